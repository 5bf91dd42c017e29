# one call: the gates that make z only up to 64 pairs a firing (the default now) beside the op before
# (gates-nu-128: up to 128, with the refused stage count remembered) at L = 6 and 5, head dim 128;
# beside the warm-ups, the fused probe's CUDA tests
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { tar -czf $OUT/all.tgz -C /tmp w; }
step warm6a 330 python3 -m bench.reads_ab --out $W/warm6a --levels 6 --variants triton --warmup-only &
step warm6b 330 python3 -m bench.reads_ab --out $W/warm6b --levels 6 --variants gates-nu-128 --no-flat --warmup-only &
step warm5a 330 python3 -m bench.reads_ab --out $W/warm5a --levels 5 --variants triton --warmup-only &
step warm5b 330 python3 -m bench.reads_ab --out $W/warm5b --levels 5 --variants gates-nu-128 --no-flat --warmup-only &
step tests 250 python3 -m pytest -q -p no:cacheprovider -n 4 property_tests/test_probe_fused.py -k "nu or triton_gates or launch"
wait
pack
step l65 170 python3 -m bench.reads_ab --out $W/l65 --levels 6 5 --variants gates-nu-128 triton --profile --memory-at-peak --stage-peaks
pack
cat $W/steps.log; tail -2 $W/tests.log; cat $W/l65/reads_ab.md 2>/dev/null | tail -8
