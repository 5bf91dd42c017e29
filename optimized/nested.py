"""Production Nested GDN-2 (SPEC sections 2 and 3): ``chunk_nested_gdn2``.

Computes exactly what ``reference.nested.naive_nested_gdn2`` computes (chunk size 64),
stage by stage, level by level (level ℓ depends only on level ℓ-1):

1. Level 0 (``optimized.level0``): fla-core's chunked GDN-2 on ``q[..., 0, :]``; keeps
   the state at the end of every chunk (the snapshots level 1 probes).
2. Probe (plain PyTorch, cuBLAS): for level ℓ ≥ 1 gather the snapshots of level ℓ-1
   at all of ℓ's firings and run the registered scheme's probe on all of them at once
   (``reference.schemes.get_scheme(name).probe`` on ``[B, F, H, K, V]``). The forward
   runs it without a graph; the backward replays it with gradients on and
   differentiates it (one extra probe forward), so any registered scheme works.
3. Update (``optimized.promote_scan``): a Triton scan over ℓ's firings, one stored
   state per firing; a hand-written reverse scan for the backward.
4. Reads and router: token t of chunk c reads level 0 after its own write (fla's
   output) and level ℓ ≥ 1 as it stood when chunk c began (after ``⌊(c-1)/f_ℓ⌋``
   firings), ``o_t = Σ_ℓ softmax(r_t)_ℓ · scale · M_ℓ^T q_t^(ℓ)``.

Schedule (host integers only): ``N = ⌈T/64⌉`` chunks, ``N_full = ⌊T/64⌋`` full ones;
level ℓ fires at chunks ``c = m·f_ℓ ≤ N_full`` (``m = 1..F_ℓ``, 1-based), probing
level ℓ-1 as it stands after chunk c: for ℓ = 1 the level-0 state at the end of
chunk c, for ℓ ≥ 2 level ℓ-1's state after ``⌊c / f_{ℓ-1}⌋`` firings.

Backward, top level first: read and final-state gradients land on ℓ's stored
states, the reverse scan turns them into gradients of the pairs and of ℓ's initial
state, the probe replay into gradients of the scheme parameters and of the
snapshots, which are added to the stored states of level ℓ-1 (for level 0: injected
into the state-gradient recurrence of ``optimized.state_grad``). No atomics and no
scatter with repeated indices anywhere: two runs give bitwise-identical results.

States are float32; inputs float32 or bfloat16 (level 0 computes in the inputs'
dtype as fla does; probes, scan and reads in float32; the output is cast to q's dtype).
"""
from __future__ import annotations

import bisect
import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from optimized import triton_mode  # noqa: F401  (device mode before fla)
from optimized.checks import KERNEL_DTYPES, check_finite_activations, check_kernel_device, check_kernel_dtype
from optimized.gdn2 import MAX_HEAD_DIM
from optimized.level0 import CHUNK, chunk_end_states, level0_bwd, level0_fwd, Level0Saved
from optimized.promote_scan import promote_scan_bwd, promote_scan_fwd, sum_partials
from optimized.state_grad import state_grad_bwd
from reference.nested import Level, validate_nested_inputs
from reference.schemes import get_scheme, query_count


