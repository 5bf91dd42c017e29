"""The fused probe (``optimized.nested.probe_fused``) against the generic
path: ``probe_fwd`` equals ``get_scheme(s).probe`` and ``probe_bwd`` equals
``torch.autograd.grad`` of it, for every built-in scheme and both reductions, on the
snapshots' gradient and every parameter's, with some upstream gradients ``None``.

Draws: B, F ≥ 1 (F ∈ {1, 2, 3}), H ∈ {1, 2}, K ≠ V small, n ∈ 1..K (n = K often; merge n = K),
gate weights at ``make_levels``' scale times a drawn factor up to 30 (sigmoid and softplus out
of their linear regimes), and snapshots of four kinds: unit normal, near rank one (every firing's
keys overlap: bounded_erase's clamp max(1, r) is passed, r ≈ n; see ``RANK_ONE_NOISE``), tiny
(1e-3: |Z_K|² near l2norm's ε, keys shorter than 1, bounded_erase's r < 1 where the clamp holds)
and mixed (the three kinds over the firings of one draw). ``FIXED_DRAWS`` run in every profile and cover each scheme ×
reduction with F = 1 and F = 3, n = K, the largest gates, each snapshot kind, a zero snapshot and
missing upstream gradients (bounded_erase with overlapping keys always keeps dκ; see ``RANK_ONE_NOISE``).

Float64: fused vs generic in float64. Float32: fused in float32 vs generic in float64 on the same
(rounded) inputs, within 1e-5 or within ``GENERIC_FACTOR`` times the generic float32 path's own
error (see there). Each mutant of ``probe_bwd`` (``MUTANTS``: the production function with one
source substitution, ``kernel_mutation.py``) must fail the float64 property, and each mutant of
the Triton gates' backward kernel (``GATE_MUTANTS``) the float32 one.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ngdn.checks.generic import nan_filled_allocations
from ngdn.inputs import generator, randn
from ngdn.strategies import examples, seeds
from ngdn.tolerances import assert_passes, compare, failures, record, relative_error, tolerance
from optimized import triton_mode
import optimized.nested.probe_fused as probe_fused_module
import optimized.nested.probe_gates as probe_gates_module
import optimized.nested.probe_gates_nu as probe_gates_nu_module
import optimized.fits as fits
from kernel_mutation import Plant, planted
from optimized.nested.probe_fused import FUSED_SCHEMES, probe_bwd, probe_fwd
from optimized.nested.probe_gates import GATE_SCHEMES
from reference.nested import make_levels
from reference.schemes import PROBE_OUTPUTS, get_scheme

# Float32: the bound is max(tolerance (tolerances.yaml, ``probe_fused``), GENERIC_FACTOR × the generic
# float32 path's own error on the draw). Some draws are ill-conditioned for any float32
# evaluation (measured: the generic float32 path errs by up to 1, on a d_W_omega whose every gate
# saturates to σ = 1 in float32): torch's sigmoid backward (1 - y)·y loses 1 - y when the gates
# saturate (|x| ≳ 8 at gate scale 30), and with near-rank-one snapshots the l2norm gradient's large
# components cancel in dQ = Σ dν Mᵀ (they are orthogonal to ν W_K ∝ y W_K). The fused path must be
# within the bound of float64 or no worse than the path it replaces.
COMPONENT = "probe_fused"
DEV = triton_mode.device()
GATE_SCALES = (1.0, 8.0, 30.0)
SNAP_KINDS = ("normal", "rank_one", "tiny", "mixed")
# Near-rank-one snapshots x yᵀ + 0.1 · noise: every firing's keys overlap (r_i ≈ n). Closer to rank
# one the gradients become ill-conditioned for any evaluation order, and fused and autograd differ
# by more than float64 rounding: at noise 1e-2, dQ = Σ dν Mᵀ cancels (l2norm's gradient is
# orthogonal to ν W_K ∝ y W_K; up to 2.3e-13). With dκ = 0, bounded_erase's only κ gradient
# (dG + dGᵀ) κ is nearly parallel to κ and l2norm's projection keeps a small residual of it: d_W_K
# differed by up to 6.5e-12 at noise 1e-2 and 4.1e-12 at 0.1 (checked in long double on one such
# draw: fused 2.2e-12, autograd 2.7e-12 off, |du| / |dκ'/‖u‖| = 3.7e-3). So bounded_erase draws
# with overlapping keys (rank_one, mixed) always keep dκ; dκ = None is drawn on normal and tiny ones.
RANK_ONE_NOISE = 0.1
TINY = 1e-3
LARGE = 30.0        # snapshot scale of the fixed draws whose decay logits pass softplus's threshold (20)
OUTPUT_NAMES = ("kappa", "nu", "beta", "omega", "gamma")


def _gates(old, new):
    return [Plant(probe_fused_module, "_gates_bwd_torch", old, new)]


# Deliberate errors of the backward: name -> plants (one exact substitution each).
MUTANTS = {
    # l2norm's backward without its projection term: dZ_K = s dκ
    "no_projection": _gates("torch.div(dκt - κ * (κ * dκt).sum(-1, keepdim=True), nrm, out=dz[..., sK])",
                            "torch.div(dκt, nrm, out=dz[..., sK])"),
    # softplus' replaced by 1
    "softplus_one": _gates("torch.where(g > _SOFTPLUS_THRESHOLD, dγ_i, dγ_i * e / (e + 1), out=dz[..., sG])",
                           "dz[..., sG].copy_(dγ_i.expand_as(g))"),
    # bounded_erase: the clamp's mask ignored (gradient through r < 1 too)
    "no_clamp": _gates("dr = torch.where(r >= 1.0, dm, torch.zeros_like(dm))", "dr = dm"),
    # bounded_erase: no gradient through r (the overlap) at all
    "no_overlap": _gates("dκ_overlap = (dG + dG.transpose(-1, -2)) @ κ", "dκ_overlap = None"),
    # dν not added to the gradient flowing back from κ, β, ω, γ
    "drop_dnu": [Plant(probe_fused_module, "_probe_bwd", "if dν is None:", "if True:")],
    # the reduction's 1/n forgotten in the backward
    "gamma_no_mean": _gates("dγ_i = dγ_i / n", "dγ_i = dγ_i"),
    # softplus' gradient dropped above its threshold (where softplus(z) = z, the gradient is 1)
    "softplus_dropped_above_threshold": _gates(
        "torch.where(g > _SOFTPLUS_THRESHOLD, dγ_i, dγ_i * e / (e + 1), out=dz[..., sG])",
        "torch.where(g > _SOFTPLUS_THRESHOLD, 0 * dγ_i, dγ_i * e / (e + 1), out=dz[..., sG])"),
}
# The Triton gates' backward kernel (``probe_gates_bwd_kernel``), the same two errors.
GATE_MUTANTS = {
    "gamma_no_mean": [Plant(probe_gates_module, "probe_gates_bwd_kernel", "dg_i = -c_reduce * tl.load(",
                            "dg_i = -tl.load(")],
    "no_projection": [Plant(probe_gates_module, "probe_gates_bwd_kernel",
                            "d_u = (d_k - kap * tl.sum(kap * d_k, axis=1)[:, None]) * s[:, None]",
                            "d_u = d_k * s[:, None]")],
    "softplus_dropped_above_threshold": [Plant(
        probe_gates_module, "probe_gates_bwd_kernel",
        "d_g = tl.where(g > 20.0, dg_i[None, :], dg_i[None, :] * tl.sigmoid(g))",
        "d_g = tl.where(g > 20.0, 0.0 * dg_i[None, :], dg_i[None, :] * tl.sigmoid(g))")],
}


def _bound(dtype, quantity: str) -> float:
    return tolerance(COMPONENT, "outputs" if quantity in OUTPUT_NAMES else "grads", dtype, mode="any")


# Not an error bound but a comparison rule (tolerances.yaml holds bounds below 1): the fused float32
# error may be this many times the generic float32 path's own error on an ill-conditioned draw.
GENERIC_FACTOR = 30.0       # fused / generic float32 error: worst 6.3 (thorough profile)


class ProbeDraw(NamedTuple):
    scheme: str
    reduction: str
    B: int
    F: int
    H: int
    K: int
    V: int
    n: int
    seed: int
    gate_scale: float = 1.0
    snaps: str = "normal"                       # SNAP_KINDS or "zero"
    none: tuple = (False,) * 5                  # which of dκ, dν, dβ, dω, dγ are None


def _snapshots(gen, d: ProbeDraw) -> torch.Tensor:
    shape = (d.B, d.F, d.H, d.K, d.V)
    if d.snaps == "zero":
        return torch.zeros(shape, dtype=torch.float64)
    if d.snaps == "large":             # the gates' pre-activations past softplus's threshold of 20
        return LARGE * randn(gen, *shape)
    normal = randn(gen, *shape)
    rank_one = (randn(gen, d.B, d.F, d.H, d.K, 1) * randn(gen, d.B, d.F, d.H, 1, d.V)
                + RANK_ONE_NOISE * randn(gen, *shape))
    tiny = TINY * randn(gen, *shape)
    if d.snaps == "mixed":
        kind = torch.arange(d.B * d.F).reshape(d.B, d.F, 1, 1, 1) % 3
        return torch.where(kind == 0, normal, torch.where(kind == 1, rank_one, tiny))
    return {"normal": normal, "rank_one": rank_one, "tiny": tiny}[d.snaps]


def probe_inputs(d: ProbeDraw):
    """Float64 ``snaps [B, F, H, K, V]``, the scheme's parameters and the five upstream
    gradients (``None`` where ``d.none`` says)."""
    gen = generator(d.seed)
    snaps = _snapshots(gen, d)
    params = make_levels(2, d.H, d.K, d.V, scheme=d.scheme, query_counts=[d.n], reduction=d.reduction,
                         generator=gen, gate_scale=d.gate_scale)[0].params
    lead = (d.B, d.F, d.H)
    shapes = [lead + (d.n, d.K), lead + (d.n, d.V), lead + (d.n, d.K), lead + (d.n, d.V), lead + (d.K,)]
    grads = [None if skip else randn(gen, *shape) for skip, shape in zip(d.none, shapes)]
    return snaps, params, grads


def generic(d: ProbeDraw, snaps, params, grads):
    """The registered probe in float64 and ``torch.autograd.grad`` of it: ``(outs, d_snaps,
    {name: d_param})`` (zeros where autograd reports no dependence)."""
    leaf = snaps.detach().clone().requires_grad_()
    leaves = {k: p.detach().clone().requires_grad_() for k, p in params.items()}
    with torch.enable_grad():
        outs = get_scheme(d.scheme).probe(leaf, leaves, d.reduction)
        pairs = [(x, g) for x, g in zip(outs, grads) if g is not None and x.requires_grad]
        if pairs:
            got = torch.autograd.grad([x for x, _ in pairs], [leaf, *leaves.values()],
                                      [g for _, g in pairs], allow_unused=True)
        else:
            got = [None] * (1 + len(leaves))
    zero = [leaf, *leaves.values()]
    got = [torch.zeros_like(z) if g is None else g for g, z in zip(got, zero)]
    return [x.detach() for x in outs], got[0], dict(zip(leaves, got[1:]))


def fused_vs_generic(d: ProbeDraw, dtype=torch.float64, mutant=None, log=True, gates="torch") -> dict:
    """``{quantity: (relative error, bound)}`` of the fused probe in ``dtype`` against the generic
    float64 path on the same (``dtype``-rounded) inputs. ``gates="triton"``: the fused probe with
    its gates in ``optimized.nested.probe_gates`` (float32, on the Triton device). ``mutant``: the
    backward runs with that entry of ``MUTANTS`` (``gates="torch"``) or ``GATE_MUTANTS`` planted."""
    snaps, params, grads = probe_inputs(d)
    rounded = lambda x: None if x is None else x.to(dtype)          # noqa: E731
    snaps_f, params_f = rounded(snaps), {k: rounded(p) for k, p in params.items()}
    grads_f = [rounded(g) for g in grads]
    as64 = lambda x: None if x is None else x.to(torch.float64)     # noqa: E731
    outs_ref, ds_ref, dp_ref = generic(d, as64(snaps_f), {k: as64(p) for k, p in params_f.items()},
                                       [as64(g) for g in grads_f])
    plants = () if mutant is None else (MUTANTS if gates == "torch" else GATE_MUTANTS)[mutant]
    if gates == "torch":
        outs, saved = probe_fwd(d.scheme, snaps_f, params_f, d.reduction)
        with planted(*plants):
            ds, dp = probe_bwd(d.scheme, saved, snaps_f, params_f, d.reduction, *grads_f)
    else:                               # on the Triton device and back
        dev = lambda x: None if x is None else x.to(DEV)            # noqa: E731
        outs, saved = probe_fwd(d.scheme, dev(snaps_f), {k: dev(p) for k, p in params_f.items()}, d.reduction,
                                gates=gates, keep_preactivations=gates != "triton-nu")
        with planted(*plants):
            ds, dp = probe_bwd(d.scheme, saved, dev(snaps_f), {k: dev(p) for k, p in params_f.items()},
                               d.reduction, *(dev(g) for g in grads_f), gates=gates)
        outs, ds, dp = [x.cpu() for x in outs], ds.cpu(), {k: x.cpu() for k, x in dp.items()}
    pairs = dict(zip(OUTPUT_NAMES, zip(outs, outs_ref)))
    pairs["d_snaps"] = (ds, ds_ref)
    for k in dp_ref:
        pairs[f"d_{k}"] = (dp[k], dp_ref[k])
    floor = {}
    if dtype != torch.float64:          # the generic path in ``dtype``: the accuracy the fused path replaces
        outs_g, ds_g, dp_g = generic(d, snaps_f, params_f, grads_f)
        floor = dict(zip(OUTPUT_NAMES, (relative_error(x, y) for x, y in zip(outs_g, outs_ref))))
        floor["d_snaps"] = relative_error(ds_g, ds_ref)
        floor.update({f"d_{k}": relative_error(dp_g[k], dp_ref[k]) for k in dp_ref})
    errors = {}
    for q, (actual, expected) in pairs.items():
        assert actual.shape == expected.shape and actual.dtype == dtype, (q, actual.shape, actual.dtype)
        err, bound = relative_error(actual, expected), max(_bound(dtype, q), GENERIC_FACTOR * floor.get(q, 0.0))
        if log:
            record(COMPONENT, "any", dtype, q, err, bound)
        errors[q] = (err, bound)
    return errors


@st.composite
def probe_draws(draw, scheme, reduction):
    K = draw(st.sampled_from((3, 4, 6, 8)))
    V = draw(st.sampled_from([v for v in (2, 3, 5, 8) if v != K]))
    n = K if scheme == "merge" else draw(st.one_of(st.just(K), st.integers(1, K)))
    none = draw(st.one_of(st.just((False,) * 5), st.tuples(*[st.booleans()] * 5)))
    snaps = draw(st.sampled_from(SNAP_KINDS))
    if scheme == "bounded_erase" and snaps in ("rank_one", "mixed"):
        none = (False,) + none[1:]      # dκ = 0 with overlapping keys is ill-conditioned: see RANK_ONE_NOISE
    return ProbeDraw(scheme, reduction, B=draw(st.integers(1, 2)), F=draw(st.sampled_from((1, 2, 3))),
                     H=draw(st.integers(1, 2)), K=K, V=V, n=n, seed=draw(seeds()),
                     gate_scale=draw(st.sampled_from(GATE_SCALES)), snaps=snaps,
                     none=none)


COMBOS = [(s, r) for s in FUSED_SCHEMES for r in ("mean", "sum")]


def _fixed_draws():
    draws = []
    for i, (s, r) in enumerate(COMBOS):
        base = ProbeDraw(s, r, B=2, F=3, H=2, K=6, V=5, n=6, seed=10 + i, gate_scale=30.0, snaps="mixed")
        draws += [base,
                  base._replace(F=1, B=1, H=1, K=4, V=8, n=4 if s == "merge" else 2, snaps="rank_one"),
                  base._replace(F=1, snaps="tiny", n=6 if s == "merge" else 3, seed=20 + i),
                  base._replace(snaps="rank_one", gate_scale=1.0,
                                none=(s != "bounded_erase", False, False, True, False)),
                  base._replace(snaps="normal" if s == "bounded_erase" else "mixed",
                                none=(True, False, False, False, False), seed=30 + i),
                  base._replace(F=3, B=1, snaps="zero", none=(False, True, False, False, True)),
                  base._replace(snaps="normal", n=6 if s == "merge" else 1, none=(True, True, False, True, True)),
                  base._replace(snaps="large", seed=40 + i)]
    return draws


FIXED_DRAWS = _fixed_draws()


def test_large_fixed_draws_reach_both_sides_of_softplus_threshold():
    """The fixed draws' decay logits ``z = ν W_γ`` lie above softplus's threshold of 20 (where
    ``softplus(z) = z`` and its gradient is 1) and below it, for every scheme: the gates' backward
    takes both branches (a gradient dropped above the threshold passed every other draw)."""
    for d in FIXED_DRAWS:
        if d.snaps != "large":
            continue
        snaps, params, _ = probe_inputs(d)
        nu = snaps if d.scheme == "merge" else params["Q"][None, None] @ snaps       # [B, F, H, n, V]
        z = nu @ params["W_gamma"][None, None]
        assert (z > 20).any() and (z < 20).any(), (d.scheme, float(z.max()))


@pytest.mark.parametrize("d", FIXED_DRAWS, ids=lambda d: f"{d.scheme}-{d.reduction}-F{d.F}-n{d.n}-{d.snaps}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_fused_probe_fixed_draws(d, dtype):
    assert_passes(fused_vs_generic(d, dtype))


@pytest.mark.parametrize("scheme,reduction", COMBOS)
@examples(scale=5)
@given(data=st.data())
def test_fused_probe_equals_generic_float64(scheme, reduction, data):
    assert_passes(fused_vs_generic(data.draw(probe_draws(scheme, reduction)), torch.float64))


@pytest.mark.parametrize("scheme,reduction", COMBOS)
@examples(scale=5)
@given(data=st.data())
def test_fused_probe_float32_near_generic_float64(scheme, reduction, data):
    assert_passes(fused_vs_generic(data.draw(probe_draws(scheme, reduction)), torch.float32))


# --- the gates in one Triton kernel (optimized.nested.probe_gates; learned and merge) ------------
GATE_COMBOS = [(s, r) for s, r in COMBOS if s in GATE_SCHEMES]
GATE_FIXED = [d for d in FIXED_DRAWS if d.scheme in GATE_SCHEMES]


# the gates that make z themselves (gates="triton-nu") with tiles of 32 rows, two a program: on these
# small draws (n ≤ 16, each firing MIN_NP = 16 rows) a tile holds 2 firings, so the draws reach several
# tiles and programs per head, a ragged last one (B·F odd) and rows past n in a firing
SMALL_ROWS = 32


SMALL_TILES = 2


@contextlib.contextmanager
def gates_rows(gates):
    """The gates' launch for a property: ``triton-nu`` at ``SMALL_ROWS`` rows a tile and
    ``SMALL_TILES`` tiles a program."""
    if gates != "triton-nu":
        yield
        return
    with mock.patch.object(probe_gates_nu_module, "ROWS", SMALL_ROWS), \
            mock.patch.object(probe_gates_nu_module, "TILES", SMALL_TILES):
        yield


@pytest.mark.parametrize("gates", ["triton", "triton-nu"])
@pytest.mark.parametrize("d", GATE_FIXED, ids=lambda d: f"{d.scheme}-{d.reduction}-F{d.F}-n{d.n}-{d.snaps}")
def test_triton_gates_fixed_draws(d, gates):
    """Float32 on the Triton device against the generic float64 path, as the PyTorch gates are:
    the fixed draws cover n = 1 … K, the largest gates (softplus above its threshold, saturated
    sigmoids), zero snapshots and every missing upstream gradient."""
    with gates_rows(gates):
        assert_passes(fused_vs_generic(d, torch.float32, gates=gates))


@pytest.mark.parametrize("gates", ["triton", "triton-nu"])
@pytest.mark.parametrize("scheme,reduction", GATE_COMBOS)
@examples(scale=3)
@given(data=st.data())
def test_triton_gates_float32_near_generic_float64(scheme, reduction, gates, data):
    with gates_rows(gates):
        assert_passes(fused_vs_generic(data.draw(probe_draws(scheme, reduction)), torch.float32, gates=gates))


def test_gates_from_nu_at_the_ops_blocks():
    """``triton-nu`` at its default tiles and K = V = 128, n = 16 (the op's level 1): 4 firings a
    tile, B·F = 10 firings in three tiles of one program per head and block, the last ragged; and
    with one tile a program, three programs."""
    d = ProbeDraw("learned", "mean", B=2, F=5, H=2, K=128, V=128, n=16, seed=12, gate_scale=30.0)
    assert probe_gates_nu_module.blocks(16, 128, 128) == (4, 16, 128, 128)
    # the op runs these tiles with TF32 dots (bf16 runs); float32 runs keep 128-wide blocks on the bmm
    # (IEEE_MAX_BLOCK): let the IEEE kernels run them here, the same code with exact dots
    calls = []
    launch = probe_fused_module.probe_gates_nu_fwd

    def spy(*args, **kwargs):
        calls.append(kwargs["precision"])
        return launch(*args, **kwargs)

    with mock.patch.object(probe_gates_nu_module, "IEEE_MAX_BLOCK", 128), \
            mock.patch.object(probe_fused_module, "probe_gates_nu_fwd", spy):
        assert_passes(fused_vs_generic(d, torch.float32, gates="triton-nu"))
        with mock.patch.object(probe_gates_nu_module, "TILES", 1):
            assert_passes(fused_vs_generic(d, torch.float32, gates="triton-nu"))
    assert calls == ["ieee", "ieee"]


def test_gates_from_nu_fall_back_where_their_blocks_do_not_fit():
    """Above 128 rows a firing or K, V above 128 the gates take the bmm's ``z``
    (``probe_gates``): ``blocks`` says None and the kernels' launchers refuse. The op's rule also
    keeps firings above ``NU_GATES_MAX_PAIRS`` pairs (64) on the bmm, where the blocks fit, and
    with IEEE float32 dots K, V above ``IEEE_MAX_BLOCK`` (64)."""
    from optimized.nested.probe_fused import _gates_from_nu

    assert probe_gates_nu_module.blocks(200, 64, 64) is None and probe_gates_nu_module.blocks(16, 256, 64) is None
    assert _gates_from_nu("triton-nu", "learned", 16, 128, 128, "tf32")
    assert _gates_from_nu("triton-nu", "learned", 64, 128, 128, "tf32")
    assert not _gates_from_nu("triton-nu", "learned", 128, 128, 128, "tf32")      # blocks fit; measured slower
    assert not _gates_from_nu("triton-nu", "merge", 128, 128, 128, "tf32")
    assert not _gates_from_nu("triton-nu", "learned", 16, 256, 128, "tf32")
    assert not _gates_from_nu("triton-nu", "bounded_erase", 16, 128, 128, "tf32")
    assert not _gates_from_nu("triton", "learned", 16, 128, 128, "tf32")
    # IEEE float32 dots: blocks up to IEEE_MAX_BLOCK (64); TF32 up to MAX_BLOCK
    assert _gates_from_nu("triton-nu", "learned", 16, 64, 64, "ieee")
    assert not _gates_from_nu("triton-nu", "learned", 16, 64, 80, "ieee")
    assert not _gates_from_nu("triton-nu", "learned", 16, 128, 128, "ieee")
    assert _gates_from_nu("triton-nu", "learned", 16, 128, 128, "tf32")
    with pytest.raises(ValueError, match="precision must be one of"):
        _gates_from_nu("triton-nu", "learned", 16, 64, 64, "fp32")
    nu, W = torch.zeros(1, 1, 2, 300), torch.zeros(1, 300, 3 * 4 + 300)
    with pytest.raises(ValueError, match="use the bmm and probe_gates"):
        probe_gates_nu_module.probe_gates_nu_bwd("learned", nu, W, 1, 1, 2, 4, 300, "mean")
    nu, W = torch.zeros(1, 1, 2, 5), torch.zeros(1, 5, 3 * 4 + 5)
    with pytest.raises(ValueError, match="bounded_erase keeps the PyTorch gates"):
        probe_gates_nu_module.probe_gates_nu_bwd("bounded_erase", nu, W, 1, 1, 2, 4, 5, "mean")
    with pytest.raises(ValueError, match="precision must be one of"):
        probe_gates_nu_module.probe_gates_nu_bwd("learned", nu, W, 1, 1, 2, 4, 5, "mean", precision="bf16")
    with pytest.raises(ValueError, match="rows must be a power of two"):
        probe_gates_nu_module.probe_gates_nu_bwd("learned", nu, W, 1, 1, 2, 4, 5, "mean", rows=24)
    with pytest.raises(ValueError, match=r"W must be a contiguous float32 \(1, 5, 17\)"):
        probe_gates_nu_module.probe_gates_nu_bwd("learned", nu, W[..., :-1], 1, 1, 2, 4, 5, "mean")


class _RefusesStages:
    """A stand-in kernel the GPU refuses at Triton's default stages: counts its launches."""
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, num_stages=None, **kwargs):
            self.launches.append(num_stages)
            if num_stages is None:
                from triton.runtime.errors import OutOfResources
                raise OutOfResources(327680, 232448, "shared memory")
        return launch


