"""Input checks shared by every public function (docs/CONTRACT.md, "Errors").

Every check raises ``ValueError`` (``TypeError`` for a wrong type) naming the
argument, what was expected and what was given, so nothing fails later inside a
kernel or an index expression.
"""
from __future__ import annotations

import warnings
from typing import Iterable, Sequence

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Kernels index their tensors with int32 offsets: no tensor a call creates or reads may hold
# more elements than this (CONTRACT "Errors", sizes). The references share the limit (one rule).
MAX_ELEMENTS = 2 ** 31 - 1


def check_tensor(name: str, x, ndim: int | None = None, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES):
    """``x`` is a torch tensor with ``ndim`` dimensions and one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")


def check_dtype(name: str, x: torch.Tensor, dtypes: Sequence[torch.dtype]):
    """``x.dtype`` is one of ``dtypes`` (checked after ``check_same_dtype``, so a mixed-dtype
    input gets the same message from every entry point, whatever dtypes it accepts)."""
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")


def check_sizes(sizes: Iterable[tuple[str, Sequence[int]]]):
    """Every ``(what, shape)`` (a tensor the call reads or creates, named with its layout)
    holds at most ``MAX_ELEMENTS`` elements; checked before any work or allocation."""
    for what, shape in sizes:
        n = 1
        for d in shape:
            n *= int(d)
        if n > MAX_ELEMENTS:
            raise ValueError(f"{what} = {tuple(int(d) for d in shape)} would hold {n} elements, more than "
                             f"2**31 - 1 = {MAX_ELEMENTS} (kernels index with int32 offsets); "
                             "split the batch or the sequence")


def as_checkable(name: str, x):
    """The NumPy twins' inputs, for the shared checks: a NumPy array becomes a torch view of
    the same memory (no copy, any size), a tensor or ``None`` stays as it is. Anything else
    is a ``TypeError`` naming the argument."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if any(s < 0 for s in x.strides):
            x = x.copy()
        try:
            with warnings.catch_warnings():     # a read-only (e.g. broadcast) array: only read here
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return torch.from_numpy(x)
        except TypeError:
            raise ValueError(f"{name} must have dtype in {[str(d) for d in FLOAT_DTYPES]}, "
                             f"got NumPy {x.dtype}") from None
    raise TypeError(f"{name} must be a NumPy array or torch.Tensor, got {type(x).__name__}")


def as_array(x) -> np.ndarray:
    """A float64 NumPy copy of an array or a (possibly grad-tracking, any-device) tensor."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.array(x, dtype=np.float64)


def check_shape(name: str, x: torch.Tensor, expected: Sequence[int], layout: str):
    """``x.shape == expected``; ``layout`` names the axes, e.g. ``"[B, T, H, K]"``."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}, got {tuple(x.shape)}")


def check_same_device(named: Iterable[tuple[str, torch.Tensor | None]]):
    """All given tensors (``None`` skipped) live on one device."""
    named = [(n, t) for n, t in named if t is not None]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if not named:
        return
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; "
                             "all tensors must be on one device")


def check_same_dtype(named: Iterable[tuple[str, torch.Tensor | None]]):
    """All given tensors (``None`` skipped) share one dtype."""
    named = [(n, t) for n, t in named if t is not None]
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.dtype != first.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
                             "inputs must share one dtype")


def check_state_dtype(name: str, state: torch.Tensor, compute_dtype: torch.dtype):
    """States are float32 (CONTRACT conventions); float64 is accepted where inputs are float64."""
    allowed = {torch.float32, compute_dtype} if compute_dtype == torch.float64 else {torch.float32}
    if state.dtype not in allowed:
        raise ValueError(f"{name} must have dtype {' or '.join(sorted(str(d) for d in allowed))}, "
                         f"got {state.dtype}")


def check_finite(name: str, x: torch.Tensor):
    """Cheap finiteness check, used for parameters (small tensors)."""
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def check_all_finite(named: Iterable[tuple[str, torch.Tensor]]):
    """``check_finite`` for many tensors on one device with a single host sync."""
    named = list(named)
    if not named:
        return
    flags = torch.stack([torch.isfinite(x).all() for _, x in named])
    if not bool(flags.all()):
        name = next(n for (n, _), ok in zip(named, flags.tolist()) if not ok)
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def check_scale(scale, dtype=None):
    """``scale``: None or a finite number; with the activations' ``dtype``, also finite in the dtype
    the computation runs in (float32 for float32, bfloat16 and float16 inputs: a Python float such as
    1e39 passes as finite and becomes inf there)."""
    if scale is None:
        return
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not (scale == scale) or scale in (float("inf"), float("-inf")):
        raise ValueError(f"scale must be finite, got {scale}")
    if dtype is not None and dtype != torch.float64 and abs(scale) > torch.finfo(torch.float32).max:
        raise ValueError(f"scale = {scale} is not finite in float32, the dtype {dtype} inputs compute in "
                         f"(|scale| ≤ {torch.finfo(torch.float32).max:.4g})")


