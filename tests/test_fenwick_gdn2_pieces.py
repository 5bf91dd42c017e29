"""``chunk_fenwick_gdn2``'s backward on one row in time pieces (``bwd.time_pieces``): fla's pieces
and the reverse carry scan run piece by piece, last piece first, the scan carrying its pre-state
gradient from one piece to the one before (``states_bwd(dcarry=...)``), so that the stacked
gradients are alive one piece at a time. fla's pieces work chunk by chunk and the carry is the
scan's own float32 state, so every gradient is the one-piece backward's to float32 rounding (on
the interpreter bit for bit). Not asserted bit for bit: the pieces are other launches (grids over
a piece's chunks, the scan compiled with a carry-in), which a compiler may round differently
(``tolerances.yaml`` ``fenwick_gdn2_time_pieces``); a dropped carry gives 7e-2 to 8e-2."""
import pytest
import torch

import optimized.fenwick_gdn2.bwd as fenwick_bwd
from ngdn.tolerances import assert_passes, compare, failures
from optimized import triton_mode
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2
from tests.test_fenwick_gdn2_release import NAMES, inputs as row_inputs

DEV = triton_mode.device()


def inputs(T, L, seed=0, H=2, K=16, V=16):
    """One row (B = 1: pieces only split a single row), two heads, an initial state."""
    x = row_inputs(B=1, T=T, H=H, K=K, V=V, L=L, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    x["initial_state"] = torch.randn(1, H, L, K, V, generator=gen).mul_(0.1).to(DEV).requires_grad_()
    return x


def grads(x, offset):
    """Every input gradient (the initial state's too) with output and final-state gradients."""
    o, final = chunk_fenwick_gdn2(**x, output_final_state=True, offset=offset)
    gen = torch.Generator().manual_seed(7)
    do, dfinal = (torch.randn(t.shape, generator=gen).to(DEV) for t in (o, final))
    leaves = [x[n] for n in (*NAMES, "initial_state")]
    return torch.autograd.grad((o, final), leaves, (do, dfinal))


def pieces_vs_one(pieces, one, log=True) -> dict:
    """``{input: (error, bound)}``: the gradients of the backward in pieces against one piece's."""
    return {name: compare("fenwick_gdn2_time_pieces", "float32", {"gradients": (a, b)}, mode="any",
                          log=log)["gradients"]
            for name, a, b in zip((*NAMES, "initial_state"), pieces, one, strict=True)}


# 6 chunks, the last ragged (T = 337): three pieces of 2 chunks, (0, 2), (2, 4), (4, 6); offset 128 and an
# initial state: the first piece's pre-state gradient is the initial state's
T, L, OFFSET = 337, 11, 128


def test_time_pieces_split_one_row_only(monkeypatch):
    monkeypatch.setattr(fenwick_bwd, "TIME_PIECES", 4)
    assert fenwick_bwd.time_pieces(1, 6, None) == [(0, 2), (2, 4), (4, 6)]
    assert fenwick_bwd.time_pieces(1, 9, None) == [(0, 3), (3, 6), (6, 9)]
    assert fenwick_bwd.time_pieces(1, 16, None) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert fenwick_bwd.time_pieces(1, 1, None) == [(0, 1)]
    assert fenwick_bwd.time_pieces(2, 6, None) == [(0, 6)]         # rows of a batch run side by side
    assert fenwick_bwd.time_pieces(1, 6, object()) == [(0, 6)]     # a packed row: one piece


@pytest.mark.compiles
def test_backward_in_time_pieces_agrees_with_one_piece(monkeypatch):
    calls = []
    scan = fenwick_bwd.states_bwd

    def spy(*a, **kw):
        calls.append(kw.get("dcarry") is not None)
        return scan(*a, **kw)

    monkeypatch.setattr(fenwick_bwd, "states_bwd", spy)
    monkeypatch.setattr(fenwick_bwd, "TIME_PIECES", 3)
    x = inputs(T, L)
    pieces = grads(x, OFFSET)
    # the main pass in three pieces (the first without a carry-in), then the split pass's one
    assert calls == [False, True, True, False]
    monkeypatch.setattr(fenwick_bwd, "TIME_PIECES", 1)
    one = grads(x, OFFSET)
    assert_passes(pieces_vs_one(pieces, one))


@pytest.mark.compiles
def test_pieces_property_catches_a_dropped_carry(monkeypatch):
    """The property above on a broken twin: each piece's reverse scan starts from a zero
    pre-state gradient (the carry from the later piece dropped)."""
    x = inputs(T, L, seed=1)
    monkeypatch.setattr(fenwick_bwd, "TIME_PIECES", 1)
    want = grads(x, OFFSET)
    monkeypatch.setattr(fenwick_bwd, "TIME_PIECES", 3)
    scan = fenwick_bwd.states_bwd
    monkeypatch.setattr(fenwick_bwd, "states_bwd", lambda *a, dcarry=None, **kw: scan(*a, **kw))
    got = grads(x, OFFSET)
    assert failures(pieces_vs_one(got, want, log=False))


def test_states_bwd_refuses_a_bad_carry():
    from optimized.fenwick_gdn2.states import states_bwd

    kg = torch.zeros(1, 64, 1, 16, device=DEV)
    mtab = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="dcarry must be contiguous float32"):
        states_bwd(kg, kg, kg, kg, torch.zeros(1, 64, 1, 32, device=DEV), torch.zeros(1, 64, 1, 32, device=DEV),
                   None, mtab, 1.0, 1, 1, 8, 16, n_own=1, dcarry=torch.zeros(1, 1, 16, 8, device=DEV))
    kg2 = torch.zeros(2, 64, 1, 16, device=DEV)
    with pytest.raises(ValueError, match="dcarry .* needs B = 1, got B = 2"):
        states_bwd(kg2, kg2, kg2, kg2, torch.zeros(2, 64, 1, 32, device=DEV), torch.zeros(2, 64, 1, 32, device=DEV),
                   None, mtab, 1.0, 1, 1, 8, 16, n_own=1, dcarry=torch.zeros(2, 1, 16, 16, device=DEV))
