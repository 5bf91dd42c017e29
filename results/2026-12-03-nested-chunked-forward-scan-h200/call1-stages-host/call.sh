# call 1: the current op's stage tables at L = 2 and at the batch point; head dim 64; host launch time
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W
pack() { tar czf $OUT/all.tgz -C $W . ; }
s=$(date +%s)
timeout -k 5 250 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton --warmup-only > $W/warm-l2.log 2>&1 &
timeout -k 5 250 python3 -m bench.reads_ab --out $W/warm-batch -B 2 -T 16384 --levels 4 --variants triton --warmup-only > $W/warm-batch.log 2>&1 &
timeout -k 5 250 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants triton --warmup-only > $W/warm-k64.log 2>&1 &
wait
echo "warmups done at $(( $(date +%s)-s )) s" | tee $W/steps.log
timeout -k 5 100 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton --profile > $W/l2.log 2>&1
echo "l2 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/l2/reads_ab.md; pack
timeout -k 5 110 python3 -m bench.reads_ab --out $W/batch -B 2 -T 16384 --levels 4 --variants triton --profile > $W/batch.log 2>&1
echo "batch done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/batch/reads_ab.md; pack
timeout -k 5 100 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants triton > $W/k64.log 2>&1
echo "k64 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/k64/reads_ab.md
cp $OUT/errors.jsonl $W/ 2>/dev/null
pack
