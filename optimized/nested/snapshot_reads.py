"""The probe's read of the snapshots, ``ν = Q M``, and its query gradient, straight from the rows
that hold the snapshots (Triton): no gathered float32 copy of them.

Level ℓ's firing ``m`` probes level ℓ-1's state ``M_m`` (CONTRACT section 2): for ℓ = 1 level 0's
state at the end of a chunk (a row of fla's bf16 or float32 chunk states ``h``, or the float32
final state), for ℓ ≥ 2 a stored float32 state of level ℓ-1. The probe's query read and its
parameter gradient are the only parts of the built-in probes that touch the snapshots:

    ν[b, m, h]  = Q[h] M_{b, m, h}                    [n, V]  (forward)
    dQ[h]       = Σ_{b, m} dν[b, m, h] M_{b, m, h}^T   [n, K]  (backward)

(the snapshots' own gradient ``Qᵀ dν`` does not read them). Both kernels take the snapshots as
``SnapshotRows``: a source tensor ``src [B, R, H, K, V]`` (any float dtype, rows contiguous, any
batch stride: fla's ``h``, or one level's view of the stored states), a row per firing (``rows``
int32 ``[F]``), and a float32 ``final [*, H, K, V]`` for the firings whose row is negative:
firing ``m`` of batch entry ``b`` reads ``src[b, rows[m]]`` when ``rows[m] ≥ 0``, else
``final[b - 1 - rows[m]]`` (one sequence per row: ``rows[m] = -1``, batch ``b``'s final state;
packed sequences, ``B = 1``: ``-1 - i``, sequence ``i``'s). The gather copy they replace wrote
``B·F·H·K·V`` float32 per level in each pass (0.5 GiB for level 1 of the L = 4 benchmark).

Precision: every operand is read in its dtype and promoted to float32 in registers; the dots'
input precision is an argument (``"ieee"``, or ``"tf32"`` for bf16 runs, as the probe's
cuBLAS matmuls); float32 accumulation. ``dQ`` is summed per group of (b, m) items into partial
buffers and the groups summed afterwards: no atomics, two runs give bitwise-identical results.

Kernels use explicit pointers and masks for ragged edges (n, K, V not multiples of the blocks);
the same code runs compiled on CUDA and under Triton's interpreter on CPU.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from optimized.fits import one_stage_where_refused
from optimized.host_math import cdiv, next_power_of_2

PRECISIONS = ("ieee", "tf32")


class SnapshotRows(NamedTuple):
    """Level ℓ's snapshots as rows of another tensor (module docstring): firing ``m`` of batch
    entry ``b`` reads ``src[b, rows[m]]``, or ``final[b - 1 - rows[m]]`` when ``rows[m] < 0``."""
    src: torch.Tensor                   # [B, R, H, K, V], rows contiguous (any batch stride)
    rows: torch.Tensor                  # int32 [F]
    final: torch.Tensor | None = None   # [*, H, K, V] float32, for negative rows

    @property
    def shape(self) -> tuple:
        """The gathered snapshots' shape ``(B, F, H, K, V)``."""
        B, _, H, K, V = self.src.shape
        return (B, self.rows.numel(), H, K, V)


