"""Seeded float64 inputs for the 3D tensor state (CONTRACT section 4), as in ``ngdn.inputs``.

Draws are well conditioned for every mode: ``k1`` is unit-norm; ``q2, k2`` come
from the second query/key mode helper (``reference.tensor3d.second_query_key``)
applied to Gaussian raw projections; in mode ``delta`` the second key is then
rescaled to unit norm, so the product key ``κ = k1 ⊗ k2`` is unit-norm
(``‖κ‖ = ‖k1‖‖k2‖``) and with ``β ∈ (0, 1)`` every token transition is
non-expansive. Log-decays are ``logsigmoid(N(0, 1) + 2.5) ∈ (-∞, 0)``, in practice
above about -1.5, at the requested granularity.
"""
from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F

from ngdn.inputs import check_regime, extreme_erase, extreme_log_decay, extreme_state, generator, rand, randn
from reference.tensor3d import GATE_KINDS, KEY_MODES, MODES, second_query_key

NAMES = ("q1", "k1", "q2", "k2", "v")


class Tensor3DShape(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    E: int
    V: int


def gate_shape(shape: Tensor3DShape, gate: str):
    """The shape of a log-decay of granularity ``gate`` (``None`` for ``"none"``)."""
    B, T, H, K, E, _ = shape
    return {"none": None, "head": (B, T, H), "tile": (B, T, H, E), "channel": (B, T, H, K, E)}[gate]


def tensor3d_inputs(shape: Tensor3DShape, seed: int, mode: str = "gla", gate: str = "tile",
                    key_mode: str = "sigmoid", initial_state: bool = True, regime: str = "typical") -> dict:
    """3D tensor state inputs in float64.

    Keys: ``q1, k1, q2, k2, v, g`` (None for gate ``"none"``), ``beta`` (None in mode
    ``gla``), ``initial_state`` ``[B, H, K, E, V]`` (or None), and cotangents ``dy``,
    ``dht`` for a loss ``Σ y·dy + Σ T_final·dht``.
    ``regime="extreme"`` (``ngdn.inputs.REGIMES``): after the typical draw, from the same
    generator, log-decays down to -20 and below (and some near 0), ``β = 1 - 1e-6`` on some
    tokens, and the initial state at entry scale 1e3 or 1e-6.
    """
    check_regime(regime)
    if mode not in MODES or gate not in GATE_KINDS or key_mode not in KEY_MODES:
        raise ValueError(f"mode, gate, key_mode must be in {MODES}, {GATE_KINDS}, {KEY_MODES}; "
                         f"got {mode!r}, {gate!r}, {key_mode!r}")
    B, T, H, K, E, V = shape
    gen = generator(seed)
    q2, k2 = second_query_key(randn(gen, B, T, H, E), randn(gen, B, T, H, E), key_mode)
    if mode == "delta":
        k2 = F.normalize(k2, dim=-1)
    g_shape = gate_shape(shape, gate)
    x = {
        "q1": randn(gen, B, T, H, K),
        "k1": F.normalize(randn(gen, B, T, H, K), dim=-1),
        "q2": q2,
        "k2": k2,
        "v": randn(gen, B, T, H, V),
        "g": None if g_shape is None else F.logsigmoid(randn(gen, *g_shape) + 2.5),
        "beta": rand(gen, B, T, H) if mode == "delta" else None,
        "initial_state": 0.5 * randn(gen, B, H, K, E, V) if initial_state else None,
        "dy": randn(gen, B, T, H, V),
        "dht": randn(gen, B, H, K, E, V),
    }
    if regime == "extreme":
        if x["g"] is not None:
            x["g"] = extreme_log_decay(gen, x["g"])
        if x["beta"] is not None:
            x["beta"] = extreme_erase(gen, x["beta"])
        x["initial_state"] = extreme_state(gen, x["initial_state"])
    return x
