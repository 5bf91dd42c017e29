"""The update stage on its own (``optimized.nested.promote_scan``, CONTRACT section 2): the Triton scan
over firings and its hand-written reverse scan equal ``reference.promote`` applied firing
by firing (float64 autograd) for every stored state and every gradient, with ragged
K, V, n (masks), several V blocks (partial sums) and both schemes; permuting the pairs
of every firing changes nothing; the two-phase backward (``optimized.nested.promote_scan_two_phase``)
equals the same reference. Each property has a mutation test."""
import functools

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ngdn.checks import nested_optimized as checks
import nested_optimized_mutants as mutants
import optimized.nested.promote_scan as promote_scan_module
import optimized.nested.promote_scan_two_phase as two_phase
from kernel_mutation import Plant, planted
from ngdn.checks.nested_optimized import LARGE_GATES
from ngdn.inputs import REGIMES
from ngdn.strategies import examples, seeds
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd
from optimized.nested.promote_scan_two_phase import promote_scan_bwd_two_phase

Draw = checks.ScanDraw
# Sizes below, between and over blocks: CUDA with the default blocks (BV = 32, the reverse scan's
# 64, BN = 16), CPU with blocks of 16 too (``bv``/``bn``): 40 = three V blocks of 16, the last ragged.
DIMS = (16, 48, 80, 112) if on_cuda() else (8, 16, 20, 32, 40)


@st.composite
def scan_draws(draw, regimes=REGIMES):
    K, V = draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS))
    scheme = draw(st.sampled_from(("learned", "merge", "bounded_erase")))
    # The extreme regime (checks.scan_inputs) saturates the gates as large gates do: the same caps.
    regime = draw(st.sampled_from(regimes))
    # Large gates saturate β and ω. With many pairs the firing is then so ill-conditioned that
    # float32 loses the gradients of β and γ whatever the kernel does: on the H200, learned with
    # K = n = 112 lost dβ to 2e-3, merge with K = n = 112 to 6e-5 and with K = n = 48 dγ to 1.9e-5
    # (bound 1e-5). Large gates are drawn with K ≤ 32 and, for learned, n ≤ K/2 (the covering
    # example adds n = K = 20, which passes in both modes).
    gate_scale = draw(st.sampled_from((1.0, LARGE_GATES))) if K <= 32 else 1.0
    saturated = gate_scale != 1.0 or regime == "extreme"
    n = K if scheme == "merge" else draw(st.integers(1, max(1, K // 2) if saturated else K))
    return Draw(B=draw(st.integers(1, 2)), F=draw(st.integers(0, 6)), H=draw(st.integers(1, 2)), K=K, V=V,
                n=n, scheme=scheme, reduction=draw(st.sampled_from(("mean", "sum"))), seed=draw(seeds()),
                gate_scale=gate_scale, regime=regime)


MUTANT_DRAW = Draw(B=1, F=3, H=2, K=16, V=32, n=8, scheme="learned", seed=0)
# Every blocking path at blocks of 16: three V blocks (the last ragged), learned pairs over two
# pair blocks (the second ragged) with overlapping keys, K not a power of two, large gates.
COVERING_DRAW = Draw(B=1, F=3, H=2, K=20, V=40, n=20, scheme="learned", seed=3, gate_scale=LARGE_GATES)
# The extreme regime (checks.scan_inputs) on draws every run sees: at blocks of 16, merge over three V
# blocks and two pair blocks where near-one erases leave dγ ill-conditioned (reference.promote in
# float32 itself loses it to 2.4e-2: the bound sits above that, see checks.scan_vs_reference), and
# learned with overlapping keys.
EXTREME_DRAWS = [Draw(B=1, F=3, H=1, K=20, V=40, n=20, scheme="merge", reduction="sum", seed=13893,
                      gate_scale=LARGE_GATES, regime="extreme"),
                 Draw(B=1, F=3, H=2, K=20, V=40, n=10, scheme="learned", seed=3, regime="extreme")]


@examples(ci=10)
@given(d=scan_draws(), bv=st.sampled_from((None, 16)), bn=st.sampled_from((None, 16)))
@example(d=COVERING_DRAW, bv=16, bn=16)
@example(d=EXTREME_DRAWS[0], bv=16, bn=16)
@example(d=EXTREME_DRAWS[1], bv=16, bn=16)
@pytest.mark.compiles
def test_scan_equals_reference_promote_firing_by_firing(d, bv, bn):
    """``bv``/``bn`` = 16: several V blocks (partial sums) / several pair blocks per firing."""
    fwd = lambda *a: promote_scan_fwd(*a, block_v=bv, block_n=bn)  # noqa: E731
    bwd = lambda *a: promote_scan_bwd(*a, block_v=bv, block_n=bn)  # noqa: E731
    assert_passes(checks.scan_vs_reference(d, scan_fwd=fwd, scan_bwd=bwd))


@examples(ci=6)
@given(d=scan_draws(), bv=st.sampled_from((None, 16)), bn=st.sampled_from((None, 16)), consume=st.booleans())
@example(d=COVERING_DRAW, bv=16, bn=16, consume=True)
@example(d=EXTREME_DRAWS[0], bv=16, bn=16, consume=False)
@pytest.mark.compiles
def test_two_phase_scan_equals_reference_promote_firing_by_firing(d, bv, bn, consume):
    """The reverse scan in two phases (the carried gradient alone, then every firing in parallel),
    on the caller's ``dstates`` (``consume``) or a copy."""
    fwd = functools.partial(promote_scan_fwd, block_v=bv, block_n=bn)
    bwd = functools.partial(promote_scan_bwd_two_phase, block_v=bv, block_n=bn, consume_dstates=consume)
    assert_passes(checks.scan_vs_reference(d, scan_fwd=fwd, scan_bwd=bwd))


# Phase 2 reads ``G_m`` instead of ``G_{m+1}`` (one firing early).
PAIRS_ONE_FIRING_EARLY = Plant(two_phase, "promote_scan_bwd_pairs_kernel", "((m + 1) * H + i_h) * K * V",
                               "(m * H + i_h) * K * V")


@pytest.mark.mutation
def test_two_phase_scan_catches_pairs_reading_one_firing_early():
    fwd = functools.partial(promote_scan_fwd, block_v=16, block_n=16)
    bwd = functools.partial(promote_scan_bwd_two_phase, block_v=16, block_n=16)
    with planted(PAIRS_ONE_FIRING_EARLY):
        bad = failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, scan_bwd=bwd, log=False))
    assert {"dkappa", "dnu", "dbeta", "domega", "dgamma"} <= set(bad), bad


@examples(ci=6)
@given(d=scan_draws(), bn=st.sampled_from((None, 16)))
@example(d=COVERING_DRAW, bn=16)
@example(d=EXTREME_DRAWS[1], bn=16)
def test_scan_pair_order_invariance(d, bn):
    assert_passes(checks.scan_pair_order(d, scan_fwd=lambda *a: promote_scan_fwd(*a, block_n=bn)))


@pytest.mark.mutation
@pytest.mark.parametrize("regime", REGIMES)
def test_scan_vs_reference_catches_missing_partial_block(regime):
    """Also on the extreme regime, whose bounds sit above the float32 reference's own error."""
    bad = failures(checks.scan_vs_reference(MUTANT_DRAW._replace(regime=regime),
                                            scan_bwd=mutants.promote_scan_bwd_missing_partial_block, log=False))
    assert {"dkappa", "dbeta", "dgamma"} <= set(bad), bad


@pytest.mark.mutation
def test_scan_vs_reference_catches_middle_partials_dropped():
    bwd = functools.partial(promote_scan_bwd, block_v=16, block_n=16, reduce_partials=mutants.sum_outer_partials)
    fwd = functools.partial(promote_scan_fwd, block_v=16, block_n=16)
    assert set(failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, scan_bwd=bwd, log=False))) == {
        "dkappa", "dbeta", "dgamma"}


