"""Fenwick level router (CONTRACT section 5): the incremental and quadratic references agree with
each other, with their NumPy twins and with fla's naive oracle; λ ≡ 1 reduces to gated linear
attention (scalar form) and to GDN-2 (GDN-2 variant); the optimized entry point matches the
reference in value and in every gradient. Each property has a mutation test showing it fails
on a broken implementation."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ngdn.checks import fenwick as checks
import fenwick_mutants as mutants
from ngdn.compile_buckets import bucket_params, on_bucket
from ngdn.fenwick_inputs import FenwickShape
from ngdn.inputs import REGIMES
from ngdn.strategies import CPU_SEQ_LENS, examples, seeds
from ngdn.testing import kernel_dtypes, on_cuda
from ngdn.tolerances import assert_passes, failures
from reference import naive_fenwick, quadratic_fenwick


def fenwick_shapes(seq_lens, head_dims, value_dims, max_batch=2, max_heads=2):
    return st.builds(FenwickShape, B=st.integers(1, max_batch), T=st.sampled_from(seq_lens),
                     H=st.integers(1, max_heads), K=st.sampled_from(head_dims), V=st.sampled_from(value_dims),
                     extra_levels=st.integers(0, 2))


# Reference-only properties: small shapes, T covering 1, powers of two and their neighbours.
REFERENCE_SHAPES = fenwick_shapes(seq_lens=(1, 2, 5, 16, 17, 40), head_dims=(4, 8, 16), value_dims=(4, 8))


def kernel_shapes(bucket=None):
    """Kernel draws. CPU: K not a multiple of 64 and V not a power of two (both padded), T < 64 and
    not a power of two. CUDA: the compile bucket's H, K, V, extra levels and a T range with one
    chunk count (fla's log-linear kernels take the level count and chunk count as constexpr;
    ``ngdn.compile_buckets.FENWICK``); B and T within the range drawn."""
    if bucket is None:
        return fenwick_shapes(CPU_SEQ_LENS, head_dims=(16, 48, 64), value_dims=(4, 24, 64))
    return st.builds(FenwickShape, B=st.integers(1, 2), T=st.sampled_from(bucket.seq_lens), H=st.just(bucket.H),
                     K=st.just(bucket.K), V=st.just(bucket.V), extra_levels=st.just(bucket.extra_levels))


MUTANT_SHAPE = FenwickShape(B=1, T=20, H=2, K=8, V=8)
# The extreme regime (ngdn.inputs.REGIMES: log-decays down to -60, λ = σ(±30), and for the GDN-2
# variant b = 1 - 1e-6, w ∈ {0, 1}) as an explicit example of every reference property.
EXTREME = dict(shape=FenwickShape(B=2, T=40, H=2, K=8, V=8, extra_levels=1), seed=0, regime="extreme")
regimes = st.sampled_from(REGIMES)
KERNEL_MUTANT_SHAPE = (FenwickShape(B=1, T=100, H=1, K=16, V=16) if not on_cuda() else   # CUDA: bucket a
                       on_bucket(FenwickShape(B=1, T=150, H=1, K=16, V=16), "fenwick"))


@examples(scale=2)
@example(**EXTREME)
@given(shape=REFERENCE_SHAPES, seed=seeds(), regime=regimes)
def test_incremental_equals_quadratic(shape, seed, regime):
    assert_passes(checks.incremental_vs_quadratic(shape, seed, regime=regime))


@examples(scale=2)
@example(**EXTREME)
@given(shape=REFERENCE_SHAPES, seed=seeds(), regime=regimes)
def test_torch_references_equal_numpy_references(shape, seed, regime):
    assert_passes(checks.torch_vs_numpy(shape, seed, regime=regime))


@examples(scale=2)
@example(**EXTREME)
@given(shape=REFERENCE_SHAPES, seed=seeds(), regime=regimes)
def test_reference_equals_fla_naive(shape, seed, regime):
    assert_passes(checks.reference_vs_fla_naive(shape, seed, regime=regime))


@pytest.mark.parametrize("reference", [naive_fenwick, quadratic_fenwick], ids=["incremental", "quadratic"])
@examples(scale=2)
@example(**EXTREME)
@given(shape=REFERENCE_SHAPES, seed=seeds(), regime=regimes)
def test_uniform_router_is_gated_linear_attention(reference, shape, seed, regime):
    assert_passes(checks.gla_reduction(shape, seed, reference=reference, regime=regime))


@examples(scale=2)
@example(**EXTREME)
@given(shape=REFERENCE_SHAPES, seed=seeds(), regime=regimes)
def test_gdn2_variant_with_uniform_router_is_gdn2(shape, seed, regime):
    assert_passes(checks.gdn2_reduction(shape, seed, regime=regime))


@pytest.mark.parametrize("bucket", bucket_params("fenwick"))
@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=8, family="fenwick")
@given(data=st.data(), seed=seeds())
def test_optimized_equals_reference(dtype, bucket, data, seed):
    shape = data.draw(kernel_shapes(bucket), label="shape")
    assert_passes(checks.optimized_vs_reference(shape, seed, dtype))


# Named kernel cases every CPU run sees (on CUDA the buckets hold such shapes).
@pytest.mark.skipif(on_cuda(), reason="on CUDA the compile buckets draw these shapes")
@pytest.mark.parametrize("shape, seed", [
    (FenwickShape(B=2, T=130, H=2, K=48, V=24, extra_levels=0), 1),   # 3 chunks, K and V padded
    (FenwickShape(B=1, T=128, H=1, K=64, V=64, extra_levels=0), 2),   # 2 full chunks, no padding
], ids=["padded_3_chunks", "unpadded_2_chunks"])
def test_optimized_equals_reference_named(shape, seed):
    assert_passes(checks.optimized_vs_reference(shape, seed, torch.float32))


# --- teeth: each property fails on a broken implementation -------------------------

@pytest.mark.mutation
@pytest.mark.parametrize("kwargs", [
    dict(incremental=mutants.naive_fenwick_merge_late),
    dict(incremental=mutants.naive_fenwick_decay_after_write),
    dict(quadratic=mutants.quadratic_fenwick_levels_off_by_one),
], ids=["merge_late", "decay_after_write", "levels_off_by_one"])
def test_incremental_vs_quadratic_catches(kwargs):
    assert failures(checks.incremental_vs_quadratic(MUTANT_SHAPE, 0, log=False, **kwargs))


@pytest.mark.mutation
@pytest.mark.parametrize("kwargs", [
    dict(incremental=mutants.naive_fenwick_merge_late),
    dict(quadratic=mutants.quadratic_fenwick_levels_off_by_one),
    dict(gdn2_variant=mutants.naive_fenwick_gdn2_erase_level0_only),
], ids=["merge_late", "levels_off_by_one", "gdn2_erase_level0_only"])
def test_torch_vs_numpy_catches(kwargs):
    assert failures(checks.torch_vs_numpy(MUTANT_SHAPE, 0, log=False, **kwargs))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", [mutants.naive_fenwick_merge_late, mutants.naive_fenwick_decay_after_write,
                                    mutants.quadratic_fenwick_levels_off_by_one])
def test_fla_oracle_catches(mutant):
    assert failures(checks.reference_vs_fla_naive(MUTANT_SHAPE, 0, reference=mutant, log=False))


@pytest.mark.mutation
def test_gla_reduction_catches_decay_after_write():
    assert failures(checks.gla_reduction(MUTANT_SHAPE, 0, reference=mutants.naive_fenwick_decay_after_write,
                                         log=False))


@pytest.mark.mutation
def test_gdn2_reduction_catches_erase_on_level0_only():
    assert failures(checks.gdn2_reduction(MUTANT_SHAPE, 0, reference=mutants.naive_fenwick_gdn2_erase_level0_only,
                                          log=False))


@pytest.mark.mutation
def test_mutant_harness_without_bugs_passes():
    """The mutants' shared loop with both bugs switched off is correct: each mutant differs
    from the reference in exactly its named way, not in the harness."""
    def clean(q, k, v, g, level_scales, scale=None, output_final_state=False):
        return mutants._recurrent(q, k, v, g, level_scales, scale, output_final_state)

    assert not failures(checks.incremental_vs_quadratic(MUTANT_SHAPE, 0, incremental=clean, log=False))
    assert not failures(checks.torch_vs_numpy(MUTANT_SHAPE, 0, incremental=clean, log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken", [
    (mutants.chunk_fenwick_fla_default_scale, {"output", "dq", "dk", "dv", "dg", "dlevel_scales"}),
    (mutants.chunk_fenwick_dropped_level_scale_gradient, {"dlevel_scales"}),
    (mutants.chunk_fenwick_dropped_gate_gradient, {"dg"}),
], ids=["fla_default_scale", "dropped_level_scale_gradient", "dropped_gate_gradient"])
def test_optimized_vs_reference_catches(mutant, broken):
    bad = failures(checks.optimized_vs_reference(KERNEL_MUTANT_SHAPE, 0, torch.float32, optimized=mutant,
                                                 log=False))
    assert set(bad) == broken
