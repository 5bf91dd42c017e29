"""``db`` plus fla's per-key-block partials, written in the gradients' dtype.

fla's intra-chunk backward of GDN-2 writes its share of ``db`` as ``NK`` partials
``parts [NK, B, T, H, BK]``, key block ``i`` (columns ``i·BK …``) at ``parts[i]``, the last block
ragged where ``BK`` does not divide ``K``. fla's launcher makes them contiguous in
``[B, T, H, K]`` order (a copy), adds them in place, and its caller casts; torch's add over the
permuted view runs its strided (non-vectorised) kernel at about half the copy bandwidth. One
kernel here reads both and writes the sum once, in the output's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.checks import check_kernel_device, check_kernel_dtype
from optimized.host_math import cdiv

ROWS = 64       # (b, t, h) rows per program


@triton.jit
def add_key_block_partials_kernel(db, parts, out, R, K, BK: tl.constexpr, BR: tl.constexpr):
    """``out[r, i·BK + j] = db[r, i·BK + j] + parts[i, r, j]`` for rows ``r < R`` (``r`` the
    flattened ``(b, t, h)``) and columns ``i·BK + j < K``; program ``(row block, key block i)``,
    the float32 sum rounded once to ``out``'s dtype on store."""
    i_r, i_k = tl.program_id(0), tl.program_id(1)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_j = tl.arange(0, BK)
    o_c = i_k * BK + o_j
    m = (o_r[:, None] < R) & (o_c[None, :] < K)
    p_db = db + o_r[:, None] * K + o_c[None, :]
    p_part = parts + (i_k * R + o_r[:, None]) * BK + o_j[None, :]
    b_sum = tl.load(p_db, mask=m, other=0.0) + tl.load(p_part, mask=m, other=0.0)
    tl.store(out + o_r[:, None] * K + o_c[None, :], b_sum.to(out.dtype.element_ty), mask=m)


def add_key_block_partials(db: torch.Tensor, parts: torch.Tensor, dtype) -> torch.Tensor:
    """``db [B, T, H, K]`` (float32, contiguous) plus ``parts [NK, B, T, H, BK]`` (float32,
    contiguous; ``NK = ⌈K / BK⌉``) as above, returned in ``dtype``."""
    B, T, H, K = db.shape
    NK, BK = parts.shape[0], parts.shape[-1]
    if parts.shape != (NK, B, T, H, BK) or NK != cdiv(K, BK):
        raise ValueError(f"parts must be [⌈K/BK⌉, B, T, H, BK] for db {tuple(db.shape)}, got {tuple(parts.shape)}")
    if db.dtype != torch.float32 or parts.dtype != torch.float32:
        raise ValueError(f"db and parts must be float32, got {db.dtype} and {parts.dtype}")
    if not (db.is_contiguous() and parts.is_contiguous()):
        raise ValueError("db and parts must be contiguous")
    check_kernel_device("db", db)
    out = torch.empty_like(db, dtype=dtype)
    check_kernel_dtype("the output dtype", out)     # the interpreter does not round to bf16 correctly
    R = B * T * H
    if out.numel():
        add_key_block_partials_kernel[(cdiv(R, ROWS), NK)](db, parts, out, R, K, BK=BK, BR=ROWS)
    return out
