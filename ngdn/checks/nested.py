"""Promote (CONTRACT section 2) and Nested GDN-2 (CONTRACT section 3) properties as functions
(implementation, draw) -> errors.

Errors are ``{label: (error, bound)}`` as ``ngdn.tolerances.compare`` returns them, and
``failures`` picks the ones over their bound. Algebraic identities use relative-error
bounds from ``tolerances.yaml`` (float64, mode ``any``). Timing and causality
properties compare the same float64 operations on the same values and so demand
bitwise equality (bound 0). A property that demands a *difference* reports
``closeness = bound / difference`` against 1, where ``bound`` is the tolerance under
which the two would count as equal.
"""
from __future__ import annotations

import math
from functools import reduce
from typing import NamedTuple

import numpy as np
import torch

from ngdn.inputs import generator, rand, randn
from ngdn.nested_inputs import ACTIVATIONS, NestedShape, nested_inputs
from ngdn.tolerances import compare, record, tolerance
from reference.gdn2 import gdn2_step, naive_gdn2
from reference.gdn2_numpy import gdn2_step_numpy
from reference.nested import Level, make_levels, naive_nested_gdn2
from reference.nested_numpy import naive_nested_gdn2_numpy
from reference.promote import promote, promote_sequential
from reference.promote_numpy import (SCHEMES_NUMPY, pair_log_decays_numpy, promote_numpy,
                                     promote_sequential_numpy)
from reference.schemes import gates, get_scheme

F64 = torch.float64


# --- helpers -----------------------------------------------------------------------------

def check(component: str, items: dict, log: bool = True) -> dict:
    """``{label: (quantity, actual, expected)}`` -> ``{label: (relative error, bound)}``."""
    out = {}
    for label, (quantity, actual, expected) in items.items():
        out[label] = compare(component, F64, {quantity: (actual, expected)}, mode="any", log=log)[quantity]
    return out


def observe(component: str, label: str, quantity: str, error: float, log: bool = True) -> dict:
    """A non-relative observation (e.g. a norm excess) against the bound of ``quantity``."""
    bound = tolerance(component, quantity, F64, mode="any")
    if log:
        record(component, "any", F64, quantity, error, bound)
    return {label: (error, bound)}


def exact(label: str, actual: torch.Tensor, expected: torch.Tensor) -> dict:
    """Bitwise equality: ``(max |actual - expected|, 0)``."""
    if actual.numel() == 0:
        return {label: (0.0, 0.0)}
    return {label: ((actual - expected).abs().max().item(), 0.0)}


def must_differ(component: str, label: str, quantity: str, actual, expected) -> dict:
    """``closeness = bound / ‖actual − expected‖·‖expected‖⁻¹`` must stay ≤ 1."""
    bound = tolerance(component, quantity, F64, mode="any")
    diff = compare(component, F64, {quantity: (actual, expected)}, mode="any", log=False)[quantity][0]
    return {label: (bound / diff if diff > 0 else math.inf, 1.0)}


def to_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy()


# --- promote draws -----------------------------------------------------------------------

# ``make_levels(gate_scale=...)`` for draws that leave every gate nonlinearity's easy regime
# (softplus ≈ log 2 + x/2, σ ≈ ½ + x/4). The pre-activations scale with ν, so each value is chosen
# for its draws: about a quarter of the decay logits x = ν W_γ then have |x| > 3 (median |x| ≈ 1.5,
# against 0.06 and 0.01 at gate_scale 1) and β, ω are mostly saturated. Measured in ``make_levels``.
PROMOTE_LARGE_GATE_SCALE = 30.0         # promote draws: unit-normal snapshots M_below
NESTED_LARGE_GATE_SCALE = 100.0         # nested runs: level states ~5x smaller than N(0, 1)
PROMOTE_GATE_SCALES = (1.0, PROMOTE_LARGE_GATE_SCALE)
NESTED_GATE_SCALES = (1.0, NESTED_LARGE_GATE_SCALE)


class PromoteDraw(NamedTuple):
    B: int
    H: int
    K: int
    V: int
    n: int
    scheme: str
    reduction: str
    seed: int
    gate_scale: float = 1.0             # make_levels' gate_scale (PROMOTE_LARGE_GATE_SCALE: large gates)


