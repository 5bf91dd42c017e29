"""Chunked Fenwick GDN-2 memory (CONTRACT section 5, the GDN-2 variant; ``optimized.chunk_fenwick_gdn2``):
the optimized op equals ``reference.naive_fenwick_gdn2`` in value, final states and every
gradient (λ included), on ragged sequences spanning several chunk-level carries; with
``λ ≡ 1`` it is ``optimized.chunk_gdn2``; splitting a sequence at a multiple of 64 and passing
the bucket states on is one call; a packed row (cu_seqlens) of sequences with different bucket
counts is separate calls. Each property has a mutation test showing it fails on a broken op
(``fenwick_gdn2_mutants.py``).

CPU cost (interpreter, 2 cores shared with other load): about 80 s of CPU in one process, plus
~12 s of first-call warm-up per extra xdist worker; the three packed-row cases add about 20 s
(one unloaded core). The ci profile's two Hypothesis draws have
B = H = 1; the named cases add two heads (extreme regime) and two sequences (state passing).
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ngdn import ops
from ngdn.checks import fenwick_gdn2 as checks
from ngdn.checks import generic
import fenwick_gdn2_mutants as mutants
from kernel_mutation import Plant, planted
from ngdn.compile_buckets import bucket_params, on_bucket
from ngdn.fenwick_inputs import FenwickShape
from ngdn.strategies import examples, seeds
from ngdn.testing import kernel_dtypes, on_cuda
from ngdn.tolerances import assert_passes, compare, failures

# CPU menu: one token, a partial chunk, one full chunk, ragged 2-4 chunks; K, V not powers of two
# (masked blocks). The carry scans' V blocks (``states.block_sizes``): one, masked, in the main
# pass; two, the last ragged, at V = 24 in the seven-block passes (one chunk; the last chunk's
# split); tests/test_fenwick_gdn2_scan_blocks.py runs the main pass over several.
CPU_SEQ_LENS = (1, 17, 64, 100, 130, 200)


# CUDA menu: fla's GDN-2 pieces take the stacked value width (J + 1)·V as a constexpr (and 7·V
# in the last chunk's split pass), and J (the bit length of the last chunk index) follows T:
# every J is a fresh compilation of all of them. Two J per bucket and dtype (J = 1: 65-128 tokens, J = 2: 129-256), each ragged and full;
# the named nine-chunk case adds J = 4.
CUDA_SEQ_LENS = (100, 128, 200, 256)


def kernel_shapes(bucket=None):
    """CPU: the menu above. CUDA: the level-0 compile bucket's H, K, V (our kernels and fla's GDN-2
    pieces take H, K, V as constexpr; T is a runtime size, the stacked value width (J + 1)·V
    follows T's chunk count), T from ``CUDA_SEQ_LENS``."""
    if bucket is None:
        return st.builds(FenwickShape, B=st.integers(1, 2), T=st.sampled_from(CPU_SEQ_LENS), H=st.integers(1, 2),
                         K=st.sampled_from((16, 24)), V=st.sampled_from((8, 24)), extra_levels=st.integers(0, 2))
    return st.builds(FenwickShape, B=st.integers(1, 2), T=st.sampled_from(CUDA_SEQ_LENS), H=st.just(bucket.H),
                     K=st.just(bucket.K), V=st.just(bucket.V), extra_levels=st.integers(0, 2))


# Three chunks (carries 0 -> 1 with m = 0 and 1 -> 2 with m = 1), ragged last chunk.
MUTANT_SHAPE = on_bucket(FenwickShape(B=1, T=130, H=1, K=16, V=16))
# Nine chunks, the last 8 tokens long: carries with m = 0, 1, 2, 3 (chunk-levels 1 … 4, token
# levels up to 10), 11 stacked blocks.
LONG = on_bucket(FenwickShape(B=1, T=520, H=1, K=16, V=16, extra_levels=0))


@pytest.mark.parametrize("bucket", bucket_params("level0"))
@pytest.mark.parametrize("dtype", kernel_dtypes())
@examples(ci=2, family="level0")
@given(data=st.data(), seed=seeds())
def test_optimized_equals_reference(dtype, bucket, data, seed):
    shape = data.draw(kernel_shapes(bucket), label="shape")
    assert_passes(checks.optimized_vs_reference(shape, seed, dtype))


