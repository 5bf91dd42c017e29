"""The promote scan's forward in transition form (``optimized.promote_scan_transition``, both
forms): every stored state equals ``reference.promote`` applied firing by firing (float64), with
ragged K, V, n, several V blocks and pair blocks and every scheme, in the extreme regime too; packed
sequences equal the plain scan's; with TF32 dots on a GPU it stays within the ``tf32`` bounds. Each
property has a mutation test: the write term dropped from the chain, the transitions stored
transposed."""
import functools

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import optimized.promote_scan_transition as transition
from kernel_mutation import Plant, planted
from ngdn.checks import nested_optimized as checks
from ngdn.strategies import examples
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized import triton_mode
from optimized.promote_scan import promote_scan_fwd
from optimized.promote_scan_transition import FORMS, promote_scan_fwd_transition
from test_promote_scan import COVERING_DRAW, EXTREME_DRAWS, scan_draws

forms = pytest.mark.parametrize("form", FORMS)


@examples(ci=6)
@given(d=scan_draws(), bv=st.sampled_from((None, 16)), bn=st.sampled_from((None, 16)), form=st.sampled_from(FORMS))
@example(d=COVERING_DRAW, bv=16, bn=16, form="inline")
@example(d=COVERING_DRAW, bv=16, bn=16, form="streamed")
@example(d=EXTREME_DRAWS[0], bv=16, bn=16, form="streamed")
@example(d=EXTREME_DRAWS[1], bv=16, bn=16, form="inline")
@pytest.mark.compiles
def test_transition_scan_equals_reference_promote_firing_by_firing(d, bv, bn, form):
    fwd = functools.partial(promote_scan_fwd_transition, block_v=bv, block_n=bn, form=form)
    assert_passes(checks.scan_vs_reference(d, scan_fwd=fwd))


def _pairs(d, dev=None):
    x = checks.scan_inputs(d)
    dev = dev or triton_mode.device()
    return [t.to(dev, torch.float32).contiguous() for t in (x["M0"], *x["pairs"])]


@forms
def test_transition_scan_packed_sequences_equal_the_plain_scan(form):
    """Three sequences of 2, 0 and 3 firings in one row, each from its own initial state."""
    d = COVERING_DRAW._replace(B=1, F=5)
    M0, *pairs = _pairs(d)
    M0 = torch.cat([M0, 2 * M0, -M0])
    offsets = torch.tensor([0, 2, 2, 5], dtype=torch.int32, device=M0.device)
    kw = dict(block_v=16, block_n=16, fire_offsets=offsets)
    want = promote_scan_fwd(M0, *pairs, **kw)
    got = promote_scan_fwd_transition(M0, *pairs, form=form, **kw)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_transition_form_is_checked():
    M0, *pairs = _pairs(COVERING_DRAW._replace(F=1))
    with pytest.raises(ValueError, match="form must be one of"):
        promote_scan_fwd_transition(M0, *pairs, form="chunked")
    with pytest.raises(ValueError, match="precision must be one of"):
        promote_scan_fwd_transition(M0, *pairs, precision="bf16")
    with pytest.raises(ValueError, match="kappa must be float32"):
        promote_scan_fwd_transition(M0, pairs[0].double(), *pairs[1:])


# The chain without the write term b = κ^T (ω ⊙ ν); the transitions stored transposed.
WRITE_DROPPED = Plant(transition, "promote_scan_fwd_transition_kernel",
                      "tl.dot(b_a, b_m, input_precision=DOT_PRECISION) + b_b",
                      "tl.dot(b_a, b_m, input_precision=DOT_PRECISION)")
A_TRANSPOSED = Plant(transition, "promote_transitions_kernel", "o_k[:, None] * K + o_k[None, :], b_a",
                     "o_k[None, :] * K + o_k[:, None], b_a")


@pytest.mark.mutation
@pytest.mark.parametrize("plant, form", [(WRITE_DROPPED, "inline"), (WRITE_DROPPED, "streamed"),
                                         (A_TRANSPOSED, "streamed")], ids=["write-inline", "write-streamed",
                                                                            "transposed"])
def test_transition_scan_catches(plant, form):
    fwd = functools.partial(promote_scan_fwd_transition, block_v=16, block_n=16, form=form)
    with planted(plant):
        assert "states" in failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, log=False))


TF32_DRAWS = [checks.ScanDraw(B=2, F=6, H=2, K=48, V=80, n=44, scheme="learned", seed=1),
              checks.ScanDraw(B=1, F=5, H=2, K=112, V=112, n=112, scheme="merge", reduction="sum", seed=2)]


@pytest.mark.skipif(not on_cuda(), reason="the interpreter computes every dot in float32")
@forms
@pytest.mark.parametrize("d", TF32_DRAWS, ids=lambda d: f"{d.scheme}-K{d.K}-V{d.V}-n{d.n}")
def test_tf32_transition_scan_equals_reference(d, form):
    fwd = functools.partial(promote_scan_fwd_transition, precision="tf32", form=form)
    assert_passes(checks.scan_vs_reference(d, scan_fwd=fwd, tolerance_dtype="tf32"))
