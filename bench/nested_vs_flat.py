"""Nested vs flat GDN-2 on one GPU: the four figures of the design note.

Nested GDN-2 with ``L`` levels of ``H`` heads (``optimized.nested.chunk_nested_gdn2``)
against a flat GDN-2 holding the same recurrent state: fla's ``chunk_gdn2``
(``optimized.gdn2.chunk_gdn2``) with ``L·H`` heads, same ``B, T, K, V``, same dtype,
forward and backward. Four sweeps, one run:

1. ``depth``:  training cost (forward, backward, forward+backward, nested/flat) vs
   ``L = 2..6`` at head dims 64 and 128 (query ladder ``min(K, 16·2^(ℓ-1))``);
2. ``batch``:  the same vs batch size at fixed tokens per batch (``B·T = 32768``);
3. peak memory of one forward+backward vs depth (measured on the ``depth`` rows);
4. ``ladder``: the query ladder vs a uniform 16 queries per level.

Timings are ``triton.testing.do_bench`` medians. Every configuration is warmed
once first (that is where Triton/fla autotune), and the warm-up is reported on
its own, never inside a timing. Every row also gets a floor (``bench.floors``):
FLOPs and minimum bytes turned into times with the bf16 matmul rate and copy
bandwidth measured at the start of the run; ``x_floor = time / floor``.

Outputs (one folder, default ``results/<date>-<gpu>/``): ``results.csv``,
``results.md``, ``fig1_depth.png``, ``fig2_batch.png``, ``fig3_memory.png``,
``fig4_ladder.png`` and ``meta.json``; each starts with (or embeds) the date, the
GPU and the torch/triton/fla versions. The CSV and Markdown are rewritten after
every measured configuration, so ``--resume`` continues a run that was cut off.

    ngdn bench --quick          # < 5 min of device time
    ngdn bench                  # all four figures
    ngdn bench --configs 'depth-K128-*' --out results/x
    ngdn bench --list           # the plan, no GPU needed
    ngdn bench --replot --out results/x   # tables and PNGs from a CSV

Entry point for ``ngdn bench``: :func:`main`. This module is the runner and the
command line only: the plan is ``bench.plan``, measuring one workload
``bench.measure``, devices, timer and hooks ``bench.harness``, rows and outputs
``bench.report``. Tests drive :func:`run` with stand-in ops, timer and device
(:class:`bench.harness.Hooks`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from bench.harness import (CudaDevice, Hooks, _slug, add_check_finite, collect_meta, header_lines, measure_rates,
                           prepare_environment, stderr_log)
from bench.measure import MEASURED, _empty_measurement, measure_workload
from bench.plan import DTYPES, SWEEPS, Config, make_plan
from bench.report import (_key_of_row, _row_order, finalize, make_row, read_csv, target_rows, write_csv,
                          write_markdown, write_plots)

SKIPPED = "skipped"


# --- the run ------------------------------------------------------------------------------

def default_out(device_name: str, quick: bool) -> Path:
    date = _dt.date.today().isoformat()
    return Path("results") / f"{date}-{_slug(device_name)}{'-quick' if quick else ''}"


def run(args, hooks: Hooks | None = None, argv: Sequence[str] = (), notes: Sequence[str] = ()) -> int:
    """Measure the plan of ``args`` and write every output; returns an exit code."""
    hooks = (hooks or Hooks()).resolve(args)
    log = hooks.log
    plan = make_plan(args, hooks.query_counts)
    if not plan:
        log("nothing to run: no configuration matches --sweeps/--configs")
        return 2
    out = Path(args.out) if args.out else default_out(hooks.device.name, args.quick)
    out.mkdir(parents=True, exist_ok=True)
    meta = collect_meta(args, hooks.device, argv, notes)
    from optimized.checks import finite_checks   # here: `optimized` is configured by prepare_environment

    check = args.check_finite
    meta["notes"].append(
        f"finiteness check of the optimized ops (flat's and the nested op's input check: one read of every "
        f"input and a host sync per forward): {'ON (--check-finite)' if check else 'off (--check-finite turns it on)'}")
    t_start = time.perf_counter()

    def elapsed():
        return time.perf_counter() - t_start

    cache: dict[tuple, dict] = {}
    csv_path = out / "results.csv"
    in_plan = {(cfg.sweep, cfg.id, w.impl, w.queries) for cfg in plan for w in cfg.workloads}
    earlier = []   # --resume: rows of configurations outside this plan stay in the results
    if args.resume and csv_path.exists():
        for row in read_csv(csv_path):
            if row["fwd_ms"] is not None and not row["error"]:
                cache[_key_of_row(row)] = {k: row[k] for k in MEASURED}
            if (row["sweep"], row["config"], row["impl"], row["queries"] or "") not in in_plan:
                earlier.append(row)
        log(f"resume: {len(cache)} measurements kept from {csv_path}")

    todo_workloads = list({w.key: w for c in plan for w in c.workloads if w.key not in cache}.values())
    todo = [w.key for w in todo_workloads]
    if todo and args.precompile_workers != 0 and isinstance(hooks.device, CudaDevice):
        from bench import precompile

        pre = precompile.run_workers(todo_workloads, args, args.precompile_workers, log)
        meta["notes"].append(
            f"precompile: {pre['groups']} compile groups in {pre['parts']} part(s) each on {pre['workers']} "
            f"parallel worker processes in "
            f"{pre['seconds']:.0f} s (bench/precompile.py: kernels into Triton's disk cache, configs launched "
            f"once, no tuning result kept; warmup_s below is then autotuning proper)"
            + (f"; FAILED: {', '.join(pre['failed'])}" if pre["failed"] else ""))

    log(f"measuring bf16 matmul rate and copy bandwidth on {hooks.device.name} ...")
    rates = measure_rates(args, hooks.timer, hooks.device)
    log(f"  matmul {rates['matmul_tflops']:.4g} TFLOP/s, copy {rates['copy_gbps']:.4g} GB/s (read+write)")
    header = header_lines(meta, rates)

    log(f"{len(plan)} configurations, {len(todo)} workloads to measure -> {out}")
    aborted = None

    def rows_so_far():
        rows = list(earlier)
        for cfg in plan:
            for w in cfg.workloads:
                if w.key in cache:
                    rows.append(make_row(cfg, w, cache[w.key], args.dtype))
        return finalize(sorted(rows, key=_row_order), rates, args)

    done = 0
    for cfg in plan:
        for w in cfg.workloads:
            if w.key in cache:
                continue
            done += 1
            tag = f"[{done}/{len(todo)}] {cfg.id} {w.label} (B={w.B}, T={w.T}, heads={w.heads}, K={w.K})"
            if aborted or (args.time_budget is not None and elapsed() > args.time_budget):
                reason = aborted or f"time budget of {args.time_budget:g} s used up"
                cache[w.key] = _empty_measurement() | {"error": f"{SKIPPED}: {reason}"}
                log(f"{tag}: {SKIPPED} ({reason})")
                continue
            log(f"{tag} ... elapsed {elapsed():.0f} s")

            def progress(message, tag=tag):
                log(f"{tag}: {message} (elapsed {elapsed():.0f} s)")

            with finite_checks(check):
                m = measure_workload(w, args, hooks, progress)
            cache[w.key] = m
            summary = ", ".join(f"{p} {m[f'{p}_ms']:.3f} ms" for p in ("fwd", "bwd", "fwdbwd", "fwdbwd_host")
                                if m.get(f"{p}_ms") is not None)
            log(f"{tag}: {summary or 'no timing'}"
                + (f", peak {m['peak_gib']:.2f} GiB" if m["peak_gib"] is not None and not math.isnan(m["peak_gib"])
                   else "")
                + (f"; ERROR {m['error']}" if m["error"] else "") + f" (elapsed {elapsed():.0f} s)")
            if m["error"] and not hooks.device.healthy():
                aborted = f"CUDA context lost after {cfg.id} {w.label}"
                log(f"{aborted}: skipping the rest")
            rows = rows_so_far()
            write_csv(csv_path, rows, header)
            write_markdown(out / "results.md", rows, header, [])

    rows = rows_so_far()
    write_csv(csv_path, rows, header)
    plots = [] if args.no_plots else write_plots(out, rows, header, log)
    write_markdown(out / "results.md", rows, header, plots)
    (out / "meta.json").write_text(json.dumps(meta | {"rates": rates, "plots": plots}, indent=2, default=str))
    targets, _ = target_rows(rows)
    print("\n".join(header))
    for what, where, value, status in targets:
        print(f"target: {what} [{where}]: {value or '-'} ({status})")
    n_err = sum(1 for r in rows if r["error"])
    log(f"done in {elapsed():.0f} s: {len(rows)} rows ({n_err} with errors) -> {out}")
    return 3 if aborted else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from bench import subcommands_help

    p = argparse.ArgumentParser(prog="ngdn bench", description=__doc__, epilog=subcommands_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results folder (default results/<date>-<gpu>/, '-quick' appended in --quick)")
    p.add_argument("--quick", action="store_true",
                   help="few configs (L 2,4; head dim 128; one batch point; one ladder point), fewer repeats")
    p.add_argument("--sweeps", default=",".join(SWEEPS), help="comma-separated subset of depth,batch,ladder")
    p.add_argument("--configs", help="comma-separated fnmatch patterns on config ids, e.g. 'depth-K128-*,batch-*'")
    p.add_argument("--list", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--resume", action="store_true", help="keep the error-free rows of an existing results.csv")
    p.add_argument("--time-budget", type=float, default=None,
                   help="start no new workload after this many seconds; the rest are marked skipped")
    p.add_argument("-B", "--batch", type=int, default=8,
                   help="batch size of the depth and ladder sweeps (default 8)")
    p.add_argument("-T", "--tokens", type=int, default=4096,
                   help="tokens per sequence of the depth and ladder sweeps (default 4096)")
    p.add_argument("-H", "--heads", type=int, default=16, help="heads per level (flat gets L*H)")
    full = {"levels": "2,3,4,5,6", "head_dims": "64,128", "batch_sizes": "1,2,4,8,16"}
    p.add_argument("--levels", default=None, help=f"default {full['levels']} (quick: 2,4)")
    p.add_argument("--head-dims", default=None, help=f"K = V values, default {full['head_dims']} (quick: 128)")
    p.add_argument("--batch-sizes", default=None, help=f"default {full['batch_sizes']} (quick: 2)")
    p.add_argument("--tokens-per-batch", type=int, default=32768,
                   help="B·T of every batch-sweep point: T = this / B (default 32768)")
    p.add_argument("--batch-levels", type=int, default=4,
                   help="levels L of the batch sweep (default 4)")
    p.add_argument("--batch-head-dim", type=int, default=128,
                   help="head dim K = V of the batch sweep (default 128)")
    p.add_argument("--ladder-levels", default=None, help="default: --levels")
    p.add_argument("--ladder-head-dims", default=None, help="default: --head-dims")
    from reference.schemes import SCHEMES

    p.add_argument("--scheme", default="learned", choices=sorted(SCHEMES),
                   help="promotion scheme of every level (a registered scheme; default learned)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES),
                   help="dtype of the activations, both sides (default bfloat16)")
    p.add_argument("--param-dtype", default="auto", choices=["auto", "run", *sorted(DTYPES)],
                   help="scheme parameters: 'run' = --dtype; 'auto' = --dtype, float32 if the op rejects it")
    p.add_argument("--graph", action="store_true",
                   help="also time each forward and step captured in a CUDA graph and replayed (bench.cuda_graph: "
                        "the device's time without the host's launches; the host-paced rows' device ratio)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and scheme parameters (default 0)")
    p.add_argument("--warmup-ms", type=float, default=None, help="do_bench warmup (default 25; quick 10)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench rep (default 200; quick 50)")
    p.add_argument("--matmul-n", type=int, default=8192, help="size of the rate-measuring bf16 matmul")
    p.add_argument("--copy-mib", type=float, default=1024, help="size of the bandwidth-measuring copy")
    p.add_argument("--matmul-tflops", type=float, default=None, help="use this rate instead of measuring")
    p.add_argument("--copy-gbps", type=float, default=None, help="use this bandwidth instead of measuring")
    p.add_argument("--precompile-workers", type=int, default=None,
                   help="parallel processes that compile the kernels before the timed process autotunes "
                        "(default: one per core, at most 12; 0: compile inside the benchmark process)")
    p.add_argument("--no-plots", action="store_true", help="write the CSV and Markdown only, no PNGs")
    add_check_finite(p, "both sides")
    p.add_argument("--replot", action="store_true",
                   help="no measuring: rewrite results.md and the PNGs of --out from its results.csv")
    args = p.parse_args(argv)
    # options left out take --quick's values or the full run's; an option given keeps its value,
    # also when it equals the full run's default (e.g. --quick --head-dims 64,128)
    defaults = {"levels": "2,4", "head_dims": "128", "batch_sizes": "2", "ladder_levels": "4"} if args.quick else full
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.warmup_ms = args.warmup_ms if args.warmup_ms is not None else (10.0 if args.quick else 25.0)
    args.rep_ms = args.rep_ms if args.rep_ms is not None else (50.0 if args.quick else 200.0)
    return args


def replot(out: Path, log=stderr_log) -> int:
    """Rewrite ``results.md`` and the PNGs of ``out`` from its ``results.csv`` (no GPU: e.g.
    after a run on a machine without matplotlib)."""
    csv_path = out / "results.csv"
    if not csv_path.exists():
        log(f"--replot: {csv_path} does not exist")
        return 2
    with open(csv_path) as f:
        header = [line[2:].rstrip("\n") for line in f if line.startswith("# ")]
    rows = read_csv(csv_path)
    plots = write_plots(out, rows, header, log)
    write_markdown(out / "results.md", rows, header, plots)
    log(f"replotted {len(rows)} rows -> {out} ({', '.join(plots) or 'no plots'})")
    return 0


def print_plan(plan: list[Config]):
    keys = set()
    for c in plan:
        parts = []
        for w in c.workloads:
            new = w.key not in keys
            keys.add(w.key)
            counts = f" n={'-'.join(map(str, w.query_counts))}" if w.query_counts else ""
            parts.append(f"{w.label}(heads={w.heads}{counts}{'' if new else ', shared'})")
        print(f"{c.id:<24} B={c.B:<3} T={c.T:<6} H={c.H} K=V={c.K}: " + ", ".join(parts))
    print(f"{len(plan)} configurations, {len(keys)} distinct workloads")


def main(argv: Sequence[str] | None = None) -> int:
    """``ngdn bench [options]`` / ``python -m bench.nested_vs_flat [options]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        if not args.out:
            print("ngdn bench: --replot needs --out DIR (the folder holding results.csv)", file=sys.stderr)
            return 2
        return replot(Path(args.out))
    if args.list:
        from reference.nested import default_query_counts

        try:
            print_plan(make_plan(args, default_query_counts))
        except ValueError as e:
            print(f"ngdn bench: {e}", file=sys.stderr)
            return 2
        return 0
    notes = prepare_environment()
    if not torch.cuda.is_available():
        print("ngdn bench needs a CUDA GPU (do_bench, peak memory); use --list to see the plan", file=sys.stderr)
        return 2
    try:
        return run(args, Hooks(), argv=argv, notes=notes)
    except ValueError as e:   # a bad --sweeps / --tokens-per-batch combination
        print(f"ngdn bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
