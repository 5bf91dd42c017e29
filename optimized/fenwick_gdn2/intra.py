"""The chunk's own tokens: the level-weighted, masked intra-chunk GDN-2 read (Triton, fwd + bwd).

Per chunk of ``C = 64`` tokens (local indices ``t, r``), with fla's intra-chunk
matrices ``Aqk`` (``scale · q_t·(e^{G_t−G_s} ⊙ k_s)``, lower triangle with the diagonal)
and ``Akk = (I + L)^{-1}`` (the WY inverse, unit lower triangular; ``u = Akk (w ⊙ v)``):

    M       = Aqk Akk                        # M[t, r] = scale · q_t^T Φ_{t,r} k_r  (r ≤ t)
    P[t, r] = λ_t[level(t, r)] · M[t, r]      # level(t, r) = bit length of (t XOR r), 0..6
    o_t     = Σ_{r ≤ t} P[t, r] (w_r ⊙ v_r)

Backward, with ``dP = do (w ⊙ v)^T`` on ``r ≤ t``:

    d(w ⊙ v)  = P^T do
    dλ_t[ℓ]   = Σ_{r: level(t,r) = ℓ} dP[t, r] M[t, r]
    dM        = Λ ⊙ dP
    dAqk      = dM Akk^T                        (gradient of the stored, scaled Aqk)
    dL        = −Akk^T stril(Aqk^T dM) Akk^T    (through the inverse; strictly lower)

``dL`` is what fla's ``chunk_gdn2_bwd_intra`` takes as ``dAkk`` (fla's fused WY kernel
returns its own part in the same form). Rows past ``T`` in a ragged last chunk are masked. In a
packed row (``IS_VARLEN``) a program's chunk is one of the packed grid (``chunk_indices``: its
sequence and local index), its rows from its sequence's first token.
Dots: TF32 in bf16 runs, IEEE float32 in float32 runs (``precision.py``); no atomics (one
program per chunk and head).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fenwick_gdn2.wy import chunk_of_program
from optimized.fits import one_stage_where_refused
from optimized.warps import num_warps
from optimized.host_math import cdiv, next_power_of_2

CHUNK = 64
INTRA_LEVELS = 7          # levels 0..6 occur inside a chunk of 64


@triton.jit
def _level_weights(p_lam, m_t, L, BT: tl.constexpr, NL: tl.constexpr):
    """``Λ[t, r] = λ_t[level(t, r)]`` for local indices (``p_lam [BT]``: the rows of λ), and the
    level matrix ``level(t, r)`` = bit length of ``t XOR r``."""
    o_i = tl.arange(0, BT)
    x = o_i[:, None] ^ o_i[None, :]
    lev = tl.zeros([BT, BT], dtype=tl.int32)
    for bit in tl.static_range(6):
        lev += ((x >> bit) > 0).to(tl.int32)
    W = tl.zeros([BT, BT], dtype=tl.float32)
    for ell in tl.static_range(NL):
        b_l = tl.load(p_lam + ell, mask=m_t & (ell < L), other=0.0).to(tl.float32)
        W = tl.where(lev == ell, b_l[:, None], W)
    return W, lev


@triton.jit
def _chunk_prologue(Aqk, Akk, lam, cu_seqlens, chunk_indices, T, L, H: tl.constexpr, BT: tl.constexpr,
                    NL: tl.constexpr, DOT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's chunk (``program_id`` = chunk, batch·head; in a packed row the chunk of the
    packed grid, ``chunk_indices`` naming its sequence and local index): its rows, the causal
    ``Aqk``, ``Akk``, ``M = Aqk Akk``, the level weights ``Λ``, the level matrix and ``P = Λ ⊙ M``."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T = chunk_of_program(i_t, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    o_t = i_t * BT + tl.arange(0, BT)
    o_i = tl.arange(0, BT)
    m_t = o_t < T
    m_tt = m_t[:, None] & (o_i[None, :] < BT)
    p_row = (bos + o_t[:, None]) * H + i_h                       # [BT, 1] row index into [B, T, H]
    b_aqk = tl.load(Aqk + p_row * BT + o_i[None, :], mask=m_tt, other=0.0).to(tl.float32)
    b_akk = tl.load(Akk + p_row * BT + o_i[None, :], mask=m_tt, other=0.0).to(tl.float32)
    causal = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_aqk = tl.where(causal, b_aqk, 0.0)
    b_akk = tl.where(causal, b_akk, 0.0)
    b_m = tl.dot(b_aqk, b_akk, input_precision=DOT)
    p_lam_row = ((bos + o_t) * H + i_h).to(tl.int64)             # [BT] row index into [B, T, H]
    W, lev = _level_weights(lam + p_lam_row * L, m_t, L, BT, NL)
    b_p = tl.where(causal, W * b_m, 0.0)
    return o_i, m_t, m_tt, p_row, p_lam_row, b_aqk, b_akk, causal, b_m, W, lev, b_p


@triton.jit(do_not_specialize=["T", "L"])
def fenwick_intra_fwd_kernel(
    v, w, lam, Aqk, Akk, o, cu_seqlens, chunk_indices, T, L,
    H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, NL: tl.constexpr, DOT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    o_i, m_t, m_tt, p_row, p_lam_row, b_aqk, b_akk, causal, b_m, W, lev, b_p = _chunk_prologue(
        Aqk, Akk, lam, cu_seqlens, chunk_indices, T, L, H, BT, NL, DOT, IS_VARLEN)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_tv = p_row * V + o_v[None, :]
        b_wv = (tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
                * tl.load(w + p_tv, mask=m_tv, other=0.0).to(tl.float32))
        b_o = tl.dot(b_p, b_wv, input_precision=DOT)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_tv)


@triton.jit(do_not_specialize=["T", "L"])
def fenwick_intra_bwd_kernel(
    v, w, lam, Aqk, Akk, do, dwv, dlam, dAqk, dL, cu_seqlens, chunk_indices, T, L,
    H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, NL: tl.constexpr, DOT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    o_i, m_t, m_tt, p_row, p_lam_row, b_aqk, b_akk, causal, b_m, W, lev, b_p = _chunk_prologue(
        Aqk, Akk, lam, cu_seqlens, chunk_indices, T, L, H, BT, NL, DOT, IS_VARLEN)

    b_dp = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_tv = p_row * V + o_v[None, :]
        b_wv = (tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
                * tl.load(w + p_tv, mask=m_tv, other=0.0).to(tl.float32))
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.0).to(tl.float32)
        b_dp += tl.dot(b_do, tl.trans(b_wv), input_precision=DOT)
        b_dwv = tl.dot(tl.trans(b_p), b_do, input_precision=DOT)
        tl.store(dwv + p_tv, b_dwv.to(dwv.dtype.element_ty), mask=m_tv)
    b_dp = tl.where(causal, b_dp, 0.0)

    # dλ_t[ℓ] = Σ_{r: level(t, r) = ℓ} dP[t, r] M[t, r]
    b_dlw = b_dp * b_m
    p_dlam = dlam + p_lam_row * NL
    for ell in tl.static_range(NL):
        b_dl = tl.sum(tl.where(lev == ell, b_dlw, 0.0), axis=1)
        tl.store(p_dlam + ell, b_dl, mask=m_t)

    b_dm = W * b_dp
    b_daqk = tl.where(causal, tl.dot(b_dm, tl.trans(b_akk), input_precision=DOT), 0.0)
    tl.store(dAqk + p_row * BT + o_i[None, :], b_daqk.to(dAqk.dtype.element_ty), mask=m_tt)
    strict = (o_i[:, None] > o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_dakk = tl.where(strict, tl.dot(tl.trans(b_aqk), b_dm, input_precision=DOT), 0.0)
    b_dl2 = tl.dot(tl.trans(b_akk), tl.dot(b_dakk, tl.trans(b_akk), input_precision=DOT),
                   input_precision=DOT)
    b_dl2 = tl.where(strict, -b_dl2, 0.0)
    tl.store(dL + p_row * BT + o_i[None, :], b_dl2.to(dL.dtype.element_ty), mask=m_tt)


def _block_v(V: int) -> int:
    return max(16, min(64, next_power_of_2(V)))


def _grid(v, p):
    """``(grid, cu_seqlens, chunk_indices)``: one program per chunk and batch·head; a packed row
    (``p``, a ``Packing``) runs its packed grid of per-sequence chunks."""
    B, T, H, _ = v.shape
    if p is None:
        return (cdiv(T, CHUNK), B * H), None, None
    if B != 1:
        raise ValueError(f"v: a packed row (p) needs B = 1, got B = {B}")
    return (p.n_chunks, H), p.cu_seqlens, p.chunk_indices


def intra_fwd(v, w, level_scales, Aqk, Akk, precision: str = "ieee", p=None):
    """``o_intra [B, T, H, V]`` float32 (the chunk's own tokens, level-weighted); ``p``: the
    ``Packing`` of a packed row (each sequence on its own chunk grid), or None."""
    B, T, H, V = v.shape
    L = level_scales.shape[-1]
    o = torch.empty(B, T, H, V, device=v.device, dtype=torch.float32)
    grid, cu_seqlens, chunk_indices = _grid(v, p)
    fenwick_intra_fwd_kernel[grid](v, w, level_scales, Aqk, Akk, o, cu_seqlens, chunk_indices, T, L, H=H, V=V,
                                   BT=CHUNK, BV=_block_v(V), NL=INTRA_LEVELS, DOT=precision,
                                   IS_VARLEN=p is not None, num_warps=num_warps(CHUNK, CHUNK))
    return o


def intra_bwd(v, w, level_scales, Aqk, Akk, do, precision: str = "ieee", p=None):
    """Returns ``d(w ⊙ v) [B, T, H, V]``, ``dλ [B, T, H, 7]`` (levels 0..6), ``dAqk`` (gradient of
    the stored Aqk) and ``dL`` (through the WY inverse), both ``[B, T, H, 64]``; all float32.
    ``p`` as in ``intra_fwd``."""
    B, T, H, V = v.shape
    L = level_scales.shape[-1]
    dwv = torch.empty(B, T, H, V, device=v.device, dtype=torch.float32)
    dlam = torch.empty(B, T, H, INTRA_LEVELS, device=v.device, dtype=torch.float32)
    dAqk = torch.empty(B, T, H, CHUNK, device=v.device, dtype=torch.float32)
    dL = torch.empty(B, T, H, CHUNK, device=v.device, dtype=torch.float32)
    grid, cu_seqlens, chunk_indices = _grid(v, p)

    def run(**stages):
        fenwick_intra_bwd_kernel[grid](v, w, level_scales, Aqk, Akk, do, dwv, dlam, dAqk, dL, cu_seqlens, chunk_indices,
                                       T, L, H=H, V=V, BT=CHUNK, BV=_block_v(V), NL=INTRA_LEVELS, DOT=precision,
                                       IS_VARLEN=p is not None, num_warps=num_warps(CHUNK, CHUNK), **stages)

    # Triton's stages ask 128 KiB of shared memory at V = 128 (sm_80, sm_86; 112 KiB sm_90), more than a
    # GPU with 99 KiB a block gives; 64 KiB at one stage (scripts/kernel_resources.py). Same values.
    one_stage_where_refused((fenwick_intra_bwd_kernel, H, V, precision, p is not None, v.dtype, w.dtype,
                             level_scales.dtype, Aqk.dtype, Akk.dtype, do.dtype, v.device), run)
    return dwv, dlam, dAqk, dL
