"""BROKEN ON PURPOSE: ``learned`` that normalises its query bank in place (``Q`` rescaled to unit rows
on every call): the parameters drift from call to call. ``contract`` fails naming the parameter."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def inplace_params(M_below, params, reduction="mean"):
    Q = params["Q"]
    with __import__("torch").no_grad():
        Q.mul_(2.0)
    ν = Q @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_inplace_params", inplace_params, learned_parameter_shapes)
