#!/usr/bin/env bash
# Targeted GPU work on the device machine, from the repo root with the fla-core wheel in .whl/.
# Steps (arguments, run in order; logs under $OUT):
#   tests          pytest -n ${PYTEST_WORKERS:-12} on $TESTS (default: the fused probe, TF32 scan, hot path, reads
#                  kernels and the nested-optimized properties), error log in errors.jsonl,
#                  worst errors in worst_errors.md; in parallel `ngdn scheme check` --device cuda
#                  for each scheme in $SCHEMES (default: bounded_erase learned merge) and the README's
#                  examples/fixed_address.py, each to scheme-<name>.log
#                  (SCHEME_CHECKS=0: none)
#   ab:ARGS        python -m bench.reads_ab --out $OUT/ab-<n> ARGS (ARGS: '+' for spaces)
#   warm:ARGS[,ARGS...]  the same with --warmup-only, in the background, one after another (fills the Triton cache with the
#                  kernels and autotune candidates a later `ab:` step compiles, but no autotune
#                  results: those are taken by the timed run on a quiet GPU), log warm-<n>.log
#   peak:ARGS      reads_ab in the background, for its peak-memory column only, log peak-<n>.log; put it
#                  after `tests`, never beside them (two 35-GiB peak runs beside 12 test workers ran the
#                  H200 out of memory, 2026-11-30)
#   fenwick:ARGS   python -m bench.fenwick_gdn2 --out $OUT/fenwick-<n> ARGS
#   fscan:ARGS     python -m bench.fenwick_scan_ab --out $OUT/fscan-<n> ARGS (the carry scans alone)
#   fenwick-warm:T[,T...][:ARGS]  bench.fenwick_gdn2 --warmup-only --ops fenwick_gdn2 --tokens 1 (B = 1),
#                  one background process per T (in parallel: each T compiles its own stacked width),
#                  and one for flat GDN-2 (its kernels do not depend on T), logs fenwick-warm-<T>.log;
#                  a later fenwick: step then loads the kernels from the cache; `wait` for them.
#                  (2026-11-30: five full-size warm-ups of both ops compiled flat five times over and
#                  two ran the GPU out of memory: a fenwick step peaks at 28.5 GiB at 65536 tokens)
#   wait           wait for the background warm-ups and peak runs (they compile beside the tests: on 16 cores two
#                  chains of two warm-ups took 466-480 s next to a 290 s test step)
# Usage: bash scripts/gpu_targeted.sh warm:--levels+4 tests wait ab:--levels+4+--profile ab:--levels+5+6
# Only files under the device's own $OUT come back, at most a few: keep its value before pointing
# this script's OUT elsewhere, and pack the work dir into it, e.g.
#   R=$OUT; OUT=/tmp/w bash scripts/gpu_targeted.sh ...; tar czf $R/all.tgz -C /tmp/w .
# (a run that packed outside the device's $OUT lost its call's files)
set -uo pipefail
OUT=${OUT:-/tmp/ngdn-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ngdn-triton-cache}
t0=$(date +%s)
since() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
n=0
warm_pids=()
for step in "$@"; do
  case $step in
    tests)
      pids=()
      [ "${SCHEME_CHECKS:-1}" = 0 ] && SCHEMES=" "
      for s in ${SCHEMES:-bounded_erase learned merge}; do
        timeout ${SCHEME_TIMEOUT:-300} python3 -m ngdn.cli scheme check reference.schemes --scheme "$s" --device cuda \
          > "$OUT/scheme-$s.log" 2>&1 & pids+=($!)
      done
      if [ "${SCHEME_CHECKS:-1}" != 0 ]; then
        timeout ${SCHEME_TIMEOUT:-300} python3 -m ngdn.cli scheme check examples/fixed_address.py --device cuda \
          > "$OUT/scheme-fixed_address.log" 2>&1 & pids+=($!)
      fi
      # SIGINT at the limit: pytest still prints its failure summary (-rfE); NGDN_TEST_LOG keeps every
      # test's outcome as it finishes (a plain kill at the limit once lost the names of 5 failures)
      NGDN_ERROR_LOG=$OUT/errors.jsonl NGDN_TEST_LOG=$OUT/tests.jsonl \
        timeout -s INT -k 30 ${TESTS_TIMEOUT:-360} python3 -m pytest -q -n ${PYTEST_WORKERS:-12} -p no:cacheprovider \
        -p no:benchmark -rfE --durations=15 ${TESTS:-tests/test_nested_fused_probe.py property_tests/test_probe_fused.py \
        property_tests/test_promote_scan_tf32.py tests/test_nested_hot_path.py tests/test_nested_reads_kernels.py \
        property_tests/test_nested_optimized.py} 2>&1 | tee "$OUT/tests.log" | tail -40
      echo "tests: exit ${PIPESTATUS[0]} at $(since) s" | tee -a "$OUT/env.txt"
      for p in "${pids[@]}"; do wait "$p"; echo "scheme check pid $p: exit $?" | tee -a "$OUT/env.txt"; done
      for f in "$OUT"/scheme-*.log; do [ -f "$f" ] && { echo "== $f"; tail -22 "$f"; }; done
      python3 -m ngdn.cli errors "$OUT/errors.jsonl" > "$OUT/worst_errors.md" 2>&1
      echo "schemes done at $(since) s" | tee -a "$OUT/env.txt" ;;
    ab:*)
      n=$((n + 1))
      args=${step#ab:}; args=${args//+/ }
      timeout ${AB_TIMEOUT:-400} python3 -m bench.reads_ab --out "$OUT/ab-$n" $args 2>&1 | tee "$OUT/ab-$n.log" | tail -14
      echo "ab-$n ($args): exit ${PIPESTATUS[0]} at $(since) s" | tee -a "$OUT/env.txt" ;;
    warm:*)
      n=$((n + 1))
      chain=${step#warm:}
      # compiled kernels only: autotune *timings* taken beside other work must not be cached for
      # the timed run (fla caches its own by default, FLA_CACHE_RESULTS; Triton's with the knob).
      # ARGS1,ARGS2,...: one background chain, run in order (one GPU memory footprint at a time)
      (
        IFS=',' read -r -a parts <<< "$chain"
        for part in "${parts[@]}"; do
          FLA_CACHE_RESULTS=0 TRITON_CACHE_AUTOTUNING=0 \
          timeout ${WARM_TIMEOUT:-400} python3 -m bench.reads_ab --out "$OUT/warm-$n" --warmup-only ${part//+/ }
          echo "warm-up [${part//+/ }] exit $? at $(since) s"
        done
      ) > "$OUT/warm-$n.log" 2>&1 & warm_pids+=($!) ;;
    peak:*)
      # reads_ab in the background for its peak-memory column only (allocator peaks are per
      # process, so work beside it does not move them; its times are not quiet and not reported)
      n=$((n + 1))
      args=${step#peak:}; args=${args//+/ }
      ( timeout ${PEAK_TIMEOUT:-400} python3 -m bench.reads_ab --out "$OUT/peak-$n" $args
        echo "peak-$n ($args): exit $? at $(since) s" ) > "$OUT/peak-$n.log" 2>&1 & warm_pids+=($!) ;;
    fenwick:*)
      n=$((n + 1))
      args=${step#fenwick:}; args=${args//+/ }
      timeout ${FENWICK_TIMEOUT:-400} python3 -m bench.fenwick_gdn2 --out "$OUT/fenwick-$n" $args 2>&1 | tee "$OUT/fenwick-$n.log" | tail -14
      echo "fenwick-$n ($args): exit ${PIPESTATUS[0]} at $(since) s" | tee -a "$OUT/env.txt" ;;
    fscan:*)
      n=$((n + 1))
      args=${step#fscan:}; args=${args//+/ }
      timeout ${FSCAN_TIMEOUT:-300} python3 -m bench.fenwick_scan_ab --out "$OUT/fscan-$n" $args 2>&1 | tee "$OUT/fscan-$n.log" | tail -24
      echo "fscan-$n ($args): exit ${PIPESTATUS[0]} at $(since) s" | tee -a "$OUT/env.txt" ;;
    fenwick-warm:*)
      spec=${step#fenwick-warm:}; ts=${spec%%:*}; extra=""
      [ "$spec" != "$ts" ] && extra=${spec#*:}; extra=${extra//+/ }
      IFS=',' read -r -a tlist <<< "$ts"
      for T in "${tlist[@]}" flat; do
        if [ "$T" = flat ]; then what="--ops flat --T ${tlist[0]}"; else what="--ops fenwick_gdn2 --T $T"; fi
        ( FLA_CACHE_RESULTS=0 TRITON_CACHE_AUTOTUNING=0 timeout ${WARM_TIMEOUT:-400} \
            python3 -m bench.fenwick_gdn2 --out "$OUT/fenwick-warm-$T" --warmup-only --tokens 1 $what $extra
          echo "fenwick warm-up [$what] exit $? at $(since) s" ) > "$OUT/fenwick-warm-$T.log" 2>&1 & warm_pids+=($!)
      done ;;
    wait)
      for p in "${warm_pids[@]}"; do wait "$p"; echo "warm-up pid $p: exit $? at $(since) s" | tee -a "$OUT/env.txt"; done
      warm_pids=() ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
