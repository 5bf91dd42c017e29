"""Production paths: fla-core's Triton kernels and ours behind validated entry points.

Importing this package first chooses the device mode (``optimized.triton_mode``):
compiled Triton on CUDA, Triton's interpreter on CPU tensors otherwise.
"""
from optimized import triton_mode

MODE = triton_mode.configure()

from optimized.gdn2 import chunk_gdn2  # noqa: E402  (after the mode is chosen)
from optimized.fenwick import chunk_fenwick  # noqa: E402  (Fenwick level router, SPEC section 5)
from optimized.tensor3d import chunk_tensor3d  # noqa: E402  (3D tensor state, SPEC section 4)
from optimized.nested import chunk_nested_gdn2  # noqa: E402  (Nested GDN-2, SPEC sections 2-3)

__all__ = ["MODE", "chunk_gdn2", "triton_mode"]
__all__ += ["chunk_fenwick"]
__all__ += ["chunk_tensor3d"]
__all__ += ["chunk_nested_gdn2"]
