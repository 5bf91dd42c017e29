"""3D tensor state (two-key linear attention) on fla-core 0.6.0's chunk kernels.

Same contract as ``reference.tensor3d.naive_tensor3d`` (docs/CONTRACT.md section 4). The
3D state ``T [K, E, V]`` is run as a 2D state ``[K·E, V]`` through the exact
flattening (row-major, index ``i·E + j``):

    key    κ_t = vec(k1_t ⊗ k2_t)     [B, T, H, K·E]
    query      vec(q1_t ⊗ q2_t)       [B, T, H, K·E]
    decay  g_t broadcast by meaning to [K, E], then flattened to K·E channels
    state  [B, H, K, E, V] <-> [B, H, K·E, V]   (a reshape: the same memory order)

- mode ``gla``: ``fla.ops.gla.chunk_gla`` (per-channel log-decay ``g [B, T, H, K·E]``);
- mode ``delta``: ``fla.ops.kda.chunk_kda`` (the gated delta rule with per-channel
  decay and a scalar ``beta [B, T, H]``), which is exactly CONTRACT's delta mode on the
  flattened state.

``scale`` defaults to ``K ** -0.5`` with K the width of ``q1`` and is always passed
to fla explicitly (fla's own default would be ``(K·E) ** -0.5``).

Memory cost of the flattening (what a fused kernel would save): the flattened
key, query and decay ``[B, T, H, K·E]`` are materialised in the input dtype (the
decay is materialised even for a ``[B, T, H]`` gate or none, as zeros), i.e.
three activations E times the size of a K-wide head's, and fla keeps its own
copies and a float32 cumulative decay of the same size for the backward pass.
A fused kernel forming ``k1 ⊗ k2`` and ``q1 ⊗ q2`` on chip would read only the
``K + E`` wide inputs. The state itself is not copied (reshape of a contiguous
tensor).

Gradients: autograd through fla's ops and the flattening reaches every input
(q1, k1, q2, k2, v, g, beta, initial_state); a broadcast gate's gradient is the
sum over the channels it scales.

Limits: mode ``delta`` needs ``K·E <= 256`` (``chunk_kda``'s key-width limit;
checked here, a ``ValueError`` beyond it). ``chunk_gla`` has no key-width limit
(it splits wide keys into blocks; K·E = 512 is tested on CPU).
Both kernels run under the Triton interpreter on CPU (``optimized.triton_mode``).
"""
from __future__ import annotations

import torch

from optimized.autograd import empty_result, first_order_only
from optimized.padding import pad_dim, padded
from optimized.checks import (KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype,
                              contiguous_cu_seqlens)
from reference.tensor3d import check_tensor3d_inputs

MAX_DELTA_KEY_DIM = 256  # fla's chunk_kda supports key width <= 256


