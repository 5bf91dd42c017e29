# the full ngdn bench, part 2: --resume from part 1's results.csv (its rows measured on the code before
# the fold's pair blocks; the refused L = 5, 6 rows again), the fold's CUDA tests beside the precompile,
# then the L = 4 ladder beside uniform 16 queries with kernel, stage and per-call stage tables
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W/bench; cp $OUT/env.txt $W/
cp .scratch/bench-part1/results.csv $W/bench/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; cp $W/bench/results.csv $W/bench/results.md $OUT/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
NGDN_TEST_LOG=$W/tests.jsonl step tests 200 python3 -m pytest -q -p no:cacheprovider -n 2 -rfE tests/test_snapshot_grads.py &
step bench 450 python3 -m bench.nested_vs_flat --out $W/bench --resume --no-plots --time-budget 420 --precompile-workers 12
wait
pack
step l4 100 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton uniform16 --profile
pack
cat $W/steps.log; tail -3 $W/tests.log; grep -E "precompile|FAILED|ERROR|done in|target" $W/bench.log | cut -c1-250
cat $W/l4/reads_ab.md 2>/dev/null | grep "^|" | head -12
for v in triton uniform16; do echo "== $v"; sed -n '/stage (calls/,$p' $W/l4/profile_L4_$v.txt; done
