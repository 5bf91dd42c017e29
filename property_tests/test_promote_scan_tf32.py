"""The promote scan with TF32 dots (``precision="tf32"``, what the nested op uses in bf16 runs,
both directions): the argument is checked, the nested op picks it by dtype, and on a GPU the
TF32 scan equals ``reference.promote`` within the ``promote_scan``/``tf32`` bounds on draws
with several pair blocks, at the forward's default V block (one block: V ≤ 128) and at V blocks
of 32 (several, the last ragged), differs from the IEEE scan (the precision reaches the kernel),
and a dropped middle V-block partial still fails."""
import functools

import pytest
import torch

from ngdn.checks import nested_optimized as checks
import nested_optimized_mutants as mutants
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized import triton_mode
from optimized.nested.pieces import scan_precision
from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd
from optimized.nested.promote_scan_two_phase import promote_scan_bwd_two_phase

Draw = checks.ScanDraw
# CUDA's default blocks in TF32 are BV = 128 (the forward: one V block here) and 64 (the reverse),
# BN = 16: V = 80 is three V blocks of 32 (the forward's ``block_v=32`` case) and two of 64, the
# last ragged, n = 44 three pair blocks (the last ragged), n = 112 seven.
DRAWS = [Draw(B=2, F=6, H=2, K=48, V=80, n=44, scheme="learned", seed=1),
         Draw(B=1, F=5, H=2, K=112, V=112, n=112, scheme="merge", reduction="sum", seed=2),
         Draw(B=1, F=4, H=1, K=80, V=48, n=40, scheme="bounded_erase", seed=3)]
cuda_only = pytest.mark.skipif(not on_cuda(), reason="the interpreter computes every dot in float32")


def test_precision_is_checked():
    x = checks.scan_inputs(DRAWS[0]._replace(K=16, V=16, n=4, F=1))
    pairs = [p.float() for p in x["pairs"]]
    with pytest.raises(ValueError, match="precision must be one of"):
        promote_scan_fwd(x["M0"].float(), *pairs, precision="bf16")
    with pytest.raises(ValueError, match="precision must be one of"):
        promote_scan_bwd(x["M0"].float()[:, None].expand(-1, 2, -1, -1, -1).contiguous(), *pairs,
                         x["M0"].float()[:, None].expand(-1, 2, -1, -1, -1).contiguous(), precision="tf16")


def test_nested_op_picks_tf32_for_bf16_scans_only():
    assert scan_precision(torch.bfloat16, "bwd") == scan_precision(torch.bfloat16, "fwd") == "tf32"
    assert scan_precision(torch.float32, "bwd") == scan_precision(torch.float32, "fwd") == "ieee"
    with pytest.raises(ValueError, match="direction"):
        scan_precision(torch.bfloat16, "forward")


def _tf32(fn, **kw):
    return functools.partial(fn, precision="tf32", **kw)


@cuda_only
@pytest.mark.parametrize("fwd_block_v", [None, 32], ids=["fwd-default", "fwd-bv32"])
@pytest.mark.parametrize("scan_bwd", [promote_scan_bwd, promote_scan_bwd_two_phase], ids=["fused", "two_phase"])
@pytest.mark.parametrize("d", DRAWS, ids=lambda d: f"{d.scheme}-K{d.K}-V{d.V}-n{d.n}")
def test_tf32_scan_equals_reference(d, scan_bwd, fwd_block_v):
    assert_passes(checks.scan_vs_reference(d, scan_fwd=_tf32(promote_scan_fwd, block_v=fwd_block_v),
                                           scan_bwd=_tf32(scan_bwd), tolerance_dtype="tf32"))


def test_tf32_forward_defaults_to_one_v_block_up_to_128():
    from optimized.nested.promote_scan import block_sizes
    assert block_sizes(128, 128, 16, precision="tf32")[2] == 128
    assert block_sizes(48, 80, 44, precision="tf32")[2] == 128     # masked past V = 80
    assert block_sizes(128, 128, 16)[2] == 32                       # IEEE
    assert block_sizes(128, 128, 16, reverse=True, precision="tf32")[2] == 64
    assert block_sizes(256, 256, 16, precision="tf32")[2] == 16     # K > 128


@cuda_only
def test_tf32_reaches_the_kernel():
    x = checks.scan_inputs(DRAWS[0])
    dev = triton_mode.device()
    M0, *pairs = (t.to(dev, torch.float32) for t in (x["M0"], *x["pairs"]))
    ieee = promote_scan_fwd(M0, *pairs)
    tf32 = promote_scan_fwd(M0, *pairs, precision="tf32")
    assert not torch.equal(ieee, tf32), "TF32 and IEEE scans agree bit for bit: the precision is not used"


@cuda_only
def test_tf32_bounds_catch_dropped_partials():
    d = DRAWS[0]
    bwd = _tf32(promote_scan_bwd, block_v=32, reduce_partials=mutants.sum_outer_partials)   # three V blocks
    bad = failures(checks.scan_vs_reference(d, scan_fwd=_tf32(promote_scan_fwd), scan_bwd=bwd, log=False,
                                            tolerance_dtype="tf32"))
    assert {"dkappa", "dbeta", "dgamma"} <= set(bad), bad


def test_tf32_forward_only_where_its_programs_fill_the_gpu(monkeypatch):
    """``forward_precision``: on a GPU of 132 SMs the TF32 forward (one V block per (batch, head))
    is kept above 66 programs and becomes IEEE at 66 and below; IEEE requests and the
    interpreter's device are left alone."""
    from types import SimpleNamespace

    from optimized.nested.promote_scan import forward_precision
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    assert forward_precision("tf32", 128, "cuda") == forward_precision("tf32", 67, "cuda") == "tf32"
    assert forward_precision("tf32", 66, "cuda") == forward_precision("tf32", 32, "cuda") == "ieee"
    assert forward_precision("ieee", 512, "cuda") == "ieee"
    assert forward_precision("tf32", 1, "cpu") == "tf32"
    with pytest.raises(ValueError, match="precision must be one of"):
        forward_precision("fp8", 128, "cuda")
