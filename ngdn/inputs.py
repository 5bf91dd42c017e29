"""Seeded, well-conditioned inputs for every op (one ``torch.Generator`` per draw).

Values are drawn in float64 on the CPU ("master" values). Tests cast them to the
kernel dtype for the optimized path and give the reference the *same* rounded
values in float64 (``as_reference``), so a measured error is the kernel's
arithmetic, not the input rounding.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class GDN2Shape(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    V: int


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def rand(gen, *shape):
    return torch.rand(*shape, generator=gen, dtype=torch.float64)


def gdn2_inputs(shape: GDN2Shape, seed: int, initial_state: bool = True) -> dict:
    """GDN-2 inputs (SPEC section 1) in float64.

    ``k`` is unit-norm and ``b, w ∈ (0, 1)``, so every token transition is
    non-expansive and long sequences stay bounded; ``g ∈ (-1.5, 0)`` per channel.
    Also draws cotangents ``do``, ``dht`` for a loss ``Σ o·do + Σ S_T·dht``.
    """
    B, T, H, K, V = shape
    gen = generator(seed)
    x = {
        "q": randn(gen, B, T, H, K),
        "k": F.normalize(randn(gen, B, T, H, K), dim=-1),
        "v": randn(gen, B, T, H, V),
        "g": F.logsigmoid(randn(gen, B, T, H, K) + 2.5),
        "b": torch.sigmoid(randn(gen, B, T, H, K)),
        "w": torch.sigmoid(randn(gen, B, T, H, V)),
        "initial_state": 0.5 * randn(gen, B, H, K, V) if initial_state else None,
        "do": randn(gen, B, T, H, V),
        "dht": randn(gen, B, H, K, V),
    }
    return x


def cast(x: torch.Tensor | None, dtype, device="cpu", requires_grad=False):
    """``x`` rounded to ``dtype`` on ``device`` as a fresh leaf."""
    if x is None:
        return None
    return x.to(device=device, dtype=dtype).detach().requires_grad_(requires_grad)


def as_reference(x: torch.Tensor | None, dtype, requires_grad=False):
    """The float64 CPU twin of ``cast(x, dtype)``: same rounded values."""
    if x is None:
        return None
    return x.to(dtype).to(torch.float64).detach().requires_grad_(requires_grad)
