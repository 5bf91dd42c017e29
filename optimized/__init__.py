"""Production paths: fla-core's Triton kernels and ours behind validated entry points.

Importing this package first chooses the device mode (``optimized.triton_mode``):
compiled Triton on CUDA, Triton's interpreter on CPU tensors otherwise.
"""
from optimized import triton_mode

MODE = triton_mode.configure()

from optimized.gdn2 import chunk_gdn2  # noqa: E402  (after the mode is chosen)

__all__ = ["MODE", "chunk_gdn2", "triton_mode"]
