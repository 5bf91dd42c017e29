"""Chunked Fenwick GDN-2 memory (CONTRACT section 5, the GDN-2 variant; ``optimized.chunk_fenwick_gdn2``)
as functions of (implementation, draw) -> errors.

Each property test runs one of these on the real op and asserts every error is within
tolerance; the mutation tests run the same function on a deliberately broken op
(``fenwick_gdn2_mutants.py``) and assert it fails. Every check returns
``ngdn.tolerances.compare``'s ``{quantity: (error, bound)}``.
"""
from __future__ import annotations

import torch

from ngdn.fenwick_inputs import fenwick_gdn2_inputs
from ngdn.inputs import as_reference, cast, generator, randn
from ngdn.tolerances import compare
from optimized import chunk_gdn2, triton_mode
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2
from reference import naive_fenwick_gdn2

INPUTS = ("q", "k", "v", "g", "b", "w", "level_scales")
GATES = INPUTS[:-1]


def grad_or_zero(x: torch.Tensor) -> torch.Tensor:
    return x.grad if x.grad is not None else torch.zeros_like(x)


def draw(shape, seed, regime="typical") -> dict:
    """``ngdn.fenwick_inputs.fenwick_gdn2_inputs`` plus a final-state cotangent ``dfinal
    [B, H, L, K, V]`` from a third generator of the same seed."""
    x = fenwick_gdn2_inputs(shape, seed, regime=regime)
    x["dfinal"] = randn(generator(seed ^ 0xF1A1), shape.B, shape.H, shape.L, shape.K, shape.V)
    return x


def reference_outputs(x: dict, dtype) -> dict:
    """The float64 reference on the inputs rounded to ``dtype``: output, final states and the
    gradients of ``Σ o·do + Σ S·dfinal``."""
    refs = {n: as_reference(x[n], dtype, True) for n in INPUTS}
    o, S = naive_fenwick_gdn2(*refs.values(), output_final_state=True)
    ((o * x["do"]).sum() + (S * x["dfinal"]).sum()).backward()
    out = {"output": o.detach(), "final_state": S.detach()}
    out.update({f"d{n}": grad_or_zero(refs[n]) for n in INPUTS})
    return out


def _loss(o, S, x, dev):
    return (o.float() * x["do"].to(dev, torch.float32)).sum() + (S * x["dfinal"].to(dev, torch.float32)).sum()


def optimized_vs_reference(shape, seed, dtype=torch.float32, optimized=chunk_fenwick_gdn2, log=True,
                           regime="typical", grads=True, component="fenwick_gdn2"):
    """The optimized op equals ``naive_fenwick_gdn2`` (float64, same rounded inputs): output,
    final states and, with ``grads``, the gradients of q, k, v, g, b, w and λ."""
    x = draw(shape, seed, regime)
    dev = triton_mode.device()
    ins = {n: cast(x[n], dtype, dev, grads) for n in INPUTS}
    o, S = optimized(*ins.values(), output_final_state=True)
    actual = {"output": o.detach(), "final_state": S.detach()}
    if grads:
        _loss(o, S, x, dev).backward()
        actual.update({f"d{n}": grad_or_zero(ins[n]) for n in INPUTS})
    expected = reference_outputs(x, dtype)
    return compare(component, dtype, {q: (actual[q], expected[q]) for q in actual}, log=log)


def state_passing(shape, seed, split: int, dtype=torch.float32, optimized=chunk_fenwick_gdn2, log=True,
                  grads=True):
    """Two optimized calls, split at token ``split`` (a multiple of 64): the first returns its
    bucket states, the second continues from them (``initial_state``, ``offset=split``), same L.
    Outputs, the second call's final states and (with ``grads``) every gradient, through the
    passed states too, equal one reference call over the whole sequence."""
    x = draw(shape, seed)
    dev = triton_mode.device()
    ins = {n: cast(x[n], dtype, dev, grads) for n in INPUTS}
    first = {n: t[:, :split] for n, t in ins.items()}
    second = {n: t[:, split:] for n, t in ins.items()}
    o1, S1 = optimized(*first.values(), output_final_state=True)
    o2, S2 = optimized(*second.values(), initial_state=S1, output_final_state=True, offset=split)
    o = torch.cat([o1, o2], dim=1)
    actual = {"output": o.detach(), "final_state": S2.detach()}
    if grads:
        _loss(o, S2, x, dev).backward()
        actual.update({f"d{n}": grad_or_zero(ins[n]) for n in INPUTS})
    expected = reference_outputs(x, dtype)
    return compare("fenwick_gdn2", dtype, {q: (actual[q], expected[q]) for q in actual}, log=log)


# chunk_gdn2's results per (shape, seed, grads): its forward costs ~0.1 s per token and head under the
# interpreter (fla's token-parallel intra kernel), and the property and its mutation test share a draw.
_GDN2_RESULTS: dict = {}


def chunk_gdn2_expected(shape, seed, grads: bool) -> dict:
    """``optimized.chunk_gdn2`` on the draw: output, final state and, with ``grads``, the gradients
    of ``Σ o·do + Σ S·dS`` (``dS`` the level-summed final-state cotangent). Cached per process."""
    for key in ((shape, seed, True), (shape, seed, grads)):
        if key in _GDN2_RESULTS:
            return _GDN2_RESULTS[key]
    x = draw(shape, seed)
    dev = triton_mode.device()
    ref = {n: cast(x[n], torch.float32, dev, grads) for n in GATES}
    o_g, S_g = chunk_gdn2(*ref.values(), output_final_state=True)
    out = {"output": o_g.detach(), "final_state": S_g.detach()}
    if grads:
        dS = x["dfinal"].to(dev, torch.float32).sum(dim=2)
        ((o_g * x["do"].to(dev, torch.float32)).sum() + (S_g * dS).sum()).backward()
        out.update({f"d{n}": grad_or_zero(ref[n]) for n in GATES})
    _GDN2_RESULTS[(shape, seed, grads)] = out
    return out


def uniform_router_is_chunk_gdn2(shape, seed, optimized=chunk_fenwick_gdn2, log=True, grads=True):
    """``λ ≡ 1`` (float32): the output equals ``optimized.chunk_gdn2``'s, the bucket states summed
    over levels equal its final state, and (with ``grads``) the gradients of q, k, v, g, b, w agree."""
    x = draw(shape, seed)
    dev = triton_mode.device()
    fen = {n: cast(x[n], torch.float32, dev, grads) for n in GATES}
    ones = torch.ones(x["level_scales"].shape, device=dev, dtype=torch.float32)
    o, S = optimized(*fen.values(), ones, output_final_state=True)
    expected = chunk_gdn2_expected(shape, seed, grads)
    pairs = {"gdn2_output": (o.detach(), expected["output"]),
             "gdn2_final_state": (S.sum(dim=2).detach(), expected["final_state"])}
    if grads:
        dS = x["dfinal"].to(dev, torch.float32).sum(dim=2)            # one cotangent for every level
        ((o * x["do"].to(dev, torch.float32)).sum() + (S.sum(dim=2) * dS).sum()).backward()
        pairs.update({f"gdn2_d{n}": (grad_or_zero(fen[n]), expected[f"d{n}"]) for n in GATES})
    return compare("fenwick_gdn2_reductions", torch.float32, pairs, log=log)
