"""Fenwick GDN-2's carry scans alone, side by side in one run: launch widths and stages, and
optionally the scans of another commit (``--baseline``).

The shapes are ``bench.fenwick_gdn2``'s (H = 8, K = V = 128, bf16, B·T = 65536): T = 4096
(B = 16, 7 stacked blocks) and T = 65536 (B = 1, 11 blocks), the main pass (one own block), no
final-state gradient (the training case). Each variant times the forward scan (``states_fwd``)
and the reverse scan (``states_bwd``) with ``triton.testing.do_bench`` medians, and reports the
largest difference of its outputs from the first variant's, relative to their largest value
(a miscompiled launch shows there; bf16 outputs differ in their last bit between forms).

    python -m bench.fenwick_scan_ab --out results/DIR [--variants ...] [--baseline FILE] [--jobs N]
        [--shape B,T,H,K,V ...] [--dtype bfloat16|float32]

``--baseline FILE``: a ``states.py`` of another commit (``git show REV:optimized/fenwick_gdn2/states.py
> FILE``), timed as variant ``baseline`` with its own launch defaults (its ``states_fwd`` and
``states_bwd`` take the same leading arguments). ``--jobs N``: compile the variants first in N
processes at once (the kernels are cached for the timed run). Variants: ``wW`` width W (the
columns a program holds over all blocks), ``-sN`` Triton's ``num_stages``, ``-bk128`` key blocks
of 128; ``default`` the op's launch. A launch that ends in an illegal memory access ends the
process (every later variant fails with it): run such sweeps one process per variant. Writes ``DIR/fenwick_scan_ab.csv`` and ``.md``.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time

import torch

from optimized import triton_mode  # the interpreter off the GPU: before Triton
import triton  # noqa: E402

from bench.harness import do_bench_timer, write_side_by_side  # noqa: E402

VARIANTS = {"default": {}, "w64": dict(width=64), "w64-s1": dict(width=64, num_stages=1),
            "w128-s1": dict(width=128, num_stages=1), "w128-bk128": dict(block_k=128),
            "w256": dict(width=256), "w256-s1": dict(width=256, num_stages=1)}
SHAPES = ((16, 4096), (1, 65536))        # (B, T) at H = 8, K = V = 128


def _log(message: str):
    print(f"[fenwick_scan_ab] {message}", file=sys.stderr, flush=True)


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("baseline_fenwick_states", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(B: int, T: int, H: int, K: int, V: int, device, dtype, seed: int = 0) -> dict:
    """Random scan operands of the main pass at ``(B, T, H, K, V)``: ``kg``, ``wy``, ``qg`` small,
    ``gk`` a log2 decay cumulated within each chunk, ``u`` on the own block only, the carry table
    of a sequence from token 0, ``do``, ``dv`` on every block."""
    from optimized.fenwick_gdn2.fwd import bucket_blocks, carry_table
    from optimized.fenwick_gdn2.states import CHUNK
    from reference.fenwick import min_levels

    L = min_levels(T)
    J = bucket_blocks(0, T, L, False)
    NB, N = J + 1, triton.cdiv(T, CHUNK)
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)
    u = torch.zeros(B, T, H, NB, V, device=device, dtype=dtype)
    u[:, :, :, J] = rnd(B, T, H, V, scale=1.0)
    steps = (torch.arange(T, device=device) % CHUNK + 1).float()
    gk = (-0.02 * steps[None, :, None, None] * torch.rand(B, 1, H, K, generator=g, device=device)).to(dtype)
    return dict(kg=rnd(B, T, H, K, scale=0.05), wy=rnd(B, T, H, K, scale=0.05), qg=rnd(B, T, H, K, scale=0.05),
                gk=gk, u=u.reshape(B, T, H, NB * V), mtab=carry_table(0, N, device),
                h0=torch.zeros(B, H, K, NB * V, device=device), do=rnd(B, T, H, NB * V, scale=0.1),
                dv=rnd(B, T, H, NB * V, scale=0.1), N=N, J=J, L=L, V=V)


def scan_calls(module, x: dict, precision: str, dtype, **launch):
    """``(forward, reverse)``: ``module``'s two scans on ``inputs``' ``x``, as calls without arguments."""
    def forward():
        return module.states_fwd(x["kg"], x["wy"], x["u"], x["gk"], x["mtab"], x["h0"], x["N"], x["J"], x["L"],
                                 x["V"], 1, precision=precision, dtype=dtype, **launch)

    def reverse():
        return module.states_bwd(x["qg"], x["kg"], x["wy"], x["gk"], x["do"], x["dv"], None, x["mtab"], 0.1, x["N"],
                                 x["J"], x["L"], x["V"], 1, precision=precision, dtype=dtype, **launch)
    return forward, reverse


def _wall_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _relative_difference(a, b) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        scale = y.float().abs().max().item() or 1.0
        worst = max(worst, (x.float() - y.float()).abs().max().item() / scale)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", nargs="+", default=None)
    parser.add_argument("--baseline", default=None, help="a states.py of another commit")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--warmup-only", action="store_true", help="compile (one call per shape), no timing")
    parser.add_argument("--shape", nargs="+", default=None, metavar="B,T,H,K,V",
                        help="other shapes (default: the two above at H = 8, K = V = 128)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="default: bf16 on CUDA")
    parser.add_argument("--quick", action="store_true", help="CPU smoke: H = 1, K = V = 16, (B, T) = (2, 200)")
    args = parser.parse_args(argv)
    from optimized.fenwick_gdn2 import states
    from optimized.fenwick_gdn2.precision import dot_precision

    device = "cuda" if triton_mode.configure() == triton_mode.CUDA else "cpu"
    dtype = (getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device == "cuda" else torch.float32)
    shapes = ([(2, 200, 1, 16, 16)] if args.quick else [(B, T, 8, 128, 128) for B, T in SHAPES])
    if args.shape:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape]
    names = args.variants or list(VARIANTS) + (["baseline"] if args.baseline else [])
    unknown = [n for n in names if n not in VARIANTS and not (n == "baseline" and args.baseline)]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)} (and baseline with --baseline)")
    baseline = load_baseline(args.baseline) if args.baseline else None
    if args.jobs > 1 and not args.warmup_only:
        extra = (["--baseline", args.baseline] if args.baseline else []) + (["--shape", *args.shape] if args.shape
                                                                             else []) + (["--dtype", args.dtype] if args.dtype else [])
        procs = [subprocess.Popen([sys.executable, "-m", "bench.fenwick_scan_ab", "--out", args.out, "--warmup-only",
                                   "--variants", *names[i::args.jobs], *extra]) for i in range(args.jobs)]
        for p in procs:
            p.wait()
    timer = do_bench_timer(25, 100) if device == "cuda" else _wall_ms
    precision = dot_precision(dtype)
    rows = []
    for B, T, H, K, V in shapes:
        x = inputs(B, T, H, K, V, device, dtype)
        first = None
        for name in names:
            module, launch = (baseline, {}) if name == "baseline" else (states, VARIANTS[name])
            try:
                forward, reverse = scan_calls(module, x, precision, dtype, **launch)
                out = forward(), reverse()
                if args.warmup_only:
                    continue
                fwd_ms, bwd_ms = timer(forward), timer(reverse)
            except Exception as e:                                   # a variant that does not compile or run
                _log(f"{name} at B = {B}, T = {T}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            flat = [t for part in out for t in part]
            diff = 0.0 if first is None else _relative_difference(flat, first)
            first = flat if first is None else first
            rows.append({"B": B, "T": T, "H": H, "K": K, "V": V, "blocks": x["J"] + 1, "variant": name, "fwd ms": round(fwd_ms, 3),
                         "bwd ms": round(bwd_ms, 3), "sum ms": round(fwd_ms + bwd_ms, 3),
                         "max rel. diff vs first": f"{diff:.2e}"})
            _log(f"B = {B}, T = {T}, {name}: fwd {fwd_ms:.3f} ms, bwd {bwd_ms:.3f} ms, diff {diff:.2e}")
            out = flat = None
        x = first = None                                             # free before the next shape
    if args.warmup_only:
        return 0
    print(write_side_by_side(args.out, "fenwick_scan_ab", f"Fenwick GDN-2 carry scans side by side ({device}, {dtype})",
                             rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
