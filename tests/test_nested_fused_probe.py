"""The nested op with the fused probe of the built-in schemes (``optimized.nested.probe_fused``,
hand-written backward) equals the same op with the generic probe replayed under autograd
(``Pieces(fused_probe=False)``): values and every gradient, each built-in scheme, both
reductions (at the op's level; ``property_tests/test_probe_fused.py`` checks
the probe alone against autograd in float64)."""
import pytest
import torch

from ngdn.nested_inputs import NestedShape, nested_inputs
from ngdn.tolerances import relative_error, tolerance
from optimized import triton_mode
from optimized.nested import Pieces, _nested
from reference.nested import Level, make_levels

NAMES = ("q", "k", "v", "g", "b", "w", "r")
DEV = triton_mode.device()
SHAPE = NestedShape(B=1, T=70, H=1, L=3, K=16, V=24)    # ragged last chunk; both levels fire


def run(scheme, reduction, pieces, shape=SHAPE):
    x = nested_inputs(shape, seed=3)
    acts = {n: x[n].to(DEV, torch.float32).requires_grad_() for n in NAMES}
    levels = make_levels(shape.L, shape.H, shape.K, shape.V, scheme=scheme, intervals=[1, 1], reduction=reduction,
                         query_counts=None if scheme == "merge" else [shape.K, 8],
                         generator=torch.Generator().manual_seed(4))
    levels = [Level(lv.scheme, lv.interval, {n: (3.0 * p).to(DEV, torch.float32).requires_grad_()
                                             for n, p in lv.params.items()}, lv.reduction) for lv in levels]
    init = [s.to(DEV, torch.float32).requires_grad_() for s in x["initial_states"]]
    o, finals = _nested(*acts.values(), levels, initial_states=init, output_final_state=True, pieces=pieces)
    gen = torch.Generator().manual_seed(5)
    loss = (o * torch.randn(o.shape, generator=gen).to(DEV)).sum() + sum(
        (f * torch.randn(f.shape, generator=gen).to(DEV)).sum() for f in finals)
    loss.backward()
    grads = {f"d{n}": t.grad for n, t in acts.items()}
    grads.update({f"dinitial_state[{i}]": s.grad for i, s in enumerate(init)})
    grads.update({f"dlevels[{i}].{n}": p.grad for i, lv in enumerate(levels) for n, p in lv.params.items()})
    return {"output": o.detach(), **{f"final_state[{i}]": f.detach() for i, f in enumerate(finals)}, **grads}


@pytest.mark.parametrize("scheme, reduction", [("learned", "mean"), ("merge", "sum"), ("bounded_erase", "sum")])
@pytest.mark.compiles
def test_fused_probe_equals_generic_probe(scheme, reduction):
    fused, generic = run(scheme, reduction, Pieces()), run(scheme, reduction, Pieces(fused_probe=False))
    errors = {k: relative_error(fused[k], generic[k]) for k in generic}
    bounds = {k: tolerance("nested_fused_probe", "gradients" if k.startswith("d") else "values", torch.float32)
              for k in errors}
    assert all(errors[k] <= bounds[k] for k in errors), {k: e for k, e in errors.items() if e > bounds[k]}


@pytest.mark.parametrize("scheme, reduction", [("bounded_erase", "sum")])   # every column of z in use
def test_recomputed_preactivations_equal_kept_ones(scheme, reduction):
    """The default op (the backward recomputes the probe's one matmul) gives the values and
    gradients of ``Pieces(probe_keeps_preactivations=True)`` (it keeps them)."""
    kept, recomputed = run(scheme, reduction, Pieces(probe_keeps_preactivations=True)), run(scheme, reduction, Pieces())
    errors = {k: relative_error(recomputed[k], kept[k]) for k in kept}
    bounds = {k: tolerance("nested_fused_probe", "gradients" if k.startswith("d") else "values", torch.float32)
              for k in errors}
    assert all(errors[k] <= bounds[k] for k in errors), {k: e for k, e in errors.items() if e > bounds[k]}


