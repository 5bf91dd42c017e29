"""Fenwick level router properties (CONTRACT section 5) as functions of (implementation, draw) -> errors.

Each property test runs one of these on the real implementation and asserts
every error is within tolerance; the mutation tests run the same function on a
deliberately broken implementation (``fenwick_mutants.py``) and assert it fails.
Every check returns ``ngdn.tolerances.compare``'s ``{quantity: (error, bound)}``.
"""
from __future__ import annotations

import torch

import optimized  # noqa: F401  (chooses the device mode before fla is imported)
from fla.ops.log_linear_attn.naive import naive_log_linear_attn  # noqa: E402
from ngdn.fenwick_inputs import fenwick_gdn2_inputs, fenwick_inputs, ones_level_scales
from ngdn.inputs import as_reference, cast
from ngdn.tolerances import compare
from optimized import chunk_fenwick, triton_mode
from reference import (naive_fenwick, naive_fenwick_gdn2, naive_fenwick_gdn2_numpy, naive_fenwick_numpy,
                       naive_gdn2, quadratic_fenwick, quadratic_fenwick_numpy)

INPUTS = ("q", "k", "v", "g", "level_scales")
GDN2_INPUTS = ("q", "k", "v", "g", "b", "w", "level_scales")


def grad_or_zero(x: torch.Tensor) -> torch.Tensor:
    return x.grad if x.grad is not None else torch.zeros_like(x)


def output_of(result):
    """``o`` from an implementation that returns ``o`` or ``(o, state)``."""
    return result[0] if isinstance(result, tuple) else result


def output_and_grads(fn, x: dict, names=INPUTS, **kwargs):
    """Run ``fn`` on fresh float64 leaves of ``x[names]``; loss ``Σ o·do``.
    Returns ``{"output": o, "d<name>": grad, ...}``."""
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in names}
    o = output_of(fn(*leaves.values(), **kwargs))
    (o * x["do"]).sum().backward()
    out = {"output": o.detach()}
    out.update({f"d{n}": grad_or_zero(leaf) for n, leaf in leaves.items()})
    return out


def paired(actual: dict, expected: dict) -> dict:
    return {q: (actual[q], expected[q]) for q in expected}


def without_dg_if_extreme(pairs: dict, regime: str) -> dict:
    """The pairs, less ``dg`` in the extreme regime. There the masked forms (``quadratic_fenwick``
    and fla's ``naive_log_linear_attn``, both ``exp(G_t - G_s)`` through a cumulative sum ``G``)
    get ``dg`` as a reverse cumulative sum of ``dG``, in which each diagonal term ``(t, t)`` (weight
    ``e^0 = 1``) enters twice with opposite signs: what is left has an absolute error of about
    1e-16 · |diagonal terms|, while under strong forgets (g ≈ -20 … -60) the true ``dg`` is of size
    ``e^g``. Measured: relative ``dg`` error up to 9e-2 in both masked forms (they agree with each
    other; the per-token ``naive_fenwick`` differentiates ``e^{g_t}`` directly and has no such
    cancellation). Output, dq, dk, dv and dλ stay within 1.4e-14 and are still compared."""
    return {q: p for q, p in pairs.items() if not (regime == "extreme" and q == "dg")}


def incremental_vs_quadratic(shape, seed, incremental=naive_fenwick, quadratic=quadratic_fenwick, log=True, regime="typical"):
    """The per-token form (one state per level, binary-counter merges) equals the masked
    ``T × T`` form through ``level(t, s)``, in value and in all five gradients (float64)."""
    x = fenwick_inputs(shape, seed, regime=regime)
    return compare("fenwick_incremental_vs_quadratic", torch.float64,
                   without_dg_if_extreme(paired(output_and_grads(incremental, x), output_and_grads(quadratic, x)),
                                         regime), log=log)


