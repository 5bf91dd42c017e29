# ngdn bench with captured CUDA graphs: head dim 64 depth rows (host-paced eager), the K = 64 and K = 128 L = 4 ladders, K = 128 L = 4
source scripts/gpu_setup.sh
step bench 545 python3 -m bench.nested_vs_flat --no-plots --graph --time-budget 440 --precompile-workers 12 \
  --configs 'depth-K64-L4,depth-K64-L5,depth-K64-L6,depth-K128-L4,ladder-K64-L4,ladder-K128-L4' --out $W/bench
pack
cat $W/steps.log; tail -5 $W/bench.log; cat $W/bench/results.md | head -60
