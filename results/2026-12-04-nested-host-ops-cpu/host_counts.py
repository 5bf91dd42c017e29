"""The nested op's host work per call on the CPU, every Triton launch and autotuner dispatch a no-op:
Triton launches, ATen ops (a TorchDispatchMode counting every op) and host milliseconds, per forward
and per step (forward + backward), at L = 4 and 6, K = V = 64, learned scheme, inputs and level
parameters in bf16 (the benchmark's case; the interpreter-mode refusal of bf16 is lifted here, since
no kernel runs) or float32.

Run from the repository root:
    python results/2026-12-04-nested-host-ops-cpu/host_counts.py [--dtype bf16|f32] [--profile N] [--ops]
``--profile N``: also print cProfile's N top functions by tottime and cumtime (one step);
``--ops``: the ATen op counts by name."""
from __future__ import annotations

import argparse
import collections
import importlib
import cProfile
import pstats
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from optimized import chunk_nested_gdn2  # (first: the device mode before the kernels)
import triton.runtime.autotuner as at
import triton.runtime.interpreter as interp
from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized.checks import finite_checks
from reference.nested import Level

LAUNCHES = collections.Counter()


def _no_launch(kind):
    def run(self, *a, **k):
        LAUNCHES[kind] += 1
    return run


interp.InterpretedFunction.run = _no_launch("jit")
at.Autotuner.run = _no_launch("autotuned")
importlib.import_module("optimized.nested.function")      # with the modules it imports
# bf16 is refused under the interpreter (its dots are wrong there); no kernel runs here, so lift it
for _m in [m for n, m in list(sys.modules.items()) if n.startswith("optimized") and hasattr(m, "check_kernel_dtype")]:
    _m.check_kernel_dtype = lambda name, x: None


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def make(L: int, dtype, B=2, T=512, H=2, K=64):
    x = nested_inputs(NestedShape(B=B, T=T, H=H, L=L, K=K, V=K), seed=0, scheme="learned")
    args = {n: x[n].to(dtype).requires_grad_() for n in ("q", "k", "v", "g", "b", "w", "r")}
    levels = [Level(lv.scheme, lv.interval, {n: p.to(dtype).requires_grad_() for n, p in lv.params.items()},
                    lv.reduction) for lv in x["levels"]]
    do = torch.ones(B, T, H, K, dtype=dtype)
    return args, levels, do


def forward(args, levels, do):
    with torch.no_grad():
        return chunk_nested_gdn2(**args, levels=levels)


def forward_grad(args, levels, do):
    return chunk_nested_gdn2(**args, levels=levels)     # the graph-building forward of a step


def step(args, levels, do):
    """A training step's op work: forward, backward; the gradients left as a zero_grad(set_to_none)
    leaves them, so autograd's accumulation into .grad is a hand-over, not an add (not the op's work)."""
    chunk_nested_gdn2(**args, levels=levels)[0].backward(do)
    for x in [*args.values(), *(p for lv in levels for p in lv.params.values())]:
        x.grad = None


def counts(fn, inputs):
    LAUNCHES.clear()
    with CountOps() as mode:
        fn(*inputs)
    return sum(LAUNCHES.values()), sum(mode.ops.values()), mode.ops


def timed(fn, inputs, rounds=15, per=20):
    ms = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(per):
            fn(*inputs)
        ms.append(1e3 * (time.perf_counter() - t) / per)
    return statistics.median(ms), min(ms)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f32"))
    ap.add_argument("--levels", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args(argv)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"torch {torch.__version__}, dtype {a.dtype}, B=2 T=512 H=2 K=V=64, learned; launches stubbed")
    with finite_checks(False):
        for L in a.levels:
            inputs = make(L, dtype)
            for name, fn in (("forward (grad)", forward_grad), ("forward (no_grad)", forward), ("step", step)):
                for _ in range(3):
                    fn(*inputs)
                n_launch, n_ops, ops = counts(fn, inputs)
                med, lo = timed(fn, inputs, rounds=a.rounds)
                print(f"L={L} {name:18s} launches {n_launch:4d}  aten ops {n_ops:5d}  host ms median {med:.3f} min {lo:.3f}")
                if a.ops:
                    print("   ", dict(ops.most_common()))
                if a.profile and name != "forward (no_grad)":
                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(10):
                        fn(*inputs)
                    pr.disable()
                    for key in ("tottime", "cumulative"):
                        print(f"--- cProfile L={L} {name}, 10 calls, by {key}")
                        pstats.Stats(pr, stream=sys.stdout).sort_stats(key).print_stats(a.profile)


if __name__ == "__main__":
    main()
