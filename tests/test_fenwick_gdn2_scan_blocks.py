"""The Fenwick GDN-2 carry scans agree with the reference at every launch width.

A scan program holds the same ``BV`` value columns of every stacked block (``states.block_sizes``:
``width`` columns in all), so the width sets how many V blocks a launch has and how wide each is.
The op runs the default width; here each width the launchers accept is run. Narrow tiles are
where Triton 3.6 went wrong on the H200: an earlier form of these scans miscompiled at
``[128, 16]`` with 8 warps (``dh`` off by up to 78 with no error, or an illegal memory access;
``results/2026-12-02-scan-launch-and-fenwick-h200/``), and this form hit illegal accesses at
16 and 32 columns (``states.block_sizes``, which refuses them). Three chunks
(carries with m = 0 and 1, two bucket blocks and the own block), B = H = 2, several V blocks,
the last one ragged at width 32; on CUDA the level-0 compile bucket "b" (K = 112, V = 100), whose
fla pieces the other properties compile already.
"""
from unittest import mock

import pytest
import torch

from ngdn.checks import fenwick_gdn2 as checks
from ngdn.compile_buckets import on_bucket
from ngdn.fenwick_inputs import FenwickShape
from ngdn.testing import kernel_dtypes, on_cuda
from ngdn.tolerances import assert_passes, failures
from optimized.fenwick_gdn2 import states as S
from property_tests.kernel_mutation import Plant, planted

SHAPE = on_bucket(FenwickShape(B=2, T=130, H=2, K=16, V=20), index=1)
WIDTHS = (64, 128) if on_cuda() else (64,)


@pytest.mark.parametrize("dtype", kernel_dtypes())
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.compiles
def test_every_scan_width_equals_reference(width, dtype):
    J, n_own = 2, 1
    BK, NBP, BV = S.block_sizes(SHAPE.K, SHAPE.V, J + n_own, width)
    assert -(-SHAPE.V // BV) >= 2, "the draw must span several V blocks"
    with mock.patch.object(S, "WIDTH", width):
        assert_passes(checks.optimized_vs_reference(SHAPE, 11, dtype))


# Every program reads and writes the first V block's columns (the V-block offset dropped).
V_BLOCK_OFFSET_DROPPED = Plant(S, "_columns", "o_v = i_v * BV + o_c % BV", "o_v = o_c % BV",
                               rebind=((S, "fenwick_states_fwd_kernel"), (S, "fenwick_states_bwd_kernel")))


@pytest.mark.mutation
@pytest.mark.compiles
def test_every_scan_width_catches_a_dropped_v_block_offset():
    with planted(V_BLOCK_OFFSET_DROPPED), mock.patch.object(S, "WIDTH", 64):
        bad = failures(checks.optimized_vs_reference(SHAPE, 11, torch.float32, log=False))
    assert {"output", "final_state", "dv"} <= set(bad), bad


def test_the_drawn_widths_reach_a_ragged_v_block():
    for width in WIDTHS:
        BK, NBP, BV = S.block_sizes(SHAPE.K, SHAPE.V, 3, width)
        assert SHAPE.V > BV
    BK, NBP, BV = S.block_sizes(SHAPE.K, SHAPE.V, 3, 64)
    assert SHAPE.V % BV != 0


def test_block_sizes_and_launch_options_are_checked():
    assert S.block_sizes(128, 128, 11) == (128, 16, 8)
    assert S.block_sizes(128, 128, 7) == (128, 8, 16)
    assert S.block_sizes(48, 80, 3) == (64, 4, 32)
    assert S.block_sizes(16, 8, 1) == (16, 4, 16)          # never fewer than 4 blocks and 64 columns
    assert S.block_sizes(48, 80, 2) == (64, 4, 32)
    assert S.block_sizes(16, 8, 40, 64) == (16, 64, 1)     # at least one column per block
    assert S.block_sizes(16, 8, 3, block_k=64) == (64, 4, 16)
    for bad in (16, 32, 48, 0, True, 64.0):
        with pytest.raises(ValueError, match="width"):
            S.block_sizes(16, 16, 3, bad)
    for bad in (8, 24, 96):
        with pytest.raises(ValueError, match="block_k"):
            S.block_sizes(24, 16, 3, None, bad)
    for bad in (0, 3, 7, 2.0, True):
        with pytest.raises(ValueError, match="num_stages"):
            S.launch_options(128, 8, 16, bad)
    assert S.launch_options(128, 8, 16, None) == {"num_warps": 8, "num_stages": 2}
    assert S.launch_options(16, 1, 64, 1) == {"num_warps": 4, "num_stages": 1}
