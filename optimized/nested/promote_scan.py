"""The update stage of Nested GDN-2 levels ℓ ≥ 1: a Triton scan over firings (CONTRACT section 2).

One firing ``m`` of a level takes the state ``M_m`` to

    M'      = diag(exp(γ_m)) M_m                      # decay once per firing
    M_{m+1} = M' + κ_m^T (ω_m ⊙ ν_m - (β_m ⊙ κ_m) M')   # erase and write all n pairs at once

with the pairs (``κ, β [n, K]``, ``ν, ω [n, V]``) and the decay ``γ [K]`` already
probed from the level below. Each program owns one (batch, head, block of V
columns) and carries ``M[:, block]`` through all firings in registers; the update
never mixes V columns, and K is not split (the erase contracts over it). The
forward stores one state per firing (not per chunk): ``states[:, m]`` is the
state after ``m`` firings, ``states[:, 0]`` the initial state.

The backward is a hand-written reverse scan. Quantities reduced over V (the
gradients of ``κ``, ``β``, ``γ``) are written per V block into partial buffers and
summed afterwards (no atomics: bitwise reproducible). It accepts a gradient on
every stored state (reads, the final state, the probes of the level above).

Each scan has a second kernel (``prefetch=True``) with the same arithmetic in the same order
whose operands that do not depend on the carried state are loaded a step before they are used,
so that their memory latency is not a link of the chain of firings; the nested op runs the
plain kernels (bench/NOTES.md compares the two).

Layouts (fla style, firing axis where fla has the chunk axis):
``M0 [B, H, K, V]``; ``κ, β [B, F, H, n, K]``; ``ν, ω [B, F, H, n, V]``;
``γ [B, F, H, K]``; ``states [B, F+1, H, K, V]``. Everything float32 (inputs, states,
accumulation). The dots' input precision is an argument, never ``TRITON_F32_DEFAULT``:
``"ieee"`` (the default; float32 runs and every float32 test) or ``"tf32"`` (tensor cores,
operands rounded to TF32's 10-bit mantissa, relative 2^-11 per product; the nested op uses
it when its activations are bf16, whose own rounding is 2^-8). The interpreter
computes every dot in float32 whatever the precision.

Kernels address their blocks with explicit pointer arithmetic and masks for ragged
edges (Triton 3.9 removed ``tl.make_block_ptr``; the same code runs compiled on CUDA
and under Triton's interpreter on CPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fits import first_that_fits
from optimized.host_math import cdiv, next_power_of_2


@triton.jit
def state_block(i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and mask of one program's ``[BK, BV]`` block of a ``[K, V]`` state (V block
    ``i_v``): ``(o_k, m_k, o_v, m_v, o_kv, m_kv)``."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    return o_k, m_k, o_v, m_v, o_k[:, None] * V + o_v[None, :], m_k[:, None] & m_v[None, :]


@triton.jit
def pair_offsets(i_n, N, o_k, m_k, o_v, m_v, K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr):
    """Offsets and masks of pair block ``i_n`` within a firing's ``[N, K]`` and ``[N, V]`` rows
    (rows ≥ N masked): ``(o_nk, m_nk, o_nv, m_nv)``."""
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    return (o_n[:, None] * K + o_k[None, :], m_n[:, None] & m_k[None, :],
            o_n[:, None] * V + o_v[None, :], m_n[:, None] & m_v[None, :])


@triton.jit
def program_firings(fire_offsets, i_b, F, IS_VARLEN: tl.constexpr):
    """The program's firings on the firing axis: ``(f0, n_fire)``, batch row ``i_b``'s ``F``, or
    with ``IS_VARLEN`` sequence ``i_b``'s ``fire_offsets[i_b] .. fire_offsets[i_b + 1] - 1``."""
    if IS_VARLEN:
        f0 = tl.load(fire_offsets + i_b).to(tl.int64)
        n_fire = tl.load(fire_offsets + i_b + 1).to(tl.int64) - f0
    else:
        f0 = i_b.to(tl.int64) * F
        n_fire = F
    return f0, n_fire


@triton.jit
def program_states(states, stride_sb, f0, i_b, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   IS_VARLEN: tl.constexpr):
    """The program's first stored-state row: batch row ``i_b`` (``stride_sb`` apart), or with
    ``IS_VARLEN`` row ``f0 + i_b`` of the one packed row (a sequence has one state more than
    firings)."""
    if IS_VARLEN:
        p = states + (f0 + i_b) * H * K * V
    else:
        p = states + i_b.to(tl.int64) * stride_sb
    return p


