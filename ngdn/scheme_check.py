"""The promotion-scheme battery behind ``ngdn scheme check`` (and ``pytest property_tests --scheme``).

A scheme (``reference.schemes.register_scheme``) is resolved once (``resolve``: the registered
``Scheme`` with its probe, parameter shapes and query axes; the query count ``n`` is read from
the declared shapes, never from a parameter's name) and checked property by property; each
property is a function ``(scheme, draw) -> Measured(figure, bound, problems)`` that passes
when ``figure ≤ bound``. Properties with a draw type are searched with Hypothesis (the
failing draw is shrunk; the stability search maximises its figure with ``target()``);
the rest run fixed cases. Parameters are drawn as ``make_levels`` draws them.

- ``contract`` (CONTRACT 2, a scheme's contract): on snapshots that are zero, tiny (1e-8), large
  (1e4), huge (1e7), near rank one, orthonormal or random, with ``K ≠ V``: the probe returns CONTRACT 2
  shapes and dtype (the registry checks them), finite outputs, ``γ ≤ 0``, gates ``β, ω`` in
  ``[0, 1]``; it is pure (a second call gives the same outputs, neither ``M_below`` nor a
  parameter is changed in place); it honours ``reduction`` (with ``n > 1`` pairs and a nonzero
  ``γ``, ``mean`` and ``sum`` differ); batched snapshots ``[B, F, H, K, V]`` equal the per-firing
  results; ``n > K`` is a ``ValueError`` (schemes with a query axis); every declared parameter
  gets a gradient from the outputs (used, and not through a detached or cached copy). Figure:
  violations.
- ``independence`` (CONTRACT "Errors", batch and head independence; ``B = H = 2``): replacing one
  batch element's (head's) inputs, at unit scale and 1e7 times larger, changes no other's
  outputs, through the probe and through the nested reference (output and final states;
  bitwise); and batch element 0 alone gives what it gives in the batch of two (the batch's size
  changes nothing; ``promote_identities.batch_slice``). Figure: violations.
- ``permutation``: permuting a firing's pairs leaves ``M_new`` unchanged (torch and NumPy
  promote, ``ngdn.checks.nested.pair_permutation``) and, with a query axis, so does permuting
  the queries (the scheme treats its queries alike). ``promote_identities.permutation`` bound.
- ``one_pair``: with ``n = 1`` (schemes with a query axis) a firing is one GDN-2 token step
  ``k=κ, v=ν, b=β, w=ω, g=γ``; n/a without one.
- ``probe_gradcheck``: float64 ``torch.autograd.gradcheck`` of the probe in every parameter
  and in the snapshot (catches a hand-written backward that is wrong; the message names the
  output and the input whose Jacobian disagrees).
- ``numpy_twin``: probe and promote vs the scheme's entry in
  ``reference.promote_numpy.SCHEMES_NUMPY`` (``ngdn.checks.nested.promote_torch_vs_numpy``); n/a
  when the scheme registers none.
- ``nested_causality`` / ``firing_timing``: the nested reference with this scheme at every
  level (chunk size 8): changing tokens ``t ≥ t0`` changes no earlier output; a chunk's
  writes are invisible through its end and visible from the next chunk
  (``ngdn.checks.nested.causal_prefix``, ``firing_timing``; bitwise).
- ``optimized``: ``optimized.chunk_nested_gdn2`` with this scheme vs the float64 reference:
  output, final states, every gradient, with the ``mean`` and the ``sum`` decay reduction
  (``ngdn.checks.nested_optimized.optimized_vs_reference``; the Triton interpreter on CPU).
  On CUDA also ``bitwise``: two runs agree bit for bit.
- ``stability``: the growth factor of k ≤ 64 firings on one adversarial snapshot

      growth = max_{j ≤ k} ‖M_j‖_F / (‖M_0‖_F + Σ_{i ≤ j} ‖κ_i^T (ω_i ⊙ ν_i)‖_F)

  (float64; ≤ 1 for a scheme whose decay-and-erase is non-expansive), maximised over
  snapshot kinds, shapes, gate scales and k with Hypothesis ``target()``; half the draws at
  ``make_levels``' parameter scales with slow decays (the probe's ``γ`` times ``SLOW_DECAY``),
  where a decay no longer hides an erase that expands the state. Above the threshold
  (default 1 + 1e-3) the scheme is reported *expansive* with the input.

A failure shrunk by Hypothesis is measured again on a random snapshot at full size (``unshrunk``)
and reported beside it: the shrunk snapshot is the smallest that fails, where a fault's error can
read as round-off.

A probe that is not a pure function of ``(M_below, params)`` makes a draw pass once and fail
once; the report says so instead of Hypothesis' "unreliable results". The battery uses the
library's check modules (``ngdn.checks.nested``, ``ngdn.checks.nested_optimized``), the same
functions the property tests run.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, NamedTuple

import torch

F64 = torch.float64
DEFAULT_THRESHOLD = 1.001
DEFAULT_EXAMPLES = 30
SNAPSHOT_KINDS = ("zero", "tiny", "large", "huge", "near_rank_one", "orthonormal", "random")
# a "huge" snapshot's entry scale: the state norms ``learned`` reaches in training (docs/layers.md, the recall run)
HUGE = 1e7


def _checks():
    """The library's nested check modules (imported on first use: the optimized one picks the
    device mode and loads fla)."""
    from ngdn.checks import nested, nested_optimized

    return nested, nested_optimized


# --- loading a scheme file --------------------------------------------------------------

@contextmanager
def registry_restored():
    """Undo every registration made inside (schemes and NumPy twins)."""
    from reference.promote_numpy import SCHEMES_NUMPY
    from reference.schemes import SCHEMES

    saved, saved_np = dict(SCHEMES), dict(SCHEMES_NUMPY)
    try:
        yield
    finally:
        SCHEMES.clear()
        SCHEMES.update(saved)
        SCHEMES_NUMPY.clear()
        SCHEMES_NUMPY.update(saved_np)


def load_scheme_file(source: str) -> list[str]:
    """Import ``source`` (a ``.py`` path, or a dotted module name such as ``reference.schemes``)
    and return the names of the schemes it registered (empty for an already imported module)."""
    from reference.schemes import SCHEMES

    if not isinstance(source, str) or not source:
        raise TypeError(f"source must be a path to a .py file or a module name, got {source!r}")
    before = set(SCHEMES)
    if source.endswith(".py") or os.sep in source:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"scheme file {source!r} does not exist")
        name = f"ngdn_scheme_file_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        importlib.import_module(source)
    return [s for s in SCHEMES if s not in before]


def pick_scheme(source: str, loaded: list[str], name: str | None) -> str:
    """``name`` if given (it must be registered), else the one scheme ``source`` registered."""
    from reference.schemes import get_scheme

    if name is not None:
        get_scheme(name)
        return name
    if len(loaded) != 1:
        raise ValueError(f"{source} registered {len(loaded)} schemes ({loaded}); pass --scheme NAME")
    return loaded[0]


# --- draws and inputs ---------------------------------------------------------------------

class ProbeDraw(NamedTuple):
    """One probe call: shapes, query count, snapshot kind, gate scale, reduction, seed."""
    K: int
    V: int
    n: int
    snapshot: str
    gate_scale: float
    reduction: str
    seed: int


class StabilityDraw(NamedTuple):
    K: int
    V: int
    n: int
    snapshot: str
    state: str              # "random" (unit entries) or "snapshot" (M_0 = the snapshot)
    firings: int
    gate_scale: float
    reduction: str
    seed: int
    decay: float = 1.0      # the probe's γ is multiplied by this (SLOW_DECAY: slow decays)


class NestedDraw(NamedTuple):
    T: int
    L: int
    K: int
    V: int
    t0: int
    chunk: int
    level: int
    gate_scale: float
    seed: int


class OptimizedDraw(NamedTuple):
    T: int
    L: int
    K: int
    V: int
    reduction: str | tuple  # one, or one per level ℓ = 1..L-1
    gate_scale: float
    seed: int


def resolve(scheme):
    """The registered ``reference.schemes.Scheme`` for a name (a ``Scheme`` is returned as is):
    resolved once per battery run and passed to every property, with its probe, parameter
    shapes and query axes (``n`` is read from those, never from a parameter's name)."""
    from reference.schemes import Scheme, get_scheme

    return scheme if isinstance(scheme, Scheme) else get_scheme(scheme)


def accepts_name(fn):
    """Let ``fn(scheme, ...)`` take a scheme's name as well as a resolved ``Scheme``."""
    @functools.wraps(fn)
    def wrapper(scheme, *args, **kwargs):
        return fn(resolve(scheme), *args, **kwargs)
    return wrapper


def draw_query_count(scheme, K: int, n: int) -> int:
    """The query count to ask ``make_levels`` for: the draw's ``n`` for a scheme with a query
    axis, else ``K`` (its probe fixes ``n``; ``make_levels`` ignores the count)."""
    return n if scheme.has_query_bank else K


def snapshot(kind: str, B: int, H: int, K: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """An adversarial snapshot ``[B, H, K, V]`` in float64 (``SNAPSHOT_KINDS``)."""
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    if kind == "zero":
        return torch.zeros(B, H, K, V, dtype=F64)
    if kind == "tiny":
        return 1e-8 * randn(B, H, K, V)
    if kind == "large":
        return 1e4 * randn(B, H, K, V)
    if kind == "huge":
        return HUGE * randn(B, H, K, V)
    if kind == "near_rank_one":
        return randn(B, H, K, 1) @ randn(B, H, 1, V) + 1e-3 * randn(B, H, K, V)
    if kind == "orthonormal":          # orthonormal columns (V ≤ K) or rows (V > K)
        Q = torch.linalg.qr(randn(B, H, max(K, V), min(K, V))).Q
        return Q if V <= K else Q.transpose(-1, -2)
    if kind == "random":
        return randn(B, H, K, V)
    raise ValueError(f"snapshot kind must be one of {list(SNAPSHOT_KINDS)}, got {kind!r}")


@accepts_name
def scheme_params(scheme, H: int, K: int, V: int, n: int, reduction: str, gate_scale: float,
                  gen: torch.Generator) -> dict:
    """The scheme's per-head parameters as ``make_levels`` draws them (query count ``n``)."""
    from reference.nested import make_levels

    return make_levels(2, H, K, V, scheme=scheme.name, query_counts=[draw_query_count(scheme, K, n)],
                       reduction=reduction, generator=gen, gate_scale=gate_scale)[0].params


@accepts_name
def probe_inputs(scheme, d: ProbeDraw, B: int = 2, H: int = 2):
    """``M_below [B, H, K, V]`` of kind ``d.snapshot`` and the scheme's parameters (``make_levels``)."""
    gen = torch.Generator().manual_seed(d.seed)
    M_below = snapshot(d.snapshot, B, H, d.K, d.V, gen)
    return M_below, scheme_params(scheme, H, d.K, d.V, d.n, d.reduction, d.gate_scale, gen)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN equal to NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


# --- results -----------------------------------------------------------------------------

class Measured(NamedTuple):
    """A property's figure against its bound; ``problems``: what went wrong (empty if it passed);
    ``applicable`` False: the property does not apply to this scheme (reported as n/a)."""
    figure: float
    bound: float
    problems: tuple = ()
    applicable: bool = True

    @property
    def passed(self) -> bool:
        return not self.applicable or (self.figure <= self.bound and not self.problems)


class Row(NamedTuple):
    """One line of the report."""
    name: str
    measured: Measured
    draw: object            # the (shrunk / worst) draw, or None
    examples: int
    seconds: float
    verdict: str            # "ok", "FAIL", "EXPANSIVE", "n/a"
    unshrunk: tuple = ()    # a failure's (draw, Measured) on a random snapshot at full size (``unshrunk``)


def from_errors(errors: dict) -> Measured:
    """``{label: (error, bound)}`` (the property-test checks) -> the worst label's ratio against 1."""
    worst_label, worst = None, 0.0
    problems = []
    for label, (err, bound) in errors.items():
        ratio = (math.inf if err > 0 or not math.isfinite(err) else 0.0) if bound == 0 else err / bound
        if not math.isfinite(ratio) or err > bound:
            problems.append(f"{label}: {err:.3g} > {bound:.3g}")
        if ratio > worst or worst_label is None:
            worst_label, worst = label, ratio
    return Measured(worst, 1.0, tuple(problems))


# --- the properties ------------------------------------------------------------------------

PURE = "a probe must be a pure function of (M_below, params): no state kept between calls, no in-place change"


@accepts_name
def contract(scheme, d: ProbeDraw) -> Measured:
    from reference.schemes import PROBE_OUTPUTS

    probe = scheme.probe
    M_below, params = probe_inputs(scheme, d)
    problems = []
    kept, kept_params = M_below.clone(), {k: p.clone() for k, p in params.items()}
    # An in-place operation bumps a tensor's version counter even where it leaves every value as it
    # was (``M_below.clamp_(-1e30, 1e30)``): the values alone cannot see it, the counter does.
    version, versions = M_below._version, {k: p._version for k, p in params.items()}
    outputs = probe(M_below, params, d.reduction)           # shapes, dtype, device: the registry
    if not same(M_below, kept):
        problems.append(f"the probe changed M_below in place; {PURE}")
    elif M_below._version != version:
        problems.append(f"the probe changed M_below in place (an in-place operation on it, such as clamp_ or "
                        f"mul_, even one that leaves its values as they were): the nested reference hands the "
                        f"probe the live state of the level below, and autograd refuses a backward through a "
                        f"tensor changed in place; {PURE}")
    changed_params = [k for k, p in params.items() if not same(p, kept_params[k]) or p._version != versions[k]]
    if changed_params:
        problems.append(f"the probe changed parameter(s) {', '.join(map(repr, changed_params))} in place; {PURE}")
        params = kept_params
    again = probe(M_below, params, d.reduction)
    changed = [label for label, a, b in zip(PROBE_OUTPUTS, outputs, again) if not same(a, b)]
    if changed:
        problems.append(f"a second call on the same inputs changed {', '.join(changed)}; {PURE}")
    for label, x in zip(PROBE_OUTPUTS, outputs):
        if not bool(torch.isfinite(x).all()):
            problems.append(f"{label} is not finite on a finite {d.snapshot} snapshot")
    γ = outputs[4]
    other = "sum" if d.reduction == "mean" else "mean"
    if outputs[0].shape[-2] > 1 and bool((γ != 0).any()) and same(γ, probe(M_below, params, other)[4]):
        problems.append(f"γ is the same with reduction={d.reduction!r} and {other!r} at n = {outputs[0].shape[-2]} "
                        f"pairs: the probe ignores `reduction`, so a Level asking for one gets the other "
                        f"(CONTRACT 2: the firing's decay reduces the pairs' log-decays by their mean or sum)")
    if bool((γ > 0).any()):
        problems.append(f"γ > 0 (max {γ.max().item():.3g}): the decay amplifies the state")
    for label, x, role in (("β", outputs[2], "an erase gate above 1 over-erases (merge scales row i by "
                                             "1 − β_ii; |1 − β| > 1 grows the state)"),
                           ("ω", outputs[3], "a write gate outside [0, 1]")):
        lo, hi = x.min().item(), x.max().item()
        if lo < 0 or hi > 1:
            problems.append(f"{label} outside [0, 1] (min {lo:.3g}, max {hi:.3g}) on a {d.snapshot} snapshot: "
                            f"{role} (CONTRACT 2: gates are meant to lie in [0, 1])")
    stacked = probe(torch.stack([M_below, 2 * M_below], dim=1), params, d.reduction)
    second = probe(2 * M_below, params, d.reduction)
    for label, s, a, b in zip(PROBE_OUTPUTS, stacked, outputs, second):
        if not (torch.allclose(s[:, 0], a, rtol=1e-12, atol=0, equal_nan=True)
                and torch.allclose(s[:, 1], b, rtol=1e-12, atol=0, equal_nan=True)):
            problems.append(f"{label} on snapshots [B, F, H, K, V] differs from per-firing [B, H, K, V] calls")
    if scheme.has_query_bank:
        big = scheme.parameter_shapes(M_below.shape[-3], d.K, d.V, d.K + 1)   # every query axis K + 1 long
        too_many = {k: p if tuple(p.shape) == tuple(big[k]) else torch.zeros(big[k], dtype=F64)
                    for k, p in params.items()}
        try:
            probe(M_below, too_many, d.reduction)
            problems.append(f"a query bank of n = K + 1 = {d.K + 1} rows was accepted (n ≤ K)")
        except ValueError:
            pass
    if d.snapshot in ("random", "near_rank_one", "orthonormal"):
        leaves = {k: p.clone().requires_grad_() for k, p in params.items()}
        outs = probe(M_below, leaves, d.reduction)
        gen = torch.Generator().manual_seed(d.seed + 1)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() for o in outs)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        for k, g in zip(leaves, grads):
            if g is None or not bool(g.abs().sum() > 0):
                problems.append(f"declared parameter {k!r} gets no gradient from the probe's outputs: unused, or "
                                f"read through a detached or cached copy (the optimized op differentiates the "
                                f"probe; {PURE})")
    return Measured(float(len(problems)), 0.0, tuple(problems))


@accepts_name
def independence(scheme, d: ProbeDraw) -> Measured:
    """CONTRACT "Errors", batch and head independence, with ``B = H = 2``: replacing batch b's (head
    h's) snapshot, and head h's parameters, changes no other batch's (head's) probe output; the
    same through the nested reference (every activation, initial state and, per head, the
    scheme's parameters; output and final states). Bitwise: the other elements' arithmetic is
    unchanged."""
    from ngdn.nested_inputs import ACTIVATIONS, NestedShape, bounded_query_counts
    from ngdn.tolerances import relative_error, tolerance
    from reference.nested import Level
    from reference.schemes import PROBE_OUTPUTS

    checks, _ = _checks()
    problems = []
    M_below, params = probe_inputs(scheme, d, B=2, H=2)
    other_M, other_params = probe_inputs(scheme, d._replace(seed=d.seed + 7919, snapshot="random"), B=2, H=2)
    base = scheme.probe(M_below, params, d.reduction)
    # another batch element's (head's) snapshot in its place, at unit scale and at HUGE: a branch on
    # the whole tensor's magnitude (an "overflow guard") mixes the batch only when one element is large
    for scale, what in ((1.0, "snapshot"), (HUGE, f"snapshot, {HUGE:.0e} times larger,")):
        for b in range(2):
            M = M_below.clone()
            M[b] = scale * other_M[b]
            for label, x, y in zip(PROBE_OUTPUTS, scheme.probe(M, params, d.reduction), base):
                if not same(x[1 - b], y[1 - b]):
                    problems.append(f"probe: {label} of batch {1 - b} changed when only batch {b}'s {what} did "
                                    f"(the probe mixes the batch)")
        for h in range(2):
            M = M_below.clone()
            M[:, h] = scale * other_M[:, h]
            ps = {k: p.clone() for k, p in params.items()}
            for k in ps:
                ps[k][h] = other_params[k][h]
            for label, x, y in zip(PROBE_OUTPUTS, scheme.probe(M, ps, d.reduction), base):
                axis = x.dim() - (2 if label == "γ" else 3)
                if not same(x.select(axis, 1 - h), y.select(axis, 1 - h)):
                    problems.append(f"probe: {label} of head {1 - h} changed when only head {h}'s {what} and "
                                    f"parameters did (the probe mixes the heads)")
    # the batch's size: batch b alone gives what it gives in the batch of two
    bound = tolerance("promote_identities", "batch_slice", F64, mode="any")
    for b in range(2):
        for label, x, y in zip(PROBE_OUTPUTS, scheme.probe(M_below[b:b + 1], params, d.reduction), base):
            err = relative_error(x, y[b:b + 1]) if x.shape == y[b:b + 1].shape else math.inf
            if not err <= bound:
                problems.append(f"probe: {label} of batch {b} called alone differs from the batch of two "
                                f"({err:.3g} > {bound:.3g}; the probe depends on the batch's size)")

    L = 3
    n = [draw_query_count(scheme, d.K, q) for q in bounded_query_counts(L, d.K, d.V)]
    case = checks.NestedCase(NestedShape(B=2, T=16, H=2, L=L, K=d.K, V=d.V), d.seed, scheme=scheme.name,
                             intervals=(1,) * (L - 1), query_counts=tuple(n), reduction=d.reduction, chunk_size=8,
                             gate_scale=d.gate_scale)
    x, y = checks.case_inputs(case), checks.case_inputs(case._replace(seed=case.seed + 7919))
    o, states = checks.run(checks.naive_nested_gdn2, x, case)
    for scale, what in ((1.0, "inputs"), (HUGE, f"inputs, its initial states {HUGE:.0e} times larger,")):
        for b in range(2):
            edit = dict(x)
            for name in ACTIVATIONS:
                edit[name] = x[name].clone()
                edit[name][b] = y[name][b]
            edit["initial_states"] = [s.clone() for s in x["initial_states"]]
            for s, t in zip(edit["initial_states"], y["initial_states"]):
                s[b] = scale * t[b]
            o2, states2 = checks.run(checks.naive_nested_gdn2, edit, case)
            if not (same(o2[1 - b], o[1 - b]) and all(same(s[1 - b], t[1 - b]) for s, t in zip(states2, states))):
                problems.append(f"nested reference: batch {1 - b}'s output or final states changed when only "
                                f"batch {b}'s {what} did (the scheme mixes the batch)")
    alone = {name: x[name][:1] for name in ACTIVATIONS}
    alone.update(levels=x["levels"], initial_states=[s[:1] for s in x["initial_states"]])
    o1, states1 = checks.run(checks.naive_nested_gdn2, alone, case)
    err = max([relative_error(o1, o[:1])] + [relative_error(s, t[:1]) for s, t in zip(states1, states)])
    if not err <= bound:
        problems.append(f"nested reference: batch 0 run alone differs from the batch of two ({err:.3g} > "
                        f"{bound:.3g}; the scheme depends on the batch's size)")
    for h in range(2):
        edit = dict(x)
        for name in ACTIVATIONS:
            edit[name] = x[name].clone()
            edit[name][:, :, h] = y[name][:, :, h]
        edit["initial_states"] = [s.clone() for s in x["initial_states"]]
        for s, t in zip(edit["initial_states"], y["initial_states"]):
            s[:, h] = t[:, h]
        levels = []
        for lv, lw in zip(x["levels"], y["levels"]):
            ps = {k: p.clone() for k, p in lv.params.items()}
            for k in ps:
                ps[k][h] = lw.params[k][h]
            levels.append(Level(lv.scheme, lv.interval, ps, lv.reduction))
        edit["levels"] = levels
        o2, states2 = checks.run(checks.naive_nested_gdn2, edit, case)
        if not (same(o2[:, :, 1 - h], o[:, :, 1 - h])
                and all(same(s[:, 1 - h], t[:, 1 - h]) for s, t in zip(states2, states))):
            problems.append(f"nested reference: head {1 - h}'s output or final states changed when only head "
                            f"{h}'s inputs and parameters did (the scheme mixes the heads)")
    return Measured(float(len(problems)), 0.0, tuple(problems))


def permute_queries(scheme, params: dict, perm: torch.Tensor) -> dict:
    """``params`` with every query axis (``scheme.query_axes``) permuted by ``perm``."""
    out = dict(params)
    for key, axis in scheme.query_axes:
        out[key] = out[key].index_select(axis, perm)
    return out


@accepts_name
def permutation(scheme, d: ProbeDraw) -> Measured:
    from ngdn.tolerances import relative_error, tolerance
    from reference.promote import promote

    checks, _ = _checks()
    n = draw_query_count(scheme, d.K, d.n)
    pd = checks.PromoteDraw(B=2, H=2, K=d.K, V=d.V, n=n, scheme=scheme.name, reduction=d.reduction, seed=d.seed,
                            gate_scale=d.gate_scale)
    errors = checks.pair_permutation(pd, log=False)
    if scheme.has_query_bank:
        M_below, params = probe_inputs(scheme, d)
        M = torch.randn(M_below.shape, generator=torch.Generator().manual_seed(d.seed + 2), dtype=F64)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(d.seed + 3))
        base = promote(M, *scheme.probe(M_below, params, d.reduction))
        permuted = promote(M, *scheme.probe(M_below, permute_queries(scheme, params, perm), d.reduction))
        bound = tolerance("promote_identities", "permutation", F64, mode="any")
        errors["query_rows_permuted"] = (relative_error(permuted, base), bound)
    return from_errors(errors)


