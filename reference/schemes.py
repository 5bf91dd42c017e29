"""Promotion schemes: docs/CONTRACT.md section 2, in plain PyTorch, behind a registry.

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

``register_scheme`` returns the probe wrapped in the input and output checks (CONTRACT
"Errors": outputs of the shapes above, errors naming the scheme; a taken name needs
``replace=True``), and ``get_scheme(name).probe`` is that checked probe. ``ngdn scheme
check FILE.py`` runs the property battery on a new scheme (``ngdn/scheme_check.py``).
Registered here: ``learned`` and ``merge`` (CONTRACT section 2) and ``bounded_erase``
(``learned``'s addresses with an erase that cannot expand the state; proof in its docstring).

A scheme's query count ``n`` is read from its declared parameter shapes, never from a
parameter's name: ``register_scheme`` calls ``parameter_shapes`` at a few ``n`` and records
which axes have size ``n`` (``Scheme.query_axes``; ``learned``: axis 1 of ``Q``, whatever the
parameter is called). A scheme whose shapes do not depend on ``n`` (``merge``) has the ``n``
its probe returns (``merge``: ``K``); one whose shapes depend on ``n`` without an axis of size
``n`` is refused, since no tool could tell its ``n``. ``n ≤ K`` is required.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, NamedTuple

import torch
import torch.nn.functional as F

from reference.validation import FLOAT_DTYPES, check_finite, check_tensor

REDUCTIONS = ("mean", "sum")


def l2norm(x):
    """``x / sqrt(sum(x**2) + 1e-6)`` over the last axis (CONTRACT conventions)."""
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
    """A registered scheme, resolved once at registration: ``probe(M_below, params,
    reduction="mean")`` (inputs and outputs checked), ``parameter_shapes(H, K, V, n) ->
    {name: shape}``, and ``query_axes``: the ``(parameter, axis)`` pairs whose size is the
    query count ``n`` (empty: ``n`` does not depend on the parameters and is the number of
    pairs the probe returns, e.g. ``merge``'s ``K``)."""
    name: str
    probe: Callable
    parameter_shapes: Callable[[int, int, int, int], dict]
    query_axes: tuple = ()

    @property
    def has_query_bank(self) -> bool:
        """Whether the parameters choose ``n`` (``make_levels``' ``query_counts`` apply)."""
        return bool(self.query_axes)

    def bank_size(self, params) -> int | None:
        """``n`` as the parameters hold it (the first query axis), or ``None`` when the scheme
        has no query axis or ``params`` lacks that tensor (the key check reports it)."""
        if not self.query_axes or not isinstance(params, Mapping):
            return None
        key, axis = self.query_axes[0]
        p = params.get(key)
        if not isinstance(p, torch.Tensor) or p.dim() <= axis:
            return None
        return p.shape[axis]

    def query_count(self, params, H: int, K: int, V: int) -> int:
        """The query count ``n`` of this scheme for these parameters and sizes: read from the
        query axis, or (a scheme without one) the pair count its probe returns on a zero
        ``[H, K, V]`` snapshot of the parameters' dtype and device."""
        n = self.bank_size(params)
        if n is not None:
            return n
        first = next((p for p in params.values() if isinstance(p, torch.Tensor)), None) \
            if isinstance(params, Mapping) else None
        zeros = torch.zeros(H, K, V, dtype=first.dtype if first is not None else torch.float64,
                            device=first.device if first is not None else "cpu")
        return self.probe(zeros, params)[0].shape[-2]


SCHEMES: dict[str, Scheme] = {}

# Sizes at which ``register_scheme`` calls ``parameter_shapes`` to find the axes of size n: distinct
# from each other and from every trial n, so that an axis equal to n at every trial is the query axis.
_TRIAL_SIZES = dict(H=3, K=16, V=12)
_TRIAL_NS = (1, 2, 5)


def resolve_query_axes(name: str, parameter_shapes: Callable) -> tuple:
    """The ``(parameter, axis)`` pairs whose declared size is ``n`` (CONTRACT section 2: tools read
    ``n`` from the parameter shapes or the probe's outputs, not from a name). ``parameter_shapes``
    is called at ``H, K, V = 3, 16, 12`` and ``n = 1, 2, 5``; it must return ``{name: shape}``
    with the same names for every ``n``. A shape that changes with ``n`` on an axis whose size
    is not ``n`` (``(H, n + 1, K)``, ``(H, 2 * n)``) is refused: ``n`` could not be read back."""
    H, K, V = _TRIAL_SIZES["H"], _TRIAL_SIZES["K"], _TRIAL_SIZES["V"]
    declared = {}
    for n in _TRIAL_NS:
        try:
            shapes = parameter_shapes(H, K, V, n)
        except Exception as e:  # noqa: BLE001 (the author's function: report what it raised)
            raise ValueError(f"scheme {name!r}: parameter_shapes({H}, {K}, {V}, {n}) raised "
                             f"{type(e).__name__}: {e}; it must accept any H, K, V ≥ 1 and 1 ≤ n ≤ K") from None
        if not isinstance(shapes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, (tuple, list)) and all(isinstance(d, int) for d in v)
                for k, v in shapes.items()):
            raise TypeError(f"scheme {name!r}: parameter_shapes(H, K, V, n) must return a dict "
                            f"{{name: shape tuple of ints}}, got {shapes!r}")
        declared[n] = {k: tuple(v) for k, v in shapes.items()}
    first = declared[_TRIAL_NS[0]]
    axes = []
    for n, shapes in declared.items():
        if set(shapes) != set(first) or any(len(shapes[k]) != len(first[k]) for k in first):
            raise ValueError(f"scheme {name!r}: parameter_shapes must declare the same parameters, each "
                             f"with the same number of axes, for every n; got {first} at n = {_TRIAL_NS[0]} "
                             f"and {shapes} at n = {n}")
    for key in first:
        for axis in range(len(first[key])):
            sizes = [declared[n][key][axis] for n in _TRIAL_NS]
            if sizes == list(_TRIAL_NS):
                axes.append((key, axis))
            elif len(set(sizes)) > 1:
                raise ValueError(
                    f"scheme {name!r}: cannot determine the query count n from the parameter shapes: "
                    f"axis {axis} of {key!r} depends on n without being of size n (sizes {sizes} at "
                    f"n = {list(_TRIAL_NS)}, H, K, V = {H}, {K}, {V}); declare the query bank with an "
                    f"axis of size n (e.g. (H, n, K)) so that n can be read back from the parameters")
    return tuple(axes)


