"""Per-kernel compile seconds of a cold GPU suite run, from its per-test log (``tests-cold.jsonl.gz``,
each test's ``compiled`` list: (what, seconds) per compile or disk-cache load, ``ngdn.compile_clock``).
A load from Triton's disk cache takes well under 0.5 s; a compile takes seconds.

    python results/2026-12-04-gpu-suite-cold-kernel-log-h200/kernels.py [LOG] [--top N]
"""
import argparse
import collections
import gzip
import json
from pathlib import Path


def main():
    here = Path(__file__).parent
    parser = argparse.ArgumentParser()
    parser.add_argument("log", nargs="?", default=here / "tests-cold.jsonl.gz")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    rows = [json.loads(line) for line in gzip.open(args.log, "rt")]
    events = [(what, s, r["test"]) for r in rows for what, s in r.get("compiled", [])]
    compiles = [e for e in events if e[1] >= 0.5]
    print(f"{len(rows)} log lines; {len(events)} compiles or loads, {sum(e[1] for e in events):.0f} s; "
          f"{len(compiles)} of them ≥ 0.5 s (compiles), {sum(e[1] for e in compiles):.0f} s\n")
    # the kernel's name leads both forms of the record: Triton's repr "name[options](...)" and "name|key"
    name = lambda what: what.split("|")[0].split("[")[0]
    by_kernel = collections.defaultdict(list)
    for e in events:
        by_kernel[name(e[0])].append(e)
    print("| seconds | compiles ≥ 0.5 s | records | kernel |\n|---|---|---|---|")
    for k, es in sorted(by_kernel.items(), key=lambda kv: -sum(e[1] for e in kv[1]))[:args.top]:
        print(f"| {sum(e[1] for e in es):.0f} | {sum(1 for e in es if e[1] >= 0.5)} | {len(es)} | `{k}` |")
    by_file = collections.Counter()
    for e in compiles:
        by_file[e[2].split("::")[0]] += e[1]
    print("\n| compile seconds | test file |\n|---|---|")
    for f, s in by_file.most_common(args.top):
        print(f"| {s:.0f} | `{f}` |")


if __name__ == "__main__":
    main()
