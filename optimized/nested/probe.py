"""The probes of levels 1..L-1: the registered scheme's probe on every firing's snapshot at once."""
from __future__ import annotations

import torch

from optimized.nested.level0 import chunk_end_states
from optimized.nested.plan import Plan
from optimized.nested.snapshot_reads import SnapshotRows
from optimized.nested.stored_states import as_stored
from reference.nested import Level
from reference.schemes import get_scheme


def _probe(level: Level, snaps: torch.Tensor, params: dict, H: int, K: int, V: int):
    """The scheme's probe on ``snaps [B, F, H, K, V]`` (float32), outputs contiguous float32."""
    B, F = snaps.shape[:2]
    if F == 0:
        n = get_scheme(level.scheme).query_count(params, H, K, V)   # read from shapes, or the probe
        z = snaps.new_zeros
        return z(B, 0, H, n, K), z(B, 0, H, n, V), z(B, 0, H, n, K), z(B, 0, H, n, V), z(B, 0, H, K)
    outs = get_scheme(level.scheme).probe(snaps, params, level.reduction)
    return tuple(x.contiguous() for x in outs)


def _snapshots(plan: Plan, tables, ℓ: int, states: torch.Tensor | None, h=None, ht0=None) -> torch.Tensor:
    """The states of level ℓ-1 that level ℓ's firings probe: ``[B, F_ℓ, H, K, V]`` float32
    (``states``: every upper level's stored states, a ``StoredStates`` or one ``[B, S, H, K, V]``
    tensor)."""
    if ℓ == 1:
        if tables.packed is not None:
            return _packed_chunk_end_states(tables.packed, h, ht0)
        return chunk_end_states(h, ht0, plan.sources[1], index=tables.end_index,
                                includes_final=tables.end_includes_final)
    below = as_stored(states).level(tables, ℓ - 1)
    if not plan.sources[ℓ]:
        return below[:, :0]
    return below.index_select(1, tables.sources[ℓ])


def snapshot_rows(tables, ℓ: int, states, h: torch.Tensor, ht0: torch.Tensor) -> SnapshotRows:
    """What ``_snapshots`` gathers, as rows of the tensors that hold them (no copy): for ℓ = 1
    fla's chunk states ``h`` and the final states ``ht0``, for ℓ ≥ 2 level ℓ-1's stored states
    (``snapshot_reads``; the fused probe reads them in place)."""
    if ℓ == 1:
        return SnapshotRows(h, tables.snap_rows[1], ht0)
    return SnapshotRows(as_stored(states).level(tables, ℓ - 1), tables.snap_rows[ℓ])


def _packed_chunk_end_states(packed, h: torch.Tensor, ht0: torch.Tensor) -> torch.Tensor:
    """Level 1's snapshots with packed sequences, ``[1, F_1, H, K, V]`` float32: a firing at a
    sequence's inner chunk c reads the start of the next packed chunk (``h[:, c + 1]``), one at
    its last chunk (a whole last chunk) that sequence's final state ``ht0[i]``."""
    _, _, H, K, V = h.shape
    F = packed.end_pos.numel() + packed.final_pos.numel()
    ends = h.new_empty(1, F, H, K, V, dtype=torch.float32)
    if packed.end_pos.numel():
        ends[0, packed.end_pos] = h[0].index_select(0, packed.end_chunk).float()
    if packed.final_pos.numel():
        ends[0, packed.final_pos] = ht0.index_select(0, packed.final_seq).float()
    return ends
