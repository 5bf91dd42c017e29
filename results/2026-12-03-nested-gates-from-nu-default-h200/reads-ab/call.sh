# one call: CUDA tests of the gates that make z themselves (form 2), then the op with them
# (reads_ab variant gates-nu) beside the default (triton) at L = 4 and 2, head dim 64, the batch point
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V="triton gates-nu"
step warm-l4 380 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants $V --warmup-only &
step warm-l2 380 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants $V --warmup-only &
step warm-k64 380 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants $V --warmup-only &
step warm-b2 380 python3 -m bench.reads_ab --out $W/warm-b2 -B 2 -T 16384 --levels 4 --variants $V --warmup-only &
step tests 300 python3 -m pytest -q -p no:cacheprovider -n 4 property_tests/test_probe_fused.py -k "nu or triton_gates" tests/test_nested_hot_path.py::test_triton_probe_gates_in_the_op_agree
pack
wait
pack
step l42 60 python3 -m bench.reads_ab --out $W/l42 --levels 4 2 --variants $V --profile
pack
step k64 40 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants $V
pack
step b2 60 python3 -m bench.reads_ab --out $W/b2 -B 2 -T 16384 --levels 4 --variants $V
pack
tail -3 $W/tests.log; cat $W/l42/reads_ab.md $W/k64/reads_ab.md $W/b2/reads_ab.md 2>/dev/null
