"""The example scheme of docs/schemes.md ("Adding a promotion scheme") and of README's "Add a scheme
or an op", exactly as written there:
``ngdn scheme check examples/fixed_address.py``."""
from reference.schemes import gates, l2norm, reduce_log_decay, register_scheme

def fixed_address_shapes(H, K, V, n):
    return {"Q": (H, n, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}

def fixed_address(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below                             # read at the query addresses
    κ = l2norm(params["Q"]).expand(*ν.shape[:-1], -1)     # write back at the same addresses
    β, ω, γ_i = gates(ν, params)                          # σ(ν W_β), σ(ν W_ω), -softplus(ν W_γ)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)

register_scheme("fixed_address", fixed_address, fixed_address_shapes)
# Level("fixed_address", interval, params), make_levels(..., scheme="fixed_address") now work.
