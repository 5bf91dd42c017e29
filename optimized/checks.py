"""Input checks of the optimized entry points beyond the references' (docs/CONTRACT.md, "Errors").

The shapes, dtypes and devices are checked by the references' validators
(``reference.validation`` and friends, one validation for both paths); these are
the checks only the kernels need, run in this order after them:

1. ``check_kernel_device``: CUDA tensors in ``cuda`` mode, CPU tensors under the
   interpreter.
2. ``check_kernel_dtype``: one rule for every optimized op: float32 or bfloat16
   inputs (float16 is accepted by none: no kernel is tested in it), and bfloat16
   only in ``cuda`` mode. Under the Triton interpreter (``cpu-interpret``) bfloat16
   dots come back as garbage (measured: outputs around 1e9-1e10 where the reference
   gives about 1), so it is refused, never computed wrongly.
3. ``check_finite_activations``: fla's chunk kernels mix every token of a 64-token
   chunk (cumulative decays, triangular solves), so one NaN or inf at token t
   poisons the outputs at earlier tokens of its chunk, and ``g = -inf`` (a full
   forget) makes every output NaN (``exp(-G)`` of the cumulative decay overflows).
   CONTRACT lets an op raise instead: one fused device reduction (a single host sync)
   over the activations; only on failure the first bad (batch, token) is looked up.
   ``g = -inf`` is refused too: clamping it to a finite log-decay whose ``exp``
   underflows to 0 (``g >= -110``) keeps every output finite, but the cancellation
   in fla's in-chunk cumulative sums then costs 3e-6 … 1e-5 relative error in
   float32 (measured, T = 100, K = V = 16, 1-4 forgetting tokens) against 2.3e-7
   without it, not the reference's answer to the usual margin. The references
   compute ``g = -inf`` exactly (``exp(-inf) = 0``): use them, or a finite gate,
   or split the sequence at the forgetting token (a fresh state).

   A finite ``g`` below ``G_FLOOR`` (≈ -745, where ``exp(g)`` is 0 even in float64: a full
   forget, as ``-inf``) is refused with the same hint, in the same reduction. fla's chunk
   kernels sum log-decays in float32 within a chunk, so a very negative ``g`` costs the chunk's
   later tokens accuracy in proportion to ``|g|``: measured (``chunk_gdn2``, float32, T = 130,
   K = V = 32, one such token) 9e-7 relative error at ``g = -20``, 3.7e-6 at -100, 2.9e-5 at
   -1000, 3.9e-4 at -1e4 and 1.0 at -1e30 (the output lost), against 2.3e-7 without it
   (``results/2026-12-05-very-negative-g-cpu/``). In float32 every ``g ≤ -104`` is already a full
   forget (``exp`` underflows), so ``g.clamp(min=-100)`` keeps the meaning and the accuracy;
   ``-1e30`` as a stand-in for ``-inf`` would not.

   The reduction also covers the scheme parameters where the op has them (the
   references' validators check those with a sync of their own; the optimized ops fold
   them into this one). ``NGDN_CHECK_FINITE=0`` in the environment, or
   ``with optimized.checks.finite_checks(False):``, skips the check and its host sync (for
   production loops and benchmarks whose inputs are known finite); the ops are then
   undefined on non-finite input (NaN may reach earlier tokens of its chunk, as above).
   Under ``torch.compile`` the check is skipped too (``optimized.compile``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable

import torch

from optimized import triton_mode

KERNEL_DTYPES = (torch.bfloat16, torch.float32)

# The most negative log-decay the ops take: below it exp(g) is 0 even in float64 (a full forget,
# refused as g = -inf is; see the module docstring).
G_FLOOR = -745.0
FORGET_HINT = (" (g = -inf, a full forget, is computed by the references only: fla's chunk kernels turn "
               "it into NaN, and sum log-decays in float32, where a g far below -100 costs the chunk's "
               "later tokens accuracy; in float32 any g ≤ -104 already forgets fully: clamp g at -100, "
               "or start a new sequence there)")

_finite_checks = os.environ.get("NGDN_CHECK_FINITE", "1").strip().lower() not in ("0", "false", "no", "off")


def finite_checks_enabled() -> bool:
    return _finite_checks


@contextlib.contextmanager
def finite_checks(enabled: bool):
    """Turn the finiteness check of the optimized ops on or off inside a ``with`` block."""
    global _finite_checks
    before, _finite_checks = _finite_checks, bool(enabled)
    try:
        yield
    finally:
        _finite_checks = before


def contiguous_cu_seqlens(cu_seqlens):
    """A checked ``cu_seqlens`` as the kernels read it: by pointer, so contiguous (a strided view of
    the same entries, e.g. every other element of a buffer, is copied); None stays None."""
    return None if cu_seqlens is None else cu_seqlens.contiguous()


def check_kernel_device(name: str, x: torch.Tensor):
    """Kernels run on CUDA tensors in cuda mode and on CPU tensors under the interpreter."""
    expected = triton_mode.device()
    if x.device.type != expected:
        raise ValueError(
            f"{name} is on {x.device}, but optimized ops run on {expected} tensors in "
            f"{triton_mode.MODE} mode"
        )


def check_kernel_dtype(name: str, x: torch.Tensor):
    """bfloat16 only where the kernels compute it (``cuda`` mode); float32 everywhere."""
    if x.dtype == torch.bfloat16 and triton_mode.MODE != triton_mode.CUDA:
        raise ValueError(
            f"{name} is torch.bfloat16, which the Triton interpreter ({triton_mode.MODE} mode) does not "
            "compute correctly; use float32 on the CPU (bfloat16 runs on CUDA)"
        )


class NonFiniteActivation(ValueError):
    """The refusal of ``check_finite_activations`` for an activation, with where it happened:
    ``name`` (the op's argument), ``batch``, ``token``, ``value`` (the bad value found; for a ``g``
    below ``G_FLOOR`` the lowest ``g`` at that token). A ``ValueError`` as before; its fields let a
    caller that computed the activations (the layers) say what they came from."""

    def __init__(self, message: str, name: str, batch: int, token: int, value: float):
        super().__init__(message)
        self.name, self.batch, self.token, self.value = name, batch, token, value


def _first_bad(x: torch.Tensor) -> tuple[int, int, float]:
    """``(batch, token, value)`` of the first non-finite entry of ``x [B, T, ...]`` (error path only)."""
    bad = ~torch.isfinite(x)
    bt = bad.flatten(2).any(-1) if bad.dim() > 2 else bad
    b, t = (int(i) for i in bt.nonzero()[0])
    value = x[b, t].flatten()[bad[b, t].flatten()][0].item()
    return b, t, value


def _extremes(x: torch.Tensor) -> torch.Tensor:
    """``[min, max]`` of ``x`` in float64, which holds every float value exactly (NaN if ``x``
    holds one; ``[0, 0]`` when empty)."""
    if x.numel() == 0:
        return torch.zeros(2, dtype=torch.float64, device=x.device)
    lo, hi = torch.aminmax(x)
    return torch.stack([lo, hi]).double()


def check_finite_activations(named: Iterable[tuple[str, torch.Tensor | None]],
                             params: Iterable[tuple[str, torch.Tensor]] = ()):
    """Every activation ``[B, T, ...]`` and every parameter is finite, with one host sync; a
    ``ValueError`` names the first bad tensor (for an activation, its batch index and token,
    and the value found). Skipped when ``finite_checks_enabled()`` is False, and while
    ``torch.compile`` traces (``torch.compiler.is_compiling()``): its host sync would break the
    graph. The compiled ops (``optimized.compile``) run without it."""
    if not _finite_checks or torch.compiler.is_compiling():
        return
    named = [(n, x) for n, x in named if x is not None]
    params = list(params)
    if not named and not params:
        return
    # one reduction pass per tensor (min and max propagate NaN and keep ±inf), not isfinite's bool
    # tensor and its all(): half the traffic of a bf16 input, and one kernel instead of two
    extremes = torch.stack([_extremes(x) for _, x in named + params])
    flags = torch.isfinite(extremes).all(-1)
    for i, (n, _) in enumerate(named):
        if n == "g":                                     # and not below the floor (NaN fails both)
            flags[i] &= extremes[i, 0] >= G_FLOOR
    if bool(flags.all()):
        return
    bad = [i for i, ok in enumerate(flags.tolist()) if not ok][0]
    if bad >= len(named):
        raise ValueError(f"{params[bad - len(named)][0]} contains non-finite values (nan or inf)")
    name, x = named[bad]
    if name == "g" and bool(torch.isfinite(x).all()):                     # finite, below the floor
        b, t, value = _first_bad(torch.where(x < G_FLOOR, torch.inf, x))
        value = x[b, t].min().item()
        raise NonFiniteActivation(f"g holds {value:g} at batch {b}, token {t}, below {G_FLOOR:g}, where exp(g) "
                                  f"is 0 even in float64: the optimized ops refuse it as they refuse g = "
                                  f"-inf{FORGET_HINT}", name, b, t, value)
    b, t, value = _first_bad(x)
    hint = FORGET_HINT if value == float("-inf") and name == "g" else ""
    raise NonFiniteActivation(
        f"{name} holds a non-finite value ({value}) at batch {b}, token {t}: the optimized ops refuse "
        f"non-finite activations (their chunk kernels would spread it to earlier tokens of its "
        f"64-token chunk){hint}", name, b, t, value
    )
