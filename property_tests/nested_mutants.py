"""Deliberately broken promote / scheme / Nested GDN-2 implementations.

Each mutant has the signature of the function it breaks and differs from it in one
named way. The nested mutants are built by ``nested_variant``, a compact
re-implementation of ``reference.nested.naive_nested_gdn2`` with one knob per
mutation; ``nested_variant()`` with no knob turned equals the reference (a test
checks that, so each mutant differs from the reference in exactly its knob).
"""
from __future__ import annotations

import numpy as np
import torch

from reference.gdn2 import gdn2_read, gdn2_step
from reference.gdn2_numpy import gdn2_step_numpy
from reference.nested import CHUNK_SIZE, validate_nested_inputs
from reference.promote import promote
from reference.promote_numpy import l2norm_numpy, sigmoid, softplus
from reference.schemes import gates, get_scheme, l2norm, reduce_log_decay


# --- promote mutants (signature of reference.promote.promote) -------------------------

def promote_pairs_sequential(M, κ, ν, β, ω, γ):
    """Decays once, then applies the pairs ONE AFTER ANOTHER: pair i erases from the state
    that already holds the writes of pairs < i (not simultaneous)."""
    M = torch.exp(γ)[..., :, None] * M
    for i in range(κ.shape[-2]):
        κ_i, ν_i, β_i, ω_i = κ[..., i, :], ν[..., i, :], β[..., i, :], ω[..., i, :]
        e = torch.einsum("...k,...kv->...v", β_i * κ_i, M)
        M = M + κ_i[..., :, None] * (ω_i * ν_i - e)[..., None, :]
    return M


def promote_erase_without_decay(M, κ, ν, β, ω, γ):
    """Erases what the pairs read from the UNDECAYED state: (β ⊙ κ) M instead of (β ⊙ κ) M'."""
    M_decayed = torch.exp(γ)[..., :, None] * M
    return M_decayed + κ.transpose(-1, -2) @ (ω * ν - (β * κ) @ M)


def promote_erase_added(M, κ, ν, β, ω, γ):
    """Sign slip: the erase term is added, M' + κ^T (ω ⊙ ν + (β ⊙ κ) M')."""
    M_decayed = torch.exp(γ)[..., :, None] * M
    return M_decayed + κ.transpose(-1, -2) @ (ω * ν + (β * κ) @ M_decayed)


def promote_decay_sign_flipped(M, κ, ν, β, ω, γ):
    """Sign slip in the decay: M' = diag(exp(-γ)) M, which grows the state (γ ≤ 0)."""
    M_decayed = torch.exp(-γ)[..., :, None] * M
    return M_decayed + κ.transpose(-1, -2) @ (ω * ν - (β * κ) @ M_decayed)


def promote_write_gate_dropped(M, κ, ν, β, ω, γ):
    """Writes ν instead of ω ⊙ ν."""
    M_decayed = torch.exp(γ)[..., :, None] * M
    return M_decayed + κ.transpose(-1, -2) @ (ν - (β * κ) @ M_decayed)


def promote_sequential_made_simultaneous(M, κ, ν, β, ω, γ_pairs):
    """A ``promote_sequential`` that is secretly the simultaneous update (γ = Σ_i γ_i):
    order-invariant, so the 'sequential differs under permutation' test must catch it."""
    return promote(M, κ, ν, β, ω, γ_pairs.sum(-2))


def promote_numpy_pairs_sequential(M, κ, ν, β, ω, γ):
    """NumPy twin of ``promote_pairs_sequential`` (one head)."""
    M = np.exp(γ)[:, None] * np.asarray(M, dtype=np.float64)
    for i in range(κ.shape[0]):
        M = gdn2_step_numpy(M, κ[i], ν[i], np.zeros_like(γ), β[i], ω[i])
    return M


# --- scheme (probe) mutants (signature of a registered probe) --------------------------

def _learned_or_merge(M_below, params, reduce, gates_fn=gates):
    if "Q" in params:
        ν = params["Q"] @ M_below
        κ = l2norm(ν @ params["W_K"])
    else:
        ν = M_below
        K = M_below.shape[-2]
        κ = torch.eye(K, dtype=M_below.dtype).expand(*M_below.shape[:-1], K)
    β, ω, γ_i = gates_fn(ν, params)
    return κ, ν, β, ω, reduce(γ_i)


def probe_gamma_sum(M_below, params, reduction="mean"):
    """γ reduced with SUM whatever ``reduction`` says (the default is mean)."""
    return _learned_or_merge(M_below, params, lambda γ_i: γ_i.sum(-2))


