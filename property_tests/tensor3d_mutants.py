"""Deliberately broken 3D tensor state implementations: every property must fail on one.

Each mutant has the signature of the function it breaks and differs from it in one
named way. Mutants of the optimized path run the real ``chunk_tensor3d`` with one
flattening helper of ``optimized.tensor3d`` swapped for a broken one (the swap lasts
for the forward call; the backward pass is autograd's and calls no helper).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

import optimized.tensor3d as opt3d
import reference.tensor3d as ref3d
from reference.tensor3d import broadcast_gate, tensor3d_read, tensor3d_step


def _loop(q1, k1, q2, k2, v, g, beta, mode, scale, initial_state, output_final_state, step, read_first=False):
    """The reference loop with a replaceable step; ``read_first`` reads before the write."""
    B, T, H, K = q1.shape
    E, V = q2.shape[-1], v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    gate = broadcast_gate(g, K, E)
    S = q1.new_zeros(B, H, K, E, V) if initial_state is None else initial_state.to(q1.dtype)
    y = []
    for t in range(T):
        if read_first:
            y.append(tensor3d_read(S, q1[:, t], q2[:, t], scale))
        S = step(S, k1[:, t], k2[:, t], v[:, t], None if gate is None else gate[:, t],
                 None if beta is None else beta[:, t], mode)
        if not read_first:
            y.append(tensor3d_read(S, q1[:, t], q2[:, t], scale))
    return torch.stack(y, 1), (S if output_final_state else None)


# --- reference mutants ----------------------------------------------------------------------------

def naive_tensor3d_read_before_write(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None,
                                     initial_state=None, output_final_state=False):
    """A token does not see its own write: ``y_t`` reads ``T_{t-1}``, before token t's decay and write."""
    return _loop(q1, k1, q2, k2, v, g, beta, mode, scale, initial_state, output_final_state, tensor3d_step,
                 read_first=True)


def naive_tensor3d_write_with_q2(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None,
                                 initial_state=None, output_final_state=False):
    """Writes with the second *query*: ``k1 ⊗ q2 ⊗ v`` (and κ = k1 ⊗ q2 in delta mode)."""
    return _loop(q1, k1, q2, q2, v, g, beta, mode, scale, initial_state, output_final_state, tensor3d_step)


def naive_tensor3d_erase_before_decay(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None,
                                      initial_state=None, output_final_state=False):
    """Delta mode reads the erase vector from the state *before* the decay: e = T^T κ."""
    def step(S, k1_t, k2_t, v_t, g_t, beta_t, mode_):
        kappa = k1_t[..., :, None] * k2_t[..., None, :]
        e = torch.einsum("...ij,...ijv->...v", kappa, S)                      # BUG: before decay
        S = S if g_t is None else torch.exp(g_t)[..., None] * S
        if mode_ == "gla":
            return S + kappa[..., None] * v_t[..., None, None, :]
        return S + kappa[..., None] * (beta_t[..., None] * (v_t - e))[..., None, None, :]

    return _loop(q1, k1, q2, k2, v, g, beta, mode, scale, initial_state, output_final_state, step)


