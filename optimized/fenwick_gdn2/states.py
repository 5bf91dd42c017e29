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

The reverse scan is the transpose: with ``dZ'`` the next chunk's pre-state gradient (zero
after the last chunk) and ``dfinal`` the final states' gradient (last chunk only),

    dH    = carryᵀ dZ' (+ dfinal)                  # dH[j] = dZ'[j] for j > m, dZ'[m] for j < m
                                                   # and every own block, 0 for j = m
    dvn   = kg dH + dv_intra
    dZ    = diag(2^G_last) dH + scale · qg^T do' − w^T dvn

(fla's ``chunk_gated_delta_rule_bwd_dhu`` per block, with the carry between chunks).

One program per (sequence·head, group of V columns) walks the sequence's chunks in order and
keeps **every block's state in registers**: its tile is ``[K, NBP·BV]`` float32, the same
``BV`` value columns of each of the ``NB`` blocks side by side (``NBP``: NB rounded up to a
power of two, at least 4; the padding blocks are masked). Every block sees the same
transition, so one chunk-step is two wide dots for all blocks at once (not NB dependent
block-steps), and the carry is a sum over the tile's block axis (a ``[K, NBP, BV]`` view) and a
select; no state leaves the program between chunks.

A sequence is a batch row, or, in a packed row (``IS_VARLEN``, ``packing.py``), the tokens
``cu_seqlens[i] … cu_seqlens[i+1] − 1`` on their own chunk grid; ``c`` (and the carry table's
index) is always the chunk's index in its sequence, the per-chunk tensors ``h``, ``dh`` take
the packed grid's index ``chunk_offsets[i] + c``. Each chunk's pre-state, ``vn`` and, in the
reverse scan, ``dh`` and ``dvn`` are written once in the activations' dtype, which is what
fla's pieces read. Dots: operands in the activations' dtype, bf16 in bf16 runs (the stored bf16
pre-states and ``vn``, as fla's state kernels do; float32 accumulation and float32 states),
IEEE float32 in float32 runs (``precision.py``); no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fits import one_stage_where_refused
from optimized.warps import num_warps
from optimized.host_math import cdiv, next_power_of_2

CHUNK = 64
OWN_LEVELS = 7
WIDTH = 128      # value columns per program, over all blocks: NBP · BV (``block_sizes``)
MIN_WIDTH = 64   # the narrowest tile the scans launch (``block_sizes``)
MIN_BLOCKS = 4   # the fewest blocks a tile holds, padding ones included (``block_sizes``)
STAGES = 2       # Triton's num_stages (``launch_options``)


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


@triton.jit
def _columns(i_v, J, NB, V: tl.constexpr, NBP: tl.constexpr, BV: tl.constexpr):
    """The program's tile columns: ``blk`` (block of each column), ``o_v`` (its V column),
    ``col`` (its column in the stacked ``NB·V``), ``m_c`` (a real block and V column) and
    ``own`` (a real own block)."""
    o_c = tl.arange(0, NBP * BV)
    blk = o_c // BV
    o_v = i_v * BV + o_c % BV
    col = blk * V + o_v
    m_c = (blk < NB) & (o_v < V)
    own = (blk >= J) & m_c
    return blk, o_v, col, m_c, own


@triton.jit
def _merged(x, take, BK: tl.constexpr, NBP: tl.constexpr, BV: tl.constexpr):
    """``[BK, NBP·BV]`` -> the sum over the blocks ``take`` of each V column, in every block
    (``take = blk == m``: block m's columns in every block)."""
    x = tl.sum(tl.reshape(tl.where(take[None, :], x, 0.0), [BK, NBP, BV]), axis=1)
    return tl.reshape(tl.broadcast_to(x[:, None, :], [BK, NBP, BV]), [BK, NBP * BV])


@triton.jit(do_not_specialize=["T", "N", "J", "L", "NB"])
def fenwick_states_fwd_kernel(
    kg, wy, u, gk, mtab, h0, h, vn, final, cu_seqlens, chunk_offsets, T, N, J, L, NB,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, NBP: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NBV = NB * V
    bos, T, N, i_c0 = _sequence(i_b, cu_seqlens, chunk_offsets, T, N, BT, IS_VARLEN)
    blk, o_v, col, m_c, own = _columns(i_v, J, NB, V, NBP, BV)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_kc = m_k[:, None] & m_c[None, :]
    p_kc = o_k[:, None] * NBV + col[None, :]
    b_z = tl.load(h0 + (i_b.to(tl.int64) * H + i_h) * K * NBV + p_kc, mask=m_kc, other=0.0)
    b_end = tl.zeros([BK, NBP * BV], dtype=tl.float32)
    for c in range(0, N):
        o_t = c * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        p_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_kg = tl.load(kg + p_tk, mask=m_tk, other=0.0)     # dot operands in the activations' dtype
        b_w = tl.load(wy + p_tk, mask=m_tk, other=0.0)
        last = tl.minimum(c * BT + BT, T) - 1
        b_gl = tl.exp2(tl.load(gk + ((bos + last) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        tl.store(h + ((i_c0 + c) * H + i_h) * K * NBV + p_kc, b_z.to(h.dtype.element_ty), mask=m_kc)
        p_tc = ((bos + o_t[:, None]) * H + i_h) * NBV + col[None, :]
        b_u = tl.load(u + p_tc, mask=m_t[:, None] & own[None, :], other=0.0).to(tl.float32)   # 0 on buckets
        b_vn = (b_u - tl.dot(b_w, b_z.to(b_w.dtype), input_precision=DOT)).to(vn.dtype.element_ty)
        tl.store(vn + p_tc, b_vn, mask=m_t[:, None] & m_c[None, :])
        b_end = b_z * b_gl[:, None] + tl.dot(tl.trans(b_kg), b_vn.to(b_kg.dtype), input_precision=DOT)
        # the carry: block m takes the own blocks and the buckets below it, buckets above m keep
        # their end state, the rest empty
        m = tl.load(mtab + c)
        b_acc = _merged(b_end, own | ((blk < m) & m_c), BK, NBP, BV)
        b_z = tl.where((m_c & ~own & (blk > m))[None, :], b_end, 0.0) + tl.where((blk == m)[None, :], b_acc, 0.0)
    lvl = tl.where(own, blk - J, blk + 7)
    p_f = final + ((i_b.to(tl.int64) * H + i_h) * L) * K * V + lvl[None, :] * K * V + o_k[:, None] * V + o_v[None, :]
    tl.store(p_f, b_end, mask=m_kc & (lvl < L)[None, :] & (N > 0))


@triton.jit(do_not_specialize=["T", "N", "J", "L", "NB"])
def fenwick_states_bwd_kernel(
    qg, kg, wy, gk, do, dv, dfinal, dcarry, mtab, dh, dv2, dpre, cu_seqlens, chunk_offsets, scale, T, N, J, L, NB,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, NBP: tl.constexpr, BV: tl.constexpr, HAS_DFINAL: tl.constexpr,
    HAS_DCARRY: tl.constexpr, DOT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NBV = NB * V
    JV = tl.maximum(J, 1) * V
    bos, T, N, i_c0 = _sequence(i_b, cu_seqlens, chunk_offsets, T, N, BT, IS_VARLEN)
    blk, o_v, col, m_c, own = _columns(i_v, J, NB, V, NBP, BV)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_kc = m_k[:, None] & m_c[None, :]
    p_kc = o_k[:, None] * NBV + col[None, :]
    lvl = tl.where(own, blk - J, blk + 7)
    if HAS_DCARRY:            # the pre-state gradient of the chunk after the last (a later piece's)
        p_c = dcarry + (i_b.to(tl.int64) * H + i_h) * K * JV + o_k[:, None] * JV + col[None, :]
        b_g = tl.load(p_c, mask=m_kc & (blk < J)[None, :], other=0.0)
    else:
        b_g = tl.zeros([BK, NBP * BV], dtype=tl.float32)  # the next chunk's pre-state gradient
    for c in range(N - 1, -1, -1):
        o_t = c * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tc = m_t[:, None] & m_c[None, :]
        p_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_qg = tl.load(qg + p_tk, mask=m_tk, other=0.0)     # dot operands in the activations' dtype
        b_kg = tl.load(kg + p_tk, mask=m_tk, other=0.0)
        b_w = tl.load(wy + p_tk, mask=m_tk, other=0.0)
        last = tl.minimum(c * BT + BT, T) - 1
        b_gl = tl.exp2(tl.load(gk + ((bos + last) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32))
        # the carry's transpose: buckets above m from their own pre-state gradient, the own blocks
        # and the buckets below m from block m's, bucket m none
        m = tl.load(mtab + c)
        b_dh = (tl.where((m_c & ~own & (blk > m))[None, :], b_g, 0.0)
                + tl.where((own | ((blk < m) & m_c))[None, :], _merged(b_g, blk == m, BK, NBP, BV), 0.0))
        if HAS_DFINAL:        # dfinal is None without a final-state gradient: no address of it
            if c == N - 1:
                p_f = (dfinal + ((i_b.to(tl.int64) * H + i_h) * L) * K * V + lvl[None, :] * K * V
                       + o_k[:, None] * V + o_v[None, :])
                b_dh += tl.load(p_f, mask=m_kc & (lvl < L)[None, :], other=0.0)
        tl.store(dh + ((i_c0 + c) * H + i_h) * K * NBV + p_kc, b_dh.to(dh.dtype.element_ty), mask=m_kc)
        p_tc = ((bos + o_t[:, None]) * H + i_h) * NBV + col[None, :]
        b_dv = tl.dot(b_kg, b_dh.to(b_kg.dtype), input_precision=DOT)
        b_dv = (b_dv + tl.load(dv + p_tc, mask=m_tc, other=0.0).to(tl.float32)).to(dv2.dtype.element_ty)
        tl.store(dv2 + p_tc, b_dv, mask=m_tc)
        b_do = tl.load(do + p_tc, mask=m_tc, other=0.0)
        b_g = (b_dh * b_gl[:, None] + scale * tl.dot(tl.trans(b_qg), b_do.to(b_qg.dtype), input_precision=DOT)
               - tl.dot(tl.trans(b_w), b_dv.to(b_w.dtype), input_precision=DOT))
    # (the offsets made again here, as for the carry: no int64 tile held through the loop)
    p_pre = dpre + (i_b.to(tl.int64) * H + i_h) * K * JV + o_k[:, None] * JV + col[None, :]
    tl.store(p_pre, b_g, mask=m_kc & (blk < J)[None, :])


def block_sizes(K: int, V: int, NB: int, width: int | None = None, block_k: int | None = None
                ) -> tuple[int, int, int]:
    """``(BK, NBP, BV)``: the key block (default: K rounded up to a power of two, at least 16),
    the blocks rounded up to a power of two (at least ``MIN_BLOCKS``) and the V columns of each
    block a program holds: ``width`` columns in all (default ``WIDTH``) where V allows, and never
    fewer than ``MIN_WIDTH`` (masked columns where V is narrow).

    Why not narrower, why not two blocks: on the H200 (Triton 3.6, bf16 operands;
    ``bench.fenwick_scan_ab`` and the op's bf16 property, 2026-12-02) tiles of 16 columns hit an
    illegal memory access at every K tried (32 … 128), and of 32 columns at K = 112 and 128;
    two blocks of 64 columns (NB = 2, T = 65 … 128) gave an output off by 0.21 at K = 48,
    V = 80. Four to sixteen blocks over 64 and 128 columns agreed with the previous scans at
    every shape tried (K = 32 … 128, V = 32 … 128)."""
    width = WIDTH if width is None else width
    if not isinstance(width, int) or isinstance(width, bool) or width < MIN_WIDTH or width & (width - 1):
        raise ValueError(f"width must be a power of two >= {MIN_WIDTH}, got {width!r}")
    BK = max(16, next_power_of_2(K))
    if block_k is not None:
        if not isinstance(block_k, int) or isinstance(block_k, bool) or block_k < BK or block_k & (block_k - 1):
            raise ValueError(f"block_k must be a power of two >= {BK} (K = {K}), got {block_k!r}")
        BK = block_k
    NBP = max(MIN_BLOCKS, next_power_of_2(NB))
    BV = max(min(next_power_of_2(V), max(1, width // NBP)), cdiv(MIN_WIDTH, NBP))
    return BK, NBP, BV


def launch_options(BK: int, NBP: int, BV: int, stages: int | None) -> dict:
    """``num_warps`` (``optimized.warps.num_warps`` for the ``[BK, NBP·BV]`` tile) and
    ``num_stages`` (default ``STAGES``, then one where the GPU refuses two: ``_launch``; 1 or 2).
    Triton's default, 3, needs more shared memory
    than the H200 has in the reverse scan at K = 112 and 128 (246–262 KiB of 227; 2026-12-02):
    it is refused. Two stages were the faster of 1 and 2 at both benchmark shapes."""
    stages = STAGES if stages is None else stages
    if not isinstance(stages, int) or isinstance(stages, bool) or stages not in (1, 2):
        raise ValueError(f"num_stages must be 1 or 2, got {stages!r}")
    return {"num_warps": num_warps(BK, NBP * BV), "num_stages": stages}


def _rows(kg, p):
    """``(sequences, cu_seqlens, chunk_offsets)`` of the launch: the batch rows, or the packed
    row's sequences (``p``, a ``Packing``)."""
    if p is None:
        return kg.shape[0], None, None
    if kg.shape[0] != 1:
        raise ValueError(f"kg: a packed row (p) needs B = 1, got B = {kg.shape[0]}")
    return p.n_seqs, p.cu_seqlens, p.chunk_offsets


def states_fwd(kg, wy, u, gk, mtab, h0, N: int, J: int, L: int, V: int, n_own: int = OWN_LEVELS,
               precision: str = "ieee", dtype: torch.dtype = torch.float32, p=None, width: int | None = None,
               num_stages: int | None = None, block_k: int | None = None):
    """From the first chunk's stacked pre-state ``h0 [S, H, K, NB·V]`` float32 (``NB = J + n_own``;
    S sequences: the batch rows, or the sequences of the packed row ``p``), returns
    ``(h [B, N, H, K, NB·V], vn [B, T, H, NB·V], final [S, H, L, K, V] float32)``: every chunk's
    pre-state and ``vn`` in ``dtype`` (what fla's pieces read; the scan itself carries float32
    states), the final states in float32. ``N``: chunks per row (a packed row: its packed grid's
    ``p.n_chunks``; ``h``'s chunk index is fla's). ``mtab[c]``: the carry after a sequence's
    local chunk c. With ``n_own = 1`` final level 0 holds the last chunk's whole own end state
    and levels 1 … 6 stay zero. ``width``, ``num_stages``: launch choices (``block_sizes``,
    ``launch_options``)."""
    B, T, H, K = kg.shape
    S, cu_seqlens, chunk_offsets = _rows(kg, p)
    NB = J + n_own
    if tuple(h0.shape) != (S, H, K, NB * V):
        raise ValueError(f"h0 must be [S, H, K, (J + n_own) * V] = {(S, H, K, NB * V)}, "
                         f"got {tuple(h0.shape)}")
    BK, NBP, BV = block_sizes(K, V, NB, width, block_k)
    opts = launch_options(BK, NBP, BV, num_stages)
    h0 = h0.float().contiguous()
    h = torch.empty(B, N, H, K, NB * V, device=kg.device, dtype=dtype)
    vn = torch.empty(B, T, H, NB * V, device=kg.device, dtype=dtype)
    final = torch.zeros(S, H, L, K, V, device=kg.device, dtype=torch.float32)
    grid = (cdiv(V, BV), S * H)
    _launch(fenwick_states_fwd_kernel, grid, (kg, wy, u, gk, mtab, h0, h, vn, final, cu_seqlens, chunk_offsets,
                                              T, N, J, L, NB),
            dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, NBP=NBP, BV=BV, DOT=precision, IS_VARLEN=p is not None), opts,
            num_stages, kg)
    return h, vn, final


def _launch(kernel, grid, args, consts: dict, opts: dict, num_stages, like):
    """``kernel[grid]`` at ``opts``; where the caller left ``num_stages`` to ``launch_options``, at one
    stage where the GPU refuses the shared memory of two. Why: float32 activations (IEEE dots) stage
    160 KiB (forward) and 192 KiB (reverse) at K = 128, 112 KiB (reverse) at K = 64: more than a GPU
    with 99 KiB (sm_89) or, for the reverse scan at K = 128, 163 KiB (sm_80) gives a block; 48–64 KiB at
    one stage (docs/kernel-shared-memory.md). A refused launch never runs; the values are the same."""
    def run(**stages):
        kernel[grid](*args, **consts, **(opts | stages))

    if num_stages is not None:
        run()
    else:
        one_stage_where_refused((kernel, tuple(consts.items()), tuple(opts.items()), like.dtype, like.device), run)


def states_bwd(qg, kg, wy, gk, do, dv, dfinal, mtab, scale: float, N: int, J: int, L: int, V: int,
               n_own: int = OWN_LEVELS, precision: str = "ieee", dtype: torch.dtype = torch.float32, p=None,
               width: int | None = None, num_stages: int | None = None, block_k: int | None = None,
               dcarry: torch.Tensor | None = None):
    """Returns ``dh [B, N, H, K, NB·V]`` (gradient of every chunk's end states) and ``dv2`` (the
    gradient of ``vn``), both in ``dtype`` (what fla's pieces read), and ``dpre0 [S, H, K,
    max(J,1)·V]`` float32, the gradient of each sequence's first bucket pre-state. ``N``, ``p``
    as in ``states_fwd``; ``dfinal [S, H, L, K, V]`` or None; ``width``, ``num_stages`` as there.

    ``dcarry``: the rows are the first chunks of longer sequences, and this is the gradient of
    the bucket pre-state of the chunk after their last (a later piece's ``dpre0``, same shape;
    ``mtab`` then starts at the piece's first chunk): the reverse scan runs piece by piece,
    last piece first, with the same values as in one call."""
    B, T, H, K = kg.shape
    S, cu_seqlens, chunk_offsets = _rows(kg, p)
    if dfinal is not None and tuple(dfinal.shape) != (S, H, L, K, V):
        raise ValueError(f"dfinal must be [S, H, L, K, V] = {(S, H, L, K, V)}, got {tuple(dfinal.shape)}")
    if dcarry is not None:
        want = (S, H, K, max(J, 1) * V)
        if tuple(dcarry.shape) != want or dcarry.dtype != torch.float32 or not dcarry.is_contiguous():
            raise ValueError(f"dcarry must be contiguous float32 {want}, got {tuple(dcarry.shape)} {dcarry.dtype}")
        if p is not None:
            raise ValueError("dcarry (a piece of longer sequences) is not supported in a packed row")
        if B != 1:      # the op's time pieces split one row (bwd.time_pieces); a batch of pieces is untested
            raise ValueError(f"dcarry (a piece of a longer sequence) needs B = 1, got B = {B}")
    NB = J + n_own
    BK, NBP, BV = block_sizes(K, V, NB, width, block_k)
    opts = launch_options(BK, NBP, BV, num_stages)
    dh = torch.empty(B, N, H, K, NB * V, device=kg.device, dtype=dtype)
    dv2 = torch.empty(B, T, H, NB * V, device=kg.device, dtype=dtype)
    dpre = torch.zeros(S, H, K, max(J, 1) * V, device=kg.device, dtype=torch.float32)
    grid = (cdiv(V, BV), S * H)
    _launch(fenwick_states_bwd_kernel, grid, (qg, kg, wy, gk, do, dv, dfinal, dcarry, mtab, dh, dv2, dpre, cu_seqlens,
                                              chunk_offsets, scale, T, N, J, L, NB),
            dict(H=H, K=K, V=V, BT=CHUNK, BK=BK, NBP=NBP, BV=BV, HAS_DFINAL=dfinal is not None,
                 HAS_DCARRY=dcarry is not None, DOT=precision, IS_VARLEN=p is not None), opts, num_stages, kg)
    return dh, dv2, dpre
