"""A probe's snapshot gradients added into the level below's state gradients, kept factored.

A fused probe that reads its snapshots as ``ν = Q M`` (learned, bounded_erase) has snapshot
gradients ``dM = Qᵀ dν'`` (``Q [H, n, K]``, ``dν' [B, F, H, n, V]``: ``FactoredSnapGrads``).
Level ℓ ≥ 2's firing m probed the level below's stored row ``targets[m]``, so the nested
backward needs

    dstates[b, targets[m], h] += Q[h]ᵀ @ dν'[b, m, h]          for every firing m

Materialised, ``Qᵀ dν'`` is a ``[B, F, H, K, V]`` float32 tensor (K / n times ``dν'``'s bytes),
written by a batched matmul and read back by a strided add. ``add_snapshot_grads`` makes each
``[K, BV]`` product inside the program that adds it: one program per (V block, firing, batch
entry and head) loads ``Q[h]`` and ``dν'``'s ``[n, BV]`` block, adds ``Qᵀ dν'`` to the target
block and stores it. Several firings may probe the same row (a level below that did not fire in
between): the firings come in rounds of distinct targets (``plan.add_rounds``), one launch per
round, in increasing firing order, so the sums are deterministic and race-free.

The op's default adds them in the kernel that makes the level below's state gradients instead
(``reads_bwd.reads_bwd_states(snap_grads=...)``: no second pass over those rows); this kernel is
``Pieces(snapshot_grads="factored-add")`` and the PyTorch reads' path. Level 1's snapshots are
level 0's chunk-end states: their factored gradients go to level 0's state-gradient kernel
(``optimized.nested.state_grad``, its ``FactoredSnapGrads`` form).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from optimized.nested.state_grad import FactoredSnapGrads
from optimized.host_math import cdiv, next_power_of_2

DOT_PRECISIONS = ("ieee", "tf32")


# rows and firings are runtime sizes: any plan reuses the compiled kernel
@triton.jit(do_not_specialize=["F", "R"])
def add_snapshot_grads_kernel(dst, q, dnu, firings, targets, stride_db, F, R, N_PAIRS,
                              H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                              BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    """``dst[b, targets[m], h, :, vblock] += q[h]ᵀ @ dnu[b, m, h, :, vblock]`` for the round's
    firings ``m = firings[i]``, ``i < R`` (distinct targets within a round).

    ``dst [B, S, H, K, V]`` float32 (each batch entry's rows contiguous, batch stride
    ``stride_db``: a slice of a bigger buffer works), ``q [H, N_PAIRS, K]``, ``dnu [B, F, H, N_PAIRS, V]``
    float32. Pairs past ``N_PAIRS``, keys past ``K`` and columns past ``V`` are masked (loaded
    as 0, never stored)."""
    i_v, i_r, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    m = tl.load(firings + i_r).to(tl.int64)
    t = tl.load(targets + m).to(tl.int64)
    o_n = tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_n, m_k, m_v = o_n < N_PAIRS, o_k < K, o_v < V
    # Qᵀ: [BK, BN]
    b_qt = tl.load(q + i_h * N_PAIRS * K + o_n[None, :] * K + o_k[:, None], mask=m_n[None, :] & m_k[:, None],
                   other=0.0)
    p_dnu = dnu + ((i_b.to(tl.int64) * F + m) * H + i_h) * N_PAIRS * V + o_n[:, None] * V + o_v[None, :]
    b_dnu = tl.load(p_dnu, mask=m_n[:, None] & m_v[None, :], other=0.0)
    b_add = tl.dot(b_qt, b_dnu, input_precision=PRECISION)
    p_dst = dst + i_b.to(tl.int64) * stride_db + (t * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]
    tl.store(p_dst, tl.load(p_dst, mask=m_kv, other=0.0) + b_add, mask=m_kv)


def block_sizes(n: int, K: int, V: int) -> tuple[int, int, int]:
    """``(BN, BK, BV)``: all pairs and keys in one block (``n``, ``K`` ≤ 128 in every built-in
    use; ≥ 16 for ``tl.dot``), V in blocks of up to 64 (a ``[BK, BV]`` float32 accumulator
    beside the target block)."""
    BN = max(16, next_power_of_2(n))
    BK = max(16, next_power_of_2(K))
    BV = max(16, min(64, next_power_of_2(V)))
    return BN, BK, BV


def add_snapshot_grads(dst: torch.Tensor, grads: FactoredSnapGrads, targets: torch.Tensor, rounds,
                       precision: str = "ieee") -> None:
    """``dst[:, targets[m]] += Qᵀ dν'[:, m]`` in place, for every firing m.

    Args:
        dst: ``[B, S, H, K, V]`` float32, each batch entry's ``[S, H, K, V]`` contiguous: the
            level below's state gradients (a slice of a bigger buffer along dim 1 works).
        grads: ``FactoredSnapGrads(q [H, n, K], dnu [B, F, H, n, V])``, float32.
        targets: int32 ``[F]``: the row of ``dst`` each firing probed (``DeviceTables.snap_rows``).
        rounds: the firings in rounds of distinct targets: a sequence of int32 ``[R]`` tensors
            (``DeviceTables.inject_rounds``), launched in order.
        precision: the product's dot precision, ``"ieee"`` or ``"tf32"`` (TF32 tensor cores in
            bf16 runs, as the probe's own matmuls; the interpreter computes float32 either way).
    """
    q, dnu = grads
    if precision not in DOT_PRECISIONS:
        raise ValueError(f"precision must be one of {DOT_PRECISIONS}, got {precision!r}")
    if dst.dim() != 5 or dst.dtype != torch.float32 or not dst[:1].is_contiguous():
        raise ValueError(f"dst must be a float32 [B, S, H, K, V] tensor, each batch entry contiguous, got "
                         f"{dst.dtype} {tuple(dst.shape)} strides {dst.stride() if dst.dim() == 5 else None}")
    B, S, H, K, V = dst.shape
    n = q.shape[1] if q.dim() == 3 else -1
    if q.dtype != torch.float32 or tuple(q.shape) != (H, n, K) or n < 1:
        raise ValueError(f"grads.q must be float32 [H, n, K] = [{H}, n, {K}], got {q.dtype} {tuple(q.shape)}")
    F = dnu.shape[1] if dnu.dim() == 5 else -1
    if dnu.dtype != torch.float32 or tuple(dnu.shape) != (B, F, H, n, V):
        raise ValueError(f"grads.dnu must be float32 [B, F, H, n, V] = [{B}, F, {H}, {n}, {V}], got "
                         f"{dnu.dtype} {tuple(dnu.shape)}")
    if targets.dtype != torch.int32 or tuple(targets.shape) != (F,):
        raise ValueError(f"targets must be int32 [F] = [{F}], got {targets.dtype} {tuple(targets.shape)}")
    for r in rounds:
        if r.dtype != torch.int32 or r.dim() != 1:
            raise ValueError(f"each round must be an int32 vector of firings, got {r.dtype} {tuple(r.shape)}")
    if F == 0 or B * H == 0:
        return
    q, dnu = q.contiguous(), dnu.contiguous()
    BN, BK, BV = block_sizes(n, K, V)
    for r in rounds:
        if r.numel() == 0:
            continue
        try:
            add_snapshot_grads_kernel[(cdiv(V, BV), r.numel(), B * H)](
                dst, q, dnu, r, targets, dst.stride(0), F, r.numel(), n,
                H=H, K=K, V=V, BN=BN, BK=BK, BV=BV, PRECISION=precision, num_warps=8)
        except OutOfResources as e:
            raise ValueError(refusal(n, K, V, precision, e)) from e


def refusal(n: int, K: int, V: int, precision: str, error: OutOfResources) -> str:
    """The error of a launch the GPU refuses for shared memory: the product's ``[K, n]`` block of
    ``Qᵀ`` is one tile (the kernel does not split pairs or keys), and at K = 256 with 64 pairs
    and TF32 it asks 112 KiB (stages do not change it; V blocks of 32 still 104 KiB), more than a
    GPU with 99 KiB a block (sm_89) gives (docs/kernel-shared-memory.md)."""
    return (f"add_snapshot_grads: K = {K}, V = {V}, n = {n} pairs at {precision} dots needs {error.required} B "
            f"of shared memory a block, this GPU gives {error.limit} B; use the nested op's default "
            f"snapshot_grads='factored' (folded into the reads' state gradients) or 'materialised' "
            f"(NestedPieces), or fewer pairs a firing")
