"""Fenwick level router (scalar decay) on fla-core 0.6.0's ``chunk_log_linear_attn``.

Same contract as ``reference.fenwick.naive_fenwick`` (docs/CONTRACT.md section 5), output
only. Validates its inputs, then adapts them to fla's kernel:

- ``scale``: fla's defaults to 1.0; ours (``K ** -0.5`` unless given) is always passed.
- Head dims: fla's chunk kernel needs ``K % 64 == 0`` and ``V`` a power of two
  (at least 16 here, for its block dots). ``q, k`` are zero-padded to the next
  multiple of 64 and ``v`` to the next power of two; padding changes no dot
  product, the output is sliced back to ``V``, and the padding's gradients are
  sliced away by autograd (``F.pad``'s backward).
- Levels: fla reads ``level_scales[..., ℓ]`` for every level ``ℓ`` that occurs and
  masks reads at ``ℓ ≥ L`` to zero. We require ``L ≥ 1 + ceil(log2 T)`` (every
  level that occurs is given, as CONTRACT says); levels beyond that never occur and
  fla never reads them (their gradient is zero, as in the reference).
- fla's kernel takes no plain initial state (its ``LogLinearAttentionState`` is a
  chunk-level cache, and its backward refuses it); neither does the reference.
- fla raises for sequences of ``2**17`` tokens or more: checked here first.
- ``cu_seqlens`` (N sequences packed in one row, ``B = 1``): passed to fla's kernel, which runs
  every sequence with its own chunk grid and Fenwick counter in one launch set; ``L`` and the
  ``2**17`` limit then apply to the longest sequence.

The GDN-2 variant (``reference.fenwick.naive_fenwick_gdn2``) has no fla kernel: its optimized
path is ``optimized.fenwick_gdn2.chunk_fenwick_gdn2`` (our kernels on fla's GDN-2 chunk pieces).
"""
from __future__ import annotations

import warnings

import torch.nn.functional as F

from optimized.autograd import empty_result, first_order_only
from optimized.checks import (KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype,
                              contiguous_cu_seqlens)
from reference.fenwick import check_fenwick_inputs, longest_sequence

BLOCK_K = 64           # fla's log-linear chunk kernel works on K in blocks of 64
MIN_V = 16             # smallest value width we hand to the kernel's block dots
MAX_T = 2 ** 17 - 1    # fla: "Sequence length must be less than 2**17"


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """The ``(K, V)`` fla's chunk kernel runs on: ``K`` up to a multiple of 64, ``V`` up to a power of two."""
    K_pad = -(-K // BLOCK_K) * BLOCK_K
    V_pad = max(MIN_V, 1 << (V - 1).bit_length())
    return K_pad, V_pad


def chunk_fenwick(q, k, v, g, level_scales, scale=None, cu_seqlens=None):
    """Chunked Fenwick log-linear attention (fla). Shapes as in ``reference.fenwick.naive_fenwick``.

    Inputs are float32 or bfloat16 (one dtype; bfloat16 in cuda mode only), finite, on the
    mode's device (``optimized.checks``). Returns ``(o [B, T, H, V] in v's dtype, None)``, like
    every op's ``(o, final_state or None)``: fla's kernel keeps no final state (see above).
    Differentiable in ``q, k, v, g, level_scales``.
    """
    B, T, H, K, V, L = check_fenwick_inputs(q, k, v, g, level_scales, scale, dtypes=KERNEL_DTYPES,
                                            cu_seqlens=cu_seqlens)
    cu_seqlens = contiguous_cu_seqlens(cu_seqlens)
    longest = T if cu_seqlens is None else longest_sequence(cu_seqlens)
    if longest > MAX_T:
        raise ValueError(f"q: fla's log-linear kernel needs T < 2**17, got T = {longest}"
                         + ("" if cu_seqlens is None else " (the longest sequence in cu_seqlens)"))
    check_kernel_device("q", q)
    check_kernel_dtype("q", q)
    check_finite_activations((("q", q), ("k", k), ("v", v), ("g", g), ("level_scales", level_scales)))
    scale = K ** -0.5 if scale is None else float(scale)
    if B == 0 or H == 0:           # fla's grid has no empty form
        return empty_result((B, T, H, V), v.dtype, v.device, (q, k, v, g, level_scales)), None
    q, k, v, g, level_scales = first_order_only("chunk_fenwick", q, k, v, g, level_scales)
    K_pad, V_pad = padded_dims(K, V)
    if K_pad != K:
        q = F.pad(q, (0, K_pad - K))
        k = F.pad(k, (0, K_pad - K))
    if V_pad != V:
        v = F.pad(v, (0, V_pad - V))
    from fla.ops.log_linear_attn import chunk_log_linear_attn

    with warnings.catch_warnings():
        # fla warns on every call that Triton > 3.2 is slower for this kernel.
        warnings.filterwarnings("ignore", message="Triton>3.2.0 detected")
        o, _ = chunk_log_linear_attn(q, k, v, g, level_scales, scale=scale, cu_seqlens=cu_seqlens)
    return o[..., :V], None
