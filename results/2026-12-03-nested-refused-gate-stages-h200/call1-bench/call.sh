# one call: ngdn bench on the default op, the depth rows not measured on it yet: L = 5, 6 at head
# dim 128, L = 4, 5, 6 at head dim 64
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
timeout -k 5 530 python3 -m bench.nested_vs_flat --out $W/bench --no-plots --time-budget 480 --precompile-workers 8 \
  --configs depth-K128-L5,depth-K128-L6,depth-K64-L4,depth-K64-L5,depth-K64-L6 > $W/bench.log 2>&1
echo "bench rc=$?"
tar -czf $OUT/all.tgz -C /tmp w
grep -A20 -i "targets" $W/bench/results.md | head -30; tail -5 $W/bench.log
