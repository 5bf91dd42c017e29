"""The fused probe's gates in one Triton kernel per pass on the pre-activations of a bmm
(``probe_fused``'s ``gates="triton"``, ``Pieces(probe_gates="triton")``, reads_ab ``gates-triton``;
the nested op's default, ``"triton-nu"``, ``probe_gates_nu``, makes the pre-activations inside its
kernels instead and comes here where its blocks would not fit or ``z`` is kept; reads_ab
``gates-torch`` is the PyTorch gates), for ``learned`` and ``merge``.

The probe's one bmm gives the pre-activations ``z [H, Bt·n, C]`` (rows ``(bt, i)`` of one head,
columns ``[Z_K | Z_β | Z_ω | Z_γ]``; ``merge`` has no ``Z_K``). The gates then take, in PyTorch,
about a dozen elementwise and reduction kernels forward and two dozen backward per level, each a
full pass over ``[H, Bt, n, K]`` float32. Here one program per (bt, head) reads its ``n`` rows of
``z`` once and writes every output once (the measured effect: bench/NOTES.md).

Forward (per row; ``s = 1/sqrt(|Z_K|² + ε)``, ε = 1e-6 as ``reference.schemes.l2norm``)::

    κ = s Z_K        β = σ(Z_β)        ω = σ(Z_ω)        γ = c Σ_i −softplus(Z_γ,i)

with ``c = 1/n`` (``mean``) or 1 (``sum``) and torch's softplus (``x`` above 20). Backward, from
``dκ, dβ, dω, dγ`` (each may be absent: its columns of ``dz`` are 0)::

    dZ_K = s (dκ − κ ⟨κ, dκ⟩)   dZ_β = dβ β (1 − β)   dZ_ω = dω ω (1 − ω)
    dZ_γ = −c dγ σ(Z_γ)  (−c dγ above 20)

the formulas of ``probe_fused._gates_bwd_torch``, which stays the reference path (the
``test_triton_gates_*`` properties: ``property_tests/test_probe_fused.py``). ``bounded_erase`` keeps the
PyTorch gates: its β needs the ``n × n`` overlap of the κ rows, and its κ gradient the overlap's.

Layouts: ``z``, ``dz`` ``[H, Bt·n, C]`` float32 contiguous; ``κ, β, dκ, dβ [Bt, H, n, K]``,
``ω, dω [Bt, H, n, V]``, ``γ, dγ [Bt, H, K]`` float32 contiguous. Rows go in blocks of ``BN``
(γ's sum carried across them); K and V are covered whole (``BK``, ``BV`` powers of two, masked).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.schemes import check_reduction
from optimized.host_math import next_power_of_2

GATE_SCHEMES = ("learned", "merge")


@triton.jit
def _softplus(x):
    """torch's softplus (threshold 20), with log1p(t) ≈ t (1 − t/2) for t = exp(−|x|) < 1e-4,
    where ``log(1 + t)`` would round ``t`` away."""
    t = tl.exp(-tl.abs(x))
    log1p = tl.where(t < 1e-4, t * (1.0 - 0.5 * t), tl.log(1.0 + t))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def _row_block(i0, n, z_row0, out_row0, o_k, m_k, m_v, K, C, BN: tl.constexpr):
    """Rows ``i0 .. i0 + BN`` of one (bt, head) (rows ≥ n masked): ``(o_n, m_nk, m_nv, z_rows,
    p_nk)``, ``z_rows`` the offsets of their rows in ``z`` / ``dz`` (``[BN, 1]``), ``p_nk`` of their
    ``[BN, K]`` blocks in the ``[Bt, H, n, K]`` tensors."""
    o_n = i0 + tl.arange(0, BN)
    m_n = o_n < n
    z_rows = (z_row0 + o_n)[:, None] * C
    p_nk = (out_row0 + o_n)[:, None] * K + o_k[None, :]
    return o_n, m_n[:, None] & m_k[None, :], m_n[:, None] & m_v[None, :], z_rows, p_nk


# Bt, n and H are runtime sizes, not specialised (a new level, schedule or batch reuses the
# compiled kernel). K, V, C and OFF_B are the row strides and column offsets: Triton's
# specialisation on their divisibility by 16 is what lets it prove rows aligned and load and
# store them 16 bytes at a time (unspecialised, the kernels ran at about a quarter of the
# bandwidth: bench/NOTES.md); it compiles at most a few variants per block size
@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_fwd_kernel(
    z, kappa, beta, omega, gamma, Bt, n, c_reduce, H, K, V, C, OFF_B,
    HAS_KAPPA: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """One (bt, head): ``κ = l2norm(Z_K)``, ``β = σ(Z_β)``, ``ω = σ(Z_ω)`` for its n rows and
    ``γ = c Σ_i −softplus(Z_γ,i)`` (module docstring)."""
    i_bt, i_h = tl.program_id(0), tl.program_id(1)
    o_k, o_v = tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    z_row0 = (i_h.to(tl.int64) * Bt + i_bt) * n           # first row of this (bt, head) in z
    out_row0 = (i_bt.to(tl.int64) * H + i_h) * n          # ... in the [Bt, H, n, *] outputs
    acc = tl.zeros([BK], dtype=tl.float32)
    for i0 in range(0, n, BN):
        o_n, m_nk, m_nv, z_rows, p_nk = _row_block(i0, n, z_row0, out_row0, o_k, m_k, m_v, K, C, BN)
        p_z = z + z_rows
        if HAS_KAPPA:
            u = tl.load(p_z + o_k[None, :], mask=m_nk, other=0.0)
            s = 1.0 / tl.sqrt(tl.sum(u * u, axis=1) + 1e-6)
            tl.store(kappa + p_nk, u * s[:, None], mask=m_nk)
        a = tl.load(p_z + OFF_B + o_k[None, :], mask=m_nk, other=0.0)
        tl.store(beta + p_nk, tl.sigmoid(a), mask=m_nk)
        w = tl.load(p_z + OFF_B + K + o_v[None, :], mask=m_nv, other=0.0)
        tl.store(omega + (out_row0 + o_n)[:, None] * V + o_v[None, :], tl.sigmoid(w), mask=m_nv)
        g = tl.load(p_z + OFF_B + K + V + o_k[None, :], mask=m_nk, other=0.0)
        acc += tl.sum(tl.where(m_nk, -_softplus(g), 0.0), axis=0)
    tl.store(gamma + (i_bt.to(tl.int64) * H + i_h) * K + o_k, acc * c_reduce, mask=m_k)


@triton.jit(do_not_specialize=["Bt", "n", "H"])
def probe_gates_bwd_kernel(
    z, dkappa, dbeta, domega, dgamma, dz, Bt, n, c_reduce, H, K, V, C, OFF_B,
    HAS_KAPPA: tl.constexpr, HAS_DK: tl.constexpr, HAS_DB: tl.constexpr, HAS_DW: tl.constexpr,
    HAS_DG: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """One (bt, head): ``dz`` of its n rows from the gates' gradients (module docstring);
    every column of ``dz`` is written (0 where the output's gradient is absent)."""
    i_bt, i_h = tl.program_id(0), tl.program_id(1)
    o_k, o_v = tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    z_row0 = (i_h.to(tl.int64) * Bt + i_bt) * n
    out_row0 = (i_bt.to(tl.int64) * H + i_h) * n
    if HAS_DG:
        dg_i = -c_reduce * tl.load(dgamma + (i_bt.to(tl.int64) * H + i_h) * K + o_k, mask=m_k, other=0.0)
    for i0 in range(0, n, BN):
        o_n, m_nk, m_nv, z_rows, p_nk = _row_block(i0, n, z_row0, out_row0, o_k, m_k, m_v, K, C, BN)
        p_z, p_dz = z + z_rows, dz + z_rows
        if HAS_KAPPA:
            d_u = tl.zeros([BN, BK], dtype=tl.float32)
            if HAS_DK:
                u = tl.load(p_z + o_k[None, :], mask=m_nk, other=0.0)
                s = 1.0 / tl.sqrt(tl.sum(u * u, axis=1) + 1e-6)
                kap = u * s[:, None]
                d_k = tl.load(dkappa + p_nk, mask=m_nk, other=0.0)
                d_u = (d_k - kap * tl.sum(kap * d_k, axis=1)[:, None]) * s[:, None]
            tl.store(p_dz + o_k[None, :], d_u, mask=m_nk)
        d_a = tl.zeros([BN, BK], dtype=tl.float32)
        if HAS_DB:
            b = tl.sigmoid(tl.load(p_z + OFF_B + o_k[None, :], mask=m_nk, other=0.0))
            d_a = tl.load(dbeta + p_nk, mask=m_nk, other=0.0) * (1.0 - b) * b
        tl.store(p_dz + OFF_B + o_k[None, :], d_a, mask=m_nk)
        d_w = tl.zeros([BN, BV], dtype=tl.float32)
        if HAS_DW:
            w = tl.sigmoid(tl.load(p_z + OFF_B + K + o_v[None, :], mask=m_nv, other=0.0))
            d_w = tl.load(domega + (out_row0 + o_n)[:, None] * V + o_v[None, :], mask=m_nv, other=0.0) * (1.0 - w) * w
        tl.store(p_dz + OFF_B + K + o_v[None, :], d_w, mask=m_nv)
        d_g = tl.zeros([BN, BK], dtype=tl.float32)
        if HAS_DG:
            g = tl.load(p_z + OFF_B + K + V + o_k[None, :], mask=m_nk, other=0.0)
            d_g = tl.where(g > 20.0, dg_i[None, :], dg_i[None, :] * tl.sigmoid(g))
        tl.store(p_dz + OFF_B + K + V + o_k[None, :], d_g, mask=m_nk)


def gate_columns(scheme, K, V) -> int:
    """``z``'s columns ``C`` for a scheme with Triton gates (refused for the others)."""
    if scheme not in GATE_SCHEMES:
        raise ValueError(f"scheme {scheme!r} has no Triton gates; they cover {list(GATE_SCHEMES)} "
                         f"(bounded_erase keeps the PyTorch gates)")
    return (2 * K + V) if scheme == "merge" else (3 * K + V)


def _sizes(scheme, z, Bt, H, n, K, V):
    C = gate_columns(scheme, K, V)
    _expect("z", z, (H, Bt * n, C))
    off_b = 0 if scheme == "merge" else K
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    BN = max(1, min(next_power_of_2(n), 4096 // max(BK, BV)))  # ≤ 4096 float32 a tile
    return C, off_b, BN, BK, BV


def _expect(name, x, shape, device=None):
    """``x`` is a contiguous float32 tensor of ``shape`` (the kernels index it flat), on ``device``."""
    if (x.dtype != torch.float32 or not x.is_contiguous() or tuple(x.shape) != tuple(shape)
            or (device is not None and x.device != device)):
        raise ValueError(f"{name} must be a contiguous float32 {tuple(shape)} tensor on {device or x.device}, got "
                         f"{x.dtype} {tuple(x.shape)} on {x.device}{'' if x.is_contiguous() else ' (not contiguous)'}")


def _reduce_factor(reduction, n):
    check_reduction(reduction)
    return 1.0 / n if reduction == "mean" else 1.0


def check_outputs(scheme, kappa, beta, omega, gamma, Bt, H, n, K, V, device):
    """The gates' outputs (layouts in the module docstring) on ``device``; ``kappa`` exactly when the
    scheme has ``Z_K`` (not merge)."""
    if (kappa is None) != (scheme == "merge"):
        raise ValueError("kappa must be given exactly when the scheme has Z_K (not merge)")
    for name, x, shape in (("kappa", kappa, (Bt, H, n, K)), ("beta", beta, (Bt, H, n, K)),
                           ("omega", omega, (Bt, H, n, V)), ("gamma", gamma, (Bt, H, K))):
        if x is not None:
            _expect(name, x, shape, device)


def checked_grads(dkappa, dbeta, domega, dgamma, Bt, H, n, K, V, device) -> list:
    """The gates' gradients (any may be None) as contiguous float32, each checked: any leading dims
    that flatten to ``Bt`` (the op's ``[B, F, H, ...]``)."""
    grads = [None if x is None else x.float().contiguous() for x in (dkappa, dbeta, domega, dgamma)]
    for name, x, shape in (("dkappa", grads[0], (Bt, H, n, K)), ("dbeta", grads[1], (Bt, H, n, K)),
                           ("domega", grads[2], (Bt, H, n, V)), ("dgamma", grads[3], (Bt, H, K))):
        if x is not None:
            tail = shape[1:]
            _expect(name, x.reshape(-1, *tail) if tuple(x.shape[-len(tail):]) == tail else x, shape, device)
    return grads


def probe_gates_fwd(scheme: str, z: torch.Tensor, Bt: int, H: int, n: int, K: int, V: int, reduction: str,
                    kappa: torch.Tensor | None, beta: torch.Tensor, omega: torch.Tensor, gamma: torch.Tensor):
    """Writes ``κ`` (not for ``merge``: pass None), ``β``, ``ω``, ``γ`` (contiguous float32, layouts in
    the module docstring) from ``z``."""
    C, off_b, BN, BK, BV = _sizes(scheme, z, Bt, H, n, K, V)
    check_outputs(scheme, kappa, beta, omega, gamma, Bt, H, n, K, V, z.device)
    if Bt * H * n == 0:
        gamma.zero_()
        return
    probe_gates_fwd_kernel[(Bt, H)](
        z, kappa if kappa is not None else beta, beta, omega, gamma, Bt, n, _reduce_factor(reduction, n),
        H, K, V, C, off_b, HAS_KAPPA=kappa is not None, BN=BN, BK=BK, BV=BV,
        num_warps=4)


def probe_gates_bwd(scheme: str, z: torch.Tensor, Bt: int, H: int, n: int, K: int, V: int, reduction: str,
                    dkappa=None, dbeta=None, domega=None, dgamma=None, overwrite_z: bool = False) -> torch.Tensor:
    """``dz [H, Bt·n, C]`` float32 from the gates' gradients (any may be None).

    ``overwrite_z``: write ``dz`` over ``z`` (the caller's ``z`` is spent; no second buffer of its
    size). Safe in place: a program reads each block of columns of its rows of ``z`` before it
    writes the same block of ``dz``, the value written depends on the value read, and no program
    reads another's rows."""
    C, off_b, BN, BK, BV = _sizes(scheme, z, Bt, H, n, K, V)
    dz = z if overwrite_z else torch.empty_like(z)
    if Bt * H * n == 0:
        return dz
    grads = checked_grads(dkappa, dbeta, domega, dgamma, Bt, H, n, K, V, z.device)
    stand_in = z   # an unused pointer for an absent gradient (its branch is compiled out)
    probe_gates_bwd_kernel[(Bt, H)](
        z, *(stand_in if x is None else x for x in grads), dz, Bt, n, _reduce_factor(reduction, n),
        H, K, V, C, off_b, HAS_KAPPA=scheme != "merge", HAS_DK=grads[0] is not None,
        HAS_DB=grads[1] is not None, HAS_DW=grads[2] is not None, HAS_DG=grads[3] is not None,
        BN=BN, BK=BK, BV=BV, num_warps=4)
    return dz
