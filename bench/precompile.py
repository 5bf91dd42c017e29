"""Parallel pre-compilation of the Triton kernels a benchmark plan needs.

Why: fla's GDN-2 kernels take the head count ``H`` as a ``tl.constexpr`` and autotune
over many configs, so every new head count (the flat side has ``L·H`` heads) compiles
every config of every kernel again: minutes per shape, one compile after another in the
benchmark process. Compiling does not need a quiet GPU; timing does.

What: before the benchmark process autotunes, worker processes (one per group, up to
``--precompile-workers`` at a time) run one forward and backward of each *compile group*
(one workload per distinct set of kernel specialisations: the flat side per head count and
head dim, the nested side per ``H, K, V, L`` and query counts; ``B = 1``, the group's own
``T``) with the autotuner's timing replaced by a single launch of each config. Where there
are more worker slots than groups, a group runs as several *parts*, part ``i`` of ``P``
compiling configs ``i, i + P, …`` of every autotuned kernel (``config_slice``): fla's
autotuners compile their configs one after another, so one process per group left a flat
GDN-2 head count at minutes (194 s at 64 heads, K = 128, on the H200: bench/NOTES.md).
Nested groups share fla's level-0 kernels: only the first of them compiles those, the others
start once all its parts are done. That fills Triton's on-disk kernel cache. The workers never cache
an autotuning result (``check_disk_cache`` is bypassed and their choices die with them),
so the benchmark process still times every config itself on an idle GPU; it only finds
the binaries compiled already. Nothing measured in the results comes from a worker.

    python -m bench.precompile CONTRACT.json INDEX [PART PARTS]    # one group or part (run_workers)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import types
from typing import Callable, Sequence

# Fields of the benchmark's argparse namespace that a worker's inputs depend on.
ARG_FIELDS = ("dtype", "param_dtype", "scheme", "seed", "warmup_ms", "rep_ms")


def group_key(w) -> tuple:
    """Workloads with equal keys launch the same kernel specialisations (``B`` and ``T``
    are runtime arguments; every planned ``T`` is a multiple of 16, so Triton's integer
    specialisation is the same too)."""
    if w.impl == "flat":
        return ("flat", w.heads, w.K, w.V)
    return ("nested", w.H, w.K, w.V, w.L, tuple(w.query_counts))


def compile_groups(workloads: Sequence) -> list[dict]:
    """One representative per compile group, as a dict of ``Workload`` fields with ``B = 1``."""
    groups = {}
    for w in workloads:
        groups.setdefault(group_key(w), w)
    out = []
    for w in groups.values():
        d = {f: getattr(w, f) for f in ("impl", "B", "T", "H", "K", "V", "L", "queries")}
        d["query_counts"] = list(w.query_counts)
        d["B"] = 1
        out.append(d)
    # Most expensive first (flat with many heads, deep nested), so workers finish together.
    out.sort(key=lambda d: -d["H"] * d["L"] * d["K"])
    return out


def default_workers(n_groups: int) -> int:
    return max(1, min(n_groups, (os.cpu_count() or 2) - 2, 12))


def level0_key(g: dict) -> tuple:
    """The fla GDN-2 kernels a group compiles: flat with ``L·H`` heads, nested's level 0
    with ``H`` heads. Groups with equal keys compile the same fla kernels."""
    heads = g["L"] * g["H"] if g["impl"] == "flat" else g["H"]
    return (heads, g["K"], g["V"])


def dependencies(groups: Sequence[dict]) -> list[int | None]:
    """For each group, the earlier group that compiles the same fla kernels (it waits for
    that one to finish and then only compiles what is its own), or None."""
    first: dict[tuple, int] = {}
    deps = []
    for i, g in enumerate(groups):
        deps.append(first.get(level0_key(g)))
        first.setdefault(level0_key(g), i)
    return deps


MAX_PARTS = 8   # parts per group: fla's GDN-2 autotuners have up to a few dozen configs a kernel


def parts_per_group(n_groups: int, slots: int) -> int:
    """How many parts each group runs as: the slots shared out, at least 1, at most ``MAX_PARTS``."""
    return max(1, min(MAX_PARTS, slots // max(1, n_groups)))


def slots_and_parts(n_groups: int, n_workers: int | None) -> tuple[int, int]:
    """Processes at a time and parts per group: ``n_workers`` slots (``None``: one per core less
    two, at most 12, whether or not there are that many groups: the parts fill them)."""
    slots = n_workers or default_workers(n_groups * MAX_PARTS)
    return slots, parts_per_group(n_groups, slots)


def config_slice(configs: Sequence, part: int, parts: int) -> list:
    """Part ``part`` of ``parts``'s share of an autotuner's configs: every ``parts``-th from
    ``part`` on; where there are fewer configs than parts, the one at ``part % len``, so every
    part still runs the kernel (its inputs feed the next kernels) and every config is compiled
    by some part."""
    configs = list(configs)
    if not configs or parts <= 1:
        return configs
    return configs[part::parts] or [configs[part % len(configs)]]


def split_tasks(deps: Sequence[int | None], parts: int) -> tuple[list[tuple[int, int]], list[tuple[int, ...] | None]]:
    """The groups' tasks, ``(group, part)`` for each part of each group in group order, and each
    task's dependencies: every part of the group its group waits for (see :func:`dependencies`)."""
    tasks = [(g, p) for g in range(len(deps)) for p in range(parts)]     # group g's: g·parts … g·parts + parts − 1
    return tasks, [None if deps[g] is None else tuple(range(deps[g] * parts, (deps[g] + 1) * parts))
                   for g, _ in tasks]


