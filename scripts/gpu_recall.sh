#!/usr/bin/env bash
# The recall benchmark on the device machine, from the repo root (the .whl folder carried):
# installs the fla-core wheel, runs the layer property test on CUDA (float32 layer with the
# optimized op vs the same layer on the float64 reference, with the error log), then the default
# `python -m bench.recall` (learned, merge, bounded_erase, flat; T 512, 2048, 8192; 299 s measured
# on an H200, the layer test 115 s before it; --time-budget 540 s) writing into $OUT. The plot needs matplotlib; without it, draw
# it here afterwards: python -m bench.recall --plot-only OUT/recall/recall.csv
# Logs under $OUT: env.txt, pytest-layer.log, errors.jsonl, worst_errors.md, recall/ (csv, md, png), bench.log.
# Usage: [RECALL_ARGS="--T 512 2048 8192"] [LAYER_TIMEOUT=240] bash scripts/gpu_recall.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
rc=0
start=$(date +%s)
timeout -s INT -k 30 "${LAYER_TIMEOUT:-240}" \
  python3 -m pytest -p no:cacheprovider -rfE --durations=10 property_tests/test_layer.py 2>&1 | tee "$OUT/pytest-layer.log" | tail -20
status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] && rc=$status
echo "== layer test: wall time $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/env.txt"
python3 -m ngdn.cli errors "$OUT/errors.jsonl" > "$OUT/worst_errors.md" 2>&1
grep nested_layer "$OUT/worst_errors.md"
start=$(date +%s)
# shellcheck disable=SC2086
python3 -m bench.recall --out "$OUT/recall" ${RECALL_ARGS:-} 2> "$OUT/bench.log" | tail -40
status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] && rc=$status
echo "== bench recall: wall time $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/env.txt"
tail -5 "$OUT/bench.log"
exit $rc
