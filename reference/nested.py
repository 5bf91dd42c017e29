"""Nested GDN-2: docs/CONTRACT.md section 3, in PyTorch, one token at a time.

    for chunk c = 1..N:
        for each token t of chunk c, in order:
            S0 <- GDN-2 step with token t                     # level 0 writes first
            o_t = Σ_ℓ softmax(r_t)_ℓ · scale · (M_ℓ)^T q_t^(ℓ)   # M_0 = S0 after t;
                                                              # M_ℓ (ℓ≥1) as it stood
                                                              # when chunk c began
        if chunk c is full (c*C ≤ T):
            for ℓ = 1..L-1, in increasing order:
                if c mod f_ℓ == 0:
                    M_ℓ <- Promote(M_ℓ, M_{ℓ-1}, scheme_ℓ)     # M_{ℓ-1} already includes
                                                              # its own firing at chunk c

Level 0 is ``reference.gdn2``; Promote is a scheme's probe (``reference.schemes``)
followed by the simultaneous update (``reference.promote``). Chunk numbering starts
at 1 in every call. Final states: level 0 after the last token, level ℓ ≥ 1 after
its last firing. Differentiable in every input, router logit, scheme parameter and
initial state. Pass float64 for a reference.

Choices where the CONTRACT is silent: everything is computed in the inputs' dtype;
scheme parameters and initial states of any float dtype are cast to it (gradients
flow back through the cast), and final states come back in it. ``chunk_size`` is 64
per CONTRACT; smaller values exist only so tests can fire levels cheaply.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from reference.gdn2 import gdn2_read, gdn2_step
from reference.promote import promote
from reference.schemes import check_reduction, check_scheme_params, get_scheme
from reference.progress import Ticker
from reference.validation import (FLOAT_DTYPES, check_all_finite, check_cu_seqlens, check_dtype,
                                  check_same_device, check_same_dtype, check_scale, check_shape, check_sizes,
                                  check_state_count, check_state_dtype, check_tensor, gdn2_sizes, sequences)

CHUNK_SIZE = 64


@dataclass
class Level:
    """One level ℓ ≥ 1: its promotion scheme, firing interval ``f_ℓ`` (in chunks), the
    scheme's per-head parameters and the decay reduction (``"mean"`` or ``"sum"``)."""
    scheme: str
    interval: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    reduction: str = "mean"


def default_intervals(L: int) -> list[int]:
    """``f_ℓ = 2^(ℓ-1)`` for ℓ = 1..L-1."""
    return [2 ** (ℓ - 1) for ℓ in range(1, L)]


def default_query_counts(L: int, K: int) -> list[int]:
    """The query ladder ``n_ℓ = min(K, 16·2^(ℓ-1))`` for ℓ = 1..L-1."""
    return [min(K, 16 * 2 ** (ℓ - 1)) for ℓ in range(1, L)]


