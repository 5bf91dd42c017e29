"""Level 0's work beside the upper levels (``Pieces.level0_overlap``, opt-in; ``optimized.nested.side_stream``).

Level 0's forward runs as fla's ``chunk_gdn2_fwd`` in two calls (``level0_fwd_states``, then
``level0_fwd_output``): bit for bit fla's single call, on every device. On CUDA, when asked, the
output, and in the backward fla's ``dAv``, run on a second stream beside the upper levels: the same kernels on
the same inputs, so the op's values and gradients are bit for bit those of the in-line op; two
broken twins (a side stream that does not wait for level 0's states, a join that does not wait for
the side stream) fail that comparison."""
import math

import pytest
import torch

from ngdn.compile_buckets import on_bucket
from ngdn.inputs import GDN2Shape, gdn2_inputs
from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import triton_mode
from optimized.nested import side_stream
from optimized.nested.level0 import CHUNK, level0_fwd
from optimized.nested.plan import device_tables, make_packed_plan
from reference.nested import Level

DEV = triton_mode.device()
GATES = ("q", "k", "v", "g", "b", "w")
NAMES = GATES + ("r",)
cuda_only = pytest.mark.skipif(DEV != "cuda", reason="the side stream exists on CUDA only")


def _two_calls_vs_fla(packed: bool) -> list:
    """Which of level 0's forward results differ from fla's ``chunk_gdn2_fwd``'s (indices into
    output, final state, ``h``, ``g_cumsum``, ``Aqk``, ``Akk``, ``w_wy``, ``qg``, ``kg``, ``v_new``)."""
    from fla.ops.gdn2.chunk_fwd import chunk_gdn2_fwd

    shape = on_bucket(GDN2Shape(B=1 if packed else 2, T=100, H=2, K=16, V=16), index=1)
    x = gdn2_inputs(shape, seed=5)
    ins = [x[n].to(DEV, torch.float32) for n in GATES]
    tables = device_tables(make_packed_plan((70, 30), (1,)), DEV).packed if packed else None
    varlen = {} if tables is None else {"cu_seqlens": tables.cu_seqlens, "chunk_indices": tables.chunk_indices}
    h0 = x["initial_state"][:1].expand(2, -1, -1, -1).to(DEV, torch.float32).contiguous()
    o, ht, h, saved = level0_fwd(*ins, scale=0.3, initial_state=h0, packed=tables)
    (o_f, ht_f, g_f, Aqk_f, Akk_f, w_f, _, qg_f, kg_f, vn_f, h_f, _) = chunk_gdn2_fwd(
        q=ins[0], k=ins[1], v=ins[2], g=ins[3], b=ins[4], w_gate=ins[5], scale=0.3, initial_state=h0,
        output_final_state=True, chunk_size=CHUNK, disable_recompute=True, **varlen)
    pairs = [(o, o_f), (ht, ht_f), (h, h_f), (saved.g_cumsum, g_f), (saved.Aqk, Aqk_f), (saved.Akk, Akk_f),
             (saved.w_wy, w_f), (saved.qg, qg_f), (saved.kg, kg_f), (saved.v_new, vn_f)]
    # Aqk's entries above each chunk's diagonal are never written (fla allocates it empty)
    starts = torch.tensor([0] if tables is None else tables.cu_seqlens.tolist()[:-1])
    t = torch.arange(shape.T)
    local = t - starts[torch.searchsorted(starts, t, right=True) - 1]
    written = (torch.arange(CHUNK)[None, :] <= (local % CHUNK)[:, None]).to(DEV)[None, :, None, :]
    pairs[4] = (torch.where(written, saved.Aqk, 0), torch.where(written, Aqk_f, 0))
    return [i for i, (a, b) in enumerate(pairs) if not torch.equal(a, b)]


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_level0_forward_in_two_calls_is_flas_forward(packed):
    """``level0_fwd`` (states, then output) against fla's ``chunk_gdn2_fwd``: output, final state,
    ``h`` and every intermediate kept for the backward, bit for bit (B = 2, H = 2, a ragged last
    chunk; packed: two sequences in one row)."""
    assert _two_calls_vs_fla(packed) == []


