"""The Fenwick GDN-2 kernels' dot precision and warp count (``optimized/fenwick_gdn2/precision.py``,
``optimized/warps.py``):
TF32 only for bf16 activations (float32 runs keep the IEEE dots their tolerances were measured
with), 8 warps from a ``[64, 32]`` tile on (4 warps spilled: 435 ms states forward on the H200)."""
import torch

from optimized.fenwick_gdn2.precision import dot_precision
from optimized.warps import num_warps


def test_tf32_only_for_bf16():
    assert dot_precision(torch.bfloat16) == "tf32"
    assert dot_precision(torch.float32) == "ieee"
    assert dot_precision(torch.float64) == "ieee"


def test_eight_warps_from_a_64_by_32_tile():
    assert num_warps(64, 32) == 8
    assert num_warps(128, 32) == 8
    assert num_warps(64, 64) == 8
    assert num_warps(32, 32) == 4
