"""BROKEN ON PURPOSE: ``learned`` that always reduces its pairs' log-decays by their mean, whatever
``reduction`` a level asks for: a ``Level(..., reduction="sum")`` silently gets the mean. ``contract``
fails (γ the same under both reductions with n > 1 pairs)."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def ignores_reduction(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i)


register_scheme("broken_ignores_reduction", ignores_reduction, learned_parameter_shapes)
