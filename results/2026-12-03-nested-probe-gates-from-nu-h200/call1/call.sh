# one call: the gates that make z themselves (default "triton-nu", reads_ab variant "triton") beside the
# op before (variant "gates-triton"): CUDA tests of the new kernels, then the op at L = 2, 4 (K = 128),
# head dim 64 at L = 4, and the batch point; a bf16 agreement check of the two gate paths in the op
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V="triton gates-triton"
step warm-k128 320 python3 -m bench.reads_ab --out $W/warm-k128 --levels 2 4 --variants $V --warmup-only &
step warm-k64 320 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants $V --warmup-only &
step tests 300 python3 -m pytest -q -p no:cacheprovider property_tests/test_probe_fused.py -k "from_nu or fixed_draws" tests/test_nested_hot_path.py::test_triton_probe_gates_in_the_op_agree tests/test_nested_fused_probe.py
wait
pack
step l24 90 python3 -m bench.reads_ab --out $W/l24 --levels 2 4 --variants $V --profile
pack
step k64 60 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants $V
pack
step agree 40 python3 .scratch/agree.py
pack
step batch 70 python3 -m bench.reads_ab --out $W/batch -B 2 -T 16384 --levels 4 --variants $V
pack
tail -3 $W/tests.log; cat $W/l24/reads_ab.md $W/k64/reads_ab.md $W/batch/reads_ab.md $W/agree.log 2>/dev/null
