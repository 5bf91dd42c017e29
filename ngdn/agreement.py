"""``ngdn check``: each component's optimized path against its reference on one default draw.

The checks themselves are the library's check functions (``ngdn.checks``), the ones the
property tests run, so the report and the suite measure the same thing against the same
``tolerances.yaml``.

A component takes seconds on CPU and up to minutes on a cold GPU (kernel
compilation), so ``run_all`` can write a progress line before and after each one.
"""
from __future__ import annotations

import importlib
import time
from typing import TextIO

from ngdn.inputs import GDN2Shape

def _checks(module: str):
    """``ngdn.checks.<module>``, imported on first use (it loads the device mode and fla)."""
    return importlib.import_module(f"ngdn.checks.{module}")


def gdn2(dtype, seed, cuda):
    shape = GDN2Shape(B=2, T=300, H=2, K=64, V=64) if cuda else GDN2Shape(B=1, T=100, H=2, K=32, V=32)
    return shape, _checks("gdn2").optimized_vs_reference(shape, seed, dtype, log=True)


def fenwick(dtype, seed, cuda):
    from ngdn.fenwick_inputs import FenwickShape

    shape = FenwickShape(B=2, T=300, H=2, K=64, V=64) if cuda else FenwickShape(B=1, T=100, H=2, K=32, V=32)
    return shape, _checks("fenwick").optimized_vs_reference(shape, seed, dtype, log=True)


def tensor3d(mode):
    def run(dtype, seed, cuda):
        from ngdn.tensor3d_inputs import Tensor3DShape

        shape = (Tensor3DShape(B=2, T=300, H=2, K=32, E=4, V=64) if cuda
                 else Tensor3DShape(B=1, T=100, H=1, K=16, E=4, V=32))
        config = dict(mode=mode, gate="channel", key_mode="sigmoid")
        errors = _checks("tensor3d").optimized_vs_reference(shape, seed, dtype, log=True, **config)
        return f"{shape} {config}", errors
    return run


def nested(dtype, seed, cuda):
    from ngdn.nested_inputs import NestedShape

    checks = _checks("nested_optimized")
    shape = (NestedShape(B=1, T=300, H=2, L=4, K=64, V=64) if cuda
             else NestedShape(B=1, T=200, H=1, L=3, K=16, V=16))
    case = checks.OptCase(shape=shape, seed=seed)
    errors = checks.optimized_vs_reference(case, dtype, log=True)
    # one row per tolerance quantity: the worst of its items (levels, parameters)
    worst = {}
    for label, (err, bound) in errors.items():
        quantity = checks.tolerance_quantity(label)
        if quantity not in worst or err > worst[quantity][0]:
            worst[quantity] = (err, bound)
    return f"{shape}, default schedule and query ladder (learned)", worst


# name -> callable(dtype, seed, cuda) -> (description of the draw, {quantity: (error, bound)})
COMPONENTS = {"gdn2": gdn2, "nested": nested, "fenwick": fenwick, "tensor3d-gla": tensor3d("gla"),
              "tensor3d-delta": tensor3d("delta")}


def run_all(dtype, seed, only=None, progress: TextIO | None = None):
    """Run the components (all, or ``only``) in order; with ``progress`` (e.g. sys.stderr)
    write ``[ngdn check] 2/5 nested float32 ...`` before each and the same line with
    its duration after, flushed, so a long run shows where it is."""
    from optimized import triton_mode

    cuda = triton_mode.configure() == triton_mode.CUDA
    names = only or list(COMPONENTS)
    unknown = set(names) - set(COMPONENTS)
    if unknown:
        raise SystemExit(f"unknown component(s) {sorted(unknown)}; have {sorted(COMPONENTS)}")
    results = {}
    for number, name in enumerate(names, start=1):
        label = f"[ngdn check] {number}/{len(names)} {name} {str(dtype).removeprefix('torch.')} ..."
        if progress is not None:
            print(label, file=progress, flush=True)
        start = time.perf_counter()
        results[name] = COMPONENTS[name](dtype, seed, cuda)
        if progress is not None:
            print(f"{label} {time.perf_counter() - start:.1f} s", file=progress, flush=True)
    return results
