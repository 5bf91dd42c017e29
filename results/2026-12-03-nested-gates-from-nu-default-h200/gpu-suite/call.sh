# one call: the GPU suite cold on the op with the gates that make z themselves by default, then
# the gates alone (bench.gates_ab: the kernels' tile count now a runtime bound) beside the bmm's
SUITE_RUNS=cold SUITE_TIMEOUTS=440 bash scripts/gpu_suite.sh
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/ngdn-triton-cache PYTHONUNBUFFERED=1
timeout 60 python3 -m bench.gates_ab --out /tmp/gates > /tmp/gates/../gates.log 2>&1; echo "gates rc=$?"
cp /tmp/gates.log /tmp/gates/ 2>/dev/null; tar -czf $OUT/gates.tgz -C /tmp gates
cat /tmp/gates/gates_ab.md 2>/dev/null | tail -12
