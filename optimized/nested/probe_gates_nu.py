"""The fused probe's gates straight from ``ν`` and the gate weights (``probe_fused``'s
``gates="triton-nu"``; the nested op's default, ``Pieces(probe_gates="triton-nu")``, reads_ab
``gates-nu``): the pre-activations ``z = ν W`` are made inside the gates' kernels, a tile of rows at
a time, and never written to memory (their measured effect, alone and in the op: bench/NOTES.md).

``probe_gates`` takes ``z [H, Bt·n, C]`` from one cuBLAS bmm; with the pre-activations not kept
for the backward (``keep_preactivations=False``, the op's default) ``z`` is written by the bmm,
read once by the gates and dropped, in the forward and again in the backward's recompute. Here a
launch per block of ``z``'s columns (``Z_K``, ``Z_β``, ``Z_ω``, ``Z_γ``: their gates are independent,
κ's row norm runs over ``Z_K``'s columns only, γ's sum over a firing's rows) runs one program per
head and ``TILES`` tiles of ``G`` firings (``G · NP`` rows, ``NP`` = n rounded up to a power of two, at
least ``MIN_NP``):
it loads that block of the head's weights once (``[V, K]``), then per tile a ``[G·NP, V] @ [V, K]``
dot of the tile's ``ν`` rows and the block's gate (the last program runs only the tiles that hold
firings). ``ν`` is read once per block (four times), ``z``
never stored. The gates are those of ``probe_gates`` (same formulas,
module docstring there)::

    Z_K = ν W_K   κ = Z_K / sqrt(|Z_K|² + ε)      (not for merge)
    Z_β = ν W_β   β = σ(Z_β)
    Z_ω = ν W_ω   ω = σ(Z_ω)
    Z_γ = ν W_γ   γ = c Σ_i −softplus(Z_γ,i)        (summed over each firing's n rows)

and backward, from ``dκ, dβ, dω, dγ`` (each may be absent: its columns of ``dz`` are 0)::

    dZ_K = s (dκ − κ ⟨κ, dκ⟩)   dZ_β = dβ β (1 − β)   dZ_ω = dω ω (1 − ω)
    dZ_γ = −c dγ σ(Z_γ)  (−c dγ above 20)

``dz [H, Bt·n, C]`` is written (the probe's backward needs it for ``dν'`` and ``dW``); ``z`` is
not. The dots' input precision is an argument (``"tf32"`` in bf16 runs, as the cuBLAS bmm it
replaces; ``"ieee"`` otherwise); the interpreter computes them in float32.

Layouts: ``ν, ω, dω [Bt, H, n, V]``, ``κ, β, dκ, dβ [Bt, H, n, K]``, ``γ, dγ [Bt, H, K]``,
``W [H, V, C]`` (columns ``[W_K | W_β | W_ω | W_γ]``, merge without ``W_K``), ``dz [H, Bt·n, C]``
(rows ``(h, bt, i)``, as the bmm's), all float32 contiguous. Rows past ``n`` and firings past
``Bt`` are masked (a ragged last group), as are K and V past their power-of-two blocks.

Where a tile would be too large (``NP``, K or V above ``MAX_BLOCK``), ``blocks`` returns None and ``probe_fused`` runs the bmm and ``probe_gates`` instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from optimized.fits import one_stage_where_refused
from optimized.nested.probe_gates import (_expect, _reduce_factor, _softplus, check_outputs, checked_grads,
                                          gate_columns)
from optimized.host_math import cdiv, next_power_of_2
from optimized.nested.promote_scan import Partials, summed

ROWS = 64           # a tile's rows (G firings of NP rows) by default
TILES = 8           # tiles a program runs with its block of W (512 rows by default)
# The fewest rows a firing takes in a tile: NP is a constexpr, so every power of two below would compile
# its own kernels (the GPU suite's draws of n = 1 … 16 gave each gate kernel seven variants, the largest
# share of the suite's compiles); firings of fewer pairs leave their rows past n masked.
MIN_NP = 16
MAX_BLOCK = 128     # the largest NP, BK, BV: [rows, BK] float32 tiles and a [BV, 128] block of W in registers
# The largest BK, BV with IEEE float32 dots (float32 runs), whose products Triton compiles to unrolled
# FMA code: at 128 the kernels spill ≈ 16 KiB a thread and take ≈ 18 s each to compile (sm_90,
# Triton 3.6; 300–470 B and 6–8 s at 64, none and 2 s at 32: scripts/kernel_resources.py), so the
# op's float32 runs take the bmm's z and probe_gates there (``ieee_blocks_fit``; TF32 fits to
# MAX_BLOCK).
IEEE_MAX_BLOCK = 64
PRECISIONS = ("ieee", "tf32")
# Every block's gate in one launch instead of one launch per block (4 a pass): the gates' launches
# are 24 of the 54 Triton launches of an L = 4 step. Unpipelined (``_launch``). ``None`` (the
# default): one launch where K <= ONE_LAUNCH_MAX_K, where the step's host time paces it (head dim
# 64), one per block above, where the device does (head dim 128: the one launch took 0.6 ms of host
# time off an L = 4 step and added ≈ 0.06 ms of device time; bench/NOTES.md). True / False: always.
ONE_LAUNCH: bool | None = None
ONE_LAUNCH_MAX_K = 64


@triton.jit
def _rows(i_t, i_h, Bt, n, H, G: tl.constexpr, NP: tl.constexpr):
    """Tile ``i_t``'s rows (firings ``i_t·G ..``): ``(bt, i, mask, row)``, ``row`` the offset in
    ``[Bt, H, n, *]`` rows."""
    o_r = tl.arange(0, G * NP)
    i_n = o_r % NP
    bt = i_t * G + o_r // NP
    m_r = (i_n < n) & (bt < Bt)
    return bt, i_n, m_r, (bt.to(tl.int64) * H + i_h) * n + i_n


@triton.jit
def _first_column(K, V, OFF_B, SEG: tl.constexpr):
    """The first column of ``z``'s block ``SEG`` (0 ``Z_K``, 1 ``Z_β``, 2 ``Z_ω``, 3 ``Z_γ``)."""
    if SEG == 0:
        col0 = 0
    elif SEG == 1:
        col0 = OFF_B
    elif SEG == 2:
        col0 = OFF_B + K
    else:
        col0 = OFF_B + K + V
    return col0


