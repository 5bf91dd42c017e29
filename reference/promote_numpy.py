"""Promotion schemes and promote in NumPy float64: the twin of ``reference.schemes`` and
``reference.promote`` (docs/CONTRACT.md section 2).

Written independently of the PyTorch reference: one head at a time (``M [K, V]``,
parameters without the head axis), and the simultaneous update as an explicit sum
over pairs that all read the same decayed state ``M'``.

The public functions (``SCHEMES_NUMPY``, ``promote_numpy``, ``promote_sequential_numpy``) check
their inputs, and the schemes their outputs, with the PyTorch reference's checks (CONTRACT "Errors":
the NumPy twins share them), on a head axis of one; the nested twin, which checks its inputs once
for the whole call, runs the unchecked forms (``unchecked_twin``, ``_promote``) in its loops.
"""
from __future__ import annotations

import functools

import numpy as np

from reference.gdn2_numpy import gdn2_step_numpy
from reference.promote import check_promote_inputs
from reference.schemes import check_probe_inputs, check_probe_outputs
from reference.validation import as_checkable


def sigmoid(x):
    # e^-x overflows to inf for x < -709 (large states, e.g. 1e3-scale ones times W_β); 1/(1 + inf) = 0
    # is then the right value (σ(x) < 1e-308), so the overflow warning is silenced, not the value changed.
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)           # log(1 + e^x), stable for large |x|


def l2norm_numpy(x):
    return x / np.sqrt(np.sum(x ** 2, axis=-1, keepdims=True) + 1e-6)


def learned_numpy(M_below, params, reduction="mean"):
    """``learned`` on one head: ``M_below [K, V]``; ``params`` Q ``[n, K]``, W_K ``[V, K]``,
    W_beta ``[V, K]``, W_omega ``[V, V]``, W_gamma ``[V, K]``. Returns κ, ν, β, ω ``[n, ·]``, γ ``[K]``."""
    ν = params["Q"] @ M_below
    κ = l2norm_numpy(ν @ params["W_K"])
    β = sigmoid(ν @ params["W_beta"])
    ω = sigmoid(ν @ params["W_omega"])
    γ_i = -softplus(ν @ params["W_gamma"])
    γ = γ_i.mean(axis=0) if reduction == "mean" else γ_i.sum(axis=0)
    return κ, ν, β, ω, γ


def merge_numpy(M_below, params, reduction="mean"):
    """``merge`` on one head: ``n = K``, ``κ = I``, ``ν = M_below``, gates as in ``learned``."""
    K = M_below.shape[0]
    κ = np.eye(K)
    ν = M_below.copy()
    β = sigmoid(ν @ params["W_beta"])
    ω = sigmoid(ν @ params["W_omega"])
    γ_i = -softplus(ν @ params["W_gamma"])
    γ = γ_i.mean(axis=0) if reduction == "mean" else γ_i.sum(axis=0)
    return κ, ν, β, ω, γ


def bounded_erase_numpy(M_below, params, reduction="mean"):
    """``bounded_erase`` on one head: ``learned``'s ν, κ, ω, γ; one erase gate per pair,
    ``β_i = mean_k σ(ν W_β)_ik / max(1, Σ_j |κ_i · κ_j|)`` on every channel."""
    κ, ν, β_channels, ω, γ = learned_numpy(M_below, params, reduction)
    overlap = np.abs(κ @ κ.T).sum(axis=1)
    β_i = β_channels.mean(axis=1) / np.maximum(1.0, overlap)
    return κ, ν, np.repeat(β_i[:, None], κ.shape[1], axis=1), ω, γ


def _heads_of_one(name, x):
    """A one-head NumPy input as the PyTorch checks see it: a torch view with a head axis of one."""
    t = as_checkable(name, x)
    return t if t is None else t.unsqueeze(0)


def _checked_scheme(name, probe):
    """``probe`` (one head) with the PyTorch probe's input and output checks; errors name ``name``."""
    @functools.wraps(probe)
    def checked(M_below, params, reduction="mean"):
        if not isinstance(params, dict):
            raise TypeError(f"scheme {name!r}: params must be a dict of arrays, got {type(params).__name__}")
        M_t = _heads_of_one("M_below", M_below)
        params_t = {key: _heads_of_one(f"params[{key!r}]", p) for key, p in params.items()}
        check_probe_inputs(name, M_t, params_t, reduction)
        outputs = probe(M_below, params, reduction)
        check_probe_outputs(name, M_t, params_t, tuple(_heads_of_one(label, x) for label, x in
                                                        zip(("κ", "ν", "β", "ω", "γ"), outputs)))
        return outputs
    checked.unchecked = probe
    return checked


def unchecked_twin(name: str):
    """``SCHEMES_NUMPY[name]`` without the checks this module wraps around the built-ins' twins (a
    twin registered from a scheme file is returned as registered)."""
    if name not in SCHEMES_NUMPY:
        raise ValueError(f"scheme {name!r} has no NumPy twin in SCHEMES_NUMPY (have {sorted(SCHEMES_NUMPY)})")
    twin = SCHEMES_NUMPY[name]
    return getattr(twin, "unchecked", twin)


SCHEMES_NUMPY = {name: _checked_scheme(name, probe) for name, probe in
                 (("learned", learned_numpy), ("merge", merge_numpy), ("bounded_erase", bounded_erase_numpy))}
BUILTIN_TWINS = dict(SCHEMES_NUMPY)      # as registered here (a scheme file may add or replace entries)


def pair_log_decays_numpy(ν, params):
    """The per-pair log-decays ``γ_i = -softplus(ν W_γ)_i`` ``[n, K]`` (for the sequential variant)."""
    return -softplus(ν @ params["W_gamma"])


def promote_numpy(M, κ, ν, β, ω, γ):
    """The simultaneous update on one head: every pair reads the same decayed ``M'``.

        M_new = M' + Σ_i κ_i ⊗ (ω_i ⊙ ν_i - (β_i ⊙ κ_i)^T M'),   M' = diag(e^γ) M

    ``M [K, V]``, ``κ, β [n, K]``, ``ν, ω [n, V]``, ``γ [K]``, ``n ≤ K`` (``promote``'s checks)."""
    check_promote_inputs(*(as_checkable(name, x) for name, x in
                           (("M", M), ("κ", κ), ("ν", ν), ("β", β), ("ω", ω), ("γ", γ))))
    return _promote(M, κ, ν, β, ω, γ)


def _promote(M, κ, ν, β, ω, γ):
    """``promote_numpy`` without its checks (the nested twin's loop; its inputs checked once)."""
    M_decayed = np.exp(γ)[:, None] * np.asarray(M, dtype=np.float64)
    M_new = M_decayed.copy()
    for i in range(κ.shape[0]):
        M_new += np.outer(κ[i], ω[i] * ν[i] - (β[i] * κ[i]) @ M_decayed)
    return M_new


def promote_sequential_numpy(M, κ, ν, β, ω, γ_pairs):
    """REJECTED DESIGN (tests only): the pairs as successive GDN-2 token steps, each with
    its own log-decay ``γ_pairs[i]``; pair i sees the writes of pairs < i."""
    check_promote_inputs(*(as_checkable(name, x) for name, x in
                           (("M", M), ("κ", κ), ("ν", ν), ("β", β), ("ω", ω), ("γ_pairs", γ_pairs))),
                         γ_name="γ_pairs", γ_pairs=True)
    M = np.array(M, dtype=np.float64)
    for i in range(κ.shape[0]):
        M = gdn2_step_numpy(M, κ[i], ν[i], γ_pairs[i], β[i], ω[i])
    return M
