"""Warps per program for kernels that hold a float32 ``[BK, BV]`` tile in registers (the nested
reads kernels, the Fenwick GDN-2 scan and intra kernels)."""
from __future__ import annotations


def num_warps(BK: int, BV: int) -> int:
    """8 warps from a ``[64, 32]`` float32 tile on, 4 below: with 4, ptxas spills at K = 64,
    BV = 32 (sm_90, float32 and bf16; no spill with 8 up to K = 128, BV = 32 and K = 64, BV = 64;
    the reads kernels), and the Fenwick GDN-2 scan's ``[64, 128]`` operand tiles cost its forward
    435 ms of a 627 ms step with 4 (H200, 2026-11-30, ``bench/NOTES.md``)."""
    return 4 if BK * BV < 64 * 32 else 8