def schedule(deps: Sequence[int | Sequence[int] | None], slots: int, launch: Callable[[int], object],
             finished: Callable[[int, object], None], timeout_s: float, poll_s: float = 0.5) -> list[int]:
    """Run task ``i`` as ``launch(i)`` (an object with ``poll()``/``kill()``, like ``Popen``),
    at most ``slots`` at a time, in index order, a task only once the tasks it depends on
    (``deps[i]``: None, one index or several) have ended (failed or not). ``finished(i,
    returncode)`` is called as each ends; tasks still running at ``timeout_s`` are killed
    (return code ``"timeout"``). Returns the start order."""
    t0 = time.perf_counter()
    pending = list(range(len(deps)))
    running: dict[int, object] = {}
    ended: set[int] = set()
    order = []
    needs = [() if d is None else (d,) if isinstance(d, int) else tuple(d) for d in deps]
    while pending or running:
        for i in [i for i in pending if all(d in ended for d in needs[i])]:
            if len(running) >= slots:
                break
            pending.remove(i)
            running[i] = launch(i)
            order.append(i)
        for i, proc in list(running.items()):
            rc = proc.poll()
            if rc is None and time.perf_counter() - t0 > timeout_s:
                proc.kill()
                rc = "timeout"
            if rc is not None:
                del running[i]
                ended.add(i)
                finished(i, rc)
        if running:
            time.sleep(poll_s)
    return order


