"""The nested backward, top level first (launch functions, no autograd)."""
from __future__ import annotations

import torch

from optimized.nested.level0 import level0_bwd, level0_bwd_dav
from optimized.nested.fwd import NestedSaved, scan_kwargs
from optimized.nested.plan import add_in_rounds
from optimized.nested.probe import _probe, _snapshots, snapshot_rows
from optimized.nested.probe_fused import probe_bwd
from optimized.nested.snapshot_grads import add_snapshot_grads
from optimized.nested.promote_scan import summed
from optimized.nested.side_stream import fork, join
from optimized.nested.stages import stage
from optimized.nested.state_grad import FactoredSnapGrads


def nested_bwd(saved: NestedSaved, do, dfinals, release: bool = False):
    """Gradients of every input: returns ``dq`` (in q's dtype), ``dk, dv, dg, db, dw, dr``
    (float32; all in input shapes), ``dinit`` (L entries, float32 or None) and ``dparams`` (per level ℓ ≥ 1,
    ``{name: float32 gradient}``; index 0 None). ``release``: the graph is not kept (no second
    backward), so the upper levels' stored states are dropped from ``saved`` once level 1's
    reverse scan is done (``NestedSaved.release_states``; those of levels ≥ 2 after level 2's,
    ``release_higher_states``) and the probe outputs before level 0's backward
    (``NestedSaved.release_upper_levels``); each level's probe outputs already after its own
    probe backward (``NestedSaved.release_probe``)."""
    s, plan = saved, saved.plan
    q, r = s.q, s.r
    B, T, H, L, K = q.shape
    V = s.o0.shape[-1]
    tables = s.tables

    # reads and router: dq of levels ≥ 1 written in place, in q's dtype (the one rounding the
    # returned gradient gets anyway: no float32 buffer and no cast copy); the state gradients per level, later
    dq = torch.empty(B, T, H, L, K, dtype=q.dtype, device=q.device)
    with stage("nested.reads_bwd"):   # the stages' device times in the profiler's table
        dr, do0, dstates_of = s.pieces.reads_bwd(do, q, r, s.o0, s.states, plan, tables, s.scale, dq,
                                                block_v=s.pieces.block_v)

    # level 0's intra-chunk dAv reads only do0: (on CUDA) beside the upper levels' backward
    do0 = do0.to(s.level0.v.dtype).contiguous()     # the dtype level0_bwd reads (the reads' kernel writes it so)
    with fork(s.pieces.overlaps("bwd"), q.device) as side, stage("nested.level0_dav"):
        dav = level0_bwd_dav(s.level0, do0)

    def level_dstates_of(ℓ, snap_grads=None):
        """Level ℓ's state gradients from the reads (with level ℓ+1's factored snapshot gradients
        ``snap_grads`` added in the same kernel), plus its final state's gradient."""
        with stage("nested.reads_bwd_states"):
            d = dstates_of(ℓ) if snap_grads is None else dstates_of(ℓ, snap_grads)
            if dfinals[ℓ] is not None:
                if tables.packed is None:
                    d[:, -1] += dfinals[ℓ].float()
                else:           # each sequence's last row (distinct rows)
                    rows = tables.packed.final_rows[ℓ]
                    d[0, rows] = d[0, rows] + dfinals[ℓ].float()
        return d

    # made one level at a time, top first: level ℓ's while its scan runs, level ℓ-1's from the
    # end of level ℓ's probe backward on (it receives that probe's snapshot gradients)
    level_dstates = [None] * L
    if L > 1:
        level_dstates[L - 1] = level_dstates_of(L - 1)

    # levels L-1 .. 1: reverse scan, probe backward (fused or replayed), gradients to the level below
    dinit = [None] * L
    dparams = [None] * L
    d_ends = None
    h, ht0 = s.level0.h, s.h_final0

    def release_spent_states(ℓ):
        """Right after level ℓ's reverse scan, unless the graph is kept: the stored states of levels
        ≥ 2 once level 2's is done, every level's (and level 0's output) once level 1's is done."""
        nonlocal dstates_of
        if release and ℓ == 2:
            s.release_higher_states()
        if release and ℓ == 1:
            dstates_of = None                               # (its closure holds them)
            s.release_states()

    for ℓ in range(L - 1, 0, -1):
        level = s.levels[ℓ - 1]
        if s.probes[ℓ] is not None:         # fused probe of a built-in scheme: hand-written backward
            pairs, probe_saved = s.probes[ℓ]
            p32 = s.params[ℓ]                               # float32, cast once in the forward
            with stage("nested.scan_bwd"):
                dM0, *d_pairs = s.pieces.scan_bwd(s.level_states(ℓ), *pairs, level_dstates[ℓ],
                                                 block_v=s.pieces.scan_block(), block_n=s.pieces.block_n,
                                                 reduce_partials=s.pieces.reduce_partials,
                                                 precision=s.pieces.scan_precision(q.dtype, "bwd"),
                                                 **scan_kwargs(tables, ℓ))
            level_dstates[ℓ] = None                        # spent before the probe's backward
            release_spent_states(ℓ)         # (level ℓ's snapshots are level ℓ-1's rows or fla's h: kept)
            # the snapshots only after the scan: not alive at its peak (level 1's are a float32
            # copy of fla's h, 0.5 GiB at L = 4, where the step peaked in level 1's scan), or
            # none at all: the rows that hold them, read in place by the probe's backward
            with stage("nested.snapshots"):
                if s.pieces.reads_rows(level.scheme):
                    snaps = snapshot_rows(tables, ℓ, s.states, h, ht0)
                else:
                    snaps = _snapshots(plan, tables, ℓ, s.states, h, ht0)
            with stage("nested.probe_bwd"):
                d_snaps, d_p = probe_bwd(level.scheme, probe_saved, snaps, p32, level.reduction, *d_pairs,
                                         precision=s.pieces.probe_precision(q.dtype), gates=s.pieces.probe_gates,
                                         dz_over_z=s.pieces.gates_dz_over_z,
                                         factored=s.pieces.factored_snapshot_grads(level.scheme))
            dparams[ℓ] = {n: d_p[n] for n in p32}
            if release:                     # this level's probe outputs and intermediates are spent
                s.release_probe(ℓ)          # (H200, L = 6: the peak was level 2's probe backward with
                pairs = probe_saved = None  # every level's, 1.13 GiB, alive)
        else:                               # generic: replay the scheme's probe under autograd
            with stage("nested.generic_probe_bwd"):
                dM0, dparams[ℓ], d_snaps = _generic_probe_bwd(s, plan, tables, ℓ, level, level_dstates[ℓ], H, K, V)
            release_spent_states(ℓ)
        dinit[ℓ] = dM0 if s.has_initial[ℓ] else None
        level_dstates[ℓ] = d_pairs = None                  # spent (dM0 may still view it)
        if ℓ == 1:
            d_ends = d_snaps
        else:
            # factored snapshot gradients: Qᵀ dν' formed in the kernel that makes the level below's
            # state gradients ("factored-add": in one of its own after it)
            fold = isinstance(d_snaps, FactoredSnapGrads) and s.pieces.snapshot_grads == "factored"
            level_dstates[ℓ - 1] = level_dstates_of(ℓ - 1, d_snaps if fold else None)
            if plan.sources[ℓ] and not fold:
                with stage("nested.add_snapshot_grads"):
                    if isinstance(d_snaps, FactoredSnapGrads):     # Qᵀ dν' formed as it is added
                        add_snapshot_grads(level_dstates[ℓ - 1], d_snaps, tables.snap_rows[ℓ],
                                           tables.inject_rounds[ℓ], precision=s.pieces.probe_precision(q.dtype))
                    else:
                        add_in_rounds(level_dstates[ℓ - 1], tables.add_rounds[ℓ], d_snaps)   # repeated targets: rounds
            snaps = d_snaps = None          # spent: not alive through the next level's scan

    # the upper levels' buffers are spent: free them before level 0's backward, where the step
    # peaks (bench.memory_cpu: level 1's float32 snapshots and the last probe's intermediates
    # would otherwise stay alive through it)
    snaps = pairs = probe_saved = d_snaps = None
    if release:             # and the stored states and probe outputs, which only `saved` still holds
        dstates_of = None                   # (its closure holds the states)
        s.release_upper_levels()
    h = ht0 = None                          # level 0's h is freed inside its backward once spent

    join(side, *dav)
    # level 0: fla's backward with the injected end-of-chunk gradients
    with stage("nested.level0_bwd"):
        dq0, dk, dv, dg, db, dw, dh0 = level0_bwd(
            s.level0, do0, dht=None if dfinals[0] is None else dfinals[0].float().contiguous(),
            d_ends=d_ends, end_chunks=plan.sources[1] if L > 1 else (), state_grad=s.pieces.state_grad,
            slots=tables.slots, release=release, dav=dav,
            grad_dtype=s.level0.q.dtype if s.pieces.level0_grads_in_input_dtype else torch.float32)
        dav = None
        dq[:, :, :, 0] = dq0
    dinit[0] = dh0 if s.has_initial[0] else None
    return dq, dk, dv, dg, db, dw, dr, dinit, dparams


