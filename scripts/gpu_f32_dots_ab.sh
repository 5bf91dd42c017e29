#!/usr/bin/env bash
# Side by side on the device machine, from the repo root (the .whl folder carried): the cold compile
# time of precompile units under each float32 dot precision the suite may use (NGDN_F32_DOTS=ieee,
# tf32x3), all at once, each in an empty Triton cache of its own (CPU cores to spare: one core per
# unit, as in the suite's precompile pool). Accuracy is the suite's business: run it under the
# precision (its error log says how near each tolerance the float32 errors come).
# Logs under $OUT: f32-dots-ab.md (one row per unit and precision), f32-dots-logs.tgz (each unit's output).
# Usage: [F32_AB_UNITS="gdn2:a:float32 nested:a:float32"] [F32_AB_TIMEOUT=200] bash scripts/gpu_f32_dots_ab.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"
units=${F32_AB_UNITS:-gdn2:a:float32 nested:a:float32 fenwick_gdn2:a:float32}
pids=()
mkdir -p "$OUT/f32-dots"
for dots in ieee tf32x3; do
  for unit in $units; do
    log="$OUT/f32-dots/$dots-${unit//:/-}.log"
    ( cache=$(mktemp -d); start=$(date +%s%N)
      NGDN_F32_DOTS=$dots TRITON_CACHE_DIR=$cache timeout "${F32_AB_TIMEOUT:-200}" \
        python3 -m suite.precompile --unit "$unit" > "$log" 2>&1
      status=$?
      ms=$(( ($(date +%s%N) - start) / 1000000 ))
      printf '| %s | %s | %d.%01d | %s |\n' "$unit" "$dots" $((ms / 1000)) $((ms % 1000 / 100)) "$status" >> "$OUT/f32-dots-rows" ) &
    pids+=($!)
  done
done
wait "${pids[@]}"
{ echo "| unit | NGDN_F32_DOTS | cold compile and run (s) | exit |"; echo "|---|---|---|---|"; sort "$OUT/f32-dots-rows"; } > "$OUT/f32-dots-ab.md"
rm -f "$OUT/f32-dots-rows"
tar czf "$OUT/f32-dots-logs.tgz" -C "$OUT" f32-dots && rm -rf "$OUT/f32-dots"
cat "$OUT/f32-dots-ab.md"