def test_optimized_equals_reference_nine_chunks():
    """A ragged sequence spanning carries with m = 0 … 3 (token levels up to 10)."""
    assert_passes(checks.optimized_vs_reference(LONG, 3, torch.float32))


def test_optimized_equals_reference_extreme_regime():
    """The extreme regime (``ngdn.inputs.REGIMES``): strong forgets (g down to -60), erase gates
    1 - 1e-6, write gates 0/1, router weights σ(±30); 3 chunks, ragged. Its own tolerance entry:
    fla's chunk (WY) form itself loses precision there (``fenwick_gdn2_extreme`` in tolerances.yaml)."""
    shape = on_bucket(FenwickShape(B=1, T=130, H=2, K=24, V=24, extra_levels=1))   # two heads
    assert_passes(checks.optimized_vs_reference(shape, 4, torch.float32, regime="extreme",
                                                component="fenwick_gdn2_extreme"))


# Two V blocks of the intra-chunk kernels (blocks of at most 64), the last ragged: the CPU menu's V ≤ 24
# runs one (CUDA's buckets reach it: V = 100). Two chunks, the last ragged; B = H = 2.
V_BLOCKS_SHAPE = on_bucket(FenwickShape(B=2, T=70, H=2, K=16, V=80))


def test_optimized_equals_reference_two_intra_v_blocks():
    assert_passes(checks.optimized_vs_reference(V_BLOCKS_SHAPE, 2, torch.float32))


@pytest.mark.mutation
def test_two_intra_v_blocks_catch_a_dp_of_the_last_block_only():
    """The intra backward's dP = Σ over V blocks of dO (w ⊙ v)ᵀ, kept from the last block only."""
    from optimized.fenwick_gdn2 import intra
    last_only = Plant(intra, "fenwick_intra_bwd_kernel", "b_dp += tl.dot(b_do, tl.trans(b_wv), input_precision=DOT)",
                      "b_dp = tl.dot(b_do, tl.trans(b_wv), input_precision=DOT)")
    with planted(last_only):
        bad = failures(checks.optimized_vs_reference(V_BLOCKS_SHAPE, 2, torch.float32, log=False))
    assert {"dq", "dk", "dlevel_scales"} & set(bad), sorted(bad)


# Two chunks (one carry), ragged: chunk_gdn2's forward costs ~0.1 s per token and head on the CPU.
REDUCTION_SHAPE = on_bucket(FenwickShape(B=1, T=66, H=1, K=16, V=16))


def test_uniform_router_is_chunk_gdn2():
    assert_passes(checks.uniform_router_is_chunk_gdn2(REDUCTION_SHAPE, 5))


@pytest.mark.mutation
def test_uniform_router_catches_transition_on_newest_only():
    """(Next to the property: in one process it reuses chunk_gdn2's results for the same draw.)"""
    bad = failures(checks.uniform_router_is_chunk_gdn2(
        REDUCTION_SHAPE, 5, optimized=mutants.chunk_fenwick_gdn2_transition_on_newest_only, log=False, grads=False))
    assert "gdn2_output" in bad


@pytest.mark.compiles
def test_state_passing_equals_one_call():
    """Split at token 128: the second call starts at chunk 2 (the carry 1 -> 2 merges levels
    0 … 7 into 8) and carries once more (2 -> 3)."""
    shape = on_bucket(FenwickShape(B=2, T=200, H=1, K=16, V=16, extra_levels=1))   # two sequences
    assert_passes(checks.state_passing(shape, 7, 128))


# Split at token 64: the second call's chunks are absolute chunks 1, 2, 3, so its carries are
# 1 -> 2 (m = 1: chunk-level 1 and the own state merge into chunk-level 2) and 2 -> 3 (m = 0);
# counted from the call's own first chunk they would be m = 0, then 1.
OFFSET_SHAPE, OFFSET_SPLIT = on_bucket(FenwickShape(B=1, T=200, H=1, K=16, V=16)), 64


def test_state_passing_equals_one_call_where_the_offset_sets_the_carries():
    assert_passes(checks.state_passing(OFFSET_SHAPE, 8, OFFSET_SPLIT))


