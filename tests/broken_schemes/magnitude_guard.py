"""BROKEN ON PURPOSE: ``learned`` with an "overflow guard" that rescales the snapshot when its largest
entry over the whole tensor passes 1e5: below that it is ``learned`` exactly, above it one batch
element's (head's) large state rescales every other's. ``independence`` fails (another element's
snapshot replaced by a huge one)."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def magnitude_guard(M_below, params, reduction="mean"):
    peak = M_below.abs().amax()
    if peak > 1e5:
        M_below = M_below / peak
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_magnitude_guard", magnitude_guard, learned_parameter_shapes)