def probe_gamma_mean(M_below, params, reduction="mean"):
    """γ reduced with MEAN whatever ``reduction`` says (``"sum"`` is ignored)."""
    return _learned_or_merge(M_below, params, lambda γ_i: γ_i.mean(-2))


# --- gate nonlinearity mutants ----------------------------------------------------------
# Each replaces a nonlinearity by its behaviour near x = 0, where ``make_levels``' default
# (gate_scale = 1) puts every pre-activation: they are only far from the truth at large |x|
# (``ngdn.checks.nested.PROMOTE_LARGE_GATE_SCALE``, ``NESTED_LARGE_GATE_SCALE``).

def softplus_linearised(x):
    """``log 2 + x/2``: softplus's tangent at 0 (exact to O(x²/8))."""
    return np.log(2.0) + 0.5 * x


def sigmoid_linearised(x):
    """``½ + x/4``: the logistic sigmoid's tangent at 0 (exact to O(x³/48))."""
    return 0.5 + 0.25 * x


class _SoftplusGradHalf(torch.autograd.Function):
    """softplus forward, but the derivative σ(x) replaced by its value at 0, ½."""

    @staticmethod
    def forward(ctx, x):
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx, grad):
        return 0.5 * grad


def _gates_with(sigmoid_fn=torch.sigmoid, softplus_fn=torch.nn.functional.softplus):
    def gates_fn(ν, params):
        return (sigmoid_fn(ν @ params["W_beta"]), sigmoid_fn(ν @ params["W_omega"]),
                -softplus_fn(ν @ params["W_gamma"]))
    return gates_fn


def _probe_with(gates_fn):
    def probe(M_below, params, reduction="mean"):
        return _learned_or_merge(M_below, params, lambda γ_i: reduce_log_decay(γ_i, reduction), gates_fn)
    return probe


probe_softplus_linearised = _probe_with(_gates_with(softplus_fn=softplus_linearised))
probe_sigmoid_linearised = _probe_with(_gates_with(sigmoid_fn=sigmoid_linearised))
probe_softplus_grad_half = _probe_with(_gates_with(softplus_fn=_SoftplusGradHalf.apply))


def numpy_probe_variant(scheme, sigmoid_fn=sigmoid, softplus_fn=softplus):
    """A ``reference.promote_numpy`` scheme twin (one head) with its nonlinearities swapped."""
    def probe(M_below, params, reduction="mean"):
        if scheme == "learned":
            ν = params["Q"] @ M_below
            κ = l2norm_numpy(ν @ params["W_K"])
        else:
            ν = M_below.copy()
            κ = np.eye(M_below.shape[0])
        β = sigmoid_fn(ν @ params["W_beta"])
        ω = sigmoid_fn(ν @ params["W_omega"])
        γ_i = -softplus_fn(ν @ params["W_gamma"])
        γ = γ_i.mean(axis=0) if reduction == "mean" else γ_i.sum(axis=0)
        return κ, ν, β, ω, γ
    return probe


NUMPY_PROBE_MUTANTS = {
    "softplus_linearised": lambda scheme: numpy_probe_variant(scheme, softplus_fn=softplus_linearised),
    "sigmoid_linearised": lambda scheme: numpy_probe_variant(scheme, sigmoid_fn=sigmoid_linearised),
}


# --- nested mutants --------------------------------------------------------------------

