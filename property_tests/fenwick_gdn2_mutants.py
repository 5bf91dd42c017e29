"""Deliberately broken chunked Fenwick GDN-2 ops: every property of ``ngdn.checks.fenwick_gdn2`` fails
on one of them.

Each mutant is ``optimized.chunk_fenwick_gdn2`` with one named piece of its forward replaced
(the pieces are module-level names of ``optimized.fenwick_gdn2.fwd``, swapped only for the
duration of the call; tests in one process run one at a time), or with one exact source
substitution planted in a production kernel or function (``kernel_mutation.py``). The backward
reuses what the forward saved, so a value mutant is checked on values only. The packed-row
mutants (end of file) break how a sequence of a packed row finds its chunks.
"""
from __future__ import annotations

import dataclasses
from unittest import mock

import torch

import optimized.fenwick_gdn2.chunk as chunk
import optimized.fenwick_gdn2.fwd as fwd
import optimized.fenwick_gdn2.packing as packing
import optimized.fenwick_gdn2.router as router
import optimized.fenwick_gdn2.states as states
from kernel_mutation import Plant, planted
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2


def _call(pieces, args, kwargs):
    with mock.patch.multiple(fwd, **pieces):
        return chunk_fenwick_gdn2(*args, **kwargs)


_carry_table = fwd.carry_table
_states_fwd = fwd.states_fwd
_intra_fwd = fwd.intra_fwd
_own_level_masks = fwd.own_level_masks
_fenwick_gdn2_fwd = chunk.fenwick_gdn2_fwd


def _late_carry_table(offset, N, device):
    """The carry due from chunk c to c + 1 done at c + 1 -> c + 2 (the previous chunk's ``m``)."""
    c0 = offset // 64
    return torch.tensor([fwd.trailing_ones(c0 + c - 1) if c0 + c >= 1 else 0 for c in range(N)],
                        dtype=torch.int32, device=device)


def chunk_fenwick_gdn2_merge_late(*args, **kwargs):
    """The chunk-level merge (the binary counter's carry) happens one chunk late."""
    return _call({"carry_table": _late_carry_table}, args, kwargs)


def chunk_fenwick_gdn2_transition_on_newest_only(*args, **kwargs):
    """Older buckets only decay: the erase part of the transition (``w_wy``) acts on the chunk's
    own tokens only, not on the buckets carried from earlier chunks."""
    def states_without_erase(kg, wy, *rest, **kw):
        return _states_fwd(kg, torch.zeros_like(wy), *rest, **kw)
    return _call({"states_fwd": states_without_erase}, args, kwargs)


# The carry keeps the end states of the buckets it merges (below its target m) instead of emptying them.
STALE_MERGED_BUCKETS = Plant(states, "fenwick_states_fwd_kernel", "(m_c & ~own & (blk > m))[None, :], b_end",
                             "(m_c & ~own & (blk != m))[None, :], b_end")


def chunk_fenwick_gdn2_stale_merged_buckets(*args, **kwargs):
    """A carry with m ≥ 1 merges buckets 0 … m-1 into bucket m but does not empty them: their
    states are counted twice from the next chunk on."""
    with planted(STALE_MERGED_BUCKETS):
        return chunk_fenwick_gdn2(*args, **kwargs)


# --- the router over the bucket blocks' reads (router.py) ------------------------------------
# Plant these around the whole check (forward and backward): the backward runs after the op returns.

# The forward router stops one bucket block short: the highest chunk-level is never read.
ROUTER_TOP_BUCKET_UNREAD = Plant(router, "fenwick_router_fwd_kernel", "for j in range(J):", "for j in range(J - 1):")

# The backward router's dλ of bucket j sums the next block's read (j + 1; the own block's for the last).
ROUTER_DLAM_FROM_NEXT_BLOCK = Plant(router, "fenwick_router_bwd_kernel", "b_x = tl.load(reads + p_st + j * V,",
                                    "b_x = tl.load(reads + p_st + (j + 1) * V,")

# The backward router's stacked cotangent of bucket j is weighted with the level below's λ (6 + j).
ROUTER_COTANGENT_LEVEL_BELOW = Plant(router, "fenwick_router_bwd_kernel", "b_l = tl.load(lam + o_r * L + OWN + j,",
                                     "b_l = tl.load(lam + o_r * L + OWN - 1 + j,")


# The carries' schedule counts chunks from the call's first chunk, not from the absolute position.
OFFSET_IGNORED_IN_CARRIES = Plant(fwd, "carry_table", "c0 = offset // CHUNK", "c0 = 0")


