# the reverse promote scans alone at the L = 4 ladder's three level shapes: the fused scan (the op's)
# beside the two-phase scan at V blocks of 32 and 64, with kernel profiles of the fused and 2phase-bv64
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
timeout -k 5 170 python3 -m bench.scan_ab --out $W/scans --variants bwd 2phase 2phase-bv64 2phase-bv64-w4 2phase-w4 --profile bwd 2phase-bv64 > $W/scans.log 2>&1
echo "scans rc=$? at $(( $(date +%s)-s )) s" | tee $W/steps.log
tar -czf $OUT/all.tgz -C /tmp w
cat $W/scans/scan_ab.md | grep "^|"
for f in $W/scans/profile_*; do echo "== $f"; grep -E "promote_scan|Self CUDA time total" $f | cut -c1-60,150-200; done
