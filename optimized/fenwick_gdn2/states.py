"""The chunk-level Fenwick counter of bucket states: forward scan and its reverse (Triton).

The bucket states are stacked along V (``optimized.fenwick_gdn2`` explains the layout):
``NB = J + NOWN`` blocks of width V, blocks ``0 .. J-1`` the chunk-level buckets
(token levels ``7 .. 6+J``), then the chunk's own end state: ``NOWN = 7`` blocks split by the
level its tokens have at the chunk's last token (token levels ``0 .. 6``), or ``NOWN = 1``
block, unsplit (every carry merges all seven; the op splits only the last chunk's, in a
pass of its own). Per chunk c (fla's WY vectors ``w``, ``u``; ``kg = k ⊙ 2^(G_last − G)``;
``Z`` the stacked pre-state):

    vn    = u − w Z                                  # every block; u = 0 on the bucket blocks
    end   = diag(2^G_last) Z + kg^T vn               # the chunk's transition (and own writes)
    carry (c → c+1, m = trailing ones of the absolute chunk index c0 + c; c counted in the sequence):
          Z'[m]   = Σ_{own blocks i} end[J+i] + Σ_{j<m} end[j]   # levels 0..m merge into m+1
          Z'[j]   = end[j]  for j > m;   Z'[j] = 0 for j < m   (end[m] is an empty bucket)
          Z'[own] = 0                                              # a chunk's own state starts empty
    last chunk: the blocks' ``end`` are the final states of levels 7+j and of own block i
    (level i; with NOWN = 1 level 0 holds the unsplit sum).

The reverse scan is the transpose: the gradient of ``end`` comes from the next chunk's
pre-state gradient through the carry (or from the final-state gradient), and

    dvn   = kg dH + dv_intra
    dZ    = diag(2^G_last) dH + scale · qg^T do' − w^T dvn

(fla's ``chunk_gated_delta_rule_bwd_dhu`` per block, with the carry between chunks).
One program per (sequence·head, block of V columns) walks the sequence's chunks in order: a
sequence is a batch row, or, in a packed row (``IS_VARLEN``, ``packing.py``), the tokens
``cu_seqlens[i] … cu_seqlens[i+1] − 1`` on their own chunk grid; ``c`` (and the carry table's
index) is always the chunk's index in its sequence, the per-chunk tensors ``h``, ``dh`` take
the packed grid's index ``chunk_offsets[i] + c``. The float32 states live in two global-memory
slots per sequence between chunks (chunk c reads slot c mod 2 and writes the next pre-state
into the other; ``tl.debug_barrier`` orders the writes of one chunk before the reads of the
next); each chunk's pre-state, ``vn`` and, in the reverse scan, ``dh`` and ``dvn`` are written
once in the activations' dtype, which is what fla's pieces read. Dots: TF32 in bf16 runs, IEEE
float32 in float32 runs (``precision.py``); no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.warps import num_warps

CHUNK = 64
OWN_LEVELS = 7


@triton.jit
def _sequence(i_b, cu_seqlens, chunk_offsets, T, N, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's sequence ``i_b`` (a batch row, or a sequence of the packed row): its first
    token's row ``bos``, its length ``T``, its chunks ``N`` and the per-chunk tensors' index of
    its first chunk ``i_c0`` (``i_b · N`` in a batch; ``chunk_offsets[i_b]`` in a packed row)."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_b).to(tl.int64)
        T = (tl.load(cu_seqlens + i_b + 1).to(tl.int64) - bos).to(tl.int32)
        N = tl.cdiv(T, BT)
        i_c0 = tl.load(chunk_offsets + i_b).to(tl.int64)
    else:
        bos = i_b.to(tl.int64) * T
        i_c0 = i_b.to(tl.int64) * N
    return bos, T, N, i_c0


@triton.jit(do_not_specialize=["T", "N", "J", "L", "NOWN"])
def fenwick_states_fwd_kernel(
    kg, wy, u, gk, mtab, carry, h, vn, final, cu_seqlens, chunk_offsets, T, N, J, L, NOWN,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NB = J + NOWN
    NBV = NB * V
    bos, T, N, i_c0 = _sequence(i_b, cu_seqlens, chunk_offsets, T, N, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    for c in range(0, N):
        o_t = c * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_kg = tl.load(kg + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_w = tl.load(wy + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        last = tl.minimum(c * BT + BT, T) - 1
        b_gl = tl.exp2(tl.load(gk + ((bos + last) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        m = tl.load(mtab + c)
        not_last = c < N - 1
        p_kv = o_k[:, None] * NBV + o_v[None, :]
        p_c0 = carry + ((i_b.to(tl.int64) * 2 + c % 2) * H + i_h) * K * NBV + p_kv        # this chunk's slot
        p_c1 = carry + ((i_b.to(tl.int64) * 2 + (c + 1) % 2) * H + i_h) * K * NBV + p_kv  # the next chunk's
        p_h = h + ((i_c0 + c) * H + i_h) * K * NBV + p_kv
        p_tv = ((bos + o_t[:, None]) * H + i_h) * NBV + o_v[None, :]
        p_f = final + ((i_b.to(tl.int64) * H + i_h) * L) * K * V + o_k[:, None] * V + o_v[None, :]
        acc = tl.zeros([BK, BV], dtype=tl.float32)
        for blk in range(0, NB):
            b_h = tl.load(p_c0 + blk * V, mask=m_kv, other=0.0)
            tl.store(p_h + blk * V, b_h.to(h.dtype.element_ty), mask=m_kv)
            b_u = tl.load(u + p_tv + blk * V, mask=m_tv, other=0.0).to(tl.float32)
            b_vn = b_u - tl.dot(b_w, b_h, input_precision=DOT)
            tl.store(vn + p_tv + blk * V, b_vn.to(vn.dtype.element_ty), mask=m_tv)
            b_end = b_h * b_gl[:, None] + tl.dot(tl.trans(b_kg), b_vn, input_precision=DOT)
            is_own = blk >= J
            lvl = tl.where(is_own, blk - J, blk + 7)
            tl.store(p_f + lvl * K * V, b_end, mask=m_kv & (c == N - 1) & (lvl < L))
            take = not_last & (is_own | (blk < m))
            acc += tl.where(take, b_end, 0.0)
            # the next pre-state: end[blk] kept above m, emptied below m and on the own blocks
            # (the slot is recycled: it holds the pre-state of two chunks before); block m: acc
            keep = (blk < J) & (blk > m)
            tl.store(p_c1 + blk * V, tl.where(keep, b_end, 0.0), mask=m_kv & not_last & (blk != m))
        tl.store(p_c1 + m * V, acc, mask=m_kv & not_last)
        tl.debug_barrier()


@triton.jit(do_not_specialize=["T", "N", "J", "L", "NOWN"])
def fenwick_states_bwd_kernel(
    qg, kg, wy, gk, do, dv, dfinal, mtab, dh, dv2, dpre, cu_seqlens, chunk_offsets, scale, T, N, J, L, NOWN,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DFINAL: tl.constexpr, DOT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NB = J + NOWN
    NBV = NB * V
    JV = tl.maximum(J, 1) * V
    bos, T, N, i_c0 = _sequence(i_b, cu_seqlens, chunk_offsets, T, N, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    for c in range(N - 1, -1, -1):
        o_t = c * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_qg = tl.load(qg + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_kg = tl.load(kg + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_w = tl.load(wy + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        last = tl.minimum(c * BT + BT, T) - 1
        b_gl = tl.exp2(tl.load(gk + ((bos + last) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        m = tl.load(mtab + c)
        is_last = c == N - 1
        p_dh = dh + ((i_c0 + c) * H + i_h) * K * NBV + o_k[:, None] * NBV + o_v[None, :]
        p_jv = o_k[:, None] * JV + o_v[None, :]
        p_pre0 = dpre + ((i_b.to(tl.int64) * 2 + c % 2) * H + i_h) * K * JV + p_jv          # chunk c's slot
        p_pre1 = dpre + ((i_b.to(tl.int64) * 2 + (c + 1) % 2) * H + i_h) * K * JV + p_jv    # chunk c + 1's
        p_tv = ((bos + o_t[:, None]) * H + i_h) * NBV + o_v[None, :]
        for blk in range(0, NB):
            is_own = blk >= J
            lvl = tl.where(is_own, blk - J, blk + 7)
            b_dh = tl.zeros([BK, BV], dtype=tl.float32)
            if HAS_DFINAL:        # dfinal is None without a final-state gradient: no address of it
                p_f = dfinal + ((i_b.to(tl.int64) * H + i_h) * L) * K * V + o_k[:, None] * V + o_v[None, :]
                b_dh += tl.load(p_f + lvl * K * V, mask=m_kv & is_last & (lvl < L), other=0.0).to(tl.float32)
            src = tl.where(is_own | (blk < m), m, blk)
            ok = (c < N - 1) & (is_own | (blk != m))
            b_dh += tl.load(p_pre1 + src * V, mask=m_kv & ok, other=0.0)
            tl.store(p_dh + blk * V, b_dh.to(dh.dtype.element_ty), mask=m_kv)
            b_dv = tl.dot(b_kg, b_dh, input_precision=DOT)
            b_dv += tl.load(dv + p_tv + blk * V, mask=m_tv, other=0.0).to(tl.float32)
            tl.store(dv2 + p_tv + blk * V, b_dv.to(dv2.dtype.element_ty), mask=m_tv)
            b_do = tl.load(do + p_tv + blk * V, mask=m_tv, other=0.0).to(tl.float32)
            b_pre = (b_dh * b_gl[:, None] + scale * tl.dot(tl.trans(b_qg), b_do, input_precision=DOT)
                     - tl.dot(tl.trans(b_w), b_dv, input_precision=DOT))
            tl.store(p_pre0 + blk * V, b_pre, mask=m_kv & (blk < J))
        tl.debug_barrier()


def scan_warps(BK: int, BV: int) -> int:
    """Warps of the carry scans: ``optimized.warps.num_warps``, but 4 for V blocks of 16.

    With ``BK = 128``, ``BV = 16`` and 8 warps, Triton 3.6 on the H200 (sm_90, TF32 dots)
    compiles the reverse scan wrong: ``dh``, ``dvn`` and the pre-state gradients differed from
    the ``BV = 32`` kernel's by up to 78 at V = 16 (one V block; the forward was bit-identical),
    and with several V blocks (K = 128, V = 128; K = 112, V = 100) the launch hit an illegal
    memory access (2026-12-02, ``results/2026-12-02-scan-launch-and-fenwick-h200/``). With 4
    warps both kernels are bit-identical to ``BV = 32`` at those shapes. The blocks of 16 come
    from ``block_sizes`` at V ≤ 16 and at K > 128."""
    return 4 if BV <= 16 else num_warps(BK, BV)


def block_sizes(K: int, V: int) -> tuple[int, int]:
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(32 if BK <= 128 else 16, triton.next_power_of_2(V)))
    return BK, BV


def _rows(kg, p):
    """``(sequences, cu_seqlens, chunk_offsets)`` of the launch: the batch rows, or the packed
    row's sequences (``p``, a ``Packing``)."""
    if p is None:
        return kg.shape[0], None, None
    if kg.shape[0] != 1:
        raise ValueError(f"kg: a packed row (p) needs B = 1, got B = {kg.shape[0]}")
    return p.n_seqs, p.cu_seqlens, p.chunk_offsets


