"""First-order gradients only: the optimized ops' refusal of second-order differentiation.

Every optimized op's backward is hand-written or fla's: its gradients are computed by kernels
that record no graph. A ``torch.autograd.grad(..., create_graph=True)`` through such an op would
return a first-order gradient that silently lacks its graph (a gradient penalty's term lost
without a word). CONTRACT "Errors" (autograd beyond one backward) asks for correct second-order
gradients or a clear refusal: these ops refuse.

Mechanism: ``first_order_only(op, *tensors)`` routes the op's differentiable inputs through an
identity ``autograd.Function`` whose backward raises when autograd runs it with a graph being
built (the engine runs backward functions in grad mode exactly when ``create_graph=True``).
The identity returns views, so it costs no copy; it sits on the inputs, not the outputs, so the
tensors a caller receives are the op's own (free to modify in place). An op whose own
``autograd.Function`` takes every differentiable input may instead call ``refuse_second_order``
first thing in its backward (the nested op: no identity node, no views a call).
"""
from __future__ import annotations

import torch


def refuse_second_order(op: str) -> None:
    """Raise if the running backward builds a graph (``create_graph=True``)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{op} supports first-order gradients only: its backward runs kernels that record no "
            "graph, so a second-order gradient (torch.autograd.grad(..., create_graph=True), a "
            "gradient penalty, double backward) through it is refused rather than returned without "
            "its graph. Use the reference (reference/, float64 autograd) for higher-order gradients."
        )


class _FirstOrderOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, *xs):
        ctx.op = op
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        refuse_second_order(ctx.op)
        return (None, *grads)


def first_order_only(op: str, *xs):
    """``xs`` (tensors or None) unchanged in value; gradients through them refuse
    ``create_graph=True`` with an error naming ``op``. Tensors that need no gradient, and every
    call made without autograd recording, pass through untouched."""
    if not torch.is_grad_enabled():
        return xs
    idx = [i for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not idx:
        return xs
    guarded = _FirstOrderOnly.apply(op, *(xs[i] for i in idx))
    out = list(xs)
    for i, x in zip(idx, guarded):
        out[i] = x
    return tuple(out)


def graph_kept() -> bool:
    """Whether the running backward was asked to keep the graph (``retain_graph=True``).
    An op whose backward frees its own saved state as it goes (tensors held in a Python object
    on ``ctx``, which autograd does not free) asks this first: without the (private) query it
    keeps everything, which is correct, only held until the graph is dropped."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


def empty_result(shape, dtype, device, inputs):
    """Zeros of ``shape`` (a batch or head count is 0, so this holds no element) for an op
    whose kernels cannot launch an empty grid: still attached to ``inputs``' graph, so a loss
    over it back-propagates (every input's gradient is then an empty zero tensor)."""
    out = torch.zeros(shape, dtype=dtype, device=device)
    grads = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if grads and torch.is_grad_enabled():
        out = out + sum(x.sum() for x in grads).to(dtype) * 0
    return out
