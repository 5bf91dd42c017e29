"""The dot precision of the Fenwick GDN-2 kernels (``intra.py``, and ``states.py`` in float32
runs; their warps: ``optimized.warps``).

bf16 runs: TF32 tensor cores in ``intra.py`` (2^-11 per product, under bf16's own 2^-8; float32
accumulation). The carry scans (``states.py``) take their dot operands in the activations'
dtype instead, bf16, as fla's own GDN-2 state kernels do: the pre-states and ``vn`` they feed
into the dots are the bf16 values they store for fla's pieces anyway; the states stay float32
between chunks. float32 runs: IEEE float32 everywhere, as the float32 tolerances were measured.
On the H200 (bf16, B·T = 65536, H = 8, K = V = 128, T = 4096; 2026-11-30,
``bench/NOTES.md``) the IEEE dots cost the states forward 435 ms, the intra backward 82 ms and
the states backward 52 ms of a 627 ms step (13.2 ms for flat GDN-2): Triton lowers IEEE
float32 dots to FMA loops whose operand tiles (``[64, 128]`` float32, replicated across the
threads) do not fit the registers of 4 warps.
"""
from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """``"tf32"`` when the activations are bf16, ``"ieee"`` otherwise."""
    return "tf32" if dtype == torch.bfloat16 else "ieee"

