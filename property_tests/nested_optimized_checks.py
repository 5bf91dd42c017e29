"""Production Nested GDN-2 (``optimized.nested``) properties as functions (implementation,
draw) -> errors, against the float64 reference (SPEC sections 2 and 3).

Errors are ``{label: (error, bound)}`` (``ngdn.tolerances.compare``; ``failures`` picks
those over their bound). Three components in ``tolerances.yaml``:

- ``nested``: ``chunk_nested_gdn2`` vs ``reference.naive_nested_gdn2``: output, the final
  state of every level, the gradients of every input, router logits, initial states and
  scheme parameters.
- ``promote_scan``: the Triton scan over firings (forward states and hand-written
  backward) vs ``reference.promote`` applied firing by firing; pair-order invariance.
- ``level0_states``: level 0 with per-chunk states out (end-of-chunk snapshots) and the
  injected-gradient backward (``optimized.state_grad``) vs per-token GDN-2 in float64.

``bitwise_reproducible`` demands two runs of the op to agree bit for bit (bound 0).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ngdn.inputs import GDN2Shape, as_reference, cast, gdn2_inputs, generator, rand, randn
from ngdn.nested_inputs import (ACTIVATIONS, NestedShape, cast_levels, cast_states, levels_as_reference,
                                nested_inputs, parameter_leaves, states_as_reference)
from ngdn.tolerances import compare
from optimized import chunk_nested_gdn2, triton_mode
from optimized.level0 import CHUNK, chunk_end_states, level0_bwd, level0_fwd
from optimized.nested import make_plan
from optimized.promote_scan import promote_scan_bwd, promote_scan_fwd
from optimized.state_grad import state_grad_bwd
from reference.gdn2 import gdn2_read, gdn2_step
from reference.nested import make_levels, naive_nested_gdn2
from reference.promote import promote
from reference.schemes import get_scheme

F64 = torch.float64
# Scheme gate weights × this in the draws that leave the gates' linear regime (decay logits of
# several units; reference.nested.make_levels).
LARGE_GATES = 30.0
GATES = ("q", "k", "v", "g", "b", "w")


def check(component: str, dtype, items: dict, log: bool = True) -> dict:
    """``{label: (quantity, actual, expected)}`` -> ``{label: (relative error, bound)}``."""
    out = {}
    for label, (quantity, actual, expected) in items.items():
        out[label] = compare(component, dtype, {quantity: (actual, expected)}, log=log)[quantity]
    return out


def grad_or_zero(x: torch.Tensor | None, like: torch.Tensor | None = None) -> torch.Tensor:
    if x is not None and x.grad is not None:
        return x.grad
    return torch.zeros_like(x if like is None else like)


# --- the whole op ---------------------------------------------------------------------------

class OptCase(NamedTuple):
    shape: NestedShape
    seed: int
    scheme: object = "learned"          # one name or one per level ℓ = 1..L-1
    intervals: tuple | None = None      # None: f_ℓ = 2^(ℓ-1)
    query_counts: tuple | None = None   # None: ngdn.nested_inputs.bounded_query_counts
    reduction: object = "mean"          # one or one per level
    initial_states: object = True       # all, none, or one bool per level (None entries elsewhere)
    scale: float | None = None
    gate_scale: float = 1.0             # scheme gate weights × this (reference.nested.make_levels)


def case_inputs(case: OptCase) -> dict:
    x = nested_inputs(case.shape, case.seed, scheme=case.scheme, intervals=case.intervals,
                      query_counts=case.query_counts, reduction=case.reduction,
                      initial_states=bool(case.initial_states), gate_scale=case.gate_scale)
    if isinstance(case.initial_states, tuple):
        x["initial_states"] = [s if keep else None for s, keep in zip(x["initial_states"], case.initial_states)]
    x["scale"] = case.scale
    return x


def run_optimized(op, x: dict, dtype):
    """Run ``op`` on ``x`` cast to ``dtype`` (states/params float32) and backprop the loss
    ``Σ o·do + Σ_ℓ M_ℓ·dht_ℓ``. Returns the output, final states and every gradient."""
    dev = triton_mode.device()
    ins = {n: cast(x[n], dtype, dev, True) for n in ACTIVATIONS}
    levels = cast_levels(x["levels"], torch.float32, dev, True)
    states = cast_states(x["initial_states"], torch.float32, dev, True)
    o, finals = op(*ins.values(), levels, scale=x["scale"], initial_states=states, output_final_state=True)
    loss = (o.float() * x["do"].to(dev, torch.float32)).sum()
    loss = loss + sum((M * d.to(dev, torch.float32)).sum() for M, d in zip(finals, x["dht"]))
    loss.backward()
    grads = {f"d{n}": grad_or_zero(t) for n, t in ins.items()}
    if states is not None:
        grads.update({f"dinitial_state[{ℓ}]": grad_or_zero(s) for ℓ, s in enumerate(states) if s is not None})
    grads.update({f"d{name}": grad_or_zero(p) for name, p in parameter_leaves(levels).items()})
    return o.detach(), [M.detach() for M in finals], grads


def run_reference(x: dict, dtype):
    """The float64 reference on the same rounded values, same loss, same gradients."""
    ins = {n: as_reference(x[n], dtype, True) for n in ACTIVATIONS}
    levels = levels_as_reference(x["levels"], torch.float32, True)
    states = states_as_reference(x["initial_states"], torch.float32, True)
    o, finals = naive_nested_gdn2(*ins.values(), levels, scale=x["scale"], initial_states=states,
                                  output_final_state=True)
    ((o * x["do"]).sum() + sum((M * d).sum() for M, d in zip(finals, x["dht"]))).backward()
    grads = {f"d{n}": grad_or_zero(t) for n, t in ins.items()}
    if states is not None:
        grads.update({f"dinitial_state[{ℓ}]": grad_or_zero(s) for ℓ, s in enumerate(states) if s is not None})
    grads.update({f"d{name}": grad_or_zero(p) for name, p in parameter_leaves(levels).items()})
    return o.detach(), [M.detach() for M in finals], grads


def tolerance_quantity(label: str) -> str:
    """``dlevels[1].Q`` -> ``dparams``, ``dinitial_state[2]`` -> ``dinitial_state``, ``dq`` -> ``dq``."""
    if label.startswith("dlevels["):
        return "dparams"
    return label.split("[")[0]


def optimized_vs_reference(case: OptCase, dtype, op=chunk_nested_gdn2, log=True):
    """Output, every level's final state and every gradient (inputs, router logits, initial
    states, scheme parameters) of ``op`` vs the float64 reference."""
    x = case_inputs(case)
    o, finals, grads = run_optimized(op, x, dtype)
    o_ref, finals_ref, grads_ref = run_reference(x, dtype)
    items = {"output": ("output", o, o_ref)}
    items.update({f"final_state[{ℓ}]": ("final_state", a, e)
                  for ℓ, (a, e) in enumerate(zip(finals, finals_ref))})
    items.update({label: (tolerance_quantity(label), grads[label], grads_ref[label]) for label in grads_ref})
    return check("nested", dtype, items, log)


def bitwise_reproducible(case: OptCase, dtype, op=chunk_nested_gdn2):
    """Two runs on the same inputs: output, final states and every gradient bit for bit.
    Returns ``{label: (max |run1 - run2|, 0)}``."""
    x = case_inputs(case)
    first = run_optimized(op, x, dtype)
    second = run_optimized(op, x, dtype)
    out = {"output": first[0].float().sub(second[0].float()).abs().max().item()}
    for ℓ, (a, b) in enumerate(zip(first[1], second[1])):
        out[f"final_state[{ℓ}]"] = (a - b).abs().max().item()
    for label in first[2]:
        a, b = first[2][label].float(), second[2][label].float()
        out[label] = (a - b).abs().max().item() if a.numel() else 0.0
    return {label: (err, 0.0) for label, err in out.items()}


# --- the schedule ------------------------------------------------------------------------------

def plan_vs_spec_loop(T: int, intervals: tuple, plan_fn=make_plan):
    """The op's schedule (where each level fires, what it probes, which state each chunk
    reads) equals a direct run of the SPEC section 3 loop on counters. Returns
    ``{label: (number of mismatching entries, 0)}``."""
    N, L = -(-T // CHUNK), len(intervals) + 1
    count = [0] * L                        # firings so far, per level
    fires = [[] for _ in range(L)]
    sources = [[] for _ in range(L)]
    reads = [[] for _ in range(L)]
    for c in range(1, N + 1):
        for ℓ in range(1, L):
            reads[ℓ].append(count[ℓ])       # as it stood when chunk c began
        if c * CHUNK <= T:
            for ℓ in range(1, L):
                if c % intervals[ℓ - 1] == 0:
                    fires[ℓ].append(c)
                    sources[ℓ].append(c - 1 if ℓ == 1 else count[ℓ - 1])   # ℓ-1 after its own firing
                    count[ℓ] += 1
    plan = plan_fn(T, tuple(intervals))
    out = {}
    for ℓ in range(1, L):
        for label, mine, spec in (("fire_chunks", plan.fire_chunks[ℓ], fires[ℓ]),
                                  ("sources", plan.sources[ℓ], sources[ℓ]),
                                  ("read_index", plan.read_index[ℓ], reads[ℓ])):
            bad = sum(a != b for a, b in zip(mine, spec)) + abs(len(mine) - len(spec))
            out[f"{label}[{ℓ}]"] = (float(bad), 0.0)
        if plan.read_group[ℓ] is not None:
            f = plan.read_group[ℓ]
            out[f"read_group[{ℓ}]"] = (float(sum(s != j // f for j, s in enumerate(reads[ℓ]))), 0.0)
    return out


# --- the scan over firings ---------------------------------------------------------------------

class ScanDraw(NamedTuple):
    B: int
    F: int
    H: int
    K: int
    V: int
    n: int
    scheme: str = "learned"
    reduction: str = "mean"
    seed: int = 0
    gate_scale: float = 1.0


def scan_inputs(d: ScanDraw) -> dict:
    """Pairs probed (float64) by the scheme from random snapshots, an initial state and a
    cotangent on every stored state."""
    gen = generator(d.seed)
    level, = make_levels(2, d.H, d.K, d.V, scheme=d.scheme, query_counts=[d.n], reduction=d.reduction,
                         generator=gen, gate_scale=d.gate_scale)
    snaps = randn(gen, d.B, d.F, d.H, d.K, d.V)
    pairs = get_scheme(d.scheme).probe(snaps, level.params, d.reduction)
    return {"M0": 0.5 * randn(gen, d.B, d.H, d.K, d.V), "pairs": [p.contiguous() for p in pairs],
            "dstates": randn(gen, d.B, d.F + 1, d.H, d.K, d.V)}


PAIR_NAMES = ("kappa", "nu", "beta", "omega", "gamma")


def scan_vs_reference(d: ScanDraw, scan_fwd=promote_scan_fwd, scan_bwd=promote_scan_bwd, log=True,
                      tolerance_dtype="float32"):
    """Every stored state and every gradient of the Triton scan vs ``reference.promote``
    applied firing by firing in float64 (autograd). ``tolerance_dtype``: the bounds' dtype key
    (``"tf32"`` for the scan with TF32 dots)."""
    x = scan_inputs(d)
    dev = triton_mode.device()
    f32 = lambda t: t.to(dev, torch.float32).contiguous()  # noqa: E731
    pairs = [f32(p) for p in x["pairs"]]
    states = scan_fwd(f32(x["M0"]), *pairs)
    dM0, *dpairs = scan_bwd(states, *pairs, f32(x["dstates"]))

    leaves = [as_reference(t, torch.float32, True) for t in [x["M0"], *x["pairs"]]]
    M, ref = leaves[0], [leaves[0]]
    for m in range(d.F):
        M = promote(M, *(p[:, m] for p in leaves[1:]))
        ref.append(M)
    ref = torch.stack(ref, dim=1)
    (ref * x["dstates"]).sum().backward()
    items = {"states": ("states", states, ref), "dinitial_state": ("dinitial_state", dM0, leaves[0].grad)}
    items.update({f"d{n}": (f"d{n}", dp, grad_or_zero(p)) for n, dp, p in zip(PAIR_NAMES, dpairs, leaves[1:])})
    return check("promote_scan", tolerance_dtype, items, log)


def scan_pair_order(d: ScanDraw, scan_fwd=promote_scan_fwd, log=True):
    """Permuting the pairs of every firing leaves every stored state unchanged."""
    x = scan_inputs(d)
    dev = triton_mode.device()
    f32 = lambda t: t.to(dev, torch.float32).contiguous()  # noqa: E731
    perm = torch.randperm(d.n, generator=generator(d.seed + 1))
    kappa, nu, beta, omega, gamma = [f32(p) for p in x["pairs"]]
    states = scan_fwd(f32(x["M0"]), kappa, nu, beta, omega, gamma)
    shuffled = [p[:, :, :, perm].contiguous() for p in (kappa, nu, beta, omega)]
    states_perm = scan_fwd(f32(x["M0"]), *shuffled, gamma)
    return check("promote_scan", torch.float32, {"permuted_states": ("permuted_states", states_perm, states)}, log)


# --- level 0 with per-chunk states ---------------------------------------------------------------

def level0_reference(x: dict, dtype, ends: list, d_ends: torch.Tensor):
    """Per-token GDN-2 in float64 keeping the state at the end of every full chunk; loss
    ``Σ o·do + S_T·dht + Σ_i S_end[ends[i]]·d_ends[:, i]``."""
    leaves = {n: as_reference(x[n], dtype, True) for n in GATES}
    h0 = as_reference(x["initial_state"], torch.float32, True)
    q, k, v, g, b, w = leaves.values()
    T, K = q.shape[1], q.shape[-1]
    S, outs, snaps = h0, [], []
    for t in range(T):
        S = gdn2_step(S, k[:, t], v[:, t], g[:, t], b[:, t], w[:, t])
        outs.append(gdn2_read(S, q[:, t], K ** -0.5))
        if (t + 1) % CHUNK == 0:
            snaps.append(S)
    o = torch.stack(outs, dim=1)
    ends_ref = torch.stack(snaps, dim=1) if snaps else h0.new_zeros(h0.shape[0], 0, *h0.shape[1:])
    loss = (o * x["do"]).sum() + (S * x["dht"]).sum()
    loss = loss + sum((snaps[c] * d_ends[:, i]).sum() for i, c in enumerate(ends))
    loss.backward()
    grads = {f"d{n}": grad_or_zero(t) for n, t in leaves.items()}
    grads["dinitial_state"] = h0.grad
    return o.detach(), ends_ref.detach(), S.detach(), grads


def level0_injection_chunks(T: int, seed: int) -> list:
    """A seeded subset of the full chunks (0-based) that receive an injected gradient; the
    last full chunk is always in it (its end is the final state when T = 64·k)."""
    n_full = T // CHUNK
    if n_full == 0:
        return []
    pick = rand(generator(seed + 7), n_full) < 0.6
    return sorted({c for c in range(n_full) if bool(pick[c])} | {n_full - 1})


def level0_states_vs_reference(shape: GDN2Shape, seed: int, dtype, state_grad=state_grad_bwd, log=True):
    """End-of-chunk states out of ``level0_fwd`` and the gradients of ``level0_bwd`` with
    injected end-of-chunk gradients vs per-token GDN-2 in float64."""
    x = gdn2_inputs(shape, seed)
    dev = triton_mode.device()
    ends = level0_injection_chunks(shape.T, seed)
    d_ends = randn(generator(seed + 3), shape.B, len(ends), shape.H, shape.K, shape.V)
    ins = [cast(x[n], dtype, dev) for n in GATES]
    h0 = cast(x["initial_state"], torch.float32, dev)
    o, ht, h, saved = level0_fwd(*ins, scale=shape.K ** -0.5, initial_state=h0)
    snaps = chunk_end_states(h, ht, range(shape.T // CHUNK))
    dq, dk, dv, dg, db, dw, dh0 = level0_bwd(saved, x["do"].to(dev, torch.float32),
                                             dht=x["dht"].to(dev, torch.float32),
                                             d_ends=d_ends.to(dev, torch.float32), end_chunks=ends,
                                             state_grad=state_grad)
    o_ref, snaps_ref, ht_ref, g_ref = level0_reference(x, dtype, ends, d_ends)
    items = {"output": ("output", o, o_ref), "chunk_end_states": ("chunk_end_states", snaps, snaps_ref),
             "final_state": ("final_state", ht, ht_ref)}
    for n, gr in zip(GATES, (dq, dk, dv, dg, db, dw)):
        items[f"d{n}"] = (f"d{n}", gr, g_ref[f"d{n}"])
    items["dinitial_state"] = ("dinitial_state", dh0, g_ref["dinitial_state"])
    return check("level0_states", dtype, items, log)
