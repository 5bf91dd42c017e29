"""``chunk_nested_gdn2``: input checks and the thin autograd Function over ``fwd`` / ``bwd``."""
from __future__ import annotations

import contextlib

import torch

from optimized import triton_mode  # noqa: F401  (device mode before fla)
import optimized.autograd as op_autograd
from optimized.autograd import empty_result, graph_kept
from optimized.checks import KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype
from optimized.gdn2 import MAX_HEAD_DIM
from optimized.nested.bwd import nested_bwd
from optimized.nested.fwd import nested_fwd
from optimized.nested.pieces import DEFAULT_PIECES, Pieces
from optimized.nested.param_casts import cast_like
from optimized.nested.stages import stage
from reference.nested import validate_nested_inputs
from reference.validation import sequences


def _device_of(x: torch.Tensor):
    """Launch on ``x``'s GPU (Triton launches on the current device), as fla's input_guard does."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


class NestedGDN2Function(torch.autograd.Function):
    """Thin autograd wrapper: inputs are flattened to tensors (initial states, then every
    level's parameters in ``levels`` order); outputs ``o`` and, when ``meta["finals"]``, the L
    final states (not made at all otherwise: L copies fewer a call)."""

    @staticmethod
    def forward(ctx, meta, q, k, v, g, b, w, r, *flat):
        levels, scale, pieces, L = meta["levels"], meta["scale"], meta["pieces"], meta["L"]
        initial_states = list(flat[:L])
        o, finals, saved = nested_fwd(q, k, v, g, b, w, r, levels, scale, initial_states, pieces,
                                      lengths=meta["lengths"], finals=meta["finals"])
        ctx.saved = saved
        ctx.meta = meta
        ctx.set_materialize_grads(False)
        return (o, *finals)

    @staticmethod
    def backward(ctx, do, *dfinals):
        # the kernels record no graph: a create_graph=True backward (which the engine runs in grad
        # mode) is refused here, before any work (optimized.autograd; CONTRACT "Errors")
        op_autograd.refuse_second_order("chunk_nested_gdn2")
        return _backward(ctx, do, *dfinals)


@torch.autograd.function.once_differentiable
def _backward(ctx, do, *dfinals):
    """``NestedGDN2Function``'s gradients (``dfinals``: none when the finals were not made)."""
    saved, meta = ctx.saved, ctx.meta
    if saved is None:
        raise RuntimeError("chunk_nested_gdn2: backward through the same graph a second time, but the "
                           "saved tensors were freed after the first; pass retain_graph=True to the "
                           "first backward")
    q = saved.q
    if do is None:
        do = torch.zeros(q.shape[:3] + (saved.o0.shape[-1],), dtype=torch.float32, device=q.device)
    dfinals = list(dfinals) if dfinals else [None] * meta["L"]
    kept = graph_kept()   # the saved state is a Python object: freed here unless kept
    with _device_of(q):
        dq, dk, dv, dg, db, dw, dr, dinit, dparams = nested_bwd(saved, do, dfinals, release=not kept)
    ins = meta["inputs"]
    cast = lambda gr, like: None if (gr is None or like is None) else gr.to(like.dtype)  # noqa: E731
    flat = [cast(dinit[ℓ], ins["initial_states"][ℓ]) for ℓ in range(meta["L"])]
    # a level that never fires reads none of its scheme parameters: no gradient (None, as autograd
    # gives the reference; zeros would still draw an optimizer's weight decay and moments)
    params = [(dparams[ℓ][n] if saved.plan.firings(ℓ) > 0 else None, p)
              for ℓ, level in enumerate(saved.levels, start=1) for n, p in level.params.items()]
    flat += cast_like([d for d, _ in params], [p for _, p in params])   # one cast for all of them
    if not kept:
        ctx.saved = None   # as autograd frees saved tensors: nothing outlives a plain backward
    with stage("nested.grad_casts"):
        grads = (dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dg.to(q.dtype), db.to(q.dtype),
                 dw.to(q.dtype), dr.to(saved.r.dtype))
    return (None, *grads, *flat)


def _nested(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False,
            pieces: Pieces = DEFAULT_PIECES, cu_seqlens=None):
    if isinstance(q, torch.Tensor):     # before the validation's finiteness sync (a meta q cannot sync)
        check_kernel_device("q", q)
    B, T, H, L, K, V = validate_nested_inputs(q, k, v, g, b, w, r, levels, scale, initial_states,
                                              dtypes=KERNEL_DTYPES, check_params_finite=False,
                                              cu_seqlens=cu_seqlens)
    if K > MAX_HEAD_DIM:
        raise ValueError(f"q: key dim K must be <= {MAX_HEAD_DIM} for fla's GDN-2 kernels, got {K}")
    check_kernel_dtype("q", q)
    check_finite_activations((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w), ("r", r)),
                             params=((f"levels[{i}].params[{key!r}]", p) for i, level in enumerate(levels)
                                     for key, p in level.params.items()))
    scale = K ** -0.5 if scale is None else float(scale)
    if B == 0 or H == 0:           # the scans' and reads' grids have no empty form
        inputs = (q, k, v, g, b, w, r, *(initial_states or ()), *(p for lv in levels for p in lv.params.values()))
        o = empty_result((B, T, H, V), q.dtype, q.device, inputs)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        finals = [empty_result((N, H, K, V), torch.float32, q.device, inputs) for _ in range(L)]
        return o, (finals if output_final_state else None)
    initial_states = [None if s is None else s.contiguous()
                      for s in ([None] * L if initial_states is None else initial_states)]
    k, v, g, b, w = (x.contiguous() for x in (k, v, g, b, w))
    # packed sequences: their lengths (host ints, read once by the validation) pick the packed
    # schedule; the kernels index the sequences themselves (one launch set for the row)
    lengths = None if cu_seqlens is None else tuple(e - s for _, s, e in sequences(cu_seqlens))
    meta = {"levels": list(levels), "scale": scale, "pieces": pieces, "L": L, "lengths": lengths,
            "inputs": {"initial_states": initial_states}, "finals": output_final_state}
    flat = list(initial_states) + [p for lv in levels for p in lv.params.values()]
    # second-order gradients: refused by the Function's backward itself (no identity node on the inputs)
    with _device_of(q):
        o, *finals = NestedGDN2Function.apply(meta, q, k, v, g, b, w, r, *flat)
    return o, (finals if output_final_state else None)


