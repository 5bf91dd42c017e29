"""Promote, one firing of a level ℓ ≥ 1: docs/CONTRACT.md section 2, in PyTorch.

Every pair comes from one snapshot and acts on the state as it stood before the
firing: the pairs are written **simultaneously**.

    M' = diag(exp(γ)) M                           # decay once per firing
    M_new = M' - κ^T (β ⊙ κ) M' + κ^T (ω ⊙ ν)      # erase, then write every pair
          = M' + κ^T (ω ⊙ ν - (β ⊙ κ) M')

``promote_sequential`` is the operation the design REJECTS (pairs applied one
after another as GDN-2 token steps, each with its own decay); it is kept only so
the tests can show that it differs.

Shapes: ``M [..., K, V]``, ``κ, β [..., n, K]``, ``ν, ω [..., n, V]``, ``γ [..., K]``
with the same leading dims (e.g. ``[B, H]``), ``n ≤ K``. Differentiable; computes
in the inputs' dtype.
"""
from __future__ import annotations

import torch

from reference.gdn2 import gdn2_step
from reference.validation import FLOAT_DTYPES, check_same_device, check_same_dtype, check_tensor


def check_promote_inputs(M, κ, ν, β, ω, γ, γ_name="γ", γ_pairs=False):
    """Shapes as in the module docstring; one dtype, one device; ``n ≤ K``."""
    named = (("M", M), ("κ", κ), ("ν", ν), ("β", β), ("ω", ω), (γ_name, γ))
    for name, x in named:
        check_tensor(name, x, dtypes=FLOAT_DTYPES)
    if M.dim() < 2:
        raise ValueError(f"M must have shape [..., K, V], got {tuple(M.shape)}")
    *lead, K, V = M.shape
    lead = tuple(lead)
    if κ.dim() != M.dim():
        raise ValueError(f"κ must have shape [..., n, K] = {lead + ('n', K)}, got {tuple(κ.shape)}")
    n = κ.shape[-2]
    if n > K:
        raise ValueError(f"κ holds n = {n} pairs but K = {K}: more pairs than K is not allowed (n ≤ K)")
    expected = {"κ": lead + (n, K), "ν": lead + (n, V), "β": lead + (n, K), "ω": lead + (n, V),
                γ_name: lead + ((n, K) if γ_pairs else (K,))}
    layouts = {"κ": "[..., n, K]", "ν": "[..., n, V]", "β": "[..., n, K]", "ω": "[..., n, V]",
               γ_name: "[..., n, K]" if γ_pairs else "[..., K]"}
    for name, x in named[1:]:
        if tuple(x.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {layouts[name]} = {expected[name]}, got {tuple(x.shape)}")
    check_same_dtype(named)
    check_same_device(named)


def promote(M, κ, ν, β, ω, γ):
    """The simultaneous update: all ``n`` pairs act on ``M`` as it stood before the firing."""
    check_promote_inputs(M, κ, ν, β, ω, γ)
    M_decayed = torch.exp(γ)[..., :, None] * M                  # M' = diag(exp(γ)) M
    erase = (β * κ) @ M_decayed                                 # (β ⊙ κ) M'          [n, V]
    return M_decayed + κ.transpose(-1, -2) @ (ω * ν - erase)    # M' + κ^T (ω ⊙ ν - (β ⊙ κ) M')


def promote_sequential(M, κ, ν, β, ω, γ_pairs):
    """REJECTED DESIGN, kept for the tests: the pairs applied one after another as GDN-2
    token steps (``k=κ_i, v=ν_i, b=β_i, w=ω_i, g=γ_i``), each with its own log-decay
    ``γ_pairs [..., n, K]``. Pair i sees the writes of pairs < i, so the result depends
    on the order of the pairs; this is NOT the promote of CONTRACT section 2."""
    check_promote_inputs(M, κ, ν, β, ω, γ_pairs, γ_name="γ_pairs", γ_pairs=True)
    for i in range(κ.shape[-2]):
        M = gdn2_step(M, κ[..., i, :], ν[..., i, :], γ_pairs[..., i, :], β[..., i, :], ω[..., i, :])
    return M
