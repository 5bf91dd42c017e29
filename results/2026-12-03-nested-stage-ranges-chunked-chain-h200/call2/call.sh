# the forward scans' kernel profiles (chunked forms against the op's scans), packed in one file
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W
s=$(date +%s)
timeout -k 5 150 python3 -m bench.scan_ab --out $W/scan-batch --levels 4 -B 2 -T 16384 --variants fwd fwd-chunked fwd-chunked-chain --profile fwd fwd-chunked fwd-chunked-chain > $W/scan-batch.log 2>&1
echo "scan-batch rc=$? at $(( $(date +%s)-s )) s" | tee -a $W/steps.log
timeout -k 5 100 python3 -m bench.scan_ab --out $W/scan-l2 --levels 2 --variants fwd-tf32 fwd-chunked-chain fwd-chunked-chain-g32 --profile fwd-tf32 fwd-chunked-chain fwd-chunked-chain-g32 > $W/scan-l2.log 2>&1
echo "scan-l2 rc=$? at $(( $(date +%s)-s )) s" | tee -a $W/steps.log
cat $W/scan-batch/scan_ab.md $W/scan-l2/scan_ab.md
for f in $W/scan-batch/profile_*level1.txt $W/scan-l2/profile_*; do echo "== $f"; head -14 $f | cut -c1-160; done
tar czf $OUT/all.tgz -C $W .
