"""The GPU suite's run order: the tests a cold run measured as long start first, one per xdist worker.

pytest-xdist's work-stealing scheduler first hands each of its W workers a contiguous share of the
collection (the first ``n // W`` items, then ``(n - that) // (W - 1)`` of the rest, ...) and later
moves the *ends* of the longest queues to idle workers. A test of 30-90 s that sits late in its
share starts late and paces the run's end (the measured runs: ``results/2026-12-04-gpu-suite-cold-analysis/``).

Here the tests that took ``THRESHOLD_S`` or more in the last measured cold run
(``durations.json``, test id -> seconds, written by ``python -m suite.order FILE``
from a ``tests-cold.jsonl.gz``) are dealt longest first, each to the share with the least
measured seconds so far, at the front of its share; the other tests fill the shares in their
order. Every worker then starts on its longest tests and the scheduler's steals move short ones.
Only the order changes: every collected test still runs. Tests absent from the file (new ones)
count as short. Applied on CUDA with xdist only (``suite.plugin``); the interpreter's order is
left alone (the file holds GPU seconds).
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
THRESHOLD_S = 2.0


def load_durations(path: Path = DURATIONS) -> dict:
    """``{test id: seconds}``; empty where the file is missing or unreadable (the order then stays)."""
    try:
        return {str(k): float(v) for k, v in json.loads(Path(path).read_text())["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def share_sizes(n: int, workers: int) -> list[int]:
    """The sizes of xdist's first contiguous shares of ``n`` tests over ``workers`` workers."""
    sizes, left = [], n
    for i in range(workers):
        k = left // (workers - i)
        sizes.append(k)
        left -= k
    return sizes


def longest_first(items: list, seconds, workers: int, threshold: float = THRESHOLD_S) -> list:
    """``items`` reordered for ``workers`` xdist workers: those with ``seconds(item) >= threshold``
    dealt longest first (ties in their order) to the share with the least seconds that still has
    room, at its front; the rest fill the shares in their order. A pure function of ``items``
    (every worker must collect the same order); one worker or no long test: ``items`` unchanged."""
    items = list(items)
    if workers < 2 or not items:
        return items
    cost = [seconds(item) for item in items]
    long_ = sorted((i for i, c in enumerate(cost) if c >= threshold), key=lambda i: (-cost[i], i))
    if not long_:
        return items
    sizes = share_sizes(len(items), workers)
    shares, load = [[] for _ in sizes], [0.0] * len(sizes)
    for i in long_:
        s = min((s for s in range(len(sizes)) if len(shares[s]) < sizes[s]), key=lambda s: (load[s], s))
        shares[s].append(i)
        load[s] += cost[i]
    taken = set(long_)
    rest = iter(i for i in range(len(items)) if i not in taken)
    for s, size in enumerate(sizes):
        shares[s] += [next(rest) for _ in range(size - len(shares[s]))]
    return [items[i] for share in shares for i in share]


def write_durations(log: str, out: Path = DURATIONS, threshold: float = THRESHOLD_S) -> int:
    """Write ``out`` from a per-test log (``NGDN_TEST_LOG``, JSON lines, gzipped or not): the call
    seconds of every test at or over ``threshold`` (setup and skips are not counted)."""
    opener = gzip.open if str(log).endswith(".gz") else open
    seconds = {}
    with opener(log, "rt") as f:
        for line in f:
            entry = json.loads(line)
            if entry.get("when") == "call":
                seconds[entry["test"]] = seconds.get(entry["test"], 0.0) + entry["duration_s"]
    kept = {t: round(s, 1) for t, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])) if s >= threshold}
    Path(out).write_text(json.dumps({"source": str(log), "threshold_s": threshold, "seconds": kept}, indent=0,
                                    ensure_ascii=False) + "\n")
    return len(kept)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m suite.order TESTS-COLD.jsonl[.gz]   (rewrites suite/durations.json)")
    print(f"{write_durations(sys.argv[1])} tests written to {DURATIONS}")
