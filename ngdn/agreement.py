"""``ngdn check``: each component's optimized path against its reference on one default draw.

The checks themselves are the library's check functions (``ngdn.checks``), the ones the
property tests run, so the report and the suite measure the same thing against the same
``tolerances.yaml``.

A component takes seconds on CPU and up to minutes on a cold GPU (kernel
compilation), so ``run_all`` can write a progress line before and after each one.
"""
from __future__ import annotations

import time
from typing import TextIO


def component(info):
    """``ngdn check``'s run of one table entry: its ``vs_reference`` on its covering draw (B = 2,
    H = 2, more than one chunk, ragged; the family's first compile bucket's sizes on CUDA), one row
    per tolerance quantity (the worst of its items: levels, parameters)."""
    def run(dtype, seed, cuda):
        from ngdn.checks.generic import quantity, vs_reference

        draw = info.covering()._replace(seed=seed)
        errors = vs_reference(info, draw, dtype, info.op, True)
        worst = {}
        for label, (err, bound) in errors.items():
            q = quantity(label)
            if q not in worst or err > worst[q][0]:
                worst[q] = (err, bound)
        options = f" {dict(draw.options)}" if draw.options else ""
        return f"{draw.shape}{options}", worst
    return run


def _components():
    from ngdn.ops import OPS

    return {info.name: component(info) for info in OPS}


# name -> callable(dtype, seed, cuda) -> (description of the draw, {quantity: (error, bound)}): every
# op of the table ``ngdn.ops``.
COMPONENTS = _components()


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
