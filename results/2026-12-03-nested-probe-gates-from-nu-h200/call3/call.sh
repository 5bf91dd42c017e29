# one call: the gates alone (bench.gates_ab, both forms, kernel times per level), then the op with the
# gates that make z themselves (default, variant "triton") beside the op before ("gates-triton") at L = 4
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
step gates 90 python3 -m bench.gates_ab --out $W/gates
pack
cat $W/gates/gates_ab.md
step l4 340 python3 -m bench.reads_ab --out $W/l4 --levels 4 --variants triton gates-triton
pack
cat $W/l4/reads_ab.md; tail -5 $W/gates.log
