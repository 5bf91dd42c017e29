# the full ngdn bench (every depth, batch and ladder row) on the current code, part 1: the precompile
# of every compile group, then rows until the time budget
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
timeout -k 5 565 python3 -m bench.nested_vs_flat --out $W/bench --no-plots --time-budget 515 --precompile-workers 14 > $W/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s)-s )) s"
cp $W/bench/results.csv $W/bench/results.md $OUT/ 2>/dev/null
tar -czf $OUT/all.tgz -C /tmp w
du -sh ${TRITON_CACHE_DIR:-/tmp/ngdn-triton-cache}
grep -E "precompile|group .*fail|\] .*fwdbwd|error" $W/bench.log | cut -c1-220 | tail -40