def test_probe_reads_snapshot_rows_in_place(monkeypatch):
    """The default op's fused probe reads ``ν = Q M`` and ``dQ`` from fla's chunk states and the
    stored states in place (``optimized.nested.snapshot_reads``): no gathered snapshots in either
    pass, and the values and gradients of ``Pieces(probe_reads_rows=False)``, which gathers them;
    with the Triton gates on a bmm's ``z`` (``probe_gates="triton"``) the backward writes the gates'
    gradient over the pre-activations it recomputed.
    B = 2: the rows' batch offsets (the kernels' own test, tests/test_snapshot_reads.py, has H = 2)."""
    from optimized.nested import bwd, fwd

    shape = NestedShape(B=2, T=70, H=1, L=3, K=16, V=24)
    gathered = run("learned", "mean", Pieces(probe_reads_rows=False), shape)

    def no_gather(*args, **kwargs):
        raise AssertionError("the snapshots were gathered")
    monkeypatch.setattr(fwd, "_snapshots", no_gather)
    monkeypatch.setattr(bwd, "_snapshots", no_gather)
    # and the gates' backward writes over the z it recomputed (probe_gates_bwd(overwrite_z=True))
    from optimized.nested import probe_fused

    overwrites, gates_bwd = [], probe_fused.probe_gates_bwd
    monkeypatch.setattr(probe_fused, "probe_gates_bwd", lambda *a, overwrite_z=False, **k: (
        overwrites.append(overwrite_z), gates_bwd(*a, overwrite_z=overwrite_z, **k))[1])
    in_place = run("learned", "mean", Pieces(probe_gates="triton"), shape)
    assert overwrites == [True, True]                               # levels 2 and 1
    errors = {k: relative_error(in_place[k], gathered[k]) for k in gathered}
    bounds = {k: tolerance("nested_fused_probe", "gradients" if k.startswith("d") else "values", torch.float32)
              for k in errors}
    assert all(errors[k] <= bounds[k] for k in errors), {k: e for k, e in errors.items() if e > bounds[k]}


def test_float32_matmuls_sets_and_restores_the_flag():
    """The probe's TF32 switch (bf16 runs) leaves torch's flag as it found it, errors included."""
    from optimized.nested.probe_fused import float32_matmuls

    flags = torch.backends.cuda.matmul
    before = flags.fp32_precision
    with float32_matmuls("tf32"):
        assert flags.fp32_precision == "tf32"
    assert flags.fp32_precision == before
    with pytest.raises(RuntimeError, match="inside"):
        with float32_matmuls("ieee"):
            raise RuntimeError("inside")
    assert flags.fp32_precision == before
    with pytest.raises(ValueError, match="precision must be one of"):
        with float32_matmuls("bf16"):
            pass


@pytest.mark.skipif(DEV != "cuda", reason="CPU float32 matmuls ignore the TF32 flag")
def test_tf32_probe_reaches_cublas_and_stays_close():
    """In bf16 runs the fused probe's float32 matmuls run in TF32: they differ from IEEE (the
    flag reaches cuBLAS) by about TF32's rounding, far below bf16's."""
    from optimized.nested.probe_fused import probe_fwd

    gen = torch.Generator().manual_seed(0)
    snaps = torch.randn(8, 4, 2, 64, 96, generator=gen).to(DEV)
    lv = make_levels(2, 2, 64, 96, query_counts=[32], generator=gen)[0]
    params = {n: p.to(DEV, torch.float32) for n, p in lv.params.items()}
    ieee, _ = probe_fwd("learned", snaps, params, precision="ieee")
    tf32, _ = probe_fwd("learned", snaps, params, precision="tf32")
    errors = [relative_error(a, b) for a, b in zip(tf32, ieee)]
    assert max(errors) > 0, "TF32 and IEEE probes agree bit for bit: the precision is not used"
    assert max(errors) <= tolerance("probe_tf32_vs_ieee", "outputs", "tf32", mode="any"), errors


@pytest.fixture
def registry():
    """Restore the scheme registry after the test (it registers over a built-in's name)."""
    from ngdn.scheme_check import registry_restored
    with registry_restored():
        yield


@pytest.mark.parametrize("scheme, reduction", [("learned", "mean"), ("merge", "sum"), ("bounded_erase", "sum")])
@pytest.mark.compiles
def test_a_scheme_registered_over_a_builtin_runs_its_own_probe(registry, scheme, reduction):
    """``register_scheme(name, probe, shapes, replace=True)`` over a built-in's name: the op runs the
    new probe (the generic path), not the built-in's fused probe, which it picks by name. The new
    probe here is the built-in's with every value doubled."""
    from reference.schemes import BUILTIN_SCHEMES, is_builtin, register_scheme
    builtin = BUILTIN_SCHEMES[scheme]

    def doubled_values(M_below, params, reduction="mean"):
        κ, ν, β, ω, γ = builtin.probe(M_below, params, reduction)
        return κ, 2.0 * ν, β, ω, γ

    register_scheme(scheme, doubled_values, builtin.parameter_shapes, replace=True)
    assert not is_builtin(scheme)
    default, generic = run(scheme, reduction, Pieces()), run(scheme, reduction, Pieces(fused_probe=False))
    errors = {k: relative_error(default[k], generic[k]) for k in generic}
    bounds = {k: tolerance("nested_fused_probe", "gradients" if k.startswith("d") else "values", torch.float32)
              for k in errors}
    assert all(errors[k] <= bounds[k] for k in errors), {k: e for k, e in errors.items() if e > bounds[k]}
