"""The fused probe's gates alone, side by side in one run: the Triton gates on a bmm's ``z``
(``probe_gates``, with the head-major copy of ``ν`` and the bmm they need) against the gates that
make ``z = ν W`` themselves (``probe_gates_nu``), forward and backward, at the nested benchmark's
level shapes (B = 8, T = 4096, H = 16, K = V = 128, the ladder: level ℓ fires 64 / 2^(ℓ−1) times
with n = 16 · 2^(ℓ−1) pairs; every level has B·F·n = 8192 rows a head). TF32 products, as in bf16
runs. ``-s1``: the new kernels at one pipeline stage (96 KiB of shared memory instead of 192).

    python -m bench.gates_ab --out results/DIR [--levels 4] [-K 128]

Writes ``DIR/gates_ab.csv`` and ``DIR/gates_ab.md`` (``triton.testing.do_bench`` medians, ms).
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from unittest import mock

import torch

from bench.harness import write_side_by_side
from bench.scan_ab import level_shapes


@contextmanager
def _stages(stages):
    """The new kernels' launches at ``stages`` pipeline stages (None: Triton's default)."""
    import optimized.nested.probe_gates_nu as nu_module

    if stages is None:
        yield
        return
    with mock.patch.object(nu_module, "_launch", lambda kernel, grid, *a, pipelined=True, **kw: kernel[grid](
            *a, num_stages=stages, **kw)):
        yield


def _passes(Bt, H, n, K, V, device):
    """name -> (forward closure, backward closure) of each variant on one level's shape."""
    from optimized.nested.probe_fused import float32_matmuls
    from optimized.nested.probe_gates import probe_gates_bwd, probe_gates_fwd
    from optimized.nested.probe_gates_nu import probe_gates_nu_bwd, probe_gates_nu_fwd

    g = torch.Generator(device=device).manual_seed(0)
    nu = torch.randn(Bt, H, n, V, generator=g, device=device)
    W = torch.randn(H, V, 3 * K + V, generator=g, device=device) / V ** 0.5
    outs = [nu.new_empty(Bt, H, n, K), nu.new_empty(Bt, H, n, K), nu.new_empty(Bt, H, n, V), nu.new_empty(Bt, H, K)]
    grads = [torch.randn_like(o) for o in outs]

    def z():
        with float32_matmuls("tf32"):
            return torch.bmm(nu.transpose(0, 1).reshape(H, Bt * n, V), W)

    def bmm_fwd():
        probe_gates_fwd("learned", z(), Bt, H, n, K, V, "mean", *outs)

    def bmm_bwd():
        probe_gates_bwd("learned", z(), Bt, H, n, K, V, "mean", *grads, overwrite_z=True)

    def nu_fwd(stages=None):
        with _stages(stages):
            probe_gates_nu_fwd("learned", nu, W, Bt, H, n, K, V, "mean", *outs, precision="tf32")

    def nu_bwd(stages=None):
        with _stages(stages):
            probe_gates_nu_bwd("learned", nu, W, Bt, H, n, K, V, "mean", *grads, precision="tf32")

    return {"bmm+gates": (bmm_fwd, bmm_bwd), "gates-nu": (nu_fwd, nu_bwd),
            "gates-nu-s1": (lambda: nu_fwd(1), lambda: nu_bwd(1))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--levels", type=int, default=4)
    parser.add_argument("-B", type=int, default=8)
    parser.add_argument("-H", type=int, default=16)
    parser.add_argument("-K", type=int, default=128)
    parser.add_argument("-T", type=int, default=4096)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU")
    import triton.testing
    from pathlib import Path

    shapes = level_shapes(args.levels, args.T)
    table = {}
    for ℓ, (F, n) in enumerate(shapes, start=1):
        for name, (fwd, bwd) in _passes(args.B * F, args.H, n, args.K, args.K, "cuda").items():
            for kind, fn in (("fwd", fwd), ("bwd", bwd)):
                fn()                                                    # compile
                table.setdefault((name, kind), []).append(triton.testing.do_bench(fn, warmup=25, rep=100))
    rows = [{"variant": name, "pass": kind, **{f"level{ℓ} ms": round(t, 4) for ℓ, t in enumerate(ms, start=1)},
             "sum ms": round(sum(ms), 4)} for (name, kind), ms in table.items()]
    title = (f"The probe's gates alone (cuda, B = {args.B}, H = {args.H}, K = V = {args.K}, T = {args.T}; "
             f"levels (F, n) = {shapes})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(write_side_by_side(out, "gates_ab", title, rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
