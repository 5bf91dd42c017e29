"""Promotion schemes: SPEC.md section 2, in plain PyTorch, behind a registry.

A scheme maps one snapshot ``M_below`` of the level below to ``n`` pairs and one
decay vector:

    probe(M_below, params) -> keys κ [n, K], values ν [n, V],
                              erase β [n, K], write ω [n, V], log-decay γ [K]

Here every probe takes ``M_below [..., H, K, V]`` (any leading batch dims before
the head axis: the per-firing reference passes ``[B, H, K, V]``, a batched path
``[B, F, H, K, V]``) and per-head parameters with leading dim ``H``, and returns

    κ [..., H, n, K], ν [..., H, n, V], β [..., H, n, K], ω [..., H, n, V], γ [..., H, K]

Adding a scheme is one function plus one registration::

    def my_parameter_shapes(H, K, V, n):
        return {"W_beta": (H, V, K), ...}

    def my_scheme(M_below, params, reduction="mean"):
        ...
        return κ, ν, β, ω, γ

    register_scheme("mine", my_scheme, my_parameter_shapes)

``register_scheme`` returns the probe wrapped in the input checks (SPEC "Errors"),
and ``get_scheme(name).probe`` is that checked probe. A scheme's query count ``n``
is the number of rows of its parameter ``Q`` (``[H, n, K]``), or ``K`` when it has
no ``Q`` (``merge``); ``n ≤ K`` is required.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, NamedTuple

import torch
import torch.nn.functional as F

from reference.validation import FLOAT_DTYPES, check_finite, check_tensor

REDUCTIONS = ("mean", "sum")


def l2norm(x):
    """``x / sqrt(sum(x**2) + 1e-6)`` over the last axis (SPEC conventions)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gates(ν, params):
    """Erase, write and per-pair log-decay gates read from the values ``ν [..., H, n, V]``:

        β = σ(ν W_β)      ω = σ(ν W_ω)      γ_i = -softplus(ν W_γ)_i

    Returns ``(β [..., H, n, K], ω [..., H, n, V], γ_i [..., H, n, K])``; the firing's
    decay is ``reduce_log_decay(γ_i, reduction)``. Shared by every scheme
    ("both arms gate identically").
    """
    β = torch.sigmoid(ν @ params["W_beta"])
    ω = torch.sigmoid(ν @ params["W_omega"])
    γ_i = -F.softplus(ν @ params["W_gamma"])
    return β, ω, γ_i


def reduce_log_decay(γ_i, reduction="mean"):
    """One decay per firing: ``γ = mean_i γ_i`` (default) or ``Σ_i γ_i`` over the pair axis (-2)."""
    return γ_i.mean(-2) if reduction == "mean" else γ_i.sum(-2)


# --- the registry -------------------------------------------------------------------

class Scheme(NamedTuple):
    """A registered scheme: ``probe(M_below, params, reduction="mean")`` (inputs checked)
    and ``parameter_shapes(H, K, V, n) -> {name: shape}``."""
    name: str
    probe: Callable
    parameter_shapes: Callable[[int, int, int, int], dict]


SCHEMES: dict[str, Scheme] = {}


def register_scheme(name: str, probe: Callable, parameter_shapes: Callable) -> Callable:
    """Register ``probe`` under ``name``; returns the probe wrapped in input checks."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"scheme name must be a non-empty str, got {name!r}")

    @functools.wraps(probe)
    def checked_probe(M_below, params, reduction="mean"):
        check_probe_inputs(name, M_below, params, reduction)
        return probe(M_below, params, reduction)

    SCHEMES[name] = Scheme(name, checked_probe, parameter_shapes)
    return checked_probe


def get_scheme(name: str) -> Scheme:
    """The registered scheme ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"scheme must be a str naming a registered scheme, got {type(name).__name__}")
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; registered schemes: {sorted(SCHEMES)}")
    return SCHEMES[name]


def query_count(params: Mapping, K: int) -> int:
    """``n``: the rows of ``params["Q"]`` (``[H, n, K]``), or ``K`` for a scheme without a query bank."""
    Q = params.get("Q") if isinstance(params, Mapping) else None
    if isinstance(Q, torch.Tensor) and Q.dim() >= 2:
        return Q.shape[-2]
    return K


def check_reduction(reduction, name="reduction"):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name} must be one of {list(REDUCTIONS)}, got {reduction!r}")


