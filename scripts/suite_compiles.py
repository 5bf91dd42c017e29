"""The Triton compiles of a GPU suite run, from its per-test log (``NGDN_TEST_LOG``,
``tests-<run>.jsonl[.gz]``): how many compiles of at least 0.5 s (a disk-cache load takes ≈ 0.1 s),
their seconds, and where they went — by kernel (with its distinct cache keys: each is one
specialisation, a constexpr value, a dtype or an integer argument's divisibility) and by test
(the precompile pool's units as ``precompile::UNIT``). Peak allocator memory per test too, where
the log has it (``peak_gib``).

    python scripts/suite_compiles.py tests-cold.jsonl.gz [--top 25]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys

SLOW_S = 0.5


def read(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    entries = []
    with opener(path, "rt") as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
    return entries


def summary(entries: list[dict], top: int = 25) -> str:
    by_kernel, keys, by_test = collections.Counter(), collections.defaultdict(set), collections.Counter()
    count = seconds = 0
    for e in entries:
        for what, sec in e.get("compiled") or []:
            if sec < SLOW_S:
                continue
            name, _, key = what.partition("|")
            name = name.split("[")[0]
            count += 1
            seconds += sec
            by_kernel[name] += sec
            keys[name].add(key)
            by_test[e.get("test", "?")] += sec
    lines = [f"compiles >= {SLOW_S} s: {count}, {seconds:.0f} s", "", "| kernel | seconds | compiles | keys |",
             "|---|---|---|---|"]
    counts = collections.Counter()
    for e in entries:
        for what, sec in e.get("compiled") or []:
            if sec >= SLOW_S:
                counts[what.partition("|")[0].split("[")[0]] += 1
    lines += [f"| {k} | {s:.0f} | {counts[k]} | {len(keys[k])} |" for k, s in by_kernel.most_common(top)]
    lines += ["", "| test | compile seconds |", "|---|---|"]
    lines += [f"| {t} | {s:.0f} |" for t, s in by_test.most_common(top)]
    peaks = [(e.get("peak_gib"), e["test"]) for e in entries if isinstance(e.get("peak_gib"), (int, float))]
    if peaks:
        peaks.sort(reverse=True)
        lines += ["", f"allocator peaks: {len(peaks)} tests, {sum(p > 2.0 for p, _ in peaks)} above 2 GiB",
                  "", "| test | peak GiB |", "|---|---|"]
        lines += [f"| {t} | {p:.2f} |" for p, t in peaks[:top]]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="a per-test log, tests-<run>.jsonl or .jsonl.gz")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    args = parser.parse_args(argv)
    try:
        entries = read(args.log)
    except OSError as e:
        parser.error(f"cannot read {args.log}: {e}")
    print(summary(entries, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
