#!/usr/bin/env bash
# The GPU test run, on the device machine from the repo root (the .whl folder carried):
# installs the fla-core wheel, then runs the README's `pytest -n auto` once per name in
# SUITE_RUNS (default "cold warm": the first on an empty Triton cache, the second on the cache
# the first filled), each with the error log and a per-test log, and prints the worst error per
# tolerance entry. Logs go under $OUT: env.txt, pytest-<run>.log, tests-<run>.jsonl.gz (with each
# test's Triton compile seconds and allocator peak), gpu-memory.csv.gz (run, time, the GPU's memory in
# use every 2 s, each process's every 10 s), errors.jsonl.gz, worst_errors.md. `CHECK=1` also runs `ngdn check` in float32 and bfloat16.
# SUITE_TIMEOUTS: one time limit (s) per run, in order (default 540 each; the cold run took ≈ 450 s on one H200: results/2026-12-03-nested-gates-from-nu-default-h200/gpu-suite/).
# SUITE_STALL_S (default 200): a test still running after that many seconds has every thread's stack
# printed into the log (pytest's faulthandler_timeout), so a run cut off at its limit names the test
# that held a worker (xdist cannot hand that worker's queued tests to another while it runs).
# Run names: "cold" (or cold2, ...) empties the Triton cache first; "cap<N>" runs with
# NGDN_GPU_MEMORY_GIB=N (a card of N GiB: fewer workers, tests needing more skipped); any other
# name (e.g. "warm") runs on the cache as it is.
# Usage: [SUITE_RUNS="cold warm"] [SUITE_TIMEOUTS="320 180"] bash scripts/gpu_suite.sh [pytest args...]
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
rc=0
read -r -a limits <<< "${SUITE_TIMEOUTS:-}"
i=0
for run in ${SUITE_RUNS:-cold warm}; do
  limit=${limits[$i]:-540}; i=$((i + 1))
  # a machine kept warm from an earlier call keeps its cache: "cold" and "cold<N>" empty it
  case "$run" in cold*) rm -rf "$TRITON_CACHE_DIR";; esac
  # "cap<N>": NGDN_GPU_MEMORY_GIB=N, a smaller card's memory (suite.gpu_memory), on the cache as it is
  case "$run" in cap*) export NGDN_GPU_MEMORY_GIB=${run#cap};; *) unset NGDN_GPU_MEMORY_GIB;; esac
  entries=$(find "$TRITON_CACHE_DIR" -type f 2>/dev/null | wc -l)
  echo "== run $run: Triton cache $TRITON_CACHE_DIR holds $entries files" | tee -a "$OUT/env.txt"
  rm -f "$OUT/tests-$run.jsonl"
  start=$(date +%s)
  # the GPU's memory in use every 2 s, and each process's every 10 s (suite.gpu_memory's shares)
  ( while sleep 2; do
      echo "$run,$(date +%s),total,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | paste -sd' ')"
      [ $(( $(date +%s) % 10 )) -lt 2 ] && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
        | sed "s/^/$run,$(date +%s),process,/"
    done ) >> "$OUT/gpu-memory.csv" 2>/dev/null &
  sampler=$!
  # SIGINT at the time limit: pytest then still prints its summary of failures (-rfE).
  NGDN_TEST_LOG=$OUT/tests-$run.jsonl timeout -s INT -k 30 "$limit" \
    python3 -m pytest -n auto -p no:cacheprovider -rfE --durations=30 -o faulthandler_timeout="${SUITE_STALL_S:-200}" "$@" 2>&1 | tee "$OUT/pytest-$run.log" | tail -45
  status=${PIPESTATUS[0]}
  kill $sampler 2>/dev/null
  [ "$status" -ne 0 ] && rc=$status
  echo "== run $run: pytest wall time $(( $(date +%s) - start )) s, exit $status" | tee -a "$OUT/env.txt"
  python3 scripts/suite_compiles.py "$OUT/tests-$run.jsonl" --top 12 >> "$OUT/env.txt" 2>&1
  grep "^compiles >=" "$OUT/env.txt" | tail -1
done
# RERUN_FAILED=1: the last run's failed tests again in one process (no -n: the whole budget is its
# share), so a test that ran out of its worker's share has its true peak measured (tests-rerun.jsonl)
if [ "${RERUN_FAILED:-0}" = 1 ] && [ -f "$OUT/tests-$run.jsonl" ]; then
  mapfile -t failed < <(python3 -c "import json,sys; print('\n'.join(sorted({e['test'] for l in open(sys.argv[1]) for e in [json.loads(l)] if e.get('outcome') == 'failed' and e.get('when') != 'compile'})))" "$OUT/tests-$run.jsonl" | grep -v '^$')
  echo "== rerun: ${#failed[@]} failed tests of run $run, one process" | tee -a "$OUT/env.txt"
  if [ "${#failed[@]}" -gt 0 ]; then
    NGDN_PRECOMPILE=0 NGDN_TEST_LOG=$OUT/tests-rerun.jsonl timeout -s INT -k 30 "${RERUN_TIMEOUT:-150}" \
      python3 -m pytest -p no:cacheprovider -rfE "${failed[@]}" 2>&1 | tee "$OUT/pytest-rerun.log" | tail -25
  fi
fi
python3 -m ngdn.cli errors "$OUT/errors.jsonl" > "$OUT/worst_errors.md" 2>&1
tail -5 "$OUT/worst_errors.md"
if [ "${CHECK:-0}" = 1 ]; then
  for dtype in float32 bfloat16; do python3 -m ngdn.cli check --dtype $dtype; done 2>&1 | tee -a "$OUT/env.txt" | tail -30
fi
# the device returns at most 8 files: the raw JSON-lines logs go back compressed
gzip -f "$OUT"/errors.jsonl "$OUT"/tests-*.jsonl "$OUT"/gpu-memory.csv 2>/dev/null
exit $rc