def register_scheme(name: str, probe: Callable, parameter_shapes: Callable, replace: bool = False) -> Callable:
    """Register ``probe`` under ``name``; returns the probe wrapped in input and output checks.

    A name already registered (the built-ins included) is refused unless ``replace=True``; a
    ``probe`` or ``parameter_shapes`` that is not callable is refused at once, and so is a
    ``parameter_shapes`` from which the query count ``n`` cannot be read back
    (``resolve_query_axes``). Every call of the returned probe checks its inputs
    (``check_probe_inputs``) and its outputs against the shapes of CONTRACT section 2
    (``check_probe_outputs``); errors name the scheme.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"scheme name must be a non-empty str, got {name!r}")
    for what, fn in (("probe", probe), ("parameter_shapes", parameter_shapes)):
        if not callable(fn):
            raise TypeError(f"scheme {name!r}: {what} must be callable, got {type(fn).__name__}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be a bool, got {type(replace).__name__}")
    if name in SCHEMES and not replace:
        raise ValueError(f"scheme {name!r} is already registered; pass replace=True to replace it "
                         f"(registered schemes: {sorted(SCHEMES)})")
    query_axes = resolve_query_axes(name, parameter_shapes)

    @functools.wraps(probe)
    def checked_probe(M_below, params, reduction="mean"):
        check_probe_inputs(name, M_below, params, reduction)
        outputs = probe(M_below, params, reduction)
        check_probe_outputs(name, M_below, params, outputs)
        return outputs

    SCHEMES[name] = Scheme(name, checked_probe, parameter_shapes, query_axes)
    return checked_probe


def get_scheme(name: str) -> Scheme:
    """The registered scheme ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"scheme must be a str naming a registered scheme, got {type(name).__name__}")
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; registered schemes: {sorted(SCHEMES)}")
    return SCHEMES[name]


def check_reduction(reduction, name="reduction"):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name} must be one of {list(REDUCTIONS)}, got {reduction!r}")