def promote_inputs(d: PromoteDraw):
    """``M_below, M [B, H, K, V]`` and the scheme's per-head parameters (``make_levels`` scales
    times ``d.gate_scale`` for the gate weights; ``merge`` has n = K)."""
    gen = generator(d.seed)
    M_below = randn(gen, d.B, d.H, d.K, d.V)
    M = randn(gen, d.B, d.H, d.K, d.V)
    level = make_levels(2, d.H, d.K, d.V, scheme=d.scheme, query_counts=[d.n], reduction=d.reduction,
                        generator=gen, gate_scale=d.gate_scale)[0]
    return M_below, M, level.params


def per_head(fn, *arrays_and_params):
    """Apply a one-head NumPy function over ``[B, H, ...]``: arrays are indexed ``[i, h]``,
    a params dict ``[h]``."""
    first = next(a for a in arrays_and_params if isinstance(a, np.ndarray))
    B, H = first.shape[:2]
    out = None
    for i in range(B):
        for h in range(H):
            args = [{k: p[h] for k, p in a.items()} if isinstance(a, dict) else
                    (a[i, h] if isinstance(a, np.ndarray) else a) for a in arrays_and_params]
            res = fn(*args)
            res = res if isinstance(res, tuple) else (res,)
            if out is None:
                out = [np.zeros((B, H) + np.shape(x)) for x in res]
            for o, x in zip(out, res):
                o[i, h] = x
    return out if len(out) > 1 else out[0]


def params_np(params):
    return {k: to_np(p) for k, p in params.items()}


# --- promote properties --------------------------------------------------------------------

def promote_torch_vs_numpy(d: PromoteDraw, probe=None, promote_fn=promote, numpy_probe=None, log=True):
    """The probe's five outputs and the promoted state, PyTorch vs the NumPy twin
    (``numpy_probe``: a one-head twin replacing ``SCHEMES_NUMPY[d.scheme]``, for mutants)."""
    M_below, M, params = promote_inputs(d)
    probe = probe or get_scheme(d.scheme).probe
    κ, ν, β, ω, γ = probe(M_below, params, d.reduction)
    M_new = promote_fn(M, κ, ν, β, ω, γ)
    np_probe = numpy_probe or SCHEMES_NUMPY[d.scheme]
    κ_, ν_, β_, ω_, γ_ = per_head(lambda Mb, p: np_probe(Mb, p, d.reduction), to_np(M_below), params_np(params))
    M_new_ = per_head(promote_numpy, to_np(M), κ_, ν_, β_, ω_, γ_)
    t = torch.from_numpy
    return check("promote_torch_vs_numpy", {
        "kappa": ("kappa", κ, t(κ_)), "nu": ("nu", ν, t(ν_)), "beta": ("beta", β, t(β_)),
        "omega": ("omega", ω, t(ω_)), "gamma": ("gamma", γ, t(γ_)), "state": ("state", M_new, t(M_new_)),
    }, log)


def pair_permutation(d: PromoteDraw, promote_fn=promote, promote_numpy_fn=promote_numpy, log=True):
    """Permuting the pairs of a firing leaves ``M_new`` unchanged (PyTorch and NumPy)."""
    M_below, M, params = promote_inputs(d)
    pairs = get_scheme(d.scheme).probe(M_below, params, d.reduction)
    κ, ν, β, ω, γ = pairs
    n = κ.shape[-2]
    perm = torch.randperm(n, generator=generator(d.seed + 1))
    κp, νp, βp, ωp = (x[..., perm, :] for x in (κ, ν, β, ω))
    np_args = [to_np(x) for x in (M, κ, ν, β, ω, γ)]
    np_perm = [to_np(x) for x in (M, κp, νp, βp, ωp, γ)]
    return check("promote_identities", {
        "permutation_torch": ("permutation", promote_fn(M, κp, νp, βp, ωp, γ), promote_fn(M, κ, ν, β, ω, γ)),
        "permutation_numpy": ("permutation", torch.from_numpy(per_head(promote_numpy_fn, *np_perm)),
                              torch.from_numpy(per_head(promote_numpy_fn, *np_args))),
    }, log)


