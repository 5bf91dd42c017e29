"""3D tensor state in NumPy float64: the twin of ``reference.tensor3d`` (docs/CONTRACT.md section 4).

Written independently of the PyTorch reference: explicit loops over batch, head
and token; the gate is expanded to one factor per ``(i, j)`` with explicit loops;
the delta rule runs on the state flattened row-major to ``[K·E, V]``
(``np.ravel``'s C order is the spec's index ``i·E + j``), the PyTorch reference on
the unflattened ``[K, E, V]`` state. The two therefore check each other's
gate broadcasting and flattening.
"""
from __future__ import annotations

import numpy as np

from reference.tensor3d import check_tensor3d_inputs
from reference.validation import as_array, as_checkable, sequences


def decay_grid_numpy(g_t, K: int, E: int) -> np.ndarray:
    """The per-``(i, j)`` log-decay ``[K, E]`` of one token on one head, by meaning."""
    grid = np.zeros((K, E))
    if g_t is None:
        return grid
    g_t = np.asarray(g_t, dtype=np.float64)
    for i in range(K):
        for j in range(E):
            if g_t.ndim == 0:          # one gate for the whole state
                grid[i, j] = g_t
            elif g_t.ndim == 1:        # one gate per tile T[:, j, :]
                grid[i, j] = g_t[j]
            else:                      # one gate per channel T[i, j, :]
                grid[i, j] = g_t[i, j]
    return grid


def tensor3d_step_numpy(S, k1, k2, v, decay, beta=None, mode="gla"):
    """One token on one head: ``S [K, E, V]``, ``k1 [K]``, ``k2 [E]``, ``v [V]``,
    ``decay [K, E]`` (log), ``beta`` a float (mode ``delta``)."""
    K, E, V = S.shape
    S_decayed = np.exp(decay)[:, :, None] * S
    if mode == "gla":
        return S_decayed + np.multiply.outer(np.outer(k1, k2), v)
    kappa = np.outer(k1, k2).ravel()                  # vec(k1 ⊗ k2), index i·E + j
    flat = S_decayed.reshape(K * E, V)
    e = kappa @ flat                                  # T'^T κ
    flat = flat + np.outer(kappa, beta * (v - e))
    return flat.reshape(K, E, V)


def naive_tensor3d_numpy(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None, initial_state=None,
                         cu_seqlens=None):
    """Per-token 3D tensor state on arrays shaped as in ``reference.tensor3d.naive_tensor3d``.

    Inputs are NumPy arrays or tensors, checked as the torch reference checks them
    (``check_tensor3d_inputs``, the same errors). Returns ``(y [B, T, H, V], T_final [B, H, K, E, V])``
    as float64 arrays. ``cu_seqlens`` (a NumPy or torch int32/int64 array): N sequences packed in
    one row, each run as a separate call; ``initial_state`` and ``T_final`` are ``[N, H, K, E, V]``.
    """
    names = ("q1", "k1", "q2", "k2", "v", "g", "beta")
    views = [as_checkable(n, x) for n, x in zip(names, (q1, k1, q2, k2, v, g, beta))]
    B, T, H, K, E, V, _ = check_tensor3d_inputs(*views, mode=mode, scale=scale,
                                                initial_state=as_checkable("initial_state", initial_state),
                                                cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        parts = [naive_tensor3d_numpy(*(None if x is None else x[:, s:e] for x in (q1, k1, q2, k2, v, g, beta)),
                                      mode, scale, None if initial_state is None else initial_state[i:i + 1])
                 for i, s, e in sequences(cu_seqlens)]
        return np.concatenate([y for y, _ in parts], axis=1), np.concatenate([S for _, S in parts], axis=0)
    q1, k1, q2, k2, v = (as_array(x) for x in (q1, k1, q2, k2, v))
    g = None if g is None else as_array(g)
    beta = None if beta is None else as_array(beta)
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, E, V)) if initial_state is None else as_array(initial_state)
    y = np.zeros((B, T, H, V))
    for b in range(B):
        for h in range(H):
            for t in range(T):
                decay = decay_grid_numpy(None if g is None else g[b, t, h], K, E)
                S[b, h] = tensor3d_step_numpy(S[b, h], k1[b, t, h], k2[b, t, h], v[b, t, h], decay,
                                              None if beta is None else beta[b, t, h], mode)
                query = np.outer(q1[b, t, h], q2[b, t, h]).ravel()
                y[b, t, h] = scale * (query @ S[b, h].reshape(K * E, V))
    return y, S
