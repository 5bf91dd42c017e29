"""Named stage ranges for the profiler's table, recorded only while a profiler runs.

A ``torch.profiler.record_function`` range costs host time on every entry whether or not a
profiler listens (a dispatcher call to open it and one to close it); the nested op opens one per
stage and level, ≈ 28 a forward+backward step at L = 4, a third of the host's time to launch a
step at head dim 64 (bench/NOTES.md). ``stage`` opens the range only under an active profiler, so
``bench.reads_ab --profile`` still gets its stage table and a plain step pays one flag check."""
from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function

_NONE = contextlib.nullcontext()


def stage(name: str):
    """``record_function(name)`` while a profiler is active, else a context that does nothing."""
    if torch.autograd._profiler_enabled():
        return record_function(name)
    return _NONE
