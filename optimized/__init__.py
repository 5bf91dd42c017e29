"""Production paths: fla-core's Triton kernels and ours behind validated entry points.

Importing this package first chooses the device mode (``optimized.triton_mode``):
compiled Triton on CUDA, Triton's interpreter on CPU tensors otherwise.

The exported ops work under ``torch.compile(fullgraph=True)``: each is its module's function
behind ``optimized.compile.compilable``, unchanged in eager mode and one opaque custom operator
(``ngdn::<name>``) while compiling.
"""
from optimized import triton_mode

MODE = triton_mode.configure()

# The kernel modules import fla and Triton kernels: only after the mode is chosen.
from optimized import fenwick, fenwick_gdn2, gdn2, nested, tensor3d  # noqa: E402
from optimized.compile import compilable  # noqa: E402

chunk_gdn2 = compilable("chunk_gdn2", gdn2.chunk_gdn2)                          # GDN-2 level 0 (CONTRACT §1)
chunk_nested_gdn2 = compilable("chunk_nested_gdn2", nested.chunk_nested_gdn2)   # Nested GDN-2 (CONTRACT §2-3)
chunk_tensor3d = compilable("chunk_tensor3d", tensor3d.chunk_tensor3d)          # 3D tensor state (CONTRACT §4)
chunk_fenwick = compilable("chunk_fenwick", fenwick.chunk_fenwick)              # Fenwick level router (CONTRACT §5)
chunk_fenwick_gdn2 = compilable("chunk_fenwick_gdn2", fenwick_gdn2.chunk_fenwick_gdn2)  # Fenwick GDN-2 (CONTRACT §5)

__all__ = ["MODE", "triton_mode", "chunk_gdn2", "chunk_nested_gdn2", "chunk_tensor3d", "chunk_fenwick",
           "chunk_fenwick_gdn2"]
