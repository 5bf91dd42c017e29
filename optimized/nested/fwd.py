"""The nested forward: level 0, probes, scans, reads (launch functions, no autograd)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from optimized.level0 import Level0Saved, level0_fwd
from optimized.nested.pieces import DEFAULT_PIECES, Pieces
from optimized.nested.plan import Plan
from optimized.nested.probe import _probe, _snapshots
from optimized.nested.reads_torch import read_fwd


@dataclass
class NestedSaved:
    plan: Plan
    levels: list
    scale: float
    level0: Level0Saved
    h_final0: torch.Tensor
    states: list                    # per level ℓ ≥ 1: [B, F_ℓ + 1, H, K, V] float32 (index 0: None)
    o0: torch.Tensor
    q: torch.Tensor
    r: torch.Tensor
    params: list                    # per level ℓ ≥ 1: {name: tensor} as given (index 0: None)
    has_initial: list
    pieces: Pieces = field(default_factory=Pieces)


def nested_fwd(q, k, v, g, b, w, r, levels, scale, initial_states, pieces: Pieces = DEFAULT_PIECES):
    """All levels, probes, scans and reads. Returns ``(o [B, T, H, V] in q's dtype,
    finals: L float32 [B, H, K, V], saved)``."""
    B, T, H, L, K = q.shape
    V = v.shape[-1]
    plan = pieces.plan(T, tuple(lv.interval for lv in levels))
    q0 = q[:, :, :, 0].contiguous()
    o0, ht0, h, saved0 = level0_fwd(q0, k, v, g, b, w, scale, initial_states[0])
    states = [None]
    params = [None] + [lv.params for lv in levels]
    for ℓ in range(1, L):
        p32 = {n: p.detach().float() for n, p in params[ℓ].items()}
        snaps = _snapshots(plan, ℓ, states[ℓ - 1], h, ht0)
        with torch.no_grad():
            pairs = _probe(levels[ℓ - 1], snaps, p32, H, K, V)
        M0 = initial_states[ℓ]
        states.append(pieces.scan_fwd(None if M0 is None else M0.detach().float(), *pairs,
                                      block_v=pieces.block_v, block_n=pieces.block_n))
    p = torch.softmax(r.float(), dim=-1)
    o = p[..., 0, None] * o0.float()
    for ℓ in range(1, L):
        o_l = read_fwd(states[ℓ], q[:, :, :, ℓ], plan.read_index[ℓ], plan.read_group[ℓ], scale)
        o = o + p[..., ℓ, None] * o_l
    # fresh tensors: outputs must not alias what the backward keeps (no reference cycles)
    finals = [ht0.clone()] + [states[ℓ][:, -1].clone() for ℓ in range(1, L)]
    saved = NestedSaved(plan, list(levels), scale, saved0, ht0, states, o0, q, r, params,
                        [s is not None for s in initial_states], pieces)
    return o.to(q.dtype), finals, saved
