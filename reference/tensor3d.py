"""3D tensor state (two-key linear attention), one token at a time: docs/CONTRACT.md section 4, in PyTorch.

Each head keeps a state ``T ∈ R^{K×E×V}``. A token writes with two keys,
``k1 ∈ R^K`` and a small second key ``k2 ∈ R^E``, and a read weighs each past
token by ``(q1·k1)(q2·k2)``:

    mode "gla":   T_t = exp(g_t) ⊙ T_{t-1} + k1_t ⊗ k2_t ⊗ v_t
    mode "delta": T' = exp(g_t) ⊙ T_{t-1}
                  e  = Σ_{i,j} κ_t[i, j] T'[i, j, :]          (κ_t = k1_t ⊗ k2_t)
                  T_t = T' + κ_t ⊗ β_t (v_t - e)
    y_t = scale · Σ_{i,j} q1_{t,i} q2_{t,j} T_t[i, j, :]

A token sees its own write. The log-decay ``g`` is broadcast by meaning, not by
NumPy's trailing-axis rule (``broadcast_gate``): ``[B, T, H]`` scales the whole
state, ``[B, T, H, E]`` scales tile ``T[:, j, :]`` by ``g[..., j]``, and
``[B, T, H, K, E]`` scales ``T[i, j, :]`` by ``g[..., i, j]``; ``g = None`` is no
decay. ``scale`` defaults to ``K ** -0.5`` with ``K`` the width of ``q1``.

Choices where the spec is silent (written down here, per CONTRACT's preamble):

- ``beta`` is required in mode ``delta`` and must be ``None`` in mode ``gla``
  (a gate that would be silently ignored is an error).
- The second query/key modes are helpers on raw projections
  (``second_query_key``); ``ones`` ignores the values of its input (its gradient
  is zero) and keeps its shape, so ``E`` is the raw projection's width.
- Sizes of the pairings (``state_size``) count numbers per head.

Differentiable in every input (autograd through the loop gives the reference
gradients). Computes in the inputs' dtype; pass float64 for a reference.
"""
from __future__ import annotations

import torch

from reference.progress import Ticker
from reference.validation import (
    CHUNK,
    FLOAT_DTYPES,
    check_dtype,
    check_same_device,
    check_same_dtype,
    check_scale,
    check_shape,
    check_sizes,
    check_state_dtype,
    check_tensor,
    check_cu_seqlens,
    check_state_count,
    sequences,
)

MODES = ("gla", "delta")
KEY_MODES = ("ones", "sigmoid", "softmax")
PAIRINGS = ("diagonal", "cross")
# Gate granularities, named by what one gate value scales.
GATE_KINDS = ("none", "head", "tile", "channel")


# --- second query / key modes and state sizes ------------------------------------------

def second_features(x: torch.Tensor, key_mode: str) -> torch.Tensor:
    """One second query or key ``[..., E]`` from its raw projection ``x [..., E]``.

    ``ones``: all ones; ``sigmoid``: ``σ(x)``, each in (0, 1); ``softmax``: ``softmax(x)``
    over the last axis (sums to 1 over E).
    """
    check_tensor("x", x)
    _check_choice("key_mode", key_mode, KEY_MODES)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a non-empty last axis E, got shape {tuple(x.shape)}")
    if key_mode == "ones":
        return torch.ones_like(x)
    if key_mode == "sigmoid":
        return torch.sigmoid(x)
    return torch.softmax(x, dim=-1)


def second_query_key(q2_raw: torch.Tensor, k2_raw: torch.Tensor, key_mode: str):
    """``(q2, k2)`` from raw projections ``[B, T, H, E]`` in one of ``KEY_MODES``."""
    check_tensor("q2_raw", q2_raw, ndim=4)
    check_tensor("k2_raw", k2_raw, ndim=4)
    check_shape("k2_raw", k2_raw, q2_raw.shape, "[B, T, H, E] (the shape of q2_raw)")
    return second_features(q2_raw, key_mode), second_features(k2_raw, key_mode)


def state_size(K: int, E: int, V: int, pairing: str = "diagonal") -> int:
    """Numbers in one head's state.

    ``diagonal``: the 3D state ``K×E×V`` (each value channel paired with the K·E key
    products) holds ``K·E·V``. ``cross``: one wide 2D head with key width ``K·E`` and
    value width ``V·E`` holds ``K·E·V·E``, E times more.
    """
    for name, n in (("K", K), ("E", E), ("V", V)):
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"{name} must be an int, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    _check_choice("pairing", pairing, PAIRINGS)
    return K * E * V if pairing == "diagonal" else (K * E) * (V * E)


