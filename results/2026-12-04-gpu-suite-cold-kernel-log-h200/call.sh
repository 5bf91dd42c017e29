# (1) the whole GPU suite cold, each compile's kernel and specialisation in the per-test log;
# (2) after it, reads_ab K = 128, L = 4: the gates summing the reverse scans' partials (default) beside the adds (partials-add)
source scripts/gpu_setup.sh
SUITE_RUNS=cold SUITE_TIMEOUTS=430 bash scripts/gpu_suite.sh > $W/suite.out 2>&1
echo "suite done at $(( $(date +%s) - SETUP_DONE )) s" >> $W/steps.log
left=$(( 575 - ( $(date +%s) - SETUP_DONE ) ))
step ab $left python3 -m bench.reads_ab --out $W/ab --levels 4 -K 128 --no-flat --variants triton partials-add --rounds 2 --graph
pack
cat $W/steps.log; tail -5 $W/suite.out; grep "^|" $W/ab/reads_ab.md | head -14
