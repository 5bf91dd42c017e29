# one call: the chunked scan's TF32 tests; the op at head dim 64 with and without its stage ranges
# (host columns, host profile); the forward scans alone with kernel profiles; the op at L = 2 with the chunked chain
source scripts/gpu_setup.sh
W=$OUT/w; mkdir -p $W
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
step warm-k64 270 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants triton ranges-always --warmup-only &
step warm-l2 270 python3 -m bench.reads_ab --out $W/warm-l2 --levels 2 --variants triton scan-fwd-chunked-chain --warmup-only &
step tests 150 python3 -m pytest -q -p no:cacheprovider property_tests/test_promote_scan_chunked.py -k tf32
wait
step k64 80 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants triton ranges-always --host-profile
V="fwd fwd-tf32 fwd-chunked fwd-chunked-chain fwd-chunked-chain-g32 fwd-chunked-chain-g128 fwd-chunked-chain-bv128"
step scan-l2 80 python3 -m bench.scan_ab --out $W/scan-l2 --levels 2 --variants $V --profile fwd-chunked fwd-chunked-chain fwd-tf32
step l2 60 python3 -m bench.reads_ab --out $W/l2 --levels 2 --variants triton scan-fwd-chunked-chain
step scan-batch 70 python3 -m bench.scan_ab --out $W/scan-batch --levels 4 -B 2 -T 16384 --variants $V --profile fwd-chunked-chain fwd
tail -3 $W/tests.log; cat $W/k64/reads_ab.md $W/scan-l2/scan_ab.md $W/l2/reads_ab.md $W/scan-batch/scan_ab.md 2>/dev/null
cp $OUT/errors.jsonl $W/ 2>/dev/null