CHUNK = 64  # the kernels' chunk: they keep one state per chunk (CONTRACT conventions)


def gdn2_sizes(B, T, H, K, V):
    """The largest tensors of a GDN-2 call: activations and output, and the per-chunk states."""
    return (("q [B, T, H, K]", (B, T, H, K)), ("v [B, T, H, V]", (B, T, H, V)),
            ("the per-chunk states [B, ceil(T/64), H, K, V]", (B, -(-T // CHUNK), H, K, V)))


def check_gdn2_inputs(q, k, v, g, b, w, scale=None, initial_state=None, dtypes=FLOAT_DTYPES, cu_seqlens=None):
    """CONTRACT section 1 shapes: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``;
    ``initial_state`` ``[B, H, K, V]`` (``[N, H, K, V]`` with ``cu_seqlens``, ``check_cu_seqlens``).
    Returns ``(B, T, H, K, V)``."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w)):
        check_tensor(name, x, ndim=4)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("q must hold at least one token, got T = 0")
    for name, x in (("k", k), ("g", g), ("b", b)):
        check_shape(name, x, (B, T, H, K), "[B, T, H, K]")
    check_shape("v", v, (B, T, H, V), "[B, T, H, V]")
    check_shape("w", w, (B, T, H, V), "[B, T, H, V]")
    check_same_dtype((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w)))
    check_dtype("q", q, dtypes)
    check_sizes(gdn2_sizes(B, T, H, K, V))
    check_same_device((("q", q), ("k", k), ("v", v), ("g", g), ("b", b), ("w", w),
                       ("initial_state", initial_state)))
    check_scale(scale, q.dtype)
    N = B
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T, q.device)
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ndim=4)
        if cu_seqlens is not None:
            check_state_count("initial_state", initial_state, N, "[N, H, K, V]")
        check_shape("initial_state", initial_state, (N, H, K, V), "[B, H, K, V]" if cu_seqlens is None
                    else "[N, H, K, V]")
        check_state_dtype("initial_state", initial_state, q.dtype)
    return B, T, H, K, V


# --- packed variable-length batches (CONTRACT "Variable-length batches") ----------------------------

CU_SEQLENS_DTYPES = (torch.int32, torch.int64)


def check_cu_seqlens(cu_seqlens, B: int, T: int, device) -> list[int]:
    """fla's packed layout: ``cu_seqlens = [0, T_1, T_1 + T_2, …, T]``, a 1-D int32 or int64 tensor
    on the activations' ``device`` (the NumPy twins pass a NumPy or torch integer array and the
    activations' device), strictly increasing (every sequence holds at least one token), with the
    activations packed in one row (``B = 1``). Returns the boundaries as a Python list (one host
    sync); ``len(...) - 1`` is the number of sequences N."""
    if isinstance(cu_seqlens, np.ndarray):
        if cu_seqlens.dtype not in (np.int32, np.int64):
            raise ValueError(f"cu_seqlens must have dtype int32 or int64, got NumPy {cu_seqlens.dtype}")
        cu_seqlens = torch.from_numpy(np.ascontiguousarray(cu_seqlens)).to(device)
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor of int32 or int64 or None, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in CU_SEQLENS_DTYPES:
        raise ValueError(f"cu_seqlens must have dtype torch.int32 or torch.int64, got {cu_seqlens.dtype}")
    if cu_seqlens.device != torch.device(device):
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but the activations are on {device}; "
                         "cu_seqlens must be on the tensors' device")
    if cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1], got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold at least 2 entries [0, T] (one sequence), got {cu_seqlens.shape[0]}")
    if B != 1:
        raise ValueError(f"cu_seqlens packs the sequences along T in one row: the activations must have B = 1, "
                         f"got B = {B}")
    bounds = [int(x) for x in cu_seqlens.tolist()]
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {bounds[0]}")
    if bounds[-1] != T:
        raise ValueError(f"cu_seqlens must end at T = {T} (the packed length), got {bounds[-1]}")
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        if e <= s:
            raise ValueError(f"cu_seqlens must be strictly increasing (every sequence holds at least one token): "
                             f"sequence {i} has cu_seqlens[{i}] = {s}, cu_seqlens[{i + 1}] = {e}")
    return bounds


def check_state_count(name: str, state, N: int, layout: str):
    """A per-sequence initial state of a packed call: leading size ``N`` (the sequences in
    ``cu_seqlens``), named with its ``layout`` (e.g. ``"[N, H, K, V]"``)."""
    if state is not None and isinstance(state, torch.Tensor) and state.dim() >= 1 and state.shape[0] != N:
        raise ValueError(f"{name} must have shape {layout} with one state per sequence, N = {N} (cu_seqlens "
                         f"holds {N + 1} entries), got {tuple(state.shape)}")


def sequences(cu_seqlens) -> list[tuple[int, int, int]]:
    """``(i, start, end)`` of each packed sequence of a checked ``cu_seqlens`` (tensor or array)."""
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [(i, s, e) for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:]))]
