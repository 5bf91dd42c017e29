# the CUDA tests the last call's limit cut (beside one warm-up only), then head dim 64 at L = 4 side
# by side: flat, the op with float32 parameters, with bf16 parameters cast together and one at a time,
# and the one-launch gates; host profiles of the op and the one-launch gates
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V64="triton params-run-dtype params-cast-each gates-one-launch"
step warm-k64 230 python3 -m bench.reads_ab --out $W/warm64 --levels 4 -K 64 --variants $V64 --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 230 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --durations=15 \
    tests/test_nested_widest_ladder.py tests/test_snapshot_grads.py tests/test_param_casts.py &
wait
pack
step k64 150 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants $V64 --host-profile
pack
cat $W/steps.log; tail -3 $W/tests.log; grep "^|" $W/k64/reads_ab.md | head -30
