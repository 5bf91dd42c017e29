"""Where a cold GPU suite run's time went, and what the run order would give (from the repo root):

    python results/2026-12-04-gpu-suite-cold-analysis/analyse.py [RUN_DIR]

RUN_DIR (default the run of 2026-12-03) holds pytest-cold.log (the precompile's lines) and
tests-cold.jsonl.gz (per test: call seconds, Triton compile seconds, kernels compiled). Prints the
precompile units, the tests by file and the longest tests, then simulates the precompile pool
(16 processes, 150 s deadline) in the order of ``units()`` and longest measured first, and
pytest-xdist's work stealing over 16 workers with the measured seconds, in the collection order
without and with ``ngdn.suite_order`` (the CUDA collection is made here by a subprocess that
reports CUDA as present; nothing runs). The simulation counts call seconds only: no worker start,
collection or unlogged fixture setup, and a test's seconds do not change with what runs beside it.
"""
import collections
import gzip
import heapq
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV0 = dict(os.environ)     # before ngdn is imported (optimized.triton_mode sets the interpreter up here)
sys.path.insert(0, str(ROOT))
RUN = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "results/2026-12-03-nested-gates-from-nu-default-h200/gpu-suite")
# tests changed in this tree to reuse kernels other tests compile: their expected call seconds
CHANGED = {"property_tests/test_fenwick_gdn2.py::test_packed_sequences_catch_the_packed_grid[packed_grid_carries]": 5.0,
           "property_tests/test_fenwick_gdn2.py::test_packed_sequences_catch_the_packed_grid[packed_grid_final_split]": 2.0,
           "property_tests/test_layer.py::test_layer_property_catches_a_router_on_the_wrong_levels": 5.0}
COLLECT = r'''
import os, sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
os.environ["NGDN_PRECOMPILE"] = "0"
import pytest
class P:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        sys.stderr.write("\n".join(["@@"] + [i.nodeid for i in items]) + "\n")
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[P()])
'''


def cuda_order(workers=None):
    env = dict(ENV0)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    if workers:
        env["PYTEST_XDIST_WORKER_COUNT"] = str(workers)
    err = subprocess.run([sys.executable, "-c", COLLECT], cwd=ROOT, env=env, capture_output=True, text=True).stderr
    return [line for line in err.split("@@\n", 1)[1].splitlines() if "::" in line]


def simulate_xdist(order, seconds, workers=16, default=0.2):
    """Work stealing as in pytest-xdist 3.8: contiguous first shares, then an idle worker (< 2
    queued) takes the last half of the longest queue. Returns the last test's end (s)."""
    queues, left = [], list(range(len(order)))
    for i in range(workers):
        k = len(left) // (workers - i)
        queues.append(left[:k])
        left = left[k:]
    events = [(seconds.get(order[q[0]], default), w) for w, q in enumerate(queues) if q]
    heapq.heapify(events)
    end = 0.0
    while events:
        t, w = heapq.heappop(events)
        end = max(end, t)
        queues[w].pop(0)
        if len(queues[w]) < 2:
            v = max(range(workers), key=lambda j: len(queues[j]))
            n = min(len(queues[v]) // 2, max(0, len(queues[v]) - 2))
            if n:
                queues[w] += queues[v][-n:]
                del queues[v][-n:]
        if queues[w]:
            heapq.heappush(events, (t + seconds.get(order[queues[w][0]], default), w))
    return end


def simulate_pool(names, seconds, jobs=16, deadline=150.0):
    free, status = [0.0] * jobs, {}
    for name in names:
        j = min(range(jobs), key=lambda i: free[i])
        if free[j] >= deadline:
            status[name] = "skipped"
            continue
        status[name] = "ok" if free[j] + seconds[name] < deadline else "stopped"    # 150: never finished by then
        free[j] = min(free[j] + seconds[name], deadline)
    return status


def main():
    from suite import precompile as suite_precompile

    rows = [json.loads(line) for line in gzip.open(RUN / "tests-cold.jsonl.gz", "rt")]
    calls = {}
    for r in rows:
        calls[r["test"]] = calls.get(r["test"], 0.0) + r["duration_s"]
    log = (RUN / "pytest-cold.log").read_text()
    units = re.findall(r"\[ngdn precompile\] \d+/\d+ (\S+): (.*?) \(([\d.]+) s, (\d+) s since start\)", log)
    print(f"## precompile: {len(units)} units, {sum(float(u[2]) for u in units):.0f} process-seconds, "
          f"{sum(u[1] == 'ok' for u in units)} finished")
    for name, status, sec, since in units:
        print(f"| {name} | {status} | {float(sec):.1f} | {since} |")
    total, comp = sum(calls.values()), sum(r.get("compile_s", 0) for r in rows)
    print(f"\n## tests: {len(calls)} logged, {total:.0f} worker-s of calls ({total / 16:.0f} s on 16 workers), "
          f"{comp:.0f} s of them compiling, {sum(r.get('kernels_compiled', 0) for r in rows)} kernels compiled or loaded")
    by_file = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += 1
        f[1] += r["duration_s"]
        f[2] += r.get("compile_s", 0)
        f[3] += r.get("kernels_compiled", 0)
    print("| file | tests | seconds | compile s | kernels |")
    for name, (n, s, c, k) in sorted(by_file.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"| {name} | {n} | {s:.1f} | {c:.1f} | {k} |")
    print("\n## longest tests (finish position in the log of", len(rows), "entries)")
    print("| seconds | compile s | kernels | position | test |")
    for i, r in sorted(enumerate(rows), key=lambda ir: -ir[1]["duration_s"])[:25]:
        print(f"| {r['duration_s']:.1f} | {r.get('compile_s', 0):.1f} | {r.get('kernels_compiled', 0)} | {i} | {r['test']} |")
    # the precompile pool: measured seconds (units().order vs longest first)
    m = suite_precompile.MEASURED_S
    for label, names in (("order of units()", suite_precompile.units()),
                         ("longest measured first", suite_precompile.longest_first(suite_precompile.units()))):
        st = simulate_pool(names, m)
        bad = [n for n in names if st[n] != "ok"]
        print(f"\npool, {label}: {len(bad)} units not finished by 150 s, {sum(m[n] for n in bad):.0f} "
              f"process-s of work left to the tests: {', '.join(bad)}")
    before, after = cuda_order(), cuda_order(16)
    changed = dict(calls, **CHANGED)
    print(f"\n## xdist, 16 workers ({len(before)} tests collected here; unlogged ones 0.2 s)")
    print(f"- spread_evenly order, measured seconds: {simulate_xdist(before, calls):.0f} s")
    print(f"- spread_evenly order, changed tests' seconds: {simulate_xdist(before, changed):.0f} s")
    print(f"- suite_order, measured seconds: {simulate_xdist(after, calls):.0f} s")
    print(f"- suite_order, changed tests' seconds: {simulate_xdist(after, changed):.0f} s")
    print(f"- work / 16: {sum(calls.get(t, 0.2) for t in before) / 16:.0f} s measured, "
          f"{sum(changed.get(t, 0.2) for t in after) / 16:.0f} s changed; longest test {max(changed.values()):.0f} s")


if __name__ == "__main__":
    main()
