"""The nested schedule: where every level fires, what it probes and which state each chunk reads."""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from optimized.level0 import CHUNK


@dataclass(frozen=True)
class Plan:
    """Where every level fires, what it probes and which state each chunk reads.

    ``fire_chunks[ℓ]``: the 1-based chunks at which level ℓ ≥ 1 fires (index 0 unused).
    ``sources[ℓ]``: what firing m probes: for ℓ = 1 the 0-based chunk whose end-of-chunk
    level-0 state it reads, for ℓ ≥ 2 the index of level ℓ-1's stored state.
    ``read_index[ℓ]``: per 0-based chunk, the index of ℓ's stored state its tokens read.
    ``read_group[ℓ]``: ``f`` when ``read_index[ℓ][j] == j // f`` for every chunk (the SPEC
    schedule: groups of f chunks read one state), else None.
    """
    T: int
    N: int
    L: int
    intervals: tuple
    fire_chunks: tuple
    sources: tuple
    read_index: tuple
    read_group: tuple

    def firings(self, level: int) -> int:
        return len(self.fire_chunks[level])


@functools.lru_cache(maxsize=256)
def make_plan(T: int, intervals: tuple, delay: int = 0) -> Plan:
    """The SPEC schedule (``delay = 0``). ``delay`` shifts every firing that many chunks
    later; it exists only for the mutation tests (a firing one chunk late)."""
    N = -(-T // CHUNK)
    n_full = T // CHUNK
    L = len(intervals) + 1
    fire_chunks, sources, read_index, read_group = [()], [()], [()], [None]
    for ℓ, f in enumerate(intervals, start=1):
        chunks = tuple(range(f + delay, n_full + 1, f))
        fire_chunks.append(chunks)
        if ℓ == 1:
            sources.append(tuple(c - 1 for c in chunks))
        else:       # level ℓ-1 after its firings at chunks <= c
            sources.append(tuple(bisect.bisect_right(fire_chunks[ℓ - 1], c) for c in chunks))
        # chunk j (0-based) begins after the firings at chunks c <= j (1-based)
        reads = tuple(bisect.bisect_right(chunks, j) for j in range(N))
        read_index.append(reads)
        read_group.append(f if all(s == j // f for j, s in enumerate(reads)) else None)
    return Plan(T, N, L, tuple(intervals), tuple(fire_chunks), tuple(sources), tuple(read_index),
                tuple(read_group))
