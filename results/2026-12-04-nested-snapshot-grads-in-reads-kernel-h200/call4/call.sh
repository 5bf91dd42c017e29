# the reads' state-gradient kernel adding levels >= 2's factored snapshot gradients (default) beside
# the add kernel of their own (snap-add-kernel), the reverse scans' partials by elementwise adds
# (default) beside torch's sum (partials-sum), the reads' token kernel at 64 x 64 (default) beside
# 32 x 32 (rtok-k32-v32): L = 4 (stage and call-site tables), L = 2, head dim 64; CUDA tests of the
# changed kernels beside the warm-ups; the Triton cache packed for a later call
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 280 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton snap-add-kernel rtok-k32-v32 --warmup-only &
step warm-l2 280 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
step warm-k64 280 python3 -m bench.reads_ab --out $W/warm-k64 --levels 4 -K 64 --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 270 python3 -m pytest -q -p no:cacheprovider -n 4 -rfE tests/test_snapshot_grads.py tests/test_nested_reads_kernels.py property_tests/test_promote_scan.py property_tests/test_nested_optimized.py
pack
wait
pack
step l4 200 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton snap-add-kernel partials-sum rtok-k32-v32 --profile
pack
step l2 60 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton partials-sum
pack
step k64 70 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants triton partials-sum
pack
du -sh $TRITON_CACHE_DIR; tar -czf /tmp/tc.tgz -C /tmp ngdn-triton-cache && ls -la /tmp/tc.tgz && split -b 15m -d /tmp/tc.tgz $OUT/tc.part.
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l4/reads_ab.md $W/l2/reads_ab.md $W/k64/reads_ab.md 2>/dev/null | grep "^|" | head -40; grep -A30 "| op | calls" $W/l4/profile_L4_triton.txt
