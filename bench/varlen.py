"""Packed variable-length batches against padding: one ``cu_seqlens`` row vs the same tokens padded.

A training batch of N documents of ragged lengths runs either packed in one row (``B = 1``,
``cu_seqlens = [0, T_1, T_1 + T_2, …]``, CONTRACT "Variable-length batches") or padded to the longest
document (``B = N``, ``T = max T_i``; the padding is computed and thrown away). For Nested GDN-2
(``optimized.nested.chunk_nested_gdn2``, L levels of H heads) and flat GDN-2 (fla's
``chunk_gdn2`` through ``optimized.gdn2``, ``L·H`` heads: the same recurrent state), both
layouts are measured: forward and forward+backward time, and the peak memory of one
forward+backward above what the inputs hold.

Defaults: 8 documents of ragged lengths summing to 32768 tokens (``DEFAULT_LENGTHS``), L = 4,
K = V = 128, H = 16, bfloat16 on CUDA; timings are ``triton.testing.do_bench`` medians after one
warm-up call (where Triton and fla autotune), with the ops' finiteness check off (``--check-finite``
keeps it). ``--quick``: a CPU smoke size (float32 under the
Triton interpreter, one wall-clock run per timing, no warm-up, no memory counters).

Outputs (``--out``, default ``results/<date>-varlen``; ``--quick``: ``results/tmp/varlen-quick``):
``varlen.csv`` and ``varlen.md``, each with the date, the device and the versions.

    python -m bench.varlen                      # the default, on one GPU
    python -m bench.varlen --lengths 1000,31768 --ops nested
    python -m bench.varlen --quick --out /tmp/varlen
    python -m bench.varlen --ops nested --layouts padded --warmup-only --out /tmp/w &   # compile ahead

Entry point: :func:`main`; tests drive :func:`run` with stand-in ops, timer and device
(``bench.harness.Hooks``: ``nested_op``, ``flat_op``, ``timer``, ``device``).
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from bench.harness import (CpuDevice, CudaDevice, Hooks, add_check_finite, do_bench_timer, prepare_environment,
                           stderr_log)

# Eight documents, none a multiple of the 64-token chunk but one, summing to 32768.
DEFAULT_LENGTHS = (1024, 7168, 2048, 5120, 3000, 6000, 4096, 4312)
QUICK_LENGTHS = (17, 64, 40)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
LAYOUTS = ("packed", "padded")
OPS = ("nested", "flat")
COLUMNS = ["op", "layout", "N", "tokens", "computed_tokens", "B", "T", "heads", "L", "K", "V", "dtype",
           "fwd_ms", "fwd_bwd_ms", "peak_gib", "error"]


def parse_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths must be comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"--lengths must be positive document lengths, got {text!r}")
    return lengths


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.varlen", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=parse_lengths, default=None,
                   help=f"document lengths, comma-separated (default {','.join(map(str, DEFAULT_LENGTHS))})")
    p.add_argument("-L", "--levels", type=int, default=4, help="nested levels (default 4)")
    p.add_argument("-H", "--heads", type=int, default=16, help="nested heads; flat GDN-2 gets L·H (default 16)")
    p.add_argument("-K", type=int, default=128, help="key head dim (default 128)")
    p.add_argument("-V", type=int, default=128, help="value head dim (default 128)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--ops", default="nested,flat", help="which of nested, flat (default both)")
    p.add_argument("--layouts", default="packed,padded", help="which of packed, padded (default both)")
    add_check_finite(p, "both ops")
    p.add_argument("--warmup-only", action="store_true",
                   help="one forward+backward per row (compile and autotune), nothing timed: run in the "
                        "background per row to fill the Triton cache before a timed run")
    p.add_argument("--scheme", default="learned", help="the nested levels' scheme (default learned)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up (default 25)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetitions (default 100)")
    p.add_argument("--quick", action="store_true",
                   help="CPU smoke size: lengths 17,64,40, L = 2, H = 2, K = V = 16, float32, one timed run")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default results/<date>-varlen; --quick: results/tmp/varlen-quick)")
    return p


def quick_defaults(args):
    """``--quick``: the CPU smoke size (explicit options other than these are kept)."""
    args.lengths = args.lengths or QUICK_LENGTHS
    args.levels, args.heads, args.K, args.V, args.dtype = 2, 2, 16, 16, "float32"
    return args


def wall_timer(fn) -> float:
    """One run, wall clock in ms (the ``--quick`` timer: no do_bench off CUDA)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


