"""The benchmark plan: which configurations each sweep measures, and the workloads
(nested or flat side at one shape) each configuration compares.

No GPU and no measuring here: :func:`make_plan` turns the command-line options into a list
of :class:`Config` objects, each holding the :class:`Workload` objects it compares. The
``depth`` and ``batch`` sweeps pair nested GDN-2 (``L`` levels of ``H`` heads, the query
ladder that ``query_counts`` gives, by default ``min(K, 16·2^(ℓ-1))``) with a flat GDN-2 of
``L·H`` heads; the ``ladder`` sweep pairs the query ladder with a uniform
``UNIFORM_QUERIES`` queries per level. Workloads with equal
:attr:`Workload.key` measure the same thing and are measured once.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

SWEEPS = ("depth", "batch", "ladder")
IMPLS = ("nested", "flat")
UNIFORM_QUERIES = 16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# --- the plan ------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """One thing to measure: one side (nested or flat) at one shape."""
    impl: str
    B: int
    T: int
    H: int
    K: int
    V: int
    L: int
    queries: str = ""                     # nested: "ladder" or "uniform16"
    query_counts: tuple[int, ...] = ()    # nested: n_ℓ for ℓ = 1..L-1

    @property
    def heads(self) -> int:
        return self.H if self.impl == "nested" else self.L * self.H

    @property
    def key(self) -> tuple:
        """Equal keys measure the same thing (shared between sweeps)."""
        if self.impl == "flat":
            return ("flat", self.B, self.T, self.L * self.H, self.K, self.V)
        return ("nested", self.B, self.T, self.H, self.K, self.V, self.L, self.query_counts)

    @property
    def label(self) -> str:
        return self.impl if self.impl == "flat" else f"nested/{self.queries}"


@dataclass(frozen=True)
class Config:
    """One point of one sweep and the workloads it compares."""
    sweep: str
    L: int
    B: int
    T: int
    H: int
    K: int
    V: int
    workloads: tuple[Workload, ...] = field(default=(), compare=False)

    @property
    def id(self) -> str:
        if self.sweep == "batch":
            return f"batch-K{self.K}-L{self.L}-B{self.B}"
        return f"{self.sweep}-K{self.K}-L{self.L}"


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def make_plan(args, query_counts: Callable[[int, int], Sequence[int]]) -> list[Config]:
    """The configurations of the requested sweeps, filtered by ``--configs``."""
    sweeps = [s.strip() for s in args.sweeps.split(",") if s.strip()]
    for s in sweeps:
        if s not in SWEEPS:
            raise ValueError(f"--sweeps: unknown sweep {s!r}; choose from {', '.join(SWEEPS)}")
    H = args.heads

    def ladder(L, K):
        return tuple(int(n) for n in query_counts(L, K))

    def pair(L, B, T, K):
        return (Workload("nested", B, T, H, K, K, L, "ladder", ladder(L, K)),
                Workload("flat", B, T, H, K, K, L))

    plan = []
    if "depth" in sweeps:
        for K in _ints(args.head_dims):
            for L in _ints(args.levels):
                plan.append(Config("depth", L, args.batch, args.tokens, H, K, K, pair(L, args.batch, args.tokens, K)))
    if "batch" in sweeps:
        K, L = args.batch_head_dim, args.batch_levels
        for B in _ints(args.batch_sizes):
            if args.tokens_per_batch % B:
                raise ValueError(f"--tokens-per-batch {args.tokens_per_batch} is not a multiple of batch size {B}")
            T = args.tokens_per_batch // B
            plan.append(Config("batch", L, B, T, H, K, K, pair(L, B, T, K)))
    if "ladder" in sweeps:
        for K in _ints(args.ladder_head_dims or args.head_dims):
            for L in _ints(args.ladder_levels or args.levels):
                uniform = tuple([min(K, UNIFORM_QUERIES)] * (L - 1))
                if uniform == ladder(L, K):
                    continue  # nothing to compare (L = 2, or K <= 16)
                plan.append(Config("ladder", L, args.batch, args.tokens, H, K, K, (
                    Workload("nested", args.batch, args.tokens, H, K, K, L, "ladder", ladder(L, K)),
                    Workload("nested", args.batch, args.tokens, H, K, K, L, f"uniform{UNIFORM_QUERIES}", uniform))))
    if args.configs:
        patterns = [p.strip() for p in args.configs.split(",") if p.strip()]
        plan = [c for c in plan if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    return plan

