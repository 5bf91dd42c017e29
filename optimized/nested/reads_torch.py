"""The upper levels' reads in plain PyTorch (einsum per level): the reference-shaped
implementation the Triton reads kernel (``reads_fwd`` / ``reads_bwd``) replaced; kept for the
schedules the kernel does not take and as its test oracle."""
from __future__ import annotations

from typing import Sequence

import torch

from optimized.nested.level0 import CHUNK
from optimized.nested.plan import add_in_rounds, add_rounds
from optimized.nested.stored_states import as_stored


def _token_groups(x: torch.Tensor, f: int, G: int) -> torch.Tensor:
    """``[B, T, H, D] -> [B, G, f·C, H, D]``, zero-padded at the end."""
    B, T, H, D = x.shape
    pad = G * f * CHUNK - T
    if pad:
        x = torch.cat([x, x.new_zeros(B, pad, H, D)], dim=1)
    return x.view(B, G, f * CHUNK, H, D)


def read_fwd(states: torch.Tensor, q: torch.Tensor, read_index: Sequence[int], group: int | None,
             scale: float) -> torch.Tensor:
    """``o[t] = scale · states[read_index[chunk(t)]]^T q[t]``: ``[B, T, H, V]`` float32.

    With the CONTRACT schedule (``group = f``: chunk j reads state ``⌊j/f⌋``) groups of ``f``
    chunks share a state and one batched matmul per level does every read; any other
    schedule (``group = None``) falls back to one gathered state per chunk.
    """
    B, T, H, K = q.shape
    f = group
    if f is not None:
        G = -(-len(read_index) // f)
        o = torch.einsum("bgthk,bghkv->bgthv", _token_groups(q.float(), f, G), states[:, :G])
        return scale * o.reshape(B, -1, H, states.shape[-1])[:, :T]
    index = torch.tensor(read_index, device=states.device)
    o = torch.einsum("bnthk,bnhkv->bnthv", _token_groups(q.float(), 1, len(read_index)),
                     states.index_select(1, index))
    return scale * o.reshape(B, -1, H, states.shape[-1])[:, :T]


def read_bwd(states: torch.Tensor, q: torch.Tensor, do: torch.Tensor, read_index: Sequence[int],
             group: int | None, scale: float):
    """Gradients of ``read_fwd``: ``(dq [B, T, H, K], dstates like states)`` float32.

    ``dstates[s] = scale · Σ_{t reading s} q[t] ⊗ do[t]``: a contraction over the tokens
    of each group (no scatter)."""
    B, T, H, K = q.shape
    f = group
    dstates = torch.zeros_like(states)
    if f is not None:
        G = -(-len(read_index) // f)
        qg, dog = _token_groups(q.float(), f, G), _token_groups(do, f, G)
        dq = torch.einsum("bgthv,bghkv->bgthk", dog, states[:, :G])
        dstates[:, :G] = scale * torch.einsum("bgthk,bgthv->bghkv", qg, dog)
        return scale * dq.reshape(B, -1, H, K)[:, :T], dstates
    N = len(read_index)
    index = torch.tensor(read_index, device=states.device)
    qg, dog = _token_groups(q.float(), 1, N), _token_groups(do, 1, N)
    dq = torch.einsum("bnthv,bnhkv->bnthk", dog, states.index_select(1, index))
    per_chunk = scale * torch.einsum("bnthk,bnthv->bnhkv", qg, dog)
    _add_rows(dstates, list(read_index), per_chunk)
    return scale * dq.reshape(B, -1, H, K)[:, :T], dstates


def _add_rows(dst: torch.Tensor, index: Sequence[int], src: torch.Tensor) -> None:
    """``dst[:, index[i]] += src[:, i]`` along dim 1, deterministically (``plan.add_in_rounds``)."""
    add_in_rounds(dst, add_rounds(list(index), dst.device), src)


# --- the reads and router with the Triton kernels' signatures (``Pieces.reads``) ----------

def _unpacked(tables) -> None:
    if tables.packed is not None:
        raise ValueError("the PyTorch reads take one sequence per row; packed sequences (cu_seqlens) "
                         "need the Triton reads (the nested op's default pieces)")


def reads_router_fwd_torch(q, r, o0, states, plan, tables, scale, block_v=None):
    """``o = p_0 · o0 + Σ_{ℓ≥1} p_ℓ · read_ℓ`` with ``p = softmax(r)``, in q's dtype; ``states``
    the ``[B, S, H, K, V]`` rows of ``plan.device_tables`` (one tensor or a ``StoredStates``)."""
    _unpacked(tables)
    p = torch.softmax(r.float(), dim=-1)
    o = p[..., 0, None] * o0.float()
    stored = as_stored(states)
    for ℓ in range(1, plan.L):
        level = stored.level(tables, ℓ)
        o = o + p[..., ℓ, None] * read_fwd(level, q[:, :, :, ℓ], plan.read_index[ℓ], plan.read_group[ℓ], scale)
    return o.to(q.dtype)


def reads_router_bwd_torch(do, q, r, o0, states, plan, tables, scale, dq, block_v=None):
    """Gradients of ``reads_router_fwd_torch``: writes ``dq[:, :, :, 1:]``; returns ``(dr, do0 =
    p_0 · do, dstates [B, S, H, K, V])``, float32."""
    _unpacked(tables)
    do = do.float()
    p = torch.softmax(r.float(), dim=-1)
    dp = torch.empty_like(p)
    dp[..., 0] = (do * o0.float()).sum(-1)
    stored = as_stored(states)
    dstates = stored.lo.new_zeros(stored.lo.shape[0], stored.S, *stored.lo.shape[2:])
    for ℓ in range(1, plan.L):
        rows = tables.level_rows(ℓ)
        level = stored.level(tables, ℓ)
        o_l = read_fwd(level, q[:, :, :, ℓ], plan.read_index[ℓ], plan.read_group[ℓ], scale)
        dp[..., ℓ] = (do * o_l).sum(-1)
        dq[:, :, :, ℓ], dstates[:, rows] = read_bwd(level, q[:, :, :, ℓ], p[..., ℓ, None] * do,
                                                    plan.read_index[ℓ], plan.read_group[ℓ], scale)
    dr = p * (dp - (p * dp).sum(-1, keepdim=True))
    return dr, p[..., 0, None] * do, dstates
