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


def cu_seqlens_read_by_pointer(op):
    """Packed calls: ``cu_seqlens`` read as a kernel reads it by pointer, its stride ignored (a
    strided view's gaps read as entries)."""
    def twin(cu_seqlens=None, **kwargs):
        if cu_seqlens is not None and not cu_seqlens.is_contiguous():
            cu_seqlens = torch.as_strided(cu_seqlens, cu_seqlens.shape, (1,), cu_seqlens.storage_offset())
        return op(**kwargs, cu_seqlens=cu_seqlens)
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


def _first_rows(value):
    """A per-sequence initial state (a tensor or a list of them) cut to its first sequence."""
    if isinstance(value, (list, tuple)):
        return [None if x is None else x[:1] for x in value]
    return None if value is None else value[:1]


def _repeated(final, N):
    if final is None:
        return None
    if isinstance(final, (list, tuple)):
        return [f.expand(N, *f.shape[1:]) for f in final]
    return final.expand(N, *final.shape[1:])


def cu_seqlens_dropped(argument):
    """Packed batches: ``cu_seqlens`` ignored, the packed row run as one sequence from the first
    sequence's initial state (each sequence's state carried into the next; its final state
    reported for every sequence)."""
    def make(op):
        def twin(**kwargs):
            kwargs = dict(kwargs)
            N = kwargs.pop("cu_seqlens").shape[0] - 1
            if argument is not None and kwargs.get(argument) is not None:
                kwargs[argument] = _first_rows(kwargs[argument])
            o, final = op(**kwargs)
            return o, _repeated(final, N)
        return twin
    return make


CHUNK = 64


def packed_chunk_grid(argument):
    """Packed batches: every sequence run on the packed row's chunk grid instead of its own:
    its front padded with ``start mod 64`` zero tokens (which write and decay nothing), so its
    chunk ends, firings and Fenwick counter are those of its place in the packed row."""
    def make(op):
        def twin(**kwargs):
            kwargs = dict(kwargs)
            bounds = kwargs.pop("cu_seqlens").tolist()
            T = bounds[-1]
            packed = {n for n, x in kwargs.items()
                      if n != argument and isinstance(x, torch.Tensor) and x.dim() >= 3 and tuple(x.shape[:2]) == (1, T)}
            outputs, finals = [], []
            for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
                pad = s % CHUNK
                call = dict(kwargs)
                for n in packed:
                    x = kwargs[n][:, s:e]
                    call[n] = torch.cat([x.new_zeros((1, pad) + tuple(x.shape[2:])), x], dim=1)
                if argument is not None and kwargs.get(argument) is not None:
                    value = kwargs[argument]
                    call[argument] = ([None if x is None else x[i:i + 1] for x in value]
                                      if isinstance(value, (list, tuple)) else value[i:i + 1])
                o, final = op(**call)
                outputs.append(o[:, pad:])
                finals.append(final)
            if finals[0] is None:
                final = None
            elif isinstance(finals[0], (list, tuple)):
                final = [torch.cat([f[l] for f in finals], dim=0) for l in range(len(finals[0]))]
            else:
                final = torch.cat(finals, dim=0)
            return torch.cat(outputs, dim=1), final
        return twin
    return make
