"""Launches with fallbacks for GPUs that refuse a block's shared memory, the refusal remembered.

Some launchers default to wide blocks or Triton's pipelining, which ask more shared memory per
program than some GPUs give a block; the launch is then refused with ``OutOfResources`` before it
runs, and a narrower form computes the same values. ``first_that_fits`` runs the forms in order
and remembers, per launch key, the first one the GPU took, so later calls start there: one
refusal per key and process, not one per call. (A refusal on every call cost the nested op's
L = 6 step an exception per launch on the host, and the exceptions' frames kept tensors alive
until the garbage collector ran: bench/NOTES.md.)
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

from triton.runtime.errors import OutOfResources

# launch key -> index of the first form the GPU took (only keys that were refused at least once)
_FIRST_THAT_FITS: dict = {}


def first_that_fits(key: Hashable, forms: Sequence[Callable]):
    """Runs ``forms`` (callables, preferred first) from the one remembered for ``key`` on, until one
    is not refused with ``OutOfResources``, and returns its result. ``key`` names everything that
    sets a form's shared memory: the kernel, its block sizes, stages and warps, the device. The
    last form's refusal propagates."""
    start = _FIRST_THAT_FITS.get(key, 0)
    for i in range(start, len(forms)):
        try:
            out = forms[i]()
        except OutOfResources:
            if i == len(forms) - 1:
                raise
            continue
        if i > start:
            _FIRST_THAT_FITS[key] = i
        return out
    raise ValueError(f"no launch forms for {key!r}")


def one_stage_where_refused(key: Hashable, run: Callable):
    """``run()`` at Triton's pipeline stages, or ``run(num_stages=1)`` where the GPU refuses the
    shared memory they stage (``first_that_fits`` with those two forms; the same values either way).
    ``run`` takes the launch's extra keyword arguments."""
    return first_that_fits(key, (run, lambda: run(num_stages=1)))
