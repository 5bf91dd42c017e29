# level 0's dg, db, dw written in the inputs' dtype and db's key-block partials added without a copy
# (default) beside the op before (l0-grads-f32): L = 4 (stage tables), head dim 64, L = 2; CUDA tests of
# level 0's backward and the nested op beside the warm-ups
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 270 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton l0-grads-f32 --warmup-only &
step warm-l2 270 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton l0-grads-f32 --warmup-only &
step warm-k64 270 python3 -m bench.reads_ab --out $W/warm-k64 --levels 4 -K 64 --variants triton l0-grads-f32 --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 265 python3 -m pytest -q -p no:cacheprovider -n 3 -rfE tests/test_level0_launchers.py tests/test_level0_recompute.py tests/test_nested_hot_path.py tests/test_level0_overlap.py property_tests/test_nested_optimized.py
pack
wait
pack
step l4 150 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton l0-grads-f32 --profile
pack
step k64 90 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants triton l0-grads-f32
pack
step l2 60 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton l0-grads-f32
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l4/reads_ab.md $W/k64/reads_ab.md $W/l2/reads_ab.md 2>/dev/null | grep "^|" | head -40; grep -A20 "| stage" $W/l4/profile_L4_triton.txt; grep -A20 "| stage" $W/l4/profile_L4_l0-grads-f32.txt | grep -E "level0_bwd|grad_casts"