@triton.jit
def _q_state(acc, q, p_s, o_n, m_n, o_v, m_v, N, K: tl.constexpr, V: tl.constexpr,
             BK: tl.constexpr, PREC: tl.constexpr):
    """``acc + Q[o_n, :] @ S[:, o_v]`` for one state ``S`` at ``p_s`` ([K, V], any dtype), K in blocks of BK."""
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + o_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
        b_s = tl.load(p_s + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        acc = tl.dot(b_q, b_s.to(tl.float32), acc, input_precision=PREC)
    return acc


@triton.jit
def _dnu_state_t(acc, p_dnu, p_s, o_n, m_n, o_k, m_k, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """``acc + dν[o_n, :] @ S[o_k, :]^T`` for one firing (``dν [n, V]`` at ``p_dnu``), V in blocks of BV."""
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_v = o_v < V
        b_dnu = tl.load(p_dnu + o_n[:, None] * V + o_v[None, :], mask=m_n[:, None] & m_v[None, :], other=0.0)
        b_s = tl.load(p_s + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        acc = tl.dot(b_dnu, tl.trans(b_s.to(tl.float32)), acc, input_precision=PREC)
    return acc


# F, N (firings, pairs) are runtime sizes: another schedule or query count reuses the kernel
@triton.jit(do_not_specialize=["F", "N"])
def snapshot_read_fwd_kernel(q, src, final, rows, nu, F, N, stride_sb,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """One program per (b, m, h) and block of pairs and V columns:

        S = src[b, rows[m], h]  if rows[m] ≥ 0  else  final[b - 1 - rows[m], h]
        ν[b, m, h][pairs, cols] = Q[h][pairs, :] @ S[:, cols]
    """
    i_bfh, i_n, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bf, i_h = i_bfh // H, i_bfh % H
    i_b, i_f = i_bf // F, i_bf % F
    o_n = i_n * BN + tl.arange(0, BN)
    o_v = i_v * BV + tl.arange(0, BV)
    m_n, m_v = o_n < N, o_v < V
    p_q = q + i_h * N * K
    row = tl.load(rows + i_f).to(tl.int64)
    acc = tl.zeros([BN, BV], dtype=tl.float32)
    if row >= 0:
        acc = _q_state(acc, p_q, src + i_b.to(tl.int64) * stride_sb + (row * H + i_h) * K * V,
                       o_n, m_n, o_v, m_v, N, K, V, BK, PREC)
    else:
        acc = _q_state(acc, p_q, final + ((i_b.to(tl.int64) - 1 - row) * H + i_h) * K * V,
                       o_n, m_n, o_v, m_v, N, K, V, BK, PREC)
    p_nu = nu + (i_bf.to(tl.int64) * H + i_h) * N * V
    tl.store(p_nu + o_n[:, None] * V + o_v[None, :], acc, mask=m_n[:, None] & m_v[None, :])


@triton.jit(do_not_specialize=["F", "N", "BF", "ITEMS"])
def snapshot_read_dq_kernel(dnu, src, final, rows, dq_part, F, N, BF, ITEMS, stride_sb,
                            H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """One program per group ``p`` of ``ITEMS`` consecutive (b, m) items, block of pairs and of K, head h:

        dq_part[p, h][pairs, keys] = Σ_{(b, m) in group p} dν[b, m, h][pairs, :] @ S_{b, m, h}[keys, :]^T
    """
    i_p, i_nk, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NK: tl.constexpr = triton.cdiv(K, BK)
    i_n, i_k = i_nk // NK, i_nk % NK
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = i_k * BK + tl.arange(0, BK)
    m_n, m_k = o_n < N, o_k < K
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for j in range(0, ITEMS):
        i_bf = i_p.to(tl.int64) * ITEMS + j
        if i_bf < BF:
            i_b, i_f = i_bf // F, i_bf % F
            row = tl.load(rows + i_f).to(tl.int64)
            p_dnu = dnu + (i_bf * H + i_h) * N * V
            if row >= 0:
                acc = _dnu_state_t(acc, p_dnu, src + i_b * stride_sb + (row * H + i_h) * K * V,
                                   o_n, m_n, o_k, m_k, V, BV, PREC)
            else:
                acc = _dnu_state_t(acc, p_dnu, final + ((i_b - 1 - row) * H + i_h) * K * V,
                                   o_n, m_n, o_k, m_k, V, BV, PREC)
    p_out = dq_part + (i_p.to(tl.int64) * H + i_h) * N * K
    tl.store(p_out + o_n[:, None] * K + o_k[None, :], acc, mask=m_n[:, None] & m_k[None, :])


def block_sizes(n: int, K: int, V: int) -> tuple[int, int, int]:
    """``(BN, BK, BV)``: pairs, keys and V columns per block, 16 to 64 (``tl.dot``'s minimum 16)."""
    def block(x):
        return max(16, min(64, next_power_of_2(x)))
    return block(n), block(K), block(V)


def _check_snaps(snaps: SnapshotRows, precision: str) -> tuple:
    """``(B, F, H, K, V, final)``: the snapshots' shape and the tensor the kernels read for
    negative rows (the source itself when there is no ``final``: then no row is negative)."""
    if not isinstance(snaps, SnapshotRows):
        raise TypeError(f"snaps must be a SnapshotRows, got {type(snaps).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    src, rows, final = snaps
    if not isinstance(src, torch.Tensor) or src.dim() != 5 or not src.is_floating_point():
        raise ValueError(f"snaps.src must be a floating-point [B, R, H, K, V] tensor, got "
                         f"{getattr(src, 'dtype', type(src).__name__)} {tuple(getattr(src, 'shape', ()))}")
    B, R, H, K, V = src.shape
    if R and src.stride()[1:] != (H * K * V, K * V, V, 1):
        raise ValueError(f"snaps.src's rows must be contiguous (a slice along dim 1 of a contiguous tensor "
                         f"at most), got strides {src.stride()}")
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32 or rows.dim() != 1 \
            or rows.device != src.device:
        raise ValueError(f"snaps.rows must be int32 [F] on {src.device}, got "
                         f"{getattr(rows, 'dtype', type(rows).__name__)} {tuple(getattr(rows, 'shape', ()))}")
    if final is not None and (not isinstance(final, torch.Tensor) or final.dim() != 4
                              or tuple(final.shape[1:]) != (H, K, V) or final.dtype != torch.float32
                              or final.device != src.device):
        raise ValueError(f"snaps.final must be float32 [*, {H}, {K}, {V}] on {src.device}, got "
                         f"{getattr(final, 'dtype', type(final).__name__)} {tuple(getattr(final, 'shape', ()))}")
    return B, rows.numel(), H, K, V, (src if final is None else final.contiguous())


def _check_float32(name: str, x, shape: tuple, device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or tuple(x.shape) != shape \
            or x.device != device:
        raise ValueError(f"{name} must be float32 {list(shape)} on {device}, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))} "
                         f"on {getattr(x, 'device', None)}")
    return x.contiguous()


def snapshot_read(Q: torch.Tensor, snaps: SnapshotRows, precision: str = "ieee") -> torch.Tensor:
    """``ν [B, F, H, n, V]`` float32, ``ν[b, m, h] = Q[h] @ snapshot(b, m, h)`` (module docstring).

    ``Q [H, n, K]`` float32; ``snaps`` a ``SnapshotRows`` (the rows are not bounds-checked: they
    come from the schedule's tables, ``plan.DeviceTables.snap_rows``)."""
    B, F, H, K, V, final = _check_snaps(snaps, precision)
    n = Q.shape[1] if isinstance(Q, torch.Tensor) and Q.dim() == 3 else -1
    Q = _check_float32("Q", Q, (H, n, K), snaps.src.device)
    nu = torch.empty(B, F, H, n, V, dtype=torch.float32, device=Q.device)
    if nu.numel() == 0:
        return nu
    BN, BK, BV = block_sizes(n, K, V)
    grid = (B * F * H, cdiv(n, BN), cdiv(V, BV))

    def run(**stages):
        snapshot_read_fwd_kernel[grid](Q, snaps.src, final, snaps.rows, nu, F, n, snaps.src.stride(0),
                                       H=H, K=K, V=V, BN=BN, BK=BK, BV=BV, PREC=precision, num_warps=4, **stages)

    # at 64 pairs and K, V ≥ 64 both snapshot kernels stage 128 KiB of shared memory (sm_80, sm_86;
    # 192 KiB sm_90), more than a GPU with 99 KiB a block gives; 20–32 KiB at one stage
    # (scripts/kernel_resources.py)
    one_stage_where_refused((snapshot_read_fwd_kernel, H, K, V, BN, BK, BV, precision, snaps.src.dtype, Q.device), run)
    return nu


def dq_groups(items: int, programs_per_group: int, target: int = 1024) -> tuple[int, int]:
    """``(groups, items per group)`` of the query gradient's (b, m) items: about ``target``
    programs in all (every SM busy), each group a sequential sum."""
    groups = max(1, min(items, cdiv(target, programs_per_group)))
    per = cdiv(items, groups)
    return cdiv(items, per), per


def snapshot_read_dq(dnu: torch.Tensor, snaps: SnapshotRows, precision: str = "ieee") -> torch.Tensor:
    """``dQ [H, n, K]`` float32, ``Σ_{b, m} dν[b, m, h] @ snapshot(b, m, h)^T`` from ``dν
    [B, F, H, n, V]`` float32 (module docstring)."""
    B, F, H, K, V, final = _check_snaps(snaps, precision)
    n = dnu.shape[3] if isinstance(dnu, torch.Tensor) and dnu.dim() == 5 else -1
    dnu = _check_float32("dnu", dnu, (B, F, H, n, V), snaps.src.device)
    if B * F == 0 or n == 0:
        return torch.zeros(H, n, K, dtype=torch.float32, device=dnu.device)
    BN, BK, BV = block_sizes(n, K, V)
    tiles = cdiv(n, BN) * cdiv(K, BK)
    groups, per = dq_groups(B * F, tiles * H)
    part = torch.empty(groups, H, n, K, dtype=torch.float32, device=dnu.device)

    def run(**stages):
        snapshot_read_dq_kernel[(groups, tiles, H)](
            dnu, snaps.src, final, snaps.rows, part, F, n, B * F, per, snaps.src.stride(0),
            H=H, K=K, V=V, BN=BN, BK=BK, BV=BV, PREC=precision, num_warps=4, **stages)

    one_stage_where_refused((snapshot_read_dq_kernel, H, K, V, BN, BK, BV, precision, snaps.src.dtype, dnu.device),
                            run)           # as in snapshot_read
    return part.sum(0)
