# one call: L = 6 (head dim 128), the default op (gates that make z) beside the op before (gates on
# a bmm's z): ngdn bench put its forward at 10.2 ms and its peak at 8.9 GiB (2026-12-02: 8.8, 6.6)
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { tar -czf $OUT/all.tgz -C /tmp w; }
step warm-a 380 python3 -m bench.reads_ab --out $W/warm-a --levels 6 --variants triton --warmup-only &
step warm-b 380 python3 -m bench.reads_ab --out $W/warm-b --levels 6 --variants gates-triton --no-flat --warmup-only &
wait
pack
step l6 150 python3 -m bench.reads_ab --out $W/l6 --levels 6 --variants triton gates-triton --profile --memory-at-peak --stage-peaks
pack
cat $W/steps.log; cat $W/l6/reads_ab.md 2>/dev/null | head -40; ls $W/l6
