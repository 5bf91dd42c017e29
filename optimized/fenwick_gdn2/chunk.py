"""Entry point and autograd wrapper of the chunked Fenwick GDN-2 memory."""
from __future__ import annotations

import dataclasses

import torch

from optimized.autograd import empty_result, first_order_only, graph_kept
from optimized.checks import KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype
from optimized.fenwick_gdn2.bwd import fenwick_gdn2_bwd_with_tail
from optimized.fenwick_gdn2.fwd import fenwick_gdn2_fwd, stacked_blocks
from optimized.fenwick_gdn2.packing import packing
from optimized.fenwick_gdn2.states import CHUNK, OWN_LEVELS
from reference.fenwick import check_level_scales, min_levels
from reference.validation import (check_gdn2_inputs, check_same_device, check_same_dtype, check_shape,
                                  check_sizes, check_tensor, sequences)

MAX_HEAD_DIM = 256  # fla's GDN-2 kernels support K <= 256
# On CUDA the reverse carry scan (states.fenwick_states_bwd_kernel) of the earlier form (a [K, 16]
# state block per step) needed 280 KiB of shared memory at K = 256, over the H200's 227 KiB (Triton
# 3.6, 2026-12-02). The present form holds a [K, 128] tile of every block's states: at K = 128 it
# takes 192 KiB (scripts/kernel_resources.py); K = 256 was not tried on the GPU. Keys up to 128
# compile and run.
MAX_HEAD_DIM_CUDA = 128


def max_head_dim(device_type: str) -> int:
    """The widest key this op runs on a device of ``device_type`` (``"cuda"``: the carry scan's
    shared memory; elsewhere, under Triton's interpreter, fla's limit)."""
    return MAX_HEAD_DIM_CUDA if device_type == "cuda" else MAX_HEAD_DIM


# The caller's tensors among the saved ones: kept with ``save_for_backward`` (autograd's check that
# they were not modified in place before the backward). Everything else the forward made is held
# in Python objects on ``ctx``, which autograd does not free, so that a backward that does not
# keep the graph frees each stacked tensor as soon as it is spent (``fenwick_gdn2_bwd``'s
# ``release``: the step peaks in fla's WY backward with every stacked tensor alive).
_INPUTS = ("q", "k", "v", "b", "w", "lam")


class ChunkFenwickGDN2Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, b, w, level_scales, initial_state, scale, offset, output_final_state,
                cu_seqlens=None, bounds=None):
        p = None if cu_seqlens is None else packing(cu_seqlens, bounds)
        o, final, saved, tail = fenwick_gdn2_fwd(q, k, v, g, b, w, level_scales, scale, initial_state, offset,
                                                 split_final=output_final_state, p=p)
        ctx.save_for_backward(*(getattr(saved, n) for n in _INPUTS))
        for n in _INPUTS:
            setattr(saved, n, None)
        ctx.parts = (saved, tail)
        return o, (final if output_final_state else None)

    @staticmethod
    def backward(ctx, do, dfinal):
        if ctx.parts is None:
            raise RuntimeError("chunk_fenwick_gdn2: backward through the same graph a second time, but the "
                               "saved tensors were freed after the first; pass retain_graph=True to the "
                               "first backward")
        saved, tail = ctx.parts
        kept = graph_kept()
        inputs = dict(zip(_INPUTS, ctx.saved_tensors))
        saved = dataclasses.replace(saved, **inputs)          # ctx's object keeps no input reference
        if not kept:
            ctx.parts = None            # the backward frees what it has spent (as autograd frees saved tensors)
        dq, dk, dv, dg, db, dw, dlam, dh0 = fenwick_gdn2_bwd_with_tail(saved, tail, do, dfinal, release=not kept)
        q = inputs["q"]
        return (dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dg.to(q.dtype), db.to(q.dtype), dw.to(q.dtype),
                dlam.to(q.dtype), dh0, None, None, None, None, None)


