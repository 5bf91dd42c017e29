"""Cost of the Fenwick GDN-2 memory (``optimized.chunk_fenwick_gdn2``) against flat GDN-2
(``optimized.chunk_gdn2``, the same heads), per token, as T grows.

For each T (default 4096 … 65536 at B·T = 65536 tokens per step, H = 8, K = V = 128, bf16):
forward and forward+backward time (``triton.testing.do_bench`` medians, autotuners tuned, one
warm step first), the time per token, the ratio to flat GDN-2, the peak memory one step
allocates on top of its inputs, and the floor of the chunked algorithm.

The floor. ``chunk_fenwick_gdn2`` runs fla's GDN-2 chunk pieces on values stacked along V:
``NB = J + 1`` blocks of width V per chunk, ``J`` the bit length of the last chunk index
(``optimized/fenwick_gdn2/__init__.py``). The V-proportional part of a GDN-2 step therefore
costs NB times flat GDN-2's, the K-only part (the WY matrices, ``Aqk``, ``Akk``) once. The
printed floor is ``flat × NB`` (an upper estimate of what the stacked layout must cost, the
layout's own floor) and ``flat`` itself (the least any Fenwick GDN-2 can cost: with λ ≡ 1
it is GDN-2); ``vs floor`` is the measured time over ``flat × NB``.

    python -m bench.fenwick_gdn2 --out results/DIR [--T 4096 16384 65536] [--dtype bfloat16]
    ngdn bench fenwick-gdn2 --out results/DIR
    python -m bench.fenwick_gdn2 --out DIR --quick     # CPU smoke (interpreter, float32, one chunk; ~40 s)
    python -m bench.fenwick_gdn2 --out DIR --T 8192 --warmup-only   # compile only (one step per op)

``--warmup-only`` runs one forward+backward per op and T and times nothing: it fills the Triton
cache with every kernel and autotune candidate of that T (each T is a new stacked width
``(J + 1)·V``, so a new set of compilations, more than 3.5 min per T on the H200). One such process
per T, in parallel, turns the timed run's compilation into cache loads
(``scripts/gpu_targeted.sh fenwick-warm:``); run it with ``FLA_CACHE_RESULTS=0
TRITON_CACHE_AUTOTUNING=0`` so no autotune *result* taken beside other work is kept.

Writes ``DIR/fenwick_gdn2.csv``, ``DIR/fenwick_gdn2.md`` and ``DIR/fenwick_gdn2.png`` (cost per
token vs T, if matplotlib is installed), rewritten after every T.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

COLUMNS = ["T", "B", "H", "K", "V", "dtype", "op", "stacked_blocks", "fwd_ms", "fwdbwd_ms", "us_per_token",
           "vs_flat", "floor_ms", "vs_floor", "peak_extra_gib", "status"]


def _log(message: str):
    print(f"[fenwick_gdn2] {message}", file=sys.stderr, flush=True)


def stacked_blocks(T: int) -> int:
    """``NB = J + 1`` (``optimized.fenwick_gdn2.fwd.stacked_blocks``; 7 in a one-chunk call). The
    last chunk's split pass, 7 blocks over 64 tokens, is left out of the floor: 7 / (64·NB) of a
    step's V-proportional work at T = 4096."""
    from optimized.fenwick_gdn2.fwd import stacked_blocks as blocks

    return blocks(0, T, 0, False)


def _inputs(B, T, H, K, V, L, dtype, device, seed):
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    def leaf(x):
        return x.to(dtype).detach().requires_grad_(True)

    x = {"q": leaf(rnd(B, T, H, K)), "k": leaf(F.normalize(rnd(B, T, H, K), dim=-1)), "v": leaf(rnd(B, T, H, V)),
         "g": leaf(F.logsigmoid(rnd(B, T, H, K) + 2.5)), "b": leaf(torch.sigmoid(rnd(B, T, H, K))),
         "w": leaf(torch.sigmoid(rnd(B, T, H, V)))}
    lam = leaf(torch.sigmoid(rnd(B, T, H, L)))
    return x, lam, rnd(B, T, H, V).to(dtype)


