# call C: the CUDA tests of the reads kernels and the nested op with the bf16 forward reads at V blocks of 128
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W
s=$(date +%s)
NGDN_TEST_LOG=$W/tests.jsonl timeout -k 5 320 python3 -m pytest -n 14 -q -p no:cacheprovider tests/test_nested_reads_kernels.py \
  property_tests/test_nested_optimized.py > $W/tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s)-s )) s" | tee $W/steps.log
tail -15 $W/tests.log
cp $OUT/errors.jsonl $W/ 2>/dev/null
tar czf $OUT/all.tgz -C $W .
