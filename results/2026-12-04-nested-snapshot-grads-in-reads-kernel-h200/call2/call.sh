# the reads' state-gradient kernel adding levels >= 2's factored snapshot gradients by float32 rank-1
# updates (default) beside the add kernel of their own (snap-add-kernel); the reverse scans' partials
# by elementwise adds (default) beside torch's sum (partials-sum): L = 4 (stage and call-site
# tables), L = 2, head dim 64; CUDA tests of the changed kernels beside the warm-ups
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 270 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton snap-add-kernel --warmup-only &
step warm-l2 270 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
step warm-k64 270 python3 -m bench.reads_ab --out $W/warm-k64 --levels 4 -K 64 --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 260 python3 -m pytest -q -p no:cacheprovider -n 3 -rfE tests/test_snapshot_grads.py tests/test_nested_reads_kernels.py
pack
wait
pack
step l4 170 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton snap-add-kernel partials-sum --profile
pack
step k64 110 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants triton partials-sum
pack
step l2 50 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton snap-add-kernel
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l4/reads_ab.md $W/k64/reads_ab.md $W/l2/reads_ab.md 2>/dev/null | grep "^|" | head -40; grep -A32 "| op | calls" $W/l4/profile_L4_triton.txt; grep -E "reads_bwd_states_kernel|add_snapshot_grads_kernel" $W/l4/profile_L4_*.txt
