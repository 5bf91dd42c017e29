"""The error float32 cancellation leaves in fla's level-0 ``dg``: a floor that bounds on the
extreme regime add to (``gdn2_extreme`` and ``nested_extreme``, ``dg_cancellation_factor``)."""
from __future__ import annotations

import torch


def dg_cancellation_floor(q, dq, k, dk, dg) -> float:
    """``u · C``: the relative error float32 cancellation leaves in fla's level-0 ``dg`` (the reverse
    cumsum within each chunk of q⊙dq − k⊙dk + …), u = 2^-24 and C the size of those terms over
    dg's, from this draw's float64 gradients (``[B, T, H, K]`` each)."""
    terms = (q * dq).abs() + (k * dk).abs()
    return 2.0 ** -24 * chunk_reverse_cumsum(terms.detach()).norm().item() / max(dg.norm().item(), 1e-300)


def chunk_reverse_cumsum(x: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """``x [B, T, ...]`` summed from each token to the end of its ``chunk``-token chunk."""
    B, T = x.shape[:2]
    pad = -T % chunk
    y = torch.cat([x, x.new_zeros(B, pad, *x.shape[2:])], 1).reshape(B, -1, chunk, *x.shape[2:])
    return y.flip(2).cumsum(2).flip(2).reshape(B, T + pad, *x.shape[2:])[:, :T]