@accepts_name
def one_pair(scheme, d: ProbeDraw) -> Measured:
    from ngdn.tolerances import relative_error, tolerance
    from reference.gdn2 import gdn2_step
    from reference.promote import promote

    if not scheme.has_query_bank:
        return Measured(0.0, 1.0, (), applicable=False)
    M_below, params = probe_inputs(scheme, d._replace(n=1))
    M = torch.randn(M_below.shape, generator=torch.Generator().manual_seed(d.seed + 2), dtype=F64)
    κ, ν, β, ω, γ = scheme.probe(M_below, params, d.reduction)
    step = gdn2_step(M, κ[..., 0, :], ν[..., 0, :], γ, β[..., 0, :], ω[..., 0, :])
    bound = tolerance("promote_identities", "one_pair_gdn2_step", F64, mode="any")
    return from_errors({"one_pair": (relative_error(promote(M, κ, ν, β, ω, γ), step), bound)})


def gradcheck_message(text: str, names: list) -> str:
    """gradcheck's first line with its output and input indices named: ``Jacobian mismatch for
    output β with respect to input W_beta`` (inputs: ``M_below`` then the parameters)."""
    from reference.schemes import PROBE_OUTPUTS

    first = text.strip().splitlines()[0].split(", numerical")[0].rstrip(",")
    inputs = ["M_below", *names]

    def name(kind, i):
        table = PROBE_OUTPUTS if kind == "output" else inputs
        return table[int(i)] if int(i) < len(table) else i

    return re.sub(r"(output|input) (\d+)", lambda m: f"{m.group(1)} {name(m.group(1), m.group(2))}", first)