def states_fwd(kg, wy, u, gk, mtab, h0, N: int, J: int, L: int, V: int, n_own: int = OWN_LEVELS,
               precision: str = "ieee", dtype: torch.dtype = torch.float32, p=None):
    """From the first chunk's stacked pre-state ``h0 [S, H, K, NB·V]`` float32 (``NB = J + n_own``;
    S sequences: the batch rows, or the sequences of the packed row ``p``), returns
    ``(h [B, N, H, K, NB·V], vn [B, T, H, NB·V], final [S, H, L, K, V] float32)``: every chunk's
    pre-state and ``vn`` in ``dtype`` (what fla's pieces read; the scan itself carries float32
    states between chunks, in two slots), the final states in float32. ``N``: chunks per row (a
    packed row: its packed grid's ``p.n_chunks``; ``h``'s chunk index is fla's). ``mtab[c]``:
    the carry after a sequence's local chunk c. With ``n_own = 1`` final level 0 holds the last
    chunk's whole own end state and levels 1 … 6 stay zero."""
    B, T, H, K = kg.shape
    S, cu_seqlens, chunk_offsets = _rows(kg, p)
    if tuple(h0.shape) != (S, H, K, (J + n_own) * V):
        raise ValueError(f"h0 must be [S, H, K, (J + n_own) * V] = {(S, H, K, (J + n_own) * V)}, "
                         f"got {tuple(h0.shape)}")
    BK, BV = block_sizes(K, V)
    NBV = (J + n_own) * V
    carry = torch.empty(S, 2, H, K, NBV, device=kg.device, dtype=torch.float32)
    carry[:, 0] = h0
    h = torch.empty(B, N, H, K, NBV, device=kg.device, dtype=dtype)
    vn = torch.empty(B, T, H, NBV, device=kg.device, dtype=dtype)
    final = torch.zeros(S, H, L, K, V, device=kg.device, dtype=torch.float32)
    grid = (triton.cdiv(V, BV), S * H)
    fenwick_states_fwd_kernel[grid](kg, wy, u, gk, mtab, carry, h, vn, final, cu_seqlens, chunk_offsets,
                                    T, N, J, L, n_own, H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, DOT=precision,
                                    IS_VARLEN=p is not None, num_warps=scan_warps(BK, BV))
    return h, vn, final


