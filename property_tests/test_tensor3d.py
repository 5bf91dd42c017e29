"""3D tensor state (CONTRACT section 4): the PyTorch and NumPy references agree; the
reference satisfies the spec's identities (parallel form, one-hot and ones
reductions to 2D, flattening to a 2D state); the optimized entry point matches the
reference in value and every gradient. Each property has a mutation test showing
it fails on a broken implementation."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ngdn.checks import tensor3d as checks
import tensor3d_mutants as mutants
from ngdn.compile_buckets import bucket_params, on_bucket
from ngdn.inputs import REGIMES
from ngdn.strategies import CPU_SEQ_LENS, examples, seeds
from ngdn.tensor3d_inputs import Tensor3DShape
from ngdn.testing import kernel_dtypes
from ngdn.tolerances import assert_passes, failures
from reference.tensor3d import GATE_KINDS, KEY_MODES, MODES

modes = st.sampled_from(MODES)
gates = st.sampled_from(GATE_KINDS)
key_modes = st.sampled_from(KEY_MODES)
regimes = st.sampled_from(REGIMES)

# Reference shapes: K != E in general, E = 1 included, B·H up to 4.
REFERENCE_SHAPES = st.builds(Tensor3DShape, B=st.integers(1, 2), T=st.sampled_from((1, 5, 17, 40)),
                             H=st.integers(1, 2), K=st.sampled_from((2, 3, 4, 8)),
                             E=st.sampled_from((1, 2, 3, 4)), V=st.sampled_from((4, 8)))


def kernel_shapes(bucket=None):
    """Under the interpreter: B·H <= 2, K·E in [16, 64], V = 16, T <= 130. On CUDA: the compile
    bucket's H, K, E, V (``ngdn.compile_buckets.TENSOR3D``: flattened key widths 48 and 112, not
    powers of two; V = 80 and 100), B and T drawn. Every new (H, K·E, V) compiles fla's kernels
    afresh: the first H200 run, with 12 (K·E, V) pairs drawn freely, spent 200 s on 4 draws of
    the delta test, almost all of it compiling."""
    if bucket is not None:
        return st.builds(Tensor3DShape, B=st.integers(1, 2), T=st.sampled_from(bucket.seq_lens),
                         H=st.just(bucket.H), K=st.just(bucket.K), E=st.just(bucket.E), V=st.just(bucket.V))
    pairs = [(4, 4), (8, 2), (4, 8), (8, 4), (8, 8)]
    dims = dict(B=st.integers(1, 2), H=st.just(1), V=st.just(16), T=st.sampled_from(CPU_SEQ_LENS))
    return st.builds(lambda KE, **d: Tensor3DShape(K=KE[0], E=KE[1], **d), st.sampled_from(pairs), **dims)


MUTANT_SHAPE = Tensor3DShape(B=1, T=12, H=2, K=4, E=4, V=4)          # K == E: the tile-on-rows mutant fits
KERNEL_MUTANT_SHAPE = on_bucket(Tensor3DShape(B=1, T=20, H=1, K=8, E=2, V=16), "tensor3d")   # CUDA: bucket a


# The extreme regime (ngdn.inputs.REGIMES: log-decays down to -60, β = 1 - 1e-6, initial states at
# scale 1e3 or 1e-6) as an explicit example of every reference property that draws gates, so the
# derandomized ci profile reaches it; mode delta (β) with a per-channel gate.
EXTREME_SHAPE = Tensor3DShape(B=2, T=40, H=2, K=4, E=3, V=8)

# --- reference properties -------------------------------------------------------------------------

@examples(scale=3)
@example(shape=EXTREME_SHAPE, seed=0, mode="delta", gate="channel", key_mode="softmax", regime="extreme")
@given(shape=REFERENCE_SHAPES, seed=seeds(), mode=modes, gate=gates, key_mode=key_modes, regime=regimes)
def test_torch_reference_equals_numpy_reference(shape, seed, mode, gate, key_mode, regime):
    assert_passes(checks.torch_vs_numpy(shape, seed, mode, gate, key_mode, regime=regime))


# No extreme regime here: this identity has no gate, no β and a zero initial state, so the regime
# would change nothing.
@examples(scale=2)
@given(shape=REFERENCE_SHAPES, seed=seeds(), key_mode=key_modes)
def test_gla_without_decay_equals_parallel_form(shape, seed, key_mode):
    assert_passes(checks.no_decay_parallel_form(shape, seed, key_mode))


@examples(scale=3)
@example(shape=EXTREME_SHAPE, seed=1, mode="delta", gate="channel", regime="extreme")
@given(shape=REFERENCE_SHAPES, seed=seeds(), mode=modes, gate=gates, regime=regimes)
def test_one_hot_second_key_reduces_to_2d(shape, seed, mode, gate, regime):
    assert_passes(checks.one_hot_reduces_to_2d(shape, seed, mode, gate, regime=regime))


@examples(scale=2)
@example(shape=EXTREME_SHAPE, seed=2, mode="delta", gate="head", regime="extreme")
@given(shape=REFERENCE_SHAPES, seed=seeds(), mode=modes, gate=st.sampled_from(("none", "head")), regime=regimes)
def test_ones_mode_is_e_times_2d(shape, seed, mode, gate, regime):
    assert_passes(checks.ones_is_e_times_2d(shape, seed, mode, gate, regime=regime))


@examples(scale=3)
@example(shape=EXTREME_SHAPE, seed=3, mode="delta", gate="tile", key_mode="sigmoid", regime="extreme")
@given(shape=REFERENCE_SHAPES, seed=seeds(), mode=modes, gate=gates, key_mode=key_modes, regime=regimes)
def test_flattened_state_equals_2d_state(shape, seed, mode, gate, key_mode, regime):
    assert_passes(checks.flattened_equals_2d(shape, seed, mode, gate, key_mode, regime=regime))


# No extreme regime: the helpers take raw projections (drawn at scale 3 here), no gate or state.
@examples(scale=2)
@given(shape=REFERENCE_SHAPES, seed=seeds(), key_mode=key_modes)
def test_second_query_key_modes_match_formulas(shape, seed, key_mode):
    assert_passes(checks.second_key_modes(shape, seed, key_mode))


@pytest.mark.parametrize("K, E, V", [(1, 1, 1), (4, 2, 8), (3, 5, 7)])
def test_state_sizes_count_real_states(K, E, V):
    assert_passes(checks.state_sizes(K, E, V))


# --- optimized vs reference ---------------------------------------------------------------------------

@pytest.mark.parametrize("bucket", bucket_params("tensor3d"))
@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=4, family="tensor3d")
@given(data=st.data(), seed=seeds(), gate=gates, key_mode=key_modes)
def test_optimized_gla_equals_reference(dtype, bucket, data, seed, gate, key_mode):
    shape = data.draw(kernel_shapes(bucket), label="shape")
    assert_passes(checks.optimized_vs_reference(shape, seed, dtype, "gla", gate, key_mode))


@pytest.mark.parametrize("bucket", bucket_params("tensor3d"))
@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=3, family="tensor3d")
@given(data=st.data(), seed=seeds(), gate=gates, key_mode=key_modes)
def test_optimized_delta_equals_reference(dtype, bucket, data, seed, gate, key_mode):
    shape = data.draw(kernel_shapes(bucket), label="shape")
    assert_passes(checks.optimized_vs_reference(shape, seed, dtype, "delta", gate, key_mode))


def test_optimized_gla_wide_flattened_key():
    """K·E = 512 > 256: chunk_gla's split path for wide keys (no limit in mode gla)."""
    shape = Tensor3DShape(B=1, T=20, H=1, K=64, E=8, V=16)
    assert_passes(checks.optimized_vs_reference(shape, 0, torch.float32, "gla", "channel", "softmax"))