def _launches_of_three_calls(launch):
    kernel, x = _RefusesStages(), torch.zeros(1)
    with mock.patch.object(fits, "_FIRST_THAT_FITS", {}):
        for _ in range(3):
            launch(kernel, (1,), x, SEG=0, G=1)
    return kernel.launches


def test_gates_launch_remembers_a_refused_stage_count():
    """A launch refused at the default stages goes to one stage, and the next calls go there at
    once: one refusal, not one a call."""
    assert _launches_of_three_calls(probe_gates_nu_module._launch) == [None, 1, 1, 1]


def test_launch_count_catches_a_launch_retried_every_call():
    def retry_every_call(kernel, grid, *args, **kwargs):
        from triton.runtime.errors import OutOfResources
        try:
            kernel[grid](*args, **kwargs)
        except OutOfResources:
            kernel[grid](*args, num_stages=1, **kwargs)

    assert _launches_of_three_calls(retry_every_call) == [None, 1] * 3


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_gates_from_nu_keep_z_only_when_asked(keep):
    """``triton-nu`` with ``keep_preactivations`` keeps the bmm's ``z`` (the ``triton`` path); without
    it nothing is kept and ``z`` is never made outside the kernels: the two agree."""
    d = ProbeDraw("learned", "sum", B=2, F=2, H=2, K=8, V=6, n=4, seed=4)
    snaps, params, grads = probe_inputs(d)
    f32 = lambda x: None if x is None else x.float().to(DEV)        # noqa: E731
    snaps, params, grads = f32(snaps), {k: f32(p) for k, p in params.items()}, [f32(g) for g in grads]
    outs, saved = probe_fwd("learned", snaps, params, "sum", keep_preactivations=keep, gates="triton-nu")
    assert (saved.z is not None) == keep
    ref_outs, ref_saved = probe_fwd("learned", snaps, params, "sum", keep_preactivations=True, gates="triton")
    for x, y in zip(outs, ref_outs):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)
    got = probe_bwd("learned", saved, snaps, params, "sum", *grads, gates="triton-nu")
    want = probe_bwd("learned", ref_saved, snaps, params, "sum", *grads, gates="triton")
    assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert all(torch.allclose(got[1][k], want[1][k], rtol=1e-5, atol=1e-5) for k in want[1])


