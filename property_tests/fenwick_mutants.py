"""Deliberately broken Fenwick implementations: every Fenwick property fails on one of them.

Each mutant has the signature of the function it breaks and differs from it in
one named way.
"""
from __future__ import annotations

import torch

from optimized import chunk_fenwick
from reference.fenwick import fenwick_level_matrix, masked_fenwick, trailing_ones
from reference.gdn2 import gdn2_read


def _read(buckets, q_t, lam_t, scale):
    return sum(lam_t[:, :, level, None] * gdn2_read(S, q_t, scale) for level, S in enumerate(buckets))


def _recurrent(q, k, v, g, level_scales, scale, output_final_state, merge_lag=0, decay_after_write=False):
    """The per-token form with zero tensors for empty buckets and two switchable bugs."""
    B, T, H, K = q.shape
    L = level_scales.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    buckets = [q.new_zeros(B, H, K, v.shape[-1]) for _ in range(L)]
    o = []
    for t in range(T):
        if t - merge_lag > 0:
            m = trailing_ones(t - 1 - merge_lag)
            merged = sum(buckets[: m + 2])                       # levels 0..m into m+1 (m+1 may be occupied)
            buckets = [torch.zeros_like(merged)] * (m + 1) + [merged] + buckets[m + 2:]
        write = k[:, t, :, :, None] * v[:, t, :, None, :]
        decay = torch.exp(g[:, t])[:, :, None, None]
        if decay_after_write:
            buckets = [decay * S for S in [buckets[0] + write] + buckets[1:]]
        else:
            buckets = [decay * S for S in buckets]
            buckets[0] = buckets[0] + write
        o.append(_read(buckets, q[:, t], level_scales[:, t], scale))
    return torch.stack(o, 1), (torch.stack(buckets, 2) if output_final_state else None)


def naive_fenwick_merge_late(q, k, v, g, level_scales, scale=None, output_final_state=False):
    """The merge due when moving from ``t-1`` to ``t`` happens one token late (at ``t -> t+1``)."""
    return _recurrent(q, k, v, g, level_scales, scale, output_final_state, merge_lag=1)


def naive_fenwick_decay_after_write(q, k, v, g, level_scales, scale=None, output_final_state=False):
    """Decays the new token's own write with its own gate (decay applied after the write)."""
    return _recurrent(q, k, v, g, level_scales, scale, output_final_state, decay_after_write=True)


def quadratic_fenwick_levels_off_by_one(q, k, v, g, level_scales, scale=None):
    """``level(t, s) = floor(log2(t XOR s))`` for ``s < t``: the ``1 +`` forgotten."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    levels = fenwick_level_matrix(q.shape[1])
    levels = torch.where(levels > 0, levels - 1, levels)
    return masked_fenwick(q, k, v, g, level_scales, scale, levels)


def naive_fenwick_gdn2_erase_level0_only(q, k, v, g, b, w, level_scales, scale=None, output_final_state=False):
    """GDN-2 variant whose older buckets only decay: the erase acts on the newest bucket alone."""
    B, T, H, K = q.shape
    L = level_scales.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    buckets = [q.new_zeros(B, H, K, v.shape[-1]) for _ in range(L)]
    o = []
    for t in range(T):
        if t > 0:
            m = trailing_ones(t - 1)
            buckets = [torch.zeros_like(buckets[0])] * (m + 1) + [sum(buckets[: m + 1])] + buckets[m + 2:]
        decay = torch.exp(g[:, t])[..., :, None]
        buckets = [decay * S for S in buckets]
        e = torch.einsum("bhk,bhkv->bhv", b[:, t] * k[:, t], buckets[0])
        buckets[0] = buckets[0] - k[:, t, ..., None] * e[..., None, :]     # BUG: only level 0 is erased
        buckets[0] = buckets[0] + k[:, t, ..., None] * (w[:, t] * v[:, t])[..., None, :]
        o.append(_read(buckets, q[:, t], level_scales[:, t], scale))
    return torch.stack(o, 1), (torch.stack(buckets, 2) if output_final_state else None)


def chunk_fenwick_fla_default_scale(q, k, v, g, level_scales, scale=None):
    """The optimized op with fla's default ``scale = 1.0`` instead of ``K ** -0.5``."""
    return chunk_fenwick(q, k, v, g, level_scales, scale=1.0)


def chunk_fenwick_dropped_level_scale_gradient(q, k, v, g, level_scales, scale=None):
    """The optimized op with the router (λ) gradient dropped."""
    return chunk_fenwick(q, k, v, g, level_scales.detach(), scale=scale)


def chunk_fenwick_dropped_gate_gradient(q, k, v, g, level_scales, scale=None):
    """The optimized op with the decay-gate gradient dropped."""
    return chunk_fenwick(q, k, v, g.detach(), level_scales, scale=scale)