@accepts_name
def probe_gradcheck(scheme, d: ProbeDraw) -> Measured:
    from torch.autograd.gradcheck import GradcheckError

    probe = scheme.probe
    M_below, params = probe_inputs(scheme, d, B=1, H=1)
    names = list(params)

    def fn(M, *ps):
        return probe(M, dict(zip(names, ps)), d.reduction)

    leaves = (M_below.clone().requires_grad_(), *(params[k].clone().requires_grad_() for k in names))
    try:
        torch.autograd.gradcheck(fn, leaves, atol=1e-6, rtol=1e-5)
    except GradcheckError as e:    # other errors: measure() reports them as raised
        return Measured(math.inf, 0.0, (f"gradcheck in (M_below, {', '.join(names)}): "
                                        f"{gradcheck_message(str(e), names)}: the probe's backward (analytical "
                                        f"gradient) disagrees with finite differences",))
    return Measured(0.0, 0.0)


@accepts_name
def numpy_twin(scheme, d: ProbeDraw) -> Measured:
    from reference.promote_numpy import SCHEMES_NUMPY

    if scheme.name not in SCHEMES_NUMPY:
        return Measured(0.0, 1.0, (), applicable=False)
    checks, _ = _checks()
    pd = checks.PromoteDraw(B=2, H=2, K=d.K, V=d.V, n=draw_query_count(scheme, d.K, d.n), scheme=scheme.name,
                            reduction=d.reduction, seed=d.seed, gate_scale=d.gate_scale)
    return from_errors(checks.promote_torch_vs_numpy(pd, log=False))