def chunk_nested_gdn2(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False,
                      cu_seqlens=None):
    """Nested GDN-2 on Triton kernels; same contract as ``reference.nested.naive_nested_gdn2``
    (without ``chunk_size``: always 64).

    Args:
        q: per-level read queries ``[B, T, H, L, K]``; k, g, b ``[B, T, H, K]``; v, w
            ``[B, T, H, V]``; r router logits ``[B, T, H, L]`` (float32 or bfloat16, one dtype;
            bfloat16 in cuda mode only; finite: ``optimized.checks``).
        levels: ``L - 1`` ``reference.nested.Level`` (scheme, interval, params, reduction).
        scale: default ``K ** -0.5``.
        initial_states: None or L entries, each None or float32 ``[B, H, K, V]``.
        output_final_state: also return the L final states.
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``), each computed as a separate call (its own
            chunk grid and firing schedule from its first token); initial and final states are
            ``[N, H, K, V]``. One launch set serves the packed row: fla's level 0 takes
            ``cu_seqlens``, and the state-gradient, scan and reads kernels index the sequences
            themselves (``optimized.nested.plan.make_packed_plan``: per-sequence chunks,
            firings and stored states, concatenated).

    Returns ``(o [B, T, H, V] in q's dtype, [M_0, ..., M_{L-1}] float32 or None)``. Gradients
    flow to every input, router logit, scheme parameter and initial state.
    """
    return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state, cu_seqlens=cu_seqlens)
