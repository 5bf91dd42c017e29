# one call: ngdn bench on the default op (gates that make z themselves): depth rows L = 2, 4 (head
# dim 128), L = 4 (head dim 64), the batch point and the L = 4 ladder; beside it, during the
# precompile, the gates-from-nu mutants on CUDA with NaN-filled allocations
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
( timeout 200 python3 -m pytest -q -p no:cacheprovider property_tests/test_probe_fused.py -k "mutant_fails and nu" > $W/mutants.log 2>&1; echo "mutants rc=$?" >> $W/mutants.log ) &
timeout -k 5 520 python3 -m bench.nested_vs_flat --out $W/bench --no-plots --time-budget 470 --precompile-workers 8 \
  --configs depth-K128-L2,depth-K128-L4,depth-K64-L4,batch-K128-L4-B2,ladder-K128-L4 > $W/bench.log 2>&1
echo "bench rc=$?"
wait
tar -czf $OUT/all.tgz -C /tmp w
tail -3 $W/mutants.log; grep -A20 -i "targets" $W/bench/results.md | head -30; tail -5 $W/bench.log
