"""Production Nested GDN-2 (``optimized.chunk_nested_gdn2``, SPEC sections 2 and 3): equals
the float64 reference in output, final states and every gradient; level 0's per-chunk
states and injected-gradient backward equal per-token GDN-2; the schedule (firings, probed
snapshots, read states) equals a direct run of the SPEC loop; two GPU runs agree bit for
bit. Each property has a mutation test showing it fails on a broken variant
(``nested_optimized_mutants``): a firing one chunk late, the injected state gradient
dropped, a missing partial-sum block, run-dependent noise.

CPU (``ci`` profile, Triton interpreter at ~2 s per 64-token chunk per head): tiny
shapes (B·H ≤ 2, T ≤ 260, K, V ∈ {16, 32}) and few examples; the ``gpu`` profile draws
the full ranges."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import nested_optimized_checks as checks
import nested_optimized_mutants as mutants
from ngdn.inputs import GDN2Shape
from ngdn.nested_inputs import NestedShape, bounded_query_counts
from ngdn.strategies import HEAD_DIMS, examples, seeds
from ngdn.testing import kernel_dtypes, on_cuda, requires_cuda
from ngdn.tolerances import assert_passes, failures

Case = checks.OptCase
CUDA = on_cuda()
# T < 64, T = 64·k, T not a multiple of 64; CPU lengths stay ≤ 260 (≤ 5 chunks: 4 full ones fire f ≤ 4).
GPU_SEQ_LENS = (1, 17, 64, 100, 128, 130, 256, 320, 512)
CPU_SEQ_LENS = (17, 64, 130, 260)
CPU_HEAD_DIMS = (16, 32)
# n up to K only on short sequences (≤ 2 full chunks): with n = K the keys overlap and firings
# are expansive (SPEC 2, "Hazard": ~3.5× per firing), which amplifies float32 rounding; longer
# sequences draw n up to the bounded ladder (ngdn.nested_inputs.bounded_query_counts).
SHORT = 130


@st.composite
def opt_cases(draw, max_L=6):
    L = draw(st.integers(1, max_L))
    dims = HEAD_DIMS if CUDA else CPU_HEAD_DIMS
    K, V = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    T = draw(st.sampled_from(GPU_SEQ_LENS if CUDA else CPU_SEQ_LENS))
    if CUDA:
        B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    elif T > 130:
        B = H = 1
    else:
        B = draw(st.integers(1, 2))
        H = 1 if B == 2 else draw(st.integers(1, 2))
    per_level = lambda s: st.lists(s, min_size=L - 1, max_size=L - 1).map(tuple)  # noqa: E731
    schemes = ("learned", "merge")
    intervals = draw(st.none()                                              # the default ladder
                     | st.integers(1, 3).map(lambda f: (f,) * (L - 1))      # uniform
                     | per_level(st.integers(1, 4)))                        # anything, e.g. (1, 3)
    cap = K if T <= SHORT else max(bounded_query_counts(L, K, V) + [1])
    return Case(shape=NestedShape(B=B, T=T, H=H, L=L, K=K, V=V), seed=draw(seeds()),
                scheme=draw(st.sampled_from(schemes) | per_level(st.sampled_from(schemes))),
                intervals=intervals,
                query_counts=draw(st.none() | per_level(st.integers(1, cap))),
                reduction=draw(st.sampled_from(("mean", "sum")) | per_level(st.sampled_from(("mean", "sum")))),
                initial_states=draw(st.booleans()))


def level0_shapes():
    dims = HEAD_DIMS if CUDA else CPU_HEAD_DIMS
    lens = (64, 100, 128, 130, 256, 300) if CUDA else (64, 130)
    return st.builds(GDN2Shape, B=st.integers(1, 2), T=st.sampled_from(lens), H=st.just(1) if not CUDA
                     else st.integers(1, 3), K=st.sampled_from(dims), V=st.sampled_from(dims))


# Named cases every run sees: the non-nested schedule f = (1, 3) over 4 full chunks (level 2
# fires at chunk 3 and probes level 1 after 3 firings); merge with the sum reduction, T = 64·2
# exactly (the last full chunk's snapshot is the final state), an initial state on levels 0
# and 2 only and an explicit scale; L = 1 (GDN-2 itself).
NAMED = {
    "non_nested_f13": Case(NestedShape(B=1, T=260, H=1, L=3, K=16, V=16), seed=1, intervals=(1, 3),
                           query_counts=(8, 16)),
    "merge_sum_T128": Case(NestedShape(B=1, T=128, H=2, L=3, K=16, V=32), seed=2, scheme=("merge", "learned"),
                           reduction="sum", intervals=(1, 1), initial_states=(True, False, True), scale=0.3),
    "one_level": Case(NestedShape(B=2, T=17, H=1, L=1, K=32, V=16), seed=3),
}
# Small enough for the interpreter, big enough that every mutation shows: two full chunks
# (levels 1 and 2 fire), V = 32 (two V blocks of 16 for the partial-sum mutant).
MUTANT_CASE = Case(NestedShape(B=1, T=130, H=1, L=3, K=16, V=32), seed=0, intervals=(1, 1))


@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=4)
@given(case=opt_cases())
def test_optimized_equals_reference(dtype, case):
    assert_passes(checks.optimized_vs_reference(case, dtype))


@pytest.mark.parametrize("name", sorted(NAMED))
def test_optimized_equals_reference_named(name):
    assert_passes(checks.optimized_vs_reference(NAMED[name], torch.float32))


@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=2)
@given(shape=level0_shapes(), seed=seeds())
def test_level0_states_and_injected_gradients(dtype, shape, seed):
    assert_passes(checks.level0_states_vs_reference(shape, seed, dtype))


@examples(scale=10)
@given(T=st.integers(1, 64 * 40), intervals=st.lists(st.integers(1, 6), min_size=0, max_size=5).map(tuple))
def test_schedule_equals_spec_loop(T, intervals):
    assert_passes(checks.plan_vs_spec_loop(T, intervals))


@requires_cuda("the Triton interpreter on CPU is deterministic by construction; the property is about GPU runs")
@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=1)
@given(case=opt_cases())
def test_two_runs_bitwise_identical(dtype, case):
    assert_passes(checks.bitwise_reproducible(case, dtype))


# --- teeth: each property fails on a broken variant ---------------------------------------------

@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken", [
    (mutants.chunk_nested_gdn2_fires_late, {"output", "final_state[1]", "dq", "dv"}),
    (mutants.chunk_nested_gdn2_dropped_injection, {"dk", "dv", "dg", "db", "dw"}),
    (mutants.chunk_nested_gdn2_missing_partial_block, {"dlevels[0].W_K", "dlevels[0].W_gamma"}),
])
def test_optimized_vs_reference_catches(mutant, broken):
    bad = failures(checks.optimized_vs_reference(MUTANT_CASE, torch.float32, op=mutant, log=False))
    assert broken <= set(bad), (sorted(bad), sorted(broken))


@pytest.mark.mutation
def test_schedule_catches_late_firing():
    bad = failures(checks.plan_vs_spec_loop(64 * 7 + 5, (1, 3, 2), plan_fn=mutants.plan_fires_late))
    assert {"fire_chunks[1]", "sources[1]", "read_index[3]"} <= set(bad), bad


@pytest.mark.mutation
def test_level0_states_catches_dropped_injection():
    bad = failures(checks.level0_states_vs_reference(GDN2Shape(B=1, T=130, H=1, K=16, V=16), 0, torch.float32,
                                                     state_grad=mutants.state_grad_dropped_injection, log=False))
    assert {"dk", "dv", "dg", "db", "dw"} <= set(bad) and not {"output", "chunk_end_states"} & set(bad), bad


@pytest.mark.mutation
def test_bitwise_reproducible_catches_nondeterminism():
    case = Case(NestedShape(B=1, T=17, H=1, L=2, K=16, V=16), seed=0)
    bad = failures(checks.bitwise_reproducible(case, torch.float32, op=mutants.chunk_nested_gdn2_nondeterministic))
    assert "output" in bad
