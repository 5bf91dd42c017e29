"""Broken twins of any table op, one per generic property (``ngdn.checks.generic``): each must
make its property fail. They wrap the real op, so every entry of ``ngdn.ops`` gets them."""
from __future__ import annotations

import contextlib

import torch


def _first_tensor(kwargs):
    return next(v for v in kwargs.values() if isinstance(v, torch.Tensor))


def noisy(op):
    """Bitwise: a different rounding each call (as an atomic-add reduction would give)."""
    def twin(**kwargs):
        o, final = op(**kwargs)
        return o + 1e-6 * o.detach().abs().max() * torch.rand_like(o), final
    return twin


def state_dropped(argument):
    """State passing: the passed state(s) ignored (each call starts from zero)."""
    def make(op):
        def twin(**kwargs):
            kwargs = dict(kwargs)
            kwargs[argument] = None
            return op(**kwargs)
        return twin
    return make


@contextlib.contextmanager
def second_order_unguarded():
    """Second order: the refusal switched off, so a ``create_graph=True`` gradient comes back
    without its graph (what fla's Functions do)."""
    import optimized.autograd as autograd

    saved = autograd.refuse_second_order
    autograd.refuse_second_order = lambda op: None
    try:
        yield
    finally:
        autograd.refuse_second_order = saved


def grad_mode_dependent(op):
    """Grad modes: a different value when autograd is off (a cached or fused path gone wrong)."""
    def twin(**kwargs):
        o, final = op(**kwargs)
        return (o if torch.is_grad_enabled() else o + 1e-3), final
    return twin


def strides_ignored(op):
    """Layouts: every activation read as if it were contiguous (its strides ignored)."""
    def contiguous_strides(shape):
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))

    def twin(**kwargs):
        kwargs = {n: (torch.as_strided(x, x.shape, contiguous_strides(x.shape), x.storage_offset())
                      if isinstance(x, torch.Tensor) and x.dim() >= 4 and not x.is_contiguous() else x)
                  for n, x in kwargs.items()}
        return op(**kwargs)
    return twin


def last_token_unwritten(op):
    """Uninitialised memory: the output's last token copied from a buffer nobody wrote."""
    def twin(**kwargs):
        o, final = op(**kwargs)
        out = torch.empty_like(o)
        out = torch.cat([o[:, :-1], out[:, -1:]], dim=1)
        return out, final
    return twin


def crashes_without_heads(op):
    """Edge shapes: H = 0 ends in an obscure error inside a kernel launch."""
    def twin(**kwargs):
        if _first_tensor(kwargs).shape[2] == 0:
            raise ZeroDivisionError("integer modulo by zero")
        return op(**kwargs)
    return twin
