"""A fused probe for the built-in schemes (``learned``, ``merge``, ``bounded_erase``) with a
hand-written backward: no autograd graph, no replay.

``probe_fwd(scheme, snaps, params, reduction) -> (outs, saved)`` computes exactly what
``reference.schemes.get_scheme(scheme).probe`` computes on ``snaps [..., H, K, V]``
(the op passes ``[B, F, H, K, V]``; any leading dims work), and
``probe_bwd(scheme, saved, snaps, params, reduction, dκ, dν, dβ, dω, dγ)`` returns
``(d_snaps, {name: dparam})`` from the gradients of the five outputs (any may be ``None``).

Forward (``Bt`` = product of the leading dims, rows ``r = (b, i)`` of one head)::

    ν   = Q M                                   one batched matmul           (merge: ν = M), or
                                                read from the snapshots' rows in place (``SnapshotRows``)
    Z   = ν [W_K | W_β | W_ω | W_γ]             ONE bmm over H: [H, Bt·n, V] @ [H, V, C]
    κ   = l2norm(Z_K)                           (merge: κ = I)
    β   = σ(Z_β)                                (bounded_erase: mean_k σ(Z_β) / max(1, Σ_j |κ_i·κ_j|))
    ω   = σ(Z_ω),  γ = reduce_i(-softplus(Z_γ))

``C = 3K + V`` (``merge``: ``2K + V``, no ``W_K``). The weights are concatenated once per
call (``[H, V, C]``, no copy per batch entry); ``ν`` is laid out head-major ``[H, Bt·n, V]``
for the bmm (one copy), and the activations are written straight into contiguous outputs.

Backward, per row (``s = 1/sqrt(|Z_K|² + 1e-6)``)::

    dZ_K = s (dκ' − κ ⟨κ, dκ'⟩)                 l2norm with its projection term; dκ' = dκ plus,
                                                for bounded_erase, (dG + dGᵀ) κ with
                                                dG_ij = dr_i sgn(G_ij), dr_i = [r_i ≥ 1] · (−dβ_i b_i / m_i²)
    dZ_β = dβ_ch ⊙ β_ch (1 − β_ch)              (bounded_erase: dβ_ch = (Σ_k dβ_ik / m_i) / K)
    dZ_ω = dω ⊙ ω (1 − ω)
    dZ_γ = −(dγ / n or dγ) ⊙ softplus'(Z_γ)     softplus' = e/(1+e), 1 above torch's threshold 20
    dν'  = dν + dZ Wᵀ                           one bmm over H (ν is itself an output: dν adds)
    dW   = νᵀ dZ                                one bmm over H, summed over rows (B, F, pairs)
    dQ   = Σ_lead dν' Mᵀ,  d_snaps = Qᵀ dν'      (merge: d_snaps = dν'; dQ read in place from ``SnapshotRows``;
                                                ``factored``: d_snaps left as the pair (Q, dν'))

The five outputs are contiguous (``merge``'s ν is the snapshots themselves, as in the reference:
no copy when they are contiguous; its κ is a materialised identity). The sigmoid and softplus
derivatives use torch's own formulas (``(1 − y)·y`` from the recomputed ``y``; ``e/(e+1)``), so
the float64 backward equals autograd's to rounding; ``σ(x)·σ(−x)`` would be more accurate in
float32 where the gates saturate, but would then differ from autograd's float64 value there.
At the kinks the backward chooses what torch autograd chooses: ``sgn(0) = 0`` for ``|·|``,
gradient through ``clamp(min=1)`` where ``r ≥ 1``. Parameter gradients are summed by bmm /
``sum`` (no atomics): two runs give bitwise-identical results.

``saved`` (``FusedSaved``) holds a reference to the output ν (no copy: the caller keeps the
pairs for the scan's backward anyway) and, with ``keep_preactivations=True`` (the default), the
pre-activations ``z [H, Bt·n, C]`` of the one bmm; everything else (κ, σ, softplus', the overlap
Gram matrix, ν's head-major copy) is recomputed in the backward. Memory beyond the outputs, in
elements of the snapshots' dtype: ``H·B·F·n·(3K + V)`` for ``learned`` / ``bounded_erase`` and
``H·B·F·K·(2K + V)`` for ``merge`` (n = K), about as much as the outputs κ, β, ω; with
``keep_preactivations=False`` none, and the backward recomputes ``z`` (one more bmm, the
forward's). The backward's transients: ``dz`` (as ``z``; with the Triton gates written over a
recomputed ``z``, which is spent once they have read it), ``ν``'s and ``dν'``'s head-major copies
``H·B·F·n·V`` each, and for bounded_erase the Gram matrix ``H·B·F·n²``.
"""
from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from optimized.nested.probe_gates import GATE_SCHEMES, probe_gates_bwd, probe_gates_fwd
from optimized.nested.probe_gates_nu import blocks as nu_gate_blocks
from optimized.nested.probe_gates_nu import ieee_blocks_fit, probe_gates_nu_bwd, probe_gates_nu_fwd
from optimized.nested.snapshot_reads import SnapshotRows, snapshot_read, snapshot_read_dq
from optimized.nested.promote_scan import summed
from optimized.nested.state_grad import FactoredSnapGrads
from reference.schemes import check_reduction

