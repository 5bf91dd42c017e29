"""BROKEN ON PURPOSE: normalises keys by ``‖x‖`` without the ``+1e-6`` of ``l2norm``, so a zero
snapshot gives ``0/0 = NaN`` keys. ``contract`` (finite on finite inputs) fails."""
from reference.schemes import gates, learned_parameter_shapes, reduce_log_decay, register_scheme


def nan_on_zero(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    x = ν @ params["W_K"]
    κ = x / x.norm(dim=-1, keepdim=True)         # should be l2norm(x)
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_nan_on_zero", nan_on_zero, learned_parameter_shapes)