def sequential_order_dependence(d: PromoteDraw, promote_sequential_fn=promote_sequential):
    """The REJECTED sequential variant is not order-invariant: reversing the pairs changes
    its result by more than the permutation tolerance (draws with n ≥ 2)."""
    M_below, M, params = promote_inputs(d)
    κ, ν, β, ω, _ = get_scheme(d.scheme).probe(M_below, params, d.reduction)
    _, _, γ_i = gates(ν, params)
    rev = torch.arange(κ.shape[-2] - 1, -1, -1)
    forward = promote_sequential_fn(M, κ, ν, β, ω, γ_i)
    backward = promote_sequential_fn(M, *(x[..., rev, :] for x in (κ, ν, β, ω, γ_i)))
    return must_differ("promote_identities", "sequential_order_dependence", "permutation", backward, forward)


def one_pair_is_gdn2_step(d: PromoteDraw, promote_fn=promote, log=True):
    """With one pair (``learned``, n = 1) a firing is one GDN-2 token step with
    ``k=κ, v=ν, b=β, w=ω, g=γ`` (PyTorch and NumPy)."""
    d = d._replace(n=1, scheme="learned")
    M_below, M, params = promote_inputs(d)
    κ, ν, β, ω, γ = get_scheme("learned").probe(M_below, params, d.reduction)
    step = gdn2_step(M, κ[..., 0, :], ν[..., 0, :], γ, β[..., 0, :], ω[..., 0, :])
    a = [to_np(x) for x in (M, κ, ν, β, ω, γ)]
    step_np = per_head(lambda M_, κ_, ν_, β_, ω_, γ_: gdn2_step_numpy(M_, κ_[0], ν_[0], γ_, β_[0], ω_[0]), *a)
    return check("promote_identities", {
        "one_pair_torch": ("one_pair_gdn2_step", promote_fn(M, κ, ν, β, ω, γ), step),
        "one_pair_numpy": ("one_pair_gdn2_step", torch.from_numpy(per_head(promote_numpy, *a)),
                           torch.from_numpy(step_np)),
    }, log)


def sum_decay_matches_sequential(d: PromoteDraw, probe=None, promote_fn=promote, log=True):
    """With ``β = 0`` and ``ω = 0``, the ``sum`` reduction's one decay equals the total decay
    of the sequential variant (each pair decaying by its own ``γ_i``): PyTorch and NumPy."""
    M_below, M, params = promote_inputs(d)
    probe = probe or get_scheme(d.scheme).probe
    κ, ν, β, ω, γ = probe(M_below, params, "sum")
    _, _, γ_i = gates(ν, params)
    zero_β, zero_ω = torch.zeros_like(β), torch.zeros_like(ω)
    a = [to_np(x) for x in (M, κ, ν, zero_β, zero_ω)]
    γ_np = per_head(lambda M_b, p: SCHEMES_NUMPY[d.scheme](M_b, p, "sum")[4], to_np(M_below), params_np(params))
    γ_i_np = per_head(lambda ν_, p: pair_log_decays_numpy(ν_, p), to_np(ν), params_np(params))
    return check("promote_identities", {
        "sum_decay_torch": ("sum_decay_sequential", promote_fn(M, κ, ν, zero_β, zero_ω, γ),
                            promote_sequential(M, κ, ν, zero_β, zero_ω, γ_i)),
        "sum_decay_numpy": ("sum_decay_sequential", torch.from_numpy(per_head(promote_numpy, *a, γ_np)),
                            torch.from_numpy(per_head(promote_sequential_numpy, *a, γ_i_np))),
    }, log)


