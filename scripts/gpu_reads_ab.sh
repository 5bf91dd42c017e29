#!/usr/bin/env bash
# Issue 12 on the device machine, from the repo root with the fla-core wheel in .whl/:
# the reads/router kernels' tests (float32 and bfloat16) and the no-host-sync test, then
# bench/reads_ab.py (nested op with PyTorch reads vs Triton reads, beside flat GDN-2, with
# torch.profiler kernel tables). Logs under $OUT: targeted.log, ab.log, ab/ (csv, md, profiles).
# Usage: [AB_ARGS="--levels 4 6"] bash scripts/gpu_reads_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/ngdn-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ngdn-triton-cache}
start=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 -rfE tests/test_nested_reads_kernels.py \
  tests/test_nested_hot_path.py 2>&1 | tee "$OUT/targeted.log" | tail -20
echo "targeted tests: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout ${AB_TIMEOUT:-300} python3 -m bench.reads_ab --out "$OUT/ab" --profile ${AB_ARGS:-} 2>&1 | tee "$OUT/ab.log" | tail -30
echo "reads_ab: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s"
