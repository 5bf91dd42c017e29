"""Nested GDN-2's reads and router, forward, in one Triton kernel (CONTRACT section 3).

Token ``t`` of chunk ``j`` (0-based, ``C = 64`` tokens) mixes level 0's output with the
reads of the upper levels' states as they stood when chunk ``j`` began:

    p_t   = softmax(r_t)                                            [L], float32
    o_t   = p_t,0 · o0_t + Σ_{ℓ=1}^{L-1} p_t,ℓ · scale · M_ℓ,j^T q_t^(ℓ)

with ``M_ℓ,j = states[read_row[ℓ, j]]``. All upper levels' stored states are rows of one
float32 ``states [B, S, H, K, V]`` (level ℓ's ``F_ℓ + 1`` states are rows
``row_offset[ℓ] .. row_offset[ℓ] + F_ℓ``), so one kernel serves every level and the level
loop runs inside the kernel. The rows may sit in two allocations, level 1's and the higher
levels' (``optimized.nested.stored_states``: the backward frees the second one early); the
kernels take both and pick by row (``state_row``). ``read_tables`` builds the row tables from a schedule.

Layouts (fla style): ``q [B, T, H, L, K]`` (level ℓ's query is read in place),
``r [B, T, H, L]``, ``o0 / o [B, T, H, V]``, all in one dtype (float32 or bfloat16);
``read_row int32 [L, N]`` (row 0 unused), ``N = ⌈T / 64⌉``.

Precision: the router and every accumulator are float32. Float32 inputs use IEEE dots
(``input_precision="ieee"``, no TF32). Bfloat16 inputs use bf16 tensor-core dots but keep
the float32 state: ``M = hi + lo`` with ``hi = bf16(M)``, ``lo = bf16(M - hi)`` and
``q @ M ≈ q @ lo + q @ hi`` (``q`` is exactly bf16), float32 accumulation; the state then
carries 16 significant bits (relative error ≤ 2^-16 per entry, bf16's unit roundoff 2^-8
squared) instead of bf16's 8.

Kernels address their blocks with explicit pointer arithmetic and masks for ragged
edges (ragged last chunk, K not a power of two, ragged last V block); the same code runs
compiled on CUDA and under Triton's interpreter on CPU.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl

from optimized.fits import first_that_fits
from optimized.nested.level0 import CHUNK
from optimized.nested.stored_states import as_stored
from optimized.warps import num_warps
from optimized.host_math import cdiv, next_power_of_2

# CUDA limits the 2nd and 3rd grid dimensions to 65535 programs.
MAX_GRID_YZ = 65535


# ----------------------------------------------------------------------------- jit helpers
@triton.jit
def router_probs(r, i_b, i_h, o_t, m_t, T, L, H: tl.constexpr, BL: tl.constexpr):
    """``softmax(r[b, t, h, :])`` over the ``L`` levels for the tokens ``o_t``: ``[BT, BL]`` float32.

    Columns ≥ L are -inf before the softmax (probability 0). Rows of tokens past ``T`` are
    loaded as logits 0 (uniform, finite: they may multiply masked-out zeros, never NaN).
    """
    o_l = tl.arange(0, BL)
    m_l = o_l < L
    p_r = r + ((i_b.to(tl.int64) * T + o_t.to(tl.int64)) * H + i_h) * L
    b_r = tl.load(p_r[:, None] + o_l[None, :], mask=m_t[:, None] & m_l[None, :], other=0.0).to(tl.float32)
    b_r = tl.where(m_l[None, :], b_r, float("-inf"))
    b_e = tl.exp(b_r - tl.max(b_r, axis=1)[:, None])
    b_p = b_e / tl.sum(b_e, axis=1)[:, None]
    return b_p


@triton.jit
def chunk_tokens(i_c, chunk_bounds, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The tokens of chunk ``i_c`` and their mask, ``(o_t [BT], m_t [BT])``: ``i_c·BT ..`` below
    ``T``, or (``IS_VARLEN``, packed sequences) ``chunk_bounds[i_c] = (first, end)`` of the
    packed row (each sequence's chunks start at its first token)."""
    if IS_VARLEN:
        lo = tl.load(chunk_bounds + 2 * i_c)
        hi = tl.load(chunk_bounds + 2 * i_c + 1)
        o_t = lo + tl.arange(0, BT)
        m_t = o_t < hi
    else:
        o_t = i_c * BT + tl.arange(0, BT)
        m_t = o_t < T
    return o_t, m_t


