"""The promote scan's forward in chunks of firings: G firings solved at once, a chain G times shorter.

The update of one firing (SPEC section 2; ``optimized.promote_scan``), with ``P = β ⊙ κ``:

    M_{m+1} = D_m M_m + κ_m^T X_m,    X_m = ω_m ⊙ ν_m − P_m D_m M_m,    D_m = diag(exp(γ_m))

The sequential scan runs one firing after another: a chain of F steps, two small dots each,
latency-bound where a level fires often and the batch is small. Over a group of G firings
``j = 0 .. G−1`` starting from ``M_0``, with ``c_j = Σ_{m ≤ j} γ_m`` (per key channel):

    X_j = U_j − E_j M_0 − Σ_{i<j} T_ji X_i,   U_j = ω_j ⊙ ν_j,   E_j = P_j ⊙ exp(c_j),
    T_ji = (P_j ⊙ exp(c_j − c_i)) κ_i^T                                    [n, n]

a block-unit-lower-triangular system ``(I + T) X = U − E M_0`` (no block on the diagonal:
a firing's pairs act at once). With ``W̃ = (I + T)^{-1} E`` and ``Ũ = (I + T)^{-1} U``, which do
not depend on ``M_0`` and are made for every group in parallel (``chunked_prep_kernel``):

    X   = Ũ − W̃ M_0                                    [G·n, V]
    M_G = exp(c_{G−1}) ⊙ M_0 + K̃^T X,   K̃_i = κ_i ⊙ exp(c_{G−1} − c_i)

the chain step (``chunked_chain_kernel``): two dots with G·n rows per group instead of two with
n rows per firing. The states inside a group, ``M_{j+1} = D_j M_j + κ_j^T X_j``, are made from
each group's start state in parallel (``chunked_fill_kernel``).

The inverse is made by doubling: with ``L`` the inverse of ``I + T`` restricted to diagonal
blocks of s firings and ``C`` the part of ``T`` coupling the two halves of each block of 2s,
``(L^{-1} + C)^{-1} = L − L C L`` exactly (``C L C = 0``); from ``L = I`` (s = 1) in log2(G)
steps. Every exponential has a non-positive exponent (``γ ≤ 0``, SPEC section 2), so strong
decays do not overflow; the decays inside ``T`` are sums of the γ between two firings, never
differences of running sums (no cancellation); ``K̃``'s, ``Σ_{m > j} γ_m``, is a reverse running
sum less firing j's own γ (one subtraction: an error of about ``|γ_j| · 2^-24`` in the exponent).

Same arguments, outputs and layouts as ``promote_scan.promote_scan_fwd``; packed sequences
(``fire_offsets``) and groups of one firing run that sequential scan.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fits import first_that_fits
from optimized.promote_scan import (_check, _check_precision, _state_rows, block_sizes, launch_options,
                                    promote_scan_fwd, states_out)
from optimized.host_math import cdiv, next_power_of_2

GROUP_ROWS = 64     # rows of a group (G · NP): G = GROUP_ROWS // NP firings


@triton.jit(do_not_specialize=["F", "N"])
def chunked_prep_kernel(
    kappa, nu, beta, omega, gamma, wt, ut, kt, gt,
    F, N, NG,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr,
    NP: tl.constexpr, G: tl.constexpr, LOG_G: tl.constexpr, DOT_PRECISION: tl.constexpr,
    GROUP_STEP: tl.constexpr,
):
    """One program per (group, batch, head): rows ``r = j · NP + a`` hold pair ``a`` of the
    group's firing ``j`` (rows with ``a ≥ n`` or past the last firing are zero). Writes
    ``W̃ [G·NP, K]`` and ``Ũ [G·NP, V]`` (module docstring) at ``(batch · H + head) · NG + group``;
    with ``GROUP_STEP`` (the chain steps a whole group at once) also ``K̃ [G·NP, K]`` and
    ``exp(c_{G−1}) [K]``."""
    BR: tl.constexpr = G * NP
    i_g, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_r = tl.arange(0, BR)
    j_r, a_r = o_r // NP, o_r % NP
    f_r = i_g * G + j_r                                        # the row's firing
    m_r = (a_r < N) & (f_r < F)
    o_k, o_v = tl.arange(0, BK), tl.arange(0, BVF)
    m_k, m_v = o_k < K, o_v < V
    row = ((i_b.to(tl.int64) * F + f_r) * H + i_h) * N + a_r   # the row's pair in [B, F, H, n, ·]
    m_rk = m_r[:, None] & m_k[None, :]
    m_rv = m_r[:, None] & m_v[None, :]
    b_kappa = tl.load(kappa + row[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
    b_p = tl.load(beta + row[:, None] * K + o_k[None, :], mask=m_rk, other=0.0) * b_kappa
    # γ of the row's firing on its first pair row only: a running sum over rows is then a sum over firings
    first = (a_r == 0) & (f_r < F)
    b_g = tl.load(gamma + (((i_b.to(tl.int64) * F + f_r) * H + i_h) * K)[:, None] + o_k[None, :],
                  mask=first[:, None] & m_k[None, :], other=0.0)

    # T (strictly lower by firing blocks), one column firing i at a time: exp(Σ_{i < m ≤ j(r)} γ_m)
    b_t = tl.zeros([BR, BR], dtype=tl.float32)
    for i in tl.static_range(G - 1):
        later = j_r > i
        b_ci = tl.cumsum(tl.where(later[:, None], b_g, 0.0), axis=0)       # Σ_{i < m ≤ j(r)} γ_m
        b_a = tl.where(later[:, None], b_p * tl.exp(tl.where(later[:, None], b_ci, 0.0)), 0.0)
        b_ki = tl.where((j_r == i)[:, None], b_kappa, 0.0)
        b_t += tl.dot(b_a, tl.trans(b_ki), input_precision=DOT_PRECISION)

    # (I + T)^{-1} by doubling, from the inverse on blocks of one firing (the identity)
    b_eye = tl.where(o_r[:, None] == o_r[None, :], 1.0, 0.0)
    b_inv = b_eye
    for s in tl.static_range(LOG_G):
        half = NP << s                                        # rows of the blocks solved so far
        same = (o_r[:, None] // (2 * half)) == (o_r[None, :] // (2 * half))
        b_cs = tl.where(same & (((o_r // half) % 2)[:, None] == 1) & (((o_r // half) % 2)[None, :] == 0), b_t, 0.0)
        if s == 0:
            b_inv = b_eye - b_cs                               # L = I
        else:
            b_lc = tl.dot(b_inv, b_cs, input_precision=DOT_PRECISION)
            b_inv = b_inv - tl.dot(b_lc, b_inv, input_precision=DOT_PRECISION)

    # each output stored as soon as it is made (fewer tiles alive at once)
    grp = i_bh.to(tl.int64) * NG + i_g
    o_rk = o_r[:, None] * K + o_k[None, :]
    o_rv = o_r[:, None] * V + o_v[None, :]
    m_ak = (o_r < BR)[:, None] & m_k[None, :]
    m_av = (o_r < BR)[:, None] & m_v[None, :]
    b_e = b_p * tl.exp(tl.cumsum(b_g, axis=0))                # E_j = P_j ⊙ exp(c_j)
    tl.store(wt + grp * BR * K + o_rk, tl.dot(b_inv, b_e, input_precision=DOT_PRECISION), mask=m_ak)
    if GROUP_STEP:
        # K̃ = κ ⊙ exp(Σ_{m > j(r)} γ_m) (a reverse running sum less the row's own γ, on its first row only)
        b_after = tl.cumsum(b_g, axis=0, reverse=True) - b_g
        tl.store(kt + grp * BR * K + o_rk, b_kappa * tl.exp(b_after), mask=m_ak)
        tl.store(gt + grp * K + o_k, tl.exp(tl.sum(b_g, axis=0)), mask=m_k)
    b_u = (tl.load(omega + row[:, None] * V + o_v[None, :], mask=m_rv, other=0.0)
           * tl.load(nu + row[:, None] * V + o_v[None, :], mask=m_rv, other=0.0))
    tl.store(ut + grp * BR * V + o_rv, tl.dot(b_inv, b_u, input_precision=DOT_PRECISION), mask=m_av)


@triton.jit(do_not_specialize=["F", "N"])
def chunked_chain_kernel(
    m0, wt, ut, kt, gt, xs, kappa, gamma, states,
    F, N, NG, stride_sb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NP: tl.constexpr, G: tl.constexpr, FILL: tl.constexpr, HAS_M0: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program per (V block, batch · head): ``states[0] = M``, then per group
    ``X = Ũ − W̃ M`` from its start state, and

    - without ``FILL``: ``M ← exp(c_{G−1}) ⊙ M + K̃^T X`` stored at ``states[min((g + 1) G, F)]``
      (the firings past F are zero pairs with γ = 0), ``X`` kept in ``xs`` for
      ``chunked_fill_kernel``;
    - with ``FILL``: firing by firing ``M ← D_j M + κ_j^T X_j``, each stored at ``states[m + 1]``.
      The G products ``κ_j^T X_j`` (``κ_j``: the group's key tile with the other firings' rows
      zeroed) depend on ``X`` only, not on each other: what runs one after another inside a group
      is ``G`` multiply-adds; no K̃, no ``X`` written and read back, no third launch."""
    BR: tl.constexpr = G * NP
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_r = tl.arange(0, BR)
    j_r, a_r = o_r // NP, o_r % NP
    m_k, m_v = o_k < K, o_v < V
    o_kv, m_kv = o_k[:, None] * V + o_v[None, :], m_k[:, None] & m_v[None, :]
    o_rk, m_rk = o_r[:, None] * K + o_k[None, :], (o_r < BR)[:, None] & m_k[None, :]
    o_rv, m_rv = o_r[:, None] * V + o_v[None, :], (o_r < BR)[:, None] & m_v[None, :]
    p_states = states + i_b.to(tl.int64) * stride_sb + i_h * K * V

    b_m = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_M0:
        b_m += tl.load(m0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    tl.store(p_states + o_kv, b_m, mask=m_kv)
    for g in range(0, NG):
        grp = i_bh.to(tl.int64) * NG + g
        b_w = tl.load(wt + grp * BR * K + o_rk, mask=m_rk, other=0.0)
        b_x = tl.load(ut + grp * BR * V + o_rv, mask=m_rv, other=0.0)
        b_x -= tl.dot(b_w, b_m, input_precision=DOT_PRECISION)
        if FILL:
            f_r = g * G + j_r
            row = ((i_b.to(tl.int64) * F + f_r) * H + i_h) * N + a_r
            b_kappa = tl.load(kappa + row[:, None] * K + o_k[None, :],
                              mask=((a_r < N) & (f_r < F))[:, None] & m_k[None, :], other=0.0)
            for j in tl.static_range(G):
                f = g * G + j
                live = f < F
                b_decay = tl.exp(tl.load(gamma + ((i_b.to(tl.int64) * F + f) * H + i_h) * K + o_k,
                                         mask=m_k & live, other=0.0))
                b_kj = tl.where((j_r == j)[:, None], b_kappa, 0.0)
                b_m = b_m * b_decay[:, None] + tl.dot(tl.trans(b_kj), b_x, input_precision=DOT_PRECISION)
                tl.store(p_states + (f + 1).to(tl.int64) * H * K * V + o_kv, b_m, mask=m_kv & live)
        else:
            tl.store(xs + grp * BR * V + o_rv, b_x, mask=m_rv)
            b_kt = tl.load(kt + grp * BR * K + o_rk, mask=m_rk, other=0.0)
            b_decay = tl.load(gt + grp * K + o_k, mask=m_k, other=0.0)
            b_m = b_m * b_decay[:, None] + tl.dot(tl.trans(b_kt), b_x, input_precision=DOT_PRECISION)
            end = tl.minimum((g + 1) * G, F)
            tl.store(p_states + end.to(tl.int64) * H * K * V + o_kv, b_m, mask=m_kv)


@triton.jit(do_not_specialize=["F", "N"])
def chunked_fill_kernel(
    kappa, gamma, xs, states,
    F, N, NG, stride_sb,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NP: tl.constexpr, G: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program per (V block, batch · head, group): from the group's start state
    ``states[g G]``, ``M ← D_m M + κ_m^T X_m`` for its firings but the last (whose state the
    chain stored), each stored at ``states[m + 1]``."""
    i_v, i_bh, i_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_n = tl.arange(0, NP)
    m_k, m_v, m_n = o_k < K, o_v < V, o_n < N
    o_kv, m_kv = o_k[:, None] * V + o_v[None, :], m_k[:, None] & m_v[None, :]
    p_states = states + i_b.to(tl.int64) * stride_sb + i_h * K * V
    f0 = i_g * G
    end = tl.minimum(f0 + G, F)
    b_m = tl.load(p_states + f0.to(tl.int64) * H * K * V + o_kv, mask=m_kv, other=0.0)
    p_x = xs + (i_bh.to(tl.int64) * NG + i_g) * G * NP * V
    for j in range(0, G - 1):
        f = f0 + j
        live = f + 1 < end                                     # the chain stored the group's last state
        i_f = (i_b.to(tl.int64) * F + f) * H + i_h
        b_decay = tl.exp(tl.load(gamma + i_f * K + o_k, mask=m_k & live, other=0.0))
        b_kappa = tl.load(kappa + (i_f * N + o_n[:, None]) * K + o_k[None, :],
                          mask=(m_n[:, None] & m_k[None, :]) & live, other=0.0)
        b_x = tl.load(p_x + (j * NP + o_n[:, None]) * V + o_v[None, :],
                      mask=(m_n[:, None] & m_v[None, :]) & live, other=0.0)
        b_m = b_m * b_decay[:, None] + tl.dot(tl.trans(b_kappa), b_x, input_precision=DOT_PRECISION)
        tl.store(p_states + (f + 1).to(tl.int64) * H * K * V + o_kv, b_m, mask=m_kv & live)


def group_size(n: int, group_rows: int = GROUP_ROWS) -> tuple[int, int]:
    """``(G, NP)``: firings per group and rows per firing (``n`` padded to a power of two ≥ 16,
    what ``tl.dot`` needs); ``G = group_rows // NP``, at least 1."""
    NP = max(16, next_power_of_2(max(n, 1)))
    return max(1, group_rows // NP), NP


def chain_block_v(V: int, precision: str, block_v: int | None) -> int:
    """The chain's and the fill's V block: ``block_v``, else 64 (TF32) or 32 (IEEE: FMA dots)."""
    if block_v is None:
        block_v = 64 if precision == "tf32" else 32
    return max(16, min(next_power_of_2(block_v), next_power_of_2(V)))


def promote_scan_fwd_chunked(M0, kappa, nu, beta, omega, gamma, block_v: int | None = None,
                             block_n: int | None = None, out: torch.Tensor | None = None, precision: str = "ieee",
                             fire_offsets: torch.Tensor | None = None, num_warps: int | None = None,
                             num_stages: int | None = None, group_rows: int = GROUP_ROWS, fill: str = "kernel"):
    """``promote_scan.promote_scan_fwd``'s result (the same arguments; ``block_n`` unused here)
    made in groups of firings (module docstring). ``group_rows``: a power of two ≥ 16, the rows
    of a group, ``G · NP``. ``fill``: ``"kernel"``, the chain steps whole groups and a third
    kernel fills the states inside them; ``"chain"``, the chain makes every state itself
    (``chunked_chain_kernel``'s ``FILL``: no K̃, no ``X`` written and read back, no third launch). Packed
    sequences (``fire_offsets``) and groups of one firing (``n > group_rows / 2``) run
    ``promote_scan_fwd``."""
    B, F, H, n, K, V = _check(M0, kappa, nu, beta, omega, gamma, fire_offsets)
    _check_precision(precision)
    if not isinstance(group_rows, int) or group_rows < 16 or group_rows & (group_rows - 1):
        raise ValueError(f"group_rows must be a power of two >= 16, got {group_rows!r}")
    if fill not in ("kernel", "chain"):
        raise ValueError(f"fill must be 'kernel' or 'chain', got {fill!r}")
    G, NP = group_size(n, group_rows)
    if fire_offsets is not None or G == 1 or F == 0:
        return promote_scan_fwd(M0, kappa, nu, beta, omega, gamma, block_v=block_v, block_n=block_n, out=out,
                                precision=precision, fire_offsets=fire_offsets, num_warps=num_warps,
                                num_stages=num_stages)
    BK = block_sizes(K, V, n)[0]
    BVF = max(16, next_power_of_2(V))
    BV = chain_block_v(V, precision, block_v)
    shape = (*_state_rows(B, F, None), H, K, V)
    states = states_out(kappa, out, shape)
    kappa, nu, beta, omega, gamma = (x.contiguous() for x in (kappa, nu, beta, omega, gamma))
    NG = cdiv(F, G)
    BR = G * NP
    chain_fills = fill == "chain"
    wt = kappa.new_empty(B * H * NG, BR, K)
    ut = kappa.new_empty(B * H * NG, BR, V)
    kt = None if chain_fills else kappa.new_empty(B * H * NG, BR, K)
    gt = None if chain_fills else kappa.new_empty(B * H * NG, K)
    chunked_prep_kernel[(NG, B * H)](
        kappa, nu, beta, omega, gamma, wt, ut, kt, gt, F, n, NG, H=H, K=K, V=V, BK=BK, BVF=BVF, NP=NP, G=G,
        LOG_G=G.bit_length() - 1, DOT_PRECISION=precision, GROUP_STEP=not chain_fills,
        num_warps=8 if BR * max(BK, BVF) > 64 * 64 else 4)
    opts = launch_options(BK, BV, num_warps, num_stages)
    # Triton's default 3 stages needs ≈ 256 KiB of shared memory in the chain at BV = 64, K = 128 and
    # 64 rows (sm_90): 2, and where a launch is refused for shared memory, 1 (then narrower V blocks)
    tries = [(opts, BV)] if num_stages is not None else [(dict(opts, num_stages=st), BV) for st in (2, 1)]
    tries += [(dict(opts, num_stages=1), bv) for bv in (32, 16) if bv < BV and block_v is None]
    m0 = M0.contiguous() if M0 is not None else None
    xs = None if chain_fills else kappa.new_empty(B * H * NG, BR, V)

    def chain(chain_opts, chain_bv):
        chunked_chain_kernel[(cdiv(V, chain_bv), B * H)](
            m0, wt, ut, kt, gt, xs, kappa, gamma, states, F, n, NG, states.stride(0), H=H, K=K, V=V, BK=BK,
            BV=chain_bv, NP=NP, G=G, FILL=chain_fills, HAS_M0=M0 is not None, DOT_PRECISION=precision,
            **chain_opts)

    first_that_fits((chunked_chain_kernel, H, K, V, BK, BV, NP, G, chain_fills, M0 is not None, precision,
                     tuple(sorted(opts.items())), num_stages, block_v, kappa.device),
                    [lambda o=o, bv=bv: chain(o, bv) for o, bv in tries])
    if chain_fills:
        return states
    chunked_fill_kernel[(cdiv(V, BV), B * H, NG)](
        kappa, gamma, xs, states, F, n, NG, states.stride(0), H=H, K=K, V=V, BK=BK, BV=BV, NP=NP, G=G,
        DOT_PRECISION=precision, **opts)
    return states
