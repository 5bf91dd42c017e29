# CUDA tests of the code not yet run on a GPU (factored blocks, one-launch gates, the grouped casts),
# then head dim 64 at L = 4 (flat, the op with float32 and with bf16 parameters, cast grouped and one
# at a time, the one-launch gates) and head dim 128 at L = 4 (flat, the op, one-launch gates), and
# ngdn bench's own depth-K64-L4 row in the same call
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V64="triton params-run-dtype params-cast-each gates-one-launch"
step warm-k64 250 python3 -m bench.reads_ab --out $W/warm64 --levels 4 -K 64 --variants $V64 --warmup-only &
step warm-k128 250 python3 -m bench.reads_ab --out $W/warm128 --levels 4 -K 128 --variants triton gates-one-launch --warmup-only &
( NGDN_TEST_LOG=$W/tests.jsonl step tests 200 python3 -m pytest -q -p no:cacheprovider -rfE -n 3 \
    tests/test_nested_widest_ladder.py tests/test_snapshot_grads.py tests/test_param_casts.py; \
  step tests-gates 60 python3 -m pytest -q -p no:cacheprovider -rfE property_tests/test_probe_fused.py -k one_launch ) &
wait
pack
step k64 110 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants $V64
pack
step k128 110 python3 -m bench.reads_ab --out $W/k128 --levels 4 -K 128 --variants triton gates-one-launch
pack
step ngdn-k64 120 python3 -m bench.nested_vs_flat --out $W/ngdn-k64 --configs depth-K64-L4 --no-plots --precompile-workers 0
pack
cat $W/steps.log; tail -3 $W/tests.log; tail -2 $W/tests-gates.log; grep "^|" $W/k64/reads_ab.md $W/k128/reads_ab.md | head -30; cat $W/ngdn-k64/results.md 2>/dev/null | head -20
