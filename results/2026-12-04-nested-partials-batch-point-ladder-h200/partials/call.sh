# on the machine the batch-point call had warmed (its Triton cache kept), right after it
source scripts/gpu_setup.sh; ls $TRITON_CACHE_DIR | wc -l
step ab4 300 python3 -m bench.reads_ab --out $W/ab4 --levels 4 -K 128 --variants triton partials-add --rounds 2 --graph
pack; cat $W/steps.log; grep "^|" $W/ab4/reads_ab.md; grep 'took' $W/ab4.log