def _timer(device):
    """``fn -> median ms``: ``do_bench`` on a GPU, a few wall-clock runs on the CPU."""
    if device == "cuda":
        import triton

        return lambda fn, leaves: triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=leaves)

    def cpu(fn, leaves, reps=1):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            for t in leaves:
                t.grad = None
        return sorted(times)[len(times) // 2]
    return cpu


OPS = ("flat", "fenwick_gdn2", "fenwick_gdn2_one_piece")
DEFAULT_OPS = ("flat", "fenwick_gdn2")


def _one_piece(step):
    """``step`` with the backward in one time piece (``optimized.fenwick_gdn2.bwd.TIME_PIECES = 1``,
    the backward before it was split along time): the op ``fenwick_gdn2_one_piece``, for a
    side-by-side of the time pieces' cost and peak. Only one-row steps (B = 1) differ."""
    from optimized.fenwick_gdn2 import bwd

    def one_piece():
        old, bwd.TIME_PIECES = bwd.TIME_PIECES, 1
        try:
            step()
        finally:
            bwd.TIME_PIECES = old
    return one_piece


def measure(T, B, H, K, V, dtype, device, seed=0, warmup_only=False, profile_dir=None, wanted=DEFAULT_OPS):
    """Rows for flat GDN-2 and the Fenwick GDN-2 memory at one T (``warmup_only``: one step per
    op, nothing timed, rows with status ``warm``; ``profile_dir``: also the kernel tables of one
    forward and one forward+backward per op, before the timing; ``wanted``: which of ``OPS``; without
    flat, no ratios)."""
    from optimized import chunk_fenwick_gdn2, chunk_gdn2
    from reference.fenwick import min_levels

    L = min_levels(T)
    x, lam, do = _inputs(B, T, H, K, V, L, dtype, device, seed)
    ops = {"flat": (list(x.values()), lambda: chunk_gdn2(**x)[0]),
           "fenwick_gdn2": (list(x.values()) + [lam], lambda: chunk_fenwick_gdn2(**x, level_scales=lam)[0])}
    ops["fenwick_gdn2_one_piece"] = ops["fenwick_gdn2"]
    ops = {name: op for name, op in ops.items() if name in wanted}
    timer = _timer(device)
    rows = {}
    for name, (leaves, forward) in ops.items():
        def step(forward=forward):
            forward().backward(do)
        if name == "fenwick_gdn2_one_piece":
            step = _one_piece(step)
        row = {"T": T, "B": B, "H": H, "K": K, "V": V, "dtype": str(dtype).replace("torch.", ""), "op": name,
               "stacked_blocks": stacked_blocks(T) if name != "flat" else 1, "status": "ok"}
        try:
            start = time.perf_counter()
            step()                                      # compile, autotune
            for t in leaves:
                t.grad = None
            if device == "cuda":
                torch.cuda.synchronize()
            _log(f"T={T} {name}: first step (compile, autotune) {time.perf_counter() - start:.1f} s")
            if warmup_only:
                row["status"] = "warm"
                rows[name] = row
                continue
            if profile_dir is not None and device == "cuda":
                from bench.harness import write_profile_table

                write_profile_table(profile_dir / f"profile_T{T}_{name}_fwd.txt", forward, leaves)
                write_profile_table(profile_dir / f"profile_T{T}_{name}_fwdbwd.txt", step, leaves)
            row["fwd_ms"] = timer(forward, leaves)
            row["fwdbwd_ms"] = timer(step, leaves)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                row["peak_extra_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 30, 3)
                for t in leaves:
                    t.grad = None
        except Exception as e:      # one failure must not cost the other rows
            row["status"] = f"error: {type(e).__name__}: {e}"[:200]
        rows[name] = row
        _log(str(row))
    flat = rows["flat"].get("fwdbwd_ms") if "flat" in rows else None
    for row in rows.values():
        ms = row.get("fwdbwd_ms")
        if ms is not None:
            row["us_per_token"] = round(ms * 1e3 / (B * T), 4)
        if ms is not None and flat:
            row["vs_flat"] = round(ms / flat, 3)
            row["floor_ms"] = round(flat * row["stacked_blocks"], 3)
            row["vs_floor"] = round(ms / row["floor_ms"], 3)
        for key in ("fwd_ms", "fwdbwd_ms"):
            if key in row:
                row[key] = round(row[key], 3)
    return list(rows.values())


def write(out: Path, rows: list) -> str:
    with open(out / "fenwick_gdn2.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    head = "| T | op | stacked blocks | fwd ms | fwd+bwd ms | µs / token | vs flat | floor ms | vs floor | peak GiB | status |"
    lines = ["# Fenwick GDN-2 memory vs flat GDN-2 (same heads)", "", head, "|" + "---|" * 11]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in
                                       ("T", "op", "stacked_blocks", "fwd_ms", "fwdbwd_ms", "us_per_token", "vs_flat",
                                        "floor_ms", "vs_floor", "peak_extra_gib", "status")) + " |")
    text = "\n".join(lines) + "\n"
    (out / "fenwick_gdn2.md").write_text(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return text
    fig, ax = plt.subplots(figsize=(6, 4))
    for op in OPS:
        pts = [(r["T"], r["us_per_token"]) for r in rows if r["op"] == op and "us_per_token" in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T")
    ax.set_ylabel("µs per token (forward+backward)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fenwick_gdn2.png", dpi=120)
    plt.close(fig)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ngdn bench fenwick-gdn2", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="output folder (default results/<date>-fenwick-gdn2/, '-quick' appended in --quick)")
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--tokens", type=int, default=65536, help="B·T per step (B = tokens // T, at least 1)")
    # H = 8: the stacked per-chunk states [B, ceil(T/64), H, K, (J + 1)·V] must stay under 2^31 elements
    # (int32 indexing in fla's kernels and ours); at 65536 tokens per step and K = V = 128 H = 8 keeps
    # them ≤ 1.5e9 at every T up to 65536, H = 16 only at T = 4096 (with J + 7 blocks, H200
    # 2026-11-30, H = 16 was refused at every T: 3.5e9 at T = 4096)
    parser.add_argument("-H", type=int, default=8)
    parser.add_argument("-K", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quick", action="store_true", help="CPU smoke: float32, T = 64, H = 1, K = V = 16")
    parser.add_argument("--warmup-only", action="store_true", help="compile only: one step per op and T, no timing")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(DEFAULT_OPS),
                        help="which ops to run (a ratio needs flat in the same run; fenwick_gdn2_one_piece: the "
                             "backward in one time piece, for a side-by-side at B = 1)")
    parser.add_argument("--profile", action="store_true",
                        help="kernel tables (torch.profiler, top 60) of one forward and one forward+backward per op "
                             "at the first T, DIR/profile_T<T>_<op>_<fwd|fwdbwd>.txt")
    args = parser.parse_args(argv)
    if args.out is None:
        import datetime

        args.out = f"results/{datetime.date.today().isoformat()}-fenwick-gdn2{'-quick' if args.quick else ''}"
    if args.quick:
        args.T, args.tokens, args.H, args.K, args.dtype = [64], 1, 1, 16, "float32"
    from bench.harness import prepare_environment

    prepare_environment()
    from optimized import triton_mode

    device = "cuda" if triton_mode.configure() == triton_mode.CUDA else "cpu"
    if device == "cpu" and not args.quick:
        parser.error("needs a GPU (or --quick for the CPU smoke run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, text = [], ""
    for T in args.T:
        rows += measure(T, max(1, args.tokens // T), args.H, args.K, args.K, getattr(torch, args.dtype), device,
                        warmup_only=args.warmup_only, wanted=args.ops,
                        profile_dir=out if args.profile and T == args.T[0] else None)
        text = write(out, rows)
        if device == "cuda":
            torch.cuda.empty_cache()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
