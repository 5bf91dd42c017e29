"""Under Triton's interpreter: NumPy launches standing in for dependency kernels whose interpreted
cost is out of all proportion to their work, bit for bit what the interpreted kernel writes.

The interpreter runs a kernel once per program, paying Python's cost per operation. fla's
token-parallel intra-chunk kernel for GDN-2 (``chunk_gdn2_fwd_kernel_intra_token_parallel``) runs
one program per token with a loop over up to 16 earlier tokens: on the CPU suite it took 467 s of
the tests' 991 s inside kernels, 43 % (2-core machine, 2026-12-03), for a few thousand
multiply-adds a token. Its stand-in below makes the same numbers with the same float32 NumPy
operations on every token at once (same products, same ``np.sum`` over the same padded rows), and
writes exactly the entries the kernel writes: ``tests/test_interpreter_harness.py`` runs both on
ragged, packed and multi-head draws and asks for bit-identical outputs and untouched gaps.

Only dependency kernels stand in here, never ours (whose interpreted runs are what the CPU suite
tests), and only under the interpreter: on CUDA fla's kernels run as they are.
``NGDN_INTERPRETER_SUBSTITUTES=0`` runs fla's own kernels under the interpreter too.

A stand-in takes the launch's arguments by name (``inspect.getcallargs`` of the kernel, constexprs
included), its grid, and writes into the argument tensors.
"""
from __future__ import annotations

import numpy as np
import torch

BLOCK_ROWS = 1 << 15        # tokens a slice: bounds the [rows, H, BK] float32 temporaries


def _f32(x: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    return x[rows].to(torch.float32).numpy()


def _padded(x: np.ndarray, pad: int) -> np.ndarray:
    """``x`` with ``pad`` zero columns on its last axis (the kernel's masked lanes up to ``BK``)."""
    return np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], axis=-1) if pad else x


def _intra_token_parallel(q, k, g, erase, Aqk, Akk, scale, cu_seqlens, T, H, HV, K, BK, BT, BC) -> None:
    """The token-parallel diagonal blocks (module docstring of each stand-in below). ``q, k``
    ``[rows, H, K]``; ``g [rows, HV, K]``; ``erase`` GDN-2's ``b [rows, HV, K]`` or KDA's ``beta
    [rows, HV]``; ``HV`` a multiple of ``H`` (value heads ``hv`` read key head ``hv // (HV / H)``)."""
    rows = g.shape[0]
    if rows == 0 or HV == 0:
        return
    if cu_seqlens is not None:
        cu = cu_seqlens.to(torch.int64).cpu()
        rows = min(rows, int(cu[-1]))           # tokens past the last sequence: the kernel returns
        seq = torch.searchsorted(cu[1:], torch.arange(rows), right=True)
        bos = cu[seq]
    else:
        bos = torch.arange(rows) // T * T
    heads = torch.arange(HV) // (HV // H)
    q, k = q[:, heads], k[:, heads]
    scale = np.float32(scale)
    pad = BK - K
    for start in range(0, rows, BLOCK_ROWS):
        i = torch.arange(start, min(rows, start + BLOCK_ROWS))
        first = i - (i - bos[i]) % BC             # the sub-chunk's first token (BT is a multiple of BC)
        g_i = _f32(g, i)
        q_i = _f32(q, i)
        e_i = _f32(erase, i)
        kb_i = _f32(k, i) * (e_i if e_i.ndim == 3 else e_i[:, :, None])
        for d in range(BC):
            j = first + d
            take = j <= i
            if not bool(take.any()):
                break
            ii, jj, sel = i[take], j[take], take.numpy()
            kg = _padded(_f32(k, jj) * np.exp2(g_i[sel] - _f32(g, jj)), pad)
            aqk = np.sum(_padded(q_i[sel], pad) * kg, axis=-1) * scale
            akk = np.sum(_padded(kb_i[sel], pad) * kg, axis=-1) * np.where((jj < ii).numpy(), np.float32(1), np.float32(0))[:, None]
            Aqk[ii, :, (jj - bos[ii]) % BT] = torch.from_numpy(aqk).to(Aqk.dtype)
            Akk[ii, :, d] = torch.from_numpy(akk).to(Akk.dtype)


def gdn2_intra_token_parallel(args: dict, grid) -> None:
    """fla-core 0.6.0 ``chunk_gdn2_fwd_kernel_intra_token_parallel``: for token ``i`` of a
    sequence and each earlier token ``j`` of its 16-token sub-chunk (``j ≤ i``), per head,

        kg_j = k_j · 2^(g_i − g_j),   Aqk[i, j mod BT] = scale · Σ q_i kg_j,
        Akk[i, j − s_i] = [j < i] · Σ (k_i b_i) kg_j,

    ``s_i`` the sub-chunk's first token, ``g`` the chunk-local cumulative log2 gates, sums over
    the key dimension padded with zeros to ``BK``; every other entry of ``Aqk`` and ``Akk`` is left
    as it was. Tensors ``[B, T, H, K]`` (``Aqk [B, T, H, BT]``, ``Akk [B, T, H, BC]``), or one packed
    row with ``cu_seqlens``."""
    H, K = int(args["H"]), int(args["K"])
    rows = args["q"].numel() // max(H * K, 1)
    q, k, g, b = (args[n].view(rows, H, K) for n in ("q", "k", "g", "b"))
    _intra_token_parallel(q, k, g, b, args["Aqk"].view(rows, H, -1), args["Akk"].view(rows, H, -1),
                          args["scale"], args["cu_seqlens"], int(args["T"]), H, H, K,
                          int(args["BK"]), int(args["BT"]), int(args["BC"]))


def kda_intra_token_parallel(args: dict, grid) -> None:
    """fla-core 0.6.0 ``chunk_kda_fwd_kernel_intra_token_parallel``: as GDN-2's above with the
    erase gate a scalar per head, ``Akk[i, j − s_i] = [j < i] · β_i Σ k_i kg_j``, and ``HV`` value
    heads (``g``, ``beta``, ``Aqk``, ``Akk``) over ``H`` key heads (``q``, ``k``)."""
    H, HV, K = int(args["H"]), int(args["HV"]), int(args["K"])
    rows = args["q"].numel() // max(H * K, 1)
    q, k = (args[n].view(rows, H, K) for n in ("q", "k"))
    _intra_token_parallel(q, k, args["g"].view(rows, HV, K), args["beta"].view(rows, HV),
                          args["Aqk"].view(rows, HV, -1), args["Akk"].view(rows, HV, -1), args["scale"],
                          args["cu_seqlens"], int(args["T"]), H, HV, K,
                          int(args["BK"]), int(args["BT"]), int(args["BC"]))


# (kernel module, kernel name) -> stand-in
SUBSTITUTES = {
    ("fla.ops.gdn2.chunk_intra_token_parallel", "chunk_gdn2_fwd_kernel_intra_token_parallel"):
        gdn2_intra_token_parallel,
    ("fla.ops.kda.chunk_intra_token_parallel", "chunk_kda_fwd_kernel_intra_token_parallel"):
        kda_intra_token_parallel,
}


def lookup(fn):
    """The stand-in for the interpreted kernel function ``fn``, or None."""
    return SUBSTITUTES.get((getattr(fn, "__module__", None), getattr(fn, "__name__", None)))
