#!/usr/bin/env bash
# The GPU run, on the device machine from the repo root (the .whl folder carried):
# installs the fla-core wheel, runs `pytest -n auto` in compiled mode with the error log,
# then prints the worst observed error per tolerance entry. Logs go under $OUT.
# Usage: bash scripts/gpu_suite.sh [pytest args...]
set -uo pipefail
OUT=${OUT:-/tmp/ngdn-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NGDN_ERROR_LOG=$OUT/errors.jsonl NGDN_TEST_LOG=$OUT/tests.jsonl
rm -f "$OUT/errors.jsonl" "$OUT/tests.jsonl"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
} | tee "$OUT/env.txt"
start=$(date +%s)
# SIGINT at the time limit: pytest then still prints its summary of failures (-rfE).
timeout -s INT -k 60 ${SUITE_TIMEOUT:-1800} python3 -m pytest -n auto -p no:cacheprovider -rfE --durations=25 "$@" 2>&1 | tee "$OUT/pytest.log" | tail -40
rc=${PIPESTATUS[0]}
echo "pytest wall time: $(( $(date +%s) - start )) s, exit $rc" | tee -a "$OUT/env.txt"
python3 -m ngdn.cli errors "$OUT/errors.jsonl" | tee "$OUT/worst_errors.md"
{ python3 scripts/f32_dot_precision.py; TRITON_F32_DEFAULT=ieee python3 scripts/f32_dot_precision.py; } 2>&1 | tee -a "$OUT/env.txt"
for dtype in float32 bfloat16; do python3 -m ngdn.cli check --dtype $dtype; done 2>&1 | tee "$OUT/check.txt" | tail -60
exit $rc
