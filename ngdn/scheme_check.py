"""The promotion-scheme battery behind ``ngdn scheme check`` (and ``pytest property_tests --scheme``).

A scheme (``reference.schemes.register_scheme``) is checked property by property; each
property is a function ``(scheme, draw) -> Measured(figure, bound, problems)`` that passes
when ``figure ≤ bound``. Properties with a draw type are searched with Hypothesis (the
failing draw is shrunk; the stability search maximises its figure with ``target()``);
the rest run fixed cases.

- ``contract``: on snapshots that are zero, tiny (1e-8), large (1e4), near rank one,
  orthonormal or random, with ``K ≠ V``: the probe returns SPEC 2 shapes and dtype (the
  registry checks them), finite outputs, ``γ ≤ 0``, batched snapshots ``[B, F, H, K, V]``
  equal the per-firing results, ``n > K`` is a ``ValueError`` (schemes with a query bank
  ``Q``), and every declared parameter is used (moves some output). Figure: violations.
- ``permutation``: permuting a firing's pairs leaves ``M_new`` unchanged (torch and NumPy
  promote, ``ngdn.checks.nested.pair_permutation``) and, with a ``Q``, so does permuting ``Q``'s
  rows (the scheme treats its queries alike). ``promote_identities.permutation`` bound.
- ``one_pair``: with ``n = 1`` (schemes with a ``Q``) a firing is one GDN-2 token step
  ``k=κ, v=ν, b=β, w=ω, g=γ``; n/a without a ``Q``.
- ``probe_gradcheck``: float64 ``torch.autograd.gradcheck`` of the probe in every parameter
  and in the snapshot (catches a hand-written backward that is wrong).
- ``numpy_twin``: probe and promote vs the scheme's entry in
  ``reference.promote_numpy.SCHEMES_NUMPY`` (``ngdn.checks.nested.promote_torch_vs_numpy``); n/a
  when the scheme registers none.
- ``nested_causality`` / ``firing_timing``: the nested reference with this scheme at every
  level (chunk size 8): changing tokens ``t ≥ t0`` changes no earlier output; a chunk's
  writes are invisible through its end and visible from the next chunk
  (``ngdn.checks.nested.causal_prefix``, ``firing_timing``; bitwise).
- ``optimized``: ``optimized.chunk_nested_gdn2`` with this scheme vs the float64 reference:
  output, final states, every gradient (``ngdn.checks.nested_optimized.optimized_vs_reference``;
  the Triton interpreter on CPU). On CUDA also ``bitwise``: two runs agree bit for bit.
- ``stability``: the growth factor of k ≤ 64 firings on one adversarial snapshot

      growth = max_{j ≤ k} ‖M_j‖_F / (‖M_0‖_F + Σ_{i ≤ j} ‖κ_i^T (ω_i ⊙ ν_i)‖_F)

  (float64; ≤ 1 for a scheme whose decay-and-erase is non-expansive), maximised over
  snapshot kinds, shapes, gate scales and k with Hypothesis ``target()``. Above the
  threshold (default 1 + 1e-3) the scheme is reported *expansive* with the input.

The battery uses the library's check modules (``ngdn.checks.nested``,
``ngdn.checks.nested_optimized``), the same functions the property tests run.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, NamedTuple

import torch

F64 = torch.float64
DEFAULT_THRESHOLD = 1.001
DEFAULT_EXAMPLES = 30
SNAPSHOT_KINDS = ("zero", "tiny", "large", "near_rank_one", "orthonormal", "random")


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
    reduction: str
    gate_scale: float
    seed: int


def has_query_bank(scheme: str) -> bool:
    from reference.schemes import get_scheme

    return "Q" in get_scheme(scheme).parameter_shapes(1, 4, 3, 2)


def query_count_for(scheme: str, K: int, n: int) -> int:
    return n if has_query_bank(scheme) else K


def snapshot(kind: str, B: int, H: int, K: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """An adversarial snapshot ``[B, H, K, V]`` in float64 (``SNAPSHOT_KINDS``)."""
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    if kind == "zero":
        return torch.zeros(B, H, K, V, dtype=F64)
    if kind == "tiny":
        return 1e-8 * randn(B, H, K, V)
    if kind == "large":
        return 1e4 * randn(B, H, K, V)
    if kind == "near_rank_one":
        return randn(B, H, K, 1) @ randn(B, H, 1, V) + 1e-3 * randn(B, H, K, V)
    if kind == "orthonormal":          # orthonormal columns (V ≤ K) or rows (V > K)
        Q = torch.linalg.qr(randn(B, H, max(K, V), min(K, V))).Q
        return Q if V <= K else Q.transpose(-1, -2)
    if kind == "random":
        return randn(B, H, K, V)
    raise ValueError(f"snapshot kind must be one of {list(SNAPSHOT_KINDS)}, got {kind!r}")


def probe_inputs(scheme: str, d: ProbeDraw, B: int = 2, H: int = 2):
    """``M_below [B, H, K, V]`` of kind ``d.snapshot`` and the scheme's parameters (``make_levels``)."""
    from reference.nested import make_levels

    gen = torch.Generator().manual_seed(d.seed)
    M_below = snapshot(d.snapshot, B, H, d.K, d.V, gen)
    n = query_count_for(scheme, d.K, d.n)
    params = make_levels(2, H, d.K, d.V, scheme=scheme, query_counts=[n], reduction=d.reduction,
                         generator=gen, gate_scale=d.gate_scale)[0].params
    return M_below, params


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

