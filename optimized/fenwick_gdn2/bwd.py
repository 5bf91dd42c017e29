"""Backward of the chunked Fenwick GDN-2 memory (orchestration; see ``optimized.fenwick_gdn2``).

Hand-written, no autograd inside:

1. ours (Triton, ``router.py``): ``dλ[7 + j] = Σ_v O_j ⊙ do`` (the stacked reads kept by the
   forward) and the stacked output cotangent ``do_st`` (``λ[7 + j] ⊙ do`` on bucket block j, 0 on
   own blocks).
2. fla: ``chunk_kda_bwd_dAv`` on the stacked reads: ``dAqk`` and ``dvn`` inside the chunk.
3. ours (Triton, ``states.py``): the reverse chunk-level Fenwick scan: the gradient of every
   chunk's end states ``dh``, the full ``dvn``, and the first chunk's pre-state gradient.
4. fla: ``chunk_gdn2_bwd_wy_dqkg_fused`` (WY backward on the stacked values); torch: unstack
   ``dv``, ``dw`` (own-level masks).

   2–4 run on one row in time pieces (``time_pieces``), last piece first, the reverse scan of a
   piece starting from the pre-state gradient the later piece ended with: fla's pieces work
   chunk by chunk, so the values are those of one call, and the stacked gradients (``dh``,
   ``dvn``, fla's all-block ``dv``, ``dw``) are alive for one piece at a time.
5. ours (Triton, ``intra.py``): the intra-chunk read's ``d(w ⊙ v)``, ``dλ[0..6]``, its
   ``dAqk`` and its ``dL`` (through the WY inverse), added to ``dv``, ``dw``; run after the
   stacked pieces, so that its per-token outputs are not alive where the step peaks (4).
6. fla: with the two ``dAqk`` and two ``dL`` summed, ``chunk_gdn2_bwd_intra``;
   ``chunk_local_cumsum`` (reverse) turns the cumsum gradient into ``dg``.
"""
from __future__ import annotations

import torch

from optimized.fenwick_gdn2.fwd import Saved, initial_state_grad, last_chunk_start
from optimized.fenwick_gdn2.intra import INTRA_LEVELS, intra_bwd
from optimized.fenwick_gdn2.precision import dot_precision
from optimized.fenwick_gdn2.router import router_bwd
from optimized.fenwick_gdn2.states import CHUNK, OWN_LEVELS, states_bwd

# One row's backward in up to this many time pieces (``time_pieces``): the step peaked in fla's WY
# backward with every stacked gradient alive (bench/NOTES.md, Fenwick GDN-2, "split along time").
TIME_PIECES = 8


