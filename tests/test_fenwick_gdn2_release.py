"""``chunk_fenwick_gdn2``'s backward frees each stacked tensor once it is spent, unless the graph
is kept: the step peaks in fla's WY backward with every stacked tensor alive (``bench/NOTES.md``,
Fenwick GDN-2), so what is already spent must not be alive there."""
import weakref

import pytest
import torch

import fla.ops.gdn2.chunk_bwd as fla_wy
import fla.ops.gdn2.chunk_intra as fla_intra
from optimized import triton_mode
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2
from tests.backward_twice import check_backward_twice

DEV = triton_mode.device()
NAMES = ("q", "k", "v", "g", "b", "w", "level_scales")


def inputs(B=2, T=130, H=2, K=16, V=16, L=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
         "v": torch.randn(B, T, H, V, generator=gen), "g": -torch.rand(B, T, H, K, generator=gen),
         "b": torch.rand(B, T, H, K, generator=gen), "w": torch.rand(B, T, H, V, generator=gen),
         "level_scales": torch.rand(B, T, H, L, generator=gen)}
    x = {n: t.to(DEV) for n, t in x.items()}
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    return {n: t.requires_grad_() for n, t in x.items()}


@pytest.mark.parametrize("retain_graph", [False, True], ids=["plain", "retain_graph"])
@pytest.mark.compiles
def test_spent_stacked_tensors_are_freed_before_fla_backward_pieces(monkeypatch, retain_graph):
    """A plain backward drops the stacked reads before fla's WY backward (they are read by the
    router's backward only) and ``qg``, ``kg``, ``w_wy`` (read by the reverse carry scan), then
    ``h``, ``vn``, ``v_st``, ``w_st`` before fla's intra backward; with retain_graph=True all stay
    (a second backward needs them)."""
    x = inputs()
    o, _ = chunk_fenwick_gdn2(**x, output_final_state=True)
    saved, tail = o.grad_fn.parts
    assert tail is not None and saved.reads is not None
    refs = {n: weakref.ref(getattr(saved, n)) for n in ("reads", "qg", "kg", "w_wy", "h", "vn", "v_st", "w_st")}
    at_wy, at_intra = [], []
    wy, intra = fla_wy.chunk_gdn2_bwd_wy_dqkg_fused, fla_intra.chunk_gdn2_bwd_intra

    def alive():
        return {n: r() is not None for n, r in refs.items()}

    def wy_spy(*a, **kw):
        at_wy.append(alive())
        return wy(*a, **kw)

    def intra_spy(*a, **kw):
        at_intra.append(alive())
        return intra(*a, **kw)

    monkeypatch.setattr(fla_wy, "chunk_gdn2_bwd_wy_dqkg_fused", wy_spy)
    monkeypatch.setattr(fla_intra, "chunk_gdn2_bwd_intra", intra_spy)
    del saved, tail
    torch.autograd.grad(o, [x[n] for n in NAMES], torch.ones_like(o), retain_graph=retain_graph)
    keep = retain_graph
    # the main pass's calls come first (then the split pass's over the last chunk)
    assert at_wy[0] == {"reads": keep, "qg": keep, "kg": keep, "w_wy": keep,
                        "h": True, "vn": True, "v_st": True, "w_st": True}
    assert at_intra[0] == {n: keep for n in refs}


@pytest.mark.compiles
def test_backward_twice_needs_retain_graph_and_then_agrees():
    """retain_graph=True keeps the saved state and a second backward agrees with the first;
    after a plain backward a third one fails with a message saying what to do."""
    x = inputs(seed=1)
    leaves = [x[n] for n in NAMES]
    o, _ = chunk_fenwick_gdn2(**x)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2)).to(o.device)
    check_backward_twice(o, leaves, do)


def test_inputs_modified_in_place_after_the_forward_are_refused():
    """The caller's tensors stay under autograd's in-place check (``save_for_backward``) while the
    forward's own tensors are held on ``ctx``: an input modified in place before the backward
    raises, not a silently wrong gradient (``v`` needs no gradient here, so no other guard sees
    it; ``dw`` reads it)."""
    x = inputs(seed=3)
    v = x.pop("v").detach()
    o, _ = chunk_fenwick_gdn2(**x, v=v)
    v.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.sum().backward()