def orthonormal_firing(d: PromoteDraw):
    """A firing in the stability regime: orthonormal keys κ ``[n, K]`` (n ≤ K), channel-uniform
    erase gates β_i·1 with β_i ∈ [0, 1] (endpoints included), ω ∈ [0, 1]^V, ν ~ N(0, 1),
    γ ∈ (-0.5, 0] per channel; in a quarter of the draws β = 0 and γ = 0, where the first
    bound of ``stability`` is an equality."""
    gen = generator(d.seed)
    B, H, K, V, n = d.B, d.H, d.K, d.V, d.n
    M = randn(gen, B, H, K, V)
    κ = torch.linalg.qr(randn(gen, B, H, K, n)).Q.transpose(-1, -2)          # orthonormal rows
    β_i = rand(gen, B, H, n, 1)
    β_i = torch.where(β_i < 0.15, 0.0, torch.where(β_i > 0.85, 1.0, β_i))    # endpoints too
    β = β_i.expand(B, H, n, K)
    ω = rand(gen, B, H, n, V)
    ν = randn(gen, B, H, n, V)
    γ = -0.5 * rand(gen, B, H, K)
    if rand(gen, 1).item() < 0.25:                      # the tight case: no decay, no erase
        β, γ = torch.zeros_like(β), torch.zeros_like(γ)
    return M, κ, ν, β, ω, γ


def stability(d: PromoteDraw, promote_fn=promote, log=True):
    """CONTRACT section 2 "Hazard", the safe regime. For orthonormal keys κ (κ κ^T = I_n),
    channel-uniform erase gates ``β_i ∈ [0, 1]``, any ``ω ∈ [0, 1]``, ``γ ≤ 0``:

        ‖M_new − κ^T (ω ⊙ ν)‖_F ≤ ‖M‖_F        (decay-and-erase is non-expansive), hence
        ‖M_new‖_F ≤ ‖M‖_F + ‖ω ⊙ ν‖_F          (one firing grows a state by at most its write)

    because ``I − κ^T diag(β) κ`` is symmetric with eigenvalues ``1 − β_i ∈ [0, 1]`` and 1,
    ``‖diag(e^γ)‖ ≤ 1`` and ``‖κ^T X‖_F = ‖X‖_F``. Reported: the worst relative excess over
    the right-hand side, per ``[K, V]`` state (≤ rounding).
    """
    M, κ, ν, β, ω, γ = orthonormal_firing(d)
    M_new = promote_fn(M, κ, ν, β, ω, γ)
    write = κ.transpose(-1, -2) @ (ω * ν)
    norm = lambda x: torch.linalg.matrix_norm(x)                              # Frobenius, per state
    erase_excess = ((norm(M_new - write) - norm(M)) / norm(M)).max().item()
    total_rhs = norm(M) + torch.linalg.vector_norm(ω * ν, dim=(-2, -1))
    total_excess = ((norm(M_new) - total_rhs) / total_rhs).max().item()
    return {**observe("promote_identities", "stability_erase", "stability_excess", erase_excess, log),
            **observe("promote_identities", "stability_total", "stability_excess", total_excess, log)}


def equal_keys_firing(d: PromoteDraw):
    """n copies of one unit key u, channel-uniform β_i ∈ (0, 1), channel-constant γ ≤ 0, ω = 0."""
    gen = generator(d.seed)
    B, H, K, V, n = d.B, d.H, d.K, d.V, d.n
    M = randn(gen, B, H, K, V)
    u = torch.nn.functional.normalize(randn(gen, B, H, 1, K), dim=-1)
    κ = u.expand(B, H, n, K)
    β_i = rand(gen, B, H, n, 1)
    β = β_i.expand(B, H, n, K)
    ν = randn(gen, B, H, n, V)
    ω = torch.zeros(B, H, n, V, dtype=F64)
    γ = (-rand(gen, B, H, 1)).expand(B, H, K)
    return M, u[..., 0, :], κ, ν, β, ω, γ, β_i[..., 0].sum(-1)


