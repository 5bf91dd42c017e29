"""Seeded, well-conditioned inputs for Nested GDN-2 (CONTRACT section 3), float64 masters.

Level 0 is drawn as in ``ngdn.inputs.gdn2_inputs`` (unit-norm ``k``, ``b, w ∈ (0, 1)``,
``g ∈ (-1.5, 0)`` per channel). Router logits ``r ~ N(0, 1)``; initial states
``0.5·N(0, 1)``; scheme parameters from ``reference.nested.make_levels`` (the scales are
documented there) with the same generator.

Keeping the float64 reference finite (CONTRACT section 2, "Hazard"). ``β = σ(ν W_β)`` has
no bias, so no choice of ``W_β`` makes ``Σ_i β_i < 1``: small weights give β ≈ ½ for
every pair. What keeps a firing bounded is key overlap and decay: with ``W_γ`` small
each firing decays the level by ``e^γ ≈ e^{-softplus(0)} = ½``, and with few, well
spread keys the erase ``I - κ^T (β ⊙ κ)`` has norm about 1. Measured (``learned``, K=V=16,
β ≈ ½, 5 levels, 64 firings per level): ``n = K`` grows without bound (1e23 after 64
firings; the Gram matrix of K random unit keys has top eigenvalue ≈ 4, so the erase
has an eigenvalue ≈ 1 - ½·4·(1 + spread)), ``V < n`` likewise (1e26 at K=16, V=4, n=16),
while ``n ≤ K/2`` with ``n ≤ V`` stayed below the level-0 norm. So the default query
counts here are the CONTRACT ladder capped at ``min(K // 2, V)`` (``bounded_query_counts``);
pass ``query_counts`` to test the full ladder on short sequences: a few firings stay
finite (the CONTRACT's equal-key worst case is 3.5× per firing at n = 16, β = ½). ``merge``
is always safe (n = K, row i scaled by ``(1 - β_ii) e^γ``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ngdn.inputs import (as_reference, cast, check_regime, extreme_erase, extreme_log_decay, extreme_logits,
                         extreme_state, extreme_write, generator, randn)
from reference.nested import Level, default_query_counts, make_levels


class NestedShape(NamedTuple):
    B: int
    T: int
    H: int
    L: int
    K: int
    V: int


def bounded_query_counts(L: int, K: int, V: int) -> list[int]:
    """The CONTRACT ladder ``min(K, 16·2^(ℓ-1))`` capped at ``max(1, min(K // 2, V))`` (see module doc)."""
    cap = max(1, min(K // 2, V))
    return [min(n, cap) for n in default_query_counts(L, K)]


def nested_inputs(shape: NestedShape, seed: int, scheme="learned", intervals=None, query_counts=None,
                  reduction="mean", initial_states: bool = True, gate_scale: float = 1.0,
                  regime: str = "typical") -> dict:
    """Nested GDN-2 inputs in float64 from one seeded generator.

    ``scheme``/``reduction``: one name, or one per level ℓ = 1..L-1; ``intervals`` default
    ``f_ℓ = 2^(ℓ-1)``; ``query_counts`` default ``bounded_query_counts(L, K, V)``.
    Returns q ``[B,T,H,L,K]``, k, v, g, b, w, r ``[B,T,H,L]``, ``levels`` (float64 params),
    ``initial_states`` (L ``[B,H,K,V]`` or None) and cotangents ``do [B,T,H,V]``,
    ``dht`` (L ``[B,H,K,V]``) for a loss ``Σ o·do + Σ_ℓ M_ℓ·dht_ℓ``.
    ``regime="extreme"`` (``ngdn.inputs.REGIMES``): after the typical draw, from the same
    generator, level-0 gates as in ``gdn2_inputs``, router logits ±30 on some (token, level)
    entries, and each level's initial state at entry scale 1e3 or 1e-6 (drawn per level).
    """
    check_regime(regime)
    B, T, H, L, K, V = shape
    gen = generator(seed)
    query_counts = bounded_query_counts(L, K, V) if query_counts is None else query_counts
    x = {
        "q": randn(gen, B, T, H, L, K),
        "k": F.normalize(randn(gen, B, T, H, K), dim=-1),
        "v": randn(gen, B, T, H, V),
        "g": F.logsigmoid(randn(gen, B, T, H, K) + 2.5),
        "b": torch.sigmoid(randn(gen, B, T, H, K)),
        "w": torch.sigmoid(randn(gen, B, T, H, V)),
        "r": randn(gen, B, T, H, L),
    }
    x["levels"] = make_levels(L, H, K, V, scheme=scheme, intervals=intervals, query_counts=query_counts,
                              reduction=reduction, generator=gen, gate_scale=gate_scale)
    x["initial_states"] = [0.5 * randn(gen, B, H, K, V) for _ in range(L)] if initial_states else None
    x["do"] = randn(gen, B, T, H, V)
    x["dht"] = [randn(gen, B, H, K, V) for _ in range(L)]
    if regime == "extreme":
        x["g"] = extreme_log_decay(gen, x["g"])
        x["b"] = extreme_erase(gen, x["b"])
        x["w"] = extreme_write(gen, x["w"])
        x["r"] = extreme_logits(gen, x["r"])
        if x["initial_states"] is not None:
            x["initial_states"] = [extreme_state(gen, s) for s in x["initial_states"]]
    return x


ACTIVATIONS = ("q", "k", "v", "g", "b", "w", "r")


def cast_levels(levels, dtype, device="cpu", requires_grad=False) -> list[Level]:
    """The levels with every parameter ``cast`` (fresh leaves)."""
    return [Level(lv.scheme, lv.interval, {n: cast(p, dtype, device, requires_grad) for n, p in lv.params.items()},
                  lv.reduction) for lv in levels]


def levels_as_reference(levels, dtype, requires_grad=False) -> list[Level]:
    """The float64 twins of ``cast_levels(levels, dtype)``: same rounded values."""
    return [Level(lv.scheme, lv.interval, {n: as_reference(p, dtype, requires_grad) for n, p in lv.params.items()},
                  lv.reduction) for lv in levels]


def cast_states(states, dtype, device="cpu", requires_grad=False):
    return None if states is None else [cast(s, dtype, device, requires_grad) for s in states]


def states_as_reference(states, dtype, requires_grad=False):
    return None if states is None else [as_reference(s, dtype, requires_grad) for s in states]


def parameter_leaves(levels) -> dict:
    """``{"levels[i].NAME": tensor}`` for every scheme parameter (for gradient comparisons)."""
    return {f"levels[{i}].{n}": p for i, lv in enumerate(levels) for n, p in lv.params.items()}
