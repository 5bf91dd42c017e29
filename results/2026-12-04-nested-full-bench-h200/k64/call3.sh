# the widest-ladder launch test on CUDA (and its twin at one fold block of 128 pairs), then head dim 64
# at L = 3, 4: the ladder and uniform 16 beside flat, with the host's launch times and cProfile
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-k64-a 260 python3 -m bench.reads_ab --out $W/warm-a --levels 3 4 -K 64 --variants uniform16 --warmup-only &
step warm-k64-b 260 python3 -m bench.reads_ab --out $W/warm-b --levels 3 4 -K 64 --no-flat --variants triton --warmup-only &
( NGDN_TEST_LOG=$W/tests.jsonl step tests 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_nested_widest_ladder.py; step twin 120 python3 .scratch/twin_check.py ) &
wait
pack
step k64 150 python3 -m bench.reads_ab --out $W/k64 --levels 3 4 -K 64 --variants triton uniform16 --host-profile
pack
cat $W/steps.log; tail -3 $W/tests.log; tail -2 $W/twin.log; grep "^|" $W/k64/reads_ab.md | head -12