@triton.jit
def _column_block(w, i_h, K, V, C, OFF_B, SEG: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr):
    """Block ``SEG`` of head ``i_h``'s ``W`` (``[BV, BC]``, masked): ``(o_v, m_v, o_c, m_c, W block)``."""
    o_v, o_c = tl.arange(0, BV), tl.arange(0, BC)
    m_v, m_c = o_v < V, o_c < (V if SEG == 2 else K)
    p_w = w + i_h.to(tl.int64) * V * C + _first_column(K, V, OFF_B, SEG)
    b_w = tl.load(p_w + o_v[:, None] * C + o_c[None, :], mask=m_v[:, None] & m_c[None, :], other=0.0)
    return o_v, m_v, o_c, m_c, b_w


# Bt, n and H are runtime sizes (a new level, schedule or batch reuses the compiled kernel); K, V,
# C and OFF_B are row strides and column offsets, specialised on divisibility by 16 as in
# probe_gates (aligned 16-byte loads and stores). The block SEG is a constexpr: each block's
# launch compiles only its gate (a runtime branch on it inside the pipelined loop does not compile
# with Triton 3.6; straight-line code computing every gate and storing one was 4x the ALU work)
@triton.jit
def _fwd_tiles(nu, w, out, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p,
               SEG: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
               BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """Head ``i_h``, block ``SEG`` of ``z``'s columns, program ``i_p``'s ``TILES`` tiles of G firings:
    the block of ``W`` loaded once, then per tile ``z``'s block from ``ν W`` and its gate into
    ``out`` (module docstring): κ (row norms over the block), β, ω per row, γ per firing."""
    o_v, m_v, o_c, m_c, b_w = _column_block(w, i_h, K, V, C, OFF_B, SEG, BV, BC)
    # only the tiles that hold firings (the last program's may be fewer than TILES)
    for j in range(0, tl.minimum(TILES, tl.cdiv(Bt, G) - i_p * TILES)):
        i_t = i_p * TILES + j
        bt, i_n, m_r, row = _rows(i_t, i_h, Bt, n, H, G, NP)
        b_nu = tl.load(nu + row[:, None] * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.0)
        zc = tl.dot(b_nu, b_w, input_precision=PREC)                    # [G·NP, BC]
        m_rc = m_r[:, None] & m_c[None, :]
        if SEG == 0:
            s = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) + 1e-6)
            tl.store(out + row[:, None] * K + o_c[None, :], zc * s[:, None], mask=m_rc)
        elif SEG == 1:
            tl.store(out + row[:, None] * K + o_c[None, :], tl.sigmoid(zc), mask=m_rc)
        elif SEG == 2:
            tl.store(out + row[:, None] * V + o_c[None, :], tl.sigmoid(zc), mask=m_rc)
        else:
            acc = tl.sum(tl.reshape(tl.where(m_rc, -_softplus(zc), 0.0), (G, NP, BC)), axis=1)    # [G, BC]
            o_g = i_t * G + tl.arange(0, G)
            tl.store(out + (o_g.to(tl.int64)[:, None] * H + i_h) * K + o_c[None, :], acc * c_reduce,
                     mask=(o_g < Bt)[:, None] & m_c[None, :])


