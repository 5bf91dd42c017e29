"""The generic properties of every op in the table (``ngdn.ops.OPS``), each shown to fail on a
broken twin (``op_mutants``). An op added to the table gets all of them.

Draws: the entry's ``covering`` draw (B = 2, H = 2, K ≠ V, more than one chunk with a ragged last
one; on CUDA the sizes of the family's first compile bucket), shortened to one ragged chunk for the
self-consistency properties where the op has no schedule that needs two. The op's own files hold
its Hypothesis-drawn agreement properties (``test_<op>.py``) and op-specific properties.
"""
import re

import pytest
import torch
from hypothesis import settings

import op_mutants
from ngdn import ops
from ngdn.checks import generic
from ngdn.ops import OPS, Draw
from ngdn.compile_buckets import on_bucket
from ngdn.testing import kernel_dtypes, on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized import triton_mode

OP_PARAMS = [pytest.param(info, id=info.name) for info in OPS]
STATEFUL = [pytest.param(info, id=info.name) for info in OPS if info.state_passing is not None]
# The broken twins wrap an op from outside (a twin breaks what the op returns or how it is called,
# not a kernel), and the generic checks treat every entry alike, so each twin is tried on the
# entries whose ``mutant_modes`` hold this mode: two cheap ones under the interpreter (one with state
# passing) and GDN-2's on CUDA (every other entry's twins would compile and hold more kernels per
# worker: ngdn.ops.fenwick_covering_shape).
MODE = triton_mode.configure()
MUTANT_OPS = [p for p in OP_PARAMS if MODE in p.values[0].mutant_modes]
MUTANT_STATEFUL = [p for p in STATEFUL if MODE in p.values[0].mutant_modes]


def skip_unless_applies(info, prop: str):
    """``pytest.skip`` with the entry's reason where ``prop`` does not apply to it (``OpInfo.skips``)."""
    reason = ops.skip_reason(info, prop)
    if reason is not None:
        pytest.skip(f"{info.name}: {reason}")


def self_consistency_draw(info) -> Draw:
    """The covering draw at the entry's ``short_T``: one ragged chunk long (T = 20) except where the
    op needs more to reach its schedule (the nested op's levels fire only at a full chunk: T = 70,
    one firing, then a ragged chunk)."""
    d = info.covering()
    return d._replace(shape=d.shape._replace(T=info.short_T))


def state_passing_draw(info) -> Draw:
    d = info.covering()
    return d._replace(shape=d.shape._replace(T=max(d.shape.T, 70)))


def test_every_public_op_is_in_the_table():
    assert ops.public_ops_missing() == []


# --- values and gradients against the reference and the NumPy twin --------------------------------

@pytest.mark.parametrize("info", OP_PARAMS)
def test_optimized_equals_reference_on_the_covering_draw(info):
    """Values, final states and every gradient (the entry's own check)."""
    skip_unless_applies(info, "vs_reference")
    assert_passes(generic.vs_reference(info, info.covering(), torch.float32, info.op, True))


@pytest.mark.parametrize("info", OP_PARAMS)
def test_torch_reference_equals_numpy_twin(info):
    skip_unless_applies(info, "vs_numpy")
    if info.vs_numpy is None:
        pytest.skip(f"{info.name}: no NumPy twin (vs_numpy is None)")
    d = info.covering()
    assert_passes(info.vs_numpy(d._replace(shape=d.shape._replace(T=min(d.shape.T, 40))), True))


# --- self-consistency: bitwise, grad modes, layouts, uninitialised memory, second order ------------

@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("info", OP_PARAMS)
def test_self_consistency(info, dtype):
    """Two runs bit for bit, the second with every floating ``torch.empty*`` filled with NaN (so a
    difference is either nondeterminism or a read of memory nobody wrote); no_grad /
    inference_mode values bit for bit and no graph kept; non-contiguous, transposed and
    batch-expanded inputs bit for bit; a second-order gradient refused. One baseline run serves
    them all."""
    d = self_consistency_draw(info)
    baseline = generic.run(info, d, dtype)
    errors = {}
    for prop, label in (("grad_modes", "grad modes"), ("layouts", "layouts"),
                        ("uninitialised_memory", "bitwise, NaN-filled allocations"),
                        ("second_order", "second order")):
        if ops.skip_reason(info, prop) is not None:
            continue
        check = getattr(generic, prop)
        got = check(info, d, dtype) if prop == "second_order" else check(info, d, dtype, baseline=baseline)
        errors.update({f"{label} {k}": e for k, e in got.items()})
    assert_passes(errors)