# The kernels that make z themselves: each error must fail the float32 property at SMALL_ROWS.
# The tiles' code is in ``_fwd_tiles`` / ``_bwd_tiles``, called by the per-block and the one-launch
# kernels alike: a planted helper is seen by both.
NU_CALLERS = {"_fwd_tiles": ("probe_gates_nu_fwd_kernel", "probe_gates_nu_fwd_one_kernel"),
              "_bwd_tiles": ("probe_gates_nu_bwd_kernel", "probe_gates_nu_bwd_one_kernel")}


def _nu(helper, old, new):
    return [Plant(probe_gates_nu_module, helper, old, new,
                  rebind=tuple((probe_gates_nu_module, k) for k in NU_CALLERS[helper]))]


NU_GATE_MUTANTS = {
    # γ summed over the wrong rows: the tile's rows grouped as (NP, G) instead of (G, NP)
    "gamma_wrong_firing": _nu("_fwd_tiles", "(G, NP, BC)), axis=1)", "(NP, G, BC)), axis=0)"),
    # the backward's reduction factor forgotten
    "gamma_no_mean": _nu("_bwd_tiles", "dg_i = -c_reduce * _load_parts(", "dg_i = -_load_parts("),
    # the program's tiles overlap: tile j of program p is tile p + j
    "tiles_overlap": _nu("_fwd_tiles", "i_t = i_p * TILES + j", "i_t = i_p + j"),
    # the tiles counted by whole tiles: the ragged last tile's firings never written
    "ragged_tile_dropped": _nu("_fwd_tiles", "tl.cdiv(Bt, G) - i_p * TILES", "Bt // G - i_p * TILES"),
    "ragged_tile_dropped_bwd": _nu("_bwd_tiles", "tl.cdiv(Bt, G) - i_p * TILES",
                                   "Bt // G - i_p * TILES"),
    # l2norm's backward without its projection
    "no_projection": _nu("_bwd_tiles",
                         "d = (d_y - kap * tl.sum(kap * d_y, axis=1)[:, None]) * s[:, None]",
                         "d = d_y * s[:, None]"),
    # dz's rows in the outputs' (bt, h) order instead of the bmm's (h, bt)
    "dz_rows_bt_major": _nu("_bwd_tiles", "p_dz = dz + ((i_h.to(tl.int64) * Bt + bt) * n + i_n)",
                            "p_dz = dz + ((bt.to(tl.int64) * H + i_h) * n + i_n)"),
    # softplus' gradient dropped above its threshold (drawn at NU_MUTANT_DRAWS' large snapshots)
    "softplus_dropped_above_threshold": _nu("_bwd_tiles", "d = tl.where(zc > 20.0, dg_i, dg_i * tl.sigmoid(zc))",
                                            "d = tl.where(zc > 20.0, 0.0 * dg_i, dg_i * tl.sigmoid(zc))"),
    # β made from ω's columns of W (its column offset one block late)
    "beta_from_omega_columns": [Plant(probe_gates_nu_module, "_first_column",
                                      "        col0 = OFF_B\n", "        col0 = OFF_B + K\n",
                                      rebind=((probe_gates_nu_module, "_column_block"),
                                              (probe_gates_nu_module, "_fwd_tiles"),
                                              (probe_gates_nu_module, "probe_gates_nu_fwd_kernel"),
                                              (probe_gates_nu_module, "probe_gates_nu_fwd_one_kernel")))],
}
# B·F = 9 firings, n = 5 of 8 rows: 2 firings a tile at 16 rows (the fifth tile ragged), two tiles a
# program, three programs per head and block (the third runs one tile)
NU_MUTANT_DRAW = ProbeDraw("learned", "mean", B=3, F=3, H=2, K=6, V=5, n=5, seed=8, gate_scale=8.0)
NU_MUTANT_DRAWS = {"softplus_dropped_above_threshold": NU_MUTANT_DRAW._replace(gate_scale=30.0, snaps="large")}


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", sorted(NU_GATE_MUTANTS))
def test_gates_from_nu_mutant_fails(mutant):
    """Each planted error of the kernels that make ``z`` themselves fails the float32 property on a
    draw of several tiles and programs per head (``NU_MUTANT_DRAW``), which the kernels pass
    unmutated. Every new buffer starts as NaN, so a row the kernels never write fails (on CUDA the
    allocator would hand back the unmutated run's buffer, right values included)."""
    d = NU_MUTANT_DRAWS.get(mutant, NU_MUTANT_DRAW)
    with gates_rows("triton-nu"), nan_filled_allocations():
        assert not failures(fused_vs_generic(d, torch.float32, gates="triton-nu"))
        with planted(*NU_GATE_MUTANTS[mutant]):
            bad = failures(fused_vs_generic(d, torch.float32, log=False, gates="triton-nu"))
    assert bad and max(e for e, _ in bad.values()) > 1e-4, bad


