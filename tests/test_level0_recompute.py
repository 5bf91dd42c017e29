"""Level 0's recompute (``optimized.nested.level0.RECOMPUTE``, ``Pieces.level0_recompute``): the
backward makes again the intermediates the forward did not keep, with fla's own functions on the
same inputs, so every gradient is bit-identical to keeping them; a broken twin of the recompute
fails that comparison."""
import pytest
import torch

from ngdn.checks.nested_optimized import GATES, level0_injection_chunks
from ngdn.compile_buckets import on_bucket
from ngdn.inputs import GDN2Shape, gdn2_inputs
from optimized import triton_mode
from optimized.nested.level0 import CHUNK, Level0Saved, level0_bwd, level0_fwd
from optimized.nested.plan import device_tables, make_packed_plan

DEV = triton_mode.device()
# B = 2 and H = 2 (batch and head offsets), a ragged last chunk; packed: two sequences in one row
# (on CUDA the sizes of compile bucket "b", two heads: ngdn.compile_buckets.on_bucket)
SHAPE = on_bucket(GDN2Shape(B=2, T=80, H=2, K=16, V=16), index=1)
LENGTHS = (70, 30)


def run(recompute: str, packed: bool, backwards=(True,), shape=SHAPE):
    """Which of ``g_cumsum, w_wy, qg, kg`` the forward kept, and the forward's output and final
    state with the gradients of one backward per entry of ``backwards`` (its ``release``: False
    keeps ``saved`` for the next), with gradients injected on end-of-chunk states."""
    if packed:
        shape = GDN2Shape(B=1, T=sum(LENGTHS), H=shape.H, K=shape.K, V=shape.V)
    x = gdn2_inputs(shape, seed=3)
    ins = [x[n].to(DEV, torch.float32) for n in GATES]
    tables = device_tables(make_packed_plan(LENGTHS, (1,)), DEV).packed if packed else None
    n_seq = len(LENGTHS) if packed else shape.B
    h0 = x["initial_state"][:1].expand(n_seq, -1, -1, -1).to(DEV, torch.float32).contiguous()
    o, ht, h, saved = level0_fwd(*ins, scale=shape.K ** -0.5, initial_state=h0, packed=tables,
                                 recompute=recompute)
    kept = [t is not None for t in (saved.g_cumsum, saved.w_wy, saved.qg, saved.kg)]
    N = h.shape[1]
    ends = level0_injection_chunks(shape.T, 3) if not packed else [0, N - 2]
    gen = torch.Generator().manual_seed(4)
    d_ends = torch.randn(o.shape[0], len(ends), shape.H, shape.K, shape.V, generator=gen).to(DEV)
    do = torch.randn(o.shape, generator=gen).to(DEV)
    slots = None
    if packed:      # the packed state gradient reads its chunk count from the slots
        from optimized.nested.level0 import injection_slots
        slots = injection_slots(N, ends, DEV)
    grads = []
    for release in backwards:
        grads += level0_bwd(saved, do, d_ends=d_ends, end_chunks=ends, slots=slots, release=release)
    return kept, [o, ht, *grads]


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_level0_recompute_agrees_bit_for_bit(packed):
    """Everything made again (``"cumsum+wy"``; ``"cumsum"`` is a part of it) against everything
    kept, with a backward that keeps the graph and a second one that releases it."""
    kept, want = run("none", packed)
    kept_again, got = run("cumsum+wy", packed, backwards=(False, True))
    assert kept == [True] * 4 and kept_again == [False] * 4
    n = len(want) - 2                   # one backward's gradients
    assert len(got) == 2 + 2 * n
    for i, (a, b) in enumerate(zip(want + want[2:], got)):
        assert (a is None and b is None) or torch.equal(a, b), i


def test_level0_recompute_catches_a_wrong_cumsum(monkeypatch):
    """The property above on a broken twin: the cumsum made again without fla's base-2 scale
    (the forward ran ``chunk_local_cumsum(g, scale=RCP_LN2)``)."""
    from fla.ops.utils import chunk_local_cumsum

    small = on_bucket(GDN2Shape(B=1, T=80, H=1, K=16, V=16))
    _, want = run("none", packed=False, shape=small)
    monkeypatch.setattr(Level0Saved, "gate_cumsum",
                        lambda s: chunk_local_cumsum(g=s.g, chunk_size=CHUNK, **s.varlen()))
    _, got = run("cumsum", packed=False, shape=small)
    assert torch.equal(want[0], got[0])                 # the forward keeps its own cumsum
    assert not all(a is None or torch.equal(a, b) for a, b in zip(want[2:], got[2:]))


def test_level0_rejects_an_unknown_recompute():
    x = gdn2_inputs(SHAPE, seed=0)
    with pytest.raises(ValueError, match="recompute must be one of"):
        level0_fwd(*[x[n].to(DEV, torch.float32) for n in GATES], scale=1.0, recompute="everything")


def test_the_op_passes_its_pieces_choice_to_level0():
    """``Pieces.level0_recompute`` reaches ``level0_fwd``: the forward's saved state keeps what the
    choice says (the default makes the cumsum again; reads_ab ``l0-keep``, ``l0-recompute-wy``)."""
    from ngdn.nested_inputs import NestedShape, nested_inputs
    from optimized.nested import Pieces, _nested
    from reference.nested import Level

    x = nested_inputs(on_bucket(NestedShape(B=1, T=64, H=1, L=2, K=16, V=16)), seed=0)
    levels = [Level(lv.scheme, lv.interval, {n: p.to(DEV) for n, p in lv.params.items()}, lv.reduction)
              for lv in x["levels"]]
    args = {n: x[n].to(DEV, torch.float32).requires_grad_() for n in ("q", "k", "v", "g", "b", "w", "r")}
    seen = {}
    for pieces in (Pieces(), Pieces(level0_recompute="none"), Pieces(level0_recompute="cumsum+wy")):
        s0 = _nested(pieces=pieces, levels=levels, **args)[0].grad_fn.saved.level0
        seen[pieces.level0_recompute] = [t is not None for t in (s0.g_cumsum, s0.w_wy, s0.qg, s0.kg)]
    assert seen == {"cumsum": [False, True, True, True], "none": [True] * 4, "cumsum+wy": [False] * 4}
