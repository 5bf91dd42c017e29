"""The one loader of ``tolerances.yaml`` (repo root, or ``$NGDN_TOLERANCES``).

Layout: ``component -> mode -> dtype -> quantity -> relative error``, where a
relative error is ``‖opt − ref‖ / ‖ref‖`` against a float64 reference and mode is
``cpu-interpret``, ``cuda`` or ``any`` (comparisons that run no kernel).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
import yaml

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "tolerances.yaml"


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def table() -> dict:
    return _load(os.environ.get("NGDN_TOLERANCES", str(DEFAULT_PATH)))


def _dtype_key(dtype) -> str:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else str(dtype)


def is_bound(value) -> bool:
    """Whether a table entry is usable as a bound: a positive, finite number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def tolerance(component: str, quantity: str, dtype, mode: str | None = None) -> float:
    """Relative-error bound for ``component``/``quantity`` at ``dtype`` in ``mode``.

    ``mode`` defaults to the current device mode; an ``any`` entry is used when
    the component has no entry for that mode.
    """
    if mode is None:
        from optimized import triton_mode

        mode = triton_mode.configure()
    entries = table()
    if component not in entries:
        raise KeyError(f"tolerances.yaml has no component {component!r}; have {sorted(entries)}")
    modes = entries[component]
    mode_key = mode if mode in modes else "any"
    if mode_key not in modes:
        raise KeyError(f"tolerances.yaml: {component} has no mode {mode!r} (nor 'any'); have {sorted(modes)}")
    dtypes = modes[mode_key]
    key = _dtype_key(dtype)
    if key not in dtypes:
        raise KeyError(f"tolerances.yaml: {component}.{mode_key} has no dtype {key!r}; have {sorted(dtypes)}")
    quantities = dtypes[key]
    if quantity not in quantities:
        raise KeyError(f"tolerances.yaml: {component}.{mode_key}.{key} has no quantity {quantity!r}; "
                       f"have {sorted(quantities)}")
    bound = quantities[quantity]
    if not is_bound(bound):
        # YAML reads `1.0e-05# note` (no space before '#') as the string "1.0e-05# note".
        raise ValueError(f"tolerances.yaml: {component}.{mode_key}.{key}.{quantity} must be a positive number, "
                         f"got {bound!r} (a comment needs a space before '#')")
    return float(bound)


def relative_error(actual, expected) -> float:
    """``‖actual − expected‖ / ‖expected‖`` in float64 (absolute error where ‖expected‖ = 0)."""
    actual = torch.as_tensor(actual).detach().to("cpu", torch.float64)
    expected = torch.as_tensor(expected).detach().to("cpu", torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if not bool(torch.isfinite(actual).all()):
        return float("inf")
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def record(component: str, mode: str, dtype, quantity: str, error: float, bound: float) -> None:
    """Append one observation to ``$NGDN_ERROR_LOG`` (JSON lines), if set.

    ``ngdn errors FILE`` summarises the worst case per tolerance entry.
    """
    path = os.environ.get("NGDN_ERROR_LOG")
    if not path:
        return
    line = json.dumps({"component": component, "mode": mode, "dtype": _dtype_key(dtype),
                       "quantity": quantity, "error": error, "tolerance": bound})
    with open(path, "a") as f:
        f.write(line + "\n")


def compare(component: str, dtype, pairs: dict, mode: str | None = None, log: bool = True) -> dict:
    """Relative errors and bounds for ``{quantity: (actual, expected)}``.

    Returns ``{quantity: (error, bound)}`` and records each observation unless
    ``log`` is false (mutation checks, which are meant to fail).
    """
    if mode is None:
        from optimized import triton_mode

        mode = triton_mode.configure()
    out = {}
    for quantity, (actual, expected) in pairs.items():
        bound = tolerance(component, quantity, dtype, mode)
        error = relative_error(actual, expected)
        if log:
            record(component, mode, dtype, quantity, error, bound)
        out[quantity] = (error, bound)
    return out


def failures(errors: dict) -> dict:
    """The quantities of ``compare``'s result whose error exceeds the bound (NaN fails)."""
    return {q: eb for q, eb in errors.items() if not eb[0] <= eb[1]}


def assert_passes(errors: dict) -> None:
    """Fail with every quantity of ``compare``'s result that is over its bound."""
    bad = failures(errors)
    assert not bad, {q: f"rel. error {e:.3e} > tolerance {b:.1e}" for q, (e, b) in bad.items()}


def assert_within(component: str, dtype, pairs: dict, mode: str | None = None) -> dict:
    """``compare`` and raise ``AssertionError`` listing every quantity over its bound."""
    errors = compare(component, dtype, pairs, mode)
    bad = failures(errors)
    if bad:
        lines = [f"  {q}: rel. error {e:.3e} > tolerance {b:.1e}" for q, (e, b) in bad.items()]
        raise AssertionError(f"{component} ({_dtype_key(dtype)}) out of tolerance:\n" + "\n".join(lines))
    return errors