def check_fenwick_gdn2_kernel_inputs(q, k, v, g, b, w, level_scales, scale, initial_state, offset,
                                     cu_seqlens=None):
    """Every check of the entry point, before any work. Returns ``(B, T, H, K, V, L, bounds)``,
    ``bounds`` the host copy of ``cu_seqlens`` (None without it)."""
    B, T, H, K, V = check_gdn2_inputs(q, k, v, g, b, w, scale, dtypes=KERNEL_DTYPES, cu_seqlens=cu_seqlens)
    bounds = None if cu_seqlens is None else [0] + [e for _, _, e in sequences(cu_seqlens)]
    lengths = [T] if cu_seqlens is None else [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    if initial_state is not None and not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"initial_state must be a torch.Tensor or None, got {type(initial_state).__name__}")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    if offset < 0 or offset % CHUNK != 0:
        raise ValueError(f"offset must be a non-negative multiple of {CHUNK} (the absolute index of the "
                         f"first token; a call continues at a chunk boundary), got {offset}")
    if cu_seqlens is not None and offset != 0:
        raise ValueError(f"offset must be 0 with cu_seqlens (every packed sequence starts at its own token 0), "
                         f"got offset = {offset}; continue a packed sequence in a call of its own")
    if cu_seqlens is not None and initial_state is not None:
        raise ValueError("initial_state is not accepted with cu_seqlens: it needs offset > 0 (the bucket states "
                         "after token offset - 1), and packed sequences start at offset 0; continue a packed "
                         "sequence in a call of its own")
    if initial_state is not None and offset == 0:
        raise ValueError("initial_state needs offset > 0: it holds the bucket states after token offset - 1 "
                         "(the final states of the call that ended there), and the Fenwick buckets of the "
                         "continuation depend on that absolute position")
    check_tensor("level_scales", level_scales, ndim=4)
    L = check_level_scales(level_scales, B, T, H, None if cu_seqlens is None else max(lengths))
    need = min_levels(offset + max(lengths))
    if L < need:
        raise ValueError(f"level_scales must have at least 1 + ceil(log2(offset + T)) = {need} levels for "
                         f"offset = {offset}, T = {max(lengths)}, got L = {L}")
    check_same_dtype((("q", q), ("level_scales", level_scales)))
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ndim=5)
        check_shape("initial_state", initial_state, (B, H, L, K, V), "[B, H, L, K, V]")
        if initial_state.dtype != torch.float32:
            raise ValueError(f"initial_state must have dtype torch.float32, got {initial_state.dtype}")
    check_same_device((("q", q), ("level_scales", level_scales), ("initial_state", initial_state)))
    if K > MAX_HEAD_DIM:
        raise ValueError(f"q: key dim K must be <= {MAX_HEAD_DIM} for fla's GDN-2 kernels, got {K}")
    if K > max_head_dim(q.device.type):
        raise ValueError(f"q: key dim K must be <= {max_head_dim(q.device.type)} on {q.device.type}, got {K}: "
                         f"above it the reverse carry scan needs more shared memory than the GPU has "
                         f"(280 KiB at K = 256 on an H200)")
    check_sizes((("level_scales [B, T, H, L]", (B, T, H, L)),))
    NB = stacked_blocks(offset, max(lengths), L, initial_state is not None)   # the longest sets J
    N = sum(-(-T_i // CHUNK) for T_i in lengths)                               # chunks of all rows
    check_sizes((("the stacked values [B, T, H, (J + 1) * V]", (B, T, H, NB * V)),
                 ("the stacked per-chunk states [B, ceil(T/64), H, K, (J + 1) * V]", (B, N, H, K, NB * V)),
                 ("the final states [B, H, L, K, V]", (len(lengths) if cu_seqlens is not None else B, H, L, K, V))))
    if cu_seqlens is not None and max(lengths) > CHUNK:      # the split pass over every sequence's last chunk
        T_tail = sum(T_i - CHUNK * ((T_i - 1) // CHUNK) for T_i in lengths)
        check_sizes((("the last chunks' stacked values [1, T_last, H, 7 * V]", (1, T_tail, H, OWN_LEVELS * V)),))
    check_kernel_device("q", q)
    check_kernel_dtype("q", q)
    check_finite_activations((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w),
                              ("level_scales", level_scales)),
                             params=(() if initial_state is None else (("initial_state", initial_state),)))
    return B, T, H, K, V, L, bounds


def chunk_fenwick_gdn2(q, k, v, g, b, w, level_scales, scale=None, initial_state=None, output_final_state=False,
                       offset=0, cu_seqlens=None):
    """Chunked Fenwick GDN-2 memory. Same contract as ``reference.fenwick.naive_fenwick_gdn2``
    (CONTRACT section 5, the GDN-2 variant), plus state passing.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]``; one dtype, float32 (or bfloat16 in
            cuda mode), finite (``optimized.checks``).
        level_scales: ``λ [B, T, H, L]`` in that dtype, ``L ≥ 1 + ceil(log2(offset + T))``.
        scale: multiplies every read; default ``K ** -0.5``.
        initial_state: ``[B, H, L, K, V]`` float32, the bucket states after token ``offset − 1``
            (what a call over tokens ``0 .. offset − 1`` returned as final states, with the same L),
            or None (all buckets empty).
        output_final_state: also return the bucket states after the last token.
        offset: absolute index of the first token, a multiple of 64 (default 0); the bucket
            boundaries ``level(t, s)`` are those of the absolute positions.
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``), each computed as a separate call with its own
            chunk grid and Fenwick counter from its first token; final states ``[N, H, L, K, V]``;
            ``L ≥ 1 + ceil(log2 T_i)`` for the longest. With it ``offset`` must be 0 and
            ``initial_state`` None (a packed sequence cannot continue an earlier call; continue it
            in a call of its own). One launch set runs the whole packed row, forward and backward:
            every kernel indexes each sequence's own chunks (``optimized.fenwick_gdn2``, "Packed
            rows"); the bucket blocks follow the longest sequence.

    Returns:
        ``(o [B, T, H, V] in v's dtype, states [B, H, L, K, V] float32 or None)``.
        Differentiable in q, k, v, g, b, w, level_scales and initial_state.
    """
    B, T, H, K, V, L, bounds = check_fenwick_gdn2_kernel_inputs(q, k, v, g, b, w, level_scales, scale,
                                                                initial_state, offset, cu_seqlens)
    scale = K ** -0.5 if scale is None else float(scale)
    if B == 0 or H == 0:           # fla's KDA backward piece divides by H at compile time
        inputs = (q, k, v, g, b, w, level_scales, initial_state)
        o = empty_result((B, T, H, V), v.dtype, v.device, inputs)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        final = empty_result((N, H, L, K, V), torch.float32, v.device, inputs) if output_final_state else None
        return o, final
    q, k, v, g, b, w, level_scales = (x.contiguous() for x in (q, k, v, g, b, w, level_scales))
    if initial_state is not None:
        initial_state = initial_state.contiguous()
    q, k, v, g, b, w, level_scales, initial_state = first_order_only("chunk_fenwick_gdn2", q, k, v, g, b, w,
                                                                     level_scales, initial_state)
    return ChunkFenwickGDN2Function.apply(q, k, v, g, b, w, level_scales, initial_state, scale, offset,
                                          output_final_state, cu_seqlens, bounds)
