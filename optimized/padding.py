"""Zero-padding of head dims below the smallest tile a kernel's dots accept.

Triton's ``tl.dot`` needs every operand dimension to be at least 16; fla's kernels take the head
dims as block sizes, so a head dim below 16 (e.g. a 3D tensor state's flattened key K·E = 12, or
V = 5) can compile in one dtype and fail in another (bfloat16's backward on an H200). Padding the
head dims with zeros to 16 changes no result: a zero key or query channel adds nothing to any dot
product, a zero value column writes nothing, a zero log-decay and erase gate leave the padded
state rows at their initial zeros. The outputs and final states are sliced back; autograd slices
the padding's gradients away (``F.pad``'s backward).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_DOT = 16


def padded(n: int) -> int:
    """``n`` raised to ``MIN_DOT`` if below it (a head dim the kernels' dots accept)."""
    return max(n, MIN_DOT)


def pad_dim(x: torch.Tensor | None, size: int, dim: int = -1) -> torch.Tensor | None:
    """``x`` zero-padded along ``dim`` to ``size`` (unchanged when already that size)."""
    if x is None or x.shape[dim] == size:
        return x
    dim = dim % x.dim()
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, size - x.shape[dim]]
    return F.pad(x, pad)