@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_nu_fwd_kernel(
    nu, w, out, Bt, n, c_reduce, H, K, V, C, OFF_B,
    SEG: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
):
    """Block ``SEG``'s gate (``_fwd_tiles``) for head ``program_id(0)``, tiles of program ``program_id(1)``."""
    _fwd_tiles(nu, w, out, Bt, n, c_reduce, H, K, V, C, OFF_B, tl.program_id(0), tl.program_id(1),
               SEG, G, NP, TILES, BV, BC, PREC)


@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_nu_fwd_one_kernel(
    nu, w, kappa, beta, omega, gamma, Bt, n, c_reduce, H, K, V, C, OFF_B,
    FIRST: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
):
    """Every block's gate in one launch: ``program_id(2)`` picks the block (``FIRST`` + it: merge,
    without ``Z_K``, starts at 1). The branch is taken once per program, outside each block's
    loop of tiles (launched unpipelined: ``_launch``)."""
    i_h, i_p, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2) + FIRST
    if seg == 0:
        _fwd_tiles(nu, w, kappa, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 0, G, NP, TILES, BV, BC, PREC)
    elif seg == 1:
        _fwd_tiles(nu, w, beta, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 1, G, NP, TILES, BV, BC, PREC)
    elif seg == 2:
        _fwd_tiles(nu, w, omega, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 2, G, NP, TILES, BV, BC, PREC)
    else:
        _fwd_tiles(nu, w, gamma, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 3, G, NP, TILES, BV, BC, PREC)


@triton.jit
def _load_parts(p, mask, NPART: tl.constexpr, PART_STRIDE):
    """``Σ_j p[j · PART_STRIDE]`` over ``NPART`` partial buffers, left to right (``promote_scan.
    sum_partials``' order, so the same float32 sums); one buffer: a plain load."""
    acc = tl.load(p, mask=mask, other=0.0)
    for j in tl.static_range(1, NPART):
        acc += tl.load(p + j * PART_STRIDE, mask=mask, other=0.0)
    return acc


@triton.jit
def _bwd_tiles(nu, w, dy, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p,
               SEG: tl.constexpr, HAS_D: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
               BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, NPART: tl.constexpr, PART_STRIDE):
    """Head ``i_h``, block ``SEG`` of ``dz``'s columns, program ``i_p``'s ``TILES`` tiles of G
    firings, from the gradient ``dy`` of that block's output (``HAS_D`` False: absent, the block is
    written as 0), ``z``'s block made again from ``ν W``. ``NPART > 1``: ``dy`` is that many
    per-V-block partials ``PART_STRIDE`` elements apart (the reverse scan's), summed as loaded."""
    o_v, m_v, o_c, m_c, b_w = _column_block(w, i_h, K, V, C, OFF_B, SEG, BV, BC)
    # only the tiles that hold firings (the last program's may be fewer than TILES)
    for j in range(0, tl.minimum(TILES, tl.cdiv(Bt, G) - i_p * TILES)):
        i_t = i_p * TILES + j
        bt, i_n, m_r, row = _rows(i_t, i_h, Bt, n, H, G, NP)
        m_rc = m_r[:, None] & m_c[None, :]
        d = tl.zeros([G * NP, BC], dtype=tl.float32)
        if HAS_D:
            b_nu = tl.load(nu + row[:, None] * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.0)
            zc = tl.dot(b_nu, b_w, input_precision=PREC)                # [G·NP, BC]
            if SEG == 0:
                d_y = _load_parts(dy + row[:, None] * K + o_c[None, :], m_rc, NPART, PART_STRIDE)
                s = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) + 1e-6)
                kap = zc * s[:, None]
                d = (d_y - kap * tl.sum(kap * d_y, axis=1)[:, None]) * s[:, None]
            elif SEG == 1:
                sg = tl.sigmoid(zc)
                d = _load_parts(dy + row[:, None] * K + o_c[None, :], m_rc, NPART, PART_STRIDE) * (1.0 - sg) * sg
            elif SEG == 2:
                sg = tl.sigmoid(zc)
                d = tl.load(dy + row[:, None] * V + o_c[None, :], mask=m_rc, other=0.0) * (1.0 - sg) * sg
            else:
                dg_i = -c_reduce * _load_parts(dy + (bt.to(tl.int64)[:, None] * H + i_h) * K + o_c[None, :],
                                               m_rc, NPART, PART_STRIDE)
                d = tl.where(zc > 20.0, dg_i, dg_i * tl.sigmoid(zc))
        p_dz = dz + ((i_h.to(tl.int64) * Bt + bt) * n + i_n)[:, None] * C
        tl.store(p_dz + _first_column(K, V, OFF_B, SEG) + o_c[None, :], d, mask=m_rc)


