# one call: the probes' snapshot gradients formed where they are added (the default now) beside the op
# that materialises them (snap-grads-materialised), and the reads' token kernel at wider blocks (rtok-*),
# at L = 4 (with the stage tables) and 2; beside the warm-ups, the CUDA tests of the changed kernels
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 300 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton --warmup-only &
step warm-l2 300 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 290 python3 -m pytest -q -p no:cacheprovider -n 5 -rfE tests/test_snapshot_grads.py tests/test_nested_reads_kernels.py tests/test_level0_recompute.py property_tests/test_nested_optimized.py property_tests/test_nested_packed.py
pack
wait
pack
step l4 170 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton snap-grads-materialised rtok-k64-v64 rtok-k128-v32 rtok-k32-v64 --profile
pack
step l2 80 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton snap-grads-materialised rtok-k64-v64
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l4/reads_ab.md $W/l2/reads_ab.md 2>/dev/null | grep "^|" | head -40; grep -A16 "| stage" $W/l4/profile_L4_triton.txt
