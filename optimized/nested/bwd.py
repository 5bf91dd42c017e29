"""The nested backward, top level first (launch functions, no autograd)."""
from __future__ import annotations

import torch

from optimized.level0 import level0_bwd
from optimized.nested.fwd import NestedSaved
from optimized.nested.probe import _probe, _snapshots
from optimized.nested.reads_torch import _add_rows, read_bwd, read_fwd
from optimized.promote_scan import promote_scan_bwd


def nested_bwd(saved: NestedSaved, do, dfinals):
    """Gradients of every input: returns ``dq, dk, dv, dg, db, dw, dr`` (float32, input
    shapes), ``dinit`` (L entries, float32 or None) and ``dparams`` (per level ℓ ≥ 1,
    ``{name: float32 gradient}``; index 0 None)."""
    s, plan = saved, saved.plan
    q, r = s.q, s.r
    B, T, H, L, K = q.shape
    V = s.o0.shape[-1]
    do = do.float()
    p = torch.softmax(r.float(), dim=-1)

    # reads and router
    dq = torch.zeros(B, T, H, L, K, dtype=torch.float32, device=q.device)
    dp = torch.empty_like(p)
    dp[..., 0] = (do * s.o0.float()).sum(-1)
    dstates = [None]
    for ℓ in range(1, L):
        o_l = read_fwd(s.states[ℓ], q[:, :, :, ℓ], plan.read_index[ℓ], plan.read_group[ℓ], s.scale)
        dp[..., ℓ] = (do * o_l).sum(-1)
        dq[:, :, :, ℓ], d_st = read_bwd(s.states[ℓ], q[:, :, :, ℓ], p[..., ℓ, None] * do,
                                        plan.read_index[ℓ], plan.read_group[ℓ], s.scale)
        if dfinals[ℓ] is not None:
            d_st[:, -1] += dfinals[ℓ].float()
        dstates.append(d_st)
    dr = p * (dp - (p * dp).sum(-1, keepdim=True))

    # levels L-1 .. 1: reverse scan, probe replay, gradients to the level below
    dinit = [None] * L
    dparams = [None] * L
    d_ends = None
    h, ht0 = s.level0.h, s.h_final0
    for ℓ in range(L - 1, 0, -1):
        level = s.levels[ℓ - 1]
        snaps = _snapshots(plan, ℓ, s.states[ℓ - 1], h, ht0).detach().requires_grad_()
        leaves = {n: t.detach().float().requires_grad_() for n, t in s.params[ℓ].items()}
        with torch.enable_grad():
            pairs = _probe(level, snaps, leaves, H, K, V)
        F = plan.firings(ℓ)
        if F == 0:
            dM0 = dstates[ℓ][:, 0]
            d_pairs = None
        else:
            dM0, *d_pairs = promote_scan_bwd(s.states[ℓ], *(x.detach() for x in pairs), dstates[ℓ],
                                             block_v=s.pieces.block_v, block_n=s.pieces.block_n,
                                             reduce_partials=s.pieces.reduce_partials)
        dinit[ℓ] = dM0 if s.has_initial[ℓ] else None
        names = list(leaves)
        grads = [None] * (1 + len(names))
        if d_pairs is not None:
            outs = [(x, dx) for x, dx in zip(pairs, d_pairs) if x.requires_grad]
            if outs:
                with torch.enable_grad():
                    grads = torch.autograd.grad([x for x, _ in outs], [snaps, *leaves.values()],
                                                [dx for _, dx in outs], allow_unused=True)
        dparams[ℓ] = {n: (gr if gr is not None else torch.zeros_like(leaves[n]))
                      for n, gr in zip(names, grads[1:])}
        d_snaps = grads[0] if grads[0] is not None else torch.zeros_like(snaps)
        if ℓ == 1:
            d_ends = d_snaps
        elif plan.sources[ℓ]:
            _add_rows(dstates[ℓ - 1], plan.sources[ℓ], d_snaps)

    # level 0: fla's backward with the injected end-of-chunk gradients
    dq0, dk, dv, dg, db, dw, dh0 = level0_bwd(
        s.level0, p[..., 0, None] * do, dht=None if dfinals[0] is None else dfinals[0].float().contiguous(),
        d_ends=d_ends, end_chunks=plan.sources[1] if L > 1 else (), state_grad=s.pieces.state_grad)
    dq[:, :, :, 0] = dq0
    dinit[0] = dh0 if s.has_initial[0] else None
    return dq, dk, dv, dg, db, dw, dr, dinit, dparams