@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_nu_bwd_kernel(
    nu, w, dy, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, PART_STRIDE,
    SEG: tl.constexpr, HAS_D: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, NPART: tl.constexpr,
):
    """Block ``SEG``'s columns of ``dz`` (``_bwd_tiles``) for head ``program_id(0)``, tiles of
    program ``program_id(1)``; ``dy`` as ``NPART`` partials ``PART_STRIDE`` apart."""
    _bwd_tiles(nu, w, dy, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, tl.program_id(0), tl.program_id(1),
               SEG, HAS_D, G, NP, TILES, BV, BC, PREC, NPART, PART_STRIDE)


@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_nu_bwd_one_kernel(
    nu, w, dkappa, dbeta, domega, dgamma, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, STRIDE_NK, STRIDE_K,
    FIRST: tl.constexpr, HAS_D0: tl.constexpr, HAS_D1: tl.constexpr, HAS_D2: tl.constexpr,
    HAS_D3: tl.constexpr, G: tl.constexpr, NP: tl.constexpr, TILES: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, NPART: tl.constexpr,
):
    """Every block's columns of ``dz`` in one launch: ``program_id(2)`` picks the block, as in
    ``probe_gates_nu_fwd_one_kernel``; ``HAS_D<block>`` as ``HAS_D``. ``dκ``, ``dβ`` and ``dγ`` as
    ``NPART`` partials ``STRIDE_NK`` (``[Bt, H, n, K]``) and ``STRIDE_K`` (``[Bt, H, K]``) apart."""
    i_h, i_p, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2) + FIRST
    if seg == 0:
        _bwd_tiles(nu, w, dkappa, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 0, HAS_D0, G, NP, TILES,
                   BV, BC, PREC, NPART, STRIDE_NK)
    elif seg == 1:
        _bwd_tiles(nu, w, dbeta, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 1, HAS_D1, G, NP, TILES,
                   BV, BC, PREC, NPART, STRIDE_NK)
    elif seg == 2:
        _bwd_tiles(nu, w, domega, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 2, HAS_D2, G, NP, TILES,
                   BV, BC, PREC, 1, 0)
    else:
        _bwd_tiles(nu, w, dgamma, dz, Bt, n, c_reduce, H, K, V, C, OFF_B, i_h, i_p, 3, HAS_D3, G, NP, TILES,
                   BV, BC, PREC, NPART, STRIDE_K)