def chunk_fenwick_gdn2_offset_ignored_in_carries(*args, **kwargs):
    """A continuation (``offset > 0``) merges its buckets as if it started at chunk 0: the carry
    from its chunk c to c + 1 merges by the trailing ones of c, not of ``offset/64 + c`` (the
    initial state's own carry still uses the offset)."""
    with planted(OFFSET_IGNORED_IN_CARRIES):
        return chunk_fenwick_gdn2(*args, **kwargs)


def chunk_fenwick_gdn2_intra_level_off_by_one(*args, **kwargs):
    """Inside a chunk, a pair at level ℓ ≥ 1 is weighted with ``λ[ℓ + 1]`` (one level too high)."""
    def intra_shifted(v, w, lam, Aqk, Akk, **kw):
        shifted = torch.cat([lam[..., :1], lam[..., 2:], lam[..., -1:]], dim=-1).contiguous()
        return _intra_fwd(v, w, shifted, Aqk, Akk, **kw)
    return _call({"intra_fwd": intra_shifted}, args, kwargs)


def chunk_fenwick_gdn2_final_split_off_by_one(*args, **kwargs):
    """The last chunk's own tokens are filed into final-state level ``level(T − 1, s) + 1``
    (levels 0 … 6 rolled by one)."""
    def rolled(T, device, p=None):
        return torch.roll(_own_level_masks(T, device, p), 1, dims=1)
    return _call({"own_level_masks": rolled}, args, kwargs)


def chunk_fenwick_gdn2_final_split_ignored_in_backward(*args, **kwargs):
    """The backward ignores the last chunk's split pass: the whole own end state of the last
    chunk takes level 0's final-state gradient (the main pass's unsplit own block)."""
    def forward_without_tail(*a, **kw):       # the split final states, but nothing saved for the backward
        o, final, saved, _ = _fenwick_gdn2_fwd(*a, **kw)
        return o, final, saved, None
    with mock.patch.object(chunk, "fenwick_gdn2_fwd", forward_without_tail):
        return chunk_fenwick_gdn2(*args, **kwargs)


def chunk_fenwick_gdn2_dropped_level_scale_gradient(q, k, v, g, b, w, level_scales, **kwargs):
    """The router (λ) gradient dropped."""
    return chunk_fenwick_gdn2(q, k, v, g, b, w, level_scales.detach(), **kwargs)


def chunk_fenwick_gdn2_initial_state_ignored(*args, initial_state=None, **kwargs):
    """The passed bucket states are dropped (the continuation starts from empty buckets)."""
    return chunk_fenwick_gdn2(*args, **kwargs)


# --- packed rows (cu_seqlens) ---------------------------------------------------------------

# The scan reads a sequence's carries at its chunk's index on the packed grid (its first chunk's
# index there plus the local one) instead of its local chunk index: a sequence that does not
# start the packed row merges its buckets on the packed row's counter.
PACKED_GRID_CARRIES = Plant(states, "fenwick_states_fwd_kernel", "m = tl.load(mtab + c)",
                            "m = tl.load(mtab + i_c0 + c)")


def _long_carry_table(offset, N, device):
    """The carry table long enough for any packed grid index of the test rows (the twin above
    reads past a sequence's own chunk count)."""
    return _carry_table(offset, N + 1024, device)


def chunk_fenwick_gdn2_packed_grid_carries(*args, **kwargs):
    """A packed row whose carry scan counts each sequence's chunks on the packed grid (the
    Fenwick counter of the packed row, not the sequence's own from its first token)."""
    with planted(PACKED_GRID_CARRIES), mock.patch.object(fwd, "carry_table", _long_carry_table):
        return chunk_fenwick_gdn2(*args, **kwargs)


def _last_chunks_on_the_packed_grid(p):
    """Each sequence's "last chunk" taken on the packed row's chunk grid: from the packed row's
    chunk boundary before its last token (or its first token, if later)."""
    bounds = p.bounds
    starts = [max(s, 64 * ((e - 1) // 64)) for s, e in zip(bounds[:-1], bounds[1:])]
    tail_bounds = [0]
    for t0, e in zip(starts, bounds[1:]):
        tail_bounds.append(tail_bounds[-1] + e - t0)
    rows = torch.cat([torch.arange(t0, e) for t0, e in zip(starts, bounds[1:])]).to(p.cu_seqlens.device)
    tail = packing.packing(torch.tensor(tail_bounds, dtype=p.cu_seqlens.dtype, device=p.cu_seqlens.device),
                           tail_bounds)
    return dataclasses.replace(tail, rows=rows)


def chunk_fenwick_gdn2_packed_grid_final_split(*args, **kwargs):
    """A packed row whose final-state split pass reads, for each sequence, the packed row's
    chunk holding its last token instead of the sequence's own last chunk."""
    with mock.patch.object(fwd, "last_chunks", _last_chunks_on_the_packed_grid):
        return chunk_fenwick_gdn2(*args, **kwargs)
