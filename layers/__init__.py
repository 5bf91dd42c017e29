"""Attention layers in fla's conventions (``[B, T, D]`` in and out, training forward, no cache)
over this project's ops: ``NestedGDN2`` (``optimized.chunk_nested_gdn2``) and the flat arm
``GDN2`` (``optimized.chunk_gdn2``), each also runnable on its float64 reference
(``backend="reference"``).

Import ``optimized`` (which picks the device mode) before fla: this package does so first.
"""
import optimized  # noqa: F401  (device mode before fla's modules are imported)

from layers.gdn2 import GDN2
from layers.nested_gdn2 import NestedGDN2

__all__ = ["GDN2", "NestedGDN2"]