@contextmanager
def _swapped(module, **replacements):
    saved = {name: getattr(module, name) for name in replacements}
    for name, fn in replacements.items():
        setattr(module, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def _tile_gate_on_rows(g, K, E):
    """Broadcasts a tile gate ``g[..., j]`` over the wrong axis: it scales row ``T[j, :, :]``
    (needs K == E to be shape-valid, which is how such a bug hides)."""
    if g is not None and g.dim() == 4:
        if K != E:
            raise ValueError("this mutant needs K == E")
        return g[..., :, None].expand(*g.shape[:-1], K, E)
    return broadcast_gate(g, K, E)


def naive_tensor3d_tile_gate_on_rows(*args, **kwargs):
    """The reference with the tile gate broadcast over the K axis instead of the E axis."""
    with _swapped(ref3d, broadcast_gate=_tile_gate_on_rows):
        return ref3d.naive_tensor3d(*args, **kwargs)


# --- optimized mutants ------------------------------------------------------------------------------

_flatten_gate = opt3d.flatten_gate  # the real helper, for the kinds a mutant leaves alone


def _vec_j_major(x1, x2):
    """``vec`` with the wrong order: entry ``j·K + i`` is ``x1[..., i] · x2[..., j]``."""
    return (x1[..., None, :] * x2[..., :, None]).flatten(-2)


def _gate_j_major(g, kind, K, E, like):
    if kind == "tile":
        return g.repeat_interleave(K, dim=-1)                   # j-major: index j·K + i -> g[j]
    if kind == "channel":
        return g.transpose(-1, -2).flatten(-2)
    return _flatten_gate(g, kind, K, E, like)


def _gate_tile_wrong_axis(g, kind, K, E, like):
    """A tile gate expanded along the wrong axis: index ``i·E + j`` gets ``g[(i·E + j) // K]``."""
    if kind == "tile":
        return g.repeat_interleave(K, dim=-1)
    return _flatten_gate(g, kind, K, E, like)


def chunk_tensor3d_key_j_major(*args, **kwargs):
    """The flattened key in the wrong order (j·K + i), the query in the right one."""
    with _swapped(opt3d, flatten_key=_vec_j_major):
        return opt3d.chunk_tensor3d(*args, **kwargs)


def chunk_tensor3d_tile_gate_wrong_axis(*args, **kwargs):
    """A ``[B, T, H, E]`` gate broadcast over the wrong axis of the flattened channels."""
    with _swapped(opt3d, flatten_gate=_gate_tile_wrong_axis):
        return opt3d.chunk_tensor3d(*args, **kwargs)


def chunk_tensor3d_state_order_mismatch(*args, **kwargs):
    """Key, query and gate consistently j-major (alone harmless) but the state still
    reshaped i-major: initial and final states are scrambled."""
    with _swapped(opt3d, flatten_key=_vec_j_major, flatten_query=_vec_j_major, flatten_gate=_gate_j_major):
        return opt3d.chunk_tensor3d(*args, **kwargs)


def chunk_tensor3d_fla_default_scale(q1, k1, q2, k2, v, *args, scale=None, **kwargs):
    """``scale`` left to fla's default for the flattened key, ``(K·E) ** -0.5``."""
    return opt3d.chunk_tensor3d(q1, k1, q2, k2, v, *args, scale=(q1.shape[-1] * q2.shape[-1]) ** -0.5, **kwargs)


def chunk_tensor3d_dropped_q2_gradient(q1, k1, q2, k2, v, *args, **kwargs):
    """The optimized op with the second query's gradient dropped (q2 detached)."""
    return opt3d.chunk_tensor3d(q1, k1, q2.detach(), k2, v, *args, **kwargs)


def chunk_tensor3d_dropped_gate_gradient(q1, k1, q2, k2, v, g=None, *args, **kwargs):
    """The optimized op with the decay gate's gradient dropped (g detached)."""
    return opt3d.chunk_tensor3d(q1, k1, q2, k2, v, None if g is None else g.detach(), *args, **kwargs)


def chunk_tensor3d_dropped_beta_gradient(q1, k1, q2, k2, v, g=None, beta=None, *args, **kwargs):
    """The optimized op with β's gradient dropped (β detached)."""
    return opt3d.chunk_tensor3d(q1, k1, q2, k2, v, g, None if beta is None else beta.detach(), *args, **kwargs)


# --- helper mutants -----------------------------------------------------------------------------------

def second_query_key_softmax_over_heads(q2_raw, k2_raw, key_mode):
    """Softmax over the head axis instead of E (sigmoid and ones unchanged)."""
    if key_mode == "softmax":
        return torch.softmax(q2_raw, dim=-2), torch.softmax(k2_raw, dim=-2)
    return ref3d.second_query_key(q2_raw, k2_raw, key_mode)


def state_size_cross_without_value_widening(K, E, V, pairing="diagonal"):
    """Counts the cross pairing as a K·E-wide head with V (not V·E) values."""
    return K * E * V
