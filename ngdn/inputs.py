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


# --- input regimes -----------------------------------------------------------------------------
# "typical": the well-conditioned draws each builder documents. "extreme": the same draw (same
# generator, same values first), then, from further draws of the same generator, extreme but valid
# gates mixed in element by element: per-token log-decays down to -20 and below (strong
# forgets) and some within 1e-6 of 0 (no forgetting), erase gates 1 - 1e-6, write gates exactly
# 0 or 1, router logits ±30, and initial states of entry scale 1e3 or 1e-6. The default is
# "typical" everywhere, so a draw without ``regime`` is bitwise what it was.
REGIMES = ("typical", "extreme")
STRONG_DECAY = (-60.0, -20.0)     # log-decay range of a strong forget (e^-20 = 2e-9, e^-60 = 9e-27)
NEAR_ZERO_DECAY = 1e-6            # weak forgets: g ∈ (-1e-6, 0)
ERASE_NEAR_ONE = 1.0 - 1e-6       # b → 1
ROUTER_LOGIT = 30.0               # router logits ±30 (softmax weights down to e^-60)
STATE_SCALES = (1e3, 1e-6)        # entry scale of an initial state (replaces 0.5)


def check_regime(regime: str) -> None:
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")


def _mask(gen, shape, p: float) -> torch.Tensor:
    return rand(gen, *shape) < p


def extreme_log_decay(gen, g: torch.Tensor) -> torch.Tensor:
    """``g`` with about 25% of its entries a strong forget in ``STRONG_DECAY`` and 15% within
    ``NEAR_ZERO_DECAY`` of 0 (every entry still < 0)."""
    lo, hi = STRONG_DECAY
    u = rand(gen, *g.shape)
    strong = lo + (hi - lo) * rand(gen, *g.shape)
    weak = -NEAR_ZERO_DECAY * (1.0 - rand(gen, *g.shape))
    return torch.where(u < 0.25, strong, torch.where(u < 0.40, weak, g))


def extreme_erase(gen, b: torch.Tensor) -> torch.Tensor:
    """``b`` with about 30% of its entries ``1 - 1e-6``."""
    return torch.where(_mask(gen, b.shape, 0.3), torch.full_like(b, ERASE_NEAR_ONE), b)


def extreme_write(gen, w: torch.Tensor) -> torch.Tensor:
    """``w`` with about 40% of its entries exactly 0 or 1 (half each)."""
    m = _mask(gen, w.shape, 0.4)
    return torch.where(m, (rand(gen, *w.shape) < 0.5).to(w.dtype), w)


def extreme_logits(gen, r: torch.Tensor) -> torch.Tensor:
    """Logits ``r`` with about 30% of the entries ``±ROUTER_LOGIT``."""
    m = _mask(gen, r.shape, 0.3)
    sign = torch.where(rand(gen, *r.shape) < 0.5, -1.0, 1.0).to(r.dtype)
    return torch.where(m, ROUTER_LOGIT * sign, r)


def extreme_state(gen, s: torch.Tensor | None, typical_scale: float = 0.5) -> torch.Tensor | None:
    """An initial state drawn as ``typical_scale · N(0, 1)`` rescaled to entry scale 1e3 or 1e-6."""
    if s is None:
        return None
    scale = STATE_SCALES[int(rand(gen, 1).item() < 0.5)]
    return s * (scale / typical_scale)


def gdn2_inputs(shape: GDN2Shape, seed: int, initial_state: bool = True, regime: str = "typical") -> dict:
    """GDN-2 inputs (CONTRACT section 1) in float64.

    ``k`` is unit-norm and ``b, w ∈ (0, 1)``, so every token transition is
    non-expansive and long sequences stay bounded; ``g ∈ (-1.5, 0)`` per channel.
    Also draws cotangents ``do``, ``dht`` for a loss ``Σ o·do + Σ S_T·dht``.
    ``regime="extreme"``: then extreme gates and state scales (see ``REGIMES``; still
    ``b, w ∈ [0, 1]``, so still non-expansive).
    """
    check_regime(regime)
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
    if regime == "extreme":
        x["g"] = extreme_log_decay(gen, x["g"])
        x["b"] = extreme_erase(gen, x["b"])
        x["w"] = extreme_write(gen, x["w"])
        x["initial_state"] = extreme_state(gen, x["initial_state"])
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