@pytest.mark.parametrize("info", STATEFUL)
@pytest.mark.compiles
def test_state_passing_equals_one_call(info):
    skip_unless_applies(info, "state_passing")
    d = state_passing_draw(info)
    splits = info.state_passing.splits(d)
    assert splits, f"{info.name}: the draw {d} allows no split"
    for split in splits:
        assert_passes({f"split {split}: {k}": e
                       for k, e in generic.state_passing(info, d, torch.float32, split).items()})


# --- edge shapes -----------------------------------------------------------------------------------

EDGE_SHAPES = generic.EDGE_SIZES     # (B, T, H, K, V) per edge


def edge_shape(info, edge: str):
    """The entry's shape for ``edge``. On CUDA the edges that are not about head dims take the head
    count and head dims of the family's first compile bucket (``H`` is a constexpr of fla's
    kernels; "H=0" keeps its zero), and "K,V off 16" those of its second (V off 16, K·E or K not a
    power of two): kernels the other tests compile, so only K = V = 1 compiles anew."""
    B, T, H, K, V = EDGE_SHAPES[edge]
    shape = info.edge_shape(B, T, H, K, V)
    if not on_cuda() or edge == "K=V=1":
        return shape
    if edge == "K,V off 16":
        return on_bucket(shape, info.family, 1)
    bucket = on_bucket(shape, info.family, 0)
    return bucket._replace(B=B, T=T, H=0) if edge == "H=0" else bucket._replace(B=B, T=T)


# Edges whose value Triton specializes (an int argument equal to 1): on CUDA each compiles the op's
# whole kernel set anew, per dtype. Their float32 cases cost 80-170 s each in a cold 16-worker run
# (results/2026-12-01-gpu-suite-op-table-2/), a third of the suite's test time, so on CUDA the
# float32 ones run under the thorough profile only; bfloat16 (the training dtype, the one whose
# compile failed at a small head dim) runs always, and float32 runs always under the interpreter.
SPECIALIZED_EDGES = ("T=1", "K=V=1")


@pytest.mark.parametrize("edge", list(EDGE_SHAPES))
@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("info", OP_PARAMS)
@pytest.mark.compiles
def test_edge_shapes(info, dtype, edge):
    """Correct results (values, final states, every gradient) or an up-front ValueError naming
    the argument; never a crash inside a kernel or a compiler error."""
    skip_unless_applies(info, "edge_shape")
    if (on_cuda() and dtype == torch.float32 and edge in SPECIALIZED_EDGES
            and settings.get_current_profile_name() != "thorough"):
        pytest.skip(f"float32 at {edge} on CUDA compiles every kernel anew: thorough profile only "
                    "(NGDN_HYPOTHESIS_PROFILE=thorough); bfloat16 here and float32 on the interpreter run always")
    assert_passes(generic.edge_shape(info, edge_shape(info, edge), dtype))


# --- packed variable-length batches (cu_seqlens) --------------------------------------------------

VARLEN = [pytest.param(info, id=info.name) for info in OPS if info.varlen]
POSITIONAL = [pytest.param(info, id=info.name) for info in OPS if info.varlen and info.positional]
PACKED_LENGTHS = ops.PACKED_LENGTHS
packed_draw = ops.packed_test_draw


@pytest.mark.parametrize("info", VARLEN)
@pytest.mark.compiles
def test_packed_equals_separate_calls(info):
    """CONTRACT "Variable-length batches": one packed call (cu_seqlens, per-sequence initial states)
    equals N separate calls: output, per-sequence final states, every gradient."""
    skip_unless_applies(info, "packed_equals_separate")
    assert_passes(generic.packed_equals_separate(info, packed_draw(info), PACKED_LENGTHS, torch.float32,
                                                 cu_dtype=ops.packed_cu_dtype(info)))


@pytest.mark.parametrize("info", VARLEN)
@pytest.mark.compiles
def test_packed_call_reads_a_strided_cu_seqlens_by_its_values(info):
    """``cu_seqlens`` as a strided view (the same entries, stride 2) gives the contiguous call's
    output, final states and gradients bit for bit."""
    skip_unless_applies(info, "packed_strided_cu_seqlens")
    assert_passes(generic.packed_strided_cu_seqlens(info, packed_draw(info), PACKED_LENGTHS, torch.float32,
                                                    cu_dtype=ops.packed_cu_dtype(info)))


PACKED_CASES = [pytest.param(info, case, id=case.name) for info in OPS if info.varlen for case in info.packed_cases]


@pytest.mark.parametrize("info, case", PACKED_CASES)
def test_packed_entry_cases(info, case):
    """The entry's further packed rows (``OpInfo.packed_cases``, e.g. nested sequences firing at
    different levels) equal separate calls."""
    skip_unless_applies(info, "packed_equals_separate")
    assert_passes(generic.packed_equals_separate(info, ops.packed_case_draw(info, case), case.lengths, torch.float32,
                                                 cu_dtype=case.cu_dtype))


# --- teeth: each generic property fails on a broken twin of every op --------------------------------