# --- the schedule --------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """Where every level fires, what it probes and which state each chunk reads.

    ``fire_chunks[ℓ]``: the 1-based chunks at which level ℓ ≥ 1 fires (index 0 unused).
    ``sources[ℓ]``: what firing m probes: for ℓ = 1 the 0-based chunk whose end-of-chunk
    level-0 state it reads, for ℓ ≥ 2 the index of level ℓ-1's stored state.
    ``read_index[ℓ]``: per 0-based chunk, the index of ℓ's stored state its tokens read.
    ``read_group[ℓ]``: ``f`` when ``read_index[ℓ][j] == j // f`` for every chunk (the SPEC
    schedule: groups of f chunks read one state), else None.
    """
    T: int
    N: int
    L: int
    intervals: tuple
    fire_chunks: tuple
    sources: tuple
    read_index: tuple
    read_group: tuple

    def firings(self, level: int) -> int:
        return len(self.fire_chunks[level])


@functools.lru_cache(maxsize=256)
def make_plan(T: int, intervals: tuple, delay: int = 0) -> Plan:
    """The SPEC schedule (``delay = 0``). ``delay`` shifts every firing that many chunks
    later; it exists only for the mutation tests (a firing one chunk late)."""
    N = -(-T // CHUNK)
    n_full = T // CHUNK
    L = len(intervals) + 1
    fire_chunks, sources, read_index, read_group = [()], [()], [()], [None]
    for ℓ, f in enumerate(intervals, start=1):
        chunks = tuple(range(f + delay, n_full + 1, f))
        fire_chunks.append(chunks)
        if ℓ == 1:
            sources.append(tuple(c - 1 for c in chunks))
        else:       # level ℓ-1 after its firings at chunks <= c
            sources.append(tuple(bisect.bisect_right(fire_chunks[ℓ - 1], c) for c in chunks))
        # chunk j (0-based) begins after the firings at chunks c <= j (1-based)
        reads = tuple(bisect.bisect_right(chunks, j) for j in range(N))
        read_index.append(reads)
        read_group.append(f if all(s == j // f for j, s in enumerate(reads)) else None)
    return Plan(T, N, L, tuple(intervals), tuple(fire_chunks), tuple(sources), tuple(read_index),
                tuple(read_group))


# --- pluggable pieces (the mutation tests swap one for a broken twin) ---------------------

@dataclass(frozen=True)
class Pieces:
    plan: Callable = make_plan
    state_grad: Callable = state_grad_bwd
    reduce_partials: Callable = sum_partials
    scan_fwd: Callable = promote_scan_fwd
    block_v: int | None = None      # the scan's V block and pair block (None: promote_scan's
    block_n: int | None = None      # defaults); tests shrink them to reach several blocks


DEFAULT_PIECES = Pieces()


# --- reads ----------------------------------------------------------------------------

def _token_groups(x: torch.Tensor, f: int, G: int) -> torch.Tensor:
    """``[B, T, H, D] -> [B, G, f·C, H, D]``, zero-padded at the end."""
    B, T, H, D = x.shape
    pad = G * f * CHUNK - T
    if pad:
        x = torch.cat([x, x.new_zeros(B, pad, H, D)], dim=1)
    return x.view(B, G, f * CHUNK, H, D)


def read_fwd(states: torch.Tensor, q: torch.Tensor, read_index: Sequence[int], group: int | None,
             scale: float) -> torch.Tensor:
    """``o[t] = scale · states[read_index[chunk(t)]]^T q[t]``: ``[B, T, H, V]`` float32.

    With the SPEC schedule (``group = f``: chunk j reads state ``⌊j/f⌋``) groups of ``f``
    chunks share a state and one batched matmul per level does every read; any other
    schedule (``group = None``) falls back to one gathered state per chunk.
    """
    B, T, H, K = q.shape
    f = group
    if f is not None:
        G = -(-len(read_index) // f)
        o = torch.einsum("bgthk,bghkv->bgthv", _token_groups(q.float(), f, G), states[:, :G])
        return scale * o.reshape(B, -1, H, states.shape[-1])[:, :T]
    index = torch.tensor(read_index, device=states.device)
    o = torch.einsum("bnthk,bnhkv->bnthv", _token_groups(q.float(), 1, len(read_index)),
                     states.index_select(1, index))
    return scale * o.reshape(B, -1, H, states.shape[-1])[:, :T]


def read_bwd(states: torch.Tensor, q: torch.Tensor, do: torch.Tensor, read_index: Sequence[int],
             group: int | None, scale: float):
    """Gradients of ``read_fwd``: ``(dq [B, T, H, K], dstates like states)`` float32.

    ``dstates[s] = scale · Σ_{t reading s} q[t] ⊗ do[t]``: a contraction over the tokens
    of each group (no scatter)."""
    B, T, H, K = q.shape
    f = group
    dstates = torch.zeros_like(states)
    if f is not None:
        G = -(-len(read_index) // f)
        qg, dog = _token_groups(q.float(), f, G), _token_groups(do, f, G)
        dq = torch.einsum("bgthv,bghkv->bgthk", dog, states[:, :G])
        dstates[:, :G] = scale * torch.einsum("bgthk,bgthv->bghkv", qg, dog)
        return scale * dq.reshape(B, -1, H, K)[:, :T], dstates
    N = len(read_index)
    index = torch.tensor(read_index, device=states.device)
    qg, dog = _token_groups(q.float(), 1, N), _token_groups(do, 1, N)
    dq = torch.einsum("bnthv,bnhkv->bnthk", dog, states.index_select(1, index))
    per_chunk = scale * torch.einsum("bnthk,bnthv->bnhkv", qg, dog)
    _add_rows(dstates, list(read_index), per_chunk)
    return scale * dq.reshape(B, -1, H, K)[:, :T], dstates


def _add_rows(dst: torch.Tensor, index: Sequence[int], src: torch.Tensor) -> None:
    """``dst[:, index[i]] += src[:, i]`` along dim 1, deterministically: repeated targets are
    added in rounds in which every target appears at most once (in increasing i); no
    atomics, no accumulating scatter."""
    rank, seen = [], {}
    for s in index:
        rank.append(seen.get(s, 0))
        seen[s] = rank[-1] + 1
    for r in range(max(rank, default=-1) + 1):
        sel = [i for i, k in enumerate(rank) if k == r]
        tgt = torch.tensor([index[i] for i in sel], device=dst.device)
        dst[:, tgt] = dst[:, tgt] + src[:, torch.tensor(sel, device=dst.device)]


# --- probes ---------------------------------------------------------------------------

def _probe(level: Level, snaps: torch.Tensor, params: dict, H: int, K: int, V: int):
    """The scheme's probe on ``snaps [B, F, H, K, V]`` (float32), outputs contiguous float32."""
    B, F = snaps.shape[:2]
    if F == 0:
        n = query_count(params, K)
        z = snaps.new_zeros
        return z(B, 0, H, n, K), z(B, 0, H, n, V), z(B, 0, H, n, K), z(B, 0, H, n, V), z(B, 0, H, K)
    outs = get_scheme(level.scheme).probe(snaps, params, level.reduction)
    return tuple(x.contiguous() for x in outs)