def flatten_pair(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``vec(x1 ⊗ x2)`` over the last axes, row-major: ``out[..., i·E + j] = x1[..., i] · x2[..., j]``."""
    return (x1[..., :, None] * x2[..., None, :]).flatten(-2)


def flatten_key(k1: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
    """The flattened key ``vec(k1 ⊗ k2) [B, T, H, K·E]``."""
    return flatten_pair(k1, k2)


def flatten_query(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """The flattened query ``vec(q1 ⊗ q2) [B, T, H, K·E]``."""
    return flatten_pair(q1, q2)


def flatten_gate(g, kind: str, K: int, E: int, like: torch.Tensor) -> torch.Tensor:
    """The log-decay on the K·E flattened channels ``[B, T, H, K·E]``, by meaning.

    ``head [B, T, H]``: every channel; ``tile [B, T, H, E]``: channel ``i·E + j`` gets
    ``g[..., j]`` (the E-vector tiled K times); ``channel [B, T, H, K, E]``: row-major
    reshape; ``none``: zeros shaped like ``like``.
    """
    if kind == "none":
        return torch.zeros_like(like)
    if kind == "head":
        return g[..., None].expand(*g.shape, K * E)
    if kind == "tile":
        return g.repeat(*([1] * (g.dim() - 1)), K)        # [..., E] -> [..., K·E], index i·E + j -> j
    return g.flatten(-2)


def flatten_state(state, K: int, E: int):
    """``[B, H, K, E, V] -> [B, H, K·E, V]`` (row-major, index ``i·E + j``)."""
    return None if state is None else state.flatten(2, 3)


def unflatten_state(state, K: int, E: int):
    """``[B, H, K·E, V] -> [B, H, K, E, V]``."""
    return None if state is None else state.unflatten(2, (K, E))


def chunk_tensor3d(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None):
    """Chunked 3D tensor state (fla). Shapes as in ``reference.tensor3d.naive_tensor3d``.

    Inputs are float32 or bfloat16 (one dtype; bfloat16 in cuda mode only) and finite
    (``optimized.checks``); ``initial_state`` is float32.
    ``cu_seqlens``: N sequences packed in one row (``B = 1``), as in the reference; passed to
    fla's ``chunk_gla`` / ``chunk_kda`` (every sequence on its own chunk grid, one launch set);
    ``initial_state`` and the final state are ``[N, H, K, E, V]``.
    Returns ``(y [B, T, H, V] in q1's dtype, T_final [B, H, K, E, V] float32 or None)``.
    """
    B, T, H, K, E, V, kind = check_tensor3d_inputs(q1, k1, q2, k2, v, g, beta, mode, scale, initial_state,
                                                   dtypes=KERNEL_DTYPES, cu_seqlens=cu_seqlens)
    cu_seqlens = contiguous_cu_seqlens(cu_seqlens)
    if mode == "delta" and K * E > MAX_DELTA_KEY_DIM:
        raise ValueError(f"q1, q2: the flattened key width K·E must be <= {MAX_DELTA_KEY_DIM} for fla's "
                         f"chunk_kda (mode 'delta'), got K·E = {K}·{E} = {K * E}")
    check_kernel_device("q1", q1)
    check_kernel_dtype("q1", q1)
    if initial_state is not None and initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state must have dtype torch.float32, got {initial_state.dtype}")
    check_finite_activations((("q1", q1), ("k1", k1), ("q2", q2), ("k2", k2), ("v", v), ("g", g),
                              ("beta", beta)))
    scale = K ** -0.5 if scale is None else float(scale)
    if B == 0 or H == 0:           # fla's grids have no empty form
        inputs = (q1, k1, q2, k2, v, g, beta, initial_state)
        y = empty_result((B, T, H, V), q1.dtype, q1.device, inputs)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        final = empty_result((N, H, K, E, V), torch.float32, q1.device, inputs) if output_final_state else None
        return y, final
    q1, k1, q2, k2, v, g, beta, initial_state = first_order_only("chunk_tensor3d", q1, k1, q2, k2, v, g, beta,
                                                                 initial_state)

    q = flatten_query(q1, q2)
    k = flatten_key(k1, k2)
    g_flat = flatten_gate(g, kind, K, E, like=k).contiguous()
    h0 = flatten_state(initial_state, K, E)
    KE, Vp = padded(K * E), padded(V)      # head dims below the dots' minimum (optimized.padding)
    q, k, g_flat = (pad_dim(x, KE) for x in (q, k, g_flat))
    v = pad_dim(v, Vp)
    h0 = pad_dim(pad_dim(h0, KE, -2), Vp, -1)
    if mode == "gla":
        from fla.ops.gla import chunk_gla

        y, ht = chunk_gla(q, k, v, g_flat, scale=scale, initial_state=h0, output_final_state=output_final_state,
                          cu_seqlens=cu_seqlens)
    else:
        from fla.ops.kda import chunk_kda

        y, ht = chunk_kda(q, k, v, g_flat, beta, scale=scale, initial_state=h0,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    y = y[..., :V]
    if output_final_state and (KE, Vp) != (K * E, V):
        ht = ht[..., :K * E, :V]
    return y.to(q1.dtype), (unflatten_state(ht, K, E) if output_final_state else None)