@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_bitwise_catches_a_noisy_twin(info):
    skip_unless_applies(info, "bitwise")
    assert failures(generic.bitwise(info, self_consistency_draw(info), torch.float32, op=op_mutants.noisy(info.op)))


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_grad_modes_catch_a_twin_that_differs_without_autograd(info):
    skip_unless_applies(info, "grad_modes")
    d = self_consistency_draw(info)
    assert failures(generic.grad_modes(info, d, torch.float32, op=op_mutants.grad_mode_dependent(info.op)))


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_layouts_catch_a_twin_that_ignores_strides(info):
    skip_unless_applies(info, "layouts")
    d = self_consistency_draw(info)
    bad = failures(generic.layouts(info, d, torch.float32, op=op_mutants.strides_ignored(info.op)))
    assert any(k.startswith("non-contiguous") for k in bad) and any(k.startswith("expanded") for k in bad), bad


@pytest.mark.mutation
@pytest.mark.parametrize("info", VARLEN[:1])      # one entry: the twin wraps the op from outside
def test_strided_cu_seqlens_catches_a_twin_that_reads_it_by_pointer(info):
    skip_unless_applies(info, "packed_strided_cu_seqlens")
    bad = failures(generic.packed_strided_cu_seqlens(info, packed_draw(info), PACKED_LENGTHS, torch.float32,
                                                     op=op_mutants.cu_seqlens_read_by_pointer(info.op)))
    assert bad and all(k.startswith("strided cu_seqlens") for k in bad), bad


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_uninitialised_memory_catches_an_unwritten_token(info):
    skip_unless_applies(info, "uninitialised_memory")
    d = self_consistency_draw(info)
    assert failures(generic.uninitialised_memory(info, d, torch.float32,
                                                 op=op_mutants.last_token_unwritten(info.op)))


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_second_order_catches_a_gradient_without_its_graph(info):
    skip_unless_applies(info, "second_order")
    d = self_consistency_draw(info)
    assert not failures(generic.second_order(info, d, torch.float32))
    with op_mutants.second_order_unguarded():
        assert failures(generic.second_order(info, d, torch.float32))


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_STATEFUL)
def test_state_passing_catches_a_dropped_state(info):
    skip_unless_applies(info, "state_passing")
    d = state_passing_draw(info)
    twin = op_mutants.state_dropped(info.state_passing.argument)(info.op)
    assert failures(generic.state_passing(info, d, torch.float32, info.state_passing.splits(d)[0], op=twin,
                                          log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("info", MUTANT_OPS)
def test_edge_shapes_catch_a_crash_without_heads(info):
    skip_unless_applies(info, "edge_shape")
    shape = edge_shape(info, "H=0")
    assert failures(generic.edge_shape(info, shape, torch.float32, op=op_mutants.crashes_without_heads(info.op)))


def test_an_error_that_names_no_argument_fails_the_edge_property():
    info = OPS[0]

    def vague(*args, **kwargs):
        raise ValueError("something went wrong")
    bad = failures(generic.edge_shape(info, edge_shape(info, "T=1"), torch.float32, op=vague))
    assert bad and all(re.search("ValueError naming an argument", k) for k in bad)


def _state_argument(info):
    return None if info.state_passing is None else info.state_passing.argument


def _packed_teeth(info, mutant):
    """The packed property on the entry's float32 reference (which passes it: the teeth are about
    the packing, not the kernels, and the reference costs no interpreter run) and on ``mutant``
    of it (which must fail). Returns the mutant's failures."""
    d = packed_draw(info)
    reference = info.reference
    assert not failures(generic.packed_equals_separate(info, d, PACKED_LENGTHS, torch.float32, op=reference,
                                                       log=False))
    twin = mutant(_state_argument(info))(reference)
    return failures(generic.packed_equals_separate(info, d, PACKED_LENGTHS, torch.float32, op=twin, log=False))


@pytest.mark.mutation
@pytest.mark.parametrize("info", VARLEN)
def test_packed_property_catches_a_state_carried_into_the_next_sequence(info):
    """The twin drops cu_seqlens: the packed row runs as one sequence."""
    skip_unless_applies(info, "packed_equals_separate")
    assert _packed_teeth(info, op_mutants.cu_seqlens_dropped)


@pytest.mark.mutation
@pytest.mark.parametrize("info", POSITIONAL)
def test_packed_property_catches_a_sequence_on_the_packed_chunk_grid(info):
    """The twin runs each sequence on the packed row's chunk grid (its firings or Fenwick counter
    shifted by its start modulo 64). Ops without a schedule (GDN-2, the 3D state) compute the
    same on either grid, so only positional entries are checked."""
    skip_unless_applies(info, "packed_equals_separate")
    assert _packed_teeth(info, op_mutants.packed_chunk_grid)
