# level 0's dg, db, dw in the inputs' dtype (default) beside the op before (l0-grads-f32), no tests:
# warm-ups split by op (flat apart from the nested variants), then L = 4 timed with stage tables, then head dim 64
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4-flat 240 python3 -m bench.reads_ab --out $W/warm-l4-flat --levels 4 --variants l0-grads-f32 --warmup-only &
step warm-l4-nested 240 python3 -m bench.reads_ab --out $W/warm-l4-nested --levels 4 --no-flat --variants triton --warmup-only &
step warm-k64 240 python3 -m bench.reads_ab --out $W/warm-k64 --levels 4 -K 64 --variants triton l0-grads-f32 --warmup-only &
wait
pack
step l4 170 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton l0-grads-f32 --profile
pack
step k64 90 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --variants triton l0-grads-f32
pack
cat $W/steps.log; cat $W/l4/reads_ab.md $W/k64/reads_ab.md 2>/dev/null | grep "^|" | head -30; grep -A20 "| stage" $W/l4/profile_L4_triton.txt; grep -A20 "| stage" $W/l4/profile_L4_l0-grads-f32.txt | grep -E "level0_bwd|grad_casts"