def torch_vs_numpy(shape, seed, incremental=naive_fenwick, quadratic=quadratic_fenwick,
                   gdn2_variant=naive_fenwick_gdn2, log=True, regime="typical"):
    """Each PyTorch reference equals its independently written NumPy float64 twin
    (outputs and per-level final states)."""
    x = fenwick_inputs(shape, seed, regime=regime)
    ins = [x[n] for n in INPUTS]
    o, states = incremental(*ins, output_final_state=True)
    o_np, states_np = naive_fenwick_numpy(*(t.numpy() for t in ins))
    oq = quadratic(*ins)
    oq_np = quadratic_fenwick_numpy(*(t.numpy() for t in ins))
    y = fenwick_gdn2_inputs(shape, seed, regime=regime)
    gins = [y[n] for n in GDN2_INPUTS]
    o2, states2 = gdn2_variant(*gins, output_final_state=True)
    o2_np, states2_np = naive_fenwick_gdn2_numpy(*(t.numpy() for t in gins))
    return compare("fenwick_torch_vs_numpy", torch.float64, {
        "output": (o, torch.from_numpy(o_np)),
        "final_state": (states, torch.from_numpy(states_np)),
        "quadratic_output": (oq, torch.from_numpy(oq_np)),
        "gdn2_output": (o2, torch.from_numpy(o2_np)),
        "gdn2_final_state": (states2, torch.from_numpy(states2_np)),
    }, log=log)


def reference_vs_fla_naive(shape, seed, reference=naive_fenwick, log=True, regime="typical"):
    """fla's ``naive_log_linear_attn`` (an oracle we did not write; plain torch ops, so it
    runs in float64 and autograd differentiates it) equals our reference in value and in
    all five gradients. fla's ``scale`` defaults to 1.0: ours is passed."""
    x = fenwick_inputs(shape, seed, regime=regime)
    scale = shape.K ** -0.5
    return compare("fenwick_fla_naive", torch.float64,
                   without_dg_if_extreme(paired(output_and_grads(reference, x),
                                                output_and_grads(naive_log_linear_attn, x, scale=scale)), regime),
                   log=log)


def recurrent_gla(q, k, v, g, scale):
    """Plain gated linear attention, one token at a time (written here, independent of every
    reference): ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale · S_t^T q_t``."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    o = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None, None] * S + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(o, dim=1)


def gla_reduction(shape, seed, reference=naive_fenwick, log=True, regime="typical"):
    """``λ ≡ 1``: every bucket is read with weight one, so the levels sum to the one gated
    linear-attention state; the output equals ``recurrent_gla`` (float64)."""
    x = fenwick_inputs(shape, seed, regime=regime)
    o = output_of(reference(x["q"], x["k"], x["v"], x["g"], ones_level_scales(x)))
    o_gla = recurrent_gla(x["q"], x["k"], x["v"], x["g"], shape.K ** -0.5)
    return compare("fenwick_reductions", torch.float64, {"gla_output": (o, o_gla)}, log=log)


def gdn2_reduction(shape, seed, reference=naive_fenwick_gdn2, log=True, regime="typical"):
    """GDN-2 variant with ``λ ≡ 1`` equals GDN-2 (``reference.naive_gdn2``): the output,
    and the bucket states summed over levels equal GDN-2's final state (float64)."""
    y = fenwick_gdn2_inputs(shape, seed, regime=regime)
    gates = [y[n] for n in GDN2_INPUTS[:-1]]
    o, states = reference(*gates, torch.ones_like(y["level_scales"]), output_final_state=True)
    o_gdn2, S = naive_gdn2(*gates, output_final_state=True)
    return compare("fenwick_reductions", torch.float64,
                   {"gdn2_output": (o, o_gdn2), "gdn2_final_state": (states.sum(dim=2), S)}, log=log)


def optimized_vs_reference(shape, seed, dtype, optimized=chunk_fenwick, log=True):
    """The optimized op (fla chunk kernel, padded K and V) equals ``naive_fenwick`` in float64 on
    the same rounded inputs: output and the gradients of q, k, v, g and λ."""
    x = fenwick_inputs(shape, seed)
    dev = triton_mode.device()
    ins = {n: cast(x[n], dtype, dev, True) for n in INPUTS}
    o, _ = optimized(*ins.values())
    (o.float() * x["do"].to(dev, torch.float32)).sum().backward()

    refs = {n: as_reference(x[n], dtype) for n in INPUTS}
    expected = output_and_grads(naive_fenwick, {**refs, "do": x["do"]})
    actual = {"output": o.detach()}
    actual.update({f"d{n}": grad_or_zero(ins[n]) for n in INPUTS})
    return compare("fenwick", dtype, paired(actual, expected), log=log)
