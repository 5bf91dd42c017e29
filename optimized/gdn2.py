"""GDN-2 level 0 on fla-core 0.6.0's chunk kernels (``fla.ops.gdn2.chunk_gdn2``).

Same contract as ``reference.gdn2.naive_gdn2`` (docs/CONTRACT.md section 1): validates
its inputs, then calls fla. fla's chunk size is 64 (CONTRACT conventions).
"""
from __future__ import annotations

import torch

from optimized.autograd import empty_result, first_order_only
from optimized.padding import pad_dim, padded
from optimized.checks import (KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype,
                              contiguous_cu_seqlens)
from reference.validation import check_gdn2_inputs

MAX_HEAD_DIM = 256  # fla's GDN-2 kernels support K <= 256


def chunk_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunked GDN-2 (fla). Shapes as in ``reference.gdn2.naive_gdn2``.

    Inputs are float32 or bfloat16 (one dtype; bfloat16 in cuda mode only) and finite
    (``optimized.checks``); ``initial_state`` is float32.
    ``cu_seqlens``: N sequences packed in one row (``B = 1``), as in the reference; passed to fla's
    kernel, which runs every sequence on its own chunk grid in one launch set; ``initial_state``
    and the final state are ``[N, H, K, V]``.
    Returns ``(o [B, T, H, V] in q's dtype, S_T [B, H, K, V] float32 or None)``.
    """
    B, T, H, K, V = check_gdn2_inputs(q, k, v, g, b, w, scale, initial_state, dtypes=KERNEL_DTYPES,
                                      cu_seqlens=cu_seqlens)
    cu_seqlens = contiguous_cu_seqlens(cu_seqlens)
    if K > MAX_HEAD_DIM:
        raise ValueError(f"q: key dim K must be <= {MAX_HEAD_DIM} for fla's GDN-2 kernels, got {K}")
    check_kernel_device("q", q)
    check_kernel_dtype("q", q)
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state must have dtype torch.float32, got {initial_state.dtype}")
    check_finite_activations((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w)))
    from fla.ops.gdn2 import chunk_gdn2 as fla_chunk_gdn2

    if B == 0 or H == 0:           # fla's grids have no empty form (its KDA backward divides by H)
        inputs = (q, k, v, g, b, w, initial_state)
        o = empty_result((B, T, H, V), q.dtype, q.device, inputs)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        return o, (empty_result((N, H, K, V), torch.float32, q.device, inputs) if output_final_state else None)
    q, k, v, g, b, w, initial_state = first_order_only("chunk_gdn2", q, k, v, g, b, w, initial_state)
    scale = K ** -0.5 if scale is None else float(scale)
    Kp, Vp = padded(K), padded(V)          # head dims below the dots' minimum (optimized.padding)
    q, k, g, b = (pad_dim(x, Kp) for x in (q, k, g, b))
    v, w = (pad_dim(x, Vp) for x in (v, w))
    initial_state = pad_dim(pad_dim(initial_state, Kp, -2), Vp, -1)
    o, ht = fla_chunk_gdn2(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if Vp != V:
        o = o[..., :V]
    if ht is not None and (Kp, Vp) != (K, V):
        ht = ht[..., :K, :V]
    return o, ht
