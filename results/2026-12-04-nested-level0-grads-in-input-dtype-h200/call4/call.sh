# db and fla's key-block partials added by optimized.key_block_partials' kernel (default) beside torch's
# strided add (l0-db-add-torch) and the op before this change (l0-grads-f32), L = 4 with stage tables;
# the level-0 launcher tests on CUDA beside the warm-ups
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step warm-l4-flat 225 python3 -m bench.reads_ab --out $W/warm-l4-flat --levels 4 --variants l0-grads-f32 --warmup-only &
step warm-l4-nested 225 python3 -m bench.reads_ab --out $W/warm-l4-nested --levels 4 --no-flat --variants triton --warmup-only &
NGDN_TEST_LOG=$W/tests.jsonl step tests 200 python3 -m pytest -q -p no:cacheprovider -n 2 -rfE tests/test_level0_launchers.py
wait
pack
step l4 75 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton l0-db-add-torch l0-grads-f32 --profile
pack
cat $W/steps.log; tail -2 $W/tests.log; cat $W/l4/reads_ab.md 2>/dev/null | grep "^|"; for v in triton l0-db-add-torch l0-grads-f32; do grep -E "level0_bwd|grad_casts|add_key_block" $W/l4/profile_L4_$v.txt | cut -c1-60,150-200; done
