"""What the benchmark runs on and with: devices, the timer, the :class:`Hooks` that tests
replace with stand-ins, the process environment, the run's metadata and headers, and the
measured rates behind the floors.

- :class:`CudaDevice` / :class:`CpuDevice`: synchronisation and peak-memory counters.
- :func:`do_bench_timer`: ``fn -> median ms`` with ``triton.testing.do_bench``.
- :class:`Hooks`: the ops, timer, device and log a run calls out to (``None``: the real thing).
- :func:`prepare_environment`: unset the pinning variables before ``optimized`` is configured.
- :func:`collect_meta` / :func:`header_lines`: date, GPU, versions, command for every output.
- :func:`measure_rates`: bf16 matmul rate and copy bandwidth for the floors (``bench.floors``).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import math
import os
import platform
import re
import sys
from dataclasses import dataclass
from typing import Callable

import torch


# --- hooks: what runs, what times, where -------------------------------------------

class CudaDevice:
    """Synchronisation and peak-memory counters of the current CUDA device."""
    torch_device = "cuda"

    def __init__(self):
        self.name = torch.cuda.get_device_name()

    def sync(self):
        torch.cuda.synchronize()

    def memory_begin(self) -> float:
        gc.collect()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return base

    def memory_peak(self) -> float:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    def cleanup(self):
        gc.collect()
        torch.cuda.empty_cache()

    def healthy(self) -> bool:
        """False once a sticky CUDA error (e.g. an illegal address) has poisoned the context."""
        try:
            torch.cuda.synchronize()
            return True
        except Exception:  # noqa: BLE001
            return False


class CpuDevice:
    """CPU stand-in (tests): no memory counters."""
    torch_device = "cpu"
    name = "cpu"

    def sync(self):
        pass

    def memory_begin(self) -> float:
        return math.nan

    def memory_peak(self) -> float:
        return math.nan

    def cleanup(self):
        pass

    def healthy(self) -> bool:
        return True


def write_side_by_side(out_dir, stem: str, title: str, rows: list[dict]) -> str:
    """``rows`` (one dict per variant, the same keys) -> ``out_dir/stem.csv`` and a Markdown table
    under ``# title`` in ``out_dir/stem.md``; returns the Markdown (the A/B benchmarks print it)."""
    import csv
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = list(rows[0])
    with open(out_dir / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{stem}.md").write_text(text)
    return text


def do_bench_timer(warmup_ms: float, rep_ms: float) -> Callable[[Callable], float]:
    """``fn -> median ms`` with ``triton.testing.do_bench`` (L2 flushed before every run)."""
    from triton.testing import do_bench

    return lambda fn: float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def write_profile_table(path, fn, leaves=()) -> None:
    """The torch.profiler kernel table (top 60 by device time) of one call of ``fn`` (a CUDA step)
    -> ``path``; the gradients of ``leaves`` reset after it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    with open(path, "w") as fh:
        fh.write(averages.table(sort_by="cuda_time_total", row_limit=60))
        fh.write("\n" + "\n".join(stage_table(averages)) + "\n")
        fh.write("\n" + "\n".join(stage_calls_table(prof.events())) + "\n")
    for t in leaves:
        t.grad = None


def _device_time(evt) -> tuple[float, bool]:
    """A profiler event's device µs (``device_time_total``, ``cuda_time_total`` on older torch) and
    whether the event is a range's span on the GPU timeline (device time, no CPU time)."""
    device_us = getattr(evt, "device_time_total", None)
    if device_us is None:
        device_us = getattr(evt, "cuda_time_total", 0.0)
    return device_us, evt.cpu_time_total == 0 and device_us > 0


def stage_table(averages, prefix: str = "nested.") -> list[str]:
    """The ``record_function`` ranges named ``prefix…`` (the nested op's stages,
    ``optimized/nested/fwd.py``, ``bwd.py``, ``function.py``; they do not nest) of a profiler's
    ``key_averages()``, one row per stage, as a Markdown table sorted by device time.

    A CUDA profile holds two events per range under one name: the host range (its CPU time;
    its device total counts only the ATen kernels it launched, not Triton's) and the range's
    span on the GPU timeline (no CPU time; the kernels and the gaps between them, so a
    launch-bound stage shows its idle time). The row takes ``device ms`` from the span (the
    host range's device total where there is no span: a CPU-only profile) and ``CPU ms`` from
    the host range; the stages' sum against the step's total shows what ran outside them.
    (Listing both events as two rows and summing both gave 40.6 ms for a 33 ms step.)"""
    stages: dict[str, dict] = {}
    for evt in averages:
        if not evt.key.startswith(prefix):
            continue
        device_us, is_span = _device_time(evt)
        row = stages.setdefault(evt.key, {"calls": 0, "span": None, "host_device": 0.0, "cpu": 0.0})
        if is_span:                                         # the range's span on the GPU timeline
            row["span"] = (row["span"] or 0.0) + device_us / 1e3
        else:                                               # the host range
            row["calls"] += evt.count
            row["cpu"] += evt.cpu_time_total / 1e3
            row["host_device"] += device_us / 1e3
    rows = [(key, r["calls"], r["host_device"] if r["span"] is None else r["span"], r["cpu"])
            for key, r in stages.items()]
    rows.sort(key=lambda r: -r[2])
    lines = ["| stage | calls | device ms | CPU ms |", "|---|---|---|---|"]
    lines += [f"| {k} | {n} | {d:.3f} | {c:.3f} |" for k, n, d, c in rows]
    lines.append(f"| (sum of stages) | | {sum(r[2] for r in rows):.3f} | |")
    return lines


def stage_calls_table(events, prefix: str = "nested.") -> list[str]:
    """The calls of every ``prefix…`` stage that ran more than once, one column per call in the
    order they started (a profiler's ``events()``): the nested op opens its level stages once per
    level, so at L = 4 ``nested.scan_fwd``'s calls are levels 1, 2, 3 and ``nested.scan_bwd``'s
    levels 3, 2, 1 (the backward runs top first). Device time as in :func:`stage_table`: the
    range's span on the GPU timeline where the profile has one, else the host range's device
    total."""
    spans: dict[str, list] = {}
    hosts: dict[str, list] = {}
    for evt in events:
        if not evt.name.startswith(prefix):
            continue
        device_us, is_span = _device_time(evt)
        (spans if is_span else hosts).setdefault(evt.name, []).append((evt.time_range.start, device_us / 1e3))
    calls = {name: sorted(spans.get(name) or hosts[name]) for name in {*spans, *hosts}}
    calls = {name: c for name, c in calls.items() if len(c) > 1}
    width = max((len(c) for c in calls.values()), default=0)
    lines = ["| stage (calls in time order) | " + " | ".join(f"call {i + 1} ms" for i in range(width)) + " |",
             "|---|" + "---|" * width]
    for name in sorted(calls, key=lambda n: -sum(ms for _, ms in calls[n])):
        cells = [f"{ms:.3f}" for _, ms in calls[name]] + [""] * (width - len(calls[name]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def add_check_finite(parser, what: str = "both sides") -> None:
    """``--check-finite``: keep the optimized ops' finiteness check on while timing (one read of
    every input and a host sync per forward). Benchmarks time with it off: their inputs are finite."""
    parser.add_argument("--check-finite", action="store_true",
                        help=f"keep the optimized ops' finiteness check on ({what}: a host sync and one read of "
                             "every input per forward); off by default: the benchmark's inputs are finite")


def stderr_log(message: str):
    print(message, file=sys.stderr, flush=True)


@dataclass
class Hooks:
    """Everything :func:`run` calls out to; ``None`` means the real thing.

    ``nested_op``/``flat_op`` have the signatures of ``optimized.nested.chunk_nested_gdn2``
    and ``optimized.gdn2.chunk_gdn2``; ``make_levels``/``query_counts`` those of
    ``reference.nested``; ``timer(fn) -> ms``; ``device`` a :class:`CudaDevice`-like object;
    ``graph(fn, timer) -> ms`` times ``fn`` captured in a CUDA graph (``--graph``;
    ``bench.cuda_graph.graph_ms``), left None when not asked for.
    """
    nested_op: Callable | None = None
    flat_op: Callable | None = None
    make_levels: Callable | None = None
    query_counts: Callable | None = None
    timer: Callable[[Callable], float] | None = None
    device: object | None = None
    log: Callable[[str], None] = stderr_log
    graph: Callable | None = None       # (fn, timer) -> ms of fn's captured graph; None: not timed

    def resolve(self, args) -> "Hooks":
        h = dataclasses.replace(self)
        if h.make_levels is None or h.query_counts is None:
            from reference import nested as ref_nested

            h.make_levels = h.make_levels or ref_nested.make_levels
            h.query_counts = h.query_counts or ref_nested.default_query_counts
        if h.flat_op is None:
            from optimized.gdn2 import chunk_gdn2

            h.flat_op = chunk_gdn2
        if h.nested_op is None:
            h.nested_op = _load_nested_op()
        if h.device is None:
            h.device = CudaDevice()
        if h.timer is None:
            h.timer = do_bench_timer(args.warmup_ms, args.rep_ms)
        if h.graph is None and getattr(args, "graph", False):
            from bench.cuda_graph import graph_ms

            h.graph = graph_ms
        return h


def _load_nested_op():
    """The optimized op, or a callable that raises why it could not be imported (so every
    nested row records the reason and the flat side is still measured)."""
    try:
        from optimized.nested import chunk_nested_gdn2

        return chunk_nested_gdn2
    except Exception as e:  # noqa: BLE001 - the op may not exist yet
        reason = f"optimized.nested.chunk_nested_gdn2 unavailable: {type(e).__name__}: {e}"

        def unavailable(*args, **kwargs):
            raise NotImplementedError(reason)

        return unavailable


# --- environment and metadata ---------------------------------------------------------

def prepare_environment() -> list[str]:
    """Benchmarks autotune and use the default float32 precision: unset ``NGDN_PIN_AUTOTUNE``
    and ``NGDN_IEEE_F32`` before ``optimized`` is configured, and cache autotuning results
    on disk (``TRITON_CACHE_AUTOTUNING=1``; fla caches its own by default) so a resumed run
    does not re-tune. Returns notes for the output headers."""
    notes = []
    for var in ("NGDN_PIN_AUTOTUNE", "NGDN_IEEE_F32"):
        if os.environ.pop(var, None) is not None:
            notes.append(f"unset {var} for the benchmark")
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    from optimized import triton_mode

    mode = triton_mode.configure()
    from triton.runtime import autotuner

    if mode == triton_mode.CUDA and getattr(autotuner.Autotuner, "_ngdn_pinned", False):
        notes.append("WARNING: autotuners are PINNED to their first config (NGDN_PIN_AUTOTUNE was set when "
                     "`optimized` was first imported); timings are not tuned")
    if os.environ.get("TRITON_F32_DEFAULT"):
        notes.append(f"TRITON_F32_DEFAULT={os.environ['TRITON_F32_DEFAULT']} is set")
    return notes


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def collect_meta(args, device, argv, notes) -> dict:
    import triton

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "gpu": device.name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fla": _version("fla-core"),
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "none",
        "dtype": args.dtype,
        "timer": f"triton.testing.do_bench median, warmup {args.warmup_ms} ms, rep {args.rep_ms} ms",
        "autotune": "on (warm-up of every configuration before timing; reported separately)",
        "command": "python -m bench.nested_vs_flat " + " ".join(argv),
        "notes": list(notes),
    }


def header_lines(meta: dict, rates: dict | None) -> list[str]:
    lines = [
        "Nested vs flat GDN-2 benchmark",
        f"date: {meta['date']}",
        f"gpu: {meta['gpu']}",
        f"versions: torch {meta['torch']}, triton {meta['triton']}, fla-core {meta['fla']}, "
        f"python {meta['python']}, cuda {meta['cuda']}",
        f"dtype: {meta['dtype']}; timer: {meta['timer']}",
        f"autotune: {meta['autotune']}",
    ]
    if rates:
        lines.append(f"measured rates: bf16 matmul {rates['matmul_tflops']:.4g} TFLOP/s ({rates['matmul_how']}), "
                     f"copy {rates['copy_gbps']:.4g} GB/s read+write ({rates['copy_how']})")
    lines.append(f"command: {meta['command']}")
    lines += [f"note: {n}" for n in meta["notes"]]
    return lines


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


# --- rates for the floors ---------------------------------------------------------------

def measure_rates(args, timer, device) -> dict:
    """bf16 matmul rate (FLOP/s) and device-to-device copy bandwidth (read+write bytes/s)."""
    dev = device.torch_device
    rates = {}
    if args.matmul_tflops:
        rates.update(matmul_flops=args.matmul_tflops * 1e12, matmul_how="given with --matmul-tflops")
    else:
        n = args.matmul_n
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        ms = timer(lambda: torch.matmul(a, b, out=c))
        rates.update(matmul_flops=2 * n ** 3 / (ms * 1e-3), matmul_how=f"torch.matmul {n}x{n}x{n}")
        del a, b, c
    if args.copy_gbps:
        rates.update(copy_bytes=args.copy_gbps * 1e9, copy_how="given with --copy-gbps")
    else:
        nbytes = int(args.copy_mib * 2 ** 20)
        src = torch.randn(nbytes // 4, device=dev, dtype=torch.float32)
        dst = torch.empty_like(src)
        ms = timer(lambda: dst.copy_(src))
        rates.update(copy_bytes=2 * src.numel() * 4 / (ms * 1e-3),
                     copy_how=f"copy_ of {args.copy_mib:g} MiB, counting read+write")
        del src, dst
    device.cleanup()
    rates["matmul_tflops"] = rates["matmul_flops"] / 1e12
    rates["copy_gbps"] = rates["copy_bytes"] / 1e9
    return rates