def fenwick_gdn2_bwd(s: Saved, do: torch.Tensor, dfinal: torch.Tensor | None, release: bool = False):
    """Returns ``dq, dk, dv, dg, db, dw, dλ, d initial_state`` (float32; the last None without one).
    ``release``: the graph is not kept (no second backward), so ``s`` drops each stacked tensor
    once it is spent: the reads after the router's backward, ``h``, ``vn``, ``v_st``, ``w_st``
    after fla's WY backward (the step peaks there; the reads are one stacked tensor of the
    fourteen alive at that peak); ``qg``, ``kg``, ``w_wy`` after the reverse carry scan."""
    from fla.ops.gdn2.chunk_bwd import chunk_gdn2_bwd_wy_dqkg_fused
    from fla.ops.gdn2.chunk_intra import chunk_gdn2_bwd_intra
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv
    from fla.ops.utils import chunk_local_cumsum

    B, T, H, K = s.q.shape
    V = s.v.shape[-1]
    L = s.lam.shape[-1]
    J = s.J
    n_own = s.own_masks.shape[1]
    NB = J + n_own
    N = s.h.shape[1]
    p = s.packing
    fla = {} if p is None else p.fla()
    do_out, Aqk = do, s.Aqk   # for the intra backward, last (``do`` is the caller's, alive anyway)
    do = do.float().contiguous()

    dlam = torch.zeros(B, T, H, L, device=do.device, dtype=torch.float32)
    precision = dot_precision(s.q.dtype)
    if J > 0:                                              # do_st: what fla's pieces read
        do_st = router_bwd(do, s.reads, s.lam, dlam, J, NB, s.q.dtype)
        if release:
            s.reads = None
    else:
        do_st = torch.zeros(B, T, H, NB * V, device=do.device, dtype=s.q.dtype)

    del do                    # do's float copy: read by the router's backward only
    dfinal = None if dfinal is None else dfinal.float().contiguous()
    out, dpre0 = {}, None
    pieces = time_pieces(B, N, p)
    for i in range(len(pieces) - 1, -1, -1):               # last piece first: the reverse scan's carry
        c0, c1 = pieces[i]
        t0, t1 = c0 * CHUNK, min(c1 * CHUNK, T)
        tok = lambda x: x[:, t0:t1]                        # noqa: E731  (a row's views: contiguous)
        dAqk, dv_intra = chunk_kda_bwd_dAv(q=tok(s.q), k=tok(s.k), v=tok(s.vn), do=tok(do_st), A=tok(s.Aqk),
                                           scale=s.scale, chunk_size=CHUNK, **fla)
        dh, dvn, dpre0 = states_bwd(tok(s.qg), tok(s.kg), tok(s.w_wy), tok(s.gk), tok(do_st), dv_intra,
                                    dfinal if c1 == N else None, s.mtab[c0:], s.scale, c1 - c0, J, L, V, n_own,
                                    precision=precision, dtype=s.q.dtype, p=p, dcarry=dpre0)
        del dv_intra              # the stacked dv_intra: not alive in fla's WY backward
        if release and i == 0:    # read by the reverse scan only
            s.qg = s.kg = s.w_wy = None
        dq, dk, dv_st, db, dw_st, dg, dL = chunk_gdn2_bwd_wy_dqkg_fused(
            q=tok(s.q), k=tok(s.k), v=tok(s.v_st), v_new=tok(s.vn), g=tok(s.gk), b=tok(s.b), w_gate=tok(s.w_st),
            A=tok(s.Akk), h=s.h[:, c0:c1], do=tok(do_st), dh=dh, dv=dvn, scale=s.scale, chunk_size=CHUNK, **fla)
        del dh, dvn               # spent: the stacked gradients of the piece
        if release and i == 0:    # the forward's stacked tensors: only the own blocks' masks are read
            s.h = s.vn = s.v_st = s.w_st = None             # from here on
        own = s.own_masks[None, t0:t1, None, :, None]                         # [1, Tp, 1, 7, 1]
        dv = (dv_st.view(B, t1 - t0, H, NB, V)[:, :, :, J:].float() * own).sum(3)     # own blocks only
        dw = dw_st.view(B, t1 - t0, H, NB, V)[:, :, :, J:].float().sum(3)
        del dv_st, dw_st          # the stacked value gradients, all blocks: only the own blocks' are used
        for name, x in (("dAqk", dAqk), ("dq", dq), ("dk", dk), ("db", db), ("dg", dg), ("dL", dL), ("dv", dv),
                        ("dw", dw)):
            if len(pieces) == 1:
                out[name] = x
            else:
                out.setdefault(name, x.new_empty(B, T, *x.shape[2:]))[:, t0:t1] = x
        del dAqk, dq, dk, db, dg, dL, dv, dw
    del do_st
    dAqk, dq, dk, db, dg, dL, dv, dw = (out.pop(n) for n in ("dAqk", "dq", "dk", "db", "dg", "dL", "dv", "dw"))

    # the intra read's backward after the stacked pieces: its four per-token outputs are not
    # alive at their peak (fla's WY backward)
    dwv, dlam_own, dAqk_own, dL_own = intra_bwd(s.v, s.w, s.lam, Aqk, s.Akk, do_out.float().contiguous(),
                                                precision=precision, p=p)
    del Aqk
    n_intra = min(INTRA_LEVELS, L)
    dlam[..., :n_intra] = dlam_own[..., :n_intra]
    dv += dwv * s.w.float()
    dw += dwv * s.v.float()
    dAqk = dAqk + s.scale * dAqk_own
    dL = dL + dL_own
    dq, dk, db, dg = chunk_gdn2_bwd_intra(q=s.q, k=s.k, g=s.gk, b=s.b, dAqk=dAqk, dAkk=dL, dq=dq, dk=dk, db=db,
                                          dg=dg, chunk_size=CHUNK, **fla)
    dg = chunk_local_cumsum(dg, chunk_size=CHUNK, reverse=True, **fla)
    dh0 = None
    if s.has_initial_state:
        dh0 = (initial_state_grad(dpre0[:, :, :, : J * V], s.offset, L, V) if J > 0
               else dpre0.new_zeros(B, H, L, K, V))
    return dq, dk, dv, dg, db, dw, dlam, dh0


def time_pieces(B: int, N: int, p) -> list[tuple[int, int]]:
    """The chunk ranges ``[(c0, c1), …]`` the backward runs fla's pieces and the reverse carry scan
    on, one after another: up to ``TIME_PIECES`` for one row (B = 1, not packed), so that the
    stacked gradients (``dh``, ``dvn``, the WY backward's all-block ``dv``, ``dw``) are alive
    for one piece at a time; one piece otherwise (the rows of a batch run side by side)."""
    if B != 1 or p is not None or N < 2:
        return [(0, N)]
    per = -(-N // min(TIME_PIECES, N))
    return [(c, min(c + per, N)) for c in range(0, N, per)]


def fenwick_gdn2_bwd_with_tail(s: Saved, tail: Saved | None, do: torch.Tensor, dfinal: torch.Tensor | None,
                               release: bool = False):
    """The backward of ``fenwick_gdn2_fwd``: the main pass's, and with the last chunk's split pass
    (``tail``) and a final-state gradient, that pass's for levels 0 … 6 added on the last chunk
    (in a packed row on every sequence's last chunk, the tail row's ``rows``).
    The main pass then sees no gradient on levels 0 … 6 (its own block's end is not a final state)."""
    if tail is None or dfinal is None:
        return fenwick_gdn2_bwd(s, do, dfinal, release)
    L = s.lam.shape[-1]
    n = min(OWN_LEVELS, L)
    dfinal_main = dfinal.clone()
    dfinal_main[:, :, :n] = 0
    grads = list(fenwick_gdn2_bwd(s, do, dfinal_main, release))
    T_tail = tail.q.shape[1]
    tail_grads = fenwick_gdn2_bwd(tail, do.new_zeros(do.shape[0], T_tail, *do.shape[2:]), dfinal, release)
    if tail.packing is None:
        t0 = last_chunk_start(s.q.shape[1])
        for i in range(7):                                                     # dq … dλ
            grads[i][:, t0:] += tail_grads[i]
    else:
        rows = tail.packing.rows                                               # distinct positions
        for i in range(7):
            grads[i][:, rows] += tail_grads[i]
    return tuple(grads)
