"""Executable spec: slow, readable per-token references of the contract in docs/CONTRACT.md
(the project's restatement of the shared contract).

PyTorch references are differentiable (autograd gives reference gradients);
``*_numpy`` twins compute in float64 with NumPy.
"""
# GDN-2 level 0 (CONTRACT §1)
from reference.gdn2 import gdn2_read, gdn2_step, naive_gdn2
from reference.gdn2_numpy import gdn2_step_numpy, naive_gdn2_numpy
# Promote and Nested GDN-2 (CONTRACT §2-3)
from reference.schemes import SCHEMES, get_scheme, register_scheme
from reference.promote import promote, promote_sequential
from reference.nested import (Level, default_intervals, default_query_counts, make_levels,
                              naive_nested_gdn2, validate_nested_inputs)
from reference.promote_numpy import SCHEMES_NUMPY, promote_numpy, promote_sequential_numpy
from reference.nested_numpy import naive_nested_gdn2_numpy
# 3D tensor state, two-key linear attention (CONTRACT §4)
from reference.tensor3d import (broadcast_gate, naive_tensor3d, second_features, second_query_key,
                                state_size, tensor3d_read, tensor3d_step)
from reference.tensor3d_numpy import naive_tensor3d_numpy, tensor3d_step_numpy
# Fenwick level router (CONTRACT §5)
from reference.fenwick import (fenwick_level, fenwick_level_matrix, min_levels, naive_fenwick,
                               naive_fenwick_gdn2, quadratic_fenwick)
from reference.fenwick_numpy import naive_fenwick_gdn2_numpy, naive_fenwick_numpy, quadratic_fenwick_numpy

__all__ = [
    "gdn2_read", "gdn2_step", "naive_gdn2", "gdn2_step_numpy", "naive_gdn2_numpy",
    "SCHEMES", "get_scheme", "register_scheme", "promote", "promote_sequential", "Level",
    "default_intervals", "default_query_counts", "make_levels", "naive_nested_gdn2",
    "validate_nested_inputs", "SCHEMES_NUMPY", "promote_numpy", "promote_sequential_numpy",
    "naive_nested_gdn2_numpy",
    "broadcast_gate", "naive_tensor3d", "second_features", "second_query_key", "state_size",
    "tensor3d_read", "tensor3d_step", "naive_tensor3d_numpy", "tensor3d_step_numpy",
    "fenwick_level", "fenwick_level_matrix", "min_levels", "naive_fenwick", "naive_fenwick_gdn2",
    "quadratic_fenwick", "naive_fenwick_numpy", "naive_fenwick_gdn2_numpy", "quadratic_fenwick_numpy",
]
