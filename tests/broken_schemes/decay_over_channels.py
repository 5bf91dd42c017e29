"""BROKEN ON PURPOSE: the README's ``fixed_address`` with its query bank called ``P`` and the
per-pair log-decays reduced over the channel axis instead of the pair axis, giving ``γ [..., H, n]``
where ``[..., H, K]`` is due. At ``n = K`` the shapes coincide and every property passes; the query
count must be read from the declared shapes (axis 1 of ``P``), not from a parameter named ``Q``, for
the battery to draw ``n < K``, where ``contract`` fails on γ's shape."""
from reference.schemes import gates, l2norm, register_scheme


def decay_over_channels_shapes(H, K, V, n):
    return {"P": (H, n, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}


def decay_over_channels(M_below, params, reduction="mean"):
    ν = params["P"] @ M_below
    κ = l2norm(params["P"]).expand(*ν.shape[:-1], -1)
    β, ω, γ_i = gates(ν, params)
    γ = γ_i.mean(-1) if reduction == "mean" else γ_i.sum(-1)    # should reduce over the pairs (-2)
    return κ, ν, β, ω, γ


register_scheme("broken_decay_over_channels", decay_over_channels, decay_over_channels_shapes)