@pytest.mark.parametrize("mode", MODES)
def test_optimized_defaults(mode):
    shape = Tensor3DShape(B=1, T=5, H=2, K=4, E=4, V=16)
    assert_passes(checks.optimized_defaults(shape, 0, mode, "head"))


# --- teeth: each property fails on a broken implementation -----------------------------------------------

REFERENCE_MUTANTS = {
    "read_before_write": mutants.naive_tensor3d_read_before_write,
    "write_with_q2": mutants.naive_tensor3d_write_with_q2,
    "erase_before_decay": mutants.naive_tensor3d_erase_before_decay,
    "tile_gate_on_rows": mutants.naive_tensor3d_tile_gate_on_rows,
}


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode, gate", [
    ("read_before_write", "gla", "none"),
    ("write_with_q2", "gla", "head"),
    ("erase_before_decay", "delta", "channel"),
    ("tile_gate_on_rows", "gla", "tile"),
])
def test_torch_vs_numpy_catches(mutant, mode, gate):
    assert failures(checks.torch_vs_numpy(MUTANT_SHAPE, 0, mode, gate, "sigmoid",
                                          reference=REFERENCE_MUTANTS[mutant], log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", ["read_before_write", "write_with_q2"])
def test_parallel_form_catches(mutant):
    assert failures(checks.no_decay_parallel_form(MUTANT_SHAPE, 0, "softmax",
                                                  reference=REFERENCE_MUTANTS[mutant], log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode, gate", [
    ("read_before_write", "gla", "head"),
    ("erase_before_decay", "delta", "tile"),
    ("tile_gate_on_rows", "delta", "tile"),
])
def test_one_hot_reduction_catches(mutant, mode, gate):
    assert failures(checks.one_hot_reduces_to_2d(MUTANT_SHAPE, 1, mode, gate,
                                                 reference=REFERENCE_MUTANTS[mutant], log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode", [("read_before_write", "gla"), ("erase_before_decay", "delta")])
def test_ones_identity_catches(mutant, mode):
    assert failures(checks.ones_is_e_times_2d(MUTANT_SHAPE, 0, mode, "head",
                                              reference=REFERENCE_MUTANTS[mutant], log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode, gate", [
    ("read_before_write", "delta", "none"),
    ("write_with_q2", "gla", "channel"),
    ("erase_before_decay", "delta", "head"),
    ("tile_gate_on_rows", "gla", "tile"),
])
def test_flattening_identity_catches(mutant, mode, gate):
    assert failures(checks.flattened_equals_2d(MUTANT_SHAPE, 0, mode, gate, "sigmoid",
                                               reference=REFERENCE_MUTANTS[mutant], log=False))


@pytest.mark.mutation
def test_second_key_modes_catch_softmax_over_wrong_axis():
    assert failures(checks.second_key_modes(MUTANT_SHAPE, 0, "softmax",
                                            helper=mutants.second_query_key_softmax_over_heads, log=False))


@pytest.mark.mutation
def test_state_sizes_catch_cross_without_value_widening():
    assert failures(checks.state_sizes(4, 2, 8, helper=mutants.state_size_cross_without_value_widening))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode, gate, broken", [
    (mutants.chunk_tensor3d_key_j_major, "gla", "none", {"output"}),
    (mutants.chunk_tensor3d_tile_gate_wrong_axis, "gla", "tile", {"output", "final_state"}),
    (mutants.chunk_tensor3d_state_order_mismatch, "gla", "channel", {"final_state", "dinitial_state"}),
    (mutants.chunk_tensor3d_fla_default_scale, "delta", "head", {"output"}),
])
def test_optimized_vs_reference_catches_flattening_bugs(mutant, mode, gate, broken):
    bad = failures(checks.optimized_vs_reference(KERNEL_MUTANT_SHAPE, 0, torch.float32, mode, gate, "sigmoid",
                                                 optimized=mutant, log=False))
    assert broken <= set(bad), bad


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, mode, gate, broken", [
    (mutants.chunk_tensor3d_dropped_q2_gradient, "gla", "tile", {"dq2"}),
    (mutants.chunk_tensor3d_dropped_gate_gradient, "gla", "channel", {"dg"}),
    (mutants.chunk_tensor3d_dropped_beta_gradient, "delta", "head", {"dbeta"}),
])
def test_optimized_vs_reference_catches_dropped_gradients(mutant, mode, gate, broken):
    bad = failures(checks.optimized_vs_reference(KERNEL_MUTANT_SHAPE, 0, torch.float32, mode, gate, "sigmoid",
                                                 optimized=mutant, log=False))
    assert set(bad) == broken


@pytest.mark.mutation
@pytest.mark.parametrize("mode", MODES)
def test_optimized_defaults_catch_fla_default_scale(mode):
    shape = Tensor3DShape(B=1, T=5, H=2, K=4, E=4, V=16)
    assert failures(checks.optimized_defaults(shape, 0, mode, "head",
                                              optimized=mutants.chunk_tensor3d_fla_default_scale, log=False))