def _gates_nu_both_passes(scheme, one_launch, missing=("omega",)):
    """``probe_gates_nu_fwd``'s four outputs and ``probe_gates_nu_bwd``'s ``dz`` at a draw of several
    tiles and programs per head (``SMALL_ROWS``, ``SMALL_TILES``; B·F = 9 firings of n = 5, H = 2),
    ``missing`` gradients absent, every new buffer NaN-filled; one launch per block or one in all."""
    Bt, H, n, K, V = 9, 2, 5, 6, 5
    C = probe_gates_module.gate_columns(scheme, K, V)
    dev = triton_mode.device()
    gen = torch.Generator().manual_seed(4)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dev)

    nu, W = rnd(Bt, H, n, V), rnd(H, V, C, scale=2.0)
    shapes = {"kappa": (Bt, H, n, K), "beta": (Bt, H, n, K), "omega": (Bt, H, n, V), "gamma": (Bt, H, K)}
    grads = {k: None if k in missing else rnd(*shape) for k, shape in shapes.items()}
    if scheme == "merge":
        grads["kappa"] = None
    with gates_rows("triton-nu"), nan_filled_allocations():
        outs = {k: torch.full(shape, float("nan"), device=dev) for k, shape in shapes.items()}
        if scheme == "merge":
            outs["kappa"] = None
        probe_gates_nu_module.probe_gates_nu_fwd(scheme, nu, W, Bt, H, n, K, V, "mean", outs["kappa"], outs["beta"],
                                                 outs["omega"], outs["gamma"], one_launch=one_launch)
        dz = probe_gates_nu_module.probe_gates_nu_bwd(scheme, nu, W, Bt, H, n, K, V, "mean", grads["kappa"],
                                                      grads["beta"], grads["omega"], grads["gamma"],
                                                      one_launch=one_launch)
    return [t for t in outs.values() if t is not None] + [dz]


