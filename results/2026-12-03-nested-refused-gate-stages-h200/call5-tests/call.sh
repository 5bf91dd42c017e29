# one call: the CUDA tests of the launchers that now share optimized.fits (scans, reads, gates, chunked chain)
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
timeout -k 5 330 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_fits.py tests/test_nested_reads_kernels.py \
  tests/test_nested_optimized_errors.py property_tests/test_promote_scan.py property_tests/test_promote_scan_tf32.py \
  property_tests/test_probe_fused.py > $W/tests.log 2>&1
echo "tests rc=$?" | tee -a $W/tests.log
tar -czf $OUT/all.tgz -C /tmp w
tail -5 $W/tests.log
