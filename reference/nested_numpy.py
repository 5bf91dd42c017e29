"""Nested GDN-2 in NumPy float64: the twin of ``reference.nested`` (docs/CONTRACT.md section 3).

Written independently of the PyTorch reference: explicit loops over batch, head,
chunk and token; the level states are read through a copy taken when the chunk
begins; NumPy schemes and promote from ``reference.promote_numpy``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from reference.gdn2_numpy import gdn2_step_numpy
from reference.nested import Level, validate_nested_inputs
from reference.promote_numpy import BUILTIN_TWINS, SCHEMES_NUMPY, _promote, unchecked_twin
from reference.schemes import BUILTIN_SCHEMES, SCHEMES, is_builtin
from reference.validation import as_array, as_checkable, sequences


def _checkable_levels(levels):
    """``levels`` with NumPy parameters viewed as tensors, for ``validate_nested_inputs``; each
    scheme must also have a NumPy twin."""
    if not isinstance(levels, Sequence) or isinstance(levels, str):
        return levels                                   # the shared check names the error
    out = []
    for i, level in enumerate(levels):
        if isinstance(level, Level):
            if isinstance(level.scheme, str) and level.scheme in SCHEMES and level.scheme not in SCHEMES_NUMPY:
                raise ValueError(f"levels[{i}] (level ℓ = {i + 1}): scheme {level.scheme!r} has no NumPy twin "
                                 f"in reference.promote_numpy.SCHEMES_NUMPY (have {sorted(SCHEMES_NUMPY)})")
            if (isinstance(level.scheme, str) and level.scheme in BUILTIN_SCHEMES and not is_builtin(level.scheme)
                    and SCHEMES_NUMPY.get(level.scheme) is BUILTIN_TWINS.get(level.scheme)):
                raise ValueError(f"levels[{i}] (level ℓ = {i + 1}): scheme {level.scheme!r} was registered over "
                                 f"the built-in of that name (replace=True), but its NumPy twin "
                                 f"(reference.promote_numpy.SCHEMES_NUMPY) is still the built-in's: register "
                                 f"the new scheme's twin there too")
            params = level.params
            if isinstance(params, dict):
                params = {name: as_checkable(f"levels[{i}].params[{name!r}]", p) for name, p in params.items()}
            level = Level(level.scheme, level.interval, params, level.reduction)
        out.append(level)
    return out


def softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


def naive_nested_gdn2_numpy(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, chunk_size=64,
                            cu_seqlens=None):
    """Per-token Nested GDN-2 on arrays shaped as in ``reference.nested.naive_nested_gdn2``.

    ``levels``: ``L - 1`` ``reference.nested.Level`` whose ``params`` are per-head arrays or
    tensors (leading dim H), of a scheme with a NumPy twin (``SCHEMES_NUMPY``). Inputs are
    NumPy arrays or tensors, checked as the torch reference checks them
    (``validate_nested_inputs``, the same errors).
    Returns ``(o [B, T, H, V], [M_0, ..., M_{L-1}] each [B, H, K, V])`` as float64 arrays.
    ``cu_seqlens`` (a NumPy or torch int32/int64 array): N sequences packed in one row, each run
    as a separate call; initial and final states are then ``[N, H, K, V]``.
    """
    named = tuple(as_checkable(n, x) for n, x in zip(("q", "k", "v", "g", "b", "w", "r"), (q, k, v, g, b, w, r)))
    states = (initial_states if not isinstance(initial_states, (list, tuple))
              else [as_checkable(f"initial_states[{ℓ}]", s) for ℓ, s in enumerate(initial_states)])
    B, T, H, L, K, V = validate_nested_inputs(*named, _checkable_levels(levels), scale, states, chunk_size,
                                              cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        parts = []
        for i, s, e in sequences(cu_seqlens):
            states_i = None if initial_states is None else [None if M0 is None else M0[i:i + 1]
                                                            for M0 in initial_states]
            parts.append(naive_nested_gdn2_numpy(*(x[:, s:e] for x in (q, k, v, g, b, w, r)), levels, scale,
                                                 states_i, chunk_size))
        return (np.concatenate([o for o, _ in parts], axis=1),
                [np.concatenate([M[ℓ] for _, M in parts], axis=0) for ℓ in range(L)])
    q, k, v, g, b, w, r = (as_array(x) for x in (q, k, v, g, b, w, r))
    scale = K ** -0.5 if scale is None else scale
    C = chunk_size
    N = (T + C - 1) // C
    M = np.zeros((L, B, H, K, V))
    for ℓ, M0 in enumerate(initial_states if initial_states is not None else [None] * L):
        if M0 is not None:
            M[ℓ] = as_array(M0)
    params = [{name: as_array(p) for name, p in level.params.items()} for level in levels]
    twins = [unchecked_twin(level.scheme) for level in levels]    # inputs checked above, once
    o = np.zeros((B, T, H, V))
    for i in range(B):
        for h in range(H):
            for c in range(1, N + 1):
                at_chunk_start = M[:, i, h].copy()          # M_ℓ as it stood when chunk c began
                for t in range((c - 1) * C, min(c * C, T)):
                    M[0, i, h] = gdn2_step_numpy(M[0, i, h], k[i, t, h], v[i, t, h], g[i, t, h], b[i, t, h],
                                                 w[i, t, h])
                    λ = softmax(r[i, t, h])
                    o[i, t, h] = λ[0] * scale * (q[i, t, h, 0] @ M[0, i, h])
                    for ℓ in range(1, L):
                        o[i, t, h] += λ[ℓ] * scale * (q[i, t, h, ℓ] @ at_chunk_start[ℓ])
                if c * C > T:
                    continue                                 # a partial last chunk never fires
                for ℓ in range(1, L):
                    level = levels[ℓ - 1]
                    if c % level.interval == 0:
                        head_params = {name: p[h] for name, p in params[ℓ - 1].items()}
                        κ, ν, β, ω, γ = twins[ℓ - 1](M[ℓ - 1, i, h], head_params, level.reduction)
                        M[ℓ, i, h] = _promote(M[ℓ, i, h], κ, ν, β, ω, γ)
    return o, [M[ℓ] for ℓ in range(L)]