def contract(scheme: str, d: ProbeDraw) -> Measured:
    from reference.schemes import get_scheme

    probe = get_scheme(scheme).probe
    M_below, params = probe_inputs(scheme, d)
    problems = []
    outputs = probe(M_below, params, d.reduction)           # shapes, dtype, device: the registry
    for label, x in zip("κνβωγ", outputs):
        if not bool(torch.isfinite(x).all()):
            problems.append(f"{label} is not finite on a finite {d.snapshot} snapshot")
    γ = outputs[4]
    if bool((γ > 0).any()):
        problems.append(f"γ > 0 (max {γ.max().item():.3g}): the decay amplifies the state")
    stacked = probe(torch.stack([M_below, 2 * M_below], dim=1), params, d.reduction)
    second = probe(2 * M_below, params, d.reduction)
    for label, s, a, b in zip("κνβωγ", stacked, outputs, second):
        if not (torch.allclose(s[:, 0], a, rtol=1e-12, atol=0, equal_nan=True)
                and torch.allclose(s[:, 1], b, rtol=1e-12, atol=0, equal_nan=True)):
            problems.append(f"{label} on snapshots [B, F, H, K, V] differs from per-firing [B, H, K, V] calls")
    if has_query_bank(scheme):
        too_many = {**params, "Q": torch.zeros(params["Q"].shape[0], d.K + 1, d.K, dtype=F64)}
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
                problems.append(f"declared parameter {k!r} is not used by the probe")
    return Measured(float(len(problems)), 0.0, tuple(problems))


def permutation(scheme: str, d: ProbeDraw) -> Measured:
    from ngdn.tolerances import relative_error, tolerance
    from reference.promote import promote
    from reference.schemes import get_scheme

    checks, _ = _checks()
    n = query_count_for(scheme, d.K, d.n)
    pd = checks.PromoteDraw(B=2, H=2, K=d.K, V=d.V, n=n, scheme=scheme, reduction=d.reduction, seed=d.seed,
                            gate_scale=d.gate_scale)
    errors = checks.pair_permutation(pd, log=False)
    if has_query_bank(scheme):
        M_below, params = probe_inputs(scheme, d)
        M = torch.randn(M_below.shape, generator=torch.Generator().manual_seed(d.seed + 2), dtype=F64)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(d.seed + 3))
        probe = get_scheme(scheme).probe
        base = promote(M, *probe(M_below, params, d.reduction))
        permuted = promote(M, *probe(M_below, {**params, "Q": params["Q"][:, perm]}, d.reduction))
        bound = tolerance("promote_identities", "permutation", F64, mode="any")
        errors["query_rows_permuted"] = (relative_error(permuted, base), bound)
    return from_errors(errors)


