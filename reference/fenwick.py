"""Fenwick level router (log-linear memory): docs/CONTRACT.md section 5, in PyTorch.

For tokens ``s ≤ t`` (0-based)::

    level(t, s) = 0 if s = t else 1 + floor(log2(t XOR s))

cuts the prefix ``[0, t]`` into Fenwick buckets, one per set bit of ``t``, plus the
token itself. The second query is a per-token router ``λ_t`` over those levels::

    o_t = scale · Σ_{s ≤ t} λ_t[level(t,s)] · exp(G_t - G_s) · (q_t · k_s) v_s,   G = cumsum(g)

Three references, all differentiable (autograd gives reference gradients), all
computing in the inputs' dtype (pass float64 for a reference):

- ``naive_fenwick``: the per-token recurrent form, one state per level. Moving
  from ``t`` to ``t+1``, where ``t`` ends in ``m`` one-bits, levels ``0..m`` merge
  (sum) into level ``m+1`` (the carry of the binary counter ``t -> t+1``); then
  every existing state decays by ``exp(g_{t+1})``; then the new token's own
  write, undecayed, is level 0 alone.
- ``quadratic_fenwick``: the masked ``T × T`` form above, through ``level(t, s)``.
- ``naive_fenwick_gdn2``: the GDN-2 variant. Every bucket is a GDN-2 state;
  every token applies the same transition ``(I - k_t (b_t ⊙ k_t)^T) diag(exp(g_t))``
  to every bucket (``reference.gdn2.gdn2_step`` with a zero write) and writes
  ``k_t (w_t ⊙ v_t)^T`` into its own level-0 bucket; buckets merge as above;
  ``o_t = scale · Σ_ℓ λ_t[ℓ] (S^(ℓ)_t)^T q_t``. With ``λ ≡ 1`` it is GDN-2.

Choices where CONTRACT is silent (written down here, as CONTRACT asks):

- No initial state: a prefix state would also need the position at which the
  sequence continues (the bucket boundaries depend on absolute token indices);
  every call starts at token 0 with all buckets empty.
- ``L`` may exceed ``1 + ceil(log2 T)``: levels that cannot occur are read as
  empty buckets (their ``λ`` gets a zero gradient). Fewer levels is an error.
- Final states (``output_final_state=True``): ``[B, H, L, K, V]``, bucket ``ℓ``
  after the last token, zeros for an empty bucket.
"""
from __future__ import annotations

import torch

from reference.gdn2 import gdn2_read, gdn2_step
from reference.progress import Ticker
from reference.validation import (FLOAT_DTYPES, check_cu_seqlens, check_dtype, check_gdn2_inputs,
                                  check_same_device, check_same_dtype, check_scale, check_shape, check_sizes,
                                  check_tensor, gdn2_sizes, sequences)


# --- levels ---------------------------------------------------------------------------

def min_levels(T: int) -> int:
    """``1 + ceil(log2 T)``: the levels a sequence of ``T`` tokens can use (exact in integers)."""
    return 1 + (T - 1).bit_length()


def fenwick_level(t: int, s: int) -> int:
    """``level(t, s)`` for ``0 ≤ s ≤ t``: 0 if ``s = t``, else ``1 + floor(log2(t XOR s))``."""
    if not 0 <= s <= t:
        raise ValueError(f"level(t, s) needs 0 <= s <= t, got t = {t}, s = {s}")
    x = t ^ s
    return 0 if x == 0 else x.bit_length()   # 1 + floor(log2 x) = number of binary digits of x


def fenwick_level_matrix(T: int, device=None) -> torch.Tensor:
    """``[T, T]`` int64 matrix of ``level(t, s)`` (row ``t``, column ``s``), ``-1`` where ``s > t``."""
    t = torch.arange(T, device=device)[:, None]
    s = torch.arange(T, device=device)[None, :]
    x = t ^ s
    # 1 + floor(log2 x) = #{b ≥ 0 : x ≥ 2^b}; exact in integers (0 for x = 0, i.e. s = t).
    level = sum(((x >> b) > 0).long() for b in range(max(T - 1, 1).bit_length()))
    return torch.where(s <= t, level, torch.full_like(level, -1))


