"""The promote scans alone, side by side in one run: launch choices and kernel forms of the
forward and reverse scans at the nested benchmark's level shapes.

Each upper level of the L = 4 benchmark row (B = 8, H = 16, K = V = 128, bf16 run: float32
scan operands) is one scan: level 1 fires 64 times with n = 16 pairs, level 2 32 times with
n = 32, level 3 16 times with n = 64 (the query ladder). A variant is timed on all three
(``triton.testing.do_bench`` medians) and the table gives the three and their sum. The reverse
scans' times include the per-V-block partial sums (they are part of the op's cost); the two-phase
scan's include a copy of the state gradients, which it overwrites (the op hands it a spent buffer).

    python -m bench.scan_ab --out results/DIR [--variants ...] [--levels 4] [-B 2 -T 16384]

Writes ``DIR/scan_ab.csv`` and ``DIR/scan_ab.md``. Variants are named by what differs from
``fwd`` (the IEEE forward scan, float32 runs' launch) and ``bwd`` (the TF32 reverse scan, the bf16
op's): ``-tf32`` the forward's dots on TF32 (``fwd-tf32`` is the bf16 op's forward: one V block
of 128), ``-sN`` Triton's ``num_stages``, ``-wN`` ``num_warps``, ``-bnN`` / ``-bvN`` pair and V
blocks, ``-pf`` the kernels loading their operands a step ahead (``prefetch=True``), ``2phase``
the two-phase reverse scan (``optimized.nested.promote_scan_two_phase``). The forward in
transition form (variants ``fwd-inline*``, ``fwd-streamed*``) and in groups of firings (``fwd-chunked*``)
were measured slower and removed: bench/NOTES.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.harness import write_side_by_side


def _log(message: str):
    print(f"[scan_ab] {message}", file=sys.stderr, flush=True)


def level_shapes(levels: int, T: int = 4096, chunk: int = 64, n1: int = 16) -> list[tuple[int, int]]:
    """``(F, n)`` of each upper level of the default ladder schedule at depth ``levels``: level ℓ
    fires every 2^(ℓ−1) chunks with n = n1 · 2^(ℓ−1) pairs."""
    return [(T // chunk // 2 ** (ℓ - 1), n1 * 2 ** (ℓ - 1)) for ℓ in range(1, levels)]


def _pairs(B, F, H, n, K, V, seed, device):
    import torch.nn.functional as Fn
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g, device=device)
    kappa = Fn.normalize(rnd(B, F, H, n, K), dim=-1)
    return (kappa, rnd(B, F, H, n, V), torch.sigmoid(rnd(B, F, H, n, K)) / n ** 0.5,
            torch.sigmoid(rnd(B, F, H, n, V)), -Fn.softplus(rnd(B, F, H, K) - 3.0))


def _variants() -> dict:
    """name -> ("fwd" | "bwd", fn(pairs, states, dstates))."""
    from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd
    from optimized.nested.promote_scan_two_phase import promote_scan_bwd_two_phase

    def fwd(**kw):
        kw.setdefault("precision", "ieee")
        return "fwd", lambda p, s, ds: promote_scan_fwd(None, *p, **kw)

    def bwd(**kw):
        kw.setdefault("precision", "tf32")
        return "bwd", lambda p, s, ds: promote_scan_bwd(s, *p, ds, **kw)

    def two(**kw):
        kw.setdefault("precision", "tf32")
        return "bwd", lambda p, s, ds: promote_scan_bwd_two_phase(s, *p, ds.clone(), consume_dstates=True, **kw)

    return {
        "fwd": fwd(), "fwd-s1": fwd(num_stages=1), "fwd-s2": fwd(num_stages=2),
        "fwd-bn32": fwd(block_n=32), "fwd-tf32": fwd(precision="tf32"),
        "fwd-tf32-s2": fwd(precision="tf32", num_stages=2), "fwd-tf32-w4-s2": fwd(precision="tf32", num_warps=4,
                                                                                 num_stages=2),
        "fwd-tf32-bv64": fwd(precision="tf32", block_v=64), "fwd-tf32-bv64-s1": fwd(precision="tf32", block_v=64,
                                                                                    num_stages=1),
        "fwd-tf32-bv64-s2": fwd(precision="tf32", block_v=64, num_stages=2),
        "fwd-tf32-bv64-s3": fwd(precision="tf32", block_v=64, num_stages=3),
        "fwd-tf32-bv64-w4": fwd(precision="tf32", block_v=64, num_warps=4),
        "fwd-tf32-bv128-w8": fwd(precision="tf32", block_v=128, num_warps=8),
        # with TF32 the forward's default V block is 128 (one block at V ≤ 128)
        "fwd-tf32-w4": fwd(precision="tf32", num_warps=4), "fwd-tf32-w16": fwd(precision="tf32", num_warps=16),
        "fwd-tf32-s3": fwd(precision="tf32", num_stages=3), "fwd-tf32-bn32": fwd(precision="tf32", block_n=32),
        "fwd-tf32-bn64": fwd(precision="tf32", block_n=64),
        "fwd-bv16": fwd(block_v=16), "fwd-bv64": fwd(block_v=64), "fwd-bv64-w16": fwd(block_v=64, num_warps=16),
        "fwd-bv128-w16": fwd(block_v=128, num_warps=16),
        # operands loaded a step ahead (promote_scan's prefetch kernels)
        "fwd-pf": fwd(prefetch=True), "fwd-pf-bv16": fwd(prefetch=True, block_v=16),
        "fwd-tf32-pf": fwd(precision="tf32", prefetch=True), "bwd-pf": bwd(prefetch=True),
        "fwd-tf32-bv32": fwd(precision="tf32", block_v=32), "fwd-tf32-pf-bv32": fwd(precision="tf32", block_v=32,
                                                                                   prefetch=True),
        "fwd-tf32-pf-bv64": fwd(precision="tf32", block_v=64, prefetch=True),
        "bwd-bv32": bwd(block_v=32), "bwd-ieee": bwd(precision="ieee"),
        "bwd-ieee-bv32": bwd(precision="ieee", block_v=32),
        "bwd-bv64-w16": bwd(block_v=64, num_warps=16),     # the old variant bwd-bv64 is now bwd
        "bwd-bv128-w8": bwd(block_v=128, num_warps=8), "bwd-bv128-w16": bwd(block_v=128, num_warps=16), "bwd-bv128-w16-bn32": bwd(block_v=128, num_warps=16,
                                                                                   block_n=32),
        "bwd": bwd(), "bwd-s1": bwd(num_stages=1), "bwd-s2": bwd(num_stages=2),
        "bwd-bn32": bwd(block_n=32), "bwd-bn32-s1": bwd(block_n=32, num_stages=1),
        "bwd-bn32-s2": bwd(block_n=32, num_stages=2),
        "2phase": two(), "2phase-bn32": two(block_n=32), "2phase-s1": two(num_stages=1),
        "2phase-w4": two(num_warps=4),
        # at the fused scan's V block (64): its carry has half the programs of 32
        "2phase-bv64": two(block_v=64), "2phase-bv64-w4": two(block_v=64, num_warps=4),
        "2phase-bv64-s1": two(block_v=64, num_stages=1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", nargs="+", default=None)
    parser.add_argument("--levels", type=int, default=4)
    parser.add_argument("-B", type=int, default=8)
    parser.add_argument("-H", type=int, default=16)
    parser.add_argument("-K", type=int, default=128)
    parser.add_argument("-T", type=int, default=4096)
    parser.add_argument("--profile", nargs="*", default=[],
                        help="variants whose kernels get a torch.profiler table per level (profile_<variant>_level<l>.txt)")
    parser.add_argument("--quick", action="store_true", help="CPU smoke: B = H = 1, K = V = 16, T = 256")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, H, K, T = (1, 1, 16, 256) if args.quick else (args.B, args.H, args.K, args.T)
    V = K
    variants = _variants()
    names = args.variants or list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(variants)}")
    if device == "cuda":
        import triton.testing

        def timer(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=100)
    else:
        def timer(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    from optimized.nested.promote_scan import promote_scan_fwd
    shapes = level_shapes(args.levels, T)
    data = []
    for ℓ, (F, n) in enumerate(shapes, start=1):
        pairs = _pairs(B, F, H, n, K, V, ℓ, device)
        states = promote_scan_fwd(None, *pairs, precision="ieee")
        dstates = torch.randn_like(states) * 1e-2
        data.append((F, n, pairs, states, dstates))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        kind, fn = variants[name]
        ms = []
        try:
            for F, n, pairs, states, dstates in data:
                fn(pairs, states, dstates)                        # compile
                ms.append(timer(lambda: fn(pairs, states, dstates)))
        except Exception as e:                                     # a variant that does not compile
            _log(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        if name in args.profile and device == "cuda":
            from bench.harness import write_profile_table
            for ℓ, (F, n, pairs, states, dstates) in enumerate(data, start=1):
                write_profile_table(out / f"profile_{name}_level{ℓ}.txt", lambda: fn(pairs, states, dstates))
        rows.append({"variant": name, "kind": kind, **{f"level{ℓ} ms": round(t, 4) for ℓ, t in
                                                       enumerate(ms, start=1)}, "sum ms": round(sum(ms), 4)})
        _log(f"{name}: {[round(t, 3) for t in ms]} sum {sum(ms):.3f} ms")
    title = (f"Promote scans side by side ({device}, B = {B}, H = {H}, K = V = {K}, T = {T}; "
             f"levels (F, n) = {[(F, n) for F, n, *_ in data]})")
    print(write_side_by_side(out, "scan_ab", title, rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