# --- teeth: each property fails on a broken implementation -------------------------

@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken", [
    (mutants.chunk_fenwick_gdn2_merge_late, "output"),
    (mutants.chunk_fenwick_gdn2_transition_on_newest_only, "output"),
    (mutants.chunk_fenwick_gdn2_intra_level_off_by_one, "output"),
    (mutants.chunk_fenwick_gdn2_final_split_off_by_one, "final_state"),
], ids=["merge_late", "transition_on_newest_only", "intra_level_off_by_one", "final_split_off_by_one"])
def test_optimized_vs_reference_catches(mutant, broken):
    bad = failures(checks.optimized_vs_reference(MUTANT_SHAPE, 0, optimized=mutant, log=False, grads=False))
    assert broken in bad


@pytest.mark.mutation
@pytest.mark.parametrize("plant, broken, intact", [
    (mutants.ROUTER_TOP_BUCKET_UNREAD, {"output"}, set()),
    (mutants.ROUTER_DLAM_FROM_NEXT_BLOCK, {"dlevel_scales"}, {"output", "dq", "dk", "dv"}),
    (mutants.ROUTER_COTANGENT_LEVEL_BELOW, {"dq", "dk", "dv"}, {"output", "dlevel_scales"}),
], ids=["top_bucket_unread", "dlam_from_next_block", "cotangent_level_below"])
def test_optimized_vs_reference_catches_router_bugs(plant, broken, intact):
    """The router over the bucket blocks' reads (three chunks: two bucket blocks): each of its
    three outputs (``o``, ``dλ[7 + j]``, the stacked cotangent) broken alone."""
    with planted(plant):        # forward and backward
        bad = set(failures(checks.optimized_vs_reference(MUTANT_SHAPE, 0, log=False)))
    assert broken <= bad and not intact & bad, bad


@pytest.mark.mutation
def test_nine_chunks_catch_stale_merged_buckets():
    """A carry with m ≥ 1 must empty the buckets 0 … m-1 it merges."""
    bad = failures(checks.optimized_vs_reference(LONG, 3, optimized=mutants.chunk_fenwick_gdn2_stale_merged_buckets,
                                                 log=False, grads=False))
    assert "output" in bad, bad


@pytest.mark.mutation
def test_optimized_vs_reference_catches_dropped_level_scale_gradient():
    bad = failures(checks.optimized_vs_reference(
        REDUCTION_SHAPE, 0, optimized=mutants.chunk_fenwick_gdn2_dropped_level_scale_gradient, log=False))
    assert "dlevel_scales" in bad, bad


@pytest.mark.mutation
def test_optimized_vs_reference_catches_final_split_ignored_in_backward():
    """Three chunks: the main pass carries one own block; the last chunk's split pass must carry
    the final-state gradient of levels 0 … 6 (values are right here, gradients are not)."""
    bad = failures(checks.optimized_vs_reference(
        MUTANT_SHAPE, 0, optimized=mutants.chunk_fenwick_gdn2_final_split_ignored_in_backward, log=False))
    assert {"dk", "dv", "dw"} <= set(bad) and not {"output", "final_state"} & set(bad), bad


@pytest.mark.mutation
def test_state_passing_catches_ignored_initial_state():
    bad = failures(checks.state_passing(FenwickShape(B=1, T=100, H=1, K=16, V=16), 7, 64,
                                        optimized=mutants.chunk_fenwick_gdn2_initial_state_ignored, log=False,
                                        grads=False))
    assert {"output", "final_state"} <= set(bad), bad


@pytest.mark.mutation
def test_state_passing_catches_offset_ignored_in_carries():
    bad = failures(checks.state_passing(OFFSET_SHAPE, 8, OFFSET_SPLIT,
                                        optimized=mutants.chunk_fenwick_gdn2_offset_ignored_in_carries, log=False,
                                        grads=False))
    assert {"output", "final_state"} <= set(bad), bad