FUSED_SCHEMES = ("learned", "merge", "bounded_erase")

_EPS = 1e-6                 # reference.schemes.l2norm's epsilon
_SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's default threshold (beta = 1)


class FusedSaved(NamedTuple):
    scheme: str
    lead: tuple          # the snapshots' leading dims
    n: int
    nu: torch.Tensor     # the output ν [..., H, n, V] (a reference, not a copy)
    z: torch.Tensor | None   # [H, Bt·n, C]  ν @ [W_K | W_β | W_ω | W_γ] (rows (b, i)); None: recomputed
    weights: tuple | None = None   # (the forward's weight tensors, their versions, W): the backward's
    #                                W when it is given the same, unmodified tensors (``_weights``)


def _check_scheme(scheme):
    if scheme not in FUSED_SCHEMES:
        raise ValueError(f"scheme {scheme!r} has no fused probe; fused schemes: {list(FUSED_SCHEMES)}")


def _weight_names(scheme):
    return ("W_beta", "W_omega", "W_gamma") if scheme == "merge" else ("W_K", "W_beta", "W_omega", "W_gamma")


def _weights(scheme, params, saved: FusedSaved | None = None):
    """``(names, W)``: the weights side by side, ``W = [W_K | W_β | W_ω | W_γ]`` ``[H, V, C]``.
    With ``saved``: the forward's ``W`` when ``params`` holds the very tensors it was made of, none
    modified in place since (their version counters), so a backward makes no second ``cat``."""
    names = _weight_names(scheme)
    parts = tuple(params[k] for k in names)
    kept = None if saved is None else saved.weights
    if (kept is not None and all(a is b for a, b in zip(kept[0], parts))
            and kept[1] == tuple(p._version for p in parts)):
        return names, kept[2]
    return names, torch.cat(parts, dim=-1)


def _kept_weights(scheme, params, W) -> tuple:
    """``FusedSaved.weights`` of ``W`` made from ``params``."""
    parts = tuple(params[k] for k in _weight_names(scheme))
    return parts, tuple(p._version for p in parts), W


def _offsets(scheme, K, V):
    """Column slices of ``z``: (W_K or None, W_β, W_ω, W_γ)."""
    o = 0 if scheme == "merge" else K
    return (None if scheme == "merge" else slice(0, K)), slice(o, o + K), slice(o + K, o + K + V), \
        slice(o + K + V, o + 2 * K + V)


MATMUL_PRECISIONS = ("ieee", "tf32")


