"""The promote scan's backward in two phases (an alternative to ``promote_scan_bwd``'s one fused
reverse scan; same inputs, same outputs, same math).

The reverse scan carries one thing from firing to firing: ``G_m``, the whole gradient on the
state after ``m`` firings,

    G_F = dstates[F],    G_m = exp(γ_m) ⊙ (G_{m+1} - Σ_pairs P_m^T (κ_m G_{m+1})) + dstates[m]

(``P = β ⊙ κ``). Everything else a firing's gradients need is then local to that firing: given
``G_{m+1}`` and the stored ``M_m``, the pair gradients of firing ``m`` are those of
``promote_scan_bwd_kernel``'s docstring with ``dM = G_{m+1}``.

- Phase 1 (``promote_scan_bwd_carry_kernel``): one program per (batch, head, V block) runs the
  recurrence alone: two dots per pair block per firing, no ν, ω or stored state loaded, and
  writes ``G_m`` over ``dstates[m]`` (read once, just before).
- Phase 2 (``promote_scan_bwd_pairs_kernel``): one program per (firing, batch, head, V block),
  all in parallel: ``dν, dω`` and the per-V-block partials of ``dκ, dβ, dγ`` from ``G_{m+1}``,
  ``M_m`` and the pairs.

The sequential chain keeps 2 of the fused kernel's 5 dots per pair block; phase 2 does 5 dots
per pair block again, but with ``F`` times more programs in flight.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.nested.promote_scan import (_batch_strided, block_sizes, check_bwd, launch_options, pair_block,
                                    pair_grad_buffers, state_block, sum_partials)
from optimized.fits import one_stage_where_refused
from optimized.host_math import cdiv


@triton.jit(do_not_specialize=["F", "N"])
def promote_scan_bwd_carry_kernel(
    kappa, beta, gamma, g,
    F, N, stride_gb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """For one (batch, head, V block), in place on ``g`` (``dstates`` on entry):

        G = g[F]
        for m = F-1 .. 0:
            G = exp(γ[m]) ⊙ (G - Σ_blocks (β[m] ⊙ κ[m])^T @ (κ[m] @ G)) + g[m]
            g[m] = G
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    p_g = g + i_b.to(tl.int64) * stride_gb + i_h * K * V + o_kv       # slot 0 of this (batch, head)

    b_g = tl.load(p_g + F * H * K * V, mask=m_kv, other=0.0)
    for i in range(0, F):
        m = F - 1 - i
        i_f = (i_b.to(tl.int64) * F + m) * H + i_h
        b_decay = tl.exp(tl.load(gamma + i_f * K + o_k, mask=m_k, other=0.0))
        b_gd = b_g                                                       # G - Σ P^T (κ G)
        for i_n in range(0, tl.cdiv(N, BN)):
            o_n = i_n * BN + tl.arange(0, BN)
            o_nk = o_n[:, None] * K + o_k[None, :]
            m_nk = (o_n < N)[:, None] & m_k[None, :]
            b_kappa = tl.load(kappa + i_f * N * K + o_nk, mask=m_nk, other=0.0)
            b_beta = tl.load(beta + i_f * N * K + o_nk, mask=m_nk, other=0.0)
            b_dd = tl.dot(b_kappa, b_g, input_precision=DOT_PRECISION)
            b_gd -= tl.dot(tl.trans(b_beta * b_kappa), b_dd, input_precision=DOT_PRECISION)
        b_g = b_gd * b_decay[:, None] + tl.load(p_g + m * H * K * V, mask=m_kv, other=0.0)
        tl.store(p_g + m * H * K * V, b_g, mask=m_kv)


