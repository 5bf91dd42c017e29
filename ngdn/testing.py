"""Pytest helpers shared by ``tests/`` and ``property_tests/`` (pytest imported lazily)."""
from __future__ import annotations

import torch

from optimized import triton_mode


def on_cuda() -> bool:
    return triton_mode.configure() == triton_mode.CUDA


def kernel_dtypes():
    """Parameters for kernel dtypes in this mode: float32 always, bfloat16 on CUDA only."""
    import pytest

    return [
        pytest.param(torch.float32, id="float32"),
        pytest.param(torch.bfloat16, id="bfloat16", marks=pytest.mark.skipif(
            not on_cuda(), reason="bfloat16 kernels run on CUDA only (the interpreter has no bf16 dots)")),
    ]


def requires_cuda(reason: str):
    import pytest

    return pytest.mark.skipif(not on_cuda(), reason=f"needs CUDA: {reason}")
