"""Production Nested GDN-2 on packed sequences (``cu_seqlens``, CONTRACT "Variable-length batches"):
one packed call equals separate float64 reference calls, sequence by sequence, in output,
per-sequence final states and every gradient, where the kernels index the sequences themselves
(``optimized.nested.plan.make_packed_plan``).

The generic packed property (``property_tests/test_ops.py``) runs every op on short sequences
and small head dims. Here the nested op's draw reaches the paths the per-sequence indexing adds:
sequences of several chunks that fire every upper level, one that fires none (a single token),
one whose firing is at its last, whole chunk (its snapshot is its final state, and a sequence
follows it), sequences starting off the packed row's chunk grid, the schemes the generic property
leaves out (``merge``, ``bounded_erase``; it runs ``learned``), and under the interpreter V over
three blocks (the last ragged) and pair blocks of 16. Each table the kernels index by sequence has a broken twin
(``nested_optimized_mutants.packed_tables_twin``) the property must catch.

On CUDA the draw takes compile bucket b's sizes (``ngdn.compile_buckets.on_bucket``) and the
default pieces.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import nested_optimized_mutants as mutants
from ngdn import ops
from ngdn.checks import generic
from ngdn.compile_buckets import CPU_BLOCK, on_bucket
from ngdn.nested_inputs import NestedShape
from ngdn.ops import Draw, options
from ngdn.strategies import examples, seeds
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized.nested import Pieces, _nested

# L = 3 (intervals 1, 2). 130: three chunks, fires levels 1 and 2; 1: fires nothing; 64: one
# whole chunk, fires level 1 at it (its final state is the snapshot) and a sequence follows;
# 129: three chunks, fires both levels. Starts at 0, 130, 131, 195: three off the 64-token grid.
LENGTHS = (130, 1, 64, 129)
# The teeth's cheaper draw: a whole-chunk sequence followed by others, starts at 0, 64, 129, 130.
TEETH_LENGTHS = (64, 65, 1, 63)


def _pieces() -> Pieces:
    return Pieces() if on_cuda() else Pieces(block_v=CPU_BLOCK, block_n=CPU_BLOCK)


def packed_op(pieces: Pieces):
    def op(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False, cu_seqlens=None):
        return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state, pieces=pieces,
                       cu_seqlens=cu_seqlens)
    return op


def draw(lengths, shape: NestedShape, scheme) -> Draw:
    shape = on_bucket(shape, "level0", 1)
    return Draw(shape._replace(B=len(lengths), T=max(lengths)), seed=11,
                options=options(scheme=scheme, reduction=("sum", "mean", "mean")[:shape.L - 1]))


def test_packed_sequences_in_the_kernels_equal_separate_calls():
    """Every level fired by several sequences, both other schemes, V over three blocks (CPU)."""
    d = draw(LENGTHS, NestedShape(B=1, T=1, H=2, L=3, K=20, V=40), ("bounded_erase", "merge"))
    assert_passes(generic.packed_equals_separate(ops.get("nested"), d, LENGTHS, torch.float32, op=packed_op(_pieces())))


@examples(ci=1)
@given(lengths=st.lists(st.integers(1, 140), min_size=2, max_size=4).map(tuple), L=st.integers(2, 3),
       scheme=st.sampled_from(ops.SCHEMES), seed=seeds())
def test_packed_drawn_lengths_equal_separate_calls(lengths, L, scheme, seed):
    """Ragged lengths drawn (1 to 140 tokens: up to three chunks, firing level 1, level 2 or
    neither), any scheme and depth: one packed call equals separate calls. On CUDA the gpu
    profile's ten draws at compile bucket b's sizes; under the interpreter one draw at small head
    dims (a drawn row costs up to 90 s there: the fixed draws above carry the CPU's coverage)."""
    d = draw(lengths, NestedShape(B=1, T=1, H=2, L=L, K=8, V=12), scheme)._replace(seed=seed)
    assert_passes(generic.packed_equals_separate(ops.get("nested"), d, lengths, torch.float32, op=packed_op(Pieces())))


@pytest.mark.mutation
@pytest.mark.parametrize("kind", mutants.PACKED_TWINS)
def test_packed_property_catches_a_broken_sequence_table(kind, monkeypatch):
    """Each per-sequence table of the kernels broken in one way fails the packed property (the
    untouched tables pass it on this draw: ``test_packed_teeth_draw_passes``)."""
    import optimized.nested.fwd as fwd

    monkeypatch.setattr(fwd, "device_tables", mutants.packed_tables_twin(kind))
    assert failures(generic.packed_equals_separate(ops.get("nested"), teeth_draw(), TEETH_LENGTHS, torch.float32,
                                                   op=packed_op(Pieces()), log=False))


def teeth_draw() -> Draw:
    """One head (the twins break sequence tables, not head layouts; the property draw above has two),
    to halve the interpreter's time."""
    return draw(TEETH_LENGTHS, NestedShape(B=1, T=1, H=1, L=2, K=8, V=12), "learned")


def test_packed_teeth_draw_passes():
    assert_passes(generic.packed_equals_separate(ops.get("nested"), teeth_draw(), TEETH_LENGTHS, torch.float32,
                                                 op=packed_op(Pieces())))