@triton.jit
def pair_block(kappa, nu, beta, omega, i_f, i_n, N, o_k, m_k, o_v, m_v,
               K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr):
    """Pair block ``i_n`` of firing ``i_f`` (rows ≥ N masked to 0): ``(κ, β [BN, BK], ν, ω
    [BN, BV], o_nk, m_nk, o_nv, m_nv)``, the offsets to store gradients of the same shapes."""
    o_nk, m_nk, o_nv, m_nv = pair_offsets(i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
    b_kappa = tl.load(kappa + i_f * N * K + o_nk, mask=m_nk, other=0.0)
    b_beta = tl.load(beta + i_f * N * K + o_nk, mask=m_nk, other=0.0)
    b_nu = tl.load(nu + i_f * N * V + o_nv, mask=m_nv, other=0.0)
    b_omega = tl.load(omega + i_f * N * V + o_nv, mask=m_nv, other=0.0)
    return b_kappa, b_beta, b_nu, b_omega, o_nk, m_nk, o_nv, m_nv


# F (firings) and N (pairs per firing) are runtime sizes, not specialised: a new level
# depth, schedule or query count reuses the compiled kernel (only H, K, V and the blocks
# pick a variant). The batch strides of the stored states are specialised (on divisibility
# by 16): it lets Triton prove the state tiles aligned and move them 16 bytes at a time.
@triton.jit(do_not_specialize=["F", "N"])
def promote_scan_fwd_kernel(
    m0, kappa, nu, beta, omega, gamma, states, fire_offsets,
    F, N, stride_sb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr,
    HAS_M0: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """For one (batch, head, V block), with ``M`` ([K, BV], float32) from ``m0`` (or 0):

        states[0] = M
        for m in 0 .. F-1:
            M' = exp(γ[m])[:, None] ⊙ M
            M  = M' + Σ_blocks κ[m]^T @ (ω[m] ⊙ ν[m] - (β[m] ⊙ κ[m]) @ M')
            states[m + 1] = M

    The pairs are visited in blocks of ``BN``; every block reads the same ``M'`` (the
    state before the firing) and the writes are summed: all pairs act at once.
    Rows ≥ n of a pair block, rows ≥ K and columns ≥ V of the state are masked
    (loaded as 0, never stored): padded pairs have κ = 0 and change nothing.

    ``IS_VARLEN`` (packed sequences, ``B = 1``): the program's batch index is a sequence i,
    whose firings are ``fire_offsets[i] .. fire_offsets[i + 1] - 1`` of the firing axis and
    whose states are rows ``fire_offsets[i] + i ..`` of ``states`` (one more than its firings).
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    f0, n_fire = program_firings(fire_offsets, i_b, F, IS_VARLEN)
    p_states = program_states(states, stride_sb, f0, i_b, H, K, V, IS_VARLEN)

    b_m = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_M0:
        b_m += tl.load(m0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(p_states + i_h * K * V + o_kv, b_m, mask=m_kv)

    for m in range(0, n_fire):
        i_f = (f0 + m) * H + i_h                             # firing m of this (batch, head)
        b_gamma = tl.load(gamma + i_f * K + o_k, mask=m_k, other=0.0)
        b_md = b_m * tl.exp(b_gamma)[:, None]               # M'
        b_m = b_md
        for i_n in range(0, tl.cdiv(N, BN)):
            b_kappa, b_beta, b_nu, b_omega, o_nk, m_nk, o_nv, m_nv = pair_block(
                kappa, nu, beta, omega, i_f, i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
            # ω ⊙ ν - (β ⊙ κ) M'
            b_d = b_omega * b_nu - tl.dot(b_beta * b_kappa, b_md, input_precision=DOT_PRECISION)
            b_m += tl.dot(tl.trans(b_kappa), b_d, input_precision=DOT_PRECISION)
        tl.store(p_states + ((m + 1) * H + i_h) * K * V + o_kv, b_m, mask=m_kv)


@triton.jit
def pair_block_ahead(kappa, nu, beta, omega, i_f, i_n, valid, N, o_k, m_k, o_v, m_v,
                     K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr):
    """``pair_block``'s operands ``(κ, β [BN, BK], ν, ω [BN, BV])`` of block ``i_n`` of firing
    ``i_f``, all masked to 0 unless ``valid``: the prefetching scans load a step ahead, past
    their last step too. Loaded a step early, a block's memory latency overlaps the step before
    it instead of waiting in the chain."""
    o_nk, m_nk, o_nv, m_nv = pair_offsets(i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
    m_nk, m_nv = m_nk & valid, m_nv & valid
    o_nk, o_nv = i_f * N * K + o_nk, i_f * N * V + o_nv
    return (tl.load(kappa + o_nk, mask=m_nk, other=0.0), tl.load(beta + o_nk, mask=m_nk, other=0.0),
            tl.load(nu + o_nv, mask=m_nv, other=0.0), tl.load(omega + o_nv, mask=m_nv, other=0.0))


@triton.jit(do_not_specialize=["F", "N"])
def promote_scan_fwd_prefetch_kernel(
    m0, kappa, nu, beta, omega, gamma, states, fire_offsets,
    F, N, stride_sb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr,
    HAS_M0: tl.constexpr, DOT_PRECISION: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """``promote_scan_fwd_kernel``'s recurrence, the same operations in the same order, with every
    operand that does not depend on ``M`` loaded one step ahead: a pair block while the block
    before it is in the dots, the next firing's decay ``γ`` while this firing's blocks run. The
    chain of firings then waits on its own arithmetic, not on memory."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    f0, n_fire = program_firings(fire_offsets, i_b, F, IS_VARLEN)
    p_states = program_states(states, stride_sb, f0, i_b, H, K, V, IS_VARLEN)
    NB = tl.cdiv(N, BN)

    b_m = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_M0:
        b_m += tl.load(m0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(p_states + i_h * K * V + o_kv, b_m, mask=m_kv)

    b_gamma = tl.load(gamma + (f0 * H + i_h) * K + o_k, mask=m_k & (n_fire > 0), other=0.0)
    b_kappa, b_beta, b_nu, b_omega = pair_block_ahead(kappa, nu, beta, omega, f0 * H + i_h, 0, n_fire > 0, N,
                                                      o_k, m_k, o_v, m_v, K, V, BN)
    for m in range(0, n_fire):
        b_md = b_m * tl.exp(b_gamma)[:, None]               # M'
        b_gamma = tl.load(gamma + ((f0 + m + 1) * H + i_h) * K + o_k, mask=m_k & (m + 1 < n_fire), other=0.0)
        b_m = b_md
        for i_n in range(0, NB):
            t = m * NB + i_n + 1                             # the next step: firing t // NB, block t % NB
            n_kappa, n_beta, n_nu, n_omega = pair_block_ahead(
                kappa, nu, beta, omega, (f0 + t // NB) * H + i_h, t % NB, t < n_fire * NB, N,
                o_k, m_k, o_v, m_v, K, V, BN)
            # ω ⊙ ν - (β ⊙ κ) M'
            b_d = b_omega * b_nu - tl.dot(b_beta * b_kappa, b_md, input_precision=DOT_PRECISION)
            b_m += tl.dot(tl.trans(b_kappa), b_d, input_precision=DOT_PRECISION)
            b_kappa, b_beta, b_nu, b_omega = n_kappa, n_beta, n_nu, n_omega
        tl.store(p_states + ((m + 1) * H + i_h) * K * V + o_kv, b_m, mask=m_kv)


@triton.jit
def reverse_pair_block(b_kappa, b_beta, b_nu, b_omega, b_md, b_dm, b_dmd, i_f, part, N, o_nk, m_nk, o_nv, m_nv,
                       dnu, domega, dkappa_part, dbeta_part, K: tl.constexpr, V: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """One pair block of a reverse-scan firing (``promote_scan_bwd_kernel``'s lines from ``P`` to
    ``dM'``): stores the block's ``dν, dω`` and its ``dκ, dβ`` partials, returns ``dM'`` less the
    block's ``Pᵀ dD``."""
    b_p = b_beta * b_kappa                                      # P
    b_d = b_omega * b_nu - tl.dot(b_p, b_md, input_precision=DOT_PRECISION)             # D

    b_dd = tl.dot(b_kappa, b_dm, input_precision=DOT_PRECISION)                         # dD
    tl.store(dnu + i_f * N * V + o_nv, b_dd * b_omega, mask=m_nv)
    tl.store(domega + i_f * N * V + o_nv, b_dd * b_nu, mask=m_nv)
    b_dp = -tl.dot(b_dd, tl.trans(b_md), input_precision=DOT_PRECISION)                 # dP
    b_dkappa = tl.dot(b_d, tl.trans(b_dm), input_precision=DOT_PRECISION) + b_dp * b_beta
    tl.store(dkappa_part + (part + i_f) * N * K + o_nk, b_dkappa, mask=m_nk)
    tl.store(dbeta_part + (part + i_f) * N * K + o_nk, b_dp * b_kappa, mask=m_nk)
    return b_dmd - tl.dot(tl.trans(b_p), b_dd, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=["F", "B", "N"])
def promote_scan_bwd_kernel(
    states, kappa, nu, beta, omega, gamma, dstates, fire_offsets,
    dm0, dkappa_part, dnu, dbeta_part, domega, dgamma_part,
    F, B, N, stride_sb, stride_db,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Reverse scan for one (batch, head, V block). ``dM`` ([K, BV]) starts at ``dstates[F]``;
    for m = F-1 .. 0, with ``M' = exp(γ) ⊙ states[m]`` and, per pair, ``P = β ⊙ κ``,
    ``D = ω ⊙ ν - P M'``:

        dD        = κ @ dM                                  [n, BV]
        dν, dω    = dD ⊙ ω, dD ⊙ ν                          (complete for this V block)
        dP        = -dD @ M'^T                              [n, K]
        dκ_part   = D @ dM^T + dP ⊙ β                       [n, K]   (summed over V blocks later)
        dβ_part   = dP ⊙ κ                                  [n, K]
        dM'       = dM - Σ_pairs P^T @ dD
        dγ_part   = Σ_v dM' ⊙ M'                            [K]
        dM        = exp(γ) ⊙ dM' + dstates[m]

    Partials go to ``d*_part[i_v]``; at the end ``dm0 = dM`` (the initial-state gradient).
    ``IS_VARLEN``: sequences as in ``promote_scan_fwd_kernel`` (``B = 1``, ``F`` the packed
    firings: the partial buffers' size).
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    part = i_v.to(tl.int64) * B * F * H        # this V block's partial buffer, counted in firings
    f0, n_fire = program_firings(fire_offsets, i_b, F, IS_VARLEN)
    p_states = program_states(states, stride_sb, f0, i_b, H, K, V, IS_VARLEN)
    p_dstates = program_states(dstates, stride_db, f0, i_b, H, K, V, IS_VARLEN)

    b_dm = tl.load(p_dstates + (n_fire * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
    for i in range(0, n_fire):
        m = n_fire - 1 - i
        i_f = (f0 + m) * H + i_h
        b_decay = tl.exp(tl.load(gamma + i_f * K + o_k, mask=m_k, other=0.0))
        b_m = tl.load(p_states + (m * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
        b_md = b_m * b_decay[:, None]                                   # M'
        b_dmd = b_dm                                                    # dM', accumulated over pairs
        for i_n in range(0, tl.cdiv(N, BN)):
            b_kappa, b_beta, b_nu, b_omega, o_nk, m_nk, o_nv, m_nv = pair_block(
                kappa, nu, beta, omega, i_f, i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
            b_dmd = reverse_pair_block(b_kappa, b_beta, b_nu, b_omega, b_md, b_dm, b_dmd, i_f, part, N,
                                       o_nk, m_nk, o_nv, m_nv, dnu, domega, dkappa_part, dbeta_part,
                                       K, V, DOT_PRECISION)
        tl.store(dgamma_part + (part + i_f) * K + o_k, tl.sum(b_dmd * b_md, axis=1), mask=m_k)

        b_dm = b_dmd * b_decay[:, None]
        b_dm += tl.load(p_dstates + (m * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(dm0 + i_bh.to(tl.int64) * K * V + o_kv, b_dm, mask=m_kv)


@triton.jit(do_not_specialize=["F", "B", "N"])
def promote_scan_bwd_prefetch_kernel(
    states, kappa, nu, beta, omega, gamma, dstates, fire_offsets,
    dm0, dkappa_part, dnu, dbeta_part, domega, dgamma_part,
    F, B, N, stride_sb, stride_db,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """``promote_scan_bwd_kernel``'s reverse scan, the same operations in the same order, with the
    operands that do not depend on ``dM`` loaded ahead: the next firing's stored state and decay,
    and each pair block, one step before they are used. The steps walk firings from the last, the
    blocks of a firing from the first. ``dstates[m]`` is loaded where it is added, as in the plain
    kernel: held from the firing's start as well, its ``[BK, BV]`` tile made the kernel spill at
    K = 128, BV = 64 (bench/NOTES.md)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    part = i_v.to(tl.int64) * B * F * H        # this V block's partial buffer, counted in firings
    f0, n_fire = program_firings(fire_offsets, i_b, F, IS_VARLEN)
    p_states = program_states(states, stride_sb, f0, i_b, H, K, V, IS_VARLEN)
    p_dstates = program_states(dstates, stride_db, f0, i_b, H, K, V, IS_VARLEN)
    NB = tl.cdiv(N, BN)

    b_dm = tl.load(p_dstates + (n_fire * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
    last = n_fire - 1
    b_gamma = tl.load(gamma + ((f0 + last) * H + i_h) * K + o_k, mask=m_k & (last >= 0), other=0.0)
    b_m = tl.load(p_states + (last * H + i_h) * K * V + o_kv, mask=m_kv & (last >= 0), other=0.0)
    b_kappa, b_beta, b_nu, b_omega = pair_block_ahead(kappa, nu, beta, omega, (f0 + last) * H + i_h, 0, last >= 0,
                                                      N, o_k, m_k, o_v, m_v, K, V, BN)
    for i in range(0, n_fire):
        m = n_fire - 1 - i
        i_f = (f0 + m) * H + i_h
        b_decay = tl.exp(b_gamma)
        b_md = b_m * b_decay[:, None]                                   # M'
        b_gamma = tl.load(gamma + ((f0 + m - 1) * H + i_h) * K + o_k, mask=m_k & (m > 0), other=0.0)
        b_m = tl.load(p_states + ((m - 1) * H + i_h) * K * V + o_kv, mask=m_kv & (m > 0), other=0.0)
        b_dmd = b_dm                                                    # dM', accumulated over pairs
        for i_n in range(0, NB):
            t = i * NB + i_n + 1                                        # the next step
            n_kappa, n_beta, n_nu, n_omega = pair_block_ahead(
                kappa, nu, beta, omega, (f0 + n_fire - 1 - t // NB) * H + i_h, t % NB, t < n_fire * NB, N,
                o_k, m_k, o_v, m_v, K, V, BN)
            o_nk, m_nk, o_nv, m_nv = pair_offsets(i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
            b_dmd = reverse_pair_block(b_kappa, b_beta, b_nu, b_omega, b_md, b_dm, b_dmd, i_f, part, N,
                                       o_nk, m_nk, o_nv, m_nv, dnu, domega, dkappa_part, dbeta_part,
                                       K, V, DOT_PRECISION)
            b_kappa, b_beta, b_nu, b_omega = n_kappa, n_beta, n_nu, n_omega
        tl.store(dgamma_part + (part + i_f) * K + o_k, tl.sum(b_dmd * b_md, axis=1), mask=m_k)

        b_dm = b_dmd * b_decay[:, None]
        b_dm += tl.load(p_dstates + (m * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(dm0 + i_bh.to(tl.int64) * K * V + o_kv, b_dm, mask=m_kv)


def block_sizes(K: int, V: int, n: int, block_v: int | None = None,
                block_n: int | None = None, reverse: bool = False,
                precision: str = "ieee") -> tuple[int, int, int]:
    """``BK`` covers all of K (≥ 16 for ``tl.dot``); pairs go in blocks of ``BN`` (16 by default:
    at 32 the reverse scan's float32 pair tiles spill registers at K = 128, at 16 neither scan
    does); ``BV`` splits V across programs, 16 when K > 128, else by default: 64 in the reverse
    scan (``reverse``: half the programs of 32, each writing half as many per-V-block partials of
    ``dκ, dβ, dγ``), 128 in a TF32 forward scan (``precision``; one program per (batch, head) at
    V ≤ 128: its ``(β ⊙ κ) M'`` product is a tensor-core product as wide as the state) and 32 in
    an IEEE one (its dots are FMA loops: wider blocks were slower). Measured: bench/NOTES.md. The
    wide defaults need more shared memory than some GPUs give a block: both scans fall back to
    32 on ``OutOfResources``, then to one pipeline stage (``_fallbacks``)."""
    BK = max(16, next_power_of_2(K))
    if block_n is None:
        block_n = 16
    BN = max(16, min(next_power_of_2(block_n), next_power_of_2(n)))
    if block_v is None:
        block_v = (64 if reverse else 128 if precision == "tf32" else 32) if BK <= 128 else 16
    BV = max(16, min(next_power_of_2(block_v), next_power_of_2(V)))
    return BK, BN, BV


def num_warps(BK: int, BV: int) -> int:
    """More warps for big state blocks (the [K, BV] state and its gradient live in registers)."""
    return 4 if BK * BV <= 64 * 32 else 8


def launch_options(BK: int, BV: int, warps: int | None, stages: int | None) -> dict:
    """The launch's ``num_warps`` (default ``num_warps(BK, BV)``) and ``num_stages`` (default:
    Triton's), checked: a benchmark (``bench.scan_ab``) times other choices side by side."""
    opts = {"num_warps": num_warps(BK, BV) if warps is None else warps}
    if opts["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be a power of two from 1 to 16, got {warps!r}")
    if stages is not None:
        if not isinstance(stages, int) or not 1 <= stages <= 6:
            raise ValueError(f"num_stages must be an int from 1 to 6, got {stages!r}")
        opts["num_stages"] = stages
    return opts


def _check(M0, kappa, nu, beta, omega, gamma, fire_offsets=None):
    B, F, H, n, K = kappa.shape
    V = nu.shape[-1]
    seqs = B if fire_offsets is None else _check_fire_offsets(fire_offsets, kappa)
    for name, x, shape in (("kappa", kappa, (B, F, H, n, K)), ("beta", beta, (B, F, H, n, K)),
                           ("nu", nu, (B, F, H, n, V)), ("omega", omega, (B, F, H, n, V)),
                           ("gamma", gamma, (B, F, H, K)), ("M0", M0, (seqs, H, K, V))):
        if x is None:
            continue
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
        if x.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {x.dtype}")
    return B, F, H, n, K, V


def _check_fire_offsets(fire_offsets, kappa) -> int:
    """Packed sequences: ``fire_offsets`` int32 ``[n + 1]`` on kappa's device, the pairs one row
    (``B = 1``). Returns n. The values (nondecreasing, from 0 to F) live on the device and are not
    read back: ``optimized.nested.plan`` makes them."""
    if not isinstance(fire_offsets, torch.Tensor):
        raise TypeError(f"fire_offsets must be a torch.Tensor or None, got {type(fire_offsets).__name__}")
    if fire_offsets.dim() != 1 or fire_offsets.numel() < 2 or fire_offsets.dtype != torch.int32:
        raise ValueError(f"fire_offsets must be int32 [n + 1] with n >= 1 sequences, got "
                         f"{fire_offsets.dtype} {tuple(fire_offsets.shape)}")
    if fire_offsets.device != kappa.device:
        raise ValueError(f"fire_offsets is on {fire_offsets.device}, expected {kappa.device} (the pairs' device)")
    if kappa.shape[0] != 1:
        raise ValueError(f"packed sequences (fire_offsets) need the pairs in one row (B = 1), got B = {kappa.shape[0]}")
    return fire_offsets.numel() - 1


def _state_rows(B: int, F: int, fire_offsets) -> tuple:
    """The stored states' leading dims: ``(B, F + 1)``, or ``(1, F + n)`` for n packed sequences."""
    return (B, F + 1) if fire_offsets is None else (1, F + fire_offsets.numel() - 1)


PRECISIONS = ("ieee", "tf32")


def _check_prefetch(prefetch: bool) -> bool:
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be a bool, got {type(prefetch).__name__}")
    return prefetch


def _check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def promote_scan_fwd(M0, kappa, nu, beta, omega, gamma, block_v: int | None = None,
                     block_n: int | None = None, out: torch.Tensor | None = None, precision: str = "ieee",
                     fire_offsets: torch.Tensor | None = None, num_warps: int | None = None,
                     num_stages: int | None = None, prefetch: bool = False):
    """All firings of one level: ``states [B, F+1, H, K, V]`` (``states[:, 0]`` = ``M0`` or 0).

    ``M0 [B, H, K, V]`` or None; pairs and decays from the probes (layouts in the module
    docstring), all float32. ``F = 0`` is allowed (no firing: just the initial state).
    ``out``: write into this tensor instead (e.g. a slice ``buf[:, a:b]`` of a buffer holding
    several levels' states: only the batch stride may differ from a contiguous tensor's).
    ``precision``: the dots' input precision, ``"ieee"`` or ``"tf32"`` (module docstring).
    ``fire_offsets``: n sequences packed in one row (``B = 1``): int32 ``[n + 1]``, sequence i's
    firings are ``fire_offsets[i] .. fire_offsets[i + 1] - 1``; each starts from its own ``M0[i]``
    (``M0 [n, H, K, V]``) and ``states [1, F + n, H, K, V]`` holds its states at rows
    ``fire_offsets[i] + i ..`` (its initial state, then one per firing).
    ``prefetch``: run ``promote_scan_fwd_prefetch_kernel`` (the same arithmetic, operands loaded a
    step ahead).
    """
    B, F, H, n, K, V = _check(M0, kappa, nu, beta, omega, gamma, fire_offsets)
    kernel = promote_scan_fwd_prefetch_kernel if _check_prefetch(prefetch) else promote_scan_fwd_kernel
    _check_precision(precision)
    BK, BN, BV = block_sizes(K, V, n, block_v, block_n, precision=precision)
    shape = (*_state_rows(B, F, fire_offsets), H, K, V)
    states = states_out(kappa, out, shape)
    programs = B if fire_offsets is None else fire_offsets.numel() - 1
    args = (M0.contiguous() if M0 is not None else None, kappa.contiguous(), nu.contiguous(), beta.contiguous(),
            omega.contiguous(), gamma.contiguous(), states, fire_offsets, F, n, states.stride(0))

    def run(BV, stages=num_stages):
        kernel[(cdiv(V, BV), programs * H)](
            *args, H=H, K=K, V=V, BK=BK, BN=BN, BV=BV, HAS_M0=M0 is not None, DOT_PRECISION=precision,
            IS_VARLEN=fire_offsets is not None, **launch_options(BK, BV, num_warps, stages))

    # the TF32 default of one V block of 128 needs more shared memory per program than some GPUs
    # give a block: V blocks of 32 there (the IEEE default); then one pipeline stage
    first_that_fits((kernel, H, K, V, BK, BN, BV, block_v is None, precision, M0 is not None,
                     fire_offsets is not None, num_warps, num_stages, kappa.device),
                    _fallbacks(run, BV, block_v, num_stages))
    return states


def _fallbacks(run, BV: int, block_v: int | None, num_stages: int | None) -> list:
    """A scan's launch forms for ``first_that_fits``, preferred first: ``run(BV)``; V blocks of 32
    where ``BV`` is a wider default (not a caller's ``block_v``); then, unless the caller set
    ``num_stages``, the narrowest of those at one pipeline stage. Why: a GPU with 99 KiB of shared
    memory a block (sm_86, sm_89) refuses the scans at K = 256 at any V block with Triton's stages
    (100–102 KiB at V blocks of 16), not at one (48 / 96 KiB forward / reverse; sm_80 and sm_86,
    scripts/kernel_resources.py). The forms compute the same values."""
    widths = [BV] if block_v is not None or BV <= 32 else [BV, 32]
    forms = [lambda w=w: run(w) for w in widths]
    if num_stages is None:
        forms.append(lambda: run(widths[-1], 1))
    return forms


def forward_precision(precision: str, programs: int, device) -> str:
    """The forward scan's precision for a launch at its default V block: ``precision``, except
    ``"tf32"`` becomes ``"ieee"`` on a GPU where the TF32 launch's ``programs`` (batch rows or
    sequences × heads, one V block each at V ≤ 128) would not exceed half its SMs.

    Why: a TF32 program holds the whole ``[K, V]`` state (one per SM at K = V = 128) and runs
    its chain of firings ≈ 1.3x slower per firing than two IEEE programs of V blocks of 32 share
    an SM; it pays by needing a quarter of the programs, which pays only where the IEEE launch
    (4x the programs, two per SM) needs a second wave: above half the SMs. Measured on the H200
    (132 SMs, K = V = 128, H = 16; bench/NOTES.md): B = 8 (128 programs) TF32 0.44 against IEEE
    0.69 ms at level 1; B = 2 (32 programs) the op's forward 9.12 against 7.45 ms."""
    _check_precision(precision)
    device = torch.device(device)
    if precision != "tf32" or device.type != "cuda":
        return precision
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return "tf32" if 2 * programs > sms else "ieee"



def _check_states(name: str, x: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``x`` float32 of ``shape`` ``[B, F+1, H, K, V]``."""
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (one state per firing and the initial one), "
                         f"got {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    return x


def states_out(kappa: torch.Tensor, out: torch.Tensor | None, shape: tuple) -> torch.Tensor:
    """The forward's stored states: a new float32 tensor of ``shape``, or ``out`` checked (that
    shape, float32, contiguous but for its batch stride)."""
    states = kappa.new_empty(shape) if out is None else _check_states("out", out, shape)
    if not _batch_strided(states):
        raise ValueError(f"out must be contiguous but for its batch stride (a slice along dim 1 of a "
                         f"contiguous buffer), got strides {states.stride()}")
    return states


def _batch_strided(x: torch.Tensor) -> bool:
    """Contiguous but for the batch stride (e.g. a slice along dim 1 of a contiguous buffer)."""
    _, F1, H, K, V = x.shape
    return x.stride()[1:] == (H * K * V, K * V, V, 1) and x.stride(0) >= F1 * H * K * V


def check_bwd(states, kappa, nu, beta, omega, gamma, dstates, precision: str, fire_offsets=None) -> tuple:
    """The reverse scan's inputs (both backward implementations): returns ``(B, F, H, n, K, V)``."""
    B, F, H, n, K, V = _check(None, kappa, nu, beta, omega, gamma, fire_offsets)
    _check_precision(precision)
    for name, x in (("states", states), ("dstates", dstates)):
        _check_states(name, x, (*_state_rows(B, F, fire_offsets), H, K, V))
    return B, F, H, n, K, V


def pair_grad_buffers(kappa: torch.Tensor, nu: torch.Tensor, NV: int) -> tuple:
    """The reverse scan's outputs before the kernel writes them: ``(dκ, dβ, dγ`` partials, one per
    V block, and ``dν, dω)`` as ``(dkappa_part, dnu, dbeta_part, domega, dgamma_part)``."""
    B, F, H, n, K = kappa.shape
    return (kappa.new_empty(NV, B, F, H, n, K), torch.empty_like(nu), kappa.new_empty(NV, B, F, H, n, K),
            torch.empty_like(nu), kappa.new_empty(NV, B, F, H, K))


def sum_partials(partials: torch.Tensor, blocks: int | None = None) -> torch.Tensor:
    """Sum of the per-V-block partial buffers (leading axis; the first ``blocks``), in a fixed
    order: ``((p0 + p1) + p2) + …`` by elementwise adds, and one block's buffer returned as it is
    (a view: at V ≤ the V block, head dim 64 among them, ``sum(0)`` was a copy of every buffer)."""
    parts = partials if blocks is None else partials[:blocks]
    if parts.shape[0] == 1:
        return parts[0]
    if parts.shape[0] == 0:
        return partials.new_zeros(partials.shape[1:])
    total = torch.add(parts[0], parts[1])
    for part in parts[2:]:
        total += part
    return total


class Partials:
    """One gradient's per-V-block partial buffers ``parts [NV, ...]``, not yet summed: handed to a
    consumer that sums them as it loads them (``optimized.nested.probe_gates_nu``: no add kernels,
    no summed buffer written and read again); ``total()`` is their ``sum_partials``, the same sums.
    A consumer that has read them calls ``release()``: the buffers (NV times a summed gradient's
    memory) are then freed while the caller still holds this object."""
    __slots__ = ("parts",)

    def __init__(self, parts: torch.Tensor):
        self.parts = parts

    def total(self) -> torch.Tensor:
        if self.parts is None:
            raise RuntimeError("these partials were released by the consumer that read them")
        return sum_partials(self.parts)

    def release(self) -> None:
        self.parts = None


def keep_partials(partials: torch.Tensor, blocks: int | None = None):
    """A ``reduce_partials`` that sums nothing: ``Partials`` of the first ``blocks`` buffers, or the
    one buffer itself where there is one (a view, as ``sum_partials`` returns it)."""
    parts = partials if blocks is None else partials[:blocks]
    return parts[0] if parts.shape[0] == 1 else Partials(parts)


def summed(x, release: bool = False):
    """``x.total()`` for ``Partials`` (``release``: its buffers released after), else ``x`` (a
    tensor or None)."""
    if not isinstance(x, Partials):
        return x
    total = x.total()
    if release:
        x.release()
    return total


def promote_scan_bwd(states, kappa, nu, beta, omega, gamma, dstates, block_v: int | None = None,
                     block_n: int | None = None, reduce_partials=sum_partials, precision: str = "ieee",
                     fire_offsets: torch.Tensor | None = None, num_warps: int | None = None,
                     num_stages: int | None = None, prefetch: bool = False):
    """Gradients of the scan given ``dstates [B, F+1, H, K, V]`` (float32), the gradient
    on every stored state (``dstates[:, F]`` includes the final state's).

    Returns ``(dM0 [B, H, K, V], dκ, dν, dβ, dω, dγ)`` shaped like the inputs; ``dκ, dβ, dγ`` are
    ``reduce_partials`` of their per-V-block partials (``keep_partials``: ``Partials`` for a
    consumer that sums them itself). ``fire_offsets``: packed sequences as in ``promote_scan_fwd`` (states and ``dstates``
    ``[1, F + n, H, K, V]``, ``dM0 [n, H, K, V]``). ``num_warps``, ``num_stages``: as in
    ``promote_scan_fwd``; ``prefetch``: ``promote_scan_bwd_prefetch_kernel``.
    """
    kernel = promote_scan_bwd_prefetch_kernel if _check_prefetch(prefetch) else promote_scan_bwd_kernel
    B, F, H, n, K, V = check_bwd(states, kappa, nu, beta, omega, gamma, dstates, precision, fire_offsets)
    states, dstates = (x if _batch_strided(x) else x.contiguous() for x in (states, dstates))
    kappa, nu, beta, omega, gamma = (x.contiguous() for x in (kappa, nu, beta, omega, gamma))
    BK, BN, BV = block_sizes(K, V, n, block_v, block_n, reverse=True)
    programs = B if fire_offsets is None else fire_offsets.numel() - 1

    def run(BV, stages=num_stages):
        NV = cdiv(V, BV)
        dm0 = states.new_empty(programs, H, K, V)
        dkappa_part, dnu, dbeta_part, domega, dgamma_part = pair_grad_buffers(kappa, nu, NV)
        kernel[(NV, programs * H)](
            states, kappa, nu, beta, omega, gamma, dstates, fire_offsets,
            dm0, dkappa_part, dnu, dbeta_part, domega, dgamma_part, F, B, n, states.stride(0), dstates.stride(0),
            H=H, K=K, V=V, BK=BK, BN=BN, BV=BV, DOT_PRECISION=precision, IS_VARLEN=fire_offsets is not None,
            **launch_options(BK, BV, num_warps, stages))
        return (dm0, reduce_partials(dkappa_part), dnu, reduce_partials(dbeta_part), domega,
                reduce_partials(dgamma_part))

    # the default V block of 64 needs ≈ 160 KiB of shared memory per program at K = 128 (sm_90):
    # a GPU with less per block runs V blocks of 32 (88 KiB), the forward's default; then one stage
    return first_that_fits((kernel, H, K, V, BK, BN, BV, block_v is None, precision, fire_offsets is not None,
                            num_warps, num_stages, kappa.device),
                           _fallbacks(run, BV, block_v, num_stages))
