"""BROKEN ON PURPOSE: a query bank ``P [H, n + 1, K]`` whose last row is a "null" query the probe
drops. No declared axis has size ``n``, so no tool can read the query count back from the
parameters (``make_levels(query_counts=[4])`` would build 5 rows and the probe return 4 pairs):
``register_scheme`` refuses it, and ``ngdn scheme check`` exits 2 naming the cause."""
from reference.schemes import gates, l2norm, reduce_log_decay, register_scheme


def unreadable_query_count_shapes(H, K, V, n):
    return {"P": (H, n + 1, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}


def unreadable_query_count(M_below, params, reduction="mean"):
    P = params["P"][..., :-1, :]                 # the last row is never used as a query
    ν = P @ M_below
    κ = l2norm(P).expand(*ν.shape[:-1], -1)
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


register_scheme("broken_unreadable_query_count", unreadable_query_count, unreadable_query_count_shapes)