def gate_forms(quantity: str, got: list, want: list, log: bool = True) -> dict:
    """``{label: (error, bound)}``: each tensor of ``got`` against ``want``'s under
    ``tolerances.yaml`` ``probe_gates_nu_forms`` (``quantity``; the last pair is ``dz`` when
    ``quantity`` is ``gates``)."""
    out = {}
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        q = "dz" if quantity == "gates" and i == len(got) - 1 else quantity
        out[f"{q} {i}"] = compare("probe_gates_nu_forms", "float32", {q: (a, b)}, mode="any", log=log)[q]
    return out


@pytest.mark.parametrize("scheme", GATE_SCHEMES)
def test_gates_from_nu_in_one_launch_agree_with_a_launch_per_block(scheme):
    """``one_launch``: every block's gate in one launch (program axis 2 picks the block, merge's
    from β on) writes what one launch per block writes, forward and backward, with a gradient
    absent, to float32 rounding; everything written (no NaN left). Not bit for bit: the one launch
    is another kernel, unpipelined (``tolerances.yaml`` ``probe_gates_nu_forms``)."""
    per_block = _gates_nu_both_passes(scheme, False)
    one = _gates_nu_both_passes(scheme, True)
    assert all(torch.isfinite(t).all() for t in one)
    assert_passes(gate_forms("gates", one, per_block))


