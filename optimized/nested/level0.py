"""Nested GDN-2 level 0: fla-core 0.6.0's chunked GDN-2 with per-chunk states in and out.

Forward: fla's ``chunk_gdn2_fwd`` (CONTRACT section 1, chunk size 64), in two calls: its steps up
to the chunk states (``level0_fwd_states``), then its output (``level0_fwd_output``), which
nothing above level 0 reads before the reads, so the nested op may run it beside the upper
levels. Besides the output and final state it keeps ``h`` (the state at the start of every
chunk), from which ``chunk_end_states`` gives the state at the end of every chunk: the snapshots
the level above probes.

Backward: fla's kernels for every piece (intra-chunk ``dAv``, the fused WY
``dq, dk, dv, db, dw, dg`` kernel, the intra-chunk backward, the reverse cumsum of
``dg``) except the state-gradient recurrence, which is ``optimized.nested.state_grad``: it
also accepts a gradient on each end-of-chunk state and folds it into the recurrence. The WY and
intra kernels are launched here (``level0_bwd_wy``, ``level0_bwd_intra``) so that ``dw`` and
``db`` can be written in the inputs' dtype and ``db``'s per-block partials added without a copy.
``dAv`` reads only the output gradient (``level0_bwd_dav``): the nested op may run it beside the
upper levels' backward and hand it to ``level0_bwd``.

Plain launch functions, no autograd: ``optimized.nested`` wraps them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from optimized import triton_mode  # noqa: F401  (device mode before fla)
from optimized.checks import check_kernel_dtype
from optimized.nested.key_block_partials import add_key_block_partials
from optimized.nested.state_grad import CHUNK, FactoredSnapGrads, state_grad_bwd
from optimized.host_math import cdiv, next_power_of_2


def fla_varlen(packed) -> dict:
    """fla's keyword arguments for packed sequences (``optimized.nested.plan.PackedTables``: its
    ``cu_seqlens`` and ``chunk_indices``); none for one sequence per row (``packed`` None)."""
    return {} if packed is None else dict(cu_seqlens=packed.cu_seqlens, chunk_indices=packed.chunk_indices)


RECOMPUTE = ("none", "cumsum", "cumsum+wy")


@dataclass
class Level0Saved:
    """What the backward needs from the forward: fla's intermediates, kept, except those
    ``recompute`` names (``RECOMPUTE``): ``"cumsum"`` drops the gates' chunk cumsum
    ``g_cumsum`` (float32, ``[B, T, H, K]``), ``"cumsum+wy"`` also the WY keys ``w_wy`` and the
    gated ``qg``, ``kg``; the backward makes them again from the inputs with the same fla
    functions the forward ran (the same values, bit for bit)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor                 # the gates as given (an input of the op: kept alive anyway)
    b: torch.Tensor
    w: torch.Tensor
    g_cumsum: torch.Tensor | None
    Aqk: torch.Tensor
    Akk: torch.Tensor
    w_wy: torch.Tensor | None       # (fla's u, the WY values, is not kept: the backward reads v_new)
    qg: torch.Tensor | None
    kg: torch.Tensor | None
    v_new: torch.Tensor
    h: torch.Tensor
    scale: float
    has_initial_state: bool
    packed: object = None           # packed sequences: ``optimized.nested.plan.PackedTables``, else None

    def varlen(self) -> dict:
        """fla's keyword arguments for packed sequences (none for one sequence per row)."""
        return fla_varlen(self.packed)

    def kernel_grid(self) -> tuple:
        """What a launch of fla's chunk kernels here needs: ``(cu_seqlens, chunk_indices, NT)``,
        the first two None for one sequence per row, ``NT`` the chunks a row (or in all, packed)."""
        if self.packed is None:
            return None, None, cdiv(self.q.shape[1], CHUNK)
        return self.packed.cu_seqlens, self.packed.chunk_indices, len(self.packed.chunk_indices)

    def gate_cumsum(self) -> torch.Tensor:
        """``g_cumsum``, kept or made again (fla's ``chunk_local_cumsum``, as in the forward)."""
        if self.g_cumsum is not None:
            return self.g_cumsum
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
        return chunk_local_cumsum(g=self.g, scale=RCP_LN2, chunk_size=CHUNK, **self.varlen())

    def wy(self, g_cumsum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w_wy, qg, kg)``, kept or made again (fla's ``recompute_w_u_fwd_gdn2``, the
        function the forward's intra piece ends with)."""
        if self.w_wy is not None:
            return self.w_wy, self.qg, self.kg
        from fla.ops.gdn2.wy_fast import recompute_w_u_fwd_gdn2
        w_wy, _, qg, kg = recompute_w_u_fwd_gdn2(k=self.k, v=self.v, b=self.b, w_gate=self.w, A=self.Akk, q=self.q,
                                                 gk=g_cumsum, **self.varlen())
        return w_wy, qg, kg


def level0_fwd_states(q, k, v, g, b, w, scale: float, initial_state=None, packed=None):
    """fla's GDN-2 forward up to the chunk states: the gates' chunk cumsum, the intra-chunk
    matrices and WY pieces, then the chunk recurrence (the steps of fla's ``chunk_gdn2_fwd``, the
    same functions in the same order, without its output). Returns ``(final_state, h, saved)``
    with every intermediate in ``saved`` (``g_cumsum`` included: the output reads it); the
    output is ``level0_fwd_output(saved)``, which no step here waits for, so the nested op can
    run it beside the upper levels (``optimized.nested.side_stream``). Arguments as ``level0_fwd``."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gdn2.chunk_intra import chunk_gdn2_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    varlen = fla_varlen(packed)
    g_cumsum = chunk_local_cumsum(g=g, scale=RCP_LN2, chunk_size=CHUNK, **varlen)
    w_wy, u_wy, qg, kg, Aqk, Akk = chunk_gdn2_fwd_intra(q=q, k=k, v=v, gk=g_cumsum, b=b, w_gate=w, scale=scale,
                                                        chunk_size=CHUNK, disable_recompute=True, **varlen)
    h, v_new, final_state = chunk_gated_delta_rule_fwd_h(k=kg, w=w_wy, u=u_wy, gk=g_cumsum,
                                                         initial_state=initial_state, output_final_state=True,
                                                         chunk_size=CHUNK, **varlen)
    saved = Level0Saved(q, k, v, g, b, w, g_cumsum, Aqk, Akk, w_wy, qg, kg, v_new, h, scale,
                        initial_state is not None, packed)
    return final_state, h, saved


def level0_fwd_output(saved: Level0Saved) -> torch.Tensor:
    """Level 0's output ``o [B, T, H, V]`` from ``level0_fwd_states``' intermediates: fla's
    ``chunk_gla_fwd_kernel_o``, the last step of ``chunk_gdn2_fwd``, launched here into an
    uninitialised ``o``. (fla's launcher, ``chunk_gla_fwd_o_gk``, zero-fills ``o`` first for
    callers that pad ``v``; every program stores its whole ``[64, BV]`` tile of tokens below its
    sequence's end, so every element is written: a 134 MB fill less at L = 2's benchmark shape.)"""
    from fla.ops.gla.chunk import chunk_gla_fwd_kernel_o

    s = saved
    B, T, H, K = s.q.shape
    V = s.v_new.shape[-1]
    cu_seqlens, chunk_indices, NT = s.kernel_grid()
    o = torch.empty_like(s.v_new)
    if o.numel() == 0:
        return o

    def grid(meta):
        return (cdiv(V, meta["BV"]) * NT, B * H)

    chunk_gla_fwd_kernel_o[grid](
        q=s.q, v=s.v_new, g=s.g_cumsum, h=s.h, o=o, A=s.Aqk,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        scale=s.scale, T=T, H=H, HV=H, K=K, V=V, BT=CHUNK, STATE_V_FIRST=False, USE_GRAPH=False)
    return o


def drop_recomputed(saved: Level0Saved, recompute: str) -> None:
    """Drop from ``saved`` what ``recompute`` (``RECOMPUTE``) has the backward make again: once
    the output is made (it reads ``g_cumsum``)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if recompute != "none":
        saved.g_cumsum = None
    if recompute == "cumsum+wy":
        saved.w_wy = saved.qg = saved.kg = None


def level0_fwd(q, k, v, g, b, w, scale: float, initial_state=None, packed=None, recompute: str = "none"):
    """GDN-2 over the whole sequence with fla's chunk kernels (``level0_fwd_states``, then
    ``level0_fwd_output``: fla's ``chunk_gdn2_fwd``, bit for bit).

    Args: ``q, k, g, b [B, T, H, K]``, ``v, w [B, T, H, V]`` (one dtype, contiguous),
    ``initial_state [B, H, K, V]`` float32 or None. ``packed``: n sequences packed in one row
    (``B = 1``; ``optimized.nested.plan.PackedTables``: fla's ``cu_seqlens`` and
    ``chunk_indices``), each with its own chunk grid; initial and final states ``[n, H, K, V]``,
    ``h`` over the packed chunks.

    Returns ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32, h, saved)``:
    ``h [B, N, H, K, V]`` the state at the start of each chunk (fla keeps it in the
    inputs' dtype) and ``saved`` for ``level0_bwd``, without the intermediates ``recompute``
    names (``Level0Saved``; the backward makes them again).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    final_state, h, saved = level0_fwd_states(q, k, v, g, b, w, scale, initial_state, packed)
    o = level0_fwd_output(saved)
    drop_recomputed(saved, recompute)
    return o, final_state, h, saved


def chunk_end_states(h: torch.Tensor, final_state: torch.Tensor, chunks, index=None,
                     includes_final=None) -> torch.Tensor:
    """The float32 states at the end of the given 0-based chunks (increasing),
    ``[B, len(chunks), H, K, V]``.

    The end of chunk ``c`` is the start of chunk ``c + 1`` (``h[:, c + 1]``, in fla's
    dtype, upcast); the end of the last chunk is the final state (float32).
    ``index`` (the ``c + 1 < N``: a long tensor on h's device, or a ``slice`` when they are
    evenly spaced, as every firing schedule's are) and ``includes_final`` may be given
    precomputed (``optimized.nested.plan.device_tables``), saving a host-to-device copy.
    One float32 buffer is written once: a slice is read in place (no gather), the upcast and
    the final state go straight into it (no concatenation).
    """
    N = h.shape[1]
    if index is None:
        chunks = list(chunks)
        if chunks != sorted(set(chunks)) or (chunks and not 0 <= chunks[0] <= chunks[-1] < N):
            raise ValueError(f"chunks must be distinct increasing chunk indices in [0, {N}), got {chunks}")
        index = torch.tensor([c + 1 for c in chunks if c + 1 < N], device=h.device, dtype=torch.long)
        includes_final = bool(chunks) and chunks[-1] == N - 1
    inner = h[:, index] if isinstance(index, slice) else h.index_select(1, index)
    count = inner.shape[1]
    B, _, H, K, V = h.shape
    ends = h.new_empty(B, count + int(includes_final), H, K, V, dtype=torch.float32)
    ends[:, :count].copy_(inner)
    if includes_final:
        ends[:, count].copy_(final_state)
    return ends


def injection_slots(num_chunks: int, chunks, device) -> torch.Tensor:
    """int32 ``[N]``: ``slots[c] = i`` where ``chunks[i] == c``, else -1 (chunks distinct)."""
    slots = [-1] * num_chunks
    for i, c in enumerate(chunks):
        if slots[c] != -1:
            raise ValueError(f"chunk {c} is injected twice")
        slots[c] = i
    return torch.tensor(slots, dtype=torch.int32, device=device)


def level0_bwd_dav(saved: Level0Saved, do) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's intra-chunk ``dAv`` of level 0: ``(dAqk [B, T, H, 64] float32, dv [B, T, H, V])``
    from ``do`` (in v's dtype, contiguous) and the forward's ``Aqk`` and ``v_new``; no state
    gradient is read, so it may run before the upper levels' backward is done."""
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv

    s = saved
    return chunk_kda_bwd_dAv(q=s.q, k=s.k, v=s.v_new, do=do, A=s.Aqk, scale=s.scale, chunk_size=CHUNK,
                             **s.varlen())


def level0_bwd_wy(saved: Level0Saved, g_cumsum, do, dh, dv, dw_dtype=torch.float32) -> tuple:
    """fla's fused WY backward (``chunk_gdn2_bwd_kernel_wy_dqkg_fused``), launched here as fla's
    ``chunk_gdn2_bwd_wy_dqkg_fused`` launches it, but for ``dw``'s dtype: ``dw`` is final when the
    kernel stores it (one store, its float32 value rounded to the buffer's dtype), so a ``dw`` in
    the inputs' dtype needs no cast's pass after.

    Returns ``dq, dk`` (float32, partial: the intra backward adds its terms), ``dv`` (v's dtype),
    ``db`` (float32, partial), ``dw`` (``dw_dtype``), ``dg`` (float32, partial), ``dAkk``.
    """
    from fla.ops.gdn2.chunk_bwd import chunk_gdn2_bwd_kernel_wy_dqkg_fused

    s = saved
    B, T, H, K = s.k.shape
    V = s.v.shape[-1]
    cu_seqlens, chunk_indices, NT = s.kernel_grid()
    f32 = torch.float32
    dq, dk, dg, db = (torch.empty_like(x, dtype=f32) for x in (s.q, s.k, g_cumsum, s.b))
    dv2, dw, dA = torch.empty_like(s.v), torch.empty_like(s.w, dtype=dw_dtype), torch.empty_like(s.Akk, dtype=f32)
    chunk_gdn2_bwd_kernel_wy_dqkg_fused[(NT, B * H)](
        q=s.q, k=s.k, v=s.v, v_new=s.v_new, g=g_cumsum, b=s.b, w_gate=s.w, A=s.Akk, h=s.h, do=do, dh=dh,
        dq=dq, dk=dk, dv=dv, dv2=dv2, dg=dg, db=db, dw=dw, dA=dA,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        scale=s.scale, T=T, H=H, K=K, V=V, BT=CHUNK, STATE_V_FIRST=False)
    return dq, dk, dv2, db, dw, dg, dA


def level0_bwd_intra(saved: Level0Saved, g_cumsum, dAqk, dAkk, dq, dk, db, dg, grad_dtype=torch.float32) -> tuple:
    """fla's intra-chunk backward (``chunk_gdn2_bwd_kernel_intra``), launched here as fla's
    ``chunk_gdn2_bwd_intra`` launches it; then ``db`` plus the kernel's per-key-block partials
    ``db2 [NK, B, T, H, BK]`` added by one kernel into a ``db`` in ``grad_dtype``
    (``optimized.nested.key_block_partials``; fla's launcher makes the partials contiguous in
    ``[B, T, H, K]`` order first, a copy of a float32 ``[B, T, H, K]``, adds in place, and the
    caller casts: three passes where one does; the same float32 sum, rounded once).

    Returns ``dq, dk`` (q's dtype), ``db`` (``grad_dtype``), ``dg`` (float32, before the reverse
    cumsum).
    """
    from fla.ops.gdn2.chunk_intra import chunk_gdn2_bwd_kernel_intra
    from fla.ops.utils.constant import RCP_LN2
    from fla.utils import IS_GATHER_SUPPORTED

    s = saved
    B, T, H, K = s.k.shape
    BC, BK = min(16, CHUNK), min(32, next_power_of_2(K))
    cu_seqlens, chunk_indices, NT = s.kernel_grid()
    NC, NK = cdiv(CHUNK, BC), cdiv(K, BK)
    dq2, dk2 = torch.empty_like(s.q), torch.empty_like(s.k)
    db2 = s.q.new_empty(NK, B, T, H, BK, dtype=torch.float32)
    dg2 = torch.empty_like(dg, dtype=torch.float32)
    chunk_gdn2_bwd_kernel_intra[(NK * NC * NT, B * H)](
        q=s.q, k=s.k, g=g_cumsum, b=s.b, dAqk=dAqk, dAkk=dAkk, dq=dq, dq2=dq2, dk=dk, dk2=dk2, dg=dg, dg2=dg2,
        db=db2, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        B=B, T=T, H=H, K=K, BT=CHUNK, BC=BC, BK=BK, NC=NC, SAFE_GATE=False, USE_GATHER=IS_GATHER_SUPPORTED,
        GATE_SHIFT=2. * RCP_LN2)
    return dq2, dk2, add_key_block_partials(db, db2, grad_dtype), dg2


def level0_bwd(saved: Level0Saved, do, dht=None, d_ends=None, end_chunks=None, state_grad=state_grad_bwd,
               slots=None, release: bool = False, dav=None, grad_dtype=torch.float32):
    """Gradients of level 0 given ``do [B, T, H, V]``, the final-state gradient ``dht``
    (float32 or None) and ``d_ends [B, S, H, K, V]`` (float32; or a ``state_grad.FactoredSnapGrads``
    standing for it, which ``state_grad`` must accept), the gradients of the
    states at the end of chunks ``end_chunks`` (S distinct 0-based chunk indices; or their
    ``injection_slots`` precomputed as ``slots``). ``release``: no second backward follows, so
    ``saved`` drops each of fla's forward tensors once the last piece that reads it has run
    (``Aqk`` after the intra ``dAv``, ``qg``, ``kg``, ``w_wy`` after the state gradients, ``h``,
    ``v_new``, ``Akk`` after the WY backward): fla's intra backward, where the nested step
    peaked (H200, L = 4), runs without them. ``dav``: ``level0_bwd_dav(saved, do)`` made earlier
    (else made here first). ``grad_dtype``: the dtype of ``dg, db, dw``, which fla makes in float32:
    in the inputs' dtype the last pass over each rounds its float32 value once as it stores, and
    the caller's casts of them go. (On CUDA a kernel compiled to store bf16 is another binary, and
    without pinned autotuners maybe another configuration: its results are within one bf16 rounding
    of the float32 ones cast, not always equal to them: ``tests/test_level0_launchers.py``.)

    Returns ``dq, dk, dv`` (the inputs' dtype), ``dg, db, dw`` (``grad_dtype``), shaped like the
    inputs, and ``dh0`` (float32, or None without an initial state).
    """
    from fla.ops.utils import chunk_local_cumsum

    if not (isinstance(grad_dtype, torch.dtype) and grad_dtype.is_floating_point):
        raise ValueError(f"grad_dtype must be a floating-point torch.dtype, got {grad_dtype!r}")
    check_kernel_dtype("grad_dtype", torch.empty(0, dtype=grad_dtype))
    s = saved
    do = do.to(s.v.dtype).contiguous()
    dav = level0_bwd_dav(s, do) if dav is None else dav
    N = s.h.shape[1]
    S = None if d_ends is None else (d_ends.dnu if isinstance(d_ends, FactoredSnapGrads) else d_ends).shape[1]
    if S:
        slots = injection_slots(N, end_chunks, do.device) if slots is None else slots
    else:
        d_ends = None
        slots = slots if s.packed is not None else None     # packed: the slots carry the chunk count
    varlen = s.varlen()
    # packed sequences: our state-gradient kernel indexes them itself (the kwargs only then, so
    # a state-gradient function without them, e.g. a test's twin, still serves one sequence per row)
    packed_grad = {} if s.packed is None else dict(cu_seqlens=s.packed.cu_seqlens,
                                                   chunk_offsets=s.packed.chunk_offsets)

    dAqk, dv = dav
    del dav
    if release:
        s.Aqk = None
    g_cumsum = s.gate_cumsum()              # kept, or made again here (``Level0Saved``)
    w_wy, qg, kg = s.wy(g_cumsum)
    dh, dh0, dv = state_grad(qg, kg, w_wy, g_cumsum, do, dv, s.scale, dht=dht, ds=d_ends,
                             slots=slots, want_dh0=s.has_initial_state, **packed_grad)
    del w_wy, qg, kg
    if release:
        s.qg = s.kg = s.w_wy = None
    dq, dk, dv, db, dw, dg, dAkk = level0_bwd_wy(s, g_cumsum, do, dh, dv, dw_dtype=grad_dtype)
    del dh                      # spent (the state gradients, [B, N, H, K, V])
    if release:
        s.h = s.v_new = s.Akk = None
    dq, dk, db, dg = level0_bwd_intra(s, g_cumsum, dAqk, dAkk, dq, dk, db, dg, grad_dtype=grad_dtype)
    dg = chunk_local_cumsum(dg, chunk_size=CHUNK, reverse=True, output_dtype=grad_dtype, **varlen)
    return dq, dk, dv, dg, db, dw, dh0


def num_chunks(T: int) -> int:
    return cdiv(T, CHUNK)
