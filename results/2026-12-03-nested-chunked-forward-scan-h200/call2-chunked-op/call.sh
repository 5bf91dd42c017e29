# call 2: CUDA tests of the chunked forward scan; the op with it beside the default at the batch point and L = 2; host profile at K = 64
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar czf $OUT/all.tgz -C $W . ; }
s=$(date +%s)
NGDN_TEST_LOG=$W/tests.jsonl timeout -k 5 150 python3 -m pytest -n 14 -q -p no:cacheprovider \
  property_tests/test_promote_scan_chunked.py property_tests/test_nested_optimized.py -k "chunked" > $W/tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s)-s )) s" | tee $W/steps.log; tail -15 $W/tests.log; pack
timeout -k 5 230 python3 -m bench.reads_ab --out $W/warm-batch -B 2 -T 16384 --levels 4 --variants triton scan-fwd-chunked --warmup-only > $W/warm-batch.log 2>&1 &
timeout -k 5 230 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton scan-fwd-chunked --warmup-only > $W/warm-l2.log 2>&1 &
timeout -k 5 230 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants triton --no-flat --warmup-only > $W/warm-k64.log 2>&1 &
wait
echo "warmups done at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; grep -h "took\|Error" $W/warm-*.log | tail -12
timeout -k 5 90 python3 -m bench.reads_ab --out $W/batch -B 2 -T 16384 --levels 4 --variants triton scan-fwd-chunked > $W/batch.log 2>&1
echo "batch done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/batch/reads_ab.md; pack
timeout -k 5 70 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton scan-fwd-chunked > $W/l2.log 2>&1
echo "l2 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -4 $W/l2/reads_ab.md; pack
timeout -k 5 40 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants triton --no-flat --host-profile > $W/k64.log 2>&1
echo "k64 done at $(( $(date +%s)-s )) s rc=$?" | tee -a $W/steps.log; tail -2 $W/k64/reads_ab.md; pack