ONE_LAUNCH_MUTANTS = {
    # the β branch writes into κ's buffer (β never written)
    "beta_into_kappa": [Plant(probe_gates_nu_module, "probe_gates_nu_fwd_one_kernel",
                              "_fwd_tiles(nu, w, beta,", "_fwd_tiles(nu, w, kappa,")],
    # ω's columns of dz made with γ's presence flag
    "omega_flag_of_gamma": [Plant(probe_gates_nu_module, "probe_gates_nu_bwd_one_kernel",
                                  "i_h, i_p, 2, HAS_D2,", "i_h, i_p, 2, HAS_D3,")],
}


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", sorted(ONE_LAUNCH_MUTANTS))
def test_gates_from_nu_in_one_launch_mutant_fails(mutant):
    per_block = _gates_nu_both_passes("learned", False)
    with planted(*ONE_LAUNCH_MUTANTS[mutant]):
        one = _gates_nu_both_passes("learned", True)
    assert failures(gate_forms("gates", one, per_block, log=False))


def _gates_nu_bwd_from_partials(npart: int, one_launch: bool, as_partials: bool, scheme: str = "learned"):
    """``probe_gates_nu_bwd``'s ``dz`` (the draw of ``_gates_nu_both_passes``) from ``npart``
    per-V-block partials of ``dκ``, ``dβ``, ``dγ`` handed over as ``promote_scan.Partials`` (the
    kernels sum them as they load them) or summed first by ``sum_partials``; ``dω`` whole. ``merge``
    (n = K) without ``dκ``: its partials start at ``dβ``."""
    from optimized.nested.promote_scan import Partials, sum_partials

    Bt, H, K, V = 9, 2, 6, 5
    n = K if scheme == "merge" else 5
    C = probe_gates_module.gate_columns(scheme, K, V)
    dev = triton_mode.device()
    gen = torch.Generator().manual_seed(6)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dev)

    nu, W = rnd(Bt, H, n, V), rnd(H, V, C, scale=2.0)
    parts = {"kappa": rnd(npart, Bt, H, n, K), "beta": rnd(npart, Bt, H, n, K), "gamma": rnd(npart, Bt, H, K)}
    grads = {k: Partials(p) if as_partials else sum_partials(p) for k, p in parts.items()}
    if scheme == "merge":
        grads["kappa"] = None
    with gates_rows("triton-nu"), nan_filled_allocations():
        return probe_gates_nu_module.probe_gates_nu_bwd(scheme, nu, W, Bt, H, n, K, V, "mean", grads["kappa"],
                                                        grads["beta"], rnd(Bt, H, n, V), grads["gamma"],
                                                        one_launch=one_launch)


@pytest.mark.parametrize("scheme", ["learned", "merge"])
@pytest.mark.parametrize("one_launch", [False, True], ids=["per_block", "one_launch"])
@pytest.mark.parametrize("npart", [2, 3])
def test_gates_from_nu_sum_partials_as_they_load_them(npart, one_launch, scheme):
    """The gates' backward given the reverse scan's per-V-block partials (``Partials``) writes the
    ``dz`` it writes from their ``sum_partials`` (the same float32 sums, left to right), at two and
    three partials, in a launch per block and in one launch, for ``learned`` and for ``merge``
    without ``dκ``; every row written. To float32 rounding, not bit for bit: the kernel that loads
    the partials is compiled for another ``NPART`` (``tolerances.yaml`` ``probe_gates_nu_forms``)."""
    kept = _gates_nu_bwd_from_partials(npart, one_launch, as_partials=True, scheme=scheme)
    assert torch.isfinite(kept).all()
    summed_first = _gates_nu_bwd_from_partials(npart, one_launch, as_partials=False, scheme=scheme)
    assert_passes(gate_forms("dz_from_partials", [kept], [summed_first]))


@pytest.mark.mutation
def test_merge_partials_catch_the_partials_stride_taken_from_the_absent_dkappa():
    """One launch reads dβ's partials with the stride of the first gradient given; a launcher taking
    dκ's (0 for ``merge``, which has none) reads dβ's first partial three times."""
    m = probe_gates_nu_module
    plant = Plant(m, "probe_gates_nu_bwd", "max(strides[:2]), strides[3]", "strides[0], strides[3]")
    right = _gates_nu_bwd_from_partials(3, True, as_partials=False, scheme="merge")
    with planted(plant):
        broken = _gates_nu_bwd_from_partials(3, True, as_partials=True, scheme="merge")
    assert failures(gate_forms("dz_from_partials", [broken], [right], log=False))


@pytest.mark.parametrize("one_launch", [False, True], ids=["per_block", "one_launch"])
def test_gates_from_nu_release_the_partials_they_read(one_launch, monkeypatch):
    """The partials are read once: the gates' backward releases every ``Partials`` it is given
    (the step's peak would otherwise hold two buffers of dκ and dβ through the probe's backward:
    ``bench.memory_cpu``'s tally +1.4 % at L = 4, +2.3 % at L = 6, K = 128), and a released one
    refuses a second read. A consumer that keeps them (``release`` a no-op) fails."""
    from optimized.nested.promote_scan import Partials

    def run():
        gen = torch.Generator().manual_seed(2)
        dev = triton_mode.device()
        Bt, H, n, K, V = 3, 2, 5, 6, 5
        C = probe_gates_module.gate_columns("learned", K, V)
        nu, W = (torch.randn(*shape, generator=gen).to(dev) for shape in ((Bt, H, n, V), (H, V, C)))
        given = [Partials(torch.randn(2, *shape, generator=gen).to(dev)) for shape in
                 ((Bt, H, n, K), (Bt, H, n, K), (Bt, H, K))]
        with gates_rows("triton-nu"):
            probe_gates_nu_module.probe_gates_nu_bwd("learned", nu, W, Bt, H, n, K, V, "mean", given[0], given[1],
                                                     None, given[2], one_launch=one_launch)
        return given

    given = run()
    assert all(p.parts is None for p in given)
    with pytest.raises(RuntimeError, match="released"):
        given[0].total()
    monkeypatch.setattr(Partials, "release", lambda self: None)
    assert not all(p.parts is None for p in run())


PARTIALS_MUTANTS = {
    # the last partial never loaded
    "last_partial_dropped": ("tl.static_range(1, NPART)", "tl.static_range(1, NPART - 1)"),
    # every later partial read from the second buffer
    "second_partial_repeated": ("acc += tl.load(p + j * PART_STRIDE", "acc += tl.load(p + PART_STRIDE"),
}


@pytest.mark.mutation
@pytest.mark.parametrize("one_launch", [False, True], ids=["per_block", "one_launch"])
@pytest.mark.parametrize("mutant", sorted(PARTIALS_MUTANTS))
def test_gates_from_nu_partials_mutant_fails(mutant, one_launch):
    """Each planted error in the partials' load changes ``dz`` at three partials."""
    old, new = PARTIALS_MUTANTS[mutant]
    m = probe_gates_nu_module
    plant = Plant(m, "_load_parts", old, new, rebind=tuple((m, k) for k in (
        "_bwd_tiles", "probe_gates_nu_bwd_kernel", "probe_gates_nu_bwd_one_kernel")))
    right = _gates_nu_bwd_from_partials(3, one_launch, as_partials=False)
    with planted(plant):
        broken = _gates_nu_bwd_from_partials(3, one_launch, as_partials=True)
    assert failures(gate_forms("dz_from_partials", [broken], [right], log=False))


