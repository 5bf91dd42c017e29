"""Level-0 state-gradient recurrence with injected per-chunk state gradients (Triton).

fla's chunked GDN-2 forward (``fla.ops.gdn2.chunk_fwd``) keeps, per chunk ``c`` of
``C = 64`` tokens, the pre-state ``h_c`` and builds the WY auxiliaries ``w, u`` (the
chunk's erase/write operators), ``qg = q ⊙ 2^G`` and ``kg = k ⊙ 2^(G_last - G)``
(``G`` the base-2 in-chunk cumsum of the log-decay ``g``), and

    v_c     = u_c - w_c h_c                          # "v_new": the chunk's effective values
    h_{c+1} = diag(2^G_last,c) h_c + kg_c^T v_c       # the state at the end of chunk c
    o_c     = scale · qg_c h_c + A_qk,c v_c

Nested GDN-2 probes ``h_{c+1}`` (the state at the end of chunk ``c``), so its loss
also depends on end-of-chunk states. With ``dS_c = ∂loss/∂h_{c+1}`` through the
probes (the *injected* gradient of chunk ``c``; zero where nothing probes) the
reverse recurrence computed here is

    dH_c     = [c = N-1] dht + dS_c + dH_{c+1}^pre                        # ∂/∂h_{c+1}
    dv_c     = kg_c dH_c + dv_c^intra                                     # ∂/∂v_c
    dH_c^pre = diag(2^G_last,c) dH_c + scale · qg_c^T do_c - w_c^T dv_c   # ∂/∂h_c

which is what the rest of fla's GDN-2 backward consumes (``dh[c] = dH_c``, the
updated ``dv``, ``dh0 = dH_0^pre``): fla's ``chunk_gated_delta_rule_bwd_dhu`` with the
injected ``dS_c`` folded in when the reverse scan reaches the end of chunk ``c``.
Without injection it computes what fla's kernel computes (bitwise, under IEEE
float32 dots, which this kernel always uses: ``input_precision="ieee"``).

The injected gradients may come factored (``FactoredSnapGrads``): a probe that reads its
snapshots as ``ν = Q h_{c+1}`` sends back ``dS_c = Qᵀ dν_c`` (``Q [H, n, K]``, ``dν [B, S, H, n, V]``,
n pairs a firing, n ≪ K), and the kernel forms ``Qᵀ dν_c`` itself, one ``[K, n] @ [n, BV]`` dot
per injected chunk, instead of reading a materialised ``[B, S, H, K, V]`` float32 tensor (K / n
times the bytes: 0.5 GiB for level 1 of the nested benchmark's shape, against 67 MB).

Kernels address their blocks with explicit pointer arithmetic and masks for ragged
edges (Triton 3.9 removed ``tl.make_block_ptr``; the same code runs compiled on CUDA
and under Triton's interpreter on CPU).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from optimized.fits import one_stage_where_refused
from optimized.host_math import cdiv, next_power_of_2

CHUNK = 64


class FactoredSnapGrads(NamedTuple):
    """Gradients of snapshots ``M`` that a probe read as ``ν = Q M``, kept factored:
    ``dM[..., h] = Q[h]ᵀ @ dnu[..., h]`` (``Q [H, n, K]``, ``dnu [B, S, H, n, V]``, both float32).
    ``materialise()`` forms ``dM [B, S, H, K, V]`` (what the consumers read before)."""
    q: torch.Tensor
    dnu: torch.Tensor

    def materialise(self) -> torch.Tensor:
        return torch.matmul(self.q.transpose(-1, -2), self.dnu)


@triton.jit
def _query_block(ds_q, i_h, i_n, N_PAIRS, K: tl.constexpr, o_k, m_k, BN: tl.constexpr):
    """Pair block ``i_n`` of head ``i_h``'s ``Q`` transposed, ``[BK, BN]`` float32 (pairs past
    ``N_PAIRS`` masked to 0): ``(o_n, m_n, Qᵀ block)``."""
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N_PAIRS
    b_qt = tl.load(ds_q + i_h * N_PAIRS * K + o_n[None, :] * K + o_k[:, None],
                   mask=m_n[None, :] & m_k[:, None], other=0.0).to(tl.float32)
    return o_n, m_n, b_qt


@triton.jit
def _dnu_block(ds, i_ds, S, slot, i_h, N_PAIRS, H: tl.constexpr, V: tl.constexpr, o_n, m_n, o_v, m_v):
    """The pairs ``o_n`` of ``dν[b, slot, h]``, ``[BN, BV]`` float32 (all 0 where there is no slot)."""
    p_ds = (ds + ((i_ds * S + tl.maximum(slot, 0).to(tl.int64)) * H + i_h) * N_PAIRS * V
            + o_n[:, None] * V + o_v[None, :])
    return tl.load(p_ds, mask=m_n[:, None] & m_v[None, :] & (slot >= 0), other=0.0).to(tl.float32)


# T (tokens) and S (injected states) are runtime sizes, not specialised: any sequence
# length reuses the compiled kernel.
@triton.jit(do_not_specialize=["T", "S"])
def state_grad_bwd_kernel(
    qg, kg, w, gk, do, dv, dht, ds, ds_q, slots, dh, dh0, dv2, cu_seqlens, chunk_offsets,
    scale, T, S, N_PAIRS,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr,
    HAS_DHT: tl.constexpr, HAS_INJECT: tl.constexpr, FACTORED: tl.constexpr, STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr, ONE_PAIR_BLOCK: tl.constexpr,
):
    """Reverse scan over the chunks of one (batch, head, block of V columns).

    ``dH`` ([K, BV], float32) starts at ``dht`` (or 0); for c = NT-1 .. 0:

        dH     += ds[b, slots[c], h]      if slots[c] >= 0     (injected gradient;
                                                             FACTORED: ds_q[h]ᵀ @ ds[b, slots[c], h],
                                                             ds [B, S, H, N_PAIRS, V], in
                                                             blocks of BN pairs)
        dh[c]   = dH
        dv2[c]  = kg[c] @ dH + dv[c]
        dH      = 2^gk[c, last] ⊙_rows dH + scale · qg[c]^T @ do[c] - w[c]^T @ dv2[c]

    (the chunk's ``BT`` rows visited in sub-blocks of ``BS``) and finally ``dh0 = dH``.
    Rows past ``T`` in a ragged last chunk and columns past ``K``/``V`` are masked: loaded
    as 0, never stored. ``ONE_PAIR_BLOCK`` (all ``N_PAIRS`` in one block of ``BN``): ``Qᵀ`` is
    loaded once, before the chunks; otherwise each block's is loaded where it is used.

    ``IS_VARLEN`` (packed sequences, ``B = 1``): the batch index is a sequence i, its tokens
    ``cu_seqlens[i] .. cu_seqlens[i + 1] - 1`` and its chunks (``dh``, ``slots``) from the packed
    chunk ``chunk_offsets[i]`` on; ``ds`` is the one row's, ``dht`` / ``dh0`` per sequence.
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_b).to(tl.int64)         # the sequence's first token
        T_seq = (tl.load(cu_seqlens + i_b + 1).to(tl.int64) - bos).to(tl.int32)
        boc = tl.load(chunk_offsets + i_b).to(tl.int64)      # and its first packed chunk
        i_ds = 0
    else:
        bos = i_b.to(tl.int64) * T
        T_seq = T
        boc = i_b.to(tl.int64) * tl.cdiv(T, BT)
        i_ds = i_b.to(tl.int64)
    NT = tl.cdiv(T_seq, BT)

    # [B, T, H, D] tensors: this (batch, head) is a [T, D] matrix with row stride H*D.
    qg += (bos * H + i_h) * K
    kg += (bos * H + i_h) * K
    w += (bos * H + i_h) * K
    gk += (bos * H + i_h) * K
    do += (bos * H + i_h) * V
    dv += (bos * H + i_h) * V
    dv2 += (bos * H + i_h) * V

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]          # a [K, V] state block, row-major

    if FACTORED:
        if ONE_PAIR_BLOCK:  # this head's Q transposed, [BK, BN], loaded once
            o_n, m_n, b_qt = _query_block(ds_q, i_h, 0, N_PAIRS, K, o_k, m_k, BN)

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        b_dh += tl.load(dht + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0).to(tl.float32)

    for i_t in range(NT - 1, -1, -1):
        if HAS_INJECT:
            if IS_VARLEN:
                slot = tl.load(slots + boc + i_t)
            else:
                slot = tl.load(slots + i_t)
            if FACTORED:        # Qᵀ dν: [K, n] @ [n, BV], pairs past N_PAIRS (and no slot) masked to 0
                if ONE_PAIR_BLOCK:
                    b_dnu = _dnu_block(ds, i_ds, S, slot, i_h, N_PAIRS, H, V, o_n, m_n, o_v, m_v)
                    b_dh += tl.dot(b_qt, b_dnu, input_precision="ieee")
                else:
                    for i_n in range(0, tl.cdiv(N_PAIRS, BN)):
                        o_n, m_n, b_qt = _query_block(ds_q, i_h, i_n, N_PAIRS, K, o_k, m_k, BN)
                        b_dnu = _dnu_block(ds, i_ds, S, slot, i_h, N_PAIRS, H, V, o_n, m_n, o_v, m_v)
                        b_dh += tl.dot(b_qt, b_dnu, input_precision="ieee")
            else:
                p_ds = ds + ((i_ds * S + tl.maximum(slot, 0).to(tl.int64)) * H + i_h) * K * V + o_kv
                b_dh += tl.load(p_ds, mask=m_kv & (slot >= 0), other=0.0).to(tl.float32)

        p_dh = dh + ((boc + i_t) * H + i_h) * K * V + o_kv
        tl.store(p_dh, b_dh.to(p_dh.dtype.element_ty), mask=m_kv)

        # The chunk's rows in sub-blocks of BS tokens (BS = BT unless K is large: bounds the
        # shared memory the dots stage). dv2 rows need dH as it stands (the gradient at the
        # end of the chunk); the update of dH sums over all rows.
        b_up = tl.zeros([BK, BV], dtype=tl.float32)
        for i_s in range(0, BT // BS):
            o_t = i_t * BT + i_s * BS + tl.arange(0, BS)
            m_t = o_t < T_seq
            m_tk = m_t[:, None] & m_k[None, :]
            m_tv = m_t[:, None] & m_v[None, :]
            # dv2 = kg @ dH + dv
            b_kg = tl.load(kg + o_t[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
            b_dv = tl.dot(b_kg, b_dh.to(b_kg.dtype), input_precision="ieee")
            p_tv = o_t[:, None] * (H * V) + o_v[None, :]
            b_dv += tl.load(dv + p_tv, mask=m_tv, other=0.0).to(tl.float32)
            tl.store(dv2 + p_tv, b_dv.to(dv2.dtype.element_ty), mask=m_tv)
            # scale · qg^T do - w^T dv2
            p_kt = o_k[:, None] + o_t[None, :] * (H * K)     # [K, BS]: the rows transposed
            b_qg = tl.load(qg + p_kt, mask=m_tk.T, other=0.0)
            b_w = tl.load(w + p_kt, mask=m_tk.T, other=0.0)
            b_do = tl.load(do + p_tv, mask=m_tv, other=0.0)
            b_up += (tl.dot(b_qg, b_do.to(b_qg.dtype), input_precision="ieee") * scale
                     - tl.dot(b_w, b_dv.to(b_w.dtype), input_precision="ieee"))

        # dH <- 2^gk_last ⊙ dH + scale · qg^T do - w^T dv2
        last = tl.minimum((i_t + 1) * BT, T_seq) - 1
        b_gl = tl.load(gk + last.to(tl.int64) * (H * K) + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_dh *= tl.exp2(b_gl)[:, None]
        b_dh += b_up

    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_kv, b_dh.to(dh0.dtype.element_ty), mask=m_kv)


def block_sizes(K: int, V: int, block_v: int | None = None) -> tuple[int, int, int]:
    """``BK`` covers all of ``K`` (≥ 16 for ``tl.dot``); ``BV`` splits ``V`` across programs;
    ``BS`` token rows per dot. For K > 128 the smaller BV and BS keep the dots' staged
    operands within an H100/H200 block's shared memory (float32, IEEE)."""
    BK = max(16, next_power_of_2(K))
    if block_v is None:
        block_v = 32 if BK <= 128 else 16
    BV = max(16, min(block_v, next_power_of_2(V)))
    BS = CHUNK if BK <= 128 else CHUNK // 2
    return BK, BV, BS


# The factored injection's pair block: Qᵀ's [K, BN] block stays in registers beside the [K, BV]
# gradient. At K = 256 a block of 128 pairs asked 275456 B of shared memory (an H200 gives a block
# 232448) and spilled 3 KiB a thread; 64 spilled at K = 128 (sm_90, scripts/kernel_resources.py).
FACTORED_BLOCK_N = 32


def pair_blocks(n: int, block_n, name: str) -> int:
    """A pair block ``BN`` for ``n`` pairs: ``block_n`` (the argument ``name``: a power of two ≥ 16,
    else ``ValueError``), no wider than the pairs' own power of two."""
    if not isinstance(block_n, int) or isinstance(block_n, bool) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {block_n!r}")
    return max(16, min(block_n, next_power_of_2(max(n, 1))))


def factored_blocks(n: int, block_n: int | None = None) -> int:
    """The factored injection's pair block ``BN``: ``block_n`` (default ``FACTORED_BLOCK_N``), a
    power of two ≥ 16, no wider than the pairs' own power of two."""
    return pair_blocks(n, FACTORED_BLOCK_N if block_n is None else block_n, "factored_block_n")


def state_grad_bwd(qg, kg, w, gk, do, dv, scale, dht=None, ds=None, slots=None, want_dh0=False,
                   block_v: int | None = None, cu_seqlens=None, chunk_offsets=None,
                   factored_block_n: int | None = None):
    """Launch ``state_grad_bwd_kernel``.

    Args:
        qg, kg, w, gk: ``[B, T, H, K]`` from fla's forward (``gk`` the base-2 in-chunk cumsum).
        do, dv: ``[B, T, H, V]``: output cotangent and fla's intra-chunk ``dv`` (``chunk_kda_bwd_dAv``).
        dht: ``[B, H, K, V]`` float32 gradient of the final state, or None.
        ds: ``[B, S, H, K, V]`` float32 injected end-of-chunk state gradients, or a
            ``FactoredSnapGrads`` ``(Q [H, n, K], dν [B, S, H, n, V])`` standing for ``Qᵀ dν``, or None;
        slots: int32 ``[NT]``: chunk ``c``'s gradient is ``ds[:, slots[c]]``, none where ``slots[c] < 0``.
        want_dh0: also return the initial-state gradient.
        factored_block_n: the factored gradients' pairs in blocks of this many (``factored_blocks``;
            a test's choice: the default, ``FACTORED_BLOCK_N``, holds every ladder's level 1).
        cu_seqlens, chunk_offsets: n sequences packed in one row (``B = 1``): their token
            offsets (int32 or int64 ``[n + 1]``) and packed-chunk offsets (``[n + 1]``, each
            sequence's chunks counted from its first token); then ``dht``, ``dh0`` are
            ``[n, H, K, V]``, ``dh`` and ``slots`` run over the packed chunks. Both on the
            device and not read back (``optimized.nested.plan`` makes them).

    Returns ``(dh [B, NT, H, K, V] in qg's dtype, dh0 [B, H, K, V] float32 or None, dv2 like dv)``.
    """
    B, T, H, K = kg.shape
    V = do.shape[-1]
    packed = cu_seqlens is not None
    if packed != (chunk_offsets is not None):
        raise ValueError("cu_seqlens and chunk_offsets go together (packed sequences), got one of them")
    if packed:
        if B != 1:
            raise ValueError(f"cu_seqlens: packed sequences need B = 1, got B = {B}")
        if cu_seqlens.dim() != 1 or chunk_offsets.shape != cu_seqlens.shape:
            raise ValueError(f"cu_seqlens and chunk_offsets must both be [n + 1], got "
                             f"{tuple(cu_seqlens.shape)} and {tuple(chunk_offsets.shape)}")
        programs = cu_seqlens.numel() - 1
        NT = slots.numel() if slots is not None else None
        if NT is None:
            raise ValueError("packed sequences: slots is needed (it carries the packed chunk count)")
    else:
        programs = B
        NT = cdiv(T, CHUNK)
    BK, BV, BS = block_sizes(K, V, block_v)
    dh = qg.new_empty(B, NT, H, K, V)
    dh0 = kg.new_empty(programs, H, K, V, dtype=torch.float32) if want_dh0 else None
    dv2 = torch.empty_like(dv)
    has_inject = ds is not None
    factored = isinstance(ds, FactoredSnapGrads)
    ds_q, n = None, 1
    if has_inject:
        if slots is None or slots.numel() != NT:
            raise ValueError(f"slots must hold one entry per chunk ({NT}), got "
                             f"{None if slots is None else tuple(slots.shape)}")
        if factored:
            ds_q, ds = ds
            n = ds_q.shape[1] if ds_q.dim() == 3 else -1
            if ds_q.dtype != torch.float32 or tuple(ds_q.shape) != (H, n, K) or n < 1:
                raise ValueError(f"ds.q must be float32 [H, n, K] = [{H}, n, {K}], got {ds_q.dtype} "
                                 f"{tuple(ds_q.shape)}")
            want = (B, ds.shape[1] if ds.dim() == 5 else -1, H, n, V)
        else:
            want = (B, ds.shape[1] if ds.dim() == 5 else -1, H, K, V)
        if ds.dtype != torch.float32 or tuple(ds.shape) != want:
            what = "ds.dnu" if factored else "ds"
            raise ValueError(f"{what} must be float32 [B, S, H, {'n' if factored else 'K'}, V] = "
                             f"[{B}, S, {H}, {want[3]}, {V}], got {ds.dtype} {tuple(ds.shape)}")
        ds = ds.contiguous()
        ds_q = None if ds_q is None else ds_q.contiguous()
        S = ds.shape[1]
    else:
        S = 0
    BN = factored_blocks(n, factored_block_n)
    grid = (cdiv(V, BV), programs * H)
    flags = dict(HAS_DHT=dht is not None, HAS_INJECT=has_inject, FACTORED=factored, STORE_DH0=want_dh0,
                 IS_VARLEN=packed, ONE_PAIR_BLOCK=BN >= n)
    warps = 4 if BK <= 64 else 8

    def run(**stages):
        state_grad_bwd_kernel[grid](
            qg, kg, w, gk, do, dv, dht, ds, ds_q, slots, dh, dh0, dv2, cu_seqlens, chunk_offsets,
            scale, T, S, n, H=H, K=K, V=V, BT=CHUNK, BS=BS, BK=BK, BV=BV, BN=BN, **flags,
            num_warps=warps, **stages)

    # Triton's pipelining stages the dots' operands in shared memory: at K = 256 more than a GPU
    # with 99 KiB a block has (108 / 124 KiB plain / factored, sm_80 and sm_86; 42 / 58 KiB at one
    # stage; scripts/kernel_resources.py): one stage there, the same values
    one_stage_where_refused((state_grad_bwd_kernel, H, K, V, BK, BV, BS, BN, tuple(flags.values()), qg.dtype,
                             qg.device), run)
    return dh, dh0, dv2
