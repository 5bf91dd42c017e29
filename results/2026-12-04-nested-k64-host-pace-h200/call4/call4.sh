# head dim 64, L = 4, the op alone: float32 parameters, bf16 parameters cast together and one at a time,
# the one-launch gates, each timed three times in turn (the host-paced rows' spread beside their gaps)
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V64="triton params-run-dtype params-cast-each gates-one-launch"
step warm-k64 150 python3 -m bench.reads_ab --out $W/warm64 --levels 4 -K 64 --no-flat --variants $V64 --warmup-only
pack
step k64 130 python3 -m bench.reads_ab --out $W/k64 --levels 4 -K 64 --no-flat --rounds 3 --variants $V64
pack
cat $W/steps.log; grep "^|" $W/k64/reads_ab.md | head -30