def test_gates_from_nu_shared_partials_rule():
    """``shared_partials``: stacked buffers and their count only where every gradient given among
    dκ, dβ, dγ is a ``Partials`` of one count ≥ 2; a tensor beside them, or counts that differ, or
    a single partial: everything summed (count 1). ``dω`` as ``Partials`` is refused."""
    from optimized.nested.promote_scan import Partials, sum_partials

    m = probe_gates_nu_module
    p2, p3, t = torch.randn(2, 4, 3), torch.randn(3, 4, 3), torch.randn(4, 3)
    # exact: the buffers handed on as they are, or summed by the same sum_partials
    grads, npart = m.shared_partials([Partials(p2), None, t, Partials(p2 + 1)])
    assert npart == 2 and torch.equal(grads[0], p2) and grads[1] is None and grads[2] is t
    for mixed in ([Partials(p2), t, None, None], [Partials(p2), Partials(p3), None, None],
                  [Partials(p2[:1]), None, None, None]):
        grads, npart = m.shared_partials(mixed)
        assert npart == 1
        assert all(g is None or isinstance(g, torch.Tensor) for g in grads)
    grads, _ = m.shared_partials([Partials(p3), None, None, None])
    assert torch.equal(grads[0], p3)
    assert torch.equal(m.shared_partials([Partials(p3), t, None, None])[0][0], sum_partials(p3))
    with pytest.raises(TypeError, match="domega"):
        m.probe_gates_nu_bwd("learned", torch.zeros(1, 1, 1, 2), torch.zeros(1, 2, 3 * 2 + 2), 1, 1, 1, 2, 2, "mean",
                             domega=Partials(torch.zeros(2, 1, 1, 1, 2)))


def test_gates_from_nu_one_launch_argument(monkeypatch):
    """``one_launch`` None takes ``ONE_LAUNCH``, whose default None is one launch at head dims up
    to ``ONE_LAUNCH_MAX_K`` (64) and one launch per block above; True / False hold at every K; not
    a bool is refused."""
    m = probe_gates_nu_module
    assert m.ONE_LAUNCH is None and m.ONE_LAUNCH_MAX_K == 64
    assert [m._one_launch(None, K) for K in (16, 64, 65, 128)] == [True, True, False, False]
    assert [m._one_launch(flag, K) for flag in (True, False) for K in (16, 128)] == [True, True, False, False]
    monkeypatch.setattr(m, "ONE_LAUNCH", False)
    assert m._one_launch(None, 16) is False
    with pytest.raises(TypeError, match="one_launch must be a bool"):
        m._one_launch(1, 16)


def test_triton_gates_cover_more_than_one_row_block():
    """n = 40 rows at K = V = 128 take several row blocks of the kernel (``BN`` = 32), a ragged last
    one, and γ's sum carried across them."""
    from optimized.nested.probe_gates import _sizes

    d = ProbeDraw("learned", "mean", B=1, F=2, H=2, K=128, V=128, n=40, seed=11, gate_scale=30.0)
    assert _sizes("learned", torch.empty(2, 2 * 40, 3 * 128 + 128), 2, 2, 40, 128, 128)[2] == 32
    assert_passes(fused_vs_generic(d, torch.float32, gates="triton"))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", sorted(GATE_MUTANTS))
def test_triton_gates_mutant_fails(mutant):
    """The kernel's own planted errors (γ's gradient summed instead of averaged; l2norm without its
    projection) fail the float32 property on their draws, which the kernel passes unmutated."""
    d = MUTANT_DRAWS[mutant]
    assert not failures(fused_vs_generic(d, torch.float32, gates="triton"))
    bad = failures(fused_vs_generic(d, torch.float32, mutant=mutant, log=False, gates="triton"))
    assert bad and max(e for e, _ in bad.values()) > 1e-4, bad


# reads a block of z after writing dz's block there: right into a new buffer, wrong over z itself
GATES_READ_AFTER_WRITE = Plant(
    probe_gates_module, "probe_gates_bwd_kernel",
    "                d_u = (d_k - kap * tl.sum(kap * d_k, axis=1)[:, None]) * s[:, None]",
    """                tl.store(p_dz + o_k[None, :], d_k, mask=m_nk)
                kap = tl.load(p_z + o_k[None, :], mask=m_nk, other=0.0) * s[:, None]
                d_u = (d_k - kap * tl.sum(kap * d_k, axis=1)[:, None]) * s[:, None]""")


def _gates_backward(scheme, overwrite: bool, plant=None):
    """``probe_gates_bwd`` at n = 40, K = V = 128 (two row blocks, the last ragged), every gradient
    given: ``(z before, z's storage after, dz)``."""
    from optimized.nested.probe_gates import probe_gates_bwd

    Bt, H, n, K, V = 2, 2, 40, 128, 128
    C = 2 * K + V if scheme == "merge" else 3 * K + V
    gen = torch.Generator().manual_seed(7)
    z = (3 * torch.randn(H, Bt * n, C, generator=gen)).to(DEV)
    grads = [torch.randn(*shape, generator=gen).to(DEV) for shape in ((Bt, H, n, K), (Bt, H, n, K),
                                                                     (Bt, H, n, V), (Bt, H, K))]
    if scheme == "merge":
        grads[0] = None
    before = z.clone()
    with planted(plant) if plant is not None else contextlib.nullcontext():
        dz = probe_gates_bwd(scheme, z, Bt, H, n, K, V, "mean", *grads, overwrite_z=overwrite)
    return before, z, dz


@pytest.mark.parametrize("scheme", GATE_SCHEMES)
def test_triton_gates_backward_over_z_equals_a_new_buffer(scheme):
    """``overwrite_z`` (the probe backward's recomputed ``z``, spent once read) gives ``dz`` bit for bit
    in ``z``'s own storage (the same kernel and launch: only the output pointer differs); without it
    ``z`` is left as it was."""
    before, z, dz_new = _gates_backward(scheme, overwrite=False)
    assert torch.equal(z, before)
    _, z_over, dz_over = _gates_backward(scheme, overwrite=True)
    assert dz_over.data_ptr() == z_over.data_ptr() and torch.equal(dz_over, dz_new)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_probe_backward_leaves_kept_preactivations_intact(keep):
    """The probe's backward writes the gates' gradient over ``z`` only when it recomputed ``z``
    (``keep_preactivations=False``): kept pre-activations stay as the forward made them, so a second
    backward (``retain_graph``) gives the first one's gradients bit for bit (the same kernels on the
    same saved tensors)."""
    d = ProbeDraw("learned", "mean", B=2, F=2, H=2, K=8, V=6, n=4, seed=3)
    snaps, params, grads = probe_inputs(d)
    f32 = lambda x: None if x is None else x.float().to(DEV)        # noqa: E731
    snaps, params, grads = f32(snaps), {k: f32(p) for k, p in params.items()}, [f32(g) for g in grads]
    _, saved = probe_fwd("learned", snaps, params, "mean", keep_preactivations=keep, gates="triton")
    z = None if saved.z is None else saved.z.clone()
    first = probe_bwd("learned", saved, snaps, params, "mean", *grads, gates="triton")
    assert (saved.z is None) if not keep else torch.equal(saved.z, z)
    second = probe_bwd("learned", saved, snaps, params, "mean", *grads, gates="triton")
    assert torch.equal(first[0], second[0]) and all(torch.equal(first[1][k], second[1][k]) for k in first[1])


