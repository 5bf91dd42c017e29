"""The promote scan's forward in transition form (an alternative to ``promote_scan_fwd``; same
inputs, same stored states, same math).

A firing is linear in the state it rewrites (SPEC section 2):

    M_{m+1} = A_m M_m + b_m,   A_m = diag(e^{γ_m}) − κ_m^T (β_m ⊙ κ_m ⊙ e^{γ_m})   [K, K]
                               b_m = κ_m^T (ω_m ⊙ ν_m)                           [K, V]

(``e^{γ}`` broadcast along the pair axis: ``(β ⊙ κ) diag(e^γ)``). Neither ``A_m`` nor ``b_m``
depends on the state, so the chain from firing to firing is one ``[K, K] @ [K, BV]`` product
whatever the number of pairs n, where ``promote_scan_fwd`` runs two dependent products per pair
block (the erase read ``(β ⊙ κ) M'``, then the write ``κ^T (…)``). Two forms:

- ``"inline"``: the chain's program makes ``A_m`` and ``b_m`` itself, each firing, from the
  pairs (products over the pair blocks that do not wait for the state).
- ``"streamed"``: ``promote_transitions_kernel`` makes every ``A_m`` first, one program per
  (firing, batch, head), all in parallel, into a ``[B, F, H, K, K]`` float32 buffer; the chain
  loads them (loads that do not depend on the state, which Triton's pipeliner can issue ahead)
  and makes ``b_m`` itself.

The dots' input precision is an argument as in ``promote_scan`` (``"ieee"`` or ``"tf32"``).
Layouts are ``promote_scan``'s (fla style); packed sequences (``fire_offsets``) as there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.promote_scan import (_batch_strided, _check, _check_precision, _check_states, _state_rows,
                                    block_sizes, launch_options, state_block)

FORMS = ("inline", "streamed")


@triton.jit
def pair_rows(x, i_f, i_n, N, o_d, m_d, D: tl.constexpr, BN: tl.constexpr):
    """Rows ``i_n·BN …`` of firing ``i_f``'s ``[N, D]`` pair tensor ``x`` (columns ``o_d``),
    rows ≥ N loaded as 0."""
    o_n = i_n * BN + tl.arange(0, BN)
    return tl.load(x + i_f * N * D + o_n[:, None] * D + o_d[None, :],
                   mask=(o_n < N)[:, None] & m_d[None, :], other=0.0)


@triton.jit
def transition(kappa, beta, gamma, i_f, N, o_k, m_k, K: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """``A = diag(e^γ) − Σ_blocks κ^T (β ⊙ κ ⊙ e^γ)`` of firing ``i_f`` (``[BK, BK]``, rows and
    columns ≥ K zero)."""
    b_decay = tl.where(m_k, tl.exp(tl.load(gamma + i_f * K + o_k, mask=m_k, other=0.0)), 0.0)
    b_a = tl.where(o_k[:, None] == o_k[None, :], b_decay[:, None], 0.0)
    for i_n in range(0, tl.cdiv(N, BN)):
        b_kappa = pair_rows(kappa, i_f, i_n, N, o_k, m_k, K, BN)
        b_beta = pair_rows(beta, i_f, i_n, N, o_k, m_k, K, BN)
        b_a -= tl.dot(tl.trans(b_kappa), b_beta * b_kappa * b_decay[None, :], input_precision=DOT_PRECISION)
    return b_a


@triton.jit
def write_term(kappa, nu, omega, i_f, N, o_k, m_k, o_v, m_v, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``b = Σ_blocks κ^T (ω ⊙ ν)`` of firing ``i_f`` on the program's V block (``[BK, BV]``)."""
    b_b = tl.zeros([BK, BV], dtype=tl.float32)
    for i_n in range(0, tl.cdiv(N, BN)):
        b_kappa = pair_rows(kappa, i_f, i_n, N, o_k, m_k, K, BN)
        b_nu = pair_rows(nu, i_f, i_n, N, o_v, m_v, V, BN)
        b_omega = pair_rows(omega, i_f, i_n, N, o_v, m_v, V, BN)
        b_b += tl.dot(tl.trans(b_kappa), b_omega * b_nu, input_precision=DOT_PRECISION)
    return b_b


@triton.jit(do_not_specialize=["N"])
def promote_transitions_kernel(kappa, beta, gamma, a, N, K: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                               DOT_PRECISION: tl.constexpr):
    """``a[i_f] = A`` of firing row ``i_f`` (the pairs' leading ``B·F·H`` rows, flattened)."""
    i_f = tl.program_id(0).to(tl.int64)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b_a = transition(kappa, beta, gamma, i_f, N, o_k, m_k, K, BK, BN, DOT_PRECISION)
    tl.store(a + i_f * K * K + o_k[:, None] * K + o_k[None, :], b_a, mask=m_k[:, None] & m_k[None, :])


