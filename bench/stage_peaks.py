"""The memory peak of each stage of one nested step, on top of what was allocated before it.

``bench.memory_at_peak`` names what is alive at the step's one peak; a change that lowers that
peak moves it to another stage, whose height it does not show. This gives every stage's: the
nested op marks its stages with ``stage`` ranges (``optimized.nested.stages``: ``nested.level0_fwd``,
``nested.scan_bwd``, …; ``optimized/nested/fwd.py``, ``bwd.py``); while ``record(step)`` runs,
those ranges also reset the allocator's peak counter on entry and read it on exit (allocations
are host-side events: no synchronisation is needed). What runs between two ranges is counted as
``(between ranges)``. A stage entered several times (one per level) keeps its highest peak.

    python -m bench.reads_ab --out DIR --levels 4 --variants triton --stage-peaks
      -> DIR/stage_peaks_L4_triton.md
"""
from __future__ import annotations

import contextlib

BETWEEN = "(between ranges)"
GIB = 2 ** 30


class CudaCounter:
    """The CUDA caching allocator's counters of the current device."""

    def __init__(self):
        import torch

        self.torch = torch

    def reset(self):
        self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated()

    def now(self) -> int:
        return self.torch.cuda.memory_allocated()


def record(step, modules=None, counter=None) -> dict:
    """Run ``step()`` once; returns ``{stage: peak bytes on top of what was allocated before the
    step}`` in the order the stages were first entered. ``modules``: those whose module-level
    ``stage`` marks the stages (default: the nested forward and backward);
    ``counter``: the allocator's counters (default ``CudaCounter``)."""
    if modules is None:
        import optimized.nested.bwd as nested_bwd
        import optimized.nested.fwd as nested_fwd

        modules = (nested_fwd, nested_bwd)
    counter = CudaCounter() if counter is None else counter
    peaks: dict = {}
    base = counter.now()

    def note(name):
        peaks[name] = max(peaks.get(name, 0), counter.peak() - base)
        counter.reset()

    originals = [(m, m.stage) for m in modules]

    def ranged(original):
        @contextlib.contextmanager
        def stage(name):
            note(BETWEEN)
            with original(name):
                try:
                    yield
                finally:
                    note(name)
        return stage

    try:
        for m, original in originals:
            m.stage = ranged(original)
        counter.reset()
        step()
        note(BETWEEN)
    finally:
        for m, original in originals:
            m.stage = original
    return peaks


def write_table(path, title: str, peaks: dict, total_peak: int | None = None) -> str:
    """A markdown table of ``peaks`` (highest first) with each stage's share of the highest; in
    GiB, or MiB when the highest is under 1 GiB (the CPU tally's small shapes)."""
    top = max(peaks.values(), default=0)
    unit, size = ("GiB", GIB) if top >= GIB else ("MiB", 2 ** 20)
    lines = [f"# {title}", ""]
    if total_peak is not None:
        lines += [f"Peak of the whole step: {total_peak / size:.3f} {unit} on top of its inputs.", ""]
    lines += [f"| stage | peak {unit} | of the highest |", "|---|---|---|"]
    for name, value in sorted(peaks.items(), key=lambda kv: -kv[1]):
        lines.append(f"| `{name}` | {value / size:.3f} | {value / top if top else 0:.1%} |")
    text = "\n".join(lines) + "\n"
    if path is not None:
        with open(path, "w") as f:
            f.write(text)
    return text