def _snapshots(plan: Plan, ℓ: int, below_states: torch.Tensor | None, h=None, ht0=None) -> torch.Tensor:
    """The states of level ℓ-1 that level ℓ's firings probe: ``[B, F_ℓ, H, K, V]`` float32."""
    if ℓ == 1:
        return chunk_end_states(h, ht0, plan.sources[1])
    if not plan.sources[ℓ]:
        return below_states[:, :0]
    return below_states.index_select(1, torch.tensor(plan.sources[ℓ], device=below_states.device))


# --- forward / backward launch functions -------------------------------------------------

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


# --- autograd ---------------------------------------------------------------------------

def _device_of(x: torch.Tensor):
    """Launch on ``x``'s GPU (Triton launches on the current device), as fla's input_guard does."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _graph_kept() -> bool:
    """Whether the running backward was asked to keep the graph (``retain_graph=True``).
    The saved state is a Python object, not ``save_for_backward`` tensors, so autograd does
    not free it; we free it ourselves unless the graph is kept. Without the (private) query
    we keep it: correct, just held until the graph is dropped."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


class NestedGDN2Function(torch.autograd.Function):
    """Thin autograd wrapper: inputs are flattened to tensors (initial states, then every
    level's parameters in ``levels`` order)."""

    @staticmethod
    def forward(ctx, meta, q, k, v, g, b, w, r, *flat):
        levels, scale, pieces, L = meta["levels"], meta["scale"], meta["pieces"], meta["L"]
        initial_states = list(flat[:L])
        o, finals, saved = nested_fwd(q, k, v, g, b, w, r, levels, scale, initial_states, pieces)
        ctx.saved = saved
        ctx.meta = meta
        ctx.set_materialize_grads(False)
        return (o, *finals)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, *dfinals):
        saved, meta = ctx.saved, ctx.meta
        if saved is None:
            raise RuntimeError("chunk_nested_gdn2: backward through the same graph a second time, but the "
                               "saved tensors were freed after the first; pass retain_graph=True to the "
                               "first backward")
        q = saved.q
        if do is None:
            do = torch.zeros(q.shape[:3] + (saved.o0.shape[-1],), dtype=torch.float32, device=q.device)
        with _device_of(q):
            dq, dk, dv, dg, db, dw, dr, dinit, dparams = nested_bwd(saved, do, list(dfinals))
        ins = meta["inputs"]
        cast = lambda gr, like: None if (gr is None or like is None) else gr.to(like.dtype)  # noqa: E731
        flat = [cast(dinit[ℓ], ins["initial_states"][ℓ]) for ℓ in range(meta["L"])]
        for ℓ, level in enumerate(saved.levels, start=1):
            flat += [dparams[ℓ][n].to(p.dtype) for n, p in level.params.items()]
        if not _graph_kept():
            ctx.saved = None   # as autograd frees saved tensors: nothing outlives a plain backward
        return (None, dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dg.to(q.dtype), db.to(q.dtype),
                dw.to(q.dtype), dr.to(saved.r.dtype), *flat)


