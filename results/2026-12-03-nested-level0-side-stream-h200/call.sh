# one call: level 0's output and dAv on a side stream (the default now) beside the op in line
# (l0-in-line) and the output alone on the side stream (l0-overlap-fwd), at L = 4 and 2, head dim 64 and
# the batch point; beside the warm-ups, the CUDA tests of the overlap and the nested op's properties
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V="triton l0-in-line l0-overlap-fwd"
step warm-l4 300 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton --warmup-only &
step warm-l2 300 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
step warm-k64 300 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants triton --warmup-only &
step warm-b2 300 python3 -m bench.reads_ab --out $W/warm-b2 -B 2 -T 16384 --levels 4 --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 300 python3 -m pytest -q -p no:cacheprovider -n 6 -rfE tests/test_level0_overlap.py tests/test_level0_recompute.py tests/test_nested_hot_path.py property_tests/test_nested_optimized.py
pack
wait
pack
step l42 90 python3 -m bench.reads_ab --out $W/l42 --levels 4 2 --variants $V --profile
pack
step b2 60 python3 -m bench.reads_ab --out $W/b2 -B 2 -T 16384 --levels 4 --variants triton l0-in-line
pack
step k64 40 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants triton l0-in-line
pack
cat $W/steps.log; tail -3 $W/tests.log; cat $W/l42/reads_ab.md $W/b2/reads_ab.md $W/k64/reads_ab.md 2>/dev/null | grep -v "^$" | head -60