def check_scheme_params(scheme: str, params, H: int, K: int, V: int, name: str = "params",
                        finite: bool = False) -> int:
    """``params`` holds exactly the scheme's parameters, each of the registered shape for
    ``(H, K, V, n)``, with ``n ≤ K``. ``finite`` also checks for nan/inf (a device sync:
    done once per call by ``validate_nested_inputs``, not per firing). Returns ``n``."""
    shapes_of = get_scheme(scheme).parameter_shapes
    if not isinstance(params, Mapping):
        raise TypeError(f"{name} must be a dict of tensors, got {type(params).__name__}")
    n = query_count(params, K)
    if n < 1:
        raise ValueError(f"{name}['Q'] must hold at least one query, got n = {n}")
    if n > K:
        raise ValueError(f"{name}['Q'] holds n = {n} queries but K = {K}: a query bank larger than K "
                         f"is not allowed (n ≤ K; a K×V state has at most K independent addresses)")
    expected = shapes_of(H, K, V, n)
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise ValueError(f"{name} for scheme {scheme!r} must have keys {sorted(expected)}; "
                         f"missing {missing}, unexpected {extra}")
    for key, shape in expected.items():
        check_tensor(f"{name}[{key!r}]", params[key], dtypes=FLOAT_DTYPES)
        if tuple(params[key].shape) != tuple(shape):
            raise ValueError(f"{name}[{key!r}] for scheme {scheme!r} must have shape {tuple(shape)} "
                             f"(H={H}, K={K}, V={V}, n={n}), got {tuple(params[key].shape)}")
        if finite:
            check_finite(f"{name}[{key!r}]", params[key])
    return n


def check_probe_inputs(scheme: str, M_below, params, reduction):
    """A probe's inputs: ``M_below [..., H, K, V]``; params of the scheme's shapes, on
    ``M_below``'s device and of its dtype; ``n ≤ K``; a known reduction."""
    check_tensor("M_below", M_below, dtypes=FLOAT_DTYPES)
    if M_below.dim() < 3:
        raise ValueError(f"M_below must have shape [..., H, K, V], got {tuple(M_below.shape)}")
    H, K, V = M_below.shape[-3:]
    check_scheme_params(scheme, params, H, K, V)
    for key, p in params.items():
        if p.dtype != M_below.dtype:
            raise ValueError(f"params[{key!r}] has dtype {p.dtype} but M_below has {M_below.dtype}; "
                             "cast the parameters to the state's dtype")
        if p.device != M_below.device:
            raise ValueError(f"params[{key!r}] is on {p.device} but M_below is on {M_below.device}; "
                             "all tensors must be on one device")
    check_reduction(reduction)


# --- the two schemes of SPEC section 2 ----------------------------------------------

def learned_parameter_shapes(H, K, V, n):
    return {"Q": (H, n, K), "W_K": (H, V, K), "W_beta": (H, V, K), "W_omega": (H, V, V),
            "W_gamma": (H, V, K)}


def learned(M_below, params, reduction="mean"):
    """``learned``: a query bank ``Q`` retrieves ``n`` values; each value picks its address."""
    ν = params["Q"] @ M_below                  # ν = Q M_below          retrieve n values [n, V]
    κ = l2norm(ν @ params["W_K"])              # κ = l2norm(ν W_K)      each value picks its address
    β, ω, γ_i = gates(ν, params)               # β = σ(ν W_β), ω = σ(ν W_ω), γ_i = -softplus(ν W_γ)_i
    γ = reduce_log_decay(γ_i, reduction)       # γ = mean_i γ_i         one decay per firing (option: sum)
    return κ, ν, β, ω, γ


def merge_parameter_shapes(H, K, V, n):
    return {"W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}


def merge(M_below, params, reduction="mean"):
    """``merge``: carries the level below up whole at identity addresses (``n = K``, ``Q = I``)."""
    K = M_below.shape[-2]
    ν = M_below                                                            # ν = I M_below
    κ = torch.eye(K, dtype=M_below.dtype, device=M_below.device).expand(*M_below.shape[:-1], K)  # κ = I
    β, ω, γ_i = gates(ν, params)                                           # exactly as in learned
    γ = reduce_log_decay(γ_i, reduction)
    return κ, ν, β, ω, γ


learned = register_scheme("learned", learned, learned_parameter_shapes)
merge = register_scheme("merge", merge, merge_parameter_shapes)
