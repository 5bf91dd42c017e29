"""GDN-2 (level 0) in NumPy float64: the twin of ``reference.gdn2`` (docs/CONTRACT.md section 1).

Written independently of the PyTorch reference (explicit loops over batch and
head, matrix products instead of einsum) so the two can check each other.
"""
from __future__ import annotations

import numpy as np

from reference.validation import as_array, as_checkable, check_gdn2_inputs, sequences


def gdn2_step_numpy(S, k, v, g, b, w):
    """One token on one head: ``S [K, V]``, ``k, g, b [K]``, ``v, w [V]``."""
    S_decayed = np.exp(g)[:, None] * S        # S' = diag(e^g) S
    e = (b * k) @ S_decayed                   # e = (b ⊙ k)^T S'
    return S_decayed + np.outer(k, w * v - e)  # S' + k ⊗ (w ⊙ v - e)


def naive_gdn2_numpy(q, k, v, g, b, w, scale=None, initial_state=None, cu_seqlens=None):
    """Per-token GDN-2 on arrays shaped as in ``reference.gdn2.naive_gdn2``.

    Inputs are NumPy arrays or tensors, checked as the torch reference checks them
    (``check_gdn2_inputs``, the same errors). Returns ``(o [B, T, H, V], S_T [B, H, K, V])``
    as float64 arrays. ``cu_seqlens`` (a NumPy or torch int32/int64 array): N sequences packed
    in one row, each run as a separate call; ``initial_state`` and ``S_T`` are ``[N, H, K, V]``.
    """
    B, T, H, K, V = check_gdn2_inputs(*(as_checkable(n, x) for n, x in zip("qkvgbw", (q, k, v, g, b, w))),
                                      scale, as_checkable("initial_state", initial_state), cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        parts = [naive_gdn2_numpy(*(x[:, s:e] for x in (q, k, v, g, b, w)), scale,
                                  None if initial_state is None else initial_state[i:i + 1])
                 for i, s, e in sequences(cu_seqlens)]
        return np.concatenate([o for o, _ in parts], axis=1), np.concatenate([S for _, S in parts], axis=0)
    q, k, v, g, b, w = (as_array(x) for x in (q, k, v, g, b, w))
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, V)) if initial_state is None else as_array(initial_state)
    o = np.zeros((B, T, H, V))
    for i in range(B):
        for h in range(H):
            for t in range(T):
                S[i, h] = gdn2_step_numpy(S[i, h], k[i, t, h], v[i, t, h], g[i, t, h], b[i, t, h], w[i, t, h])
                o[i, t, h] = scale * (q[i, t, h] @ S[i, h])
    return o, S