def test_two_calls_check_catches_an_output_on_the_raw_gates(monkeypatch):
    """The check above on a twin whose output reads the gates as given, not their chunk cumsum."""
    import optimized.nested.level0 as level0_module
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk

    def output(s):
        return chunk_gla_fwd_o_gk(q=s.q, v=s.v_new, g=s.g, A=s.Aqk, h=s.h, scale=s.scale, chunk_size=CHUNK)

    monkeypatch.setattr(level0_module, "level0_fwd_output", output)
    assert _two_calls_vs_fla(False) == [0]


def test_pieces_reject_an_unknown_overlap():
    from optimized.nested import Pieces

    with pytest.raises(ValueError, match="level0_overlap must be one of"):
        Pieces(level0_overlap="bwd")
    with pytest.raises(ValueError, match="level0_recompute must be one of"):
        Pieces(level0_recompute="wy")
    assert not Pieces().overlaps("fwd") and not Pieces().overlaps("bwd")
    assert Pieces(level0_overlap="fwd+bwd").overlaps("bwd")
    assert not Pieces(level0_overlap="fwd").overlaps("bwd")


def test_fork_runs_in_line_without_cuda():
    with side_stream.fork(True, torch.device("cpu")) as s:
        assert s is None
    side_stream.join(None, torch.zeros(1))


def _op(overlap: str, seed: int = 0):
    """The nested op's output and every input gradient with ``Pieces(level0_overlap=overlap)``
    (L = 3, B = 2, H = 2: batch and head offsets, a ragged last chunk, bf16 as in training)."""
    from optimized.nested import Pieces, _nested

    shape = on_bucket(NestedShape(B=2, T=200, H=2, L=3, K=16, V=16))
    x = nested_inputs(shape, seed=seed)
    args = {n: x[n].to(DEV, torch.bfloat16).requires_grad_() for n in NAMES}
    args["levels"] = [Level(lv.scheme, lv.interval, {n: p.to(DEV, torch.float32) for n, p in lv.params.items()},
                            lv.reduction) for lv in x["levels"]]
    o = _nested(pieces=Pieces(level0_overlap=overlap), **args)[0]
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device, o.dtype)
    grads = torch.autograd.grad(o, [args[n] for n in NAMES], do)
    torch.cuda.synchronize()
    return [o, *grads]


@cuda_only
@pytest.mark.parametrize("overlap", ["fwd", "fwd+bwd"])
def test_overlap_agrees_bit_for_bit(overlap):
    want = _op("none")
    for i, (a, b) in enumerate(zip(want, _op(overlap))):
        assert torch.equal(a, b), (overlap, i)


def _busy() -> None:
    """Keep the current stream busy for ≈ 50 ms (10^8 GPU clock cycles), so work on another stream
    that does not wait for it runs first."""
    torch.cuda._sleep(100_000_000)


@cuda_only
@pytest.mark.parametrize("broken", ["fork-without-wait", "join-without-wait"])
def test_overlap_check_catches_a_broken_stream_order(monkeypatch, broken):
    """The comparison above on a twin: a side stream that starts before level 0's states are made
    (the main stream held busy before them), or a join that does not wait for the side stream (the
    side stream held busy before the output)."""
    import contextlib

    import optimized.nested.level0 as level0_module
    import optimized.nested.fwd as fwd_module

    want = _op("none", seed=7)
    # another draw through the correct op first: the buffers the twin is handed hold that draw's
    # values (the caching allocator reuses the same blocks for the same sizes), not this draw's
    _op("fwd", seed=8)
    states, output = level0_module.level0_fwd_states, level0_module.level0_fwd_output

    if broken == "fork-without-wait":
        @contextlib.contextmanager
        def fork(enabled, device):
            stream = side_stream.side_stream(device)
            with torch.cuda.stream(stream):
                yield stream

        def slow_states(*a, **k):
            _busy()
            return states(*a, **k)

        monkeypatch.setattr(fwd_module, "fork", fork)
        monkeypatch.setattr(fwd_module, "level0_fwd_states", slow_states)
    else:
        def join(stream, *made):
            pass

        def slow_output(saved):
            _busy()
            return output(saved)

        monkeypatch.setattr(fwd_module, "join", join)
        monkeypatch.setattr(fwd_module, "level0_fwd_output", slow_output)
    got = _op("fwd", seed=7)
    same = all(torch.equal(a.nan_to_num(math.pi), b.nan_to_num(math.pi)) for a, b in zip(want, got))
    assert not same
