"""BROKEN ON PURPOSE: the log-decay ``γ = mean_i(ν W_γ)_i`` without the ``-softplus``, so it can be
positive (the "decay" amplifies). ``contract`` (γ ≤ 0) fails."""
from reference.schemes import gates, learned_parameter_shapes, l2norm, register_scheme


def positive_gamma(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, _ = gates(ν, params)
    γ_i = ν @ params["W_gamma"]                  # should be -softplus(ν W_γ)
    return κ, ν, β, ω, γ_i.mean(-2) if reduction == "mean" else γ_i.sum(-2)


register_scheme("broken_positive_gamma", positive_gamma, learned_parameter_shapes)
