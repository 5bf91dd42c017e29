"""What is alive at the memory peak of one step, and who allocated it (CUDA allocator history).

``record(step)`` runs ``step()`` once with ``torch.cuda.memory._record_memory_history`` on
(Python stacks only) and returns the allocator snapshot. ``peak_blocks`` replays the
snapshot's trace of this device: every ``alloc`` adds a block, every ``free_completed``
removes it; the peak is the largest sum of live blocks allocated *during the step* (blocks
alive before it, the inputs, are not in the trace: this is the step's "peak on top of its
inputs", as ``reads_ab``'s ``peak_extra_gib`` up to the allocator's rounding). ``by_site``
groups the blocks alive at the peak by the innermost stack frame in this repository
(``optimized/``, ``bench/``, ``reference/``) or in fla, with, for fla's, the innermost of ours
that called it: each row names the line of code that holds the memory.

    python -m bench.reads_ab --out DIR --levels 4 --variants triton --memory-at-peak
      -> DIR/memory_L4_triton.md, DIR/memory_L4_flat.md
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

OUR_ROOTS = ("optimized/", "bench/", "reference/")
FLA_ROOT = "fla/"
GIB = 2 ** 30


def record(step, max_entries: int = 200_000) -> dict:
    """The allocator snapshot after one ``step()`` recorded from its start (CUDA)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries, clear_history=True)
    try:
        step()
        torch.cuda.synchronize()
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def peak_blocks(trace: list) -> tuple[int, list, int]:
    """Replay one device's trace. Returns ``(peak bytes, [(size, frames) alive at the peak],
    index of the event that reached it)``. A ``free_completed`` of a block allocated before the
    recording (not in the trace) is ignored."""
    live: dict = {}
    total = peak = 0
    peak_at = -1
    peak_live: dict = {}
    for i, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            total += event["size"]
            if total > peak:
                peak, peak_at, peak_live = total, i, dict(live)
        elif action == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    return peak, list(peak_live.values()), peak_at


def _short(f: dict) -> str:
    name = f.get("filename", "?")
    for root in OUR_ROOTS + (FLA_ROOT,):
        if root in name:
            name = name[name.rindex(root):]
            break
    return f"{name}:{f.get('line', '?')} {f.get('name', '?')}"


def _in(f: dict, roots) -> bool:
    name = f.get("filename", "")
    return any(r in name for r in roots) and not any(m in name for m in ("memory_at_peak", "memory_cpu"))


def site(frames: list) -> tuple[str, str]:
    """``(allocated at, called from)``: the innermost frame in this repo or fla (else the
    innermost frame), and, if that one is fla's, the innermost frame in this repo."""
    at = next((f for f in frames if _in(f, OUR_ROOTS + (FLA_ROOT,))), frames[0] if frames else None)
    if at is None:
        return "(no stack)", ""
    caller = ""
    if _in(at, (FLA_ROOT,)):
        ours = next((f for f in frames if _in(f, OUR_ROOTS)), None)
        caller = _short(ours) if ours is not None else ""
    return _short(at), caller


def by_site(blocks: list) -> list:
    """``[((allocated at, called from), bytes, count)]`` by bytes, largest first."""
    sizes, counts = defaultdict(int), defaultdict(int)
    for size, frames in blocks:
        key = site(frames)
        sizes[key] += size
        counts[key] += 1
    return sorted(((k, sizes[k], counts[k]) for k in sizes), key=lambda r: -r[1])


def device_trace(snapshot: dict, device: int = 0) -> list:
    traces = snapshot.get("device_traces", [])
    return traces[device] if device < len(traces) else []


def write_table(path: Path, title: str, snapshot: dict, top: int = 25) -> list:
    """``path`` (markdown): the peak, its position in the trace and the ``top`` sites alive there."""
    trace = device_trace(snapshot)
    peak, blocks, at = peak_blocks(trace)
    rows = by_site(blocks)
    lines = [f"# {title}", "",
             f"Peak of the step's own allocations: {peak / GIB:.3f} GiB in {len(blocks)} blocks, "
             f"at event {at} of {len(trace)} (allocator trace; inputs allocated before the step are not counted).",
             "", "| GiB | blocks | allocated at (innermost frame in this repo or fla) | called from (ours, for fla's) |",
             "|---|---|---|---|"]
    lines += [f"| {size / GIB:.3f} | {count} | `{at}` | {f'`{caller}`' if caller else ''} |"
              for (at, caller), size, count in rows[:top]]
    rest = sum(size for _, size, _ in rows[top:])
    if rest:
        lines.append(f"| {rest / GIB:.3f} | {sum(c for _, _, c in rows[top:])} | (the other {len(rows) - top} sites) | |")
    Path(path).write_text("\n".join(lines) + "\n")
    return lines
