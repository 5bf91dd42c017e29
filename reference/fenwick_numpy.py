"""Fenwick level router in NumPy float64: the twin of ``reference.fenwick`` (docs/CONTRACT.md section 5).

Written independently of the PyTorch reference so the two can check each other:
explicit loops over batch and head; the level is CONTRACT's ``1 + floor(log2(t XOR s))``
evaluated literally; the recurrent form adds a token by a binary-counter carry
(level 0 absorbs each occupied level above it until the first empty one, where
the sum lands) instead of counting trailing one-bits; the GDN-2 transition is
the CONTRACT's matrix ``(I - k (b ⊙ k)^T) diag(exp(g))`` applied by a matrix product.
"""
from __future__ import annotations

import numpy as np

from reference.fenwick import check_fenwick_gdn2_inputs, check_fenwick_inputs
from reference.validation import as_array, as_checkable, sequences


def fenwick_level_numpy(t: int, s: int) -> int:
    """``level(t, s) = 0 if s = t else 1 + floor(log2(t XOR s))``."""
    return 0 if s == t else 1 + int(np.floor(np.log2(t ^ s)))


def _checked(q, k, v, g, level_scales, scale, b=None, w=None, cu_seqlens=None):
    """The torch reference's checks (``check_fenwick_inputs``, or ``check_fenwick_gdn2_inputs``
    with ``b, w``) on the arrays, then float64 copies ``[q, k, v, g, (b, w,) level_scales]``."""
    views = {n: as_checkable(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w),
                                                 ("level_scales", level_scales))}
    if b is None and w is None:
        check_fenwick_inputs(views["q"], views["k"], views["v"], views["g"], views["level_scales"], scale,
                             cu_seqlens=cu_seqlens)
        return [as_array(x) for x in (q, k, v, g, level_scales)]
    check_fenwick_gdn2_inputs(*views.values(), scale, cu_seqlens=cu_seqlens)
    return [as_array(x) for x in (q, k, v, g, b, w, level_scales)]


def _carry(buckets: list) -> None:
    """Binary-counter increment before a new token: the occupied level 0 carries upward
    through every occupied level above it; the carried sum lands in the first empty
    level, and level 0 is left empty for the new token."""
    if buckets[0] is None:                     # the first token: nothing to carry
        return
    carry, buckets[0] = buckets[0], None
    level = 1
    while buckets[level] is not None:
        carry, buckets[level] = carry + buckets[level], None
        level += 1
    buckets[level] = carry


def _states(buckets: list, K: int, V: int) -> np.ndarray:
    return np.stack([np.zeros((K, V)) if S is None else S for S in buckets])


def _packed(fn, cu_seqlens, arrays, scale):
    """``fn`` once per packed sequence; outputs joined along T, states stacked (``[N, ...]``)."""
    parts = [fn(*(x[:, s:e] for x in arrays), scale=scale) for _, s, e in sequences(cu_seqlens)]
    if isinstance(parts[0], tuple):
        return np.concatenate([o for o, _ in parts], axis=1), np.concatenate([S for _, S in parts], axis=0)
    return np.concatenate(parts, axis=1)


def naive_fenwick_numpy(q, k, v, g, level_scales, scale=None, cu_seqlens=None):
    """Per-token Fenwick attention on arrays shaped as in ``reference.fenwick.naive_fenwick``.

    Returns ``(o [B, T, H, V], states [B, H, L, K, V])`` as float64 arrays. ``cu_seqlens`` (a
    NumPy or torch int32/int64 array): N sequences packed in one row, each run as a separate
    call (its own Fenwick counter); states ``[N, H, L, K, V]``.
    """
    q, k, v, g, lam = _checked(q, k, v, g, level_scales, scale, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        return _packed(naive_fenwick_numpy, cu_seqlens, (q, k, v, g, lam), scale)
    B, T, H, K = q.shape
    V, L = v.shape[-1], lam.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    o = np.zeros((B, T, H, V))
    states = np.zeros((B, H, L, K, V))
    for i in range(B):
        for h in range(H):
            buckets = [None] * L
            for t in range(T):
                _carry(buckets)                                                   # merge
                buckets = [None if S is None else np.exp(g[i, t, h]) * S for S in buckets]  # decay
                buckets[0] = np.outer(k[i, t, h], v[i, t, h])                      # write
                o[i, t, h] = scale * sum(lam[i, t, h, level] * (q[i, t, h] @ S)
                                         for level, S in enumerate(buckets) if S is not None)
            states[i, h] = _states(buckets, K, V)
    return o, states


def naive_fenwick_gdn2_numpy(q, k, v, g, b, w, level_scales, scale=None, cu_seqlens=None):
    """The GDN-2 variant on arrays shaped as in ``reference.fenwick.naive_fenwick_gdn2``.

    Returns ``(o [B, T, H, V], states [B, H, L, K, V])`` as float64 arrays; ``cu_seqlens`` as in
    ``naive_fenwick_numpy``.
    """
    q, k, v, g, b, w, lam = _checked(q, k, v, g, level_scales, scale, b, w, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        return _packed(naive_fenwick_gdn2_numpy, cu_seqlens, (q, k, v, g, b, w, lam), scale)
    B, T, H, K = q.shape
    V, L = v.shape[-1], lam.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    o = np.zeros((B, T, H, V))
    states = np.zeros((B, H, L, K, V))
    for i in range(B):
        for h in range(H):
            buckets = [None] * L
            for t in range(T):
                kt = k[i, t, h]
                A = (np.eye(K) - np.outer(kt, b[i, t, h] * kt)) @ np.diag(np.exp(g[i, t, h]))
                _carry(buckets)
                buckets = [None if S is None else A @ S for S in buckets]
                buckets[0] = np.outer(kt, w[i, t, h] * v[i, t, h])
                o[i, t, h] = scale * sum(lam[i, t, h, level] * (q[i, t, h] @ S)
                                         for level, S in enumerate(buckets) if S is not None)
            states[i, h] = _states(buckets, K, V)
    return o, states


def quadratic_fenwick_numpy(q, k, v, g, level_scales, scale=None, cu_seqlens=None):
    """The masked ``T × T`` form, one pair ``(t, s)`` at a time. Returns ``o [B, T, H, V]``;
    ``cu_seqlens`` as in ``naive_fenwick_numpy``."""
    q, k, v, g, lam = _checked(q, k, v, g, level_scales, scale, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        return _packed(quadratic_fenwick_numpy, cu_seqlens, (q, k, v, g, lam), scale)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    o = np.zeros((B, T, H, V))
    for i in range(B):
        for h in range(H):
            for t in range(T):
                log_decay = 0.0                 # Σ_{u=s+1..t} g_u, summed (a difference of cumulative
                for s in range(t, -1, -1):      # sums is -inf - (-inf) = NaN after a g = -inf)
                    weight = lam[i, t, h, fenwick_level_numpy(t, s)] * np.exp(log_decay)
                    o[i, t, h] += scale * weight * (q[i, t, h] @ k[i, s, h]) * v[i, s, h]
                    log_decay = log_decay + g[i, s, h]
    return o
