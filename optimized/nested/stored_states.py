"""Every upper level's stored states, in two allocations: level 1's rows, and the higher levels'.

The stored states are rows ``0 .. S`` in level order (``plan.DeviceTables.level_rows``: level 1's
``F_1 + 1`` rows first). The reads kernels read any row of any level, so in the forward and at
the start of the backward every row must be alive; after that each level's rows are read only
by its own reverse scan (and level ℓ's by level ℓ + 1's snapshots, made before that scan). Held
as one tensor, all rows stayed alive until level 1's scan, the last: the higher levels' rows are
spent after level 2's scan, and live in their own tensor so that the backward frees them there
(``release_higher``), before level 2's and level 1's probe backwards and level 1's scan.

A plain ``[B, S, H, K, V]`` tensor is accepted wherever a ``StoredStates`` is (``as_stored``:
all rows in ``lo``), so the reads kernels' own tests and callers keep their one buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class StoredStates:
    lo: torch.Tensor                # [B, S_lo, H, K, V] float32: rows 0 .. S_lo (level 1's, or all)
    hi: torch.Tensor | None         # [B, S - S_lo, H, K, V] float32: rows S_lo .. S; None once released
    S: int                          # every row

    @property
    def S_lo(self) -> int:
        return self.lo.shape[1]

    @classmethod
    def empty(cls, B: int, S: int, S_lo: int, H: int, K: int, V: int, device) -> StoredStates:
        """Uninitialised rows; level 1's ``S_lo`` rows in one allocation, the rest in another."""
        lo = torch.empty(B, S_lo, H, K, V, dtype=torch.float32, device=device)
        hi = torch.empty(B, S - S_lo, H, K, V, dtype=torch.float32, device=device)
        return cls(lo, hi, S)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start .. stop`` (a view), all in ``lo`` or all in ``hi``."""
        if stop <= self.S_lo:
            return self.lo[:, start:stop]
        if start < self.S_lo:
            raise ValueError(f"rows {start} .. {stop} straddle the two allocations (split at {self.S_lo})")
        if self.hi is None:
            raise RuntimeError(f"rows {start} .. {stop} were released (release_higher)")
        return self.hi[:, start - self.S_lo: stop - self.S_lo]

    def level(self, tables, ℓ: int) -> torch.Tensor:
        """Level ℓ's rows ``[B, F_ℓ + 1, H, K, V]`` (a view)."""
        rows = tables.level_rows(ℓ)
        return self.rows(rows.start, rows.stop)

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(lo, hi, S_lo)`` for the reads kernels (``hi`` is ``lo`` when it holds no row)."""
        if self.hi is None and self.S > self.S_lo:
            raise RuntimeError("the higher levels' stored states were released: the reads kernels need every row")
        hi = self.lo if self.hi is None or self.hi.shape[1] == 0 else self.hi
        return self.lo.contiguous(), hi.contiguous(), self.S_lo

    def whole(self) -> torch.Tensor:
        """Every row as one ``[B, S, H, K, V]`` tensor (a copy when split)."""
        if self.S == self.S_lo:
            return self.lo
        lo, hi, _ = self.kernel_args()
        return torch.cat([lo, hi], dim=1)

    def release_higher(self) -> None:
        """Drop the rows past level 1's (spent once level 2's reverse scan is done)."""
        self.hi = None


def as_stored(states) -> StoredStates:
    """``states`` as a ``StoredStates``: one ``[B, S, H, K, V]`` tensor becomes all-``lo``."""
    if isinstance(states, StoredStates):
        return states
    if not isinstance(states, torch.Tensor) or states.dim() != 5:
        raise ValueError(f"states must have shape [B, S, H, K, V] (or be a StoredStates), got "
                         f"{tuple(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__}")
    return StoredStates(states, None, states.shape[1])
