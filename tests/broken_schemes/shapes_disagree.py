"""BROKEN ON PURPOSE: declares ``W_K`` as ``[H, K, K]`` and an unused ``W_extra``, but the probe
multiplies ``ν [n, V]`` by ``W_K`` (needs ``[H, V, K]``) and never reads ``W_extra``. At K = V
the first goes unnoticed; ``contract`` (draws with K ≠ V, every parameter used) fails."""
from reference.schemes import gates, l2norm, reduce_log_decay, register_scheme


def shapes_disagree_shapes(H, K, V, n):
    return {"Q": (H, n, K), "W_K": (H, K, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K),
            "W_extra": (H, V, V)}


def shapes_disagree(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_shapes_disagree", shapes_disagree, shapes_disagree_shapes)
