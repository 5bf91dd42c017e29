"""BROKEN ON PURPOSE: reads the snapshot transposed (``M_below^T`` instead of ``M_below``), with a
query bank sized for it. At K = V it runs and looks plausible; at K ≠ V its outputs cannot
have the CONTRACT shapes, so ``contract`` fails."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def transposed_snapshot(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below.transpose(-1, -2)  # should be Q M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_transposed_snapshot", transposed_snapshot, learned_parameter_shapes)
