"""GDN-2 (level 0), one token at a time: docs/CONTRACT.md section 1, in PyTorch.

    S_t = (I - k_t (b_t ⊙ k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t ⊙ v_t)^T
    o_t = scale · S_t^T q_t

computed as the spec's three steps: decay ``S' = diag(e^g) S``, read the erase
vector ``e = (b ⊙ k)^T S'``, write ``S = S' + k ⊗ (w ⊙ v - e)``. A token sees its
own write. Differentiable in every input (autograd through the loop gives the
reference gradients). Computes in the inputs' dtype; pass float64 for a reference.
"""
from __future__ import annotations

import torch

from reference.progress import Ticker
from reference.validation import check_gdn2_inputs, sequences


def gdn2_step(S, k, v, g, b, w):
    """One GDN-2 token step on states ``S [..., K, V]`` with ``k, g, b [..., K]``, ``v, w [..., V]``."""
    S_decayed = torch.exp(g)[..., :, None] * S                     # S' = diag(e^g) S
    e = torch.einsum("...k,...kv->...v", b * k, S_decayed)          # e = (b ⊙ k)^T S'
    return S_decayed + k[..., :, None] * (w * v - e)[..., None, :]  # S' + k ⊗ (w ⊙ v - e)


def gdn2_read(S, q, scale):
    """``o = scale · S^T q`` for ``S [..., K, V]``, ``q [..., K]``."""
    return scale * torch.einsum("...k,...kv->...v", q, S)


def naive_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Per-token GDN-2.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]``.
        scale: multiplies every read; default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (float32, or float64 with float64 inputs); default zeros.
        output_final_state: also return the state after the last token.
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``); each is computed as a separate call, with
            ``initial_state`` and the final state ``[N, H, K, V]``, one per sequence.

    Returns:
        ``(o [B, T, H, V], S_T [B, H, K, V] or None)`` in the inputs' dtype.
    """
    B, T, H, K, V = check_gdn2_inputs(q, k, v, g, b, w, scale, initial_state, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        outputs, finals = [], []
        for i, s, e in sequences(cu_seqlens):
            o_i, S_i = naive_gdn2(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], b[:, s:e], w[:, s:e], scale,
                                  None if initial_state is None else initial_state[i:i + 1], True)
            outputs.append(o_i)
            finals.append(S_i)
        return torch.cat(outputs, dim=1), (torch.cat(finals, dim=0) if output_final_state else None)
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(q.dtype)
    o = []
    tick = Ticker("naive_gdn2", T)                 # a time estimate on stderr for a long call
    for t in range(T):
        tick(t)
        S = gdn2_step(S, k[:, t], v[:, t], g[:, t], b[:, t], w[:, t])
        o.append(gdn2_read(S, q[:, t], scale))
    return torch.stack(o, dim=1), (S if output_final_state else None)