def check_scheme_params(scheme: str, params, H: int, K: int, V: int, name: str = "params",
                        finite: bool = False) -> int | None:
    """``params`` holds exactly the scheme's parameters, each of the registered shape for
    ``(H, K, V, n)``, with ``n ≤ K`` read from the scheme's query axis. ``finite`` also checks for
    nan/inf (a device sync: done once per call by ``validate_nested_inputs``, not per firing).
    Returns ``n`` (``None`` for a scheme without a query axis: its probe's outputs fix ``n``)."""
    resolved = get_scheme(scheme)
    if not isinstance(params, Mapping):
        raise TypeError(f"{name} must be a dict of tensors, got {type(params).__name__}")
    n = resolved.bank_size(params)
    if n is not None:
        key, axis = resolved.query_axes[0]
        where = f"{name}[{key!r}]" + (f" (axis {axis})" if axis != 1 else "")
        if n < 1:
            raise ValueError(f"{where} must hold at least one query, got n = {n}")
        if n > K:
            raise ValueError(f"{where} holds n = {n} queries but K = {K}: a query bank larger than K "
                             f"is not allowed (n ≤ K; a K×V state has at most K independent addresses)")
    expected = resolved.parameter_shapes(H, K, V, K if n is None else n)
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    if missing or extra:
        raise ValueError(f"{name} for scheme {scheme!r} must have keys {sorted(expected)}; "
                         f"missing {missing}, unexpected {extra}")
    sizes = f"H={H}, K={K}, V={V}" + (f", n={n}" if n is not None else "")
    for key, shape in expected.items():
        check_tensor(f"{name}[{key!r}]", params[key], dtypes=FLOAT_DTYPES)
        if tuple(params[key].shape) != tuple(shape):
            raise ValueError(f"{name}[{key!r}] for scheme {scheme!r} must have shape {tuple(shape)} "
                             f"({sizes}), got {tuple(params[key].shape)}")
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


PROBE_OUTPUTS = ("κ", "ν", "β", "ω", "γ")


def check_probe_outputs(scheme: str, M_below, params, outputs):
    """A probe's outputs (CONTRACT section 2): five tensors of ``M_below``'s dtype and device,
    ``κ [..., H, n, K], ν [..., H, n, V], β [..., H, n, K], ω [..., H, n, V], γ [..., H, K]``
    with ``M_below``'s leading dims; ``n`` is the parameters' query count, or (a scheme
    without a query axis) the pairs ``κ`` holds, with ``1 ≤ n ≤ K``. Errors name the scheme."""
    where = f"scheme {scheme!r}: probe"
    if not isinstance(outputs, (tuple, list)) or len(outputs) != 5:
        got = f"a {type(outputs).__name__} of {len(outputs)}" if isinstance(outputs, (tuple, list)) else \
            type(outputs).__name__
        raise ValueError(f"{where} must return 5 tensors (κ, ν, β, ω, γ), got {got}")
    *lead, H, K, V = M_below.shape
    lead = tuple(lead)
    n = get_scheme(scheme).bank_size(params)
    if n is None:                       # no query axis: n is what the probe returns
        κ = outputs[0]
        if isinstance(κ, torch.Tensor) and κ.dim() >= 2:
            n = κ.shape[-2]
            if not 1 <= n <= K:
                raise ValueError(f"{where} returned n = {n} pairs (κ {tuple(κ.shape)}) but K = {K}: "
                                 f"1 ≤ n ≤ K is required (a K×V state has at most K independent addresses)")
    expected = {"κ": (lead + (H, n, K), "[..., H, n, K]"), "ν": (lead + (H, n, V), "[..., H, n, V]"),
                "β": (lead + (H, n, K), "[..., H, n, K]"), "ω": (lead + (H, n, V), "[..., H, n, V]"),
                "γ": (lead + (H, K), "[..., H, K]")}
    for label, x in zip(PROBE_OUTPUTS, outputs):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{where} output {label} must be a torch.Tensor, got {type(x).__name__}")
        shape, layout = expected[label]
        if tuple(x.shape) != shape:
            raise ValueError(f"{where} output {label} must have shape {layout} = {shape} (n = {n}), "
                             f"got {tuple(x.shape)}")
        if x.dtype != M_below.dtype:
            raise ValueError(f"{where} output {label} has dtype {x.dtype} but M_below has {M_below.dtype}")
        if x.device != M_below.device:
            raise ValueError(f"{where} output {label} is on {x.device} but M_below is on {M_below.device}")


# --- the two schemes of CONTRACT section 2 ----------------------------------------------

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


# --- a stable scheme: learned addresses, erase bounded along overlapping keys -----------

def bounded_erase_parameter_shapes(H, K, V, n):
    return learned_parameter_shapes(H, K, V, n)


def overlap(κ):
    """``r_i = Σ_j |κ_i · κ_j|`` over the pairs of a firing: row i's absolute row sum of the
    keys' Gram matrix ``G = κ κ^T`` (``κ [..., n, K]`` -> ``r [..., n, 1]``)."""
    return (κ @ κ.transpose(-1, -2)).abs().sum(-1, keepdim=True)