@pytest.mark.mutation
def test_scan_vs_reference_catches_pair_blocks_in_sequence():
    fwd = functools.partial(mutants.promote_scan_fwd_blocks_in_sequence, block_n=16)
    assert "states" in failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("regime", REGIMES)
def test_pair_order_catches_sequential_pairs(regime):
    assert failures(checks.scan_pair_order(MUTANT_DRAW._replace(regime=regime),
                                           scan_fwd=mutants.promote_scan_fwd_sequential, log=False))


@pytest.mark.parametrize("blocks", [0, 1, 2, 3, 5])
def test_sum_partials_is_the_left_to_right_sum(blocks):
    """``promote_scan.sum_partials``: the per-V-block partials summed left to right (bit for bit
    ``((p0 + p1) + p2) + …``: elementwise float adds in the same order, which round alike on any
    machine), one block returned as it is, none as zeros, ``blocks`` a prefix."""
    import torch

    from optimized.nested.promote_scan import sum_partials

    parts = torch.randn(max(blocks, 1) + 1, 3, 5, generator=torch.Generator().manual_seed(blocks))
    want = torch.zeros(3, 5)
    for p in parts[:blocks]:
        want = want + p
    assert torch.equal(sum_partials(parts, blocks), want)
    assert torch.equal(sum_partials(parts[:blocks] if blocks else parts[:0]), want)


@examples(ci=6)
@given(d=scan_draws(), bv=st.sampled_from((None, 16)), bn=st.sampled_from((None, 16)))
@example(d=COVERING_DRAW, bv=16, bn=16)
@example(d=EXTREME_DRAWS[0], bv=16, bn=16)
@pytest.mark.compiles
def test_prefetching_scans_equal_reference_promote_firing_by_firing(d, bv, bn):
    """The scans that load their operands a step ahead (``prefetch=True``): several pair blocks
    per firing (the walk crossing from one firing's last block to the next firing's first), a
    ragged last block, F = 0 and 1 (the loads past the last step masked)."""
    fwd = functools.partial(promote_scan_fwd, block_v=bv, block_n=bn, prefetch=True)
    bwd = functools.partial(promote_scan_bwd, block_v=bv, block_n=bn, prefetch=True)
    assert_passes(checks.scan_vs_reference(d, scan_fwd=fwd, scan_bwd=bwd))


