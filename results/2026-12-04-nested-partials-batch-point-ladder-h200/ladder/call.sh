# on the same warm machine, right after the partials call; the l2 and k64 steps (K = 128 at L = 2 and
# head dim 64 at L = 2, 3, beside flat) were stopped in flat's cold autotuning and left no rows
source scripts/gpu_setup.sh
step lad 90 python3 -m bench.reads_ab --out $W/lad --levels 4 -K 128 --no-flat --variants triton uniform16 --rounds 2 --graph; pack
step l2 80 python3 -m bench.reads_ab --out $W/l2 --levels 2 -K 128 --variants triton --rounds 2 --graph; pack
step k64 $(( 330 - ( $(date +%s) - SETUP_DONE ) )) python3 -m bench.reads_ab --out $W/k64 --levels 3 2 -K 64 --variants triton --graph; pack