def ieee_blocks_fit(K: int, V: int, precision: str) -> bool:
    """Whether a launch at ``precision`` keeps its ``BK``, ``BV`` within ``IEEE_MAX_BLOCK`` where
    its dots are IEEE float32 (always with TF32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision != "ieee" or max(next_power_of_2(K), next_power_of_2(V)) <= IEEE_MAX_BLOCK


def blocks(n: int, K: int, V: int, rows: int | None = None) -> tuple | None:
    """``(G, NP, BV, BC)`` of a launch (``rows``: a tile's rows, a power of two ≥ 16, default
    ``ROWS``; a program runs ``TILES`` tiles), or None where ``NP``, ``BK`` or ``BV`` would exceed
    ``MAX_BLOCK`` (the caller then runs the bmm and ``probe_gates``)."""
    rows = ROWS if rows is None else rows
    if rows < 16 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two >= 16, got {rows!r}")
    NP = max(MIN_NP, next_power_of_2(max(n, 1)))
    BK, BV = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    if max(NP, BK, BV) > MAX_BLOCK:
        return None
    return max(1, rows // NP), NP, BV, max(BK, BV)


def _check(scheme, nu, W, Bt, H, n, K, V, precision, rows):
    C = gate_columns(scheme, K, V)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    _expect("nu", nu, (Bt, H, n, V))
    _expect("W", W, (H, V, C), nu.device)
    sizes = blocks(n, K, V, rows)
    if sizes is None:
        raise ValueError(f"n = {n}, K = {K}, V = {V}: blocks above {MAX_BLOCK}; use the bmm and probe_gates")
    return C, 0 if scheme == "merge" else K, sizes


def _one_launch(one_launch: bool | None, K: int) -> bool:
    """``one_launch`` as given, else ``ONE_LAUNCH``, else whether ``K <= ONE_LAUNCH_MAX_K``."""
    if one_launch is None:
        one_launch = ONE_LAUNCH
    if one_launch is None:
        return K <= ONE_LAUNCH_MAX_K
    if not isinstance(one_launch, bool):
        raise TypeError(f"one_launch must be a bool or None, got {type(one_launch).__name__}")
    return one_launch


def probe_gates_nu_fwd(scheme: str, nu: torch.Tensor, W: torch.Tensor, Bt: int, H: int, n: int, K: int, V: int,
                       reduction: str, kappa: torch.Tensor | None, beta: torch.Tensor, omega: torch.Tensor,
                       gamma: torch.Tensor, precision: str = "ieee", rows: int | None = None,
                       one_launch: bool | None = None):
    """Writes ``κ`` (not for ``merge``: pass None), ``β``, ``ω``, ``γ`` from ``ν`` and ``W`` (layouts in
    the module docstring); ``z`` is never stored. ``one_launch``: every block in one launch
    (``probe_gates_nu_fwd_one_kernel``) instead of one launch per block; None: ``ONE_LAUNCH``, whose
    default ``None`` is one launch at ``K <= ONE_LAUNCH_MAX_K``."""
    one = _one_launch(one_launch, K)
    C, off_b, (G, NP, BV, BC) = _check(scheme, nu, W, Bt, H, n, K, V, precision, rows)
    check_outputs(scheme, kappa, beta, omega, gamma, Bt, H, n, K, V, nu.device)
    if Bt * H * n == 0:
        gamma.zero_()
        return
    c = _reduce_factor(reduction, n)
    grid = (H, cdiv(Bt, G * TILES))
    if one:
        first = 1 if kappa is None else 0
        _launch(probe_gates_nu_fwd_one_kernel, grid + (4 - first,), nu, W, beta if kappa is None else kappa, beta,
                omega, gamma, Bt, n, c, H, K, V, C, off_b, pipelined=False, FIRST=first, G=G, NP=NP, TILES=TILES,
                BV=BV, BC=BC, PREC=precision, num_warps=_warps(G * NP, BV, BC))
        return
    for seg, out in enumerate((kappa, beta, omega, gamma)):
        if out is not None:
            _launch(probe_gates_nu_fwd_kernel, grid, nu, W, out, Bt, n, c, H, K, V, C, off_b, SEG=seg, G=G, NP=NP,
                    TILES=TILES, BV=BV, BC=BC, PREC=precision, num_warps=_warps(G * NP, BV, BC))


def probe_gates_nu_bwd(scheme: str, nu: torch.Tensor, W: torch.Tensor, Bt: int, H: int, n: int, K: int, V: int,
                       reduction: str, dkappa=None, dbeta=None, domega=None, dgamma=None, precision: str = "ieee",
                       rows: int | None = None, one_launch: bool | None = None) -> torch.Tensor:
    """``dz [H, Bt·n, C]`` float32 from the gates' gradients (any may be None), ``z`` made again from
    ``ν W`` inside the kernel. ``dkappa``, ``dbeta``, ``dgamma`` may also be ``promote_scan.Partials``
    (the reverse scan's per-V-block partials), which the kernels sum as they load them, in
    ``sum_partials``' order: the same float32 sums, no add kernels (``shared_partials``); their
    buffers are released once the kernels are launched (they are read once). ``one_launch``: as in
    ``probe_gates_nu_fwd``."""
    one = _one_launch(one_launch, K)
    C, off_b, (G, NP, BV, BC) = _check(scheme, nu, W, Bt, H, n, K, V, precision, rows)
    dz = nu.new_empty(H, Bt * n, C)
    if Bt * H * n == 0:
        return dz
    if isinstance(domega, Partials):
        raise TypeError("domega has no per-V-block partials (the reverse scan writes it whole)")
    given, npart = shared_partials([dkappa, dbeta, domega, dgamma])
    for d in (dkappa, dbeta, dgamma):       # read once: freed when this call's references go
        if isinstance(d, Partials):
            d.release()
    # shapes checked on the first partial buffer (a view of the stacked ones)
    grads = checked_grads(*(d if d is None or npart == 1 or seg == 2 else d[0] for seg, d in enumerate(given)),
                          Bt, H, n, K, V, nu.device)
    strides = [0 if npart == 1 or seg == 2 or d is None else d[0].numel() for seg, d in enumerate(given)]
    loads = [nu if d is None else (d if npart == 1 or seg == 2 else given[seg]) for seg, d in enumerate(grads)]
    c = _reduce_factor(reduction, n)
    grid = (H, cdiv(Bt, G * TILES))
    if one:
        first = 1 if scheme == "merge" else 0
        has = {f"HAS_D{seg}": d is not None for seg, d in enumerate(grads)}
        _launch(probe_gates_nu_bwd_one_kernel, grid + (4 - first,), nu, W, *loads, dz, Bt, n, c, H, K, V, C, off_b,
                max(strides[:2]), strides[3], pipelined=False, FIRST=first, **has, G=G, NP=NP, TILES=TILES,
                BV=BV, BC=BC, PREC=precision, NPART=npart, num_warps=_warps(G * NP, BV, BC))
        return dz
    for seg, d in enumerate(grads):
        if seg == 0 and scheme == "merge":
            continue                        # no Z_K
        _launch(probe_gates_nu_bwd_kernel, grid, nu, W, loads[seg], dz, Bt, n, c, H, K, V, C, off_b, strides[seg],
                SEG=seg, HAS_D=d is not None, G=G, NP=NP, TILES=TILES, BV=BV, BC=BC, PREC=precision,
                NPART=1 if seg == 2 else npart, num_warps=_warps(G * NP, BV, BC))
    return dz


def shared_partials(grads: list) -> tuple[list, int]:
    """``(grads, NPART)`` for the kernels: where every gradient given among ``dκ, dβ, dγ`` is a
    ``Partials`` of the same count (two or more, its offsets within int32), their stacked buffers
    (contiguous float32 ``[NPART, ...]``) and that count; else (a tensor beside them, differing
    counts) every ``Partials`` summed here (``summed``) and 1. ``dω`` (index 2) passes as it is."""
    kinds = [grads[i] for i in (0, 1, 3) if grads[i] is not None]
    counts = {d.parts.shape[0] if isinstance(d, Partials) else 1 for d in kinds}
    if len(counts) == 1 and all(isinstance(d, Partials) for d in kinds) and kinds:
        npart = counts.pop()
        stacked = [d if i == 2 or d is None else d.parts.float().contiguous() for i, d in enumerate(grads)]
        if npart > 1 and all((npart - 1) * d[0].numel() < 2**31 for i, d in enumerate(stacked)
                             if i != 2 and d is not None):
            return stacked, npart
    return [summed(d) for d in grads], 1


def _launch(kernel, grid, *args, pipelined: bool = True, **kwargs):
    """Triton's default pipelining of the tiles' ν loads (192 KiB of shared memory at the largest
    tiles, sm_90), or none (96 KiB) where the GPU gives a block less (320 KiB at 128-row tiles).
    ``pipelined=False`` (the one-launch kernels: their blocks' loops do not share shared memory,
    384 KiB at Triton's default stages, 320 at two, 96 at one; sm_90, scripts/kernel_resources.py):
    none at once."""
    if not pipelined:
        kernel[grid](*args, num_stages=1, **kwargs)
        return
    one_stage_where_refused((kernel, tuple(sorted(kwargs.items())), args[0].device),
                            lambda **stages: kernel[grid](*args, **kwargs, **stages))


def _warps(R: int, BV: int, BC: int) -> int:
    """8 warps for the largest tiles (``[64, 128]`` rows and a ``[128, 128]`` block of ``W``: no
    spill at sm_90, ``scripts/kernel_resources.py``), else 4."""
    return 8 if R * BC + BV * BC > 64 * 64 * 2 else 4
