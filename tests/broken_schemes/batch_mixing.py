"""BROKEN ON PURPOSE: ``learned`` whose retrieved values are averaged over the batch axis, so one
batch element's snapshot leaks into every other's pairs. With one batch element it is ``learned``
exactly, and batched snapshots ``[B, F, H, K, V]`` still equal per-firing calls; ``independence``
(batch and head independence, B = H = 2) fails."""
from reference.schemes import gates, l2norm, learned_parameter_shapes, reduce_log_decay, register_scheme


def batch_mixing(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    if ν.dim() > 3:                              # [B, ..., H, n, V]: mixes the batch (should not)
        ν = ν.mean(0, keepdim=True).expand_as(ν)
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_batch_mixing", batch_mixing, learned_parameter_shapes)
