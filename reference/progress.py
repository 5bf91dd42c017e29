"""A one-line time estimate on stderr for a long per-token reference call.

The references run one token at a time (``reference.naive_nested_gdn2`` at T = 4096 takes 20-43 s
on a CPU) and would otherwise run silently. Each per-token loop calls a ``Ticker`` once per token;
after the first ``PROBE_TOKENS`` tokens it extrapolates the elapsed time to the whole sequence and,
when that predicts more than ``ANNOUNCE_ABOVE_S`` seconds, writes one line to stderr:

    [reference] naive_nested_gdn2: T = 4096 tokens, about 31 s (from the first 32 tokens;
    NGDN_REFERENCE_PROGRESS=0 silences this)        <- one line

Nothing else: no math changes, one clock read per token before the probe and none after.
``NGDN_REFERENCE_PROGRESS=0`` in the environment, or ``with reference.progress.quiet():``,
silences it. A packed call (``cu_seqlens``) estimates each sequence on its own.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

PROBE_TOKENS = 32          # tokens timed before the estimate
ANNOUNCE_ABOVE_S = 5.0     # the estimate is written only for calls predicted to take longer

_enabled = os.environ.get("NGDN_REFERENCE_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether the references write their estimate line (``NGDN_REFERENCE_PROGRESS``, ``quiet``)."""
    return _enabled


@contextlib.contextmanager
def quiet(silent: bool = True):
    """Silence (``silent=True``) or allow the estimate line inside a ``with`` block."""
    global _enabled
    if not isinstance(silent, bool):
        raise TypeError(f"silent must be a bool, got {type(silent).__name__}")
    before, _enabled = _enabled, not silent
    try:
        yield
    finally:
        _enabled = before


class Ticker:
    """``tick(t)`` once per token ``t = 0..T-1`` of a per-token loop named ``name``: at token
    ``PROBE_TOKENS`` the elapsed time is extrapolated to ``T`` tokens and, above
    ``ANNOUNCE_ABOVE_S``, announced on ``stream`` (default stderr)."""

    def __init__(self, name: str, T: int, stream=None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if isinstance(T, bool) or not isinstance(T, int) or T < 0:
            raise ValueError(f"T must be an int >= 0, got {T!r}")
        self.name, self.T, self.stream = name, T, stream
        # a call shorter than the probe is never announced: nothing to time
        self.active = _enabled and T > PROBE_TOKENS
        self.start = time.perf_counter()

    def __call__(self, t: int) -> None:
        if not self.active or t < PROBE_TOKENS:
            return
        self.active = False
        estimate = (time.perf_counter() - self.start) / PROBE_TOKENS * self.T
        if estimate > ANNOUNCE_ABOVE_S:
            print(f"[reference] {self.name}: T = {self.T} tokens, about {estimate:.0f} s (from the first "
                  f"{PROBE_TOKENS} tokens; NGDN_REFERENCE_PROGRESS=0 silences this)",
                  file=sys.stderr if self.stream is None else self.stream, flush=True)
