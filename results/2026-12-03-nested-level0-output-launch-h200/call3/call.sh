# one call: level 0's output launched into an uninitialised buffer (the default now) beside fla's
# launcher, which zero-fills it first (l0-output-fla), at L = 2 (with its stage table) and 4
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4 280 python3 -m bench.reads_ab --out $W/warm-l4 --levels 4 --variants triton --warmup-only &
step warm-l2 280 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only &
wait
pack
step l24 110 python3 -m bench.reads_ab --out $W/l24 --levels 2 4 --variants triton l0-output-fla --profile
pack
cat $W/steps.log; cat $W/l24/reads_ab.md 2>/dev/null | grep "^|"; grep -A14 "| stage" $W/l24/profile_L2_triton.txt