@triton.jit
def level_column(b_p, l, BL: tl.constexpr):
    """Column ``l`` (a runtime level) of a ``[BT, BL]`` block: ``[BT]``."""
    o_l = tl.arange(0, BL)
    return tl.sum(tl.where(o_l[None, :] == l, b_p, 0.0), axis=1)


@triton.jit
def dot_exact_a(a, b, SPLIT: tl.constexpr):
    """``a @ b`` in float32 where ``b`` is float32 and ``a`` is exact in the input dtype.

    ``SPLIT`` (bf16 inputs): two bf16 tensor-core dots, ``a @ lo(b) + a @ hi(b)``; else one
    IEEE float32 dot.
    """
    if SPLIT:
        a16 = a.to(tl.bfloat16)
        hi = b.to(tl.bfloat16)
        lo = (b - hi.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(a16, lo, out_dtype=tl.float32)
        return tl.dot(a16, hi, acc, out_dtype=tl.float32)
    else:
        return tl.dot(a.to(tl.float32), b, input_precision="ieee")


@triton.jit
def dot_exact_b(a, b, SPLIT: tl.constexpr):
    """``a @ b`` in float32 where ``a`` is float32 and ``b`` is exact in the input dtype
    (the mirror of ``dot_exact_a``: ``a`` is split into bf16 ``hi + lo``)."""
    if SPLIT:
        b16 = b.to(tl.bfloat16)
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(lo, b16, out_dtype=tl.float32)
        return tl.dot(hi, b16, acc, out_dtype=tl.float32)
    else:
        return tl.dot(a, b.to(tl.float32), input_precision="ieee")


# ----------------------------------------------------------------------------- kernel
# T, N (chunks), S (stored rows) and L (levels) are runtime sizes, not specialised: a new
# sequence length, schedule or depth reuses the compiled kernel (H, K, V, the blocks and the
# dtype pick a variant).
@triton.jit
def state_row(states, states_hi, i_b, i_row, i_h, S, S_LO, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Where stored row ``i_row`` of batch ``i_b``, head ``i_h`` starts: rows below ``S_LO`` in
    ``states [B, S_LO, H, K, V]``, the others in ``states_hi [B, S - S_LO, H, K, V]``
    (``optimized.nested.stored_states``; one buffer: ``S_LO = S``)."""
    if i_row < S_LO:
        p = states + ((i_b.to(tl.int64) * S_LO + i_row) * H + i_h) * K * V
    else:
        p = states_hi + ((i_b.to(tl.int64) * (S - S_LO) + (i_row - S_LO)) * H + i_h) * K * V
    return p


@triton.jit(do_not_specialize=["T", "N", "S", "S_LO", "L"])
def reads_fwd_kernel(
    q, r, o0, states, states_hi, read_row, chunk_bounds, o,
    scale, T, N, S, S_LO, L,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr,
    SPLIT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """One (V block, chunk j, batch·head) program; ``BT = 64`` tokens, ``[BT, BV]`` outputs:

        p   = softmax(r[tokens])                                  [BT, BL] float32
        acc = p[:, 0] ⊙ o0[tokens, block]
        for ℓ in 1 .. L-1:
            M    = states[read_row[ℓ, j]][:, block]               [BK, BV] float32 (``state_row``)
            acc += p[:, ℓ] ⊙ scale · (q[tokens, ℓ] @ M)           [BT, BK] @ [BK, BV]
        o[tokens, block] = acc  (in o's dtype)

    Tokens ≥ T, key columns ≥ K and value columns ≥ V are masked (loaded as 0, never stored).
    ``IS_VARLEN``: chunk j's tokens are ``chunk_bounds[j]`` (``chunk_tokens``).
    """
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H

    o_t, m_t = chunk_tokens(i_c, chunk_bounds, T, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]
    tok = (i_b.to(tl.int64) * T + o_t.to(tl.int64)) * H + i_h            # [BT] (b, t, h) index

    b_p = router_probs(r, i_b, i_h, o_t, m_t, T, L, H, BL)
    b_o0 = tl.load(o0 + tok[:, None] * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
    b_o = level_column(b_p, 0, BL)[:, None] * b_o0
    for l in range(1, L):
        i_row = tl.load(read_row + l * N + i_c)
        p_m = state_row(states, states_hi, i_b, i_row, i_h, S, S_LO, H, K, V)
        b_m = tl.load(p_m + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
        b_q = tl.load(q + (tok * L + l)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
        b_o += (level_column(b_p, l, BL) * scale)[:, None] * dot_exact_a(b_q, b_m, SPLIT)
    tl.store(o + tok[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)


# ----------------------------------------------------------------------------- host side
class ReadTables(NamedTuple):
    """Row tables of one schedule over the concatenated ``states [B, S, H, K, V]``.

    ``read_row int32 [L, N]``: the row chunk j reads for level ℓ ≥ 1 (row 0 of the table: 0).
    ``row_offset`` (host ints, L + 1 entries): level ℓ's first row for ℓ ≥ 1 (entry 0 unused, 0),
    and the total ``S`` last. ``row_level, row_chunk_lo, row_chunk_hi int32 [S]``:
    the level of row s and the chunks ``[lo, hi)`` that read it (``lo = hi``: read by none).
    """
    read_row: torch.Tensor
    row_offset: tuple
    row_level: torch.Tensor
    row_chunk_lo: torch.Tensor
    row_chunk_hi: torch.Tensor


def read_tables(read_index: Sequence[Sequence[int]], rows: Sequence[int], device) -> ReadTables:
    """The tables the reads kernels take, from a schedule (host ints, one host→device copy each).

    ``read_index[ℓ]`` (ℓ ≥ 1; entry 0 ignored): per 0-based chunk, the index of level ℓ's
    own stored state its tokens read, nondecreasing in the chunk (``Plan.read_index``).
    ``rows[ℓ]``: how many states level ℓ stores (``F_ℓ + 1``; entry 0 ignored).
    """
    L = len(read_index)
    if L < 2:
        raise ValueError(f"read_tables needs at least one upper level (L >= 2), got L = {L}")
    if len(rows) != L:
        raise ValueError(f"rows must have one entry per level ({L}), got {len(rows)}")
    N = len(read_index[1])
    offsets = [0, 0]
    for ℓ in range(1, L):
        offsets.append(offsets[-1] + rows[ℓ])
    S = offsets[-1]
    read_row = [[0] * N]
    level, lo, hi = [], [], []
    for ℓ in range(1, L):
        idx = list(read_index[ℓ])
        if len(idx) != N:
            raise ValueError(f"read_index[{ℓ}] must have {N} chunks, got {len(idx)}")
        if any(not 0 <= i < rows[ℓ] for i in idx) or any(a > b for a, b in zip(idx, idx[1:])):
            raise ValueError(f"read_index[{ℓ}] must be nondecreasing in [0, {rows[ℓ]}), got {idx}")
        read_row.append([offsets[ℓ] + i for i in idx])
        for i in range(rows[ℓ]):            # idx is sorted: row i is read by chunks [lo, hi)
            level.append(ℓ)
            lo.append(bisect.bisect_left(idx, i))
            hi.append(bisect.bisect_right(idx, i))

    def dev(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return ReadTables(dev(read_row).view(L, N), tuple(offsets), dev(level).view(S),
                      dev(lo).view(S), dev(hi).view(S))


def block_sizes(K: int, V: int, L: int, block_v: int | None = None) -> tuple[int, int, int, int]:
    """``BT = 64`` (one chunk); ``BK`` covers all of K (≥ 16 for ``tl.dot``); ``BV`` splits V
    across programs (64 for K ≤ 64, else 32: the ``[BK, BV]`` state block and the
    ``[64, BV]`` accumulator stay in registers); ``BL`` covers the levels."""
    BK = max(16, next_power_of_2(K))
    if block_v is None:
        block_v = 64 if BK <= 64 else 32
    BV = max(16, min(next_power_of_2(block_v), next_power_of_2(V)))
    BL = max(2, next_power_of_2(L))
    return CHUNK, BK, BV, BL


def forward_block_v(K: int, dtype: torch.dtype) -> int | None:
    """The forward kernel's default V block: 128 for bfloat16 inputs at ``64 < K ≤ 128`` (one
    program per chunk and (batch, head) at V ≤ 128, reading the chunk's queries of every level
    once instead of once per V block), else None (``block_sizes``' default, which the backward
    keeps). H200, bf16, K = V = 128 (bench/NOTES.md): the forward −0.15 ms at L = 2, −0.22 ms at
    L = 4 against V blocks of 32; 64 gained nothing; float32 inputs were not measured."""
    BK = max(16, next_power_of_2(K))
    return 128 if dtype == torch.bfloat16 and 64 < BK <= 128 else None


def _expect(name, x, shape, dtypes, device):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device} (the device of q)")


def check_reads(q, r, o0, states, read_row, chunk_bounds=None):
    """Shapes, dtypes and devices shared by ``reads_fwd`` and ``reads_bwd``; returns the sizes
    ``(B, T, H, L, K, V, S, N)`` (``N``: the chunks, ``chunk_bounds``' rows when given).
    ``states``: one ``[B, S, H, K, V]`` tensor or a ``StoredStates`` (its two allocations)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 5:
        raise ValueError(f"q must have shape [B, T, H, L, K], got {tuple(q.shape)}")
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"q must have dtype in ['torch.float32', 'torch.bfloat16'], got {q.dtype}")
    B, T, H, L, K = q.shape
    stored = as_stored(states)
    S, V = stored.S, stored.lo.shape[-1]
    N = cdiv(T, CHUNK)
    if chunk_bounds is not None:
        if B != 1:
            raise ValueError(f"chunk_bounds: packed sequences need B = 1, got B = {B}")
        if not isinstance(chunk_bounds, torch.Tensor) or chunk_bounds.dim() != 2:
            raise ValueError("chunk_bounds must be an int32 [N, 2] tensor (each packed chunk's first token "
                             "and one past its last)")
        N = chunk_bounds.shape[0]
        _expect("chunk_bounds", chunk_bounds, (N, 2), (torch.int32,), q.device)
    _expect("r", r, (B, T, H, L), (q.dtype,), q.device)
    _expect("o0", o0, (B, T, H, V), (q.dtype,), q.device)
    _expect("states", stored.lo, (B, stored.S_lo, H, K, V), (torch.float32,), q.device)
    if stored.hi is not None:
        _expect("states (rows past level 1's)", stored.hi, (B, S - stored.S_lo, H, K, V), (torch.float32,), q.device)
    _expect("read_row", read_row, (L, N), (torch.int32,), q.device)
    if L > 1 and S == 0:
        raise ValueError("states has no rows, but the upper levels read some (L > 1)")
    for name, n in (("chunks N = ceil(T/64)", N), ("B*H", B * H), ("rows S", S)):
        if n > MAX_GRID_YZ:
            raise ValueError(f"{name} = {n} exceeds the kernels' grid limit {MAX_GRID_YZ}")
    return B, T, H, L, K, V, S, N


def reads_fwd(q: torch.Tensor, r: torch.Tensor, o0: torch.Tensor, states: torch.Tensor,
              read_row: torch.Tensor, scale: float, *, block_v: int | None = None,
              chunk_bounds: torch.Tensor | None = None) -> torch.Tensor:
    """``o [B, T, H, V]`` in q's dtype: ``o_t = p_t,0 o0_t + Σ_{ℓ≥1} p_t,ℓ · scale · M_ℓ,j^T q_t^(ℓ)``
    with ``p_t = softmax(r_t)`` and ``M_ℓ,j = states[read_row[ℓ, j]]`` (module docstring).

    ``q [B, T, H, L, K]``, ``r [B, T, H, L]``, ``o0 [B, T, H, V]`` (one dtype: float32 or
    bfloat16); ``states [B, S, H, K, V]`` float32, or a ``StoredStates`` (the same rows in two
    allocations, ``optimized.nested.stored_states``); ``read_row int32 [L, N]`` (valid rows of
    ``states``; not checked: it lives on the device). ``block_v``: the V block (tests shrink
    it to reach several V blocks; None: ``forward_block_v``, else ``block_sizes``' default).
    ``chunk_bounds``: sequences packed in one row (``B = 1``): int32 ``[N, 2]``, each chunk's
    first token and one past its last (every sequence's chunks start at its first token);
    ``read_row`` then runs over these N chunks.
    """
    B, T, H, L, K, V, S, N = check_reads(q, r, o0, states, read_row, chunk_bounds)
    o = o0.new_empty(B, T, H, V)
    if o.numel() == 0:
        return o
    lo, hi, S_lo = as_stored(states).kernel_args()
    args = (q.contiguous(), r.contiguous(), o0.contiguous(), lo, hi, read_row.contiguous(), chunk_bounds, o,
            float(scale), T, N, S, S_lo, L)

    def run(bv):
        BT, BK, BV, BL = block_sizes(K, V, L, bv)
        reads_fwd_kernel[(cdiv(V, BV), N, B * H)](
            *args, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, BL=BL, SPLIT=q.dtype == torch.bfloat16,
            IS_VARLEN=chunk_bounds is not None, num_warps=num_warps(BK, BV))

    wide = forward_block_v(K, q.dtype) if block_v is None else None
    if wide is None:
        run(block_v)
    else:
        # V blocks of 128 need ≈ 160 KiB of shared memory per program at K = 128, more than some
        # GPUs give a block: the backward's default there; an asked block_v is not changed
        first_that_fits((reads_fwd_kernel, H, K, V, L, wide, q.dtype, chunk_bounds is not None, q.device),
                        (lambda: run(wide), lambda: run(None)))
    return o
