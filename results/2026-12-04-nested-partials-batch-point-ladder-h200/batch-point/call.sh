# (1) K = 128, L = 4: the gates summing the reverse scans' partials (default) beside the adds (partials-add), flat beside;
# (2) the batch point (B = 2, T = 16384): the chunked forward scan's filling chain beside the op;
# (3) head dim 64 at L = 2, 3, beside flat; every op also as captured graphs
source scripts/gpu_setup.sh
step ab4 280 python3 -m bench.reads_ab --out $W/ab4 --levels 4 -K 128 --variants triton partials-add --rounds 2 --graph
pack
step batch 170 python3 -m bench.reads_ab --out $W/batch --levels 4 -K 128 -B 2 -T 16384 --variants triton scan-fwd-chunked-chain --graph
pack
left=$(( 575 - ( $(date +%s) - SETUP_DONE ) ))
step k64 $left python3 -m bench.reads_ab --out $W/k64 --levels 2 3 -K 64 --variants triton --graph
pack
cat $W/steps.log; for f in ab4 batch k64; do grep "^|" $W/$f/reads_ab.md | head -12; done