@contextlib.contextmanager
def float32_matmuls(precision: str):
    """torch's CUDA float32 matmuls inside the block in ``precision`` (``"ieee"`` or ``"tf32"``),
    restored after. torch has no per-call flag: this sets the process-wide
    ``torch.backends.cuda.matmul.fp32_precision`` for the duration, so another thread's CUDA
    float32 matmuls in that window would use it too. CPU matmuls are float32 either way."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"precision must be one of {MATMUL_PRECISIONS}, got {precision!r}")
    flags = torch.backends.cuda.matmul
    before = flags.fp32_precision
    flags.fp32_precision = precision
    try:
        yield
    finally:
        flags.fp32_precision = before


GATES = ("torch", "triton", "triton-nu")


# The most pairs a firing may have for ``gates="triton-nu"`` to make ``z`` inside its kernels; above
# it the bmm's ``z`` and ``probe_gates``. At 128 pairs (the query ladder's top levels from L = 5 on,
# merge at K = 128) a kernel tile is one firing of 128 rows, and the L = 6 step was slower and
# peaked higher with them there (bench/NOTES.md).
NU_GATES_MAX_PAIRS = 64


def _gates_from_nu(gates, scheme, n, K, V, precision="ieee") -> bool:
    """Whether the gates make ``z`` themselves from ``ν`` and ``W`` (``gates="triton-nu"``,
    ``optimized.nested.probe_gates_nu``): for learned and merge with at most ``NU_GATES_MAX_PAIRS``
    pairs a firing where its blocks fit, at IEEE ``precision`` blocks of at most ``IEEE_MAX_BLOCK``;
    else the bmm and ``probe_gates``."""
    return (gates == "triton-nu" and scheme in GATE_SCHEMES and n <= NU_GATES_MAX_PAIRS
            and nu_gate_blocks(n, K, V) is not None and ieee_blocks_fit(K, V, precision))


def _check_gates(gates):
    if gates not in GATES:
        raise ValueError(f"gates must be one of {GATES}, got {gates!r}")


def probe_fwd(scheme: str, snaps, params: dict, reduction: str = "mean",
              keep_preactivations: bool = True, precision: str = "ieee", gates: str = "torch"):
    """The scheme's five outputs ``(κ [..., H, n, K], ν [..., H, n, V], β [..., H, n, K],
    ω [..., H, n, V], γ [..., H, K])``, contiguous, and the ``FusedSaved`` of the backward
    (``keep_preactivations=False``: no pre-activations kept, the backward recomputes them).
    ``snaps``: the snapshots ``[..., H, K, V]`` float32, or (``learned``, ``bounded_erase``) a
    ``snapshot_reads.SnapshotRows`` ``[B, F, H, K, V]``: ``ν = Q M`` read from the rows that hold
    them, no gathered copy. ``precision``: of its float32 matmuls on CUDA (``float32_matmuls``)
    and of the in-place read's dots. ``gates="triton"``: κ, β, ω, γ from ``z`` in one kernel
    (``optimized.nested.probe_gates``; learned and merge, bounded_erase keeps these PyTorch gates);
    ``"triton-nu"``: without ``keep_preactivations``, ``z`` made inside that kernel from ``ν`` and the
    weights and never stored (``optimized.nested.probe_gates_nu``; with it, or above
    ``NU_GATES_MAX_PAIRS`` pairs a firing, ``"triton"``'s path)."""
    _check_gates(gates)
    _check_rows(scheme, snaps)
    with float32_matmuls(precision):
        return _probe_fwd(scheme, snaps, params, reduction, keep_preactivations, gates, precision)


def _check_rows(scheme, snaps):
    if isinstance(snaps, SnapshotRows) and scheme == "merge":
        raise ValueError("merge's ν is the snapshots themselves: pass them as a tensor, not as SnapshotRows")


def _probe_fwd(scheme, snaps, params, reduction, keep_preactivations, gates="torch", precision="ieee"):
    _check_scheme(scheme)
    check_reduction(reduction)
    *lead, H, K, V = snaps.shape
    lead = tuple(lead)
    Bt = math.prod(lead)
    if scheme == "merge":
        n = K
        ν4 = snaps.reshape(Bt, H, K, V).contiguous()
    else:                                                           # [Bt, H, n, V]
        n = params["Q"].shape[-2]
        ν4 = (snapshot_read(params["Q"], snaps, precision).view(Bt, H, n, V) if isinstance(snaps, SnapshotRows)
              else torch.matmul(params["Q"], snaps.reshape(Bt, H, K, V)))
    _, W = _weights(scheme, params)
    new = ν4.new_empty
    κ, β, ω, γ = new(Bt, H, n, K), new(Bt, H, n, K), new(Bt, H, n, V), new(Bt, H, K)
    if scheme == "merge":
        κ.copy_(torch.eye(K, dtype=ν4.dtype, device=ν4.device))
    outs = (κ.view(*lead, H, n, K), ν4.view(*lead, H, n, V), β.view(*lead, H, n, K),
            ω.view(*lead, H, n, V), γ.view(*lead, H, K))
    if not keep_preactivations and _gates_from_nu(gates, scheme, n, K, V, precision):
        # z made block by block inside the gates' kernel: no head-major copy of ν, no bmm, no z
        probe_gates_nu_fwd(scheme, ν4.contiguous(), W.contiguous(), Bt, H, n, K, V, reduction,
                           None if scheme == "merge" else κ, β, ω, γ, precision=precision)
        return outs, FusedSaved(scheme, lead, n, outs[1], None, _kept_weights(scheme, params, W))
    nu_h = ν4.transpose(0, 1).reshape(H, Bt * n, V)                # head-major copy
    z = torch.bmm(nu_h, W)                                         # [H, Bt·n, C]: the one matmul
    z4 = z.view(H, Bt, n, W.shape[-1])
    κh, βh, ωh = κ.transpose(0, 1), β.transpose(0, 1), ω.transpose(0, 1)   # [H, Bt, n, *] views
    if gates in ("triton", "triton-nu") and scheme in GATE_SCHEMES:
        probe_gates_fwd(scheme, z, Bt, H, n, K, V, reduction, None if scheme == "merge" else κ, β, ω, γ)
    else:
        _gates_fwd_torch(scheme, z4, reduction, K, V, κh, βh, ωh, γ)
    return outs, FusedSaved(scheme, lead, n, outs[1], z if keep_preactivations else None,
                            _kept_weights(scheme, params, W))


def _gates_fwd_torch(scheme, z4, reduction, K, V, κh, βh, ωh, γ):
    """κ, β, ω, γ from ``z4 [H, Bt, n, C]`` in PyTorch, written through the head-major views."""
    sK, sB, sW, sG = _offsets(scheme, K, V)
    if scheme != "merge":
        u = z4[..., sK]
        torch.div(u, torch.sqrt((u * u).sum(-1, keepdim=True) + _EPS), out=κh)
    if scheme == "bounded_erase":
        b = torch.sigmoid(z4[..., sB]).mean(-1, keepdim=True)                    # [H, Bt, n, 1]
        r = (κh @ κh.transpose(-1, -2)).abs().sum(-1, keepdim=True)
        βh.copy_((b / r.clamp(min=1.0)).expand_as(βh))
    else:
        torch.sigmoid(z4[..., sB], out=βh)
    torch.sigmoid(z4[..., sW], out=ωh)
    γ_i = -F.softplus(z4[..., sG])
    γ.transpose(0, 1).copy_(γ_i.mean(-2) if reduction == "mean" else γ_i.sum(-2))


def _head_major(x, Bt, H, rows, last):
    """``x [..., H, rows, last]`` as a ``[H, Bt, rows, last]`` view (no copy when contiguous)."""
    return x.reshape(Bt, H, rows, last).transpose(0, 1)


def probe_bwd(scheme: str, saved: FusedSaved, snaps, params: dict, reduction: str,
              dκ=None, dν=None, dβ=None, dω=None, dγ=None, *, precision: str = "ieee",
              gates: str = "torch", dz_over_z: bool = True, factored: bool = False):
    """Gradients of the snapshots and of every parameter from the gradients of the five outputs
    (``None``: zero; ``dκ``, ``dβ``, ``dγ`` may be the reverse scan's ``promote_scan.Partials``,
    summed by the gates that make ``z`` themselves as they load them, else first). Returns ``(d_snaps [..., H, K, V], {name: d_param})``. ``snaps``: as
    given to ``probe_fwd`` (a tensor or ``SnapshotRows``: ``dQ`` then read from the rows in
    place). ``precision``: of its float32 matmuls on CUDA (``float32_matmuls``) and the in-place
    read's dots. ``gates``: as in ``probe_fwd`` (the gates' backward in one kernel). ``dz_over_z``:
    with the Triton gates, write the pre-activations' gradient over the pre-activations this
    backward recomputed (never over kept ones); False: into a new buffer. ``factored`` (learned,
    bounded_erase): ``d_snaps`` returned as ``FactoredSnapGrads(Q, dν')`` standing for ``Qᵀ dν'``
    (``[H, n, K]`` and ``[..., H, n, V]``), for a consumer that forms the product itself
    (``optimized.nested.snapshot_grads``, ``optimized.nested.state_grad``); merge's ``d_snaps`` is ``dν'``
    either way."""
    _check_gates(gates)
    _check_rows(scheme, snaps)
    with float32_matmuls(precision):
        return _probe_bwd(scheme, saved, snaps, params, reduction, dκ, dν, dβ, dω, dγ, gates, precision, dz_over_z,
                          factored)


def _probe_bwd(scheme, saved, snaps, params, reduction, dκ, dν, dβ, dω, dγ, gates="torch", precision="ieee",
               dz_over_z=True, factored=False):
    _check_scheme(scheme)
    check_reduction(reduction)
    if scheme != saved.scheme:
        raise ValueError(f"saved state is for scheme {saved.scheme!r}, not {scheme!r}")
    *lead, H, K, V = snaps.shape
    Bt, n = math.prod(lead), saved.n
    names, W = _weights(scheme, params, saved)          # the forward's W where it still holds
    C = W.shape[-1]
    nu_h = saved.nu.reshape(Bt, H, n, V).transpose(0, 1).reshape(H, Bt * n, V)   # head-major copy
    if saved.z is None and _gates_from_nu(gates, scheme, n, K, V, precision):
        # z made again inside the gates' kernel from ν and W, never stored; dz in a new buffer (the
        # reverse scan's partials of dκ, dβ, dγ summed as the kernel loads them)
        dz = probe_gates_nu_bwd(scheme, saved.nu.reshape(Bt, H, n, V).contiguous(), W.contiguous(), Bt, H, n,
                                K, V, reduction, dκ, dβ, dω, dγ, precision=precision)
    else:
        dκ, dβ, dγ = (summed(x, release=True) for x in (dκ, dβ, dγ))   # the partials' sums, if partials
        z = torch.bmm(nu_h, W) if saved.z is None else saved.z
        if gates in ("triton", "triton-nu") and scheme in GATE_SCHEMES:
            # a recomputed z is spent once the gates' backward has read it: dz goes over it (the
            # probe backward's largest buffer, 0.25 GiB a level at L = 4, where the step peaks)
            dz = probe_gates_bwd(scheme, z, Bt, H, n, K, V, reduction, dκ, dβ, dω, dγ,
                                 overwrite_z=dz_over_z and saved.z is None)
        else:
            dz = _gates_bwd_torch(scheme, z, Bt, H, n, K, V, reduction, dκ, dβ, dω, dγ)

    # the one matmul: dν' = dν + dZ Wᵀ (ν is itself an output), dW = νᵀ dZ
    dz_rows = dz.view(H, Bt * n, C)
    dW = torch.bmm(nu_h.transpose(1, 2), dz_rows)                   # [H, V, C]
    back = torch.bmm(dz_rows, W.transpose(1, 2)).view(H, Bt, n, V).transpose(0, 1)   # [Bt, H, n, V] view
    dνt = saved.nu.new_empty(Bt, H, n, V)
    if dν is None:
        dνt.copy_(back)
    else:
        torch.add(dν.reshape(Bt, H, n, V), back, out=dνt)

    dparams = {}
    offset = 0
    for name in names:
        width = params[name].shape[-1]
        dparams[name] = dW[..., offset:offset + width].contiguous()
        offset += width
    if scheme == "merge":
        d_snaps = dνt
    else:
        Q = params["Q"]
        if isinstance(snaps, SnapshotRows):                         # [H, n, K], summed over (b, m)
            dparams["Q"] = snapshot_read_dq(dνt.view(*lead, H, n, V), snaps, precision)
        else:
            snaps4 = snaps.reshape(Bt, H, K, V)
            dparams["Q"] = torch.matmul(dνt, snaps4.transpose(-1, -2)).sum(0)   # [H, n, K], summed over lead
        if factored:                                                # Qᵀ dν' formed by the consumer
            return FactoredSnapGrads(Q, dνt.view(*lead, H, n, V)), {k: dparams[k] for k in params}
        d_snaps = torch.matmul(Q.transpose(-1, -2), dνt)            # [Bt, H, K, V]
    return d_snaps.view(*lead, H, K, V), {k: dparams[k] for k in params}


def _gates_bwd_torch(scheme, z, Bt, H, n, K, V, reduction, dκ, dβ, dω, dγ):
    """``dz [H, Bt, n, C]`` from the gates' gradients in PyTorch (every scheme)."""
    C = z.shape[-1]
    z4 = z.view(H, Bt, n, C)
    sK, sB, sW, sG = _offsets(scheme, K, V)
    dz = z.new_empty(H, Bt, n, C)

    # ω = σ(z_ω)
    if dω is None:
        dz[..., sW].zero_()
    else:
        ω = torch.sigmoid(z4[..., sW])
        torch.mul(_head_major(dω, Bt, H, n, V) * (1 - ω), ω, out=dz[..., sW])

    # γ = reduce_i(-softplus(z_γ))
    if dγ is None:
        dz[..., sG].zero_()
    else:
        g = z4[..., sG]
        dγ_i = -dγ.reshape(Bt, H, 1, K).transpose(0, 1)             # [H, Bt, 1, K], through the negation
        if reduction == "mean":
            dγ_i = dγ_i / n
        e = torch.exp(g.clamp(max=_SOFTPLUS_THRESHOLD))
        torch.where(g > _SOFTPLUS_THRESHOLD, dγ_i, dγ_i * e / (e + 1), out=dz[..., sG])

    # β (and, for bounded_erase, the overlap's gradient to κ)
    dκ_overlap = None
    if dβ is None:
        dz[..., sB].zero_()
    else:
        a = z4[..., sB]
        β_ch = torch.sigmoid(a)
        dβh = _head_major(dβ, Bt, H, n, K)
        if scheme == "bounded_erase":
            u = z4[..., sK]
            κ = u / torch.sqrt((u * u).sum(-1, keepdim=True) + _EPS)
            b = β_ch.mean(-1, keepdim=True)
            G = κ @ κ.transpose(-1, -2)                               # [H, Bt, n, n]
            r = G.abs().sum(-1, keepdim=True)
            m = r.clamp(min=1.0)
            dβ_i = dβh.sum(-1, keepdim=True)                          # β = (b / m) expanded over K
            db = dβ_i / m
            dm = -dβ_i * b / (m * m)
            dr = torch.where(r >= 1.0, dm, torch.zeros_like(dm))      # through clamp(min=1) where r ≥ 1
            dG = dr * G.sgn()                                         # d|G|: sgn, 0 at 0 (as autograd)
            dκ_overlap = (dG + dG.transpose(-1, -2)) @ κ
            dβ_ch = (db / K).expand_as(β_ch)                          # b = mean_k β_ch
        else:
            dβ_ch = dβh
        torch.mul(dβ_ch * (1 - β_ch), β_ch, out=dz[..., sB])

    # κ = l2norm(z_K)
    if sK is not None:
        dκt = None if dκ is None else _head_major(dκ, Bt, H, n, K)
        if dκ_overlap is not None:
            dκt = dκ_overlap if dκt is None else dκt + dκ_overlap
        if dκt is None:
            dz[..., sK].zero_()
        else:
            u = z4[..., sK]
            nrm = torch.sqrt((u * u).sum(-1, keepdim=True) + _EPS)
            κ = u / nrm
            torch.div(dκt - κ * (κ * dκt).sum(-1, keepdim=True), nrm, out=dz[..., sK])
    return dz