def _scan_args(B, F, H, n, K, V, seed, packed=None):
    import torch
    import torch.nn.functional as Fn

    from optimized import triton_mode
    g = torch.Generator().manual_seed(seed)
    dev = triton_mode.device()
    r = lambda *s: torch.randn(*s, generator=g).to(dev)  # noqa: E731
    seqs = B if packed is None else len(packed)
    pairs = (Fn.normalize(r(B, F, H, n, K), dim=-1), r(B, F, H, n, V), torch.sigmoid(r(B, F, H, n, K)),
             torch.sigmoid(r(B, F, H, n, V)), -Fn.softplus(r(B, F, H, K)))
    offsets = None
    if packed is not None:
        import itertools
        offsets = torch.tensor([0, *itertools.accumulate(packed)], dtype=torch.int32, device=dev)
    rows = F + 1 if packed is None else F + seqs
    return r(seqs, H, K, V), pairs, r(B if packed is None else 1, rows, H, K, V), offsets


@pytest.mark.parametrize("shape", [
    dict(B=2, F=3, H=2, n=40, K=20, V=40),              # three pair blocks (the last ragged), three V blocks
    dict(B=2, F=1, H=2, n=16, K=16, V=16),              # one firing, one block: every load ahead masked
    dict(B=1, F=5, H=2, n=20, K=16, V=32, packed=(2, 0, 3)),   # packed sequences, one without firings
])
@pytest.mark.compiles
def test_prefetching_scans_agree_with_the_scans(shape):
    """The same operations in the same order: every stored state and every gradient agree with the
    plain kernels' to float32 rounding, packed sequences (one of them empty) included. Not bit for
    bit: the two are different kernels, and the compiler may contract or order their arithmetic
    differently per card (``tolerances.yaml`` ``prefetching_scans``); a step too far is O(1)."""
    assert_passes(prefetch_vs_plain(shape))


def prefetch_vs_plain(shape, log=True) -> dict:
    """``{label: (error, bound)}``: the prefetching scans' states and gradients against the plain ones."""
    from ngdn.tolerances import compare

    shape = dict(shape)
    packed = shape.pop("packed", None)
    M0, pairs, dstates, offsets = _scan_args(**shape, seed=7, packed=packed)
    kw = dict(block_v=16, block_n=16, fire_offsets=offsets)
    plain = promote_scan_fwd(M0, *pairs, **kw)
    ahead = promote_scan_fwd(M0, *pairs, prefetch=True, **kw)
    grads = zip(promote_scan_bwd(plain, *pairs, dstates, prefetch=True, **kw),
                promote_scan_bwd(plain, *pairs, dstates, **kw))
    cases = [("states", "states", ahead, plain)] + [(f"gradient {i}", "gradients", a, b) for i, (a, b) in enumerate(grads)]
    return {label: compare("prefetching_scans", "float32", {quantity: (a, b)}, mode="any", log=log)[quantity]
            for label, quantity, a, b in cases}


# The forward's walk loads the block two steps ahead; the reverse scan's state one firing too far
# back (the firing before the one it is for).
AHEAD_TWO_STEPS = Plant(promote_scan_module, "promote_scan_fwd_prefetch_kernel", "t = m * NB + i_n + 1",
                        "t = m * NB + i_n + 2")
STATE_TWO_BACK = Plant(promote_scan_module, "promote_scan_bwd_prefetch_kernel", "((m - 1) * H + i_h) * K * V",
                       "((m - 2) * H + i_h) * K * V")


@pytest.mark.mutation
def test_prefetching_scans_catch_a_step_too_far():
    fwd = functools.partial(promote_scan_fwd, block_v=16, block_n=16, prefetch=True)
    bwd = functools.partial(promote_scan_bwd, block_v=16, block_n=16, prefetch=True)
    with planted(AHEAD_TWO_STEPS):
        assert "states" in failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, scan_bwd=bwd, log=False))
    with planted(STATE_TWO_BACK):
        bad = failures(checks.scan_vs_reference(COVERING_DRAW, scan_fwd=fwd, scan_bwd=bwd, log=False))
    assert {"dkappa", "dbeta", "dgamma"} <= set(bad), bad


@pytest.mark.mutation
def test_prefetching_scans_agreement_catches_a_step_too_far():
    """``prefetch_vs_plain`` fails on each planted break of the prefetching kernels."""
    shape = dict(B=2, F=3, H=2, n=40, K=20, V=40)
    with planted(AHEAD_TWO_STEPS):
        assert "states" in failures(prefetch_vs_plain(shape, log=False))
    with planted(STATE_TWO_BACK):
        assert failures(prefetch_vs_plain(shape, log=False)).keys() - {"states"}