def states_bwd(qg, kg, wy, gk, do, dv, dfinal, mtab, scale: float, N: int, J: int, L: int, V: int,
               n_own: int = OWN_LEVELS, precision: str = "ieee", dtype: torch.dtype = torch.float32, p=None):
    """Returns ``dh [B, N, H, K, NB·V]`` (gradient of every chunk's end states) and ``dv2`` (the
    gradient of ``vn``), both in ``dtype`` (what fla's pieces read), and ``dpre0 [S, H, K,
    max(J,1)·V]`` float32, the gradient of each sequence's first bucket pre-state (the scan
    carries the pre-state gradients in two float32 slots). ``N``, ``p`` as in ``states_fwd``;
    ``dfinal [S, H, L, K, V]`` or None."""
    B, T, H, K = kg.shape
    S, cu_seqlens, chunk_offsets = _rows(kg, p)
    if dfinal is not None and tuple(dfinal.shape) != (S, H, L, K, V):
        raise ValueError(f"dfinal must be [S, H, L, K, V] = {(S, H, L, K, V)}, got {tuple(dfinal.shape)}")
    BK, BV = block_sizes(K, V)
    NBV = (J + n_own) * V
    dh = torch.empty(B, N, H, K, NBV, device=kg.device, dtype=dtype)
    dv2 = torch.empty(B, T, H, NBV, device=kg.device, dtype=dtype)
    dpre = torch.zeros(S, 2, H, K, max(J, 1) * V, device=kg.device, dtype=torch.float32)
    grid = (triton.cdiv(V, BV), S * H)
    fenwick_states_bwd_kernel[grid](qg, kg, wy, gk, do, dv, dfinal, mtab, dh, dv2, dpre, cu_seqlens, chunk_offsets,
                                    scale, T, N, J, L, n_own, H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV,
                                    HAS_DFINAL=dfinal is not None, DOT=precision, IS_VARLEN=p is not None,
                                    num_warps=scan_warps(BK, BV))
    return dh, dv2, dpre[:, 0]
