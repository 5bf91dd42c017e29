# one call: ngdn bench's L = 5, 6 rows (head dim 128) on the op with the refused stage count remembered
# and the gates that make z only up to 64 pairs a firing
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
timeout -k 5 400 python3 -m bench.nested_vs_flat --out $W/bench --no-plots --time-budget 370 --precompile-workers 8 \
  --configs depth-K128-L5,depth-K128-L6 > $W/bench.log 2>&1
echo "bench rc=$?"
tar -czf $OUT/all.tgz -C /tmp w
grep -A12 -i "^## Targets" $W/bench/results.md | head -14; grep -A6 '^## 1\.' $W/bench/results.md; grep -A6 '^## 3\.' $W/bench/results.md; tail -2 $W/bench.log
