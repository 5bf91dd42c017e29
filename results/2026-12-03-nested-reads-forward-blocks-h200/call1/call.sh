# call A: the batch point with the forward-precision rule; reads forward V blocks; L = 5; head dim 64
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W
pack() { tar czf $OUT/all.tgz -C $W . ; }
s=$(date +%s)
timeout -k 5 240 python3 -m bench.reads_ab --out $W/warm-batch -B 2 -T 16384 --levels 4 --variants triton scan-fwd-tf32 scan-fwd-ieee --warmup-only > $W/warm-batch.log 2>&1 &
timeout -k 5 240 python3 -m bench.reads_ab --out $W/warm-reads --levels 2 4 --variants triton reads-fwd-bv64 reads-fwd-bv128 scan-fwd-bn32 scan-fwd-bn64 --warmup-only > $W/warm-reads.log 2>&1 &
timeout -k 5 240 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants triton --warmup-only > $W/warm-k64.log 2>&1 &
timeout -k 5 240 python3 -m bench.reads_ab --out $W/warm-l5 --levels 5 --variants triton --warmup-only > $W/warm-l5.log 2>&1 &
wait
echo "warmups done at $(( $(date +%s)-s )) s" | tee $W/steps.log
timeout -k 5 100 python3 -m bench.reads_ab --out $W/batch -B 2 -T 16384 --levels 4 --variants triton scan-fwd-tf32 scan-fwd-ieee > $W/batch.log 2>&1
echo "batch done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -6 $W/batch.log; pack
timeout -k 5 60 python3 -m bench.reads_ab --out $W/reads2 --levels 2 --variants triton reads-fwd-bv64 reads-fwd-bv128 > $W/reads2.log 2>&1
tail -5 $W/reads2.log
timeout -k 5 100 python3 -m bench.reads_ab --out $W/reads --levels 4 --variants triton reads-fwd-bv64 reads-fwd-bv128 scan-fwd-bn32 scan-fwd-bn64 > $W/reads.log 2>&1
echo "reads done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -9 $W/reads.log; pack
timeout -k 5 60 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants triton > $W/k64.log 2>&1
echo "k64 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/k64.log; pack
timeout -k 5 80 python3 -m bench.reads_ab --out $W/l5 --levels 5 --variants triton > $W/l5.log 2>&1
echo "l5 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/l5.log
cp $OUT/errors.jsonl $W/ 2>/dev/null
pack
