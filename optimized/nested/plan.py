"""The nested schedule: where every level fires, what it probes and which state each chunk reads."""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from optimized.nested.level0 import CHUNK


@dataclass(frozen=True)
class Plan:
    """Where every level fires, what it probes and which state each chunk reads.

    ``fire_chunks[ℓ]``: the 1-based chunks at which level ℓ ≥ 1 fires (index 0 unused).
    ``sources[ℓ]``: what firing m probes: for ℓ = 1 the 0-based chunk whose end-of-chunk
    level-0 state it reads, for ℓ ≥ 2 the index of level ℓ-1's stored state.
    ``read_index[ℓ]``: per 0-based chunk, the index of ℓ's stored state its tokens read.
    ``read_group[ℓ]``: ``f`` when ``read_index[ℓ][j] == j // f`` for every chunk (the CONTRACT
    schedule: groups of f chunks read one state), else None.
    """
    T: int
    N: int
    L: int
    intervals: tuple
    fire_chunks: tuple
    sources: tuple
    read_index: tuple
    read_group: tuple

    def firings(self, level: int) -> int:
        return len(self.fire_chunks[level])


@functools.lru_cache(maxsize=256)
def make_plan(T: int, intervals: tuple, delay: int = 0) -> Plan:
    """The CONTRACT schedule (``delay = 0``). ``delay`` shifts every firing that many chunks
    later; it exists only for the mutation tests (a firing one chunk late)."""
    N = -(-T // CHUNK)
    n_full = T // CHUNK
    L = len(intervals) + 1
    fire_chunks, sources, read_index, read_group = [()], [()], [()], [None]
    for ℓ, f in enumerate(intervals, start=1):
        chunks = tuple(range(f + delay, n_full + 1, f))
        fire_chunks.append(chunks)
        if ℓ == 1:
            sources.append(tuple(c - 1 for c in chunks))
        else:       # level ℓ-1 after its firings at chunks <= c
            sources.append(tuple(bisect.bisect_right(fire_chunks[ℓ - 1], c) for c in chunks))
        # chunk j (0-based) begins after the firings at chunks c <= j (1-based)
        reads = tuple(bisect.bisect_right(chunks, j) for j in range(N))
        read_index.append(reads)
        read_group.append(f if all(s == j // f for j, s in enumerate(reads)) else None)
    return Plan(T, N, L, tuple(intervals), tuple(fire_chunks), tuple(sources), tuple(read_index),
                tuple(read_group))


# --- the schedule on the device ---------------------------------------------------------

@dataclass(frozen=True)
class PackedPlan:
    """The schedules of N sequences packed in one row (``cu_seqlens``): each sequence has its
    own chunk grid and firing schedule from its first token (``plans[i] = make_plan(T_i, …)``);
    the packed row concatenates them.

    Chunks: sequence i's local chunk c is the packed row's chunk ``chunk_offset[i] + c``
    (fla's varlen numbering), its tokens ``[start_i + 64c, min(start_i + 64(c + 1), end_i))``.
    Firings: level ℓ's firing m of sequence i is packed firing ``fire_offset[ℓ][i] + m``.
    Stored states: level ℓ keeps ``F_ℓ,i + 1`` states per sequence, in sequence order, so
    sequence i's state after m firings is the level's row ``fire_offset[ℓ][i] + i + m``.
    ``sources[ℓ]``: what each packed firing probes, in the same numbering (ℓ = 1: the packed
    chunk whose end-of-chunk level-0 state it reads; ℓ ≥ 2: the row of level ℓ-1).
    ``T``, ``N`` (packed chunks), ``L``, ``intervals``, ``firings(ℓ)`` (summed over sequences)
    as in ``Plan``, so the op's stages take either plan.
    """
    lengths: tuple
    T: int
    N: int
    L: int
    intervals: tuple
    plans: tuple
    chunk_offset: tuple
    fire_offset: tuple
    sources: tuple

    def firings(self, level: int) -> int:
        return self.fire_offset[level][-1]


@functools.lru_cache(maxsize=64)
def make_packed_plan(lengths: tuple, intervals: tuple, plan=make_plan) -> PackedPlan:
    """The packed schedule of sequences of ``lengths`` (each ≥ 1 token); ``plan(T, intervals)``
    makes each sequence's own (``make_plan``, or a test's twin). Cached per ``lengths``, as its
    device tables are: a run whose packing changes every step builds both once a step (host work
    linear in the packed chunks, and a few small host-to-device copies)."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive sequence lengths, got {lengths}")
    plans = tuple(plan(T_i, intervals) for T_i in lengths)
    L = len(intervals) + 1
    chunk_offset = [0]
    for p in plans:
        chunk_offset.append(chunk_offset[-1] + p.N)
    fire_offset, sources = [()], [()]
    for ℓ in range(1, L):
        offsets = [0]
        for p in plans:
            offsets.append(offsets[-1] + p.firings(ℓ))
        fire_offset.append(tuple(offsets))
        if ℓ == 1:
            sources.append(tuple(chunk_offset[i] + c for i, p in enumerate(plans) for c in p.sources[1]))
        else:
            below = fire_offset[ℓ - 1]
            sources.append(tuple(below[i] + i + s for i, p in enumerate(plans) for s in p.sources[ℓ]))
    return PackedPlan(tuple(lengths), sum(lengths), chunk_offset[-1], L, tuple(intervals), plans,
                      tuple(chunk_offset), tuple(fire_offset), tuple(sources))


@dataclass(frozen=True)
class PackedTables:
    """A packed plan's extra index tensors on one device (``device_tables``), for the kernels
    that index sequences themselves.

    ``cu_seqlens`` long ``[n + 1]`` and fla's ``chunk_indices`` (level 0); ``chunk_offsets``
    int32 ``[n + 1]`` (the state-gradient kernel); ``chunk_bounds`` int32 ``[N, 2]``: each packed
    chunk's first token and one past its last (the reads kernels); ``fire_offsets[ℓ]`` int32
    ``[n + 1]`` (level ℓ's scans); ``final_rows[ℓ]`` long ``[n]``: each sequence's last stored
    state among level ℓ's rows; the level-1 snapshots: ``end_pos`` / ``end_chunk`` (firings whose
    end-of-chunk state is ``h[:, chunk + 1]``) and ``final_pos`` / ``final_seq`` (firings at a
    sequence's last chunk, whose state is that sequence's final state).
    """
    cu_seqlens: object
    chunk_indices: object
    chunk_offsets: object
    chunk_bounds: object
    fire_offsets: tuple
    final_rows: tuple
    end_pos: object
    end_chunk: object
    final_pos: object
    final_seq: object


@dataclass(frozen=True)
class DeviceTables:
    """The plan's index tensors on one device, built once per (plan, device) and cached, so a
    step makes no host-to-device copies (each would stall the host on the stream).

    Upper levels' stored states live in one buffer ``[B, S, H, K, V]``: level ℓ's ``F_ℓ + 1``
    states at rows ``row_offset[ℓ] .. row_offset[ℓ] + F_ℓ`` (``row_offset[0] = 0`` unused).
    ``read_row [L, N]`` int32: the row chunk j reads for level ℓ ≥ 1 (row 0 for ℓ = 0, unused).
    ``row_level``, ``row_chunk_lo``, ``row_chunk_hi`` ``[S]`` int32: the level of row s and the
    chunks ``[lo, hi)`` that read it (``read_index`` is nondecreasing: one contiguous range).
    ``sources[ℓ]`` (long): what level ℓ's firings probe (for ℓ = 1 the level-0 chunk-end
    indices into fla's ``h``, ``end_index``: a ``slice`` when evenly spaced, else a long tensor;
    and whether the last one is the final state).
    ``add_rounds[ℓ]``: the deterministic rounds of ``dstates[ℓ-1][sources[ℓ]] += d_snaps``
    (each round a (targets, rows) pair with distinct targets); ``inject_rounds[ℓ]`` the same
    rounds' firings as int32 tensors (``snapshot_grads.add_snapshot_grads``, whose targets are
    ``snap_rows[ℓ]``).
    ``slots`` int32 ``[N]``: the level-0 injection slots of level 1's snapshots.
    ``snap_rows[ℓ]`` int32 ``[F_ℓ]``: the row each of level ℓ's firings probes, for the probe's
    in-place read (``snapshot_reads.SnapshotRows``): for ℓ = 1 a row of fla's ``h`` (``c + 1``
    for an end of chunk c), or ``-1 - i`` for the final state ``i`` (one sequence per row:
    ``-1``, the batch entry's own; packed: sequence i's); for ℓ ≥ 2 a row of level ℓ-1's states.
    ``snap_fire_ranges[ℓ]`` (ℓ ≥ 2; None below): int32 ``(lo, hi)``, each ``[rows of level ℓ-1]``:
    the firings ``[lo[s], hi[s])`` of level ℓ that probed level ℓ-1's row s (its ``sources`` are
    nondecreasing), for the state-gradient kernel that adds their factored snapshot gradients
    (``reads_bwd.reads_bwd_states``).
    ``packed``: a ``PackedPlan``'s extra tables (``PackedTables``), else None.
    """
    S: int
    row_offset: tuple
    read_row: object
    row_level: object
    row_chunk_lo: object
    row_chunk_hi: object
    sources: tuple
    end_index: object
    end_includes_final: bool
    add_rounds: tuple
    slots: object
    snap_rows: tuple
    inject_rounds: tuple
    snap_fire_ranges: tuple
    packed: PackedTables | None = None

    def level_rows(self, ℓ: int) -> slice:
        """Level ℓ ≥ 1's rows of the ``[B, S, H, K, V]`` buffer: its ``F_ℓ + 1`` stored states
        (the levels' rows are consecutive, in level order)."""
        end = self.row_offset[ℓ + 1] if ℓ + 1 < len(self.row_offset) else self.S
        return slice(self.row_offset[ℓ], end)


def _round_members(index) -> list[list[int]]:
    """The positions i of ``index`` in rounds of distinct ``index[i]``, in increasing i: round r
    holds each value's r-th occurrence."""
    rank, seen = [], {}
    for s in index:
        rank.append(seen.get(s, 0))
        seen[s] = rank[-1] + 1
    return [[i for i, k in enumerate(rank) if k == r] for r in range(max(rank, default=-1) + 1)]


def add_rounds(index, device):
    """Split ``dst[:, index[i]] += src[:, i]`` into rounds in which every target appears once
    (in increasing i): ``(targets, rows)`` per round, for ``add_in_rounds``; each a ``slice``
    where evenly spaced (every built-in schedule: one round of two slices), else a long index
    tensor on ``device``."""
    import torch

    rounds = []
    for sel in _round_members(index):
        targets = [index[i] for i in sel]
        rounds.append(tuple(_as_slice(x) or torch.tensor(x, device=device) for x in (targets, sel)))
    return tuple(rounds)


def inject_rounds(index, device) -> tuple:
    """``add_rounds``' rounds as int32 tensors of positions i (the firings whose snapshot
    gradients a launch of ``snapshot_grads.add_snapshot_grads`` adds)."""
    import torch

    return tuple(torch.tensor(sel, dtype=torch.int32, device=device) for sel in _round_members(index))


def add_in_rounds(dst, rounds, src) -> None:
    """``dst[:, index[i]] += src[:, i]`` along dim 1 with ``rounds = add_rounds(index, ...)``:
    deterministic, no atomics, no accumulating scatter. A round of two slices is one in-place
    add on strided views (H200, L = 4: a gather, an add and a scatter before, ≈ 1 ms a step)."""
    for targets, rows in rounds:
        if isinstance(targets, slice) and isinstance(rows, slice):
            dst[:, targets] += src[:, rows]
        else:
            dst[:, targets] = dst[:, targets] + src[:, rows]


def _as_slice(index: list) -> slice | None:
    """``slice(a, b, step)`` selecting exactly ``index`` (evenly spaced, increasing), else None."""
    if not index:
        return slice(0, 0)
    step = index[1] - index[0] if len(index) > 1 else 1
    if step <= 0 or index != list(range(index[0], index[-1] + 1, step)):
        return None
    return slice(index[0], index[-1] + 1, step)


def _row_tables(read_index, rows, N: int, L: int, device) -> tuple:
    """``(S, row_offset, read_row, row_level, row_chunk_lo, row_chunk_hi)`` of the reads kernels
    (``read_tables``), or their empty forms without upper levels (L = 1)."""
    import torch

    from optimized.nested.reads_fwd import read_tables

    if L < 2:
        i32 = dict(dtype=torch.int32, device=device)
        return (0, (0,), torch.zeros(1, N, **i32), *(torch.zeros(0, **i32) for _ in range(3)))
    reads = read_tables(read_index, rows, device)
    return (reads.row_offset[-1], reads.row_offset[:L], reads.read_row, reads.row_level, reads.row_chunk_lo,
            reads.row_chunk_hi)


@functools.lru_cache(maxsize=64)
def device_tables(plan: Plan | PackedPlan, device) -> DeviceTables:
    import torch

    from optimized.nested.level0 import injection_slots

    if isinstance(plan, PackedPlan):
        return _packed_device_tables(plan, device)
    N, L = plan.N, plan.L
    S, row_offset, read_row, row_level, lo, hi = _row_tables(
        plan.read_index, [0] + [plan.firings(ℓ) + 1 for ℓ in range(1, L)], N, L, device)
    sources = [None] + [torch.tensor(plan.sources[ℓ], dtype=torch.long, device=device) for ℓ in range(1, L)]
    ends = list(plan.sources[1]) if L > 1 else []
    inner = [c + 1 for c in ends if c + 1 < N]
    rounds = [None, None] + [add_rounds(plan.sources[ℓ], device) for ℓ in range(2, L)]
    return DeviceTables(
        S=S, row_offset=tuple(row_offset), read_row=read_row, row_level=row_level, row_chunk_lo=lo,
        row_chunk_hi=hi, sources=tuple(sources),
        end_index=_as_slice(inner) or torch.tensor(inner, dtype=torch.long, device=device),
        end_includes_final=bool(ends) and ends[-1] == N - 1,
        add_rounds=tuple(rounds), slots=injection_slots(N, ends, device),
        snap_rows=_snap_rows(inner + [-1] * (bool(ends) and ends[-1] == N - 1), plan.sources, L, device),
        inject_rounds=_inject_rounds(plan.sources, L, device),
        snap_fire_ranges=_snap_fire_ranges(plan.sources, row_offset, L, device))


def fire_ranges(targets, rows: int, device) -> tuple:
    """``(lo, hi)`` int32 ``[rows]``: the positions ``[lo[s], hi[s])`` of ``targets`` equal to s,
    for nondecreasing ``targets`` in ``0 .. rows - 1`` (a level's firings probe the level below's
    rows in order)."""
    import bisect

    import torch

    targets = list(targets)
    if any(a > b for a, b in zip(targets, targets[1:])) or any(not 0 <= t < rows for t in targets):
        raise ValueError(f"targets must be nondecreasing rows in [0, {rows}), got {targets}")
    lo = [bisect.bisect_left(targets, s) for s in range(rows)]
    hi = [bisect.bisect_right(targets, s) for s in range(rows)]
    return tuple(torch.tensor(x, dtype=torch.int32, device=device) for x in (lo, hi))


def _snap_fire_ranges(sources, row_offset, L: int, device) -> tuple:
    """``DeviceTables.snap_fire_ranges``: None for levels 0 and 1, ``fire_ranges`` of level ℓ ≥ 2's
    sources over level ℓ-1's rows."""
    return (None, None) + tuple(fire_ranges(sources[ℓ], row_offset[ℓ] - row_offset[ℓ - 1], device)
                                for ℓ in range(2, L))


def _inject_rounds(sources, L: int, device) -> tuple:
    """``DeviceTables.inject_rounds``: None for levels 0 and 1, ``inject_rounds`` of level ℓ ≥ 2's sources."""
    return (None, None) + tuple(inject_rounds(list(sources[ℓ]), device) for ℓ in range(2, L))


def _snap_rows(level1: list, sources, L: int, device) -> tuple:
    """``DeviceTables.snap_rows``: level 1's rows as given, level ℓ ≥ 2's its ``sources``."""
    import torch

    return (None,) + tuple(torch.tensor(level1 if ℓ == 1 else list(sources[ℓ]), dtype=torch.int32, device=device)
                           for ℓ in range(1, L))


def _packed_device_tables(plan: PackedPlan, device) -> DeviceTables:
    """``device_tables`` of a packed plan: the same row tables over the packed chunks and rows
    (each level's rows in sequence order), and ``PackedTables``."""
    import torch
    from fla.ops.utils import prepare_chunk_indices

    from optimized.nested.level0 import injection_slots

    N, L, n = plan.N, plan.L, len(plan.lengths)
    i32 = dict(dtype=torch.int32, device=device)
    i64 = dict(dtype=torch.long, device=device)
    fo, co = plan.fire_offset, plan.chunk_offset
    # level ℓ's packed read index: sequence i's rows start at fo[ℓ][i] + i (nondecreasing)
    read_index = [()] + [tuple(fo[ℓ][i] + i + r for i, p in enumerate(plan.plans) for r in p.read_index[ℓ])
                         for ℓ in range(1, L)]
    S, row_offset, read_row, row_level, lo, hi = _row_tables(
        read_index, [0] + [plan.firings(ℓ) + n for ℓ in range(1, L)], N, L, device)
    sources = [None] + [torch.tensor(plan.sources[ℓ], **i64) for ℓ in range(1, L)]
    rounds = [None, None] + [add_rounds(plan.sources[ℓ], device) for ℓ in range(2, L)]
    starts = [0]
    for T_i in plan.lengths:
        starts.append(starts[-1] + T_i)
    bounds = [(starts[i] + c * CHUNK, min(starts[i] + (c + 1) * CHUNK, starts[i + 1]))
              for i, p in enumerate(plan.plans) for c in range(p.N)]
    end_pos, end_chunk, final_pos, final_seq, level1 = [], [], [], [], []
    if L >= 2:
        for i, p in enumerate(plan.plans):
            for m, c in enumerate(p.sources[1]):
                if c + 1 < p.N:
                    end_pos.append(fo[1][i] + m)
                    end_chunk.append(co[i] + c + 1)
                    level1.append(co[i] + c + 1)
                else:
                    final_pos.append(fo[1][i] + m)
                    final_seq.append(i)
                    level1.append(-1 - i)
    cu_seqlens = torch.tensor(starts, **i64)
    packed = PackedTables(
        cu_seqlens=cu_seqlens, chunk_indices=prepare_chunk_indices(cu_seqlens, CHUNK),
        chunk_offsets=torch.tensor(co, **i32), chunk_bounds=torch.tensor(bounds, **i32).view(N, 2),
        fire_offsets=(None,) + tuple(torch.tensor(fo[ℓ], **i32) for ℓ in range(1, L)),
        final_rows=(None,) + tuple(torch.tensor([fo[ℓ][i + 1] + i for i in range(n)], **i64) for ℓ in range(1, L)),
        end_pos=torch.tensor(end_pos, **i64), end_chunk=torch.tensor(end_chunk, **i64),
        final_pos=torch.tensor(final_pos, **i64), final_seq=torch.tensor(final_seq, **i64))
    return DeviceTables(
        S=S, row_offset=tuple(row_offset), read_row=read_row, row_level=row_level, row_chunk_lo=lo,
        row_chunk_hi=hi, sources=tuple(sources), end_index=None, end_includes_final=False,
        add_rounds=tuple(rounds), slots=injection_slots(N, plan.sources[1] if L > 1 else (), device),
        snap_rows=_snap_rows(level1, plan.sources, L, device),
        inject_rounds=_inject_rounds(plan.sources, L, device),
        snap_fire_ranges=_snap_fire_ranges(plan.sources, row_offset, L, device), packed=packed)