def _generic_probe_bwd(s: NestedSaved, plan, tables, ℓ, level, dstates, H, K, V):
    """Level ℓ's scan backward and its probe's gradients by replaying the scheme's probe under
    autograd (any registered scheme). Returns ``(dM0, dparams, d_snaps)``."""
    h, ht0 = s.level0.h, s.h_final0
    snaps = _snapshots(plan, tables, ℓ, s.states, h, ht0).detach().requires_grad_()
    leaves = {n: t.detach().requires_grad_() for n, t in s.params[ℓ].items()}    # float32
    with torch.enable_grad():
        pairs = _probe(level, snaps, leaves, H, K, V)
    if plan.firings(ℓ) == 0:        # no firing: the stored states are the initial ones
        dM0 = dstates[:, 0] if tables.packed is None else dstates[0]
        d_pairs = None
    else:
        dM0, *d_pairs = s.pieces.scan_bwd(s.level_states(ℓ), *(x.detach() for x in pairs), dstates,
                                         block_v=s.pieces.scan_block(), block_n=s.pieces.block_n,
                                         reduce_partials=s.pieces.reduce_partials,
                                         precision=s.pieces.scan_precision(s.q.dtype, "bwd"),
                                         **scan_kwargs(tables, ℓ))
    names = list(leaves)
    grads = [None] * (1 + len(names))
    if d_pairs is not None:
        d_pairs = [summed(dx) for dx in d_pairs]             # autograd takes tensors, not partials
        outs = [(x, dx) for x, dx in zip(pairs, d_pairs) if x.requires_grad]
        if outs:
            with torch.enable_grad():
                grads = torch.autograd.grad([x for x, _ in outs], [snaps, *leaves.values()],
                                            [dx for _, dx in outs], allow_unused=True)
    dparams = {n: (gr if gr is not None else torch.zeros_like(leaves[n])) for n, gr in zip(names, grads[1:])}
    d_snaps = grads[0] if grads[0] is not None else torch.zeros_like(snaps)
    return dM0, dparams, d_snaps