def _nested(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False,
            pieces: Pieces = DEFAULT_PIECES):
    if isinstance(q, torch.Tensor):     # before the validation's finiteness sync (a meta q cannot sync)
        check_kernel_device("q", q)
    B, T, H, L, K, V = validate_nested_inputs(q, k, v, g, b, w, r, levels, scale, initial_states,
                                              dtypes=KERNEL_DTYPES)
    if K > MAX_HEAD_DIM:
        raise ValueError(f"q: key dim K must be <= {MAX_HEAD_DIM} for fla's GDN-2 kernels, got {K}")
    check_kernel_dtype("q", q)
    check_finite_activations((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w), ("r", r)))
    scale = K ** -0.5 if scale is None else float(scale)
    initial_states = [None if s is None else s.contiguous()
                      for s in ([None] * L if initial_states is None else initial_states)]
    k, v, g, b, w = (x.contiguous() for x in (k, v, g, b, w))
    meta = {"levels": list(levels), "scale": scale, "pieces": pieces, "L": L,
            "inputs": {"initial_states": initial_states}}
    flat = list(initial_states) + [p for lv in levels for p in lv.params.values()]
    with _device_of(q):
        o, *finals = NestedGDN2Function.apply(meta, q, k, v, g, b, w, r, *flat)
    return o, (finals if output_final_state else None)


def chunk_nested_gdn2(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False):
    """Nested GDN-2 on Triton kernels; same contract as ``reference.nested.naive_nested_gdn2``
    (without ``chunk_size``: always 64).

    Args:
        q: per-level read queries ``[B, T, H, L, K]``; k, g, b ``[B, T, H, K]``; v, w
            ``[B, T, H, V]``; r router logits ``[B, T, H, L]`` (float32 or bfloat16, one dtype;
            bfloat16 in cuda mode only; finite: ``optimized.checks``).
        levels: ``L - 1`` ``reference.nested.Level`` (scheme, interval, params, reduction).
        scale: default ``K ** -0.5``.
        initial_states: None or L entries, each None or float32 ``[B, H, K, V]``.
        output_final_state: also return the L final states.

    Returns ``(o [B, T, H, V] in q's dtype, [M_0, ..., M_{L-1}] float32 or None)``. Gradients
    flow to every input, router logit, scheme parameter and initial state.
    """
    return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state)
