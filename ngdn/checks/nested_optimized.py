"""Production Nested GDN-2 (``optimized.nested``) properties as functions (implementation,
draw) -> errors, against the float64 reference (CONTRACT sections 2 and 3).

Errors are ``{label: (error, bound)}`` (``ngdn.tolerances.compare``; ``failures`` picks
those over their bound). Components in ``tolerances.yaml``:

- ``nested``: ``chunk_nested_gdn2`` vs ``reference.naive_nested_gdn2``: output, the final
  state of every level, the gradients of every input, router logits, initial states and
  scheme parameters.
- ``promote_scan``: the Triton scan over firings (forward states and hand-written
  backward) vs ``reference.promote`` applied firing by firing; pair-order invariance.
- ``level0_states``: level 0 with per-chunk states out (end-of-chunk snapshots) and the
  injected-gradient backward (``optimized.nested.state_grad``) vs per-token GDN-2 in float64.
- ``nested_extreme``, ``promote_scan_extreme``: the extreme regime (``ngdn.inputs.REGIMES``), with
  bounds raised by the problem's own error measured on the draw (``check_above``): for the op, the
  error inherited from level 0 and the float32 reference's (``extreme_vs_reference``); for the scan,
  the float32 reference's (``scan_vs_reference``).

``bitwise_reproducible`` demands two runs of the op to agree bit for bit (bound 0).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ngdn.cancellation import dg_cancellation_floor
from ngdn.inputs import (GDN2Shape, as_reference, cast, check_regime, extreme_erase, extreme_log_decay, extreme_state,
                         extreme_write, gdn2_inputs, generator, rand, randn)
from ngdn.nested_inputs import (ACTIVATIONS, NestedShape, cast_levels, cast_states, levels_as_reference,
                                nested_inputs, parameter_leaves, states_as_reference)
from ngdn.tolerances import compare, record, relative_error, tolerance
from optimized import chunk_nested_gdn2, triton_mode
from optimized.nested.level0 import CHUNK, chunk_end_states, level0_bwd, level0_fwd
from optimized.nested import make_plan
from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd
from optimized.nested.state_grad import FactoredSnapGrads, state_grad_bwd
from reference.gdn2 import gdn2_read, gdn2_step
from reference.nested import CHUNK_SIZE, Level, make_levels, naive_nested_gdn2
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


def check_above(component: str, dtype, items: dict, floors: list, log: bool = True, suffix: str = "") -> dict:
    """``check`` with each label's bound raised by ``Σ factor × floor[label]`` over ``floors``, a
    list of ``(floor, factor_key)``: ``floor`` the problem's own error on this draw (how far a
    reference moves under a perturbation the kernel cannot avoid), ``factor_key`` the component's
    entry for its factor. Logs the raised bound (quantity + ``suffix``), so ``ngdn errors`` gives
    the margin that was tested."""
    factors = [(floor, tolerance(component, key, dtype)) for floor, key in floors]
    mode = triton_mode.configure()
    out = {}
    for label, (quantity, actual, expected) in items.items():
        error, bound = compare(component, dtype, {quantity: (actual, expected)}, log=False)[quantity]
        bound += sum(factor * floor.get(label, 0.0) for floor, factor in factors)
        if log:
            record(component, mode, dtype, quantity + suffix, error, bound)
        out[label] = (error, bound)
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
    regime: str = "typical"             # ngdn.inputs.REGIMES


def case_inputs(case: OptCase) -> dict:
    x = nested_inputs(case.shape, case.seed, scheme=case.scheme, intervals=case.intervals,
                      query_counts=case.query_counts, reduction=case.reduction,
                      initial_states=bool(case.initial_states), gate_scale=case.gate_scale,
                      regime=case.regime)
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


def reference_leaves(x: dict, dtype):
    """The float64 reference's leaves: activations rounded to ``dtype``, parameters and initial
    states to float32 (the values the optimized op sees), each requiring grad."""
    ins = {n: as_reference(x[n], dtype, True) for n in ACTIVATIONS}
    return ins, levels_as_reference(x["levels"], torch.float32, True), \
        states_as_reference(x["initial_states"], torch.float32, True)


def reference_gradients(x: dict, o, finals, ins, levels, states):
    """Backprop the loss ``Σ o·do + Σ_ℓ M_ℓ·dht_ℓ`` through a reference run; returns it as
    ``run_optimized`` does."""
    ((o * x["do"]).sum() + sum((M * d).sum() for M, d in zip(finals, x["dht"]))).backward()
    grads = {f"d{n}": grad_or_zero(t) for n, t in ins.items()}
    if states is not None:
        grads.update({f"dinitial_state[{ℓ}]": grad_or_zero(s) for ℓ, s in enumerate(states) if s is not None})
    grads.update({f"d{name}": grad_or_zero(p) for name, p in parameter_leaves(levels).items()})
    return o.detach(), [M.detach() for M in finals], grads


def run_reference(x: dict, dtype):
    """The float64 reference on the same rounded values, same loss, same gradients."""
    ins, levels, states = reference_leaves(x, dtype)
    o, finals = naive_nested_gdn2(*ins.values(), levels, scale=x["scale"], initial_states=states,
                                  output_final_state=True)
    return reference_gradients(x, o, finals, ins, levels, states)


def run_reference_float32(x: dict, dtype):
    """``reference.naive_nested_gdn2`` computed in float32 throughout on the same rounded values
    (a per-token float32 algorithm): how far float32 arithmetic itself moves this draw."""
    ins, levels, states = reference_leaves(x, dtype)
    ins = {n: t.detach().float().requires_grad_(True) for n, t in ins.items()}
    levels = [Level(lv.scheme, lv.interval, {n: p.detach().float().requires_grad_(True) for n, p in lv.params.items()},
                    lv.reduction) for lv in levels]
    states = None if states is None else [None if s is None else s.detach().float().requires_grad_(True)
                                          for s in states]
    o, finals = naive_nested_gdn2(*ins.values(), levels, scale=x["scale"], initial_states=states,
                                  output_final_state=True)
    f32 = {**x, "do": x["do"].float(), "dht": [d.float() for d in x["dht"]]}
    return reference_gradients(f32, o, finals, ins, levels, states)


def reference_loop(x: dict, dtype, snapshot=None, state=None, capture=None, leaves=None):
    """``reference.naive_nested_gdn2`` (chunk 64) written out with two hooks: ``snapshot(c, S)``
    replaces the level-0 state that level 1 probes after chunk ``c`` (1-based), ``state(S)`` every
    state after every level-0 step and every firing. Without hooks it equals the reference bit
    for bit (``test_nested_optimized.py::test_reference_loop_equals_naive``). ``capture`` receives
    ``{c: (S before the hook, detached; S as probed, its gradient retained)}``; ``leaves`` replaces
    ``reference_leaves(x, dtype)``. Returns as ``run_reference``."""
    ins, levels, states = reference_leaves(x, dtype) if leaves is None else leaves
    q, k, v, g, b, w, r = ins.values()
    B, T, H, L, K = q.shape
    scale = K ** -0.5 if x["scale"] is None else x["scale"]
    keep = (lambda S: S) if state is None else state  # noqa: E731
    M = [q.new_zeros(B, H, K, v.shape[-1]) if s is None else s.to(q.dtype) for s in (states or [None] * L)]
    o = []
    for c in range(1, -(-T // CHUNK_SIZE) + 1):
        for t in range((c - 1) * CHUNK_SIZE, min(c * CHUNK_SIZE, T)):
            M[0] = keep(gdn2_step(M[0], k[:, t], v[:, t], g[:, t], b[:, t], w[:, t]))
            weights = torch.softmax(r[:, t], dim=-1)
            o.append(sum(weights[..., ℓ, None] * gdn2_read(M[ℓ], q[:, t, :, ℓ], scale) for ℓ in range(L)))
        if c * CHUNK_SIZE <= T:
            for ℓ in range(1, L):
                lv = levels[ℓ - 1]
                if c % lv.interval == 0:
                    S = M[ℓ - 1]
                    if ℓ == 1 and (snapshot is not None or capture is not None):
                        before = S.detach()
                        S = (S if snapshot is None else snapshot(c, S)).view_as(S)
                        if capture is not None:
                            S.retain_grad()
                            capture[c] = (before, S)
                    M[ℓ] = keep(promote(M[ℓ], *get_scheme(lv.scheme).probe(S, lv.params, lv.reduction)))
    return reference_gradients(x, torch.stack(o, dim=1), M, ins, levels, states)


def kernel_level0_snapshots(x: dict, dtype) -> dict:
    """Level 0's end-of-chunk states as the op computes them (``optimized.nested.level0``: fla's chunked
    GDN-2 on the inputs cast to ``dtype``, float32 initial state): ``{c (1-based): [B, H, K, V]}``
    float32 on the CPU, for every full chunk."""
    dev = triton_mode.device()
    ins = [cast(x[n][..., 0, :] if n == "q" else x[n], dtype, dev).contiguous() for n in GATES]
    h0 = None if x["initial_states"] is None else cast(x["initial_states"][0], torch.float32, dev)
    K = ins[0].shape[-1]
    _, ht, h, _ = level0_fwd(*ins, scale=K ** -0.5 if x["scale"] is None else x["scale"], initial_state=h0)
    n_full = ins[0].shape[1] // CHUNK
    ends = chunk_end_states(h, ht, range(n_full))
    return {c + 1: ends[:, c].cpu() for c in range(n_full)}


def with_snapshots(snaps: dict):
    """A ``reference_loop`` snapshot hook: the value of ``snaps[c]``, the gradient straight through."""
    return lambda c, S: S + (snaps[c].to(S) - S).detach()


def outputs_by_label(o, finals, grads) -> dict:
    return {"output": o, **{f"final_state[{ℓ}]": M for ℓ, M in enumerate(finals)}, **grads}


def tolerance_quantity(label: str) -> str:
    """``dlevels[1].Q`` -> ``dparams``, ``dinitial_state[2]`` -> ``dinitial_state``, ``dq`` -> ``dq``."""
    if label.startswith("dlevels["):
        return "dparams"
    return label.split("[")[0]


def quantity_of(label: str) -> str:
    """The tolerance quantity of an ``optimized_vs_reference`` label."""
    return label.split("[")[0] if label.startswith(("output", "final_state")) else tolerance_quantity(label)


def optimized_vs_reference(case: OptCase, dtype, op=chunk_nested_gdn2, log=True):
    """Output, every level's final state and every gradient (inputs, router logits, initial
    states, scheme parameters) of ``op`` vs the float64 reference. Extreme regime:
    ``extreme_vs_reference``."""
    x = case_inputs(case)
    o, finals, grads = run_optimized(op, x, dtype)
    if case.regime == "extreme":
        return extreme_vs_reference(x, dtype, outputs_by_label(o, finals, grads), log)
    o_ref, finals_ref, grads_ref = run_reference(x, dtype)
    items = {"output": ("output", o, o_ref)}
    items.update({f"final_state[{ℓ}]": ("final_state", a, e)
                  for ℓ, (a, e) in enumerate(zip(finals, finals_ref))})
    items.update({label: (tolerance_quantity(label), grads[label], grads_ref[label]) for label in grads_ref})
    if dtype != torch.bfloat16 or o.numel() == 0:     # an empty batch or no heads: nothing to be sensitive
        return check("nested", dtype, items, log)
    # bf16: level 1 probes fla's bf16-rounded level-0 states (CONTRACT allows the kernel's own level 0),
    # and some draws amplify that rounding far beyond the typical bound (H200 thorough run
    # 2026-11-30: dparams to 0.31, dk … dw to 0.09, final states to 0.037 on L = 5, f = 1 draws).
    # The bound also gets bf16_sensitivity_factor × e_inj, e_inj how far the float64 reference moves
    # when fed the kernel's level-0 snapshots: the draw's own sensitivity at that precision.
    fed = outputs_by_label(*reference_loop(x, dtype, snapshot=with_snapshots(kernel_level0_snapshots(x, dtype))))
    ref = outputs_by_label(o_ref, finals_ref, grads_ref)
    sensitivity = {label: relative_error(fed[label], ref[label]) for label in ref}
    return check_above("nested", dtype, items, [(sensitivity, "bf16_sensitivity_factor")], log)


END_TO_END = " vs float64"
# bf16 extreme regime: quantities checked finite only (extreme_vs_reference says why)
BF16_EXTREME_LOST = ("dk", "dv", "dg", "db", "dw", "dr", "dinitial_state", "dparams")


def extreme_vs_reference(x: dict, dtype, opt: dict, log=True):
    """The extreme regime (``nested_extreme``; results/2026-11-30-extreme-regime-cpu.md). There fla's
    chunked level 0 is good to only ~3e-5 (its float32 cumulative log-decays reach |Σg| ~ 1e3 within
    a chunk: error ≈ 0.1–0.7 × |Σg| · 2^-24; the per-token float32 recurrence keeps 6e-8), and with
    upper-level states of scale 1e3 the nested gradients amplify an error of level 0's snapshots
    100× and more (1e4× on some L = 6 draws). The float64 reference fed the kernel's own level-0
    snapshots reproduces the op's error (ratio ≤ 1.13 over 8 draws). Checked in three parts:

    - every label vs the float64 reference fed the kernel's level-0 snapshots
      (``kernel_level0_snapshots``, forward value only, the gradient flows straight through): the
      upper levels, the reads and level 0's backward, given level 0's forward; bound
      ``bound(q) + float32_reference_factor × e_f32``, ``e_f32`` the error of the reference computed
      in float32 on this draw (``run_reference_float32``: the problem's own float32 conditioning);
    - ``chunk_end_states``: those snapshots vs the float64 reference's;
    - ``LABEL vs float64``: every label vs the plain float64 reference, the bound also raised by
      ``inherited_factor × e_inj``, ``e_inj`` how far the fed reference itself moved (the
      problem's sensitivity to level 0's error, measured on this draw).

    A one-term bug (mutants: 1e-2 … 1) fails the first or the second part unless the draw's own
    float32 error is within ~1/50 of it."""
    snaps = kernel_level0_snapshots(x, dtype)
    probed = {}
    fed = outputs_by_label(*reference_loop(x, dtype, snapshot=with_snapshots(snaps), capture=probed))
    ref = outputs_by_label(*run_reference(x, dtype))
    own = outputs_by_label(*run_reference_float32(x, dtype))
    items = {label: (quantity_of(label), opt[label], fed[label]) for label in ref}
    if probed:                                  # the chunks whose end level 1 probed
        chunks = sorted(probed)
        items["chunk_end_states"] = ("chunk_end_states", torch.stack([snaps[c] for c in chunks], 1),
                                     torch.stack([probed[c][0] for c in chunks], 1))
    float32_error = {label: relative_error(own[label], ref[label]) for label in ref}
    sensitivity = {label: relative_error(fed[label], ref[label]) for label in ref}
    # Level 0 is fla's chunk_gdn2: its float32 dg cancels where the true dg is far smaller than
    # q⊙dq − k⊙dk (T = 1, strong decay; gdn2_extreme dg_cancellation_factor). The same floor here,
    # from the float64 reference's level-0 gradients (H200 and interpreter 2026-11-30: T = 1, L = 1
    # draws reach dg 1.8e-3 … 8.5e-3, per-token float32 6e-8).
    cancel = dg_cancellation_floor(x["q"][..., 0, :].double(), ref["dq"][..., 0, :].double(), x["k"].double(),
                                   ref["dk"].double(), ref["dg"].double())
    floors = [(float32_error, "float32_reference_factor"), ({"dg": cancel}, "dg_cancellation_factor")]
    finite = {}
    if dtype == torch.bfloat16:
        # A bf16 run rounds more than level 0's snapshots (fla's bf16 h inside level 0's backward,
        # bf16 activations in the reads), each rounding of the snapshots' size (2^-9): how far the
        # fed reference moved (e_inj) is the draw's sensitivity at that precision, and a float32
        # floor alone cannot cover it (H200 2026-11-30: an L = 5 draw with e_inj = 1.5 gave fed
        # gradient errors of 0.8-1.2 against a float32-floor bound of 0.07).
        floors.append((sensitivity, "bf16_sensitivity_factor"))
        # The gradients that flow back through level 0 and the probes (level 0's inputs, initial
        # states, scheme parameters) and the router's (logits at ±30: a saturated softmax) are lost
        # to bf16 rounding here: H200 thorough run 2026-11-30, 122 draws: relative errors up to 0.82
        # (dr) … 3.5 (dk) … 47 (dparams), and e_inj does not explain them (factors of 19 … 2.7e4
        # would be needed; scripts/sensitivity_factor_needed.py). Those are checked finite only;
        # the float32 draws of this regime check their values. The forward and dq keep their bounds.
        lost = [label for label in ref if quantity_of(label) in BF16_EXTREME_LOST]
        finite = {label + " finite": (0.0 if torch.isfinite(opt[label]).all() else float("inf"), 0.0)
                  for label in lost}
        items = {label: item for label, item in items.items() if label not in lost}
        ref = {label: e for label, e in ref.items() if label not in lost}
    out = check_above("nested_extreme", dtype, items, floors, log)
    out.update(finite)
    end_to_end = {label + END_TO_END: (quantity_of(label), opt[label], ref[label]) for label in ref}
    inherited = {label + END_TO_END: e for label, e in sensitivity.items()}
    own_end_to_end = {label + END_TO_END: e for label, e in float32_error.items()}
    out.update(check_above("nested_extreme", dtype, end_to_end, [(inherited, "inherited_factor"),
                                                                 (own_end_to_end, "float32_reference_factor"),
                                                                 ({"dg" + END_TO_END: cancel}, "dg_cancellation_factor")],
                           log, END_TO_END))
    return out


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
    reads) equals a direct run of the CONTRACT section 3 loop on counters. Returns
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
    regime: str = "typical"       # ngdn.inputs.REGIMES


def scan_inputs(d: ScanDraw) -> dict:
    """Pairs probed (float64) by the scheme from random snapshots, an initial state and a
    cotangent on every stored state. ``regime="extreme"``: the typical draw, then from the same
    generator each firing's snapshot at entry scale 1e3 or 1e-6 (so ν is large or tiny and the
    gates saturate), γ with strong (-20 … -60) and near-zero per-channel log-decays, β = 1 - 1e-6
    and ω ∈ {0, 1} on some entries, and the initial state at scale 1e3 or 1e-6
    (``ngdn.inputs``' extreme gates)."""
    gen = generator(d.seed)
    level, = make_levels(2, d.H, d.K, d.V, scheme=d.scheme, query_counts=[d.n], reduction=d.reduction,
                         generator=gen, gate_scale=d.gate_scale)
    snaps = randn(gen, d.B, d.F, d.H, d.K, d.V)
    if d.regime == "typical":
        pairs = get_scheme(d.scheme).probe(snaps, level.params, d.reduction)
        return {"M0": 0.5 * randn(gen, d.B, d.H, d.K, d.V), "pairs": [p.contiguous() for p in pairs],
                "dstates": randn(gen, d.B, d.F + 1, d.H, d.K, d.V)}
    check_regime(d.regime)
    M0, dstates = 0.5 * randn(gen, d.B, d.H, d.K, d.V), randn(gen, d.B, d.F + 1, d.H, d.K, d.V)
    snaps = torch.stack([extreme_state(gen, snaps[:, m], typical_scale=1.0) for m in range(d.F)], 1) \
        if d.F else snaps
    κ, ν, β, ω, γ = get_scheme(d.scheme).probe(snaps, level.params, d.reduction)
    pairs = [κ, ν, extreme_erase(gen, β), extreme_write(gen, ω), extreme_log_decay(gen, γ)]
    return {"M0": extreme_state(gen, M0), "pairs": [p.contiguous() for p in pairs], "dstates": dstates}


PAIR_NAMES = ("kappa", "nu", "beta", "omega", "gamma")


def scan_component(d: ScanDraw) -> str:
    """The scan's tolerance component: ``promote_scan``, or ``promote_scan_extreme`` for the extreme regime."""
    return "promote_scan" if d.regime == "typical" else "promote_scan_extreme"


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

    ref = scan_reference(d, x)
    items = {"states": ("states", states, ref["states"]), "dinitial_state": ("dinitial_state", dM0, ref["dinitial_state"])}
    items.update({f"d{n}": (f"d{n}", dp, ref[f"d{n}"]) for n, dp in zip(PAIR_NAMES, dpairs)})
    if d.regime == "typical":
        return check(scan_component(d), tolerance_dtype, items, log)
    # Extreme: a near-one erase (β = 1 - 1e-6) leaves 1 - β = 1e-6 of a row, so a float32 evaluation
    # of the firing's backward loses dγ to ~2^-24 / 1e-6 whatever the kernel does: reference.promote
    # itself in float32 does the same (8e-2 on some draws). The bounds sit above that, measured here.
    own = scan_reference(d, x, torch.float32)
    floors = {label: relative_error(own[label], ref[label]) for label in items}
    return check_above(scan_component(d), tolerance_dtype, items, [(floors, "float32_reference_factor")], log)


def scan_reference(d: ScanDraw, x: dict, dtype=torch.float64) -> dict:
    """``reference.promote`` firing by firing under autograd in ``dtype`` on the float32-rounded
    inputs: ``{"states", "dinitial_state", "dkappa", ...}``."""
    leaves = [as_reference(t, torch.float32).to(dtype).requires_grad_(True) for t in [x["M0"], *x["pairs"]]]
    M, ref = leaves[0], [leaves[0]]
    for m in range(d.F):
        M = promote(M, *(p[:, m] for p in leaves[1:]))
        ref.append(M)
    ref = torch.stack(ref, dim=1)
    (ref * x["dstates"].to(dtype)).sum().backward()
    out = {"states": ref.detach(), "dinitial_state": leaves[0].grad}
    out.update({f"d{n}": grad_or_zero(p) for n, p in zip(PAIR_NAMES, leaves[1:])})
    return out


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
    return check(scan_component(d), torch.float32, {"permuted_states": ("permuted_states", states_perm, states)}, log)


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


def level0_states_vs_reference(shape: GDN2Shape, seed: int, dtype, state_grad=state_grad_bwd, log=True,
                               pairs: int | None = None):
    """End-of-chunk states out of ``level0_fwd`` and the gradients of ``level0_bwd`` with
    injected end-of-chunk gradients vs per-token GDN-2 in float64. ``pairs``: the injected
    gradients given factored, ``Qᵀ dν`` with ``Q [H, pairs, K]`` (``state_grad.FactoredSnapGrads``,
    as a probe reading ``ν = Q M`` hands them back), the reference adding the product in float64."""
    x = gdn2_inputs(shape, seed)
    dev = triton_mode.device()
    ends = level0_injection_chunks(shape.T, seed)
    if pairs is None:
        d_ends = randn(generator(seed + 3), shape.B, len(ends), shape.H, shape.K, shape.V)
        given = d_ends.to(dev, torch.float32)
    else:
        Q = randn(generator(seed + 4), shape.H, pairs, shape.K) / pairs ** 0.5
        dnu = randn(generator(seed + 3), shape.B, len(ends), shape.H, pairs, shape.V)
        d_ends = torch.einsum("hnk,bshnv->bshkv", Q.double(), dnu.double())
        given = FactoredSnapGrads(Q.to(dev, torch.float32), dnu.to(dev, torch.float32))
    ins = [cast(x[n], dtype, dev) for n in GATES]
    h0 = cast(x["initial_state"], torch.float32, dev)
    o, ht, h, saved = level0_fwd(*ins, scale=shape.K ** -0.5, initial_state=h0)
    snaps = chunk_end_states(h, ht, range(shape.T // CHUNK))
    dq, dk, dv, dg, db, dw, dh0 = level0_bwd(saved, x["do"].to(dev, torch.float32),
                                             dht=x["dht"].to(dev, torch.float32),
                                             d_ends=given, end_chunks=ends,
                                             state_grad=state_grad)
    o_ref, snaps_ref, ht_ref, g_ref = level0_reference(x, dtype, ends, d_ends)
    items = {"output": ("output", o, o_ref), "chunk_end_states": ("chunk_end_states", snaps, snaps_ref),
             "final_state": ("final_state", ht, ht_ref)}
    for n, gr in zip(GATES, (dq, dk, dv, dg, db, dw)):
        items[f"d{n}"] = (f"d{n}", gr, g_ref[f"d{n}"])
    items["dinitial_state"] = ("dinitial_state", dh0, g_ref["dinitial_state"])
    return check("level0_states", dtype, items, log)
