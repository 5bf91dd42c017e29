"""Nested GDN-2's reads and router, backward, in two Triton kernels (CONTRACT section 3).

Forward (``reads_fwd``): ``p_t = softmax(r_t)``, ``o_t = p_t,0 o0_t + Σ_{ℓ≥1} p_t,ℓ o_t,ℓ`` with
``o_t,ℓ = scale · M_ℓ,j^T q_t^(ℓ)`` and ``M_ℓ,j = states[read_row[ℓ, j]]`` (t in chunk j).
Given ``do = ∂loss/∂o``:

    u_t,ℓ      = M_ℓ,j do_t                                   [K]   (= (do @ M^T)_t)
    dp_t,0     = do_t · o0_t
    dp_t,ℓ     = do_t · o_t,ℓ = scale · q_t^(ℓ) · u_t,ℓ       (no read recomputed)
    dr_t       = p_t ⊙ (dp_t - Σ_ℓ p_t,ℓ dp_t,ℓ)                    (softmax backward)
    dq_t^(ℓ)   = p_t,ℓ · scale · u_t,ℓ                          ℓ ≥ 1
    do0_t      = p_t,0 · do_t
    dstates[s] = scale · Σ_{t reading s} (p_t,ℓ q_t^(ℓ)) ⊗ do_t   ℓ = row_level[s]

Kernel A (``reads_bwd_tokens_kernel``) owns one chunk and makes every per-token gradient;
kernel B (``reads_bwd_states_kernel``) owns one stored row and contracts over the chunks
``[row_chunk_lo[s], row_chunk_hi[s])`` that read it (each row is read by one contiguous
chunk range, since ``read_row`` is nondecreasing in the chunk): a fixed loop order, no
atomics, no scatter, bitwise reproducible. Rows read by no chunk get zeros.

Precision as in ``reads_fwd``: float32 accumulators; float32 inputs use IEEE dots;
bfloat16 inputs use two bf16 dots per product with the float32 operand (the state, or
``p ⊙ q``) split into bf16 ``hi + lo``, the other operand (``do``, in q's dtype) exact.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.nested.reads_fwd import (_expect, block_sizes, check_reads, chunk_tokens, dot_exact_a,
                                        dot_exact_b, level_column, num_warps, router_probs, state_row)
from optimized.fits import one_stage_where_refused
from optimized.nested.stored_states import as_stored
from optimized.nested.state_grad import FactoredSnapGrads, pair_blocks
from optimized.host_math import cdiv, next_power_of_2


# T, N, S, S_LO, L are runtime sizes (see reads_fwd_kernel).
@triton.jit(do_not_specialize=["T", "N", "S", "S_LO", "L"])
def reads_bwd_tokens_kernel(
    do, q, r, o0, states, states_hi, read_row, chunk_bounds, dq, dr, do0,
    scale, T, N, S, S_LO, L,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BKA: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
    SPLIT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """One (chunk j, batch·head) program, all ``BT = 64`` tokens; K visited in blocks of ``BKA``
    and V in blocks of ``BV`` (``u`` is made one key block at a time):

        p      = softmax(r[tokens])                                       [BT, BL]
        dp0    = Σ_blocks rowsum(do ⊙ o0);   do0 = p[:, 0] ⊙ do            (per V block)
        for ℓ in 1 .. L-1, with M = states[read_row[ℓ, j]]:
            for each key block kb:
                u  = Σ_{V blocks vb} do[:, vb] @ M[kb, vb]^T              [BT, BKA]
                dp_ℓ += scale · rowsum(q[tokens, ℓ, kb] ⊙ u)
                dq[tokens, ℓ, kb] = p[:, ℓ] ⊙ scale · u
        dr     = p ⊙ (dp - rowsum(p ⊙ dp))

    ``dq[:, :, :, 0]`` is not touched. Tokens ≥ T, columns ≥ K, V, L are masked.
    ``IS_VARLEN``: chunk j's tokens are ``chunk_bounds[j]`` (``chunk_tokens``).
    """
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H

    o_t, m_t = chunk_tokens(i_c, chunk_bounds, T, BT, IS_VARLEN)
    o_l = tl.arange(0, BL)
    m_l = o_l < L
    tok = (i_b.to(tl.int64) * T + o_t.to(tl.int64)) * H + i_h            # [BT] (b, t, h) index

    b_p = router_probs(r, i_b, i_h, o_t, m_t, T, L, H, BL)
    b_p0 = level_column(b_p, 0, BL)

    # level 0: dp_0 = do · o0, do0 = p_0 do
    b_dp0 = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        b_do = tl.load(do + tok[:, None] * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
        b_o0 = tl.load(o0 + tok[:, None] * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
        b_dp0 += tl.sum(b_do * b_o0, axis=1)
        tl.store(do0 + tok[:, None] * V + o_v[None, :], (b_p0[:, None] * b_do).to(do0.dtype.element_ty), mask=m_tv)
    b_dp = tl.where(o_l[None, :] == 0, b_dp0[:, None], 0.0)

    for l in range(1, L):
        i_row = tl.load(read_row + l * N + i_c)
        p_m = state_row(states, states_hi, i_b, i_row, i_h, S, S_LO, H, K, V)
        b_pl = level_column(b_p, l, BL)
        b_dpl = tl.zeros([BT], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BKA)):                            # key blocks: fewer registers
            o_k = i_k * BKA + tl.arange(0, BKA)
            m_k = o_k < K
            b_u = tl.zeros([BT, BKA], dtype=tl.float32)
            for i_v in range(0, tl.cdiv(V, BV)):
                o_v = i_v * BV + tl.arange(0, BV)
                m_v = o_v < V
                b_do = tl.load(do + tok[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
                b_m = tl.load(p_m + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
                b_u += dot_exact_a(b_do, tl.trans(b_m), SPLIT)            # [BT, BV] @ [BV, BKA]
            m_tk = m_t[:, None] & m_k[None, :]
            b_q = tl.load(q + (tok * L + l)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
            b_dpl += scale * tl.sum(b_q * b_u, axis=1)
            tl.store(dq + (tok * L + l)[:, None] * K + o_k[None, :], (b_pl * scale)[:, None] * b_u, mask=m_tk)
        b_dp += tl.where(o_l[None, :] == l, b_dpl[:, None], 0.0)

    b_dr = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])
    tl.store(dr + tok[:, None] * L + o_l[None, :], b_dr, mask=m_t[:, None] & m_l[None, :])


@triton.jit
def dot_split_both(a, b, SPLIT: tl.constexpr):
    """``a @ b`` for two float32 operands. ``SPLIT`` (bf16 inputs): each split into bf16
    ``hi + lo``, three bf16 tensor-core dots ``lo_a hi_b + hi_a lo_b + hi_a hi_b`` (``lo_a lo_b``,
    about 2^-16 of the product, left out); else one IEEE float32 dot. The bf16 dots give the
    accumulator the layout of the reads' own ``dot_exact_*`` dots."""
    if SPLIT:
        a_hi = a.to(tl.bfloat16)
        a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)
        b_hi = b.to(tl.bfloat16)
        b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(a_lo, b_hi, out_dtype=tl.float32)
        acc = tl.dot(a_hi, b_lo, acc, out_dtype=tl.float32)
        return tl.dot(a_hi, b_hi, acc, out_dtype=tl.float32)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit(do_not_specialize=["T", "S", "L", "F_SNAP", "N_PAIRS"])