def nested_variant(promote_fn=promote, probe_fn=None, read="chunk_start", partial_fires=False,
                   chunk_base=1, decreasing_levels=False, softmax_dim=-1, detach=()):
    """A Nested GDN-2 with one knob per mutation (defaults: the reference).

    read: ``"chunk_start"`` (CONTRACT), ``"after_firing"`` (chunk c's tokens read M_ℓ after chunk c's
    own firing) or ``"one_chunk_late"`` (chunk c reads M_ℓ as it stood when chunk c-1 began, so a
    firing becomes visible one chunk late). partial_fires: a partial last chunk fires too.
    chunk_base: 0 numbers chunks from 0 (fires when (c-1) mod f == 0). decreasing_levels: fires
    ℓ = L-1..1. softmax_dim: the router softmax axis of ``r[:, t]`` ``[B, H, L]``. detach: names
    of inputs whose gradient is dropped (``"params"``, ``"r"``, ``"initial_states"``).
    """
    def nested(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False,
               chunk_size=CHUNK_SIZE):
        B, T, H, L, K, V = validate_nested_inputs(q, k, v, g, b, w, r, levels, scale, initial_states, chunk_size)
        scale = K ** -0.5 if scale is None else scale
        if "r" in detach:
            r = r.detach()
        C, N = chunk_size, -(-T // chunk_size)
        states = [None] * L if initial_states is None else initial_states
        M = [q.new_zeros(B, H, K, V) if s is None else
             (s.detach() if "initial_states" in detach else s).to(q.dtype) for s in states]
        params = [{n: (p.detach() if "params" in detach else p).to(q.dtype) for n, p in lv.params.items()}
                  for lv in levels]
        probes = [probe_fn or get_scheme(lv.scheme).probe for lv in levels]
        previous_start = list(M)
        o = []
        for c in range(1, N + 1):
            chunk_start = list(M)
            seen = previous_start if read == "one_chunk_late" else chunk_start
            level0, weights = [], []
            for t in range((c - 1) * C, min(c * C, T)):
                M[0] = gdn2_step(M[0], k[:, t], v[:, t], g[:, t], b[:, t], w[:, t])
                weights.append(torch.softmax(r[:, t], dim=softmax_dim))
                level0.append(gdn2_read(M[0], q[:, t, :, 0], scale))
            if c * C <= T or partial_fires:
                order = range(L - 1, 0, -1) if decreasing_levels else range(1, L)
                for ℓ in order:
                    if (c - 1 + chunk_base) % levels[ℓ - 1].interval == 0:
                        κ, ν, β, ω, γ = probes[ℓ - 1](M[ℓ - 1], params[ℓ - 1], levels[ℓ - 1].reduction)
                        M[ℓ] = promote_fn(M[ℓ], κ, ν, β, ω, γ)
            if read == "after_firing":
                seen = M
            for j, t in enumerate(range((c - 1) * C, min(c * C, T))):
                o.append(sum(weights[j][..., ℓ, None] * (level0[j] if ℓ == 0 else
                                                          gdn2_read(seen[ℓ], q[:, t, :, ℓ], scale))
                             for ℓ in range(L)))
            previous_start = chunk_start
        return torch.stack(o, dim=1), (M if output_final_state else None)

    return nested


unmutated_nested = nested_variant()
nested_pairs_sequential = nested_variant(promote_fn=promote_pairs_sequential)
nested_erase_without_decay = nested_variant(promote_fn=promote_erase_without_decay)
nested_gamma_sum = nested_variant(probe_fn=probe_gamma_sum)
nested_read_after_firing = nested_variant(read="after_firing")
nested_visible_one_chunk_late = nested_variant(read="one_chunk_late")
nested_partial_chunk_fires = nested_variant(partial_fires=True)
nested_zero_based_chunks = nested_variant(chunk_base=0)
nested_decreasing_levels = nested_variant(decreasing_levels=True)
nested_softmax_over_heads = nested_variant(softmax_dim=-2)
nested_params_detached = nested_variant(detach=("params",))
nested_router_detached = nested_variant(detach=("r",))
nested_initial_states_detached = nested_variant(detach=("initial_states",))
nested_softplus_linearised = nested_variant(probe_fn=probe_softplus_linearised)
nested_sigmoid_linearised = nested_variant(probe_fn=probe_sigmoid_linearised)
nested_softplus_grad_half = nested_variant(probe_fn=probe_softplus_grad_half)

NESTED_MUTANTS = {
    "pairs_sequential": nested_pairs_sequential,
    "erase_without_decay": nested_erase_without_decay,
    "gamma_sum_not_mean": nested_gamma_sum,
    "read_after_firing": nested_read_after_firing,
    "visible_one_chunk_late": nested_visible_one_chunk_late,
    "partial_chunk_fires": nested_partial_chunk_fires,
    "zero_based_chunk_numbering": nested_zero_based_chunks,
    "decreasing_level_order": nested_decreasing_levels,
    "router_softmax_over_heads": nested_softmax_over_heads,
}

# Gate nonlinearities replaced by their tangent at 0: shown caught on gate_scale = NESTED_LARGE_GATE_SCALE
# draws (test_nested_reference.py), not on MUTANT_CASE.
GATE_MUTANTS = {
    "softplus_linearised": nested_softplus_linearised,
    "sigmoid_linearised": nested_sigmoid_linearised,
}


def mutant_name(fn) -> str:
    for name, m in {**NESTED_MUTANTS, **GATE_MUTANTS}.items():
        if m is fn:
            return name
    return getattr(fn, "__name__", repr(fn))

