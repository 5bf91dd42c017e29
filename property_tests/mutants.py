"""Deliberately broken implementations: every property must fail on one of them.

Each mutant has the signature of the function it breaks and differs from it in
one named way.
"""
from __future__ import annotations

import torch

from optimized import chunk_gdn2
from reference.gdn2 import gdn2_read, naive_gdn2


def naive_gdn2_erase_before_decay(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """Reads the erase vector from the state *before* the decay: e = (b ⊙ k)^T S."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    o = []
    for t in range(T):
        e = torch.einsum("bhk,bhkv->bhv", b[:, t] * k[:, t], S)          # BUG: before decay
        S = torch.exp(g[:, t])[..., None] * S
        S = S + k[:, t][..., None] * (w[:, t] * v[:, t] - e)[..., None, :]
        o.append(gdn2_read(S, q[:, t], scale))
    return torch.stack(o, 1), (S if output_final_state else None)


def naive_gdn2_write_gate_on_erase(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """Applies the write gate to the whole delta (w ⊙ (v - e)) instead of to v alone."""
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    o = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None] * S
        e = torch.einsum("bhk,bhkv->bhv", b[:, t] * k[:, t], S)
        S = S + k[:, t][..., None] * (w[:, t] * (v[:, t] - e))[..., None, :]   # BUG: gate on e too
        o.append(gdn2_read(S, q[:, t], scale))
    return torch.stack(o, 1), (S if output_final_state else None)


def naive_gdn2_decay_clamped(q, k, v, g, b, w, **kwargs):
    """Clamps the log-decay at -10 (a common guard against underflow): e^-10 = 4.5e-5 where the
    input asks for e^-40. The typical draws never go below -10; only the extreme regime catches it."""
    return naive_gdn2(q, k, v, g.clamp(min=-10.0), b, w, **kwargs)   # BUG: strong forgets weakened


def chunk_gdn2_dropped_gate_gradient(q, k, v, g, b, w, **kwargs):
    """The optimized op with the decay-gate gradient dropped (g detached)."""
    return chunk_gdn2(q, k, v, g.detach(), b, w, **kwargs)


def chunk_gdn2_dropped_state_gradient(q, k, v, g, b, w, initial_state=None, **kwargs):
    """The optimized op with the initial-state gradient dropped."""
    return chunk_gdn2(q, k, v, g, b, w, initial_state=initial_state.detach(), **kwargs)
