#!/usr/bin/env bash
# The benchmark on the device machine, from the repo root, with the fla-core wheel in .whl/
# (the image has torch, triton, numpy, matplotlib; nothing can be downloaded there).
# Installs fla-core and this package (`pip install -e .`, no dependencies), then runs
# the steps in order, each cut off in time to leave room for the next and for packing:
#   quick          `ngdn bench --quick` into results/tmp/quick, wall time recorded
#   full:SECONDS   `ngdn bench --resume` into results/tmp/full, starting no workload
#                  later than SECONDS after this script started (repeat the call, carrying
#                  results/tmp/full, until no row says "skipped"); BENCH_NAME sets
#                  the folder name, BENCH_ARGS adds options (e.g. --configs)
# Each results folder comes back as $OUT/<name>.tgz, its log as $OUT/<name>.log.
# Usage: bash scripts/gpu_bench.sh quick full:470   (a step ends at most 110 s after its deadline)
set -uo pipefail
OUT=${OUT:-/tmp/ngdn-out}
mkdir -p "$OUT" results/tmp
t0=$(date +%s)
since() { echo $(( $(date +%s) - t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
  echo "pip install -e . failed (see install.log); running from the source tree"
  export PYTHONPATH=/tmp/site:$PWD
fi
NGDN="python3 -m ngdn.cli"
command -v ngdn >/dev/null && NGDN=ngdn
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
  echo "install: $(since) s; cli: $NGDN"
} | tee "$OUT/env.txt"

for step in "$@"; do
  case $step in
    quick)
      start=$(date +%s)
      timeout -k 10 420 $NGDN bench --quick --out results/tmp/quick 2>&1 | tee "$OUT/quick.log" | tail -30
      echo "quick: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s (device time, from a bare machine: + install $(( start - t0 )) s)" | tee -a "$OUT/env.txt"
      tar czf "$OUT/quick.tgz" -C results/tmp quick ;;
    full:*)
      deadline=${step#full:}
      budget=$(( deadline - $(since) ))
      [ "$budget" -gt 30 ] || { echo "full: no time left (budget $budget s)"; continue; }
      name=${BENCH_NAME:-full}
      timeout -k 10 $(( budget + 110 )) $NGDN bench --out results/tmp/$name --resume --time-budget $budget \
        ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/$name.log" | tail -30
      echo "$name: exit ${PIPESTATUS[0]} after $(since) s; skipped rows: $(grep -c 'skipped' results/tmp/$name/results.csv)" \
        | tee -a "$OUT/env.txt"
      tar czf "$OUT/$name.tgz" -C results/tmp $name ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