def reads_bwd_states_kernel(
    do, q, r, row_level, row_chunk_lo, row_chunk_hi, chunk_bounds, dstates,
    snap_q, snap_dnu, fire_lo, fire_hi,
    scale, T, S, L, F_SNAP, N_PAIRS,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, BN: tl.constexpr,
    SPLIT: tl.constexpr, IS_VARLEN: tl.constexpr, SNAP: tl.constexpr,
):
    """One (V block, stored row s, batch·head) program; ``[BK, BV]`` accumulator, ℓ = row_level[s]:

        acc = 0
        for j in row_chunk_lo[s] .. row_chunk_hi[s] - 1:          (in order)
            p    = softmax(r[tokens of j])                         [BT, BL]
            acc += (p[:, ℓ] ⊙ q[tokens, ℓ])^T @ do[tokens, block]   [BK, BT] @ [BT, BV]
        ds = scale · acc                                           (0 for a row nobody reads)
        for each block n of BN pairs:                              (SNAP: the level above's firings
            for m in fire_lo[s] .. fire_hi[s] - 1:                   that probed row s, in order)
                ds += snap_q[h, n]^T @ snap_dnu[b, m, h, n, block]
        dstates[s][:, block] = ds

    Tokens ≥ T (a ragged last chunk) are loaded as 0 and contribute nothing. ``IS_VARLEN``:
    chunk j's tokens are ``chunk_bounds[j]`` (``chunk_tokens``). ``SNAP``: ``snap_q [H, N_PAIRS, K]``
    and ``snap_dnu [B, F_SNAP, H, N_PAIRS, V]`` float32, in blocks of ``BN`` pairs (the last one
    masked past ``N_PAIRS``; a block's Q loaded once for all the row's firings); their
    products by ``dot_split_both`` (bf16 dots like the reads' own, so the accumulator keeps one
    layout; a TF32 dot would convert it between two MMA layouts).
    """
    i_v, i_s, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    l = tl.load(row_level + i_s)
    j_lo = tl.load(row_chunk_lo + i_s)
    j_hi = tl.load(row_chunk_hi + i_s)

    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    for j in range(j_lo, j_hi):
        o_t, m_t = chunk_tokens(j, chunk_bounds, T, BT, IS_VARLEN)
        tok = (i_b.to(tl.int64) * T + o_t.to(tl.int64)) * H + i_h
        b_pl = level_column(router_probs(r, i_b, i_h, o_t, m_t, T, L, H, BL), l, BL)
        b_q = tl.load(q + (tok * L + l)[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                      other=0.0).to(tl.float32)
        b_do = tl.load(do + tok[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_ds += dot_exact_b(tl.trans(b_pl[:, None] * b_q), b_do, SPLIT)
    b_ds = scale * b_ds
    if SNAP:                # the snapshot gradients of the firings that probed this row
        for i_n in range(0, tl.cdiv(N_PAIRS, BN)):
            o_n = i_n * BN + tl.arange(0, BN)
            m_n = o_n < N_PAIRS
            b_qt = tl.load(snap_q + i_h * N_PAIRS * K + o_n[None, :] * K + o_k[:, None],
                           mask=m_n[None, :] & m_k[:, None], other=0.0)                     # [BK, BN]
            for m in range(tl.load(fire_lo + i_s), tl.load(fire_hi + i_s)):
                p_dnu = snap_dnu + ((i_b.to(tl.int64) * F_SNAP + m) * H + i_h) * N_PAIRS * V
                b_dnu = tl.load(p_dnu + o_n[:, None] * V + o_v[None, :], mask=m_n[:, None] & m_v[None, :],
                                other=0.0)                                                  # [BN, BV]
                b_ds += dot_split_both(b_qt, b_dnu, SPLIT)
    p_ds = dstates + ((i_b.to(tl.int64) * S + i_s) * H + i_h) * K * V
    tl.store(p_ds + o_k[:, None] * V + o_v[None, :], b_ds, mask=m_k[:, None] & m_v[None, :])


def token_blocks(K: int, V: int, block_v: int | None = None) -> tuple[int, int, int]:
    """``(BKA, BVA, warps)`` of kernel A: K visited in key blocks of ``BKA`` and V in blocks of
    ``BVA`` (``block_v``, a test's choice, caps it), up to 64 each: ``do``'s ``[64, BVA]`` block
    is loaded once per level, key block and V block, so wider blocks load it fewer times and run
    fewer, larger dots. At K = V = 128 in bf16, 64 x 64 with 8 warps holds 128 registers, no spill,
    72 KiB of shared memory (sm_90, ``scripts/kernel_resources.py``); H200, L = 4 (bench/NOTES.md):
    the step −0.73 ms against 32 x 32, which 128 x 32 and 32 x 64 beat by less."""
    BKA = min(64, max(16, next_power_of_2(K)))
    BVA = min(64, max(16, next_power_of_2(V)))
    if block_v is not None:
        BVA = max(16, min(BVA, next_power_of_2(block_v)))
    return BKA, BVA, 4 if BKA * BVA < 32 * 32 else 8


def reads_bwd(do: torch.Tensor, q: torch.Tensor, r: torch.Tensor, o0: torch.Tensor, states: torch.Tensor,
              read_row: torch.Tensor, row_level: torch.Tensor, row_chunk_lo: torch.Tensor,
              row_chunk_hi: torch.Tensor, scale: float, dq: torch.Tensor, *, block_v: int | None = None,
              with_states: bool = True, chunk_bounds: torch.Tensor | None = None,
              do0_dtype: torch.dtype = torch.float32, tokens_blocks: tuple[int, int, int] | None = None):
    """Gradients of ``reads_fwd`` (module docstring). Returns ``(dr [B, T, H, L], do0 [B, T, H, V],
    dstates [B, S, H, K, V])``, float32 (``do0`` in ``do0_dtype``: the nested op asks for the
    activations' dtype, which level 0's backward reads; the one rounding it gets anyway, made on
    store), and writes ``dq[:, :, :, 1:]`` in place.

    ``do [B, T, H, V]`` in q's dtype (exact in it: bf16 dots take it as is); the other inputs
    as in ``reads_fwd``; ``row_level, row_chunk_lo, row_chunk_hi int32 [S]`` (``read_tables``);
    ``dq`` a contiguous ``[B, T, H, L, K]`` buffer in float32 or q's dtype (the float32 values
    are rounded once, on store): levels 1..L-1 are overwritten, level 0 is left alone.
    ``with_states=False``: ``dstates`` is None (``reads_bwd_states`` gives any rows of it later).
    ``block_v`` and ``chunk_bounds`` (packed sequences) as in ``reads_fwd``. ``tokens_blocks``:
    kernel A's ``(BKA, BVA, warps)`` instead of ``token_blocks``' (powers of two ≥ 16; a
    benchmark's choice).
    """
    B, T, H, L, K, V, S, N = _check_bwd(do, q, r, o0, states, read_row, row_level, row_chunk_lo, row_chunk_hi,
                                        chunk_bounds)
    _expect("dq", dq, (B, T, H, L, K), (torch.float32, q.dtype), q.device)
    if not dq.is_contiguous():
        raise ValueError("dq must be contiguous (levels 1..L-1 are written into it in place)")
    BT, BK, BV, BL = block_sizes(K, V, L, block_v)
    BKA, BVA, warps_a = token_blocks(K, V, block_v) if tokens_blocks is None else tokens_blocks
    if min(BKA, BVA) < 16 or BKA & (BKA - 1) or BVA & (BVA - 1):
        raise ValueError(f"tokens_blocks' key and V blocks must be powers of two ≥ 16, got {BKA}, {BVA}")
    f32 = torch.float32
    dr = torch.empty(B, T, H, L, dtype=f32, device=q.device)
    if do0_dtype not in (f32, q.dtype):
        raise ValueError(f"do0_dtype must be torch.float32 or q's dtype {q.dtype}, got {do0_dtype}")
    do0 = torch.empty(B, T, H, V, dtype=do0_dtype, device=q.device)
    dstates = None
    if B * H == 0:
        return dr, do0, (torch.empty(B, S, H, K, V, dtype=f32, device=q.device) if with_states else None)
    do, q, r = do.contiguous(), q.contiguous(), r.contiguous()
    split = q.dtype == torch.bfloat16
    if T > 0:
        lo, hi, S_lo = as_stored(states).kernel_args()
        reads_bwd_tokens_kernel[(N, B * H)](
            do, q, r, o0.contiguous(), lo, hi, read_row.contiguous(), chunk_bounds, dq, dr, do0,
            float(scale), T, N, S, S_lo, L,
            H=H, K=K, V=V, BT=BT, BKA=BKA, BV=BVA, BL=BL, SPLIT=split, IS_VARLEN=chunk_bounds is not None,
            num_warps=warps_a)
    if with_states:
        dstates = reads_bwd_states(do, q, r, o0, states, read_row, row_level, row_chunk_lo, row_chunk_hi, scale,
                                   slice(0, S), block_v=block_v, chunk_bounds=chunk_bounds)
    return dr, do0, dstates


def _check_bwd(do, q, r, o0, states, read_row, row_level, row_chunk_lo, row_chunk_hi, chunk_bounds=None):
    """``check_reads`` and the backward's own inputs; returns the same sizes."""
    B, T, H, L, K, V, S, N = check_reads(q, r, o0, states, read_row, chunk_bounds)
    _expect("do", do, (B, T, H, V), (q.dtype,), q.device)
    for name, x in (("row_level", row_level), ("row_chunk_lo", row_chunk_lo), ("row_chunk_hi", row_chunk_hi)):
        _expect(name, x, (S,), (torch.int32,), q.device)
    return B, T, H, L, K, V, S, N


def states_block_v(K: int) -> int | None:
    """The state-gradient kernel's default V block: 128 for keys up to 128 (one program per stored
    row and head at V ≤ 128, so each chunk's router probabilities and ``p ⊙ q`` are made once
    instead of once per V block), else the reads' default (``block_sizes``). H200, L = 4,
    K = V = 128, bf16: 1.97 ms for three levels at 32, 1.20 at 64, 0.84 at 128 (``bench/NOTES.md``)."""
    return 128 if K <= 128 else None


# The fold's pair block: at K = V = 128 (a [128, 128] state block) a block of 128 pairs asked
# 256 KiB of shared memory of the H200's 227 (the ladder's n = 128 levels, L ≥ 5, were refused);
# 64 fits (bench/NOTES.md).
SNAP_BLOCK_N = 64


def snap_blocks(pairs: int, block_n: int | None = None) -> int:
    """The fold's pair block ``BN``: ``block_n`` (default ``SNAP_BLOCK_N``), a power of two ≥ 16,
    no wider than the pairs' own power of two."""
    return pair_blocks(pairs, SNAP_BLOCK_N if block_n is None else block_n, "snap_block_n")


def reads_bwd_states(do: torch.Tensor, q: torch.Tensor, r: torch.Tensor, o0: torch.Tensor, states: torch.Tensor,
                     read_row: torch.Tensor, row_level: torch.Tensor, row_chunk_lo: torch.Tensor,
                     row_chunk_hi: torch.Tensor, scale: float, rows: slice, *,
                     block_v: int | None = None, chunk_bounds: torch.Tensor | None = None,
                     snap_grads: FactoredSnapGrads | None = None, fire_ranges: tuple | None = None,
                     snap_block_n: int | None = None) -> torch.Tensor:
    """The stored rows ``rows`` (a step-1 slice of ``0 .. S``) of ``reads_bwd``'s ``dstates``, as a
    fresh float32 ``[B, len(rows), H, K, V]``: the nested backward asks for one level's rows at a
    time, so the levels' state gradients are never all alive at once. Same kernel, launched on
    the row tables' slices; inputs as in ``reads_bwd`` (checked the same way), but ``block_v``
    None takes ``states_block_v(K)``.

    ``snap_grads``: the snapshot gradients of the level above's fused probe, kept factored
    (``FactoredSnapGrads(Q [H, n, K], dν' [B, F, H, n, V])``, float32), added to the rows they
    probed in the same programs: row i of ``rows`` gets ``Σ_m Q[h]ᵀ dν'[b, m, h]`` over the firings
    ``m`` in ``fire_ranges = (lo, hi)`` (int32 ``[len(rows)]``, ``[lo[i], hi[i])``; the plan's
    ``DeviceTables.snap_fire_ranges``: a level's firings probe nondecreasing rows), in increasing
    m, after the reads' own sum (``dot_split_both``: three bf16 dots for bf16 inputs, relative error
    about 2^-16; IEEE float32 otherwise). The pairs go in blocks of ``snap_block_n`` (default
    ``SNAP_BLOCK_N``; a power of two ≥ 16, capped at the pairs' own power of two)."""
    B, T, H, L, K, V, S, N = _check_bwd(do, q, r, o0, states, read_row, row_level, row_chunk_lo, row_chunk_hi,
                                        chunk_bounds)
    if not isinstance(rows, slice):
        raise TypeError(f"rows must be a slice, got {type(rows).__name__}")
    start, stop, step = rows.indices(S)
    if step != 1:
        raise ValueError(f"rows must be a slice with step 1, got {rows}")
    n = max(stop - start, 0)
    snap_q, snap_dnu, lo, hi, F, pairs = _check_snap(snap_grads, fire_ranges, B, H, K, V, n, q.device)
    BN = snap_blocks(pairs, snap_block_n)
    BT, BK, BV, BL = block_sizes(K, V, L, states_block_v(K) if block_v is None else block_v)
    dstates = torch.empty(B, n, H, K, V, dtype=torch.float32, device=q.device)
    if n > 0 and B * H > 0 and K * V > 0:
        args = (do.contiguous(), q.contiguous(), r.contiguous(), row_level[start:stop].contiguous(),
                row_chunk_lo[start:stop].contiguous(), row_chunk_hi[start:stop].contiguous(), chunk_bounds, dstates,
                dstates if snap_q is None else snap_q, dstates if snap_dnu is None else snap_dnu, lo, hi,
                float(scale), T, n, L, F, pairs)
        consts = dict(H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, BL=BL, BN=BN, SPLIT=q.dtype == torch.bfloat16,
                      IS_VARLEN=chunk_bounds is not None, SNAP=snap_q is not None)

        def run(**stages):
            reads_bwd_states_kernel[(cdiv(V, BV), n, B * H)](*args, **consts, num_warps=num_warps(BK, BV), **stages)

        # float32 inputs stage 162 KiB of shared memory at K = V = 128 (V blocks of 128) and 210 KiB at
        # K = 256, more than a GPU with 99 KiB (sm_89) or 163 KiB (sm_80, K = 256) a block gives; 64 / 72 KiB
        # at one stage (docs/kernel-shared-memory.md). Same values.
        one_stage_where_refused((reads_bwd_states_kernel, tuple(consts.items()), q.device), run)
    return dstates


def _check_snap(snap_grads, fire_ranges, B, H, K, V, rows, device):
    """``reads_bwd_states``' snapshot-gradient inputs checked; returns ``(Q, dν', lo, hi, F, n)``
    contiguous (``None, None, None, None, 0, 1`` without them)."""
    if snap_grads is None:
        if fire_ranges is not None:
            raise ValueError("fire_ranges given without snap_grads")
        return None, None, None, None, 0, 1
    if not isinstance(snap_grads, FactoredSnapGrads):
        raise TypeError(f"snap_grads must be a FactoredSnapGrads, got {type(snap_grads).__name__}")
    Q, dnu = snap_grads
    pairs = Q.shape[1] if Q.dim() == 3 else -1
    _expect("snap_grads.q", Q, (H, pairs, K), (torch.float32,), device)
    if pairs < 1:
        raise ValueError(f"snap_grads.q must have at least one pair, got {tuple(Q.shape)}")
    F = dnu.shape[1] if dnu.dim() == 5 else -1
    _expect("snap_grads.dnu", dnu, (B, F, H, pairs, V), (torch.float32,), device)
    if not (isinstance(fire_ranges, tuple) and len(fire_ranges) == 2):
        raise ValueError("fire_ranges must be a (lo, hi) pair of int32 tensors with snap_grads")
    for name, x in zip(("fire_ranges' lo", "fire_ranges' hi"), fire_ranges):
        _expect(name, x, (rows,), (torch.int32,), device)
    return Q.contiguous(), dnu.contiguous(), *(x.contiguous() for x in fire_ranges), F, pairs