@pytest.mark.mutation
def test_offset_ignored_in_carries_needs_the_offset_draw():
    """The split-128 draw cannot see this mutant (its one carry, 2 -> 3, has m = 0 counted either
    way); the split-64 draw's carries differ."""
    from kernel_mutation import twins
    from optimized.fenwick_gdn2.fwd import carry_table

    (_, _, ignored), = twins([mutants.OFFSET_IGNORED_IN_CARRIES])
    # entry c: the carry c -> c + 1 (the last chunk's entry is never used)
    assert carry_table(128, 2, "cpu").tolist()[:1] == ignored(128, 2, "cpu").tolist()[:1] == [0]
    assert carry_table(64, 3, "cpu").tolist()[:2] == [1, 0] and ignored(64, 3, "cpu").tolist()[:2] == [0, 1]


@pytest.mark.skipif(on_cuda(), reason="the CPU menu only")
def test_mutant_harness_without_bugs_passes():
    """The mutants' piece swapping with the real pieces is the real op (values)."""
    def clean(*args, **kwargs):
        return mutants._call({"carry_table": mutants._carry_table, "states_fwd": mutants._states_fwd}, args, kwargs)

    assert not failures(checks.optimized_vs_reference(FenwickShape(B=1, T=20, H=1, K=16, V=16), 0, optimized=clean,
                                                      log=False, grads=False))


RAGGED_LENGTHS = ops.FENWICK_GDN2_RAGGED_LENGTHS     # the packed row (ngdn.ops says what each reaches)


def ragged_draw():
    return ops.get("fenwick-gdn2"), ops.fenwick_gdn2_ragged_draw()


@pytest.mark.compiles
def test_packed_sequences_reach_different_bucket_counts():
    """CONTRACT "Variable-length batches": one packed call (one launch set) equals separate calls in
    output, per-sequence final states and every gradient, with sequences of 1, 1, 3 and 5 chunks
    (the longest sets the row's bucket blocks; the shorter ones' stay empty)."""
    info, d = ragged_draw()
    assert_passes(generic.packed_equals_separate(info, d, RAGGED_LENGTHS, torch.float32, cu_dtype=torch.int64))


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken", [
    (mutants.chunk_fenwick_gdn2_packed_grid_carries, "output"),
    (mutants.chunk_fenwick_gdn2_packed_grid_final_split, "final_state"),
], ids=["packed_grid_carries", "packed_grid_final_split"])
def test_packed_sequences_catch_the_packed_grid(mutant, broken):
    """The property fails when a sequence's carries or its final split follow the packed row's
    chunk grid instead of its own. ``cu_seqlens`` as int64, as in the property above: the twins
    break the grid, not the index width, and on CUDA int32 compiled every kernel of the packed
    row anew for this test alone (≈ 90 s of a cold run, its last test)."""
    info, d = ragged_draw()
    bad = failures(generic.packed_equals_separate(info, d, RAGGED_LENGTHS, torch.float32, op=mutant, log=False,
                                                  cu_dtype=torch.int64))
    assert broken in bad, bad


def test_backward_without_final_state():
    """``output_final_state=False`` (no final-state gradient reaches the backward) gives the same
    gradients as asking for the final states and not using them, to float32 rounding (the backward
    kernels are compiled without and with a final-state gradient: ``tolerances.yaml``
    ``fenwick_gdn2_final_state_choice``; the interpreter gives the same bits). Failed before the fix:
    the reverse scan addressed the missing ``dfinal`` (found by ``ngdn bench fenwick-gdn2 --quick``)."""
    from ngdn.fenwick_inputs import fenwick_gdn2_inputs
    from optimized import chunk_fenwick_gdn2

    shape = on_bucket(FenwickShape(B=1, T=70, H=1, K=16, V=16))
    x = fenwick_gdn2_inputs(shape, 2)
    dev = "cuda" if on_cuda() else "cpu"
    names = ("q", "k", "v", "g", "b", "w", "level_scales")
    grads = []
    for keep in (False, True):
        ins = {n: x[n].to(dev, torch.float32).requires_grad_() for n in names}
        o, S = chunk_fenwick_gdn2(**ins, output_final_state=keep)
        assert (S is not None) == keep
        o.sum().backward()
        grads.append([ins[n].grad for n in names])
    assert_passes({n: compare("fenwick_gdn2_final_state_choice", "float32", {"gradients": (a, b)},
                              mode="any")["gradients"] for n, a, b in zip(names, *grads, strict=True)})
