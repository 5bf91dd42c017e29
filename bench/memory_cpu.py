"""What is alive at the memory peak of one nested step, on the CPU (no GPU needed).

The CPU twin of ``bench.memory_at_peak`` (which replays the CUDA allocator's history): a
``TorchDispatchMode`` sees every tensor an aten op returns, counts the live tensors on each
storage (a weak-reference finalizer per tensor) and logs an ``alloc`` when a storage first
appears and a ``free_completed`` when its last tracked tensor dies, with the Python stack of
the allocation. ``bench.memory_at_peak.peak_blocks`` then replays that log exactly as it
replays the allocator's, and the table groups what is alive at the peak by allocating line.

Storages alive before the step (inputs, parameters) are not counted: the figure is the step's
peak on top of its inputs, like ``reads_ab``'s ``peak_extra_gib``. Not seen: memory that no aten
op returns (none in this repo's paths; the Triton interpreter writes into tensors allocated
by ``torch.empty``, which is seen). Every term of the nested op's memory is linear in
``B·H·T`` (per-token tensors, and stored states: firings ∝ T), so a small shape gives the
fractions of a large one at the same ``K, V, L``, intervals and query ladder; float32 runs
hold per-token activations at twice their bf16 size (the table shows each site's dtypes).

    python -m bench.memory_cpu --out DIR [-T 512] [-K 128] [--levels 4] [--stage-peaks]
      -> DIR/memory_cpu_L<L>_<variant>.md  (CPU interpreter, float32; about a minute at the defaults)
         DIR/stage_peaks_cpu_L<L>_<variant>.md  (with --stage-peaks: every stage's peak, bench.stage_peaks)
    python -m bench.memory_cpu --out DIR --op fenwick-gdn2 -T 1024 -K 64
      -> DIR/memory_cpu_fenwick_gdn2_T<T>.md  (Fenwick GDN-2: its stacked tensors grow with the
         bucket blocks J + 1, the bit length of the last chunk index, so T sets the proportions)
"""
from __future__ import annotations

import argparse
import sys
import traceback
import weakref
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bench.memory_at_peak import by_site, peak_blocks, site


class LiveStorages(TorchDispatchMode):
    """Logs ``alloc`` / ``free_completed`` events of the storages aten ops return (see the module
    docstring); ``known`` storages (by data pointer) are never logged."""

    def __init__(self, known=()):
        super().__init__()
        self.events: list = []
        self.known = set(known)
        self.live: dict = {}        # data pointer -> number of live tracked tensors on it
        self.sizes: dict = {}       # data pointer -> bytes, while alive
        self.total = self.high = 0  # bytes alive now, and the most since ``high`` was last reset

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or ptr in self.known:
            return
        if ptr not in self.live:
            frames = [{"filename": f.filename, "line": f.lineno, "name": f.name}    # innermost first,
                      for f in reversed(traceback.extract_stack()[:-2]) if "/torch/" not in f.filename]  # torch's own left out
            self.events.append({"action": "alloc", "addr": ptr, "size": size, "frames": frames,
                                "dtype": str(t.dtype).replace("torch.", "")})
            self.live[ptr] = 0
            self.sizes[ptr] = size
            self.total += size
            self.high = max(self.high, self.total)
        self.live[ptr] += 1
        weakref.finalize(t, self._release, ptr)

    def _release(self, ptr):
        self.live[ptr] -= 1
        if self.live[ptr] == 0:
            del self.live[ptr]
            self.events.append({"action": "free_completed", "addr": ptr})
            self.total -= self.sizes.pop(ptr)


class TrackerCounter:
    """``bench.stage_peaks``'s counter over a ``LiveStorages`` tracker: each stage's peak on the CPU."""

    def __init__(self, tracker: LiveStorages):
        self.tracker = tracker

    def reset(self):
        self.tracker.high = self.tracker.total

    def peak(self) -> int:
        return self.tracker.high

    def now(self) -> int:
        return self.tracker.total


def storages_of(tensors) -> set:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def record(step, known_tensors) -> list:
    """The event log of one ``step()`` (storages of ``known_tensors`` not counted)."""
    tracker = LiveStorages(storages_of(known_tensors))
    with tracker:
        step()
    return tracker.events


def table(events: list, title: str, top: int = 25) -> list:
    """Markdown lines: the peak and the ``top`` allocating sites alive there, with their dtypes."""
    peak, blocks, at = peak_blocks(events)
    dtypes = defaultdict(set)
    allocs = {id(e["frames"]): e for e in events if e.get("action") == "alloc"}
    for size, frames in blocks:
        dtypes[site(frames)].add(allocs[id(frames)]["dtype"])
    rows = by_site(blocks)
    lines = [f"# {title}", "",
             f"Peak of the step's own allocations: {peak / 2 ** 20:.2f} MiB in {len(blocks)} storages, at event {at} "
             f"of {len(events)} (CPU, `bench.memory_cpu`; inputs and parameters not counted).", "",
             "| share | MiB | storages | dtype | allocated at (innermost frame in this repo or fla) | called from |",
             "|---|---|---|---|---|---|"]
    for (where, caller), size, count in rows[:top]:
        lines.append(f"| {size / max(peak, 1):.1%} | {size / 2 ** 20:.2f} | {count} | "
                     f"{', '.join(sorted(dtypes[(where, caller)]))} | `{where}` | {f'`{caller}`' if caller else ''} |")
    rest = sum(size for _, size, _ in rows[top:])
    if rest:
        lines.append(f"| {rest / max(peak, 1):.1%} | {rest / 2 ** 20:.2f} | {sum(c for _, _, c in rows[top:])} | | "
                     f"(the other {len(rows) - top} sites) | |")
    return lines


