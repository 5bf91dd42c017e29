# the reads' state-gradient kernel adding levels >= 2's factored snapshot gradients by three bf16
# dots of split operands (default) beside the add kernel of their own (snap-add-kernel): L = 4
# (stage tables), head dim 64, L = 2; CUDA tests of the changed kernels beside the warm-ups
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 270 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton snap-add-kernel --warmup-only &
step warm-l2 270 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
step warm-k64 270 python3 -m bench.reads_ab --out $W/warm-k64 --levels 4 -K 64 --variants triton snap-add-kernel --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 260 python3 -m pytest -q -p no:cacheprovider -n 3 -rfE tests/test_snapshot_grads.py tests/test_nested_reads_kernels.py property_tests/test_nested_packed.py
pack
wait
pack
step l4 150 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton snap-add-kernel --profile
pack
step k64 100 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants triton snap-add-kernel
pack
step l2 50 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton snap-add-kernel
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l4/reads_ab.md $W/k64/reads_ab.md $W/l2/reads_ab.md 2>/dev/null | grep "^|" | head -40; grep -A20 "| stage" $W/l4/profile_L4_triton.txt; grep -E "reads_bwd_states_kernel|add_snapshot_grads_kernel" $W/l4/profile_L4_*.txt
