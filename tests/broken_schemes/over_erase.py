"""BROKEN ON PURPOSE: ``merge`` with an erase gate ``β = 3σ(ν W_β)`` in ``(0, 3)``. Row i of the state
is scaled by ``(1 − β_ii) e^γ``; with ``β_ii`` near 3 that is about ``−2 e^γ``, which the decay hides at
``make_levels``' scales (``e^γ ≈ ½``) but not when the decay is slow. ``contract`` (gates in [0, 1]) fails,
and ``stability`` reports it EXPANSIVE with slow decays."""
import torch

from reference.schemes import gates, merge_parameter_shapes, reduce_log_decay, register_scheme


def over_erase(M_below, params, reduction="mean"):
    K = M_below.shape[-2]
    ν = M_below
    κ = torch.eye(K, dtype=M_below.dtype, device=M_below.device).expand(*M_below.shape[:-1], K)
    β, ω, γ_i = gates(ν, params)
    return κ, ν, 3 * β, ω, reduce_log_decay(γ_i, reduction)     # should be β


register_scheme("broken_over_erase", over_erase, merge_parameter_shapes)
