"""BROKEN ON PURPOSE: ``learned`` that guards against overflow by clamping its snapshot in place
(``M_below.clamp_``, at 1e30: no value of a finite battery snapshot changes). The outputs are the
same call after call, yet the probe writes to the state it is handed: the nested reference passes
it the live level state, and autograd refuses the backward through it. ``contract`` fails naming
the in-place change."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def inplace_snapshot(M_below, params, reduction="mean"):
    M_below.clamp_(-1e30, 1e30)                # should be M_below.clamp(-1e30, 1e30), a new tensor
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_inplace_snapshot", inplace_snapshot, learned_parameter_shapes)