@pytest.mark.mutation
def test_gates_backward_over_z_catches_a_read_after_write():
    """A kernel that reads a block of ``z`` after writing ``dz``'s there is right into a new buffer
    and wrong over ``z``: the in-place property fails it."""
    _, _, right = _gates_backward("learned", overwrite=False)
    _, _, twin_new = _gates_backward("learned", overwrite=False, plant=GATES_READ_AFTER_WRITE)
    _, _, twin_over = _gates_backward("learned", overwrite=True, plant=GATES_READ_AFTER_WRITE)
    assert torch.allclose(twin_new, right, rtol=1e-6, atol=1e-6)
    assert (twin_over - right).abs().max() > 1e-2


def test_triton_gates_refuse_bounded_erase_and_bad_z():
    from optimized.nested.probe_gates import probe_gates_bwd

    z = torch.zeros(1, 2, 3 * 4 + 5)
    with pytest.raises(ValueError, match="bounded_erase keeps the PyTorch gates"):
        probe_gates_bwd("bounded_erase", z, 1, 1, 2, 4, 5, "mean")
    with pytest.raises(ValueError, match="contiguous float32"):
        probe_gates_bwd("learned", z.double(), 1, 1, 2, 4, 5, "mean")
    with pytest.raises(ValueError, match="gates must be one of"):
        probe_fwd("learned", torch.zeros(1, 1, 4, 5), {}, "mean", gates="cuda")
    with pytest.raises(ValueError, match=r"dgamma must be a contiguous float32 \(1, 1, 4\)"):
        probe_gates_bwd("learned", z, 1, 1, 2, 4, 5, "mean", dgamma=torch.zeros(1, 1, 3))
    with pytest.raises(ValueError, match="reduction"):
        probe_gates_bwd("learned", z, 1, 1, 2, 4, 5, "max")


# --- mutants: each must fail the float64 property on its draw -------------------------------------
MUTANT_DRAWS = {
    "no_projection": ProbeDraw("learned", "mean", B=2, F=2, H=2, K=6, V=5, n=4, seed=1),
    "softplus_one": ProbeDraw("merge", "sum", B=2, F=2, H=1, K=4, V=5, n=4, seed=2, gate_scale=30.0),
    # tiny snapshots: keys shorter than 1, several rows with r < 1 where the clamp holds β = b
    "no_clamp": ProbeDraw("bounded_erase", "mean", B=2, F=3, H=2, K=6, V=5, n=3, seed=3, snaps="tiny"),
    # near-rank-one: r ≈ n > 1, the overlap carries gradient to κ
    "no_overlap": ProbeDraw("bounded_erase", "sum", B=2, F=2, H=2, K=6, V=5, n=4, seed=4, snaps="rank_one"),
    "drop_dnu": ProbeDraw("learned", "sum", B=1, F=3, H=2, K=4, V=3, n=4, seed=5),
    "gamma_no_mean": ProbeDraw("learned", "mean", B=1, F=2, H=1, K=6, V=5, n=5, seed=6),
    # large snapshots: decay logits on both sides of softplus's threshold of 20
    "softplus_dropped_above_threshold": ProbeDraw("learned", "mean", B=2, F=2, H=2, K=6, V=5, n=4, seed=7,
                                                  gate_scale=30.0, snaps="large"),
}


def test_every_mutant_has_a_draw():
    assert set(MUTANT_DRAWS) == set(MUTANTS)


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_fails_the_property(mutant):
    d = MUTANT_DRAWS[mutant]
    assert not failures(fused_vs_generic(d)), "the unmutated backward must pass on the mutant's draw"
    bad = failures(fused_vs_generic(d, mutant=mutant, log=False))
    assert bad, f"mutant {mutant!r} passed the property"
    assert max(e for e, _ in bad.values()) > 1e-4, bad


def test_no_clamp_draw_has_rows_below_and_above_one():
    """The clamp mutant's draw does exercise both sides of max(1, r)."""
    d = MUTANT_DRAWS["no_clamp"]
    snaps, params, _ = probe_inputs(d)
    κ = get_scheme("bounded_erase").probe(snaps, params, d.reduction)[0]
    r = (κ @ κ.transpose(-1, -2)).abs().sum(-1)
    assert (r < 1).any() and (r > 1).any()


# --- the API ------------------------------------------------------------------------------------------
def test_unknown_scheme_is_refused_by_name():
    d = FIXED_DRAWS[0]
    snaps, params, _ = probe_inputs(d)
    with pytest.raises(ValueError, match="fixed_address"):
        probe_fwd("fixed_address", snaps, params, "mean")
    _, saved = probe_fwd(d.scheme, snaps, params, d.reduction)
    with pytest.raises(ValueError, match="fixed_address"):
        probe_bwd("fixed_address", saved, snaps, params, "mean")


@pytest.mark.parametrize("scheme", FUSED_SCHEMES)
def test_deterministic_contiguous_and_recomputed_preactivations_agree(scheme):
    d = ProbeDraw(scheme, "mean", B=2, F=3, H=2, K=6, V=5, n=6, seed=7, gate_scale=8.0, snaps="mixed")
    snaps, params, grads = probe_inputs(d)
    snaps, params, grads = snaps.float(), {k: p.float() for k, p in params.items()}, [g.float() for g in grads]
    runs = []
    for keep in (True, True, False):     # twice the same, then with the pre-activations recomputed
        outs, saved = probe_fwd(scheme, snaps, params, "mean", keep_preactivations=keep)
        assert saved.nu is outs[1] and (saved.z is None) == (not keep)
        ds, dp = probe_bwd(scheme, saved, snaps, params, "mean", *grads)
        runs.append([*outs, ds, *dp.values()])
        assert all(x.is_contiguous() for x in outs)
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    # bit for bit: the recomputed z is the forward's bmm again (same shapes, same values), and the
    # PyTorch gates run on it as on the kept one
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


@pytest.mark.parametrize("scheme", FUSED_SCHEMES)
@pytest.mark.parametrize("lead", [(), (3,), (2, 0), (2, 1, 2)])
def test_any_leading_dims(scheme, lead):
    H, K, V, n = 2, 4, 3, 4 if scheme == "merge" else 2
    gen = generator(8)
    snaps = randn(gen, *lead, H, K, V)
    params = make_levels(2, H, K, V, scheme=scheme, query_counts=[n], generator=gen, gate_scale=8.0)[0].params
    outs, saved = probe_fwd(scheme, snaps, params, "sum")
    ref = get_scheme(scheme).probe(snaps, params, "sum")
    for label, x, y in zip(PROBE_OUTPUTS, outs, ref):
        assert x.shape == y.shape, label
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-15)
    grads = [torch.ones_like(x) for x in outs]
    ds, dp = probe_bwd(scheme, saved, snaps, params, "sum", *grads)
    assert ds.shape == snaps.shape and all(dp[k].shape == params[k].shape for k in params)
