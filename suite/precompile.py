"""Compile every compile bucket's kernels once per GPU test run, before the tests start.

Without this, the tests of one bucket (``ngdn.compile_buckets``) that land on different xdist
workers at the same time all compile the same kernels: on one H200 with 16 workers the
compiling tests took 90-140 s each, nearly all of it compiling, and most of that work was
done several times over. Here the controlling pytest process first runs one small call per
*unit* (a kernel family, bucket and dtype; e.g. the nested op, bucket ``b``, bfloat16; a family
whose calls there are long is split into one unit per call, ``kind:bucket:dtype:part``) in a
pool of subprocesses, one unit per process, longest first. Each unit calls the same check
functions the tests call, with the same environment (pinned autotuners, IEEE float32 dots),
so the kernels land in Triton's on-disk cache with exactly the keys the tests will look up;
the workers then load them instead of compiling.

A unit that fails or runs past the time limit is reported and skipped: the tests then compile
what they need themselves (slower, never wrong). Runs only on CUDA, in the controlling process,
when the whole suite runs (``pytest`` with no paths) or when ``NGDN_PRECOMPILE=1``;
``NGDN_PRECOMPILE=0`` turns it off.

``python -m suite.precompile`` runs the whole pool by hand; ``--unit NAME`` one unit.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ngdn.compile_buckets import FENWICK, LEVEL0, TENSOR3D

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")
# Longest first: fenwick_gdn2 compiles fla's GDN-2 pieces at two stacked value widths (up to
# 150 s for one bucket on the H200, 2026-11-30); the nested op fla's level-0 kernels, the scan
# and the state gradient.
# ``packed``: the packed properties' calls (``ngdn.ops.packed_test_draw``, ``fenwick_gdn2_ragged_draw``:
# the same shapes and cu_seqlens dtypes as the tests), in float32 only, grouped by the level-0
# bucket their draws sit on.
KINDS = ("fenwick_gdn2", "nested", "packed", "delta", "gdn2", "gla", "fenwick")
FAMILY_OF = {"fenwick_gdn2": LEVEL0, "nested": LEVEL0, "packed": LEVEL0, "gdn2": LEVEL0, "delta": TENSOR3D,
             "gla": TENSOR3D, "fenwick": FENWICK}
# (bucket, dtype) -> the packed calls there, by name: ``TABLE`` stands for the op table's
# (``property_tests/test_ops.py``'s packed property of each entry that takes ``cu_seqlens``, by the
# entry's name, and each entry's further packed rows, ``OpInfo.packed_cases``, by the case's name,
# e.g. ``nested-levels``: its nested row at L = 3), ``fenwick-gdn2-ragged``
# (``property_tests/test_fenwick_gdn2.py``'s)
TABLE = "table"
PACKED_CALLS = {
    ("b", "float32"): (TABLE,),
    ("a", "float32"): ("fenwick-gdn2-ragged",),
}


def table_packed_calls() -> tuple:
    """The op table's packed calls by name (``PACKED_CALLS``' ``TABLE``); the table is read only
    here, so importing this module loads no op."""
    from ngdn import ops

    return tuple(n for info in ops.OPS if info.varlen for n in (info.name, *(c.name for c in info.packed_cases)))


def packed_calls(bucket: str, dtype: str) -> tuple:
    return tuple(n for call in PACKED_CALLS.get((bucket, dtype), ())
                 for n in (table_packed_calls() if call == TABLE else (call,)))


def fenwick_gdn2_lengths(bucket: str, dtype: str) -> tuple:
    """The sequence lengths whose stacked widths (J + 1)·V the Fenwick GDN-2 properties compile:
    J = 1 (T = 100) and J = 2 (T = 200), the two they draw (``test_fenwick_gdn2.CUDA_SEQ_LENS``);
    bucket a in float32 also J = 4 (T = 520, the nine-chunk case)."""
    return (100, 200, 520) if (bucket, dtype) == ("a", "float32") else (100, 200)


def parts(kind: str, bucket: str, dtype: str) -> tuple:
    """The calls of a (kind, bucket, dtype) that run as units of their own, in parallel (a unit of
    several calls ran past the pool's time limit while the other processes sat idle), or ``()``:
    one unit. A packed (bucket, dtype) without calls has no unit."""
    if kind == "fenwick_gdn2":
        return tuple(f"T{T}" for T in fenwick_gdn2_lengths(bucket, dtype))
    if kind == "packed":
        return packed_calls(bucket, dtype)
    return ()


def units() -> list[str]:
    """Every unit as ``kind:bucket:dtype`` or ``kind:bucket:dtype:part``, longest kinds first."""
    names = []
    for kind in KINDS:
        for b in FAMILY_OF[kind]:
            for dtype in DTYPES:
                ps = parts(kind, b.name, dtype)
                if ps:
                    names += [f"{kind}:{b.name}:{dtype}:{p}" for p in ps]
                elif kind != "packed":
                    names.append(f"{kind}:{b.name}:{dtype}")
    return names


# Seconds each unit took in a cold run on one H200 with 16 units at a time (150: stopped at the
# deadline; results/2026-12-04-gpu-suite-cold-analysis/ says which runs).
# ``run_pool`` starts the units longest first by these: in the order of ``units()`` (by kind) the
# units started last were the ones the deadline stopped, whatever their length.
MEASURED_S = {
    "fenwick_gdn2:b:float32:T100": 150, "fenwick_gdn2:b:float32:T200": 150, "nested:a:float32": 150,
    "nested:b:float32": 150, "packed:b:float32:fenwick-gdn2": 146, "packed:a:float32:fenwick-gdn2-ragged": 121,
    "fenwick_gdn2:a:float32:T200": 115, "fenwick_gdn2:a:float32:T520": 112, "fenwick_gdn2:a:float32:T100": 108,
    "nested:b:bfloat16": 100, "packed:b:float32:nested": 89, "packed:b:float32:tensor3d-delta": 83,
    "packed:b:float32:gdn2": 74, "nested:a:bfloat16": 72, "delta:b:float32": 67, "packed:b:float32:nested-levels": 66,
    "delta:a:float32": 65, "fenwick_gdn2:b:bfloat16:T200": 64, "fenwick_gdn2:b:bfloat16:T100": 62,
    "fenwick_gdn2:a:bfloat16:T100": 59, "fenwick_gdn2:a:bfloat16:T200": 59, "packed:b:float32:tensor3d-gla": 41,
    "delta:b:bfloat16": 39, "fenwick:b:float32": 39, "gdn2:b:float32": 38, "delta:a:bfloat16": 36,
    "fenwick:a:float32": 34, "gla:a:float32": 33, "packed:b:float32:fenwick": 33, "gla:b:float32": 31,
    "fenwick:a:bfloat16": 31, "gla:a:bfloat16": 30, "gla:b:bfloat16": 30, "fenwick:b:bfloat16": 26,
    "gdn2:a:float32": 26, "fenwick:c:float32": 26, "fenwick:c:bfloat16": 23, "gdn2:b:bfloat16": 22,
    "gdn2:a:bfloat16": 22,
}
UNMEASURED_S = 60.0     # a unit not measured yet: started among the middling ones


def longest_first(names) -> list[str]:
    """``names`` by ``MEASURED_S`` (longest first; ties and unmeasured units keep their order)."""
    names = list(names)
    return sorted(names, key=lambda n: (-MEASURED_S.get(n, UNMEASURED_S), names.index(n)))


def parse_unit(unit: str):
    """``(kind, bucket, dtype, part)``; ``part`` None for a unit without parts."""
    try:
        kind, name, dtype, *rest = unit.split(":")
        bucket = {b.name: b for b in FAMILY_OF[kind]}[name]
    except (ValueError, KeyError):
        raise ValueError(f"unknown precompile unit {unit!r}; units look like 'nested:a:float32', "
                         f"one of {units()}") from None
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype in unit {unit!r}: {dtype!r}, expected one of {DTYPES}")
    ps = parts(kind, name, dtype)
    part = rest[0] if len(rest) == 1 else None
    if len(rest) > 1 or (part is None) != (not ps) or (part is not None and part not in ps):
        raise ValueError(f"unknown precompile unit {unit!r}: {kind}:{name}:{dtype} has "
                         f"{'parts ' + ', '.join(ps) if ps else 'no parts'}")
    return kind, bucket, dtype, part


def warm(unit: str, require_cuda: bool = True) -> None:
    """Run the unit's calls in this process (CUDA, test environment). ``require_cuda=False``
    lets a CPU test run a small unit under the interpreter (nothing compiles there)."""
    kind, bucket, dtype_name, part = parse_unit(unit)
    os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    os.environ.setdefault("NGDN_IEEE_F32", "1")
    os.environ.setdefault("NGDN_F32_DOTS", "tf32x3")
    import torch

    from optimized import triton_mode

    if require_cuda and triton_mode.configure() != triton_mode.CUDA:
        raise RuntimeError("precompiling needs CUDA (under the interpreter nothing compiles)")
    torch.set_num_threads(1)        # one core per unit, as in the test workers
    dtype = getattr(torch, dtype_name)
    H, K, V = bucket.H, bucket.K, bucket.V
    if kind == "gdn2":
        from ngdn.checks import gdn2 as gdn2_checks
        from ngdn.inputs import GDN2Shape

        gdn2_checks.optimized_vs_reference(GDN2Shape(B=1, T=100, H=H, K=K, V=V), 0, dtype, log=False)
    elif kind == "nested":
        from ngdn.checks import nested_optimized as checks
        from ngdn.inputs import GDN2Shape
        from ngdn.nested_inputs import NestedShape

        shape = NestedShape(B=1, T=130, H=H, L=3, K=K, V=V)
        # several pair blocks (n = K) and one (n ≤ 16); with and without initial states
        checks.optimized_vs_reference(checks.OptCase(shape, seed=0, scheme=("learned", "merge"), intervals=(1, 1),
                                                     query_counts=(K, K)), dtype, log=False)
        checks.optimized_vs_reference(checks.OptCase(shape, seed=1, intervals=(1, 1), query_counts=(8, 16),
                                                     initial_states=False), dtype, log=False)
        checks.level0_states_vs_reference(GDN2Shape(B=1, T=130, H=H, K=K, V=V), 0, dtype, log=False)
    elif kind == "packed":
        warm_packed(part, dtype)
    elif kind == "fenwick_gdn2":
        from ngdn.checks import fenwick_gdn2 as fenwick_gdn2_checks
        from ngdn.fenwick_inputs import FenwickShape

        # the stacked width (J + 1)·V follows the last chunk index: one length per part
        fenwick_gdn2_checks.optimized_vs_reference(FenwickShape(B=1, T=int(part[1:]), H=H, K=K, V=V), 0, dtype,
                                                   log=False)
    elif kind in ("gla", "delta"):
        from ngdn.checks import tensor3d as tensor3d_checks
        from ngdn.tensor3d_inputs import Tensor3DShape
        from reference.tensor3d import GATE_KINDS

        shape = Tensor3DShape(B=1, T=20, H=H, K=K, E=bucket.E, V=V)
        for gate in GATE_KINDS:
            tensor3d_checks.optimized_vs_reference(shape, 0, dtype, kind, gate, "sigmoid", log=False)
    else:
        from ngdn.checks import fenwick as fenwick_checks
        from ngdn.fenwick_inputs import FenwickShape

        shape = FenwickShape(B=1, T=bucket.seq_lens[0], H=H, K=K, V=V, extra_levels=bucket.extra_levels)
        fenwick_checks.optimized_vs_reference(shape, 0, dtype, log=False)


def warm_packed(call: str, dtype) -> None:
    """One packed property's call (``packed_calls``), as the test makes it."""
    import torch

    from ngdn import ops
    from ngdn.checks import generic

    if call == "fenwick-gdn2-ragged":
        info, d, lengths = ops.get("fenwick-gdn2"), ops.fenwick_gdn2_ragged_draw(), ops.FENWICK_GDN2_RAGGED_LENGTHS
        cu_dtype = torch.int64
    elif call in (cases := {c.name: (info, c) for info in ops.OPS for c in info.packed_cases}):
        info, case = cases[call]
        d, lengths, cu_dtype = ops.packed_case_draw(info, case), case.lengths, case.cu_dtype
    else:
        info, lengths = ops.get(call), ops.PACKED_LENGTHS
        d, cu_dtype = ops.packed_test_draw(info, lengths), ops.packed_cu_dtype(info)
    generic.packed_equals_separate(info, d, lengths, dtype, log=False, cu_dtype=cu_dtype)


def unit_command(name: str) -> list[str]:
    return [sys.executable, "-m", "suite.precompile", "--unit", name]


def run_pool(names=None, jobs: int | None = None, time_limit: float = 240.0, log=print,
             command=unit_command, deadline: float | None = None) -> dict:
    """Warm the units in subprocesses (``command(unit)``), ``jobs`` at a time (default: the CPU
    count; ``names`` default: every unit, longest measured first), each stopped after ``time_limit`` seconds; ``deadline``: seconds after the pool's
    start when the units still running are stopped and those not started are skipped (a unit
    started late must not hold the whole run: its tests compile what it did not). Returns
    ``{unit: (status, seconds)}``; never raises for a unit's failure."""
    names = longest_first(units()) if names is None else list(names)
    for name in names:
        parse_unit(name)
    jobs = jobs or os.cpu_count() or 1
    pending, running, done = list(names), {}, {}
    start = time.monotonic()

    def finish(name, status, elapsed):
        done[name] = (status, elapsed)
        log(f"[ngdn precompile] {len(done)}/{len(names)} {name}: {status} ({elapsed:.1f} s, "
            f"{time.monotonic() - start:.0f} s since start)")

    while pending or running:
        late = deadline is not None and time.monotonic() - start > deadline
        while pending and (late or len(running) < jobs):
            name = pending.pop(0)
            if late:
                finish(name, f"not started by the {deadline:.0f} s deadline", 0.0)
                continue
            # stderr to a file, not a pipe: a unit that warns a lot must not block on a full pipe
            err = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen(command(name), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True)
            running[name] = (proc, time.monotonic(), err)
        time.sleep(0.2)
        late = deadline is not None and time.monotonic() - start > deadline
        for name, (proc, t0, err) in list(running.items()):
            elapsed = time.monotonic() - t0
            if proc.poll() is None and elapsed <= time_limit and not late:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                status = (f"stopped after {time_limit:.0f} s" if elapsed > time_limit
                          else f"stopped at the {deadline:.0f} s deadline")
            elif proc.returncode == 0:
                status = "ok"
            else:
                err.seek(0)
                lines = err.read().strip().splitlines()
                status = f"failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
            err.close()
            del running[name]
            finish(name, status, elapsed)
    return done


def wanted(config) -> bool:
    """Whether the suite plugin should precompile for this pytest run (see module docstring)."""
    choice = os.environ.get("NGDN_PRECOMPILE", "").strip().lower()
    if choice in {"0", "false", "no", "off"}:
        return False
    if os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("collectonly", False):
        return False
    if choice in {"1", "true", "yes", "on"}:
        return True
    whole_suite = getattr(getattr(config, "ArgsSource", None), "TESTPATHS", None)
    return whole_suite is not None and getattr(config, "args_source", None) == whole_suite


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.precompile", description=__doc__.split("\n")[0])
    parser.add_argument("--unit", help="warm one unit in this process (kind:bucket:dtype[:part], see --list)")
    parser.add_argument("--list", action="store_true", help="print the units and exit")
    parser.add_argument("--jobs", type=int, default=None, help="processes at a time (default: CPU count)")
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds per unit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(units()))
        return 0
    if args.unit:
        log = os.environ.get("NGDN_TEST_LOG")
        if log:     # the unit's compiles in the per-test log, before the tests' (which start after the pool)
            from suite import compile_clock

            compile_clock.install(sink=log, label=f"precompile::{args.unit}")
        warm(args.unit)
        return 0
    done = run_pool(jobs=args.jobs, time_limit=args.time_limit)
    return 0 if all(status == "ok" for status, _ in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