# --- one workload ------------------------------------------------------------------------------

def _inputs(op: str, layout: str, lengths, args, device: str):
    """Leaves, positional inputs and the cotangent of one workload (``layout`` packed: B = 1,
    T = Σ T_i; padded: B = N, T = max T_i, tokens past a document's end random like the rest)."""
    B, T = (1, sum(lengths)) if layout == "packed" else (len(lengths), max(lengths))
    heads = args.heads if op == "nested" else args.levels * args.heads
    gen = torch.Generator(device=device).manual_seed(args.seed)
    dtype = DTYPES[args.dtype]

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q_shape = (B, T, heads, args.levels, args.K) if op == "nested" else (B, T, heads, args.K)
    x = {"q": rnd(*q_shape), "k": F.normalize(rnd(B, T, heads, args.K), dim=-1), "v": rnd(B, T, heads, args.V),
         "g": F.logsigmoid(rnd(B, T, heads, args.K) + 2.5), "b": torch.sigmoid(rnd(B, T, heads, args.K)),
         "w": torch.sigmoid(rnd(B, T, heads, args.V))}
    if op == "nested":
        x["r"] = rnd(B, T, heads, args.levels)
    x = {n: t.to(dtype).requires_grad_(True) for n, t in x.items()}
    do = rnd(B, T, heads, args.V).to(dtype)
    return x, do, dict(B=B, T=T, heads=heads)


def _levels(args, device):
    from reference.nested import make_levels

    levels = make_levels(args.levels, args.heads, args.K, args.V, scheme=args.scheme,
                         generator=torch.Generator().manual_seed(args.seed + 1), dtype=torch.float32, device=device)
    for level in levels:
        level.params = {n: p.requires_grad_(True) for n, p in level.params.items()}
    return levels


def measure(op: str, layout: str, lengths, args, hooks: Hooks) -> dict:
    device = hooks.device.torch_device
    x, do, dims = _inputs(op, layout, lengths, args, device)
    extra = {}
    if layout == "packed":
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        extra["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=device)
    if op == "nested":
        levels = _levels(args, device)
        leaves = list(x.values()) + [p for lv in levels for p in lv.params.values()]

        def forward():
            return hooks.nested_op(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], x["r"], levels, **extra)[0]
    else:
        leaves = list(x.values())

        def forward():
            return hooks.flat_op(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], **extra)[0]

    def step():
        forward().backward(do)
        for t in leaves:
            t.grad = None

    row = {"op": op, "layout": layout, "N": len(lengths), "tokens": sum(lengths),
           "computed_tokens": dims["B"] * dims["T"], "L": args.levels if op == "nested" else 1, "K": args.K,
           "V": args.V, "dtype": args.dtype, **dims, "fwd_ms": math.nan, "fwd_bwd_ms": math.nan,
           "peak_gib": math.nan, "error": ""}
    try:
        if not args.quick:
            step()                                       # warm-up: compile and autotune
        hooks.device.sync()
        if getattr(args, "warmup_only", False):
            hooks.device.cleanup()
            return row
        with torch.no_grad():
            row["fwd_ms"] = hooks.timer(forward)
        row["fwd_bwd_ms"] = hooks.timer(step)
        base = hooks.device.memory_begin()
        if not math.isnan(base):                         # a device with memory counters
            step()
            row["peak_gib"] = (hooks.device.memory_peak() - base) / 2 ** 30
    except Exception as e:  # noqa: BLE001 - recorded in the row; the other workloads still run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        row["error"] = f"{type(e).__name__}: {first}"[:300]
    hooks.device.cleanup()
    return row


# --- outputs ---------------------------------------------------------------------------------------

def _fmt(x) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def header(args, device, argv) -> list[str]:
    import triton

    from bench.harness import _version

    return ["Packed (cu_seqlens) vs padded batches",
            f"date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}",
            f"device: {device.name}",
            f"versions: torch {torch.__version__}, triton {triton.__version__}, fla-core {_version('fla-core')}",
            f"documents: {len(args.lengths)}, lengths {','.join(map(str, args.lengths))} "
            f"(sum {sum(args.lengths)}, longest {max(args.lengths)})",
            f"L = {args.levels}, H = {args.heads} (flat: L·H = {args.levels * args.heads}), K = {args.K}, "
            f"V = {args.V}, dtype {args.dtype}, scheme {args.scheme}",
            "timer: " + ("one wall-clock run (--quick)" if args.quick else
                         f"triton.testing.do_bench median, warmup {args.warmup_ms} ms, rep {args.rep_ms} ms"),
            "command: python -m bench.varlen " + " ".join(argv)]


