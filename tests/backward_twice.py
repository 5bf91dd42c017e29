"""The second-backward check the optimized ops that free their saved state share.

An op whose backward frees its saved state as it goes (``optimized.autograd.graph_kept``) must
keep it under ``retain_graph=True`` (a second backward then agrees bit for bit) and refuse a
backward after a plain one with a message saying what to do, not fail somewhere inside.
"""
import pytest
import torch


def check_backward_twice(o, leaves, do):
    first = torch.autograd.grad(o, leaves, do, retain_graph=True)
    second = torch.autograd.grad(o, leaves, do)
    for a, b in zip(first, second):     # the same kernels on the same saved tensors: bit for bit
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="pass retain_graph=True to the first backward"):
        torch.autograd.grad(o, leaves, do)
