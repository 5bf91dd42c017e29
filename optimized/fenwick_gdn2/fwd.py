"""Forward of the chunked Fenwick GDN-2 memory (orchestration; see ``optimized.fenwick_gdn2``).

1. fla: ``chunk_local_cumsum`` (base-2 in-chunk cumsum ``gk`` of the log-decay); the intra
   matrices ``Aqk``, ``Akk``: fla's ``chunk_gdn2_fwd_intra`` in cuda mode, ours (Triton,
   ``wy.py``, the same matrices, 15x faster under the interpreter) in cpu-interpret mode;
   then fla's ``recompute_w_u_fwd_gdn2`` on the *stacked* values (``v_st``, ``w_st``: zeros on the
   J bucket blocks, ``v`` and ``w`` on one own block; in the last chunk's pass ``v ⊙ [level(last,
   s) = ℓ]`` and ``w`` on 7 own-level blocks) giving the WY vectors ``w_wy``, ``u_st``, and ``qg``, ``kg``.
2. ours (Triton, ``states.py``): the chunk-level Fenwick scan of the stacked bucket
   states: per-chunk pre-states ``h``, ``vn = u_st − w_wy h``, the final states.
3. fla: ``chunk_gla_fwd_o_gk`` on the stacked blocks: ``O_j = scale · qg h_j + Aqk vn_j``,
   the read of bucket j through the chunk's transition (``q̂^T Z_j``); the own block's is
   computed too (reading the stacked tensors in place costs less than copying the buckets out)
   and not used.
4. ours (Triton, ``intra.py``): the chunk's own tokens, level-weighted and masked.
5. ours (Triton, ``router.py``): ``o = o_intra + Σ_j λ[7 + j] ⊙ O_j`` (the router over the
   bucket blocks' reads, read in place in the stacked reads).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from optimized import triton_mode  # device mode before fla
from optimized.fenwick_gdn2.intra import intra_fwd
from optimized.fenwick_gdn2.packing import Packing, last_chunks
from optimized.fenwick_gdn2.precision import dot_precision
from optimized.fenwick_gdn2.router import router_fwd
from optimized.fenwick_gdn2.states import CHUNK, OWN_LEVELS, states_fwd
from optimized.fenwick_gdn2.wy import fenwick_wy_fwd
from reference.fenwick import trailing_ones
from optimized.host_math import cdiv


def bucket_blocks(offset: int, T: int, L: int, has_initial_state: bool) -> int:
    """``J``: the chunk-level buckets the scan keeps (token levels ``7 .. 6+J``). Every chunk-level
    that two chunks of the absolute range ``[offset, offset + T)`` can be apart: the bit length of
    the last absolute chunk index; with an initial state also every level it holds (``L − 7``)."""
    last_chunk = (offset + T - 1) // CHUNK
    J = last_chunk.bit_length()
    if has_initial_state:
        J = max(J, L - OWN_LEVELS)
    return J


def stacked_blocks(offset: int, T: int, L: int, has_initial_state: bool) -> int:
    """``NB``, the value blocks one chunk carries in the main pass: the ``J`` bucket blocks and one
    own block, or, in a one-chunk call (a single pass, split by level), seven own blocks."""
    return bucket_blocks(offset, T, L, has_initial_state) + (OWN_LEVELS if T <= CHUNK else 1)


def own_level_masks(T: int, device, p: Packing | None = None) -> torch.Tensor:
    """``[T, 7]`` float32 one-hot of ``level(last_c, s)`` for token s of chunk c, ``last_c`` the
    chunk's last token (``min(64c + 63, T − 1)``): which of the chunk's own final levels s is in.
    In a packed row (``p``) positions, chunks and ``T`` are each sequence's own."""
    s = torch.arange(T, device=device)
    if p is None:
        pos, length = s, T
    else:
        cu = p.cu_seqlens.to(device=device, dtype=torch.int64)
        seq = torch.searchsorted(cu, s, right=True) - 1
        pos, length = s - cu[seq], cu[seq + 1] - cu[seq]
    last = torch.minimum((pos // CHUNK) * CHUNK + CHUNK - 1, torch.as_tensor(length - 1, device=device))
    x = (pos ^ last) & (CHUNK - 1)
    lev = torch.zeros_like(s)
    for bit in range(6):
        lev += ((x >> bit) > 0).long()
    return torch.nn.functional.one_hot(lev, OWN_LEVELS).float()


def carry_table(offset: int, N: int, device) -> torch.Tensor:
    """int32 ``[N]``: ``m`` of the carry from chunk c to c + 1, the trailing ones of ``offset/64 + c``."""
    c0 = offset // CHUNK
    return torch.tensor([trailing_ones(c0 + c) for c in range(N)], dtype=torch.int32, device=device)


def initial_pre_state(states: torch.Tensor, offset: int, J: int) -> torch.Tensor:
    """The first chunk's stacked bucket pre-state ``[B, H, K, J·V]`` from the bucket states after
    token ``offset − 1`` (``[B, H, L, K, V]``): the carry ``offset − 1 → offset`` merges levels
    ``0 .. 6+m0`` (``m0`` the trailing ones of the previous chunk index), and whatever the
    target level ``7 + m0`` holds (nothing, in a continuation), into block ``m0`` (token level
    ``7 + m0``); every level ``7 + j``, ``j > m0``, is block j."""
    B, H, L, K, V = states.shape
    m0 = trailing_ones(offset // CHUNK - 1)
    blocks = states.new_zeros(B, H, J, K, V)
    blocks[:, :, m0] = states[:, :, : min(L, OWN_LEVELS + m0 + 1)].sum(dim=2)
    if L > OWN_LEVELS + m0 + 1:
        blocks[:, :, m0 + 1: L - OWN_LEVELS] = states[:, :, OWN_LEVELS + m0 + 1:]
    return blocks.permute(0, 1, 3, 2, 4).reshape(B, H, K, J * V)


def initial_state_grad(dpre0: torch.Tensor, offset: int, L: int, V: int) -> torch.Tensor:
    """The transpose of ``initial_pre_state``: ``[B, H, K, J·V]`` -> ``[B, H, L, K, V]``."""
    B, H, K, JV = dpre0.shape
    J = JV // V
    m0 = trailing_ones(offset // CHUNK - 1)
    d = dpre0.reshape(B, H, K, J, V).permute(0, 1, 3, 2, 4)
    out = d.new_zeros(B, H, L, K, V)
    out[:, :, : min(L, OWN_LEVELS + m0 + 1)] = d[:, :, m0: m0 + 1]
    if L > OWN_LEVELS + m0 + 1:
        out[:, :, OWN_LEVELS + m0 + 1:] = d[:, :, m0 + 1: L - OWN_LEVELS]
    return out


@dataclass
class Saved:
    """What the backward needs (fla's intermediates and ours; no recompute)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    b: torch.Tensor
    w: torch.Tensor
    lam: torch.Tensor
    gk: torch.Tensor
    v_st: torch.Tensor
    w_st: torch.Tensor
    own_masks: torch.Tensor
    Aqk: torch.Tensor
    Akk: torch.Tensor
    w_wy: torch.Tensor
    qg: torch.Tensor
    kg: torch.Tensor
    h: torch.Tensor
    vn: torch.Tensor
    reads: torch.Tensor | None        # [B, T, H, NB·V]: every stacked block's read (the J bucket blocks' used)
    mtab: torch.Tensor
    scale: float
    J: int
    offset: int
    has_initial_state: bool
    packing: Packing | None = None


def stacked_pass(q, k, v, g, b, w, lam, scale: float, initial_state, offset: int, J: int, own: torch.Tensor,
                 p: Packing | None = None):
    """One pass of the stacked GDN-2 chunk computation over ``q … lam`` (steps 1-5 above) with
    ``J`` bucket blocks and the own blocks ``v ⊙ own[:, i]`` (``own [T, n_own]``: the seven
    level masks, or one column of ones for the unsplit own state); ``p``: the ``Packing`` of a
    packed row (every piece indexes per sequence), or None. Returns ``(o, final, saved)``; with
    one own column, final level 0 is the last chunk's unsplit own state."""
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    B, T, H, K = q.shape
    V = v.shape[-1]
    L = lam.shape[-1]
    fla = {} if p is None else p.fla()
    N = cdiv(T, CHUNK) if p is None else p.n_chunks          # chunks of the (packed) grid
    S = B if p is None else p.n_seqs                                  # sequences
    n_own = own.shape[1]
    NB = J + n_own

    gk = chunk_local_cumsum(g, chunk_size=CHUNK, scale=RCP_LN2, **fla)
    v_st, w_st = v.new_empty(B, T, H, NB, V), w.new_empty(B, T, H, NB, V)    # each block written once
    v_st[:, :, :, :J] = 0
    w_st[:, :, :, :J] = 0
    torch.mul(v[:, :, :, None, :], own[None, :, None, :, None], out=v_st[:, :, :, J:])
    w_st[:, :, :, J:] = w[:, :, :, None, :]
    v_st, w_st = v_st.reshape(B, T, H, NB * V), w_st.reshape(B, T, H, NB * V)
    if triton_mode.MODE == triton_mode.CUDA:
        from fla.ops.gdn2.chunk_intra import chunk_gdn2_fwd_intra

        w_wy, u_st, qg, kg, Aqk, Akk = chunk_gdn2_fwd_intra(q=q, k=k, v=v_st, gk=gk, b=b, w_gate=w_st, scale=scale,
                                                            chunk_size=CHUNK, disable_recompute=True, **fla)
    else:
        w_wy, u_st, qg, kg, Aqk, Akk = fenwick_wy_fwd(q, k, v_st, b, w_st, gk, scale, p)

    h0 = torch.zeros(S, H, K, NB * V, device=q.device, dtype=torch.float32)
    if initial_state is not None and J > 0:
        h0[:, :, :, : J * V] = initial_pre_state(initial_state.float(), offset, J)
    mtab = carry_table(offset, cdiv(T if p is None else p.max_len, CHUNK), q.device)
    precision = dot_precision(q.dtype)
    h, vn, final = states_fwd(kg, w_wy, u_st, gk, mtab, h0, N, J, L, V, n_own, precision=precision, dtype=q.dtype,
                              p=p)

    o = intra_fwd(v, w, lam, Aqk, Akk, precision=precision, p=p)
    reads = None
    if J > 0:
        # every stacked block is read (no copy of the bucket blocks out of h and vn); the own
        # blocks' reads are not used: the chunk's own tokens are the intra read's
        reads = chunk_gla_fwd_o_gk(q=q, v=vn, g=gk, A=Aqk, h=h, scale=scale, chunk_size=CHUNK, **fla)
        o = router_fwd(o, reads, lam, J, v.dtype)                                   # reads [B, T, H, NB·V]
    saved = Saved(q, k, v, b, w, lam, gk, v_st, w_st, own, Aqk, Akk, w_wy, qg, kg, h, vn, reads, mtab,
                  scale=scale, J=J, offset=offset, has_initial_state=initial_state is not None, packing=p)
    return o, final, saved


def last_chunk_start(T: int) -> int:
    return CHUNK * (cdiv(T, CHUNK) - 1)


def fenwick_gdn2_fwd(q, k, v, g, b, w, lam, scale: float, initial_state=None, offset: int = 0,
                     split_final: bool = True, p: Packing | None = None):
    """Returns ``(o [B, T, H, V] in v's dtype, final [S, H, L, K, V] float32, saved, tail)``
    (S: the batch rows, or the sequences of a packed row).

    Every carry merges all seven own levels of a chunk, so the main pass carries the chunk's
    own state as one block (``J + 1`` blocks, not ``J + 7``). Only the final states of levels
    0 … 6 need the split by level: with ``split_final``, a second pass over the last chunk alone
    (no buckets, seven own blocks; ``tail``, its saved tensors) gives them. One chunk: one pass,
    split. Without ``split_final`` final levels 0 … 6 are not meaningful (the op returns no
    final states then).

    A packed row (``p``, its ``Packing``; ``offset = 0``, no initial state): one set of launches for all sequences, ``J`` from the longest (a shorter
    sequence's higher bucket blocks stay zero); the split pass runs on the packed row of every
    sequence's last chunk (``packing.last_chunks``), a sequence of one chunk included. A row
    whose sequences are all one chunk long runs one split pass."""
    T = q.shape[1]
    L = lam.shape[-1]
    if p is not None and (offset != 0 or initial_state is not None):
        raise ValueError(f"a packed row (p) takes offset = 0 and no initial_state, got offset = {offset}, "
                         f"initial_state {'given' if initial_state is not None else 'None'}")
    longest = T if p is None else p.max_len
    J = bucket_blocks(offset, longest, L, initial_state is not None)
    if longest <= CHUNK:
        o, final, saved = stacked_pass(q, k, v, g, b, w, lam, scale, initial_state, offset, J,
                                       own_level_masks(T, q.device, p), p)
        return o.to(v.dtype), final, saved, None
    o, final, saved = stacked_pass(q, k, v, g, b, w, lam, scale, initial_state, offset, J,
                                   torch.ones(T, 1, device=q.device), p)
    tail = None
    if split_final:
        if p is None:
            t0 = last_chunk_start(T)
            piece = [x[:, t0:].contiguous() for x in (q, k, v, g, b, w, lam)]
            tail_p, tail_offset = None, offset + t0
        else:
            tail_p, tail_offset = last_chunks(p), 0
            piece = [x.index_select(1, tail_p.rows) for x in (q, k, v, g, b, w, lam)]
        _, tail_final, tail = stacked_pass(*piece, scale, None, tail_offset, 0,
                                           own_level_masks(piece[0].shape[1], q.device, tail_p), tail_p)
        n = min(OWN_LEVELS, L)
        final[:, :, :n] = tail_final[:, :, :n]
    return o.to(v.dtype), final, saved, tail