@accepts_name
def nested_case(scheme, d: NestedDraw):
    from ngdn.nested_inputs import NestedShape, bounded_query_counts

    checks, _ = _checks()
    n = [draw_query_count(scheme, d.K, q) for q in bounded_query_counts(d.L, d.K, d.V)]
    return checks.NestedCase(NestedShape(B=1, T=d.T, H=1, L=d.L, K=d.K, V=d.V), d.seed, scheme=scheme.name,
                             intervals=(1,) * (d.L - 1), query_counts=tuple(n), chunk_size=8,
                             gate_scale=d.gate_scale)


@accepts_name
def nested_causality(scheme, d: NestedDraw) -> Measured:
    checks, _ = _checks()
    return from_errors(checks.causal_prefix(nested_case(scheme, d), min(d.t0, d.T - 1)))


@accepts_name
def firing_timing(scheme, d: NestedDraw) -> Measured:
    checks, _ = _checks()
    c = min(d.chunk, -(-d.T // 8))
    return from_errors(checks.firing_timing(nested_case(scheme, d), c, min(d.level, d.L - 1)))


@accepts_name
def optimized_case(scheme, d: OptimizedDraw):
    """The optimized op's case for one draw (every level fires each chunk, bounded query counts)."""
    from ngdn.nested_inputs import NestedShape, bounded_query_counts

    _, opt = _checks()
    n = [draw_query_count(scheme, d.K, q) for q in bounded_query_counts(d.L, d.K, d.V)]
    return opt.OptCase(NestedShape(B=1, T=d.T, H=1, L=d.L, K=d.K, V=d.V), d.seed, scheme=scheme.name,
                       intervals=(1,) * (d.L - 1), query_counts=tuple(n), reduction=d.reduction,
                       gate_scale=d.gate_scale)


@accepts_name
def optimized(scheme, d: OptimizedDraw) -> Measured:
    _, opt = _checks()
    return from_errors(opt.optimized_vs_reference(optimized_case(scheme, d), torch.float32, log=False))


@accepts_name
def bitwise(scheme, d: OptimizedDraw) -> Measured:
    _, opt = _checks()
    return from_errors(opt.bitwise_reproducible(optimized_case(scheme, d), torch.float32))


@accepts_name
def growth_factor(scheme, d: StabilityDraw) -> float:
    """``max_{j ≤ k} ‖M_j‖ / (‖M_0‖ + Σ_{i ≤ j} ‖write_i‖)`` over ``d.firings`` firings on one
    snapshot (float64; ``inf`` once a state is not finite); the probe's ``γ`` times ``d.decay``."""
    from reference.promote import promote

    probe = scheme.probe
    pd = ProbeDraw(d.K, d.V, d.n, d.snapshot, d.gate_scale, d.reduction, d.seed)
    M_below, params = probe_inputs(scheme, pd, B=1, H=1)
    gen = torch.Generator().manual_seed(d.seed + 1)
    M = M_below.clone() if d.state == "snapshot" else torch.randn(M_below.shape, generator=gen, dtype=F64)
    norm = lambda x: torch.linalg.matrix_norm(x).max().item()  # noqa: E731
    budget, worst = norm(M), 0.0
    for _ in range(d.firings):
        κ, ν, β, ω, γ = probe(M_below, params, d.reduction)
        budget += norm(κ.transpose(-1, -2) @ (ω * ν))
        M = promote(M, κ, ν, β, ω, γ * d.decay)
        size = norm(M)
        if not math.isfinite(size):
            return math.inf
        if budget > 0:
            worst = max(worst, size / budget)
    return worst


@accepts_name
def stability(scheme, d: StabilityDraw, threshold: float = DEFAULT_THRESHOLD) -> Measured:
    g = growth_factor(scheme, d)
    if g <= threshold:
        return Measured(g, threshold)
    how = (f" with slow decays (the probe's γ × {d.decay:g}) at make_levels' parameter scales: the erase itself "
           "expands the state (e.g. an erase gate β > 1, or overlapping keys)" if d.decay != 1.0 else "")
    return Measured(g, threshold, (f"expansive: growth factor {g:.4g} after ≤ {d.firings} firings{how}",))


# --- strategies --------------------------------------------------------------------------------

# Slow decays for the stability search: the probe's γ times this (a level whose decay gate has
# learned to keep its memory). At make_levels' scales a firing then decays by about 0.07 % instead
# of ½, which no longer hides an erase that expands the state (CONTRACT 2).
SLOW_DECAY = 1e-3
SLOW_DECAY_SNAPSHOTS = ("tiny", "near_rank_one", "orthonormal", "random")   # the unit and smaller scales


def probe_draws(scheme):
    from hypothesis import strategies as st

    @st.composite
    def draws(draw):
        K = draw(st.sampled_from((4, 8)))
        return ProbeDraw(K=K, V=draw(st.sampled_from((3, 6))), n=draw(st.integers(1, K)),
                         snapshot=draw(st.sampled_from(SNAPSHOT_KINDS)), gate_scale=draw(st.sampled_from((1.0, 30.0))),
                         reduction=draw(st.sampled_from(("mean", "sum"))), seed=draw(st.integers(0, 2**31 - 1)))
    return draws()


def gradcheck_draws(scheme):
    return probe_draws(scheme).filter(lambda d: d.snapshot in ("random", "near_rank_one", "orthonormal")).map(
        lambda d: d._replace(K=4, V=3, n=min(d.n, 3)))


def stability_draws(scheme):
    from hypothesis import strategies as st

    @st.composite
    def draws(draw):
        K = draw(st.sampled_from((4, 8, 16)))
        slow = draw(st.booleans())
        kinds = SLOW_DECAY_SNAPSHOTS if slow else SNAPSHOT_KINDS[1:]
        return StabilityDraw(K=K, V=draw(st.sampled_from((4, 8, 16))), n=draw(st.integers(1, K)),
                             snapshot=draw(st.sampled_from(kinds)),
                             state=draw(st.sampled_from(("random", "snapshot"))), firings=draw(st.integers(1, 64)),
                             gate_scale=1.0 if slow else draw(st.sampled_from((1.0, 30.0))),
                             reduction=draw(st.sampled_from(("mean", "sum"))), seed=draw(st.integers(0, 2**31 - 1)),
                             decay=SLOW_DECAY if slow else 1.0)
    return draws()


def nested_draws(scheme):
    from hypothesis import strategies as st

    @st.composite
    def draws(draw):
        T = draw(st.sampled_from((12, 16, 29)))
        L = draw(st.integers(2, 3))
        return NestedDraw(T=T, L=L, K=draw(st.sampled_from((4, 8))), V=draw(st.sampled_from((3, 8))),
                          t0=draw(st.integers(1, T - 1)), chunk=draw(st.integers(1, 3)), level=draw(st.integers(1, 2)),
                          gate_scale=draw(st.sampled_from((1.0, 100.0))), seed=draw(st.integers(0, 2**31 - 1)))
    return draws()


class Property(NamedTuple):
    """A battery entry: ``fn(scheme, draw) -> Measured``; ``draws(scheme)``: a Hypothesis strategy
    (None: run ``fixed`` draws); ``share``: examples as a multiple of ``--examples``."""
    name: str
    fn: Callable
    draws: Callable | None = None
    share: float = 1.0
    fixed: tuple = ()
    cuda_only: bool = False
    maximise: bool = False
    explicit: tuple = ()        # draws the search always starts from (Hypothesis ``@example``)


def _kernel_sizes(K: int, V: int) -> dict:
    """``K, V`` under the interpreter; on CUDA those of the GPU suite's first compile bucket
    (``ngdn.compile_buckets``, H = 1 like these draws), whose kernels the suite compiles anyway."""
    from ngdn.compile_buckets import buckets

    bucket = buckets("level0")[0]
    return dict(K=K, V=V) if bucket is None else dict(K=bucket.K, V=bucket.V)


# Level 1 reduces its decays with ``mean``, level 2 with ``sum``: both reductions in one interpreter run.
OPTIMIZED_CPU = OptimizedDraw(T=130, L=3, **_kernel_sizes(16, 32), reduction=("mean", "sum"), gate_scale=1.0, seed=0)
OPTIMIZED_CUDA = (OPTIMIZED_CPU, OptimizedDraw(T=256, L=4, **_kernel_sizes(64, 64), reduction="sum", gate_scale=30.0,
                                               seed=1))

# The CONTRACT 2 "Hazard" configuration (n = K keys read from a near-rank-one snapshot, 64 firings) at both
# gate scales: a scheme that over-erases along overlapping keys shows it here whatever the budget; and
# make_levels' scales with slow decays, where an erase gate above 1 is not hidden by the decay.
STABILITY_SEEDS = tuple(StabilityDraw(K=16, V=8, n=16, snapshot="near_rank_one", state=state, firings=64,
                                      gate_scale=g, reduction="mean", seed=0)
                        for state, g in (("snapshot", 1.0), ("random", 30.0))) + (
    StabilityDraw(K=16, V=4, n=16, snapshot="random", state="snapshot", firings=64, gate_scale=1.0,
                  reduction="mean", seed=1, decay=SLOW_DECAY),)

PROPERTIES = (
    Property("contract", contract, probe_draws),
    Property("independence", independence, probe_draws, share=0.3),
    Property("permutation", permutation, probe_draws, share=0.5),
    Property("one_pair", one_pair, probe_draws, share=0.5),
    Property("probe_gradcheck", probe_gradcheck, gradcheck_draws, share=0.5),
    Property("numpy_twin", numpy_twin, probe_draws, share=0.5),
    Property("nested_causality", nested_causality, nested_draws, share=0.2),
    Property("firing_timing", firing_timing, nested_draws, share=0.2),
    Property("optimized", optimized, fixed=(OPTIMIZED_CPU,)),
    Property("bitwise", bitwise, fixed=OPTIMIZED_CUDA, cuda_only=True),
    Property("stability", stability, stability_draws, share=4.0, maximise=True, explicit=STABILITY_SEEDS),
)
PROPERTY_NAMES = tuple(p.name for p in PROPERTIES)
DRAW_TYPES = {cls.__name__: cls for cls in (ProbeDraw, StabilityDraw, NestedDraw, OptimizedDraw)}


def examples_text(examples: int = DEFAULT_EXAMPLES) -> str:
    """What ``--examples N`` runs, row by row (the help's account): a searched property runs
    ``max(1, round(N × share))`` Hypothesis examples (plus its explicit seed draws), a fixed row its
    fixed draws whatever N is; shown at ``N = examples``."""
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    searched, fixed = [], []
    for p in PROPERTIES:
        if p.draws is not None:
            seeds = f" + {len(p.explicit)} seed draws" if p.explicit else ""
            searched.append(f"{p.name} {max(1, round(examples * p.share))}{seeds}")
        else:
            fixed.append(f"{p.name} {len(p.fixed)}{' (CUDA only)' if p.cuda_only else ''}")
    return (f"each searched property runs it times its share, at {examples}: {', '.join(searched)} (a failing "
            f"draw's shrinking adds calls); fixed draws whatever it is: {', '.join(fixed)}")


def get_property(name: str) -> Property:
    for p in PROPERTIES:
        if p.name == name:
            return p
    raise ValueError(f"unknown property {name!r}; the battery has {list(PROPERTY_NAMES)}")


def parse_draw(text: str):
    """A draw from its repr (the reproduction command's ``--draw``); only the draw types are known."""
    if not isinstance(text, str):
        raise TypeError(f"draw must be a str such as 'ProbeDraw(K=4, ...)', got {type(text).__name__}")
    try:
        draw = eval(text, {"__builtins__": {}}, dict(DRAW_TYPES))   # noqa: S307 (names restricted)
    except Exception as e:
        raise ValueError(f"cannot read draw {text!r}: {e}") from None
    if not isinstance(draw, tuple(DRAW_TYPES.values())):
        raise ValueError(f"draw must be one of {sorted(DRAW_TYPES)}, got {text!r}")
    return draw


def draw_type(prop: Property) -> type:
    """The draw type ``prop`` takes (its function's ``d`` annotation; one of ``DRAW_TYPES``)."""
    if not isinstance(prop, Property):
        raise TypeError(f"prop must be a Property of PROPERTIES, got {type(prop).__name__}")
    annotation = inspect.signature(prop.fn).parameters["d"].annotation
    return DRAW_TYPES[annotation] if isinstance(annotation, str) else annotation


REDUCTIONS = ("mean", "sum")
STATES = ("random", "snapshot")


def check_draw(prop: Property, draw) -> None:
    """A ``ValueError`` naming what is wrong when ``draw`` is not one ``prop`` can run: another
    property's draw type, a field of the wrong type, or a value outside the field's domain (a
    snapshot kind, a reduction, a size below 1, ``n > K``, ``t0`` outside the sequence, a level
    above ``L - 1``). A reproduction's draw is the user's input: refused as a usage error, never
    measured as the scheme failing."""
    expected = draw_type(prop)
    if not isinstance(draw, expected):
        raise ValueError(f"property {prop.name!r} runs on a {expected.__name__}, got {draw!r}")
    fields = draw._asdict()
    bad = []
    for name, value in fields.items():
        if name in ("gate_scale", "decay"):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value < math.inf):
                bad.append(f"{name} must be a positive finite number, got {value!r}")
        elif name == "snapshot":
            if value not in SNAPSHOT_KINDS:
                bad.append(f"snapshot must be one of {list(SNAPSHOT_KINDS)}, got {value!r}")
        elif name == "state":
            if value not in STATES:
                bad.append(f"state must be one of {list(STATES)}, got {value!r}")
        elif name == "reduction":
            per_level = isinstance(draw, OptimizedDraw) and isinstance(value, tuple)
            if not (value in REDUCTIONS if isinstance(value, str) else per_level and all(
                    isinstance(r, str) and r in REDUCTIONS for r in value)):
                bad.append(f"reduction must be one of {list(REDUCTIONS)}"
                           f"{' or a tuple of them, one per level 1..L-1' if isinstance(draw, OptimizedDraw) else ''}"
                           f", got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "seed" else 1):
            bad.append(f"{name} must be an int ≥ {0 if name == 'seed' else 1}, got {value!r}")
    if not bad:
        if "n" in fields and draw.n > draw.K:
            bad.append(f"n = {draw.n} > K = {draw.K} (a firing reads at most K pairs)")
        if "L" in fields and draw.L < 2:
            bad.append(f"L must be ≥ 2 (a nested memory has levels above level 0), got {draw.L}")
        if isinstance(draw, NestedDraw) and not (draw.t0 < draw.T and draw.level < draw.L):
            bad.append(f"t0 must lie in 1..T-1 and level in 1..L-1, got t0 = {draw.t0}, level = {draw.level} "
                       f"at T = {draw.T}, L = {draw.L}")
        if isinstance(draw, OptimizedDraw) and isinstance(draw.reduction, tuple) and len(draw.reduction) != draw.L - 1:
            bad.append(f"reduction holds {len(draw.reduction)} entries for L - 1 = {draw.L - 1} levels")
    if bad:
        raise ValueError(f"draw {draw!r} for {prop.name!r}: " + "; ".join(bad))


def unshrunk(prop: Property, draw):
    """The draw to measure a shrunk failure again on: a random snapshot at the largest sizes its
    search draws (``ProbeDraw`` K = 8, V = 6, or ``probe_gradcheck``'s own sizes; ``NestedDraw``
    T = 29, K = V = 8), every other field kept; None when there is none (fixed draws, the stability
    search, which does not shrink) or it is the draw itself. Hypothesis shrinks toward the smallest
    snapshot that still fails, where an error of 1e-12 against a bound of 1e-13 reads as round-off;
    the same property on a normal snapshot shows the size of the fault (e.g. 0.035)."""
    check_draw(prop, draw)
    if prop.draws is None or prop.maximise:
        return None
    if isinstance(draw, ProbeDraw):
        sizes = {} if prop.name == "probe_gradcheck" else dict(K=8, V=6)
        again = draw._replace(snapshot="random", **sizes)
    elif isinstance(draw, NestedDraw):
        again = draw._replace(T=29, K=8, V=8, t0=min(draw.t0, 28))
    else:
        return None
    return None if again == draw else again


# --- running -----------------------------------------------------------------------------------

def measure(prop: Property, scheme, draw, threshold: float) -> Measured:
    """One evaluation of ``prop`` on ``draw`` (``scheme``: a resolved ``Scheme``); an exception is
    a failure carrying its message."""
    try:
        if prop.name == "stability":
            return stability(scheme, draw, threshold)
        return prop.fn(scheme, draw)
    except Exception as e:  # noqa: BLE001 (a scheme's error is the report's content)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = ""
        shapes = re.search(r"size|shape|mat1|mat2|dimension|broadcast", first, flags=re.I)
        if isinstance(e, RuntimeError) and shapes and hasattr(draw, "K") and hasattr(draw, "V"):
            hint = (f" (at K = {draw.K}, V = {draw.V}: do the declared parameter shapes match how the probe "
                    f"uses the parameters?)")
        return Measured(math.inf, 0.0 if prop.name != "stability" else threshold,
                        (f"raised {type(e).__name__}: {first}"[:300] + hint,))


def _score(m: Measured) -> float:
    if not m.applicable:
        return -math.inf
    if m.problems and not math.isfinite(m.figure):
        return math.inf
    return m.figure / m.bound if m.bound > 0 else (math.inf if m.figure > 0 or m.problems else 0.0)


def search(prop: Property, scheme, examples: int, threshold: float):
    """Hypothesis over ``prop.draws``: a failing draw is shrunk (and returned); ``maximise``:
    the draw with the largest figure (``target()``). Returns ``(Measured, draw, examples run)``."""
    from hypothesis import HealthCheck, Phase, example, given, settings, target
    from hypothesis.errors import Flaky

    worst = {"score": -math.inf, "measured": None, "draw": None, "count": 0}
    failing = {}

    class Failed(Exception):
        pass

    phases = [Phase.explicit, Phase.generate, Phase.target] + ([] if prop.maximise else [Phase.shrink])

    def explore(draw):
        m = measure(prop, scheme, draw, threshold)
        worst["count"] += 1
        s = _score(m)
        if prop.maximise:
            target(m.figure if math.isfinite(m.figure) else 1e300, label=prop.name)
        if s > worst["score"] or worst["measured"] is None:
            worst.update(score=s, measured=m, draw=draw)
        if not prop.maximise and not m.passed:
            failing.update(measured=m, draw=draw)         # the last one is the shrunk one
            raise Failed()

    for d in reversed(prop.explicit):
        explore = example(draw=d)(explore)
    explore = given(draw=prop.draws(scheme))(explore)
    explore = settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=phases,
                       suppress_health_check=list(HealthCheck), print_blob=False)(explore)

    try:
        explore()
    except Failed:
        return failing["measured"], failing["draw"], worst["count"]
    except Flaky:
        m = failing.get("measured") or worst["measured"]
        return (Measured(math.inf, 0.0, (f"the same draw passed once and failed once: {PURE}",
                                         *(m.problems if m is not None else ()))),
                failing.get("draw", worst["draw"]), worst["count"])
    except Exception as e:  # noqa: BLE001 (e.g. every draw filtered out)
        return Measured(math.inf, 0.0, (f"search raised {type(e).__name__}: {e}"[:300],)), None, worst["count"]
    return worst["measured"], worst["draw"], worst["count"]


def run_property(prop: Property, scheme, examples: int = DEFAULT_EXAMPLES,
                 threshold: float = DEFAULT_THRESHOLD, draw=None) -> Row:
    """One report row: ``draw`` given: that draw only (a reproduction); else the search or the fixed draws.
    ``scheme``: a name or a resolved ``reference.schemes.Scheme``."""
    scheme = resolve(scheme)
    if draw is not None:
        check_draw(prop, draw)
    start = time.perf_counter()
    if draw is not None:
        m, worst_draw, count = measure(prop, scheme, draw, threshold), draw, 1
    elif prop.draws is not None:
        m, worst_draw, count = search(prop, scheme, max(1, round(examples * prop.share)), threshold)
    else:
        m, worst_draw, count = Measured(0.0, 1.0), None, 0
        for d in prop.fixed:
            md = measure(prop, scheme, d, threshold)
            count += 1
            if _score(md) > _score(m) or not md.passed:
                m, worst_draw = md, d
            if not md.passed:
                break
    if not m.applicable:
        verdict = "n/a"
    elif m.passed:
        verdict = "ok"
    else:
        verdict = "EXPANSIVE" if any(p.startswith("expansive") for p in m.problems) else "FAIL"
    also = ()
    if verdict == "FAIL" and worst_draw is not None:
        again = unshrunk(prop, worst_draw)
        if again is not None:
            also = ((again, measure(prop, scheme, again, threshold)),)
    return Row(prop.name, m, worst_draw, count, time.perf_counter() - start, verdict, also)


def battery(scheme, examples: int = DEFAULT_EXAMPLES, threshold: float = DEFAULT_THRESHOLD,
            only=None, cuda: bool = False, progress=None):
    """Every applicable property's row, in ``PROPERTIES`` order (``only``: those names)."""
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    if not isinstance(threshold, (int, float)) or not threshold >= 1.0:
        raise ValueError(f"threshold must be a number ≥ 1, got {threshold!r}")
    for name in only or ():
        get_property(name)
    scheme = resolve(scheme)
    rows = []
    for prop in PROPERTIES:
        if (only and prop.name not in only) or (prop.cuda_only and not cuda):
            continue
        if progress is not None:
            print(f"[ngdn scheme check] {prop.name} ...", file=progress, flush=True)
        rows.append(run_property(prop, scheme, examples, threshold))
    return rows


def reproduction(source: str, scheme: str, row: Row, threshold: float) -> str:
    """The one-line command that re-runs ``row``'s property on its draw."""
    extra = f" --threshold {threshold}" if threshold != DEFAULT_THRESHOLD else ""
    draw = f' --draw "{row.draw!r}"' if row.draw is not None else ""
    return f"ngdn scheme check {source} --scheme {scheme} --only {row.name}{draw}{extra}"


def figure_text(m: Measured) -> str:
    return "-" if not m.applicable else f"{m.figure:.4g}"


def report(source: str, scheme: str, rows, threshold: float) -> tuple[str, bool]:
    """The table, then each failure's example and reproduction command. Returns ``(text, all passed)``."""
    from ngdn.table import text_table as _table

    lines = [f"scheme {scheme!r} from {source}"]
    table = [(r.name, figure_text(r.measured), f"≤ {r.measured.bound:.4g}" if r.measured.applicable else "-",
              r.examples, f"{r.seconds:.1f}", r.verdict) for r in rows]
    lines.append(_table(table, ("property", "figure", "tolerance", "examples", "s", "verdict")))
    ok = all(r.measured.passed for r in rows)
    for r in rows:
        if r.measured.passed:
            continue
        lines.append(f"\n{r.verdict}: {r.name}")
        lines += [f"  {p}" for p in r.measured.problems]
        if r.draw is not None:
            lines.append(f"  example: {r.draw!r}")
        lines.append(f"  reproduce: {reproduction(source, scheme, r, threshold)}")
        for d, m in r.unshrunk:
            outcome = "passes there" if m.passed else "; ".join(m.problems) or f"figure {m.figure:.4g}"
            lines.append(f"  on a random snapshot, not shrunk ({d!r}): {outcome}")
            if not m.passed:
                lines.append(f"  reproduce: {reproduction(source, scheme, r._replace(draw=d), threshold)}")
    lines.append("\nall properties pass" if ok else "\nSOME PROPERTIES FAIL")
    return "\n".join(lines), ok