@triton.jit(do_not_specialize=["F", "B", "N"])
def promote_scan_bwd_pairs_kernel(
    states, kappa, nu, beta, omega, gamma, g,
    dkappa_part, dnu, dbeta_part, domega, dgamma_part,
    F, B, N, stride_sb, stride_gb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Firing ``m`` of one (batch, head, V block), with ``dM = G_{m+1} = g[m + 1]`` and
    ``M' = exp(γ[m]) ⊙ states[m]``: per pair block ``D = ω ⊙ ν - P M'``, ``dD = κ dM``,
    ``dν = dD ⊙ ω``, ``dω = dD ⊙ ν``, ``dP = -dD M'^T``, ``dκ_part = D dM^T + dP ⊙ β``,
    ``dβ_part = dP ⊙ κ``; ``dγ_part = Σ_v (dM - Σ P^T dD) ⊙ M'``."""
    i_v, m, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, m_k, o_v, m_v, o_kv, m_kv = state_block(i_v, K, V, BK, BV)
    i_f = (i_b.to(tl.int64) * F + m) * H + i_h
    part = i_v.to(tl.int64) * B * F * H

    b_dm = tl.load(g + i_b.to(tl.int64) * stride_gb + ((m + 1) * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
    b_decay = tl.exp(tl.load(gamma + i_f * K + o_k, mask=m_k, other=0.0))
    b_md = tl.load(states + i_b.to(tl.int64) * stride_sb + (m * H + i_h) * K * V + o_kv,
                   mask=m_kv, other=0.0) * b_decay[:, None]
    b_dmd = b_dm
    for i_n in range(0, tl.cdiv(N, BN)):
        b_kappa, b_beta, b_nu, b_omega, o_nk, m_nk, o_nv, m_nv = pair_block(
            kappa, nu, beta, omega, i_f, i_n, N, o_k, m_k, o_v, m_v, K, V, BN)
        b_p = b_beta * b_kappa
        b_d = b_omega * b_nu - tl.dot(b_p, b_md, input_precision=DOT_PRECISION)
        b_dd = tl.dot(b_kappa, b_dm, input_precision=DOT_PRECISION)
        tl.store(dnu + i_f * N * V + o_nv, b_dd * b_omega, mask=m_nv)
        tl.store(domega + i_f * N * V + o_nv, b_dd * b_nu, mask=m_nv)
        b_dp = -tl.dot(b_dd, tl.trans(b_md), input_precision=DOT_PRECISION)
        b_dkappa = tl.dot(b_d, tl.trans(b_dm), input_precision=DOT_PRECISION) + b_dp * b_beta
        tl.store(dkappa_part + (part + i_f) * N * K + o_nk, b_dkappa, mask=m_nk)
        tl.store(dbeta_part + (part + i_f) * N * K + o_nk, b_dp * b_kappa, mask=m_nk)
        b_dmd -= tl.dot(tl.trans(b_p), b_dd, input_precision=DOT_PRECISION)
    tl.store(dgamma_part + (part + i_f) * K + o_k, tl.sum(b_dmd * b_md, axis=1), mask=m_k)


def promote_scan_bwd_two_phase(states, kappa, nu, beta, omega, gamma, dstates, block_v: int | None = None,
                               block_n: int | None = None, reduce_partials=sum_partials, precision: str = "ieee",
                               consume_dstates: bool = False, fire_offsets=None, num_warps: int | None = None,
                               num_stages: int | None = None):
    """``promote_scan_bwd``'s contract, computed in two phases (module docstring): returns
    ``(dM0 [B, H, K, V], dκ, dν, dβ, dω, dγ)``. ``consume_dstates``: phase 1 writes its carried
    gradients over ``dstates`` (the caller's buffer is spent; saves one ``[B, F+1, H, K, V]``
    float32 copy); otherwise it works on a copy. ``num_warps``, ``num_stages``: both kernels' launch
    (``promote_scan.launch_options``; with Triton's stages, one stage where the GPU refuses their
    shared memory). Packed sequences (``fire_offsets``) are
    ``promote_scan_bwd``'s alone: refused here."""
    if fire_offsets is not None:
        raise ValueError("fire_offsets: the two-phase reverse scan does not take packed sequences; "
                         "use promote_scan_bwd (the nested op's default)")
    B, F, H, n, K, V = check_bwd(states, kappa, nu, beta, omega, gamma, dstates, precision)
    if not _batch_strided(states):
        states = states.contiguous()
    g = dstates if consume_dstates and _batch_strided(dstates) else dstates.contiguous().clone()
    kappa, nu, beta, omega, gamma = (x.contiguous() for x in (kappa, nu, beta, omega, gamma))
    BK, BN, BV = block_sizes(K, V, n, block_v, block_n)
    NV = cdiv(V, BV)
    opts = launch_options(BK, BV, num_warps, num_stages)
    key = (H, K, V, BK, BN, BV, precision, opts["num_warps"], kappa.device)

    def launch(kernel, grid, *args):
        def run(**stages):
            kernel[grid](*args, H=H, K=K, V=V, BK=BK, BN=BN, BV=BV, DOT_PRECISION=precision, **opts, **stages)
        if num_stages is not None:          # the caller's stages: a refusal propagates
            run()
        else:
            # at K = 256 phase 2 stages 100 / 133 KiB of shared memory (TF32 / IEEE), more than a GPU with
            # 99 KiB a block (sm_89) gives; 96 / 65 KiB at one stage (docs/kernel-shared-memory.md).
            # A refused launch never runs, so phase 1's in-place writes happen once. Same values.
            one_stage_where_refused((kernel,) + key, run)

    launch(promote_scan_bwd_carry_kernel, (NV, B * H), kappa, beta, gamma, g, F, n, g.stride(0))
    dkappa_part, dnu, dbeta_part, domega, dgamma_part = pair_grad_buffers(kappa, nu, NV)
    if F > 0:
        launch(promote_scan_bwd_pairs_kernel, (NV, F, B * H), states, kappa, nu, beta, omega, gamma, g,
               dkappa_part, dnu, dbeta_part, domega, dgamma_part, F, B, n, states.stride(0), g.stride(0))
    return (g[:, 0].clone(), reduce_partials(dkappa_part), dnu, reduce_partials(dbeta_part), domega,
            reduce_partials(dgamma_part))
