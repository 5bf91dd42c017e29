"""Promotion schemes and promote in NumPy float64: the twin of ``reference.schemes`` and
``reference.promote`` (SPEC.md section 2).

Written independently of the PyTorch reference: one head at a time (``M [K, V]``,
parameters without the head axis), and the simultaneous update as an explicit sum
over pairs that all read the same decayed state ``M'``.
"""
from __future__ import annotations

import numpy as np

from reference.gdn2_numpy import gdn2_step_numpy


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


SCHEMES_NUMPY = {"learned": learned_numpy, "merge": merge_numpy, "bounded_erase": bounded_erase_numpy}


def pair_log_decays_numpy(ν, params):
    """The per-pair log-decays ``γ_i = -softplus(ν W_γ)_i`` ``[n, K]`` (for the sequential variant)."""
    return -softplus(ν @ params["W_gamma"])


def promote_numpy(M, κ, ν, β, ω, γ):
    """The simultaneous update on one head: every pair reads the same decayed ``M'``.

        M_new = M' + Σ_i κ_i ⊗ (ω_i ⊙ ν_i - (β_i ⊙ κ_i)^T M'),   M' = diag(e^γ) M
    """
    M_decayed = np.exp(γ)[:, None] * np.asarray(M, dtype=np.float64)
    M_new = M_decayed.copy()
    for i in range(κ.shape[0]):
        M_new += np.outer(κ[i], ω[i] * ν[i] - (β[i] * κ[i]) @ M_decayed)
    return M_new


def promote_sequential_numpy(M, κ, ν, β, ω, γ_pairs):
    """REJECTED DESIGN (tests only): the pairs as successive GDN-2 token steps, each with
    its own log-decay ``γ_pairs[i]``; pair i sees the writes of pairs < i."""
    M = np.array(M, dtype=np.float64)
    for i in range(κ.shape[0]):
        M = gdn2_step_numpy(M, κ[i], ν[i], γ_pairs[i], β[i], ω[i])
    return M