@triton.jit(do_not_specialize=["F", "N"])
def promote_scan_fwd_transition_kernel(
    m0, kappa, nu, beta, omega, gamma, a, states, fire_offsets,
    F, N, stride_sb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr,
    HAS_M0: tl.constexpr, STREAMED: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """For one (batch, head, V block), ``M`` ([K, BV], float32) from ``m0`` (or 0):

        states[0] = M
        for m in 0 .. F-1:
            M = A[m] @ M + b[m]          # A[m] loaded (STREAMED) or made here, b[m] made here
            states[m + 1] = M

    ``IS_VARLEN``: packed sequences as in ``promote_scan_fwd_kernel``.
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    if IS_VARLEN:
        f0 = tl.load(fire_offsets + i_b).to(tl.int64)
        n_fire = tl.load(fire_offsets + i_b + 1).to(tl.int64) - f0
        p_states = states + (f0 + i_b) * H * K * V
    else:
        f0 = i_b.to(tl.int64) * F
        n_fire = F
        p_states = states + i_b.to(tl.int64) * stride_sb

    b_m = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_M0:
        b_m += tl.load(m0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(p_states + i_h * K * V + o_kv, b_m, mask=m_kv)

    for m in range(0, n_fire):
        i_f = (f0 + m) * H + i_h
        if STREAMED:
            b_a = tl.load(a + i_f * K * K + o_k[:, None] * K + o_k[None, :],
                          mask=m_k[:, None] & m_k[None, :], other=0.0)
        else:
            b_a = transition(kappa, beta, gamma, i_f, N, o_k, m_k, K, BK, BN, DOT_PRECISION)
        b_b = write_term(kappa, nu, omega, i_f, N, o_k, m_k, o_v, m_v, K, V, BK, BN, BV, DOT_PRECISION)
        b_m = tl.dot(b_a, b_m, input_precision=DOT_PRECISION) + b_b
        tl.store(p_states + ((m + 1) * H + i_h) * K * V + o_kv, b_m, mask=m_kv)


def promote_transitions(kappa, beta, gamma, block_n: int | None = None, precision: str = "ieee"):
    """Every firing's ``A`` (module docstring): ``[B, F, H, K, K]`` float32 from ``κ, β [B, F, H, n, K]``,
    ``γ [B, F, H, K]``."""
    B, F, H, n, K = kappa.shape
    _check_precision(precision)
    BK, BN, _ = block_sizes(K, K, n, None, block_n)
    a = kappa.new_empty(B, F, H, K, K)
    if a.numel():
        promote_transitions_kernel[(B * F * H,)](kappa.contiguous(), beta.contiguous(), gamma.contiguous(), a, n,
                                                  K=K, BK=BK, BN=BN, DOT_PRECISION=precision,
                                                  num_warps=8 if BK >= 128 else 4)
    return a


def promote_scan_fwd_transition(M0, kappa, nu, beta, omega, gamma, block_v: int | None = None,
                                block_n: int | None = None, out: torch.Tensor | None = None,
                                precision: str = "ieee", fire_offsets: torch.Tensor | None = None,
                                form: str = "inline", num_warps: int | None = None,
                                num_stages: int | None = None):
    """``promote_scan_fwd`` (same arguments, same result) in transition form ``form``
    (``"inline"`` or ``"streamed"``, module docstring)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    B, F, H, n, K, V = _check(M0, kappa, nu, beta, omega, gamma, fire_offsets)
    _check_precision(precision)
    BK, BN, BV = block_sizes(K, V, n, block_v, block_n)
    shape = (*_state_rows(B, F, fire_offsets), H, K, V)
    states = kappa.new_empty(shape) if out is None else _check_states("out", out, shape)
    if not _batch_strided(states):
        raise ValueError(f"out must be contiguous but for its batch stride (a slice along dim 1 of a "
                         f"contiguous buffer), got strides {states.stride()}")
    kappa, nu, beta, omega, gamma = (x.contiguous() for x in (kappa, nu, beta, omega, gamma))
    a = promote_transitions(kappa, beta, gamma, block_n, precision) if form == "streamed" else None
    programs = B if fire_offsets is None else fire_offsets.numel() - 1
    promote_scan_fwd_transition_kernel[(triton.cdiv(V, BV), programs * H)](
        M0.contiguous() if M0 is not None else None, kappa, nu, beta, omega, gamma, a, states, fire_offsets,
        F, n, states.stride(0), H=H, K=K, V=V, BK=BK, BN=BN, BV=BV, HAS_M0=M0 is not None,
        STREAMED=form == "streamed", DOT_PRECISION=precision, IS_VARLEN=fire_offsets is not None,
        **launch_options(BK, BV, num_warps, num_stages))
    return states
