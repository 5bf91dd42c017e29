# one call: level 0's output launched into an uninitialised buffer (the default now) beside fla's
# launcher, which zero-fills it first (l0-output-fla), at L = 2 (with its stage table), 4 and the batch
# point; beside the warm-ups, the CUDA tests of the nested op
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V="triton l0-output-fla"
step warm-l4 300 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton --warmup-only &
step warm-l2 300 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
step warm-b2 300 python3 -m bench.reads_ab --out $W/warm-b2 -B 2 -T 16384 --levels 4 --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 300 python3 -m pytest -q -p no:cacheprovider -n 6 -rfE tests/test_level0_overlap.py tests/test_level0_recompute.py property_tests/test_nested_packed.py property_tests/test_nested_optimized.py property_tests/test_ops.py -k "nested or level0 or two_calls or overlap or recompute or packed"
pack
wait
pack
step l24 90 python3 -m bench.reads_ab --out $W/l24 --levels 2 4 --variants $V --profile
pack
step b2 60 python3 -m bench.reads_ab --out $W/b2 -B 2 -T 16384 --levels 4 --variants $V
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l24/reads_ab.md $W/b2/reads_ab.md 2>/dev/null | grep "^|" 
