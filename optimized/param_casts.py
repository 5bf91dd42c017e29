"""The scheme parameters' casts, all parameters in one launch each way.

The kernels read the scheme parameters in float32 and make float32 gradients; parameters held in
another dtype (bf16 in a bf16 run) then need a cast to float32 in the forward and their gradients
a cast back. Cast one tensor at a time, that is a launch per parameter and pass: at L = 4 with the
learned scheme 15 in the forward and 15 back, each a host call in a step whose pace the host can
set (head dim 64: bench/NOTES.md). Here every parameter that needs the cast goes through one
``cat`` and one cast, and comes back as views of that one buffer. Float32 tensors pass through
untouched (no copy).
"""
from __future__ import annotations

import torch


def _cast_together(tensors: list, dtypes: list) -> list:
    """``tensors[i]`` cast to ``dtypes[i]``: those already in it as they are, the others as views
    of one buffer per target dtype (one ``cat`` and one cast per target dtype)."""
    out = list(tensors)
    for dtype in {d for t, d in zip(tensors, dtypes) if t is not None and t.dtype != d}:
        idx = [i for i, (t, d) in enumerate(zip(tensors, dtypes)) if t is not None and d == dtype and t.dtype != d]
        if len(idx) == 1:
            out[idx[0]] = tensors[idx[0]].to(dtype)
            continue
        flat = torch.cat([tensors[i].reshape(-1) for i in idx]).to(dtype)
        for i, part in zip(idx, flat.split([tensors[i].numel() for i in idx])):
            out[i] = part.view(tensors[i].shape)
    return out


def float32_params(groups: list) -> list:
    """Each group (a ``{name: tensor}`` or None) with its tensors detached and in float32; the
    groups' non-float32 tensors are cast together (module docstring)."""
    flat = [t.detach() for g in groups if g is not None for t in g.values()]
    cast = iter(_cast_together(flat, [torch.float32] * len(flat)))
    return [None if g is None else {name: next(cast) for name in g} for g in groups]


def cast_like(grads: list, likes: list) -> list:
    """``grads[i]`` (a tensor or None) in ``likes[i]``'s dtype; those that need it cast together
    (module docstring)."""
    return _cast_together(grads, [like.dtype for like in likes])
