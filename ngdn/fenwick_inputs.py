"""Seeded float64 inputs for the Fenwick level router (CONTRACT section 5).

Same conventions as ``ngdn.inputs``: one ``torch.Generator`` per draw, float64
CPU "master" values; tests ``cast`` them for the optimized path and give the
reference the same rounded values (``as_reference``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ngdn.inputs import GDN2Shape, check_regime, extreme_log_decay, extreme_logits, gdn2_inputs, generator, randn
from reference.fenwick import min_levels


class FenwickShape(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    V: int
    extra_levels: int = 0   # L = 1 + ceil(log2 T) + extra_levels

    @property
    def L(self) -> int:
        return min_levels(self.T) + self.extra_levels


def level_scales(gen, B, T, H, L):
    """Router weights ``λ ∈ (0, 1)``, one per token, head and level."""
    return torch.sigmoid(randn(gen, B, T, H, L))


def extreme_level_scales(gen, λ: torch.Tensor) -> torch.Tensor:
    """``λ`` with logits ±30 on some entries (``ngdn.inputs.extreme_logits``): ``λ = σ(±30)``,
    within 1e-13 of 0 or 1."""
    return torch.sigmoid(extreme_logits(gen, torch.logit(λ)))


def fenwick_inputs(shape: FenwickShape, seed: int, regime: str = "typical") -> dict:
    """Scalar-decay inputs: ``q`` Gaussian, ``k`` unit-norm, ``v`` Gaussian,
    ``g ∈ (-1.5, 0)``-ish per token and head (``logsigmoid(N(2.5, 1))``), ``λ ∈ (0, 1)``,
    and an output cotangent ``do``. Bucket states stay bounded: each is a decayed sum
    of unit-key outer products.

    ``do = v + N(0, 1/4)``, not independent of ``v``: at ``T = 1`` (and ``B = H = 1``)
    ``dq``, ``dk`` and ``dλ`` are each one multiple of the single dot product
    ``do_0 · v_0``; an independent draw can make it cancel (one seed in 300 gave
    ``cos(do, v) = 7e-5`` and a float32 relative error of 3e-4 in all three), so their
    relative error is unbounded though the kernel is right. Correlated, it cannot cancel.

    ``regime="extreme"`` (``ngdn.inputs.REGIMES``): after the typical draw, from the same
    generator, log-decays down to -20 and below on some tokens (and some near 0) and router
    logits ±30 on some entries."""
    check_regime(regime)
    B, T, H, K, V, _ = shape
    gen = generator(seed)
    x = {
        "q": randn(gen, B, T, H, K),
        "k": F.normalize(randn(gen, B, T, H, K), dim=-1),
        "v": randn(gen, B, T, H, V),
        "g": F.logsigmoid(randn(gen, B, T, H) + 2.5),
        "level_scales": level_scales(gen, B, T, H, shape.L),
    }
    x["do"] = x["v"] + 0.5 * randn(gen, B, T, H, V)
    if regime == "extreme":
        x["g"] = extreme_log_decay(gen, x["g"])
        x["level_scales"] = extreme_level_scales(gen, x["level_scales"])
    return x


def fenwick_gdn2_inputs(shape: FenwickShape, seed: int, regime: str = "typical") -> dict:
    """GDN-2-variant inputs: ``ngdn.inputs.gdn2_inputs`` (no initial state) plus ``λ``
    drawn from a second generator seeded from the same seed (``regime`` applies to both)."""
    check_regime(regime)
    B, T, H, K, V, _ = shape
    x = gdn2_inputs(GDN2Shape(B, T, H, K, V), seed, initial_state=False, regime=regime)
    del x["initial_state"], x["dht"]
    gen = generator(seed ^ 0x5EED)
    x["level_scales"] = level_scales(gen, B, T, H, shape.L)
    if regime == "extreme":
        x["level_scales"] = extreme_level_scales(gen, x["level_scales"])
    return x


def ones_level_scales(x: dict) -> torch.Tensor:
    """``λ ≡ 1`` shaped like ``x["level_scales"]``."""
    return torch.ones_like(x["level_scales"])


__all__ = ["FenwickShape", "fenwick_inputs", "fenwick_gdn2_inputs", "level_scales", "ones_level_scales"]
