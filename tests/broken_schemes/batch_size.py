"""BROKEN ON PURPOSE: ``learned`` whose retrieved values are divided by the square root of the
snapshot's first axis, meant as the head count but the batch's size. Replacing a batch element's
values changes no other element (every element is divided alike), so only a batch of another size
shows it; ``independence`` (batch b alone against the batch of two) fails."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def batch_size(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below / M_below.shape[0] ** 0.5
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_batch_size", batch_size, learned_parameter_shapes)
