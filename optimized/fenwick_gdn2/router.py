"""The router over the bucket blocks' reads (Triton, forward and backward).

For every row ``r`` of ``[B, T, H]`` (a token of one head), with the J bucket blocks' reads
``O_j`` (fla's ``chunk_gla_fwd_o_gk`` on the stacked blocks, ``[B, T, H, NB·V]`` in the
activations' dtype; block ``j < J`` is chunk-level ``j + 1``, token level ``7 + j``):

    o_r        = o_intra_r + Σ_{j < J} λ_r[7 + j] · O_{r, j}           (forward)
    dλ_r[7 + j] = Σ_v O_{r, j, v} · do_{r, v}                          (backward)
    do_st_{r, j} = λ_r[7 + j] · do_r  for j < J,   0 for the own blocks j ≥ J

``do_st`` (``[B, T, H, NB·V]``, the activations' dtype) is the stacked output cotangent that
fla's backward pieces read. One program per ``BR`` rows, every value column of a row in one
tile; sums in float32. Rows are read where the stacked tensor holds them (row stride
``NB·V``, block stride ``V``): no copy of the bucket blocks, no float32 copy of the reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fenwick_gdn2.states import OWN_LEVELS
from optimized.warps import num_warps
from optimized.host_math import cdiv, next_power_of_2

TILE = 4096          # elements per program's [BR, BV] tile


@triton.jit
def _rows(R, NB, V: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    """This program's ``BR`` rows: ``(o_r, m_r, m_rv, p_rv, p_st)``, the row indices (int64), their
    masks, the offsets of their ``[BR, BV]`` tile in a ``[R, V]`` tensor and of its block 0 in the
    stacked ``[R, NB·V]`` one (block j at ``+ j·V``)."""
    o_r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    o_v = tl.arange(0, BV)
    m_r = o_r < R
    m_rv = m_r[:, None] & (o_v[None, :] < V)
    return o_r, m_r, m_rv, o_r[:, None] * V + o_v[None, :], o_r[:, None] * (NB * V) + o_v[None, :]


@triton.jit(do_not_specialize=["R", "J", "NB"])
def fenwick_router_fwd_kernel(o_intra, reads, lam, o, R, L, J, NB, V: tl.constexpr, BR: tl.constexpr,
                              BV: tl.constexpr, OWN: tl.constexpr):
    o_r, m_r, m_rv, p_rv, p_st = _rows(R, NB, V, BR, BV)
    b_o = tl.load(o_intra + p_rv, mask=m_rv, other=0.0).to(tl.float32)
    for j in range(J):
        b_l = tl.load(lam + o_r * L + OWN + j, mask=m_r, other=0.0).to(tl.float32)
        b_o += b_l[:, None] * tl.load(reads + p_st + j * V, mask=m_rv, other=0.0).to(tl.float32)
    tl.store(o + p_rv, b_o.to(o.dtype.element_ty), mask=m_rv)


@triton.jit(do_not_specialize=["R", "J", "NB"])
def fenwick_router_bwd_kernel(do, reads, lam, dlam, do_st, R, L, J, NB, V: tl.constexpr, BR: tl.constexpr,
                              BV: tl.constexpr, OWN: tl.constexpr):
    o_r, m_r, m_rv, p_rv, p_st = _rows(R, NB, V, BR, BV)
    b_do = tl.load(do + p_rv, mask=m_rv, other=0.0).to(tl.float32)
    for j in range(J):
        b_x = tl.load(reads + p_st + j * V, mask=m_rv, other=0.0).to(tl.float32)
        tl.store(dlam + o_r * L + OWN + j, tl.sum(b_x * b_do, axis=1), mask=m_r)
        b_l = tl.load(lam + o_r * L + OWN + j, mask=m_r, other=0.0).to(tl.float32)
        tl.store(do_st + p_st + j * V, (b_l[:, None] * b_do).to(do_st.dtype.element_ty), mask=m_rv)
    for j in range(J, NB):
        tl.store(do_st + p_st + j * V, tl.zeros([BR, BV], dtype=do_st.dtype.element_ty), mask=m_rv)


def _check_levels(lam: torch.Tensor, J: int):
    if OWN_LEVELS + J > lam.shape[-1]:
        raise ValueError(f"lam has {lam.shape[-1]} levels, the router reads levels up to {OWN_LEVELS + J - 1}")


def launch_blocks(V: int, R: int):
    """``(grid, BR, BV)``: ``BV`` every value column of a row, ``BR`` rows per program (a tile of
    ``TILE`` elements)."""
    BV = next_power_of_2(V)
    BR = max(1, TILE // BV)
    return (cdiv(R, BR),), BR, BV


def _check_stacked(reads: torch.Tensor, NB: int, V: int):
    """``reads`` is the stacked ``[B, T, H, NB·V]`` tensor (contiguous): row r's block j starts at
    ``r·NB·V + j·V``."""
    if not reads.is_contiguous() or reads.shape[-1] != NB * V:
        raise ValueError(f"reads must be the contiguous stacked reads [B, T, H, NB * V = {NB * V}], "
                         f"got shape {tuple(reads.shape)}, strides {reads.stride()}")


def router_fwd(o_intra: torch.Tensor, reads: torch.Tensor, lam: torch.Tensor, J: int, dtype) -> torch.Tensor:
    """``o = o_intra + Σ_{j < J} λ[7 + j] ⊙ O_j`` in ``dtype`` (``o_intra [B, T, H, V]`` float32,
    ``reads [B, T, H, NB·V]`` the stacked reads, ``λ [B, T, H, L]``)."""
    B, T, H, V = o_intra.shape
    L = lam.shape[-1]
    NB = reads.shape[-1] // V
    _check_stacked(reads, NB, V)
    _check_levels(lam, J)
    o = torch.empty(B, T, H, V, device=o_intra.device, dtype=dtype)
    R = B * T * H
    grid, BR, BV = launch_blocks(V, R)
    fenwick_router_fwd_kernel[grid](o_intra.contiguous(), reads, lam.contiguous(), o, R, L, J, NB, V=V, BR=BR, BV=BV,
                                    OWN=OWN_LEVELS, num_warps=num_warps(BR, BV))
    return o


def router_bwd(do: torch.Tensor, reads: torch.Tensor, lam: torch.Tensor, dlam: torch.Tensor, J: int, NB: int,
               dtype) -> torch.Tensor:
    """Writes ``dλ[..., 7 : 7 + J]`` into ``dlam`` (``[B, T, H, L]`` float32, contiguous) and returns
    the stacked cotangent ``do_st [B, T, H, NB·V]`` in ``dtype`` (``do [B, T, H, V]``; ``reads`` as
    in ``router_fwd``)."""
    B, T, H, V = do.shape
    L = lam.shape[-1]
    _check_stacked(reads, NB, V)
    _check_levels(lam, J)
    if not dlam.is_contiguous() or dlam.dtype != torch.float32 or tuple(dlam.shape) != (B, T, H, L):
        raise ValueError(f"dlam must be a contiguous float32 [B, T, H, L] = {(B, T, H, L)} tensor")
    do_st = torch.empty(B, T, H, NB * V, device=do.device, dtype=dtype)
    R = B * T * H
    grid, BR, BV = launch_blocks(V, R)
    fenwick_router_bwd_kernel[grid](do.contiguous(), reads, lam.contiguous(), dlam, do_st, R, L, J, NB, V=V, BR=BR,
                                    BV=BV, OWN=OWN_LEVELS, num_warps=num_warps(BR, BV))
    return do_st