def hazard_identity(d: PromoteDraw, promote_fn=promote, log=True):
    """CONTRACT section 2 "Hazard": with n equal keys u (channel-uniform β_i, channel-constant γ,
    ω = 0) a firing multiplies u's component by ``(1 − Σ_i β_i) e^γ`` (exactly: expansive
    once Σβ > 2 for γ ≈ 0) and the rest of the state by ``e^γ``."""
    M, u, κ, ν, β, ω, γ, Σβ = equal_keys_firing(d)
    M_new = promote_fn(M, κ, ν, β, ω, γ)
    component = lambda X: torch.einsum("...k,...kv->...v", u, X)               # u^T X
    rest = lambda X: X - u[..., :, None] * component(X)[..., None, :]          # (I - u u^T) X
    e_γ = torch.exp(γ[..., :1])
    # u^T M_new = (1 - Σβ) e^γ u^T M, written as "u^T M_new + Σβ e^γ u^T M = e^γ u^T M" so the
    # comparison stays well conditioned when Σβ ≈ 1 (the left side then cancels to ~0).
    erased = (Σβ[..., None] * e_γ) * component(M)
    return check("promote_identities", {
        "hazard_component": ("hazard_component", component(M_new) + erased, e_γ * component(M)),
        "hazard_rest": ("hazard_component", rest(M_new), e_γ[..., None] * rest(M)),
    }, log)


# --- nested draws ------------------------------------------------------------------------------

class NestedCase(NamedTuple):
    shape: NestedShape
    seed: int
    scheme: object = "learned"          # one name or one per level
    intervals: tuple | None = None      # None: f_ℓ = 2^(ℓ-1)
    query_counts: tuple | None = None   # None: ngdn.nested_inputs.bounded_query_counts
    reduction: object = "mean"
    chunk_size: int = 64
    gate_scale: float = 1.0             # make_levels' gate_scale (NESTED_LARGE_GATE_SCALE: large gates)
    regime: str = "typical"             # ngdn.inputs.REGIMES ("extreme": extreme gates and state norms)


def case_inputs(case: NestedCase, initial_states=True) -> dict:
    return nested_inputs(case.shape, case.seed, scheme=case.scheme, intervals=case.intervals,
                         query_counts=case.query_counts, reduction=case.reduction,
                         initial_states=initial_states, gate_scale=case.gate_scale, regime=case.regime)


def run(reference, x, case, **overrides):
    """``reference(q, k, v, g, b, w, r, levels, ...)`` on ``x`` (entries overridable)."""
    y = {**x, **overrides}
    return reference(*(y[n] for n in ACTIVATIONS), y["levels"], initial_states=y["initial_states"],
                     output_final_state=True, chunk_size=case.chunk_size)


def final_state_items(prefix, quantity, actual, expected):
    return {f"{prefix}[{ℓ}]": (quantity, a, torch.as_tensor(e)) for ℓ, (a, e) in enumerate(zip(actual, expected))}


def nested_torch_vs_numpy(case: NestedCase, reference=naive_nested_gdn2, log=True):
    """PyTorch reference == NumPy twin in float64: output and every level's final state."""
    x = case_inputs(case)
    o, states = run(reference, x, case)
    o_np, states_np = naive_nested_gdn2_numpy(*(x[n] for n in ACTIVATIONS), x["levels"],
                                              initial_states=x["initial_states"], chunk_size=case.chunk_size)
    return check("nested_torch_vs_numpy", {"output": ("output", o, torch.from_numpy(o_np)),
                                           **final_state_items("final_state", "final_state", states, states_np)},
                 log)


def gdn2_reduction(case: NestedCase, reference=naive_nested_gdn2, log=True):
    """``L = 1`` is GDN-2 itself (``reference.naive_gdn2``)."""
    case = case._replace(shape=case.shape._replace(L=1), scheme="learned", intervals=None, query_counts=None,
                         reduction="mean")
    x = case_inputs(case)
    o, states = run(reference, x, case)
    o_gdn2, S = naive_gdn2(x["q"][..., 0, :], x["k"], x["v"], x["g"], x["b"], x["w"],
                           initial_state=x["initial_states"][0], output_final_state=True)
    return check("nested_identities", {"gdn2_output": ("gdn2_output", o, o_gdn2),
                                       "gdn2_final_state": ("gdn2_final_state", states[0], S)}, log)


