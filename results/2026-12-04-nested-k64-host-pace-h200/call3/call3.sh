# the op alone (no flat: its times are stable across this day's calls) at L = 4: head dim 64 with float32
# parameters, bf16 parameters cast together and one at a time, the one-launch gates (host profiles);
# head dim 128 with the op and the one-launch gates
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V64="triton params-run-dtype params-cast-each gates-one-launch"
step warm-k64 270 python3 -m bench.reads_ab --out $W/warm64 --levels 4 -K 64 --no-flat --variants $V64 --warmup-only &
step warm-k128 270 python3 -m bench.reads_ab --out $W/warm128 --levels 4 -K 128 --no-flat --variants triton gates-one-launch --warmup-only &
wait
pack
step k64 110 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --no-flat --variants $V64 --host-profile
pack
step k128 100 python3 -m bench.reads_ab --out $W/k128 --levels 4 -K 128 --no-flat --variants triton gates-one-launch
pack
cat $W/steps.log; grep "^|" $W/k64/reads_ab.md $W/k128/reads_ab.md | head -30
