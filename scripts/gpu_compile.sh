#!/usr/bin/env bash
# torch.compile through every optimized op, on the device machine from the repo root (the .whl
# folder carried): installs the fla-core wheel, then runs tests/test_compile.py once (the CUDA
# property: inductor, fullgraph=True, each op's covering draw in float32 and bfloat16, values
# and every gradient against eager, bit for bit; the CPU-only tests skip themselves there).
# Logs go under $OUT: env.txt and pytest-compile.log (-rA: every test's outcome; with dynamo's
# recompile and graph-break logs, TORCH_LOGS, in the same file).
# COMPILE_TIMEOUT: time limit in seconds (default 540).
# Usage: [COMPILE_TIMEOUT=540] bash scripts/gpu_compile.sh [pytest args...]
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
export TORCH_LOGS=${TORCH_LOGS:-recompiles,graph_breaks}
start=$(date +%s)
# SIGINT at the time limit: pytest then still prints its summary.
timeout -s INT -k 30 "${COMPILE_TIMEOUT:-540}" \
  python3 -m pytest -q -p no:cacheprovider -rA --durations=20 tests/test_compile.py "$@" 2>&1 \
  | tee "$OUT/pytest-compile.log" | tail -60
status=${PIPESTATUS[0]}
echo "== pytest wall time $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/env.txt"
exit "$status"