def one_pair(scheme: str, d: ProbeDraw) -> Measured:
    from ngdn.tolerances import relative_error, tolerance
    from reference.gdn2 import gdn2_step
    from reference.promote import promote
    from reference.schemes import get_scheme

    if not has_query_bank(scheme):
        return Measured(0.0, 1.0, (), applicable=False)
    M_below, params = probe_inputs(scheme, d._replace(n=1))
    M = torch.randn(M_below.shape, generator=torch.Generator().manual_seed(d.seed + 2), dtype=F64)
    κ, ν, β, ω, γ = get_scheme(scheme).probe(M_below, params, d.reduction)
    step = gdn2_step(M, κ[..., 0, :], ν[..., 0, :], γ, β[..., 0, :], ω[..., 0, :])
    bound = tolerance("promote_identities", "one_pair_gdn2_step", F64, mode="any")
    return from_errors({"one_pair": (relative_error(promote(M, κ, ν, β, ω, γ), step), bound)})


def probe_gradcheck(scheme: str, d: ProbeDraw) -> Measured:
    from reference.schemes import get_scheme

    probe = get_scheme(scheme).probe
    M_below, params = probe_inputs(scheme, d, B=1, H=1)
    names = list(params)

    def fn(M, *ps):
        return probe(M, dict(zip(names, ps)), d.reduction)

    leaves = (M_below.clone().requires_grad_(), *(params[k].clone().requires_grad_() for k in names))
    try:
        torch.autograd.gradcheck(fn, leaves, atol=1e-6, rtol=1e-5)
    except RuntimeError as e:      # gradcheck's GradcheckError
        first = str(e).strip().splitlines()[0].split(", numerical")[0]
        return Measured(math.inf, 0.0, (f"gradcheck in (M_below, {', '.join(names)}): {first}",))
    return Measured(0.0, 0.0)


def numpy_twin(scheme: str, d: ProbeDraw) -> Measured:
    from reference.promote_numpy import SCHEMES_NUMPY

    if scheme not in SCHEMES_NUMPY:
        return Measured(0.0, 1.0, (), applicable=False)
    checks, _ = _checks()
    pd = checks.PromoteDraw(B=2, H=2, K=d.K, V=d.V, n=query_count_for(scheme, d.K, d.n), scheme=scheme,
                            reduction=d.reduction, seed=d.seed, gate_scale=d.gate_scale)
    return from_errors(checks.promote_torch_vs_numpy(pd, log=False))


def nested_case(scheme: str, d: NestedDraw):
    from ngdn.nested_inputs import NestedShape, bounded_query_counts

    checks, _ = _checks()
    n = [query_count_for(scheme, d.K, q) for q in bounded_query_counts(d.L, d.K, d.V)]
    return checks.NestedCase(NestedShape(B=1, T=d.T, H=1, L=d.L, K=d.K, V=d.V), d.seed, scheme=scheme,
                             intervals=(1,) * (d.L - 1), query_counts=tuple(n), chunk_size=8,
                             gate_scale=d.gate_scale)


def nested_causality(scheme: str, d: NestedDraw) -> Measured:
    checks, _ = _checks()
    return from_errors(checks.causal_prefix(nested_case(scheme, d), min(d.t0, d.T - 1)))