def write_outputs(out: Path, rows: list[dict], lines: list[str]):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "varlen.csv", "w", newline="") as fh:
        fh.write("".join(f"# {line}\n" for line in lines))
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row[c]) for c in COLUMNS})
    md = [f"# {lines[0]}", ""] + [f"- {line}" for line in lines[1:]] + [""]
    md += ["| op | layout | B × T | computed / real tokens | fwd ms | fwd+bwd ms | peak GiB | padded / packed "
           "fwd+bwd | error |", "|---|---|---|---|---|---|---|---|---|"]
    packed = {r["op"]: r for r in rows if r["layout"] == "packed"}
    for r in rows:
        ratio = ""
        if r["layout"] == "padded" and r["op"] in packed:
            a, b = r["fwd_bwd_ms"], packed[r["op"]]["fwd_bwd_ms"]
            ratio = _fmt(a / b) if (b == b and a == a and b > 0) else ""
        md.append(f"| {r['op']} | {r['layout']} | {r['B']} × {r['T']} | {r['computed_tokens'] / r['tokens']:.3g} | "
                  f"{_fmt(r['fwd_ms'])} | {_fmt(r['fwd_bwd_ms'])} | {_fmt(r['peak_gib'])} | {ratio} | "
                  f"{r['error']} |")
    (out / "varlen.md").write_text("\n".join(md) + "\n")


def run(args, hooks: Hooks | None = None, argv: Sequence[str] = ()) -> list[dict]:
    """Every (op, layout) of ``args``; writes the CSV and Markdown to ``args.out``."""
    hooks = Hooks() if hooks is None else hooks
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"--ops: unknown {unknown}; choose from {list(OPS)}")
    layouts = [x.strip() for x in getattr(args, "layouts", ",".join(LAYOUTS)).split(",") if x.strip()]
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown or not layouts:
        raise ValueError(f"--layouts: unknown {unknown or layouts}; choose from {list(LAYOUTS)}")
    if hooks.device is None:
        hooks.device = CudaDevice() if torch.cuda.is_available() else CpuDevice()
    if hooks.timer is None:
        hooks.timer = wall_timer if (args.quick or not torch.cuda.is_available()) else \
            do_bench_timer(args.warmup_ms, args.rep_ms)
    if "nested" in ops and hooks.nested_op is None:
        from optimized.nested import chunk_nested_gdn2
        hooks.nested_op = chunk_nested_gdn2
    if "flat" in ops and hooks.flat_op is None:
        from optimized.gdn2 import chunk_gdn2
        hooks.flat_op = chunk_gdn2
    from optimized.checks import finite_checks      # here: `optimized` is configured (prepare_environment)

    check = getattr(args, "check_finite", False)
    lines = header(args, hooks.device, argv) + [
        f"finiteness check of the ops: {'ON (--check-finite)' if check else 'off (--check-finite turns it on)'}"]
    rows = []
    with finite_checks(check):
        _measure_rows(ops, layouts, args, hooks, lines, rows)
    return rows


def _measure_rows(ops, layouts, args, hooks, lines, rows) -> None:
    for op in ops:
        for layout in [x for x in LAYOUTS if x in layouts]:
            start = time.perf_counter()
            rows.append(measure(op, layout, args.lengths, args, hooks))
            hooks.log(f"varlen: {op} {layout} done in {time.perf_counter() - start:.0f} s"
                      + (" (warm-up only)" if getattr(args, "warmup_only", False) else ""))
            write_outputs(args.out, rows, lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.quick:
        args = quick_defaults(args)
    args.lengths = args.lengths or DEFAULT_LENGTHS
    if args.out is None:        # a full run goes to a dated folder (to be committed), a smoke run to the untracked tmp/
        args.out = (Path("results") / "tmp" / "varlen-quick" if args.quick
                    else Path("results") / f"{_dt.date.today().isoformat()}-varlen")
    prepare_environment()
    rows = run(args, Hooks(log=stderr_log), argv)
    print((args.out / "varlen.md").read_text())
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