def make_levels(L, H, K, V, scheme="learned", intervals=None, query_counts=None, reduction="mean",
                generator=None, dtype=torch.float64, device="cpu", gate_scale=1.0) -> list[Level]:
    """Seeded random levels 1..L-1 (``scheme`` and ``reduction`` may also be one entry per level).

    Scales (chosen so firings stay bounded on the tested lengths; see ``ngdn.nested_inputs``):
    ``Q`` rows ~ N(0, 1/K) (``ν`` about as large as a row of ``M_below``), ``W_K, W_ω`` ~ N(0, 1/V),
    ``W_β`` ~ N(0, 0.25/V) (β near ½), ``W_γ`` ~ N(0, 0.01/V) (γ near -softplus(0) = -0.69, so each
    firing decays the level by about ½). A parameter of any other name (a new scheme's) is drawn
    from N(0, 1/V) and is not scaled by ``gate_scale``: name a new scheme's parameters like these
    when they play these roles, or pass your own ``Level`` parameters. ``query_counts`` set the
    size of the scheme's query axis (``Scheme.query_axes``, read from its declared shapes, e.g.
    axis 1 of ``Q``); a scheme without one ignores them (``merge``: n = K).

    ``gate_scale`` multiplies the std of ``W_beta``, ``W_omega`` and ``W_gamma``. At 1 every gate
    sits in its nonlinearity's linear regime (softplus(x) ≈ log 2 + x/2, σ(x) ≈ ½ + x/4); large
    values reach |x| of several units. Measured |x| of the decay logits ``x = ν W_γ`` (K, V ∈ {4, 8, 16}):

    - unit-normal snapshots ``M_below`` (one firing, ``property_tests`` promote draws): gate_scale 1
      median 0.06, 90% below 0.16, max 0.74; gate_scale 30 median 1.8, 90% below 4.9, 29% over 3
      (β, ω pre-activations: median 9 and 19).
    - Nested GDN-2 runs on ``ngdn.nested_inputs`` (level states are ~5× smaller than N(0, 1)):
      gate_scale 1 median 0.013, max 0.22; 30 median 0.4, 1% over 3; 100 median 1.4, 90% below 5,
      24% over 3.

    Hazard (CONTRACT section 2): at gate_scale 100 (30), 80 (160) nested draws with T = 200, chunk size 8,
    L ≤ 6, the bounded query counts and both schemes stayed finite, every level state below 3.2 (17)
    in magnitude, and the float64 references agreed to 1e-12.
    """
    for name, x, least in (("L", L, 1), ("H", H, 0), ("K", K, 1), ("V", V, 1)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name} must be an int, got {type(x).__name__}")
        if x < least:
            raise ValueError(f"{name} must be ≥ {least}, got {x}")
    if isinstance(gate_scale, bool) or not isinstance(gate_scale, (int, float)) or not math.isfinite(gate_scale) \
            or gate_scale < 0:
        raise ValueError(f"gate_scale must be a finite number ≥ 0, got {gate_scale!r}")
    for name, x in (("scheme", scheme), ("reduction", reduction)):
        if not isinstance(x, str) and not (isinstance(x, Sequence) and all(isinstance(e, str) for e in x)):
            raise TypeError(f"{name} must be a str or one str per level ℓ = 1..L-1, got {x!r}")
    intervals = default_intervals(L) if intervals is None else list(intervals)
    query_counts = default_query_counts(L, K) if query_counts is None else list(query_counts)
    schemes = [scheme] * (L - 1) if isinstance(scheme, str) else list(scheme)
    reductions = [reduction] * (L - 1) if isinstance(reduction, str) else list(reduction)
    if isinstance(scheme, str):             # named even where no level uses it (L = 1)
        get_scheme(scheme)
    if isinstance(reduction, str):
        check_reduction(reduction)
    for ℓ, (name, red) in enumerate(zip(schemes, reductions), start=1):
        get_scheme(name)                                        # an unknown scheme: named, listed
        check_reduction(red, f"reduction of level ℓ = {ℓ}")
    for name, xs in (("intervals", intervals), ("query_counts", query_counts), ("scheme", schemes),
                     ("reduction", reductions)):
        if len(xs) != L - 1:
            raise ValueError(f"{name} must have L - 1 = {L - 1} entries, got {len(xs)}")
    for ℓ, (f, n) in enumerate(zip(intervals, query_counts), start=1):
        if isinstance(f, bool) or not isinstance(f, int):
            raise TypeError(f"intervals[{ℓ - 1}] (level ℓ = {ℓ}) must be an int, got {type(f).__name__}")
        if f < 1:
            raise ValueError(f"intervals[{ℓ - 1}] (level ℓ = {ℓ}) must be a positive number of chunks "
                             f"(f_ℓ ≥ 1), got {f}")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"query_counts[{ℓ - 1}] (level ℓ = {ℓ}) must be an int, got {type(n).__name__}")
        if not 1 <= n <= K:
            raise ValueError(f"query_counts[{ℓ - 1}] (level ℓ = {ℓ}) must be in 1..K = {K} (a query bank "
                             f"larger than K is not allowed), got n = {n}")

    def randn(*shape, std):
        x = torch.randn(*shape, generator=generator, dtype=torch.float64) * std
        return x.to(dtype=dtype, device=device)

    levels = []
    for ℓ in range(1, L):
        n = query_counts[ℓ - 1]
        shapes = get_scheme(schemes[ℓ - 1]).parameter_shapes(H, K, V, n)
        std = {"Q": K ** -0.5, "W_K": V ** -0.5, "W_beta": 0.5 * gate_scale * V ** -0.5,
               "W_omega": gate_scale * V ** -0.5, "W_gamma": 0.1 * gate_scale * V ** -0.5}
        params = {name: randn(*shape, std=std.get(name, V ** -0.5)) for name, shape in shapes.items()}
        levels.append(Level(schemes[ℓ - 1], intervals[ℓ - 1], params, reductions[ℓ - 1]))
    return levels


