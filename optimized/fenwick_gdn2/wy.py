"""The chunk's intra matrices ``Aqk`` and ``Akk = (I + Lkk)^{-1}`` (Triton, forward only).

Per chunk of 64 tokens, with the base-2 in-chunk cumsum ``gk`` of the log-decay:

    Aqk[t, s] = scale · Σ_i q_{t,i} k_{s,i} 2^(gk_{t,i} − gk_{s,i})           s ≤ t (0 above)
    Lkk[t, s] = Σ_i b_{t,i} k_{t,i} k_{s,i} 2^(gk_{t,i} − gk_{s,i})           s < t
    Akk       = (I + Lkk)^{-1}           (forward substitution, one row at a time)

the same matrices fla's ``chunk_gdn2_fwd_intra`` returns (its layout ``[B, T, H, 64]``, row t
of the chunk), computed exactly per pair of tokens like fla's token-parallel kernel (each
exponent masked to the causal pairs before ``exp2``, so nothing overflows) but in one
program per chunk: under the CPU interpreter fla's token-parallel kernel costs about 0.1 s
per token and head (measured: 23 s of a 24 s forward at T = 130, B·H = 2), this one about
a hundredth of that. fla's ``recompute_w_u_fwd_gdn2`` then forms ``w_wy, u, qg, kg`` from
``Akk``, and fla's ``chunk_gdn2_bwd_intra`` is the backward of both matrices. A packed row
(``IS_VARLEN``) runs one program per chunk of its packed grid (``packing.py``).

Used in cpu-interpret mode only: on a GPU the [64, 64, 16] broadcasts and the 64-step
substitution would be slow (never compiled or run there), so in cuda mode the op calls fla's
``chunk_gdn2_fwd_intra`` (the same matrices: measured 1.4e-8 relative difference in ``Akk`` and
7e-8 in ``Aqk`` on an extreme-regime draw, T = 130).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from optimized.host_math import cdiv

CHUNK = 64


@triton.jit
def chunk_of_program(i_t, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN: tl.constexpr):
    """A chunk program's chunk: ``(local chunk index, first token of its sequence, its length)``.
    One sequence per row: chunk ``i_t`` of row ``i_b``, ``T`` tokens from ``i_b · T``. A packed row
    (``IS_VARLEN``): chunk ``i_t`` of the packed grid, ``chunk_indices[i_t] = (sequence, local
    index)``, the sequence's tokens from ``cu_seqlens``."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_c = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T_seq = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        i_c = i_t
        bos = i_b.to(tl.int64) * T
        T_seq = T
    return i_c, bos, T_seq


@triton.jit(do_not_specialize=["T"])
def fenwick_wy_intra_kernel(
    q, k, b, gk, Aqk, Akk, cu_seqlens, chunk_indices, scale, T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, bos, T = chunk_of_program(i_t, i_b, cu_seqlens, chunk_indices, T, IS_VARLEN)
    o_t = i_t * BT + tl.arange(0, BT)
    o_i = tl.arange(0, BT)
    m_t = o_t < T
    lower = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    strict = (o_i[:, None] > o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_aqk = tl.zeros([BT, BT], dtype=tl.float32)
    b_lkk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k[None, :] < K)
        p_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_q = tl.load(q + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_k = tl.load(k + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_b = tl.load(b + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_g = tl.load(gk + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        diff = b_g[:, None, :] - b_g[None, :, :]                              # [BT, BT, BK]
        decay = tl.exp2(tl.where(lower[:, :, None], diff, 0.0))
        kd = b_k[None, :, :] * decay
        b_aqk += tl.sum(b_q[:, None, :] * kd, axis=2)
        b_lkk += tl.sum((b_b * b_k)[:, None, :] * kd, axis=2)
    b_aqk = tl.where(lower, b_aqk * scale, 0.0)
    b_lkk = tl.where(strict, b_lkk, 0.0)
    # (I + L)^{-1} by forward substitution: row i = e_i − Σ_{j<i} L[i, j] · row j.
    b_inv = tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)
    for i in range(1, BT):
        l_i = tl.sum(tl.where(o_i[:, None] == i, b_lkk, 0.0), axis=0)      # L[i, :]
        row = tl.where(o_i == i, 1.0, 0.0) - tl.sum(l_i[:, None] * b_inv, axis=0)
        b_inv = tl.where(o_i[:, None] == i, row[None, :], b_inv)
    b_inv = tl.where(lower, b_inv, 0.0)
    m_tt = m_t[:, None] & (o_i[None, :] < BT)
    p_tt = ((bos + o_t[:, None]) * H + i_h) * BT + o_i[None, :]
    tl.store(Aqk + p_tt, b_aqk.to(Aqk.dtype.element_ty), mask=m_tt)
    tl.store(Akk + p_tt, b_inv.to(Akk.dtype.element_ty), mask=m_tt)


def wy_intra(q, k, b, gk, scale: float, p=None):
    """``(Aqk, Akk)``, each ``[B, T, H, 64]`` in k's dtype (fla's layout); ``p``: the ``Packing``
    of a packed row (one program per chunk of its packed grid), or None."""
    B, T, H, K = k.shape
    Aqk = torch.empty(B, T, H, CHUNK, device=k.device, dtype=k.dtype)
    Akk = torch.empty(B, T, H, CHUNK, device=k.device, dtype=k.dtype)
    if p is None:
        grid, cu_seqlens, chunk_indices = (cdiv(T, CHUNK), B * H), None, None
    elif B != 1:
        raise ValueError(f"k: a packed row (p) needs B = 1, got B = {B}")
    else:
        grid, cu_seqlens, chunk_indices = (p.n_chunks, H), p.cu_seqlens, p.chunk_indices
    fenwick_wy_intra_kernel[grid](q, k, b, gk, Aqk, Akk, cu_seqlens, chunk_indices, scale, T, H=H, K=K, BT=CHUNK,
                                  BK=16, IS_VARLEN=p is not None)
    return Aqk, Akk


def fenwick_wy_fwd(q, k, v, b, w, gk, scale: float, p=None):
    """``(w_wy, u, qg, kg, Aqk, Akk)`` as fla's ``chunk_gdn2_fwd_intra(..., disable_recompute=True)``;
    ``p`` as in ``wy_intra``."""
    from fla.ops.gdn2.wy_fast import recompute_w_u_fwd_gdn2

    Aqk, Akk = wy_intra(q, k, b, gk, scale, p)
    fla = {} if p is None else p.fla()
    w_wy, u, qg, kg = recompute_w_u_fwd_gdn2(k=k, v=v, b=b, w_gate=w, A=Akk, q=q, gk=gk, **fla)
    return w_wy, u, qg, kg, Aqk, Akk
