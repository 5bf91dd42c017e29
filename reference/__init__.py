"""Executable spec: slow, readable per-token references of ../shared/SPEC.md.

PyTorch references are differentiable (autograd gives reference gradients);
``*_numpy`` twins compute in float64 with NumPy.
"""
from reference.gdn2 import gdn2_read, gdn2_step, naive_gdn2
from reference.gdn2_numpy import gdn2_step_numpy, naive_gdn2_numpy

__all__ = ["gdn2_read", "gdn2_step", "naive_gdn2", "gdn2_step_numpy", "naive_gdn2_numpy"]
