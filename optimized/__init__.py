"""Production paths: fla-core's Triton kernels and ours behind validated entry points.

Importing this package first chooses the device mode (``optimized.triton_mode``):
compiled Triton on CUDA, Triton's interpreter on CPU tensors otherwise.
"""
from optimized import triton_mode

MODE = triton_mode.configure()

# The kernel modules import fla and Triton kernels: only after the mode is chosen.
from optimized.gdn2 import chunk_gdn2  # noqa: E402            GDN-2 level 0 (SPEC §1)
from optimized.nested import chunk_nested_gdn2  # noqa: E402   Nested GDN-2 (SPEC §2-3)
from optimized.tensor3d import chunk_tensor3d  # noqa: E402    3D tensor state (SPEC §4)
from optimized.fenwick import chunk_fenwick  # noqa: E402      Fenwick level router (SPEC §5)
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2  # noqa: E402  Fenwick GDN-2 memory (SPEC §5)

__all__ = ["MODE", "triton_mode", "chunk_gdn2", "chunk_nested_gdn2", "chunk_tensor3d", "chunk_fenwick",
           "chunk_fenwick_gdn2"]