def validate_nested_inputs(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                           chunk_size=CHUNK_SIZE, dtypes=FLOAT_DTYPES, check_params_finite=True, cu_seqlens=None):
    """Every CONTRACT "Errors" check for Nested GDN-2 (shared with ``optimized.nested``).

    q ``[B, T, H, L, K]``; k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; r ``[B, T, H, L]``;
    ``len(levels) == L - 1``; each level a known scheme with parameters of its shapes
    (``n ≤ K``, finite), a positive integer interval and a known reduction; initial
    states ``None`` or ``L`` entries, each ``None`` or ``[B, H, K, V]``. One dtype for
    the activations, one device for everything. Returns ``(B, T, H, L, K, V)``.
    ``check_params_finite=False``: the caller checks the parameters' finiteness itself (the
    optimized op folds it into its one fused check). ``cu_seqlens``: N sequences packed in one
    row (``reference.validation.check_cu_seqlens``); each initial state is then ``[N, H, K, V]``.
    """
    check_tensor("q", q, ndim=5)
    B, T, H, L, K = q.shape
    if T == 0:
        raise ValueError("q must hold at least one token, got T = 0")
    for name, x in (("k", k), ("v", v), ("g", g), ("b", b), ("w", w), ("r", r)):
        check_tensor(name, x, ndim=4)
    V = v.shape[-1]
    for name, x in (("k", k), ("g", g), ("b", b)):
        check_shape(name, x, (B, T, H, K), "[B, T, H, K]")
    check_shape("v", v, (B, T, H, V), "[B, T, H, V]")
    check_shape("w", w, (B, T, H, V), "[B, T, H, V]")
    if not isinstance(levels, Sequence) or isinstance(levels, str):
        raise TypeError(f"levels must be a list of Level, got {type(levels).__name__}")
    if len(levels) != L - 1:
        raise ValueError(f"q has L = {L} levels (q.shape[3]) but levels has {len(levels)} entries; "
                         f"expected len(levels) = L - 1 = {L - 1}")
    if tuple(r.shape[:3]) != (B, T, H) or r.shape[3] != L:
        raise ValueError(f"r must have shape [B, T, H, L] = {(B, T, H, L)} with one router logit per level "
                         f"(r.shape[-1] = L = len(levels) + 1 = {L}), got {tuple(r.shape)}")
    activations = (("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w), ("r", r))
    check_same_dtype(activations)
    check_dtype("q", q, dtypes)
    check_sizes((("q [B, T, H, L, K]", (B, T, H, L, K)),) + gdn2_sizes(B, T, H, K, V))
    check_scale(scale, q.dtype)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")

    N = B
    if cu_seqlens is not None:
        check_same_device(activations)
        check_cu_seqlens(cu_seqlens, B, T, q.device)
        N = cu_seqlens.shape[0] - 1

    tensors = list(activations)
    for i, level in enumerate(levels):
        where = f"levels[{i}] (level ℓ = {i + 1})"
        if not isinstance(level, Level):
            raise TypeError(f"{where} must be a reference.nested.Level, got {type(level).__name__}")
        get_scheme(level.scheme)
        if isinstance(level.interval, bool) or not isinstance(level.interval, int):
            raise TypeError(f"{where}.interval must be an int, got {type(level.interval).__name__}")
        if level.interval < 1:
            raise ValueError(f"{where}.interval must be a positive number of chunks (f_ℓ ≥ 1), "
                             f"got {level.interval}")
        check_reduction(level.reduction, f"{where}.reduction")
        check_scheme_params(level.scheme, level.params, H, K, V, name=f"levels[{i}].params")
        tensors += [(f"levels[{i}].params[{key!r}]", p) for key, p in level.params.items()]

    if initial_states is not None:
        if not isinstance(initial_states, Sequence) or len(initial_states) != L:
            raise ValueError(f"initial_states must be None or a list of L = {L} entries (None or "
                             f"[B, H, K, V] tensors), got "
                             f"{len(initial_states) if isinstance(initial_states, Sequence) else type(initial_states).__name__}")
        for ℓ, state in enumerate(initial_states):
            if state is None:
                continue
            check_tensor(f"initial_states[{ℓ}]", state, ndim=4)
            if cu_seqlens is not None:
                check_state_count(f"initial_states[{ℓ}]", state, N, "[N, H, K, V]")
            check_shape(f"initial_states[{ℓ}]", state, (N, H, K, V),
                        "[B, H, K, V]" if cu_seqlens is None else "[N, H, K, V]")
            check_state_dtype(f"initial_states[{ℓ}]", state, q.dtype)
            tensors.append((f"initial_states[{ℓ}]", state))
    check_same_device(tensors)
    if check_params_finite:
        check_all_finite((f"levels[{i}].params[{key!r}]", p)                   # after the device check:
                         for i, level in enumerate(levels) for key, p in level.params.items())  # one sync
    return B, T, H, L, K, V


def naive_nested_gdn2(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                      output_final_state=False, chunk_size=CHUNK_SIZE, cu_seqlens=None):
    """Per-token Nested GDN-2.

    Args:
        q: per-level read queries ``[B, T, H, L, K]`` (``q[..., ℓ, :]`` reads level ℓ).
        k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]`` (level 0, CONTRACT section 1).
        r: router logits ``[B, T, H, L]``.
        levels: ``L - 1`` ``Level`` entries for ℓ = 1..L-1.
        scale: multiplies every read; default ``K ** -0.5``.
        initial_states: ``None`` or ``L`` entries, each ``None`` (zeros) or ``[B, H, K, V]``.
        output_final_state: also return the ``L`` final states.
        chunk_size: ``C`` (64 per CONTRACT).
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``); each is computed as a separate call (its own
            chunk grid and firing schedule from its first token), with initial and final states
            ``[N, H, K, V]``, one per sequence.

    Returns:
        ``(o [B, T, H, V], [M_0, ..., M_{L-1}] or None)`` in the inputs' dtype.
    """
    B, T, H, L, K, V = validate_nested_inputs(q, k, v, g, b, w, r, levels, scale, initial_states, chunk_size,
                                              cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        outputs, finals = [], []
        for i, s, e in sequences(cu_seqlens):
            states_i = None if initial_states is None else [None if M0 is None else M0[i:i + 1]
                                                            for M0 in initial_states]
            o_i, M_i = naive_nested_gdn2(*(x[:, s:e] for x in (q, k, v, g, b, w, r)), levels, scale, states_i,
                                         True, chunk_size)
            outputs.append(o_i)
            finals.append(M_i)
        return torch.cat(outputs, dim=1), ([torch.cat([M_i[ℓ] for M_i in finals], dim=0) for ℓ in range(L)]
                                           if output_final_state else None)
    scale = K ** -0.5 if scale is None else scale
    C = chunk_size
    N = -(-T // C)
    initial_states = [None] * L if initial_states is None else initial_states
    M = [q.new_zeros(B, H, K, V) if M0 is None else M0.to(q.dtype) for M0 in initial_states]
    params = [{name: p.to(q.dtype) for name, p in level.params.items()} for level in levels]
    probe = [get_scheme(level.scheme).probe for level in levels]

    o = []
    tick = Ticker("naive_nested_gdn2", T)          # a time estimate on stderr for a long call
    for c in range(1, N + 1):
        for t in range((c - 1) * C, min(c * C, T)):
            tick(t)
            M[0] = gdn2_step(M[0], k[:, t], v[:, t], g[:, t], b[:, t], w[:, t])   # level 0 writes first
            weights = torch.softmax(r[:, t], dim=-1)                                # softmax(r_t) over ℓ
            # M_ℓ (ℓ ≥ 1) is as it stood when chunk c began: it changes only at the chunk's end.
            o.append(sum(weights[..., ℓ, None] * gdn2_read(M[ℓ], q[:, t, :, ℓ], scale) for ℓ in range(L)))
        if c * C <= T:                                                              # a full chunk fires
            for ℓ in range(1, L):                                                   # in increasing order
                if c % levels[ℓ - 1].interval == 0:
                    κ, ν, β, ω, γ = probe[ℓ - 1](M[ℓ - 1], params[ℓ - 1], levels[ℓ - 1].reduction)
                    M[ℓ] = promote(M[ℓ], κ, ν, β, ω, γ)                             # M_{ℓ-1} after its own firing
    return torch.stack(o, dim=1), (M if output_final_state else None)