def bounded_erase(M_below, params, reduction="mean"):
    """``bounded_erase``: ``learned``'s addresses with an erase that can never expand the state.

    Parameters, ``ν``, ``κ``, ``ω`` and ``γ`` exactly as in ``learned``; the erase gate is one
    number per pair, divided by how much that pair's key overlaps the others::

        ν = Q M_below,  κ = l2norm(ν W_K),  ω = σ(ν W_ω),  γ = mean_i(-softplus(ν W_γ)_i)
        b_i = mean_k σ(ν W_β)_ik                    # channel-uniform erase, in (0, 1)
        r_i = Σ_j |κ_i · κ_j|                       # row i of |G|, G = κ κ^T (Gershgorin)
        β_i = b_i / max(1, r_i) · 1_K               # erase gate [n, K]

    Claim: for any snapshot and any parameters, ``‖M_new − κ^T (ω ⊙ ν)‖_F ≤ ‖M‖_F``; hence a
    firing grows the state by at most its write, ``‖M_new‖_F ≤ ‖M‖_F + ‖κ^T (ω ⊙ ν)‖_F``, and
    after k firings ``‖M_k‖_F ≤ ‖M_0‖_F + Σ_j ‖write_j‖_F`` (growth factor ≤ 1).

    Proof. With channel-uniform β the erase is ``κ^T (β ⊙ κ) = κ^T C κ =: E``, ``C = diag(c)``,
    ``c_i = b_i / max(1, r_i) ∈ [0, 1)``. E is symmetric positive semi-definite, and its
    non-zero eigenvalues are those of ``C^½ G C^½``, which is similar to ``C G``. Every
    eigenvalue of ``C G`` is at most its ∞-norm: ``max_i c_i Σ_j |G_ij| = max_i c_i r_i ≤
    max_i b_i < 1`` (if ``r_i ≥ 1``, ``c_i r_i = b_i``; otherwise ``c_i r_i < b_i``). So
    ``I − E`` is symmetric with eigenvalues in ``(0, 1]`` and ``‖(I − E) X‖_F ≤ ‖X‖_F``;
    ``γ ≤ 0`` gives ``‖diag(e^γ) M‖_F ≤ ‖M‖_F``; and ``M_new − κ^T(ω ⊙ ν) = (I − E) diag(e^γ) M``. ∎

    What it costs: nothing when the keys of a firing are orthonormal (``r_i = 1``: β_i = b_i,
    the full erase); with n equal keys each β_i is divided by n, so the erase along that key
    is ``Σ_i b_i / n ≤ 1`` instead of ``learned``'s ``Σ_i β_i`` (up to n; CONTRACT 2 "Hazard").
    The erase is channel-uniform per pair (a per-channel ``β ⊙ κ`` makes E non-symmetric,
    and ``I − E`` can then have a singular value above 1 even for one pair). ``r_i`` uses
    ``|·|`` and ``max``, which have kinks only where a Gram entry is exactly 0 or r_i = 1.
    """
    ν = params["Q"] @ M_below                                  # ν = Q M_below      as in learned
    κ = l2norm(ν @ params["W_K"])                              # κ = l2norm(ν W_K)  learned addresses
    β_channels, ω, γ_i = gates(ν, params)
    b = β_channels.mean(-1, keepdim=True)                      # b_i = mean_k σ(ν W_β)_ik
    β = (b / overlap(κ).clamp(min=1.0)).expand_as(κ)           # β_i = b_i / max(1, r_i)
    γ = reduce_log_decay(γ_i, reduction)
    return κ, ν, β, ω, γ


learned = register_scheme("learned", learned, learned_parameter_shapes)
merge = register_scheme("merge", merge, merge_parameter_shapes)
bounded_erase = register_scheme("bounded_erase", bounded_erase, bounded_erase_parameter_shapes)

# The built-ins as registered here: code that has a faster path or a NumPy twin for a built-in
# (chosen by its name) asks ``is_builtin`` first, so a scheme registered over a built-in's name
# with ``replace=True`` runs its own probe everywhere.
BUILTIN_SCHEMES: dict[str, Scheme] = {name: SCHEMES[name] for name in ("learned", "merge", "bounded_erase")}


def is_builtin(name) -> bool:
    """Whether ``name`` is registered as this module's built-in scheme of that name (not replaced)."""
    return isinstance(name, str) and name in BUILTIN_SCHEMES and SCHEMES.get(name) is BUILTIN_SCHEMES[name]