def run_workers(workloads: Sequence, args, n_workers: int | None, log: Callable[[str], None],
                timeout_s: float = 1800.0) -> dict:
    """Compile every group of ``workloads``, ``n_workers`` processes at a time (``None``: one per
    core less two, at most 12), each group as ``parts_per_group`` processes when the slots
    outnumber the groups; a group whose fla kernels another group compiles waits for all of
    that one's parts (see :func:`dependencies`) instead of compiling them twice. Returns a
    summary for the output headers; a failing part is reported, never fatal (the benchmark
    process then compiles what is missing itself)."""
    groups = compile_groups(workloads)
    if not groups:
        return {"groups": 0, "workers": 0, "parts": 0, "seconds": 0.0, "failed": []}
    slots, parts = slots_and_parts(len(groups), n_workers)
    tasks, deps = split_tasks(dependencies(groups), parts)
    n = min(len(tasks), slots)
    spec = {"args": {f: getattr(args, f) for f in ARG_FIELDS}, "groups": groups}
    t0 = time.perf_counter()
    failed = []
    with tempfile.TemporaryDirectory(prefix="ngdn-precompile-") as tmp:
        path = os.path.join(tmp, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        logs = {}

        def name(i):
            g, p = tasks[i]
            return f"group {g}" + (f" part {p + 1}/{parts}" if parts > 1 else "")

        def launch(i):
            g, p = tasks[i]
            logs[i] = open(os.path.join(tmp, f"task{i}.log"), "w+")
            return subprocess.Popen([sys.executable, "-m", "bench.precompile", path, str(g), str(p), str(parts)],
                                    stdout=logs[i], stderr=subprocess.STDOUT, env=env)

        def finished(i, rc):
            logs[i].seek(0)
            lines = logs[i].read().strip().splitlines()
            logs[i].close()
            for line in lines[-3:] if rc != 0 else lines[-1:]:
                log(f"  [{time.perf_counter() - t0:.0f} s] {name(i)}: {line}")
            if rc != 0:
                failed.append(f"{name(i)}: exit {rc}")

        waiting = sum(d is not None for d in dependencies(groups))
        log(f"precompile: {len(groups)} compile groups in {parts} part(s) each, {n} processes at a time "
            f"({waiting} group(s) wait for a group that compiles the same fla kernels) ...")
        schedule(deps, n, launch, finished, timeout_s)
    seconds = time.perf_counter() - t0
    log(f"precompile: done in {seconds:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return {"groups": len(groups), "workers": n, "parts": parts, "seconds": seconds, "failed": failed}


def _launch_once(kernel_call, quantiles=None, **_):
    """Stands in for the autotuner's timing: compile and launch the config once."""
    import torch

    kernel_call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [0.0, 0.0, 0.0] if quantiles else 0.0


def _patch_autotuner(part: int = 0, parts: int = 1):
    """In a worker: each config launched once instead of timed, no autotuning result cached, and
    with ``parts > 1`` only this part's share of each autotuner's configs (``config_slice``)."""
    from triton.runtime.autotuner import Autotuner

    Autotuner.do_bench = property(lambda self: _launch_once)

    def bench_without_cache(self, tuning_key, configs, bench_fn):
        bench_fn()
        return False

    Autotuner.check_disk_cache = bench_without_cache
    if parts > 1:
        prune = Autotuner.prune_configs

        def this_parts_configs(self, kwargs):
            return config_slice(prune(self, kwargs), part, parts)

        Autotuner.prune_configs = this_parts_configs


def worker(spec_path: str, index: int, part: int = 0, parts: int = 1) -> int:
    from bench.harness import CpuDevice, Hooks, prepare_environment
    from bench.measure import build_flat, build_nested, param_dtypes
    from bench.plan import Workload

    prepare_environment()   # the benchmark process's environment: same compile cache keys
    _patch_autotuner(part, parts)
    import torch

    with open(spec_path) as f:
        spec = json.load(f)
    args = types.SimpleNamespace(**spec["args"])
    # A CPU device only for tests of this path (the interpreter; nothing to precompile there).
    hooks = Hooks(device=None if torch.cuda.is_available() else CpuDevice()).resolve(args)
    d = spec["groups"][index]
    w = Workload(**(d | {"query_counts": tuple(d["query_counts"])}))
    t0 = time.perf_counter()
    try:
        if w.impl == "flat":
            built = build_flat(w, args, hooks)
            o = built.forward()
        else:
            dtypes = param_dtypes(args)   # as measure_workload: float32 if the op rejects bf16
            for dtype in dtypes:
                try:
                    built = build_nested(w, args, hooks, dtype)
                    o = built.forward()
                    break
                except (TypeError, ValueError) as e:
                    if dtype is dtypes[-1] or "dtype" not in str(e):
                        raise
        torch.autograd.grad(o, built.inputs, built.do, allow_unused=True)
        hooks.device.sync()
        print(f"{w.label} heads={w.heads} K={w.K} L={w.L}: compiled in {time.perf_counter() - t0:.0f} s"
              + (f" (configs {part + 1}/{parts})" if parts > 1 else ""), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - the benchmark process reports real errors
        print(f"{w.label} heads={w.heads} K={w.K} L={w.L}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], *map(int, sys.argv[2:5])))