def firing_timing(scheme: str, d: NestedDraw) -> Measured:
    checks, _ = _checks()
    c = min(d.chunk, -(-d.T // 8))
    return from_errors(checks.firing_timing(nested_case(scheme, d), c, min(d.level, d.L - 1)))


def optimized_case(scheme: str, d: OptimizedDraw):
    """The optimized op's case for one draw (every level fires each chunk, bounded query counts)."""
    from ngdn.nested_inputs import NestedShape, bounded_query_counts

    _, opt = _checks()
    n = [query_count_for(scheme, d.K, q) for q in bounded_query_counts(d.L, d.K, d.V)]
    return opt.OptCase(NestedShape(B=1, T=d.T, H=1, L=d.L, K=d.K, V=d.V), d.seed, scheme=scheme,
                       intervals=(1,) * (d.L - 1), query_counts=tuple(n), reduction=d.reduction,
                       gate_scale=d.gate_scale)


def optimized(scheme: str, d: OptimizedDraw) -> Measured:
    _, opt = _checks()
    return from_errors(opt.optimized_vs_reference(optimized_case(scheme, d), torch.float32, log=False))


def bitwise(scheme: str, d: OptimizedDraw) -> Measured:
    _, opt = _checks()
    return from_errors(opt.bitwise_reproducible(optimized_case(scheme, d), torch.float32))


def growth_factor(scheme: str, d: StabilityDraw) -> float:
    """``max_{j ≤ k} ‖M_j‖ / (‖M_0‖ + Σ_{i ≤ j} ‖write_i‖)`` over ``d.firings`` firings on one
    snapshot (float64; ``inf`` once a state is not finite)."""
    from reference.promote import promote
    from reference.schemes import get_scheme

    probe = get_scheme(scheme).probe
    pd = ProbeDraw(d.K, d.V, d.n, d.snapshot, d.gate_scale, d.reduction, d.seed)
    M_below, params = probe_inputs(scheme, pd, B=1, H=1)
    gen = torch.Generator().manual_seed(d.seed + 1)
    M = M_below.clone() if d.state == "snapshot" else torch.randn(M_below.shape, generator=gen, dtype=F64)
    norm = lambda x: torch.linalg.matrix_norm(x).max().item()  # noqa: E731
    budget, worst = norm(M), 0.0
    for _ in range(d.firings):
        κ, ν, β, ω, γ = probe(M_below, params, d.reduction)
        budget += norm(κ.transpose(-1, -2) @ (ω * ν))
        M = promote(M, κ, ν, β, ω, γ)
        size = norm(M)
        if not math.isfinite(size):
            return math.inf
        if budget > 0:
            worst = max(worst, size / budget)
    return worst


def stability(scheme: str, d: StabilityDraw, threshold: float = DEFAULT_THRESHOLD) -> Measured:
    g = growth_factor(scheme, d)
    problems = () if g <= threshold else (f"expansive: growth factor {g:.4g} after ≤ {d.firings} firings",)
    return Measured(g, threshold, problems)


# --- strategies --------------------------------------------------------------------------------

def probe_draws(scheme: str):
    from hypothesis import strategies as st

    @st.composite
    def draws(draw):
        K = draw(st.sampled_from((4, 8)))
        return ProbeDraw(K=K, V=draw(st.sampled_from((3, 6))), n=draw(st.integers(1, K)),
                         snapshot=draw(st.sampled_from(SNAPSHOT_KINDS)), gate_scale=draw(st.sampled_from((1.0, 30.0))),
                         reduction=draw(st.sampled_from(("mean", "sum"))), seed=draw(st.integers(0, 2**31 - 1)))
    return draws()


def gradcheck_draws(scheme: str):
    from hypothesis import strategies as st

    return probe_draws(scheme).filter(lambda d: d.snapshot in ("random", "near_rank_one", "orthonormal")).map(
        lambda d: d._replace(K=4, V=3, n=min(d.n, 3)))


def stability_draws(scheme: str):
    from hypothesis import strategies as st

    @st.composite
    def draws(draw):
        K = draw(st.sampled_from((4, 8, 16)))
        return StabilityDraw(K=K, V=draw(st.sampled_from((4, 8, 16))), n=draw(st.integers(1, K)),
                             snapshot=draw(st.sampled_from(SNAPSHOT_KINDS[1:])),
                             state=draw(st.sampled_from(("random", "snapshot"))), firings=draw(st.integers(1, 64)),
                             gate_scale=draw(st.sampled_from((1.0, 30.0))),
                             reduction=draw(st.sampled_from(("mean", "sum"))), seed=draw(st.integers(0, 2**31 - 1)))
    return draws()


def nested_draws(scheme: str):
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


OPTIMIZED_CPU = OptimizedDraw(T=130, L=3, **_kernel_sizes(16, 32), reduction="mean", gate_scale=1.0, seed=0)
OPTIMIZED_CUDA = (OPTIMIZED_CPU, OptimizedDraw(T=256, L=4, **_kernel_sizes(64, 64), reduction="sum", gate_scale=30.0,
                                               seed=1))

# The SPEC 2 "Hazard" configuration (n = K keys read from a near-rank-one snapshot, 64 firings) at both
# gate scales: a scheme that over-erases along overlapping keys shows it here whatever the budget.
STABILITY_SEEDS = tuple(StabilityDraw(K=16, V=8, n=16, snapshot="near_rank_one", state=state, firings=64,
                                      gate_scale=g, reduction="mean", seed=0)
                        for state, g in (("snapshot", 1.0), ("random", 30.0)))

PROPERTIES = (
    Property("contract", contract, probe_draws),
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


# --- running -----------------------------------------------------------------------------------

def measure(prop: Property, scheme: str, draw, threshold: float) -> Measured:
    """One evaluation; an exception is a failure carrying its message."""
    try:
        if prop.name == "stability":
            return stability(scheme, draw, threshold)
        return prop.fn(scheme, draw)
    except Exception as e:  # noqa: BLE001 (a scheme's error is the report's content)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Measured(math.inf, 0.0 if prop.name != "stability" else threshold,
                        (f"raised {type(e).__name__}: {first}"[:300],))


def _score(m: Measured) -> float:
    if not m.applicable:
        return -math.inf
    if m.problems and not math.isfinite(m.figure):
        return math.inf
    return m.figure / m.bound if m.bound > 0 else (math.inf if m.figure > 0 or m.problems else 0.0)


def search(prop: Property, scheme: str, examples: int, threshold: float):
    """Hypothesis over ``prop.draws``: a failing draw is shrunk (and returned); ``maximise``:
    the draw with the largest figure (``target()``). Returns ``(Measured, draw, examples run)``."""
    from hypothesis import HealthCheck, Phase, example, given, settings, target

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
    except Exception as e:  # noqa: BLE001 (e.g. every draw filtered out)
        return Measured(math.inf, 0.0, (f"search raised {type(e).__name__}: {e}"[:300],)), None, worst["count"]
    return worst["measured"], worst["draw"], worst["count"]


def run_property(prop: Property, scheme: str, examples: int = DEFAULT_EXAMPLES,
                 threshold: float = DEFAULT_THRESHOLD, draw=None) -> Row:
    """One report row: ``draw`` given: that draw only (a reproduction); else the search or the fixed draws."""
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
    return Row(prop.name, m, worst_draw, count, time.perf_counter() - start, verdict)


def battery(scheme: str, examples: int = DEFAULT_EXAMPLES, threshold: float = DEFAULT_THRESHOLD,
            only=None, cuda: bool = False, progress=None):
    """Every applicable property's row, in ``PROPERTIES`` order (``only``: those names)."""
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    if not isinstance(threshold, (int, float)) or not threshold >= 1.0:
        raise ValueError(f"threshold must be a number ≥ 1, got {threshold!r}")
    for name in only or ():
        get_property(name)
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
    lines.append("\nall properties pass" if ok else "\nSOME PROPERTIES FAIL")
    return "\n".join(lines), ok