def trailing_ones(n: int) -> int:
    """Number of trailing one-bits of ``n``: the length of the carry when counting ``n -> n+1``."""
    m = 0
    while n & 1:
        n >>= 1
        m += 1
    return m


# --- validation -----------------------------------------------------------------------

def check_level_scales(level_scales, B: int, T: int, H: int, longest: int | None = None):
    """``level_scales [B, T, H, L]`` with ``L ≥ 1 + ceil(log2 T)``. Returns ``L``. ``longest``:
    the longest sequence of a packed call (``cu_seqlens``), which sets the levels instead of ``T``."""
    check_tensor("level_scales", level_scales, ndim=4)
    if tuple(level_scales.shape[:3]) != (B, T, H):
        raise ValueError(f"level_scales must have shape [B, T, H, L] with (B, T, H) = {(B, T, H)}, "
                         f"got {tuple(level_scales.shape)}")
    L = level_scales.shape[-1]
    need = min_levels(T if longest is None else longest)
    if L < need:
        what = f"T = {T}" if longest is None else f"the longest packed sequence (cu_seqlens), T = {longest}"
        raise ValueError(f"level_scales must have at least 1 + ceil(log2 T) = {need} levels for {what}, "
                         f"got L = {L} (shape {tuple(level_scales.shape)})")
    return L


def longest_sequence(cu_seqlens) -> int:
    """The longest sequence of a checked ``cu_seqlens``."""
    return max(e - s for _, s, e in sequences(cu_seqlens))