def nested_step(B, T, H, K, V, L, seed=0, pieces=None):
    """``(step, leaves)``: one forward+backward of the default nested op (float32, CPU)."""
    import torch.nn.functional as F

    from optimized.nested import Pieces, _nested
    from reference.nested import make_levels

    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, fn=lambda x: x):
        return fn(torch.randn(*shape, generator=gen)).requires_grad_(True)

    x = {"q": leaf(B, T, H, L, K), "k": leaf(B, T, H, K, fn=lambda t: F.normalize(t, dim=-1)), "v": leaf(B, T, H, V),
         "g": leaf(B, T, H, K, fn=lambda t: F.logsigmoid(t + 2.5)), "b": leaf(B, T, H, K, fn=torch.sigmoid),
         "w": leaf(B, T, H, V, fn=torch.sigmoid), "r": leaf(B, T, H, L)}
    levels = make_levels(L, H, K, V, generator=torch.Generator().manual_seed(seed + 1))
    params = [p.requires_grad_(True) for lv in levels for p in lv.params.values()]
    do = torch.randn(B, T, H, V, generator=gen)
    pieces = pieces or Pieces()

    def step():
        _nested(levels=levels, pieces=pieces, **x)[0].backward(do)

    return step, list(x.values()) + params + [do]


def fenwick_gdn2_step(B, T, H, K, V, seed=0):
    """``(step, leaves)``: one forward+backward of ``chunk_fenwick_gdn2`` (float32, CPU) with the
    fewest levels T allows."""
    import torch.nn.functional as F

    from optimized.fenwick_gdn2 import chunk_fenwick_gdn2
    from reference.fenwick import min_levels

    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, fn=lambda x: x):
        return fn(torch.randn(*shape, generator=gen)).requires_grad_(True)

    x = {"q": leaf(B, T, H, K), "k": leaf(B, T, H, K, fn=lambda t: F.normalize(t, dim=-1)), "v": leaf(B, T, H, V),
         "g": leaf(B, T, H, K, fn=lambda t: F.logsigmoid(t + 2.5)), "b": leaf(B, T, H, K, fn=torch.sigmoid),
         "w": leaf(B, T, H, V, fn=torch.sigmoid), "level_scales": leaf(B, T, H, min_levels(T), fn=torch.sigmoid)}
    do = torch.randn(B, T, H, V, generator=gen)

    def step():
        chunk_fenwick_gdn2(**x)[0].backward(do)

    return step, list(x.values()) + [do]


def _tally(step, known, title: str, path: Path, stages: Path | None = None):
    """Runs ``step`` once untracked (caches, plan tables), then once tracked; writes and prints the
    table. ``stages``: also run it once more with every stage's peak (``bench.stage_peaks``) and
    write that table there."""
    from optimized.checks import finite_checks

    with finite_checks(False):
        step()
        for t in known:
            t.grad = None
        events = record(step, known)
        for t in known:
            t.grad = None
        if stages is not None:
            from bench import stage_peaks

            tracker = LiveStorages(storages_of(known))
            with tracker:
                peaks = stage_peaks.record(step, counter=TrackerCounter(tracker))
            stage_peaks.write_table(stages, title.replace("memory alive at its peak", "memory peak of each stage"),
                                    peaks, peak_blocks(events)[0])
    lines = table(events, title)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("-B", type=int, default=1)
    parser.add_argument("-T", type=int, default=512)
    parser.add_argument("-H", type=int, default=1)
    parser.add_argument("-K", type=int, default=128, help="K = V")
    parser.add_argument("--levels", type=int, nargs="+", default=[4])
    parser.add_argument("--keep-z", action="store_true",
                        help="Pieces(probe_keeps_preactivations=True) instead of the default op")
    parser.add_argument("--op", choices=("nested", "fenwick-gdn2"), default="nested",
                        help="fenwick-gdn2: chunk_fenwick_gdn2 (--levels ignored: the fewest T allows)")
    parser.add_argument("--stage-peaks", action="store_true",
                        help="nested: also every stage's peak (bench.stage_peaks) in stage_peaks_cpu_L<L>_<variant>.md")
    args = parser.parse_args(argv)
    from optimized import triton_mode

    if triton_mode.configure() != triton_mode.CPU_INTERPRET:
        parser.error("a CPU tally (cpu-interpret mode); on a GPU use `reads_ab --memory-at-peak`")
    from optimized.nested import Pieces

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = f"B={args.B}, T={args.T}, H={args.H}, K=V={args.K}, float32"
    if args.op == "fenwick-gdn2":
        step, known = fenwick_gdn2_step(args.B, args.T, args.H, args.K, args.K)
        _tally(step, known, f"Fenwick GDN-2, one forward+backward on the CPU: memory alive at its peak ({shape})",
               out / f"memory_cpu_fenwick_gdn2_T{args.T}.md")
        return 0
    pieces = Pieces(probe_keeps_preactivations=args.keep_z)
    variant = "keep-z" if args.keep_z else "default"
    for L in args.levels:
        step, known = nested_step(args.B, args.T, args.H, args.K, args.K, L, pieces=pieces)
        _tally(step, known, f"L={L} nested ({variant}), one forward+backward on the CPU: memory alive at its peak "
                            f"({shape})", out / f"memory_cpu_L{L}_{variant}.md",
               stages=out / f"stage_peaks_cpu_L{L}_{variant}.md" if args.stage_peaks else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
