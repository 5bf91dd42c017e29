"""The scheme parameters' casts, all parameters in one launch each way.

The kernels read the scheme parameters in float32 and make float32 gradients; parameters held in
another dtype (bf16 in a bf16 run) then need a cast to float32 in the forward and their gradients
a cast back. Cast one tensor at a time, that is a launch per parameter and pass: at L = 4 with the
learned scheme 15 in the forward and 15 back, each a host call in a step whose pace the host can
set (head dim 64: bench/NOTES.md). Here every parameter that needs the cast goes through one
``cat`` and one cast, and comes back as views of that one buffer. Float32 tensors pass through
untouched (no copy). The views into and out of the one buffer are made by torch's own flatten
and unflatten (C++: no Python call per parameter).
"""
from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def _cast_together(tensors: list, dtypes: list) -> list:
    """``tensors[i]`` cast to ``dtypes[i]``: those already in it as they are, the others as views
    of one buffer per target dtype (one ``cat`` and one cast per target dtype)."""
    out = list(tensors)
    for dtype in {d for t, d in zip(tensors, dtypes) if t is not None and t.dtype != d}:
        idx = [i for i, (t, d) in enumerate(zip(tensors, dtypes)) if t is not None and d == dtype and t.dtype != d]
        if len(idx) == 1:
            out[idx[0]] = tensors[idx[0]].to(dtype)
            continue
        # torch's flatten / unflatten (those of its distributed buckets): the same cat, and the
        # views in and out made in C++, not a Python call each (2 x 25 at L = 6)
        group = [tensors[i] for i in idx]
        for i, part in zip(idx, _unflatten_dense_tensors(_flatten_dense_tensors(group).to(dtype), group)):
            out[i] = part
    return out


def float32_params(groups: list) -> list:
    """Each group (a ``{name: tensor}`` or None) with its tensors detached and in float32; the
    groups' non-float32 tensors are cast together (module docstring). Without grad mode (the
    nested Function's forward) a cast copy records no graph: only the tensors passed through are
    detached (one call each), not every parameter before the cast."""
    grad = torch.is_grad_enabled()
    flat = [t.detach() if grad else t for g in groups if g is not None for t in g.values()]
    cast = iter(_cast_together(flat, [torch.float32] * len(flat)))
    return [None if g is None else {name: _detached(next(cast)) for name in g} for g in groups]


def _detached(t: torch.Tensor) -> torch.Tensor:
    return t.detach() if t.requires_grad else t


def cast_like(grads: list, likes: list) -> list:
    """``grads[i]`` (a tensor or None) in ``likes[i]``'s dtype; those that need it cast together
    (module docstring)."""
    return _cast_together(grads, [like.dtype for like in likes])