def check_fenwick_inputs(q, k, v, g, level_scales, scale=None, dtypes=FLOAT_DTYPES, cu_seqlens=None):
    """CONTRACT section 5 shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H]``;
    level_scales ``[B, T, H, L]`` (``L`` for the longest sequence with ``cu_seqlens``,
    ``reference.validation.check_cu_seqlens``). Returns ``(B, T, H, K, V, L)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ndim=4)
    check_tensor("g", g, ndim=3)
    check_tensor("level_scales", level_scales, ndim=4)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("q must hold at least one token, got T = 0")
    check_shape("k", k, (B, T, H, K), "[B, T, H, K]")
    check_shape("v", v, (B, T, H, V), "[B, T, H, V]")
    check_shape("g", g, (B, T, H), "[B, T, H]")
    named = (("q", q), ("k", k), ("v", v), ("g", g), ("level_scales", level_scales))
    longest = None
    if cu_seqlens is not None:
        check_same_device(named)
        bounds = check_cu_seqlens(cu_seqlens, B, T, q.device)
        longest = max(e - s for s, e in zip(bounds[:-1], bounds[1:]))
    L = check_level_scales(level_scales, B, T, H, longest)
    check_same_dtype(named)
    check_dtype("q", q, dtypes)
    check_sizes(gdn2_sizes(B, T, H, K, V) + (("level_scales [B, T, H, L]", (B, T, H, L)),))
    check_same_device(named)
    check_scale(scale, q.dtype)
    return B, T, H, K, V, L


def check_fenwick_gdn2_inputs(q, k, v, g, b, w, level_scales, scale=None, cu_seqlens=None):
    """CONTRACT section 1 shapes for ``q, k, v, g, b, w`` plus ``level_scales [B, T, H, L]`` (``L`` for
    the longest sequence with ``cu_seqlens``). Returns ``(B, T, H, K, V, L)``."""
    B, T, H, K, V = check_gdn2_inputs(q, k, v, g, b, w, scale, cu_seqlens=cu_seqlens)
    L = check_level_scales(level_scales, B, T, H, None if cu_seqlens is None else longest_sequence(cu_seqlens))
    check_same_dtype((("q", q), ("level_scales", level_scales)))
    check_same_device((("q", q), ("level_scales", level_scales)))
    return B, T, H, K, V, L


# --- the per-token recurrent form -------------------------------------------------------

def _carry(buckets: list, t: int) -> None:
    """Moving from token ``t-1`` to ``t``: ``t-1`` ends in ``m`` one-bits, so levels
    ``0..m`` (all occupied) merge, by summing, into level ``m+1`` (empty)."""
    m = trailing_ones(t - 1)
    assert buckets[m + 1] is None, "the carry target of a binary counter is always empty"
    buckets[m + 1] = sum(buckets[: m + 1])
    buckets[: m + 1] = [None] * (m + 1)


def _read(buckets: list, q_t, lam_t, scale):
    """``o_t = scale · Σ_ℓ λ_t[ℓ] (S^(ℓ))^T q_t`` over the occupied buckets."""
    return sum(lam_t[:, :, level, None] * gdn2_read(S, q_t, scale)
               for level, S in enumerate(buckets) if S is not None)


def _final_states(buckets: list, like: torch.Tensor) -> torch.Tensor:
    """``[B, H, L, K, V]``, zeros for empty buckets."""
    return torch.stack([like.new_zeros(like.shape) if S is None else S for S in buckets], dim=2)


def naive_fenwick(q, k, v, g, level_scales, scale=None, output_final_state=False, cu_seqlens=None):
    """Per-token Fenwick log-linear attention, one state per level.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: scalar log-decay ``[B, T, H]``.
        level_scales: ``λ [B, T, H, L]``, ``L ≥ 1 + ceil(log2 T)``.
        scale: multiplies every read; default ``K ** -0.5``.
        output_final_state: also return the bucket states after the last token.
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``); each is computed as a separate call (its
            Fenwick counter starts at its first token), final states ``[N, H, L, K, V]``.

    Returns:
        ``(o [B, T, H, V], states [B, H, L, K, V] or None)`` in the inputs' dtype.
    """
    B, T, H, K, V, L = check_fenwick_inputs(q, k, v, g, level_scales, scale, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        parts = [naive_fenwick(*(x[:, s:e] for x in (q, k, v, g, level_scales)), scale, True)
                 for _, s, e in sequences(cu_seqlens)]
        return (torch.cat([o for o, _ in parts], dim=1),
                torch.cat([S for _, S in parts], dim=0) if output_final_state else None)
    scale = K ** -0.5 if scale is None else scale
    buckets = [None] * L                                   # buckets[ℓ]: [B, H, K, V], None while empty
    o = []
    tick = Ticker("naive_fenwick", T)                      # a time estimate on stderr for a long call
    for t in range(T):
        tick(t)
        if t > 0:
            _carry(buckets, t)                             # merge levels 0..m into m+1
        decay = torch.exp(g[:, t])[:, :, None, None]
        buckets = [None if S is None else decay * S for S in buckets]   # decay every existing state
        buckets[0] = k[:, t, :, :, None] * v[:, t, :, None, :]         # own write, undecayed: k_t v_t^T
        o.append(_read(buckets, q[:, t], level_scales[:, t], scale))
    return torch.stack(o, dim=1), (_final_states(buckets, buckets[0]) if output_final_state else None)


def naive_fenwick_gdn2(q, k, v, g, b, w, level_scales, scale=None, output_final_state=False, cu_seqlens=None):
    """The GDN-2 variant: every bucket is a GDN-2 state sharing the token transition.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]`` (CONTRACT section 1).
        level_scales: ``λ [B, T, H, L]``, ``L ≥ 1 + ceil(log2 T)``.
        scale: multiplies every read; default ``K ** -0.5``.
        output_final_state: also return the bucket states after the last token.
        cu_seqlens: N sequences packed in one row (``B = 1``), each a separate call with its own
            Fenwick counter; final states ``[N, H, L, K, V]`` (as in ``naive_fenwick``).

    Returns:
        ``(o [B, T, H, V], states [B, H, L, K, V] or None)``; the states sum to GDN-2's state.
    """
    B, T, H, K, V, L = check_fenwick_gdn2_inputs(q, k, v, g, b, w, level_scales, scale, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        parts = [naive_fenwick_gdn2(*(x[:, s:e] for x in (q, k, v, g, b, w, level_scales)), scale, True)
                 for _, s, e in sequences(cu_seqlens)]
        return (torch.cat([o for o, _ in parts], dim=1),
                torch.cat([S for _, S in parts], dim=0) if output_final_state else None)
    scale = K ** -0.5 if scale is None else scale
    buckets = [None] * L
    o = []
    tick = Ticker("naive_fenwick_gdn2", T)                 # a time estimate on stderr for a long call
    for t in range(T):
        tick(t)
        if t > 0:
            _carry(buckets, t)
        k_t, v_t, g_t, b_t, w_t = k[:, t], v[:, t], g[:, t], b[:, t], w[:, t]
        no_write = torch.zeros_like(w_t)
        # The transition (I - k (b ⊙ k)^T) diag(e^g) on every bucket: a GDN-2 step without its write.
        buckets = [None if S is None else gdn2_step(S, k_t, v_t, g_t, b_t, no_write) for S in buckets]
        buckets[0] = k_t[..., :, None] * (w_t * v_t)[..., None, :]   # own write k (w ⊙ v)^T, level 0
        o.append(_read(buckets, q[:, t], level_scales[:, t], scale))
    return torch.stack(o, dim=1), (_final_states(buckets, buckets[0]) if output_final_state else None)


# --- the quadratic masked form ----------------------------------------------------------

def quadratic_fenwick(q, k, v, g, level_scales, scale=None, cu_seqlens=None):
    """``o_t = scale Σ_{s≤t} λ_t[level(t,s)] exp(G_t - G_s) (q_t·k_s) v_s`` as ``T × T`` matrices.

    Shapes (and ``cu_seqlens``) as in ``naive_fenwick``; returns ``o [B, T, H, V]``.
    """
    B, T, H, K, V, L = check_fenwick_inputs(q, k, v, g, level_scales, scale, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        return torch.cat([quadratic_fenwick(*(x[:, s:e] for x in (q, k, v, g, level_scales)), scale)
                          for _, s, e in sequences(cu_seqlens)], dim=1)
    scale = K ** -0.5 if scale is None else scale
    return masked_fenwick(q, k, v, g, level_scales, scale, fenwick_level_matrix(T, device=q.device))


def masked_fenwick(q, k, v, g, level_scales, scale, levels):
    """The quadratic form for a given ``[T, T]`` level matrix (``-1`` = not attended); unchecked."""
    B, T, H, K = q.shape
    causal = levels >= 0
    # log_decay[t, s] = Σ_{u=s+1..t} g_u, summed per (t, s) rather than as G_t - G_s of cumulative
    # sums: after a g = -inf (a full forget) that difference is -inf - (-inf) = NaN.
    gu = g.transpose(1, 2)[..., :, None].expand(B, H, T, T)               # gu[.., u, s] = g_u
    after_s = torch.ones(T, T, dtype=torch.bool, device=g.device).tril(-1)   # u > s
    G_ts = torch.cumsum(torch.where(after_s, gu, torch.zeros((), dtype=g.dtype, device=g.device)), dim=-2)
    # Mask the exponent (not the product) so no exp(+large) appears, in value or in gradient.
    log_decay = torch.where(causal, G_ts, float("-inf"))
    decay = torch.exp(log_decay)                                           # exp(G_t - G_s)  [B, H, T, S]
    lam = level_scales.permute(0, 2, 1, 3)                                # [B, H, T, L]
    lam_ts = torch.gather(lam, -1, levels.clamp(min=0).expand(B, H, T, T))  # λ_t[level(t, s)]
    scores = torch.einsum("bthk,bshk->bhts", q, k)                        # q_t · k_s
    A = torch.where(causal, lam_ts * decay * scores, torch.zeros((), dtype=q.dtype, device=q.device))
    return scale * torch.einsum("bhts,bshv->bthv", A, v)