def router_weights_sum_to_one(case: NestedCase, reference=naive_nested_gdn2, log=True):
    """The router's softmax weights sum to one per token: when every level holds the same
    state S and reads the same query (level 0 frozen by ``g = b = w = 0``, levels ≥ 1 never
    firing), ``o_t = Σ_ℓ softmax(r_t)_ℓ · scale S^T q_t = scale S^T q_t`` for any logits."""
    x = case_inputs(case)
    B, T, H, L, K, V = case.shape
    N = -(-T // case.chunk_size)
    S = x["initial_states"][0]
    q = x["q"][..., :1, :].expand(B, T, H, L, K)
    levels = [Level(lv.scheme, N + 1, lv.params, lv.reduction) for lv in x["levels"]]
    zeros = torch.zeros_like
    o, _ = run(reference, x, case, q=q, g=zeros(x["g"]), b=zeros(x["b"]), w=zeros(x["w"]), levels=levels,
               initial_states=[S] * L)
    expected = K ** -0.5 * torch.einsum("bthk,bhkv->bthv", q[..., 0, :], S)
    return check("nested_identities", {"router_output": ("router_output", o, expected)}, log)


WRITES = ("k", "v", "g", "b", "w")


def perturbed(x: dict, case: NestedCase, tokens: slice, names=ACTIVATIONS) -> dict:
    """``x`` with the inputs ``names`` of ``tokens`` replaced by a fresh, equally conditioned draw."""
    other = case_inputs(case._replace(seed=case.seed + 7919))
    y = dict(x)
    for n in names:
        y[n] = x[n].clone()
        y[n][:, tokens] = other[n][:, tokens]
    return y


def causal_prefix(case: NestedCase, t0: int, reference=naive_nested_gdn2):
    """Changing the tokens ``t ≥ t0`` changes no output before ``t0`` (bitwise)."""
    x = case_inputs(case)
    o, _ = run(reference, x, case)
    o2, _ = run(reference, perturbed(x, case, slice(t0, None)), case)
    return exact("causal_prefix", o2[:, :t0], o[:, :t0])


def all_weight_on(x: dict, ℓ: int) -> torch.Tensor:
    """Router logits putting all weight on level ℓ (softmax gives exact zeros elsewhere)."""
    r = torch.full_like(x["r"], -1e4)
    r[..., ℓ] = 0.0
    return r


def firing_timing(case: NestedCase, c: int, ℓ: int, reference=naive_nested_gdn2):
    """With all router weight on level ℓ ≥ 1, changing what the tokens of chunk c (1-based)
    write (k, v, g, b, w) changes no output up to the end of chunk c (they read M_ℓ as it
    stood when their chunk began; bitwise), and, when chunk c is full and levels 1..ℓ all fire at c, does change
    the output at the first token of chunk c+1 (a firing is visible from the next chunk on)."""
    x = case_inputs(case)
    x["r"] = all_weight_on(x, ℓ)
    C, T = case.chunk_size, case.shape.T
    chunk = slice((c - 1) * C, min(c * C, T))
    o, _ = run(reference, x, case)
    o2, _ = run(reference, perturbed(x, case, chunk, WRITES), case)
    errors = exact("unchanged_through_chunk", o2[:, :chunk.stop], o[:, :chunk.stop])
    intervals = [lv.interval for lv in x["levels"]]
    if c * C < T and all(c % f == 0 for f in intervals[:ℓ]):
        t = c * C
        errors.update(must_differ("nested_identities", "visible_next_chunk", "split_output",
                                  o2[:, t], o[:, t]))
    return errors


def partial_chunk_never_fires(case: NestedCase, reference=naive_nested_gdn2):
    """A trailing partial chunk never fires: the final states of levels ℓ ≥ 1 after
    ``m·C + p`` tokens (0 < p < C) equal those after ``m·C`` tokens (bitwise)."""
    C = case.chunk_size
    m = max(1, case.shape.T // C)
    p = max(1, C // 2)
    case = case._replace(shape=case.shape._replace(T=m * C + p))
    x = case_inputs(case)
    _, states = run(reference, x, case)
    prefix = {n: x[n][:, :m * C] for n in ACTIVATIONS}
    _, states_full = run(reference, x, case, **prefix)
    errors = {}
    for ℓ in range(1, case.shape.L):
        errors.update(exact(f"final_state[{ℓ}]", states[ℓ], states_full[ℓ]))
    return errors


def split_point(case: NestedCase, x: dict) -> int:
    """The largest multiple of ``C · lcm(f)`` below T (0 if none)."""
    period = case.chunk_size * reduce(math.lcm, [lv.interval for lv in x["levels"]], 1)
    return ((case.shape.T - 1) // period) * period


def state_passing(case: NestedCase, reference=naive_nested_gdn2, log=True):
    """Splitting at a multiple of ``C · lcm(f)`` and passing the final states on equals one
    call (chunk numbering restarts at 1 in every call). Cases without such a split point
    inside the sequence compare the one call with itself."""
    x = case_inputs(case)
    s = split_point(case, x)
    o, states = run(reference, x, case)
    if s == 0:
        o_split, states_split = o, states
    else:
        o1, mid = run(reference, x, case, **{n: x[n][:, :s] for n in ACTIVATIONS})
        o2, states_split = run(reference, x, case, initial_states=mid, **{n: x[n][:, s:] for n in ACTIVATIONS})
        o_split = torch.cat([o1, o2], dim=1)
    return check("nested_identities", {"split_output": ("split_output", o_split, o),
                                       **final_state_items("split_final_state", "split_final_state",
                                                           states_split, states)}, log)


def nested_pair_permutation(case: NestedCase, reference=naive_nested_gdn2, log=True):
    """``learned``: permuting the rows of every level's query bank ``Q`` (= the order of the
    pairs of every firing) leaves outputs and final states unchanged (PyTorch and NumPy)."""
    case = case._replace(scheme="learned")
    x = case_inputs(case)
    gen = generator(case.seed + 1)
    levels_p = []
    for lv in x["levels"]:
        perm = torch.randperm(lv.params["Q"].shape[1], generator=gen)
        levels_p.append(Level(lv.scheme, lv.interval, {**lv.params, "Q": lv.params["Q"][:, perm]}, lv.reduction))
    o, states = run(reference, x, case)
    o_p, states_p = run(reference, x, case, levels=levels_p)
    args = [x[n] for n in ACTIVATIONS]
    o_np, states_np = naive_nested_gdn2_numpy(*args, x["levels"], initial_states=x["initial_states"],
                                              chunk_size=case.chunk_size)
    o_np_p, states_np_p = naive_nested_gdn2_numpy(*args, levels_p, initial_states=x["initial_states"],
                                                  chunk_size=case.chunk_size)
    t = torch.from_numpy
    return check("nested_identities", {
        "permutation_output_torch": ("permutation_output", o_p, o),
        **final_state_items("permutation_final_state_torch", "permutation_final_state", states_p, states),
        "permutation_output_numpy": ("permutation_output", t(o_np_p), t(o_np)),
        **final_state_items("permutation_final_state_numpy", "permutation_final_state",
                            [t(s) for s in states_np_p], [t(s) for s in states_np]),
    }, log)


def output_unit(y: torch.Tensor) -> float:
    """The power of two ``2^⌈log2 max(1, max|y|)⌉`` (1 for non-finite ``y``): dividing by it is exact."""
    m = y.detach().abs().max().item() if y.numel() else 0.0
    return 2.0 ** math.ceil(math.log2(m)) if math.isfinite(m) and m > 1.0 else 1.0


def nested_gradcheck(case: NestedCase, reference=naive_nested_gdn2, fast_mode=False):
    """``torch.autograd.gradcheck`` (float64, finite differences) of outputs and final states
    with respect to every input: q, k, v, g, b, w, r, every scheme parameter and every
    initial state.

    Two settings keep the central difference ``(f(x+ε) - f(x-ε)) / 2ε`` accurate on
    extreme-regime draws (1e3-scale initial states, gates saturated at large gate scales),
    where its two errors are far above their typical size:

    - rounding, ``~(ulps of rounding in f)·2^-52·|f| / ε``: an output of size |f| computed
      through cancellations (the erase of a 1e3-scale state) carries tens of ulps, so at
      |f| of a few hundred the error exceeds gradcheck's absolute ``atol`` whatever the true
      derivative. So each output (o and every final state) is compared in units of its own
      magnitude: divided by ``output_unit`` of its value at the checked point (a constant
      power of two, so the division is exact and ``rtol`` keeps its meaning). Outputs within
      ±1 are checked as they are.
    - truncation, ``ε²·f‴/6``: third derivatives through saturated gates and key
      normalisations reach ~1e11 there (one draw ≈ 2e12). So ε (``tolerances.yaml``) is smaller
      than gradcheck's default 1e-6, which the rounding headroom won by the units allows, and a
      check that fails at ε is made once more against a Richardson extrapolation
      (``richardson_jacobian_check``), where the ε² term cancels.
    """
    x = case_inputs(case)
    names = list(ACTIVATIONS)
    leaves = [x[n].clone().requires_grad_() for n in names]
    param_keys = [(i, k) for i, lv in enumerate(x["levels"]) for k in lv.params]
    leaves += [x["levels"][i].params[k].clone().requires_grad_() for i, k in param_keys]
    leaves += [s.clone().requires_grad_() for s in x["initial_states"]]
    n_act, n_par = len(names), len(param_keys)

    def fn(*args):
        acts = args[:n_act]
        params = [dict() for _ in x["levels"]]
        for (i, k), p in zip(param_keys, args[n_act:n_act + n_par]):
            params[i][k] = p
        levels = [Level(lv.scheme, lv.interval, params[i], lv.reduction) for i, lv in enumerate(x["levels"])]
        o, states = reference(*acts, levels, initial_states=list(args[n_act + n_par:]), output_final_state=True,
                              chunk_size=case.chunk_size)
        return (o, *states)

    with torch.no_grad():
        units = [output_unit(y) for y in fn(*leaves)]

    def fn_in_units(*args):
        return tuple(y / u for y, u in zip(fn(*args), units))

    atol, rtol, eps = (tolerance("nested_gradcheck", t, F64, mode="any") for t in ("atol", "rtol", "eps"))
    ok = torch.autograd.gradcheck(fn_in_units, tuple(leaves), eps=eps, atol=atol, rtol=rtol, raise_exception=False,
                                  fast_mode=fast_mode)
    if not ok:
        # a second look without the truncation error: one extreme draw's third derivatives
        # (≈ 2e12 in output units) put gradcheck's central difference at 1.75x the bound
        ok = richardson_jacobian_check(fn_in_units, leaves, tolerance("nested_gradcheck", "richardson_eps", F64,
                                                                      mode="any"), atol, rtol)
    return {"gradcheck": (0.0 if ok else math.inf, 0.0)}


def richardson_jacobian_check(fn, leaves, eps: float, atol: float, rtol: float) -> bool:
    """Every entry of the Jacobian of ``fn`` (a tuple of tensors) at ``leaves``, by autograd,
    against the Richardson extrapolation of two central differences, ``(4·D(ε/2) − D(ε)) / 3``:
    the ``ε²·f‴/6`` terms cancel (what is left is ``O(ε⁴)``; rounding grows about 3x against one
    difference at ε, so ε is larger than gradcheck's), while a wrong gradient's mismatch stays
    whatever ε. The bound is gradcheck's, ``|analytic − numeric| ≤ atol + rtol·|numeric|``.
    Dense: for small draws only (four calls of ``fn`` per input entry)."""
    def flat(*args):
        return torch.cat([y.reshape(-1) for y in fn(*args)])

    jacobians = torch.autograd.functional.jacobian(flat, tuple(leaves))       # per leaf [outputs, *leaf]
    analytic = torch.cat([j.reshape(j.shape[0], -1) for j in jacobians], 1).T  # [input entries, outputs]
    base = [x.detach() for x in leaves]

    def difference(i_leaf: int, i: int, h: float) -> torch.Tensor:
        plus, minus = list(base), list(base)
        plus[i_leaf], minus[i_leaf] = base[i_leaf].clone(), base[i_leaf].clone()
        plus[i_leaf].view(-1)[i] += h
        minus[i_leaf].view(-1)[i] -= h
        return (flat(*plus) - flat(*minus)) / (2 * h)

    with torch.no_grad():
        numeric = torch.stack([(4 * difference(k, i, eps / 2) - difference(k, i, eps)) / 3
                               for k, x in enumerate(base) for i in range(x.numel())])
    return bool(((numeric - analytic).abs() <= atol + rtol * numeric.abs()).all())