# --- validation ---------------------------------------------------------------------------

def _check_choice(name: str, value, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {list(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def gate_kind(g, B, T, H, K, E) -> str:
    """Which granularity a log-decay ``g`` has (``GATE_KINDS``), checking its shape."""
    if g is None:
        return "none"
    check_tensor("g", g)
    shapes = {3: ("head", (B, T, H), "[B, T, H]"),
              4: ("tile", (B, T, H, E), "[B, T, H, E]"),
              5: ("channel", (B, T, H, K, E), "[B, T, H, K, E]")}
    if g.dim() not in shapes:
        raise ValueError(f"g must have shape [B, T, H] = {(B, T, H)}, [B, T, H, E] = {(B, T, H, E)} "
                         f"or [B, T, H, K, E] = {(B, T, H, K, E)}, got {tuple(g.shape)}")
    kind, expected, layout = shapes[g.dim()]
    check_shape("g", g, expected, layout)
    return kind


def check_tensor3d_inputs(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None,
                          initial_state=None, dtypes=FLOAT_DTYPES, cu_seqlens=None):
    """CONTRACT section 4 shapes: ``q1, k1 [B, T, H, K]``, ``q2, k2 [B, T, H, E]``,
    ``v [B, T, H, V]``, ``g`` as in ``gate_kind`` or None, ``beta [B, T, H]`` (mode
    ``delta`` only), ``initial_state [B, H, K, E, V]`` (``[N, H, K, E, V]`` with ``cu_seqlens``,
    ``reference.validation.check_cu_seqlens``).

    Returns ``(B, T, H, K, E, V, gate_kind)``.
    """
    _check_choice("mode", mode, MODES)
    for name, x in (("q1", q1), ("k1", k1), ("q2", q2), ("k2", k2), ("v", v)):
        check_tensor(name, x, ndim=4)
    B, T, H, K = q1.shape
    E, V = q2.shape[-1], v.shape[-1]
    if T == 0:
        raise ValueError("q1 must hold at least one token, got T = 0")
    check_shape("k1", k1, (B, T, H, K), "[B, T, H, K]")
    check_shape("q2", q2, (B, T, H, E), "[B, T, H, E]")
    check_shape("k2", k2, (B, T, H, E), "[B, T, H, E]")
    check_shape("v", v, (B, T, H, V), "[B, T, H, V]")
    kind = gate_kind(g, B, T, H, K, E)
    if mode == "delta":
        if beta is None:
            raise ValueError("beta [B, T, H] is required in mode 'delta', got None")
        check_tensor("beta", beta, ndim=3)
        check_shape("beta", beta, (B, T, H), "[B, T, H]")
    elif beta is not None:
        raise ValueError("beta is only used in mode 'delta'; pass beta=None in mode 'gla'")
    named = (("q1", q1), ("k1", k1), ("q2", q2), ("k2", k2), ("v", v), ("g", g), ("beta", beta))
    check_same_dtype(named)
    check_dtype("q1", q1, dtypes)
    N = -(-T // CHUNK)
    check_sizes((("q1 [B, T, H, K]", (B, T, H, K)), ("v [B, T, H, V]", (B, T, H, V)),
                 ("the flattened key vec(k1 ⊗ k2) [B, T, H, K·E]", (B, T, H, K * E)),
                 ("the per-chunk states [B, ceil(T/64), H, K·E, V]", (B, N, H, K * E, V))))
    check_same_device(named + (("initial_state", initial_state),))
    check_scale(scale, q1.dtype)
    N = B
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T, q1.device)
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ndim=5)
        if cu_seqlens is not None:
            check_state_count("initial_state", initial_state, N, "[N, H, K, E, V]")
        check_shape("initial_state", initial_state, (N, H, K, E, V),
                    "[B, H, K, E, V]" if cu_seqlens is None else "[N, H, K, E, V]")
        check_state_dtype("initial_state", initial_state, q1.dtype)
    return B, T, H, K, E, V, kind


# --- the recurrence ---------------------------------------------------------------------------

def broadcast_gate(g, K: int, E: int) -> torch.Tensor | None:
    """A log-decay of any granularity as ``[..., K, E]``, by meaning (CONTRACT section 4).

    ``g [B, T, H]`` -> every ``(i, j)``; ``g [B, T, H, E]`` -> ``g[..., j]`` for tile ``j``
    (the same for every ``i``); ``g [B, T, H, K, E]`` unchanged. ``None`` stays ``None``.
    """
    if g is None:
        return None
    if g.dim() == 3:                                   # one gate for the whole state
        return g[..., None, None].expand(*g.shape, K, E)
    if g.dim() == 4:                                   # one gate per K×V tile T[:, j, :]
        return g[..., None, :].expand(*g.shape[:-1], K, E)
    return g                                           # one gate per channel T[i, j, :]


def tensor3d_step(S, k1, k2, v, g=None, beta=None, mode="gla"):
    """One token on states ``S [..., K, E, V]`` with ``k1 [..., K]``, ``k2 [..., E]``,
    ``v [..., V]``, log-decay ``g [..., K, E]`` (by meaning, see ``broadcast_gate``) or
    None, ``beta [...]`` (mode ``delta``)."""
    S_decayed = S if g is None else torch.exp(g)[..., None] * S        # T' = exp(g) ⊙ T
    kappa = k1[..., :, None] * k2[..., None, :]                         # κ = k1 ⊗ k2   [..., K, E]
    if mode == "gla":
        return S_decayed + kappa[..., None] * v[..., None, None, :]     # T' + k1 ⊗ k2 ⊗ v
    e = torch.einsum("...ij,...ijv->...v", kappa, S_decayed)            # e = T'^T κ
    delta = beta[..., None] * (v - e)                                   # β (v - e)
    return S_decayed + kappa[..., None] * delta[..., None, None, :]     # T' + κ ⊗ β (v - e)


def tensor3d_read(S, q1, q2, scale):
    """``y = scale · Σ_{i,j} q1_i q2_j S[i, j, :]`` for ``S [..., K, E, V]``."""
    return scale * torch.einsum("...i,...j,...ijv->...v", q1, q2, S)


def naive_tensor3d(q1, k1, q2, k2, v, g=None, beta=None, mode="gla", scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None):
    """Per-token 3D tensor state.

    Args:
        q1, k1: ``[B, T, H, K]``; q2, k2: ``[B, T, H, E]``; v: ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]``, ``[B, T, H, E]`` or ``[B, T, H, K, E]``, or None (no decay).
        beta: ``[B, T, H]``, the delta rule's scalar gate (mode ``delta`` only).
        mode: ``"gla"`` (linear-attention write) or ``"delta"`` (gated delta rule).
        scale: multiplies every read; default ``K ** -0.5`` (K = width of q1).
        initial_state: ``[B, H, K, E, V]`` (float32, or float64 with float64 inputs); default zeros.
        output_final_state: also return the state after the last token.
        cu_seqlens: ``[0, T_1, T_1 + T_2, …, T]`` (int32 or int64, on the inputs' device) for N
            sequences packed in one row (``B = 1``); each is computed as a separate call, with
            ``initial_state`` and the final state ``[N, H, K, E, V]``, one per sequence.

    Returns:
        ``(y [B, T, H, V], T_final [B, H, K, E, V] or None)`` in the inputs' dtype.
    """
    B, T, H, K, E, V, _ = check_tensor3d_inputs(q1, k1, q2, k2, v, g, beta, mode, scale, initial_state,
                                                cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:                  # one separate call per packed sequence
        outputs, finals = [], []
        for i, s, e in sequences(cu_seqlens):
            y_i, S_i = naive_tensor3d(*(None if x is None else x[:, s:e] for x in (q1, k1, q2, k2, v, g, beta)),
                                      mode, scale, None if initial_state is None else initial_state[i:i + 1], True)
            outputs.append(y_i)
            finals.append(S_i)
        return torch.cat(outputs, dim=1), (torch.cat(finals, dim=0) if output_final_state else None)
    scale = K ** -0.5 if scale is None else scale
    gate = broadcast_gate(g, K, E)
    S = q1.new_zeros(B, H, K, E, V) if initial_state is None else initial_state.to(q1.dtype)
    y = []
    tick = Ticker("naive_tensor3d", T)             # a time estimate on stderr for a long call
    for t in range(T):
        tick(t)
        S = tensor3d_step(S, k1[:, t], k2[:, t], v[:, t], None if gate is None else gate[:, t],
                          None if beta is None else beta[:, t], mode)
        y.append(tensor3d_read(S, q1[:, t], q2[:, t], scale))
    return torch.stack(y, dim=1), (S if output_final_state else None)
