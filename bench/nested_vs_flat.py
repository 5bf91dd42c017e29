"""Nested vs flat GDN-2 on one GPU: the four figures of the design note.

Nested GDN-2 with ``L`` levels of ``H`` heads (``optimized.nested.chunk_nested_gdn2``)
against a flat GDN-2 holding the same recurrent state: fla's ``chunk_gdn2``
(``optimized.gdn2.chunk_gdn2``) with ``L·H`` heads, same ``B, T, K, V``, same dtype,
forward and backward. Four sweeps, one run:

1. ``depth``:  training cost (forward, backward, forward+backward, nested/flat) vs
   ``L = 2..6`` at head dims 64 and 128 (query ladder ``min(K, 16·2^(ℓ-1))``);
2. ``batch``:  the same vs batch size at fixed tokens per batch (``B·T = 32768``);
3. peak memory of one forward+backward vs depth (measured on the ``depth`` rows);
4. ``ladder``: the query ladder vs a uniform 16 queries per level.

Timings are ``triton.testing.do_bench`` medians. Every configuration is warmed
once first (that is where Triton/fla autotune), and the warm-up is reported on
its own, never inside a timing. Every row also gets a floor (``bench.floors``):
FLOPs and minimum bytes turned into times with the bf16 matmul rate and copy
bandwidth measured at the start of the run; ``x_floor = time / floor``.

Outputs (one folder, default ``results/<date>-<gpu>/``): ``results.csv``,
``results.md``, ``fig1_depth.png``, ``fig2_batch.png``, ``fig3_memory.png``,
``fig4_ladder.png`` and ``meta.json``; each starts with (or embeds) the date, the
GPU and the torch/triton/fla versions. The CSV and Markdown are rewritten after
every measured configuration, so ``--resume`` continues a run that was cut off.

    python -m bench.nested_vs_flat --quick          # < 5 min of device time
    python -m bench.nested_vs_flat                  # all four figures
    python -m bench.nested_vs_flat --configs 'depth-K128-*' --out results/x
    python -m bench.nested_vs_flat --list           # the plan, no GPU needed
    python -m bench.nested_vs_flat --replot --out results/x   # tables and PNGs from a CSV

Entry point for ``ngdn bench``: :func:`main`. Tests drive :func:`run` with
stand-in ops, timer and device (:class:`Hooks`).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import fnmatch
import gc
import json
import math
import os
import platform
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bench import floors

# --- what the design note and the next performance issue ask for ---------------------

TARGETS = (
    "forward+backward <= 0.6x flat at L >= 4 (head dim 128)",
    "forward <= 1.0x flat",
    "peak memory <= 0.35x flat at L = 4",
)
ANCHORS = (
    "forward 1.3-1.8x flat",
    "forward+backward 1.03x flat at head dim 128, 5 levels",
    "peak memory 1/2 of flat at 4 levels, 1/3 at 6",
)

SWEEPS = ("depth", "batch", "ladder")
IMPLS = ("nested", "flat")
UNIFORM_QUERIES = 16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
GIB = 2 ** 30

COLUMNS = [
    "sweep", "config", "impl", "queries", "L", "B", "T", "H", "heads", "K", "V",
    "dtype", "param_dtype", "query_counts", "intervals", "param_elements",
    "warmup_s", "fwd_ms", "bwd_ms", "fwdbwd_ms", "peak_gib", "peak_extra_gib",
    "fwd_gflop", "bwd_gflop", "fwd_min_mb", "bwd_min_mb",
    "fwd_floor_ms", "bwd_floor_ms", "fwdbwd_floor_ms",
    "fwd_x_floor", "bwd_x_floor", "fwdbwd_x_floor",
    "fwd_vs_flat", "bwd_vs_flat", "fwdbwd_vs_flat", "peak_vs_flat", "peak_extra_vs_flat",
    "finite", "error",
]
INT_COLUMNS = {"L", "B", "T", "H", "heads", "K", "V", "param_elements"}
STR_COLUMNS = {"sweep", "config", "impl", "queries", "dtype", "param_dtype", "query_counts",
               "intervals", "error"}
MEASURED = ("param_dtype", "query_counts", "intervals", "param_elements", "warmup_s", "fwd_ms",
            "bwd_ms", "fwdbwd_ms", "peak_gib", "peak_extra_gib", "finite", "error")
SKIPPED = "skipped"


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


def do_bench_timer(warmup_ms: float, rep_ms: float) -> Callable[[Callable], float]:
    """``fn -> median ms`` with ``triton.testing.do_bench`` (L2 flushed before every run)."""
    from triton.testing import do_bench

    return lambda fn: float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def stderr_log(message: str):
    print(message, file=sys.stderr, flush=True)


@dataclass
class Hooks:
    """Everything :func:`run` calls out to; ``None`` means the real thing.

    ``nested_op``/``flat_op`` have the signatures of ``optimized.nested.chunk_nested_gdn2``
    and ``optimized.gdn2.chunk_gdn2``; ``make_levels``/``query_counts`` those of
    ``reference.nested``; ``timer(fn) -> ms``; ``device`` a :class:`CudaDevice`-like object.
    """
    nested_op: Callable | None = None
    flat_op: Callable | None = None
    make_levels: Callable | None = None
    query_counts: Callable | None = None
    timer: Callable[[Callable], float] | None = None
    device: object | None = None
    log: Callable[[str], None] = stderr_log

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


# --- inputs ------------------------------------------------------------------------------

@dataclass
class Built:
    """A workload ready to run: ``forward() -> o``, the leaves that get gradients, ``do``."""
    forward: Callable[[], torch.Tensor]
    inputs: list
    do: torch.Tensor
    info: dict


def _activations(gen, dev, dtype, B, T, heads, K, V, q_levels=None):
    """GDN-2 activations as in ``ngdn.inputs``/``ngdn.nested_inputs`` (drawn on the device in
    float32, then cast): q ~ N(0,1), k unit-norm, g = logsigmoid(N + 2.5), b, w = σ(N)."""
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32)

    def leaf(x):
        return x.to(dtype).detach().requires_grad_(True)

    q_shape = (B, T, heads, K) if q_levels is None else (B, T, heads, q_levels, K)
    return {
        "q": leaf(rnd(*q_shape)),
        "k": leaf(F.normalize(rnd(B, T, heads, K), dim=-1)),
        "v": leaf(rnd(B, T, heads, V)),
        "g": leaf(F.logsigmoid(rnd(B, T, heads, K) + 2.5)),
        "b": leaf(torch.sigmoid(rnd(B, T, heads, K))),
        "w": leaf(torch.sigmoid(rnd(B, T, heads, V))),
    }


def build_flat(w: Workload, args, hooks: Hooks, **_) -> Built:
    dev, dtype = hooks.device.torch_device, DTYPES[args.dtype]
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    x = _activations(gen, dev, dtype, w.B, w.T, w.heads, w.K, w.V)
    do = torch.randn(w.B, w.T, w.heads, w.V, generator=gen, device=dev, dtype=torch.float32).to(dtype)
    op = hooks.flat_op

    def forward():
        return op(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"])[0]

    return Built(forward, list(x.values()), do, {"param_dtype": "", "query_counts": "", "intervals": "",
                                                  "param_elements": 0})


def build_nested(w: Workload, args, hooks: Hooks, param_dtype: torch.dtype) -> Built:
    dev, dtype = hooks.device.torch_device, DTYPES[args.dtype]
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    x = _activations(gen, dev, dtype, w.B, w.T, w.H, w.K, w.V, q_levels=w.L)
    x["r"] = torch.randn(w.B, w.T, w.H, w.L, generator=gen, device=dev, dtype=torch.float32) \
        .to(dtype).detach().requires_grad_(True)
    do = torch.randn(w.B, w.T, w.H, w.V, generator=gen, device=dev, dtype=torch.float32).to(dtype)
    # make_levels draws on the CPU (seeded, float64); the parameters are then cast and moved.
    levels = hooks.make_levels(w.L, w.H, w.K, w.V, scheme=args.scheme, query_counts=list(w.query_counts),
                               generator=torch.Generator().manual_seed(args.seed + 1))
    params = []
    for i, level in enumerate(levels):
        moved = {name: p.detach().to(device=dev, dtype=param_dtype).requires_grad_(True)
                 for name, p in level.params.items()}
        if dataclasses.is_dataclass(level):
            levels[i] = dataclasses.replace(level, params=moved)
        else:
            level.params = moved
        params += list(moved.values())
    op = hooks.nested_op

    def forward():
        return op(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], x["r"], levels)[0]

    counts = [int(lv.params["Q"].shape[-2]) if "Q" in lv.params else w.K for lv in levels]
    info = {"param_dtype": str(param_dtype).replace("torch.", ""),
            "query_counts": "-".join(map(str, counts)),
            "intervals": "-".join(str(int(lv.interval)) for lv in levels),
            "param_elements": int(sum(p.numel() for p in params))}
    return Built(forward, list(x.values()) + params, do, info)


# --- measuring one workload ---------------------------------------------------------------

def describe(phase: str, e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
        return f"{phase}: OOM ({text[:160]})"
    return f"{phase}: {type(e).__name__}: {text[:200]}"


def _empty_measurement() -> dict:
    return {k: None for k in MEASURED} | {"error": ""}


def _all_finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


def measure(build: Callable[[], Built], hooks: Hooks, progress: Callable[[str], None]) -> dict:
    """Warm up (autotune) and time one workload; errors (OOM included) land in ``error``."""
    m = _empty_measurement()
    try:
        built = build()
    except Exception as e:  # noqa: BLE001
        m["error"] = describe("build", e)
        hooks.device.cleanup()
        return m
    m.update(built.info)
    try:
        _measure_built(built, m, hooks, progress)
    finally:
        del built
        hooks.device.cleanup()
    return m


def _measure_built(built: Built, m: dict, hooks: Hooks, progress):
    dev, timer = hooks.device, hooks.timer
    forward, inputs, do = built.forward, built.inputs, built.do

    def grads(o, retain=False):
        return torch.autograd.grad(o, inputs, do, retain_graph=retain, allow_unused=True)

    # Warm-up: the first forward and backward autotune every kernel for this shape key.
    t0 = time.perf_counter()
    try:
        o = forward()
        dev.sync()
    except Exception as e:  # noqa: BLE001
        m["error"] = describe("forward", e)
        m["warmup_s"] = time.perf_counter() - t0
        return
    backward_ok = True
    try:
        gs = grads(o)
        dev.sync()
        m["finite"] = _all_finite([o, *gs])
        del gs
    except Exception as e:  # noqa: BLE001
        m["error"] = describe("backward", e)
        m["finite"] = _all_finite([o])
        backward_ok = False
    del o
    m["warmup_s"] = time.perf_counter() - t0
    progress(f"autotune/warm-up: {m['warmup_s']:.1f} s")

    errors = [m["error"]] if m["error"] else []
    try:
        m["fwd_ms"] = timer(forward)
    except Exception as e:  # noqa: BLE001
        errors.append(describe("forward timing", e))
    if backward_ok:
        try:
            o = forward()
            m["bwd_ms"] = timer(lambda: grads(o, retain=True))
            del o
        except Exception as e:  # noqa: BLE001
            errors.append(describe("backward timing", e))
        try:
            m["fwdbwd_ms"] = timer(lambda: grads(forward()))
        except Exception as e:  # noqa: BLE001
            errors.append(describe("forward+backward timing", e))
        try:
            base = dev.memory_begin()
            gs = grads(forward())
            peak = dev.memory_peak()
            del gs
            m["peak_gib"] = peak / GIB
            m["peak_extra_gib"] = (peak - base) / GIB
        except Exception as e:  # noqa: BLE001
            errors.append(describe("peak memory", e))
    m["error"] = "; ".join(errors)


def param_dtypes(args) -> list[torch.dtype]:
    """Scheme-parameter dtypes to try, in order: ``--param-dtype auto`` is the run dtype and,
    if the op rejects that with a dtype error, float32 once."""
    first = DTYPES[args.dtype if args.param_dtype in ("auto", "run") else args.param_dtype]
    return [first, torch.float32] if args.param_dtype == "auto" and first != torch.float32 else [first]


def measure_workload(w: Workload, args, hooks: Hooks, progress) -> dict:
    if w.impl == "flat":
        return measure(lambda: build_flat(w, args, hooks), hooks, progress)
    first, *fallback = param_dtypes(args)
    m = measure(lambda: build_nested(w, args, hooks, first), hooks, progress)
    if fallback and m["fwd_ms"] is None and re.match(r"forward: (ValueError|TypeError): .*dtype", m["error"] or ""):
        progress(f"op rejected {first} parameters ({m['error']}); retrying with float32 parameters")
        m = measure(lambda: build_nested(w, args, hooks, fallback[0]), hooks, progress)
    return m


# --- rows: measurements, floors, ratios ---------------------------------------------

def make_row(cfg: Config, w: Workload, m: dict, dtype: str) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(sweep=cfg.sweep, config=cfg.id, impl=w.impl, queries=w.queries, L=w.L, B=w.B, T=w.T,
               H=w.H, heads=w.heads, K=w.K, V=w.V, dtype=dtype)
    row.update({k: m.get(k) for k in MEASURED})
    if w.impl == "nested" and not row["query_counts"]:
        row["query_counts"] = "-".join(map(str, w.query_counts))
    return row


def _row_order(row: dict) -> tuple:
    """Sweep, head dim, depth, batch; nested before flat, ladder before uniform."""
    sweep = SWEEPS.index(row["sweep"]) if row["sweep"] in SWEEPS else len(SWEEPS)
    return (sweep, row["K"], row["L"], row["B"], IMPLS.index(row["impl"]), row["queries"] != "ladder")


def _key_of_row(row: dict) -> tuple:
    if row["impl"] == "flat":
        return ("flat", row["B"], row["T"], row["heads"], row["K"], row["V"])
    counts = tuple(int(n) for n in str(row["query_counts"]).split("-") if n)
    return ("nested", row["B"], row["T"], row["H"], row["K"], row["V"], row["L"], counts)


def _ratio(a, b):
    if a is None or b is None or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def finalize(rows: list[dict], rates: dict, args) -> list[dict]:
    """Fill the floor and nested/flat columns of every row (in place; returns ``rows``)."""
    itemsize = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    flat_by_shape = {}
    for row in rows:
        if row["impl"] == "flat" and row["fwd_ms"] is not None:
            flat_by_shape[(row["B"], row["T"], row["heads"], row["K"], row["V"])] = row
    for row in rows:
        B, T, H, K, V, L = (row[c] for c in ("B", "T", "H", "K", "V", "L"))
        if row["impl"] == "flat":
            cost = floors.flat_cost(B, T, row["heads"], K, V, itemsize)
        else:
            counts = [int(n) for n in str(row["query_counts"]).split("-") if n]
            intervals = ([int(f) for f in str(row["intervals"]).split("-") if f] if row["intervals"]
                         else [2 ** i for i in range(L - 1)])
            p_dtype = DTYPES.get(row["param_dtype"] or args.dtype, DTYPES[args.dtype])
            cost = floors.nested_cost(B, T, H, K, V, counts, intervals, itemsize,
                                      torch.empty((), dtype=p_dtype).element_size(), scheme=args.scheme,
                                      param_elements=row["param_elements"] or None)
        fl = floors.floors(cost, rates["matmul_flops"], rates["copy_bytes"])
        row.update(fwd_gflop=cost.fwd_flops / 1e9, bwd_gflop=cost.bwd_flops / 1e9,
                   fwd_min_mb=cost.fwd_bytes / 1e6, bwd_min_mb=cost.bwd_bytes / 1e6,
                   fwd_floor_ms=fl.fwd_ms, bwd_floor_ms=fl.bwd_ms, fwdbwd_floor_ms=fl.fwdbwd_ms)
        for p in ("fwd", "bwd", "fwdbwd"):
            row[f"{p}_x_floor"] = _ratio(row[f"{p}_ms"], row[f"{p}_floor_ms"])
        flat = flat_by_shape.get((B, T, L * H, K, V)) if row["impl"] == "nested" else None
        for p in ("fwd", "bwd", "fwdbwd", "peak", "peak_extra"):
            unit = "ms" if p in ("fwd", "bwd", "fwdbwd") else "gib"
            row[f"{p}_vs_flat"] = _ratio(row[f"{p}_{unit}"], flat[f"{p}_{unit}"]) if flat else None
    return rows


# --- outputs ---------------------------------------------------------------------------------

def _fmt(x, digits=4) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{digits}g}"
    return str(x)


def write_csv(path: Path, rows: list[dict], header: list[str]):
    with open(path, "w", newline="") as f:
        for line in header:
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c), 6) for c in COLUMNS})


def read_csv(path: Path) -> list[dict]:
    """Rows of a results.csv written by :func:`write_csv`, with their types back."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = []
    for raw in csv.DictReader(lines):
        row = {}
        for c in COLUMNS:
            v = raw.get(c, "")
            if c in STR_COLUMNS:
                row[c] = v or ("" if c in ("error", "queries") else None)
            elif v == "":
                row[c] = None
            elif c == "finite":
                row[c] = v == "True"
            elif c in INT_COLUMNS:
                row[c] = int(float(v))
            else:
                row[c] = float(v)
        rows.append(row)
    return rows


def _md_table(header: Sequence[str], rows: list[Sequence]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return out


def _ms(x):
    return "" if x is None else f"{x:.3f}"


def _x(x):
    return "" if x is None else f"{x:.2f}x"


def _gib(x):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _status(value, ok: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if ok else "not met"


def _index(rows):
    """(sweep, config, impl, queries) -> row."""
    return {(r["sweep"], r["config"], r["impl"], r["queries"] or ""): r for r in rows}


def _pairs(rows, sweep):
    """(nested row, flat row) per config of a nested-vs-flat sweep, in plan order."""
    idx = _index(rows)
    seen, out = set(), []
    for r in rows:
        if r["sweep"] == sweep and r["config"] not in seen:
            seen.add(r["config"])
            out.append((idx.get((sweep, r["config"], "nested", "ladder")),
                        idx.get((sweep, r["config"], "flat", ""))))
    return out


def target_rows(rows: list[dict]) -> tuple[list, list]:
    """(targets, anchors) as Markdown table rows: what, where, measured, status."""
    depth = [n for n, _ in _pairs(rows, "depth") if n is not None]
    targets, anchors = [], []
    for n in depth:
        if n["K"] == 128 and n["L"] >= 4:
            v = n["fwdbwd_vs_flat"]
            targets.append((TARGETS[0], f"L={n['L']}, K={n['K']}", _x(v), _status(v, v is not None and v <= 0.6)))
    fwd = [(n["fwd_vs_flat"], n) for n in depth if n["fwd_vs_flat"] is not None]
    if fwd:
        worst, n = max(fwd, key=lambda t: t[0])
        targets.append((TARGETS[1], f"worst over depth rows: L={n['L']}, K={n['K']}", _x(worst),
                        _status(worst, worst <= 1.0)))
    else:
        targets.append((TARGETS[1], "depth rows", "", "not measured"))
    for n in depth:
        if n["L"] == 4:
            v = n["peak_vs_flat"]
            targets.append((TARGETS[2], f"L=4, K={n['K']}", _x(v), _status(v, v is not None and v <= 0.35)))
    if fwd:
        lo, hi = min(v for v, _ in fwd), max(v for v, _ in fwd)
        anchors.append((ANCHORS[0], "range over depth rows", f"{lo:.2f}x - {hi:.2f}x"))
    for n in depth:
        if n["K"] == 128 and n["L"] == 5:
            anchors.append((ANCHORS[1], f"L=5, K={n['K']}", _x(n["fwdbwd_vs_flat"])))
    for n in depth:
        if n["L"] in (4, 6):
            anchors.append((ANCHORS[2], f"L={n['L']}, K={n['K']} (design note: {'0.50' if n['L'] == 4 else '0.33'}x)",
                            _x(n["peak_vs_flat"])))
    return targets, anchors


def write_markdown(path: Path, rows: list[dict], header: list[str], plots: list[str]):
    out = [f"# {header[0]}", ""] + [f"- {line}" for line in header[1:]] + [""]
    out += ["Times are do_bench medians in ms (forward; backward alone on a kept graph; one "
            "forward+backward step). `x floor` = time / floor (bench/floors.py: max(FLOPs / matmul "
            "rate, min bytes / copy bandwidth) per pass). Ratios are nested / flat GDN-2 with L·H heads. "
            "Peak memory is torch.cuda.max_memory_allocated over one forward+backward, inputs included; "
            "`extra` counts only what the step allocates on top of its inputs.", ""]
    targets, anchors = target_rows(rows)
    out += ["## Targets (the next performance issue works toward them; this run only measures)", ""]
    out += _md_table(("target", "where", "measured", "status"), targets) + [""]
    out += ["Design note anchors:", ""]
    out += _md_table(("anchor", "where", "measured"), anchors) + [""]

    errors: dict[str, str] = {}   # message -> label; the tables show labels, "Errors" the messages

    def eref(*rows_):
        labels = []
        for r in rows_:
            for text in _split_errors((r or {}).get("error")):
                if text:
                    labels.append(errors.setdefault(text, f"E{len(errors) + 1}"))
        return " ".join(dict.fromkeys(labels))

    def cost_table(sweep, first_col):
        body = []
        for n, f in _pairs(rows, sweep):
            r = n or f
            lead = {"depth": f"{r['L']}", "batch": f"{r['B']} x {r['T']}"}[sweep]
            body.append((lead, r["K"], (n or {}).get("query_counts") or "",
                         _ms(n and n["fwd_ms"]), _ms(n and n["bwd_ms"]), _ms(n and n["fwdbwd_ms"]),
                         _ms(f and f["fwd_ms"]), _ms(f and f["bwd_ms"]), _ms(f and f["fwdbwd_ms"]),
                         _x(n and n["fwd_vs_flat"]), _x(n and n["bwd_vs_flat"]), _x(n and n["fwdbwd_vs_flat"]),
                         _x(n and n["fwdbwd_x_floor"]), _x(f and f["fwdbwd_x_floor"]),
                         eref(n, f)))
        return _md_table((first_col, "K", "queries", "nested fwd", "nested bwd", "nested f+b", "flat fwd",
                          "flat bwd", "flat f+b", "fwd ratio", "bwd ratio", "f+b ratio", "nested f+b x floor",
                          "flat f+b x floor", "error"), body)

    if any(r["sweep"] == "depth" for r in rows):
        out += [f"## 1. Training cost vs depth (B={_first(rows, 'depth', 'B')}, T={_first(rows, 'depth', 'T')}, "
                f"H={_first(rows, 'depth', 'H')})", ""] + cost_table("depth", "L") + [""]
    if any(r["sweep"] == "batch" for r in rows):
        out += [f"## 2. Training cost vs batch size at fixed tokens per batch (L={_first(rows, 'batch', 'L')}, "
                f"H={_first(rows, 'batch', 'H')})", ""] + cost_table("batch", "B x T") + [""]
    if any(r["sweep"] == "depth" for r in rows):
        body = [(n["L"], n["K"], _gib(n["peak_gib"]), _gib(f and f["peak_gib"]), _x(n["peak_vs_flat"]),
                 _gib(n["peak_extra_gib"]), _gib(f and f["peak_extra_gib"]), _x(n["peak_extra_vs_flat"]))
                for n, f in _pairs(rows, "depth") if n is not None]
        out += ["## 3. Peak memory of one forward+backward vs depth (GiB)", ""]
        out += _md_table(("L", "K", "nested", "flat", "ratio", "nested extra", "flat extra", "extra ratio"), body)
        out += [""]
    if any(r["sweep"] == "ladder" for r in rows):
        idx = _index(rows)
        body = []
        for cfg in dict.fromkeys(r["config"] for r in rows if r["sweep"] == "ladder"):
            a = idx.get(("ladder", cfg, "nested", "ladder"))
            u = idx.get(("ladder", cfg, "nested", f"uniform{UNIFORM_QUERIES}"))
            r = a or u
            body.append((r["L"], r["K"], (a or {}).get("query_counts") or "", (u or {}).get("query_counts") or "",
                         _ms(a and a["fwd_ms"]), _ms(u and u["fwd_ms"]), _ms(a and a["fwdbwd_ms"]),
                         _ms(u and u["fwdbwd_ms"]), _x(_ratio(a and a["fwd_ms"], u and u["fwd_ms"])),
                         _x(_ratio(a and a["bwd_ms"], u and u["bwd_ms"])),
                         _x(_ratio(a and a["fwdbwd_ms"], u and u["fwdbwd_ms"])),
                         eref(a, u)))
        out += [f"## 4. Query ladder vs uniform {UNIFORM_QUERIES} queries per level (nested only)", ""]
        out += _md_table(("L", "K", "ladder", "uniform", "ladder fwd", "uniform fwd", "ladder f+b", "uniform f+b",
                          "fwd ladder/uniform", "bwd ladder/uniform", "f+b ladder/uniform", "error"), body) + [""]
    body = [(r["config"], r["impl"] + (f"/{r['queries']}" if r["queries"] else ""), r["heads"],
             _fmt(r["fwd_gflop"]), _fmt(r["fwd_min_mb"]), _ms(r["fwd_floor_ms"]), _x(r["fwd_x_floor"]),
             _ms(r["bwd_floor_ms"]), _x(r["bwd_x_floor"]), _ms(r["fwdbwd_floor_ms"]), _x(r["fwdbwd_x_floor"]),
             _fmt(r["finite"]))
            for r in rows]
    out += ["## Floors (every row)", ""]
    out += _md_table(("config", "impl", "heads", "fwd GFLOP", "fwd min MB", "fwd floor", "fwd x floor",
                      "bwd floor", "bwd x floor", "f+b floor", "f+b x floor", "finite"), body) + [""]
    body = [(r["config"], r["impl"] + (f"/{r['queries']}" if r["queries"] else ""),
             "" if r["warmup_s"] is None else f"{r['warmup_s']:.1f}") for r in rows]
    out += ["## Autotune / warm-up (s; one forward+backward, not part of any timing; "
            "repeated shapes reuse the first measurement)", ""]
    out += _md_table(("config", "impl", "warm-up s"), body) + [""]
    for r in rows:
        eref(r)
    if errors:
        out += ["## Errors (labels used in the tables above)", ""]
        out += _md_table(("label", "error", "rows"), [
            (label, text, ", ".join(f"{r['config']} {r['impl']}" + (f"/{r['queries']}" if r["queries"] else "")
                                    for r in rows if text in _split_errors(r["error"])))
            for text, label in errors.items()]) + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    path.write_text("\n".join(out))


def _split_errors(text: str | None) -> list[str]:
    """A row's ``error`` is phase messages joined by "; " (messages may contain "; " too)."""
    return [e for e in re.split(r"; (?=(?:build|forward|backward|peak memory|skipped)\b)", text or "") if e]


def _first(rows, sweep, col):
    for r in rows:
        if r["sweep"] == sweep:
            return r[col]
    return ""


def write_plots(out: Path, rows: list[dict], header: list[str], log) -> list[str]:
    """The four PNGs; skipped with a warning when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        message = "matplotlib is not installed: skipping the PNG plots (pip install matplotlib)"
        warnings.warn(message, stacklevel=2)
        log(f"warning: {message}")
        return []
    footer = " | ".join(header[1:3]) + "\n" + header[3]
    metadata = {"Title": header[0], "Description": "\n".join(header)}
    written = []

    def save(fig, name):
        fig.text(0.01, 0.005, footer, fontsize=6, color="0.35")
        fig.tight_layout(rect=(0, 0.045, 1, 1))
        fig.savefig(out / name, dpi=120, metadata=metadata)
        plt.close(fig)
        written.append(name)

    def series(pairs, xkey, side, col):
        pts = [(r[xkey], r[col]) for r in (p[side] for p in pairs) if r is not None and r[col] is not None
               and not (isinstance(r[col], float) and math.isnan(r[col]))]
        return [p[0] for p in pts], [p[1] for p in pts]

    def cost_figure(sweep, xkey, xlabel, name, logx=False):
        pairs = _pairs(rows, sweep)
        if not pairs:
            return
        Ks = sorted({(n or f)["K"] for n, f in pairs})
        fig, axes = plt.subplots(2, len(Ks), figsize=(6 * len(Ks), 8), squeeze=False)
        for j, K in enumerate(Ks):
            pk = [p for p in pairs if (p[0] or p[1])["K"] == K]
            ax = axes[0][j]
            for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                ax.plot(*series(pk, xkey, 0, col), "o-", color=color, label=f"nested {col[:-3]}")
                ax.plot(*series(pk, xkey, 1, col), "s--", color=color, label=f"flat {col[:-3]}")
            ax.plot(*series(pk, xkey, 0, "fwdbwd_floor_ms"), ":", color="C2", label="nested f+b floor")
            ax.plot(*series(pk, xkey, 1, "fwdbwd_floor_ms"), ":", color="0.5", label="flat f+b floor")
            ax.set_yscale("log")
            ax.set_title(f"{sweep}: head dim {K}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("ms (do_bench median)")
            ax.legend(fontsize=7)
            ax = axes[1][j]
            for col, color in (("fwd_vs_flat", "C0"), ("bwd_vs_flat", "C1"), ("fwdbwd_vs_flat", "C2")):
                ax.plot(*series(pk, xkey, 0, col), "o-", color=color, label=col.replace("_vs_flat", ""))
            xs = sorted({(n or f)[xkey] for n, f in pk})
            ax.axhline(1.0, color="C0", ls="--", lw=0.8, label="target fwd <= 1.0x")
            if K == 128 and any((n or f)["L"] >= 4 for n, f in pk):
                lo = 4 if sweep == "depth" else xs[0]
                ax.hlines(0.6, lo, max(lo, xs[-1]), color="C2", ls="--", lw=0.8,
                          label="target f+b <= 0.6x (L>=4, K=128)")
            if sweep == "depth" and K == 128:
                ax.plot([5], [1.03], "k*", label="design note f+b 1.03x (L=5)")
            for a in (axes[0][j], ax):
                if logx:
                    a.set_xscale("log", base=2)
                a.set_xticks(xs)
                a.set_xticklabels([str(x) for x in xs])
                a.minorticks_off()
            ax.set_xlabel(xlabel)
            ax.set_ylabel("nested / flat")
            ax.legend(fontsize=7)
        save(fig, name)

    cost_figure("depth", "L", "levels L", "fig1_depth.png")
    cost_figure("batch", "B", "batch size B (B*T fixed)", "fig2_batch.png", logx=True)

    pairs = [p for p in _pairs(rows, "depth") if p[0] is not None]
    if pairs:
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(12, 4.5))
        for j, K in enumerate(sorted({n["K"] for n, _ in pairs})):
            pk = [p for p in pairs if p[0]["K"] == K]
            a0.plot(*series(pk, "L", 0, "peak_gib"), "o-", color=f"C{j}", label=f"nested K={K}")
            a0.plot(*series(pk, "L", 1, "peak_gib"), "s--", color=f"C{j}", label=f"flat K={K}")
            a1.plot(*series(pk, "L", 0, "peak_vs_flat"), "o-", color=f"C{j}", label=f"K={K}")
        a1.plot([4], [0.35], "rv", label="target <= 0.35x at L=4")
        a1.plot([4, 6], [0.5, 1 / 3], "k*", label="design note 1/2 at L=4, 1/3 at L=6")
        Ls = sorted({n["L"] for n, _ in pairs} | {4, 6})
        for a in (a0, a1):
            a.set_xticks(Ls)
        a0.set_xlabel("levels L")
        a0.set_ylabel("peak GiB (forward+backward)")
        a0.legend(fontsize=7)
        a1.set_xlabel("levels L")
        a1.set_ylabel("nested / flat peak memory")
        a1.legend(fontsize=7)
        save(fig, "fig3_memory.png")

    ladder = [r for r in rows if r["sweep"] == "ladder"]
    if ladder:
        Ks = sorted({r["K"] for r in ladder})
        fig, axes = plt.subplots(2, len(Ks), figsize=(6 * len(Ks), 8), squeeze=False)
        uniform = f"uniform{UNIFORM_QUERIES}"
        for j, K in enumerate(Ks):
            ax, axr = axes[0][j], axes[1][j]
            by = {(r["queries"], r["L"]): r for r in ladder if r["K"] == K}
            Ls = sorted({L for _, L in by})
            for q, style in (("ladder", "o-"), (uniform, "s--")):
                for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                    pts = [(L, by[(q, L)][col]) for L in Ls if (q, L) in by and by[(q, L)][col] is not None]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{q} {col[:-3]}")
            for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                pts = [(L, _ratio(by.get(("ladder", L), {}).get(col), by.get((uniform, L), {}).get(col))) for L in Ls]
                pts = [p for p in pts if p[1] is not None]
                axr.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=col[:-3])
            axr.axhline(1.0, color="0.5", lw=0.8)
            ax.set_title(f"query ladder vs uniform {UNIFORM_QUERIES}: head dim {K}")
            ax.set_ylabel("ms (do_bench median)")
            axr.set_ylabel(f"ladder / uniform {UNIFORM_QUERIES}")
            for a in (ax, axr):
                a.set_xticks(Ls)
                a.set_xlabel("levels L")
                a.legend(fontsize=7)
        save(fig, "fig4_ladder.png")
    return written


# --- the run ------------------------------------------------------------------------------

def default_out(device_name: str, quick: bool) -> Path:
    date = _dt.date.today().isoformat()
    return Path("results") / f"{date}-{_slug(device_name)}{'-quick' if quick else ''}"


def run(args, hooks: Hooks | None = None, argv: Sequence[str] = (), notes: Sequence[str] = ()) -> int:
    """Measure the plan of ``args`` and write every output; returns an exit code."""
    hooks = (hooks or Hooks()).resolve(args)
    log = hooks.log
    plan = make_plan(args, hooks.query_counts)
    if not plan:
        log("nothing to run: no configuration matches --sweeps/--configs")
        return 2
    out = Path(args.out) if args.out else default_out(hooks.device.name, args.quick)
    out.mkdir(parents=True, exist_ok=True)
    meta = collect_meta(args, hooks.device, argv, notes)
    t_start = time.perf_counter()

    def elapsed():
        return time.perf_counter() - t_start

    cache: dict[tuple, dict] = {}
    csv_path = out / "results.csv"
    in_plan = {(cfg.sweep, cfg.id, w.impl, w.queries) for cfg in plan for w in cfg.workloads}
    earlier = []   # --resume: rows of configurations outside this plan stay in the results
    if args.resume and csv_path.exists():
        for row in read_csv(csv_path):
            if row["fwd_ms"] is not None and not row["error"]:
                cache[_key_of_row(row)] = {k: row[k] for k in MEASURED}
            if (row["sweep"], row["config"], row["impl"], row["queries"] or "") not in in_plan:
                earlier.append(row)
        log(f"resume: {len(cache)} measurements kept from {csv_path}")

    todo_workloads = list({w.key: w for c in plan for w in c.workloads if w.key not in cache}.values())
    todo = [w.key for w in todo_workloads]
    if todo and args.precompile_workers != 0 and isinstance(hooks.device, CudaDevice):
        from bench import precompile

        pre = precompile.run_workers(todo_workloads, args, args.precompile_workers, log)
        meta["notes"].append(
            f"precompile: {pre['groups']} compile groups on {pre['workers']} parallel worker processes in "
            f"{pre['seconds']:.0f} s (bench/precompile.py: kernels into Triton's disk cache, configs launched "
            f"once, no tuning result kept; warmup_s below is then autotuning proper)"
            + (f"; FAILED: {', '.join(pre['failed'])}" if pre["failed"] else ""))

    log(f"measuring bf16 matmul rate and copy bandwidth on {hooks.device.name} ...")
    rates = measure_rates(args, hooks.timer, hooks.device)
    log(f"  matmul {rates['matmul_tflops']:.4g} TFLOP/s, copy {rates['copy_gbps']:.4g} GB/s (read+write)")
    header = header_lines(meta, rates)

    log(f"{len(plan)} configurations, {len(todo)} workloads to measure -> {out}")
    aborted = None

    def rows_so_far():
        rows = list(earlier)
        for cfg in plan:
            for w in cfg.workloads:
                if w.key in cache:
                    rows.append(make_row(cfg, w, cache[w.key], args.dtype))
        return finalize(sorted(rows, key=_row_order), rates, args)

    done = 0
    for cfg in plan:
        for w in cfg.workloads:
            if w.key in cache:
                continue
            done += 1
            tag = f"[{done}/{len(todo)}] {cfg.id} {w.label} (B={w.B}, T={w.T}, heads={w.heads}, K={w.K})"
            if aborted or (args.time_budget is not None and elapsed() > args.time_budget):
                reason = aborted or f"time budget of {args.time_budget:g} s used up"
                cache[w.key] = _empty_measurement() | {"error": f"{SKIPPED}: {reason}"}
                log(f"{tag}: {SKIPPED} ({reason})")
                continue
            log(f"{tag} ... elapsed {elapsed():.0f} s")

            def progress(message, tag=tag):
                log(f"{tag}: {message} (elapsed {elapsed():.0f} s)")

            m = measure_workload(w, args, hooks, progress)
            cache[w.key] = m
            summary = ", ".join(f"{p} {m[f'{p}_ms']:.3f} ms" for p in ("fwd", "bwd", "fwdbwd")
                                if m[f"{p}_ms"] is not None)
            log(f"{tag}: {summary or 'no timing'}"
                + (f", peak {m['peak_gib']:.2f} GiB" if m["peak_gib"] is not None and not math.isnan(m["peak_gib"])
                   else "")
                + (f"; ERROR {m['error']}" if m["error"] else "") + f" (elapsed {elapsed():.0f} s)")
            if m["error"] and not hooks.device.healthy():
                aborted = f"CUDA context lost after {cfg.id} {w.label}"
                log(f"{aborted}: skipping the rest")
            rows = rows_so_far()
            write_csv(csv_path, rows, header)
            write_markdown(out / "results.md", rows, header, [])

    rows = rows_so_far()
    write_csv(csv_path, rows, header)
    plots = [] if args.no_plots else write_plots(out, rows, header, log)
    write_markdown(out / "results.md", rows, header, plots)
    (out / "meta.json").write_text(json.dumps(meta | {"rates": rates, "plots": plots}, indent=2, default=str))
    targets, _ = target_rows(rows)
    print("\n".join(header))
    for what, where, value, status in targets:
        print(f"target: {what} [{where}]: {value or '-'} ({status})")
    n_err = sum(1 for r in rows if r["error"])
    log(f"done in {elapsed():.0f} s: {len(rows)} rows ({n_err} with errors) -> {out}")
    return 3 if aborted else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ngdn bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results folder (default results/<date>-<gpu>/, '-quick' appended in --quick)")
    p.add_argument("--quick", action="store_true",
                   help="few configs (L 2,4; head dim 128; one batch point; one ladder point), fewer repeats")
    p.add_argument("--sweeps", default=",".join(SWEEPS), help="comma-separated subset of depth,batch,ladder")
    p.add_argument("--configs", help="comma-separated fnmatch patterns on config ids, e.g. 'depth-K128-*,batch-*'")
    p.add_argument("--list", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--resume", action="store_true", help="keep the error-free rows of an existing results.csv")
    p.add_argument("--time-budget", type=float, default=None,
                   help="start no new workload after this many seconds; the rest are marked skipped")
    p.add_argument("-B", "--batch", type=int, default=8)
    p.add_argument("-T", "--tokens", type=int, default=4096)
    p.add_argument("-H", "--heads", type=int, default=16, help="heads per level (flat gets L*H)")
    p.add_argument("--levels", default="2,3,4,5,6")
    p.add_argument("--head-dims", default="64,128", help="K = V values")
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--tokens-per-batch", type=int, default=32768)
    p.add_argument("--batch-levels", type=int, default=4)
    p.add_argument("--batch-head-dim", type=int, default=128)
    p.add_argument("--ladder-levels", default=None, help="default: --levels")
    p.add_argument("--ladder-head-dims", default=None, help="default: --head-dims")
    p.add_argument("--scheme", default="learned", choices=["learned", "merge"])
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--param-dtype", default="auto", choices=["auto", "run", *sorted(DTYPES)],
                   help="scheme parameters: 'run' = --dtype; 'auto' = --dtype, float32 if the op rejects it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=float, default=None, help="do_bench warmup (default 25; quick 10)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench rep (default 200; quick 50)")
    p.add_argument("--matmul-n", type=int, default=8192, help="size of the rate-measuring bf16 matmul")
    p.add_argument("--copy-mib", type=float, default=1024, help="size of the bandwidth-measuring copy")
    p.add_argument("--matmul-tflops", type=float, default=None, help="use this rate instead of measuring")
    p.add_argument("--copy-gbps", type=float, default=None, help="use this bandwidth instead of measuring")
    p.add_argument("--precompile-workers", type=int, default=None,
                   help="parallel processes that compile the kernels before the timed process autotunes "
                        "(default: one per core, at most 12; 0: compile inside the benchmark process)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--replot", action="store_true",
                   help="no measuring: rewrite results.md and the PNGs of --out from its results.csv")
    args = p.parse_args(argv)
    if args.quick:
        defaults = {"levels": "2,4", "head_dims": "128", "batch_sizes": "2", "ladder_levels": "4"}
        for name, value in defaults.items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.warmup_ms = args.warmup_ms if args.warmup_ms is not None else (10.0 if args.quick else 25.0)
    args.rep_ms = args.rep_ms if args.rep_ms is not None else (50.0 if args.quick else 200.0)
    return args


def replot(out: Path, log=stderr_log) -> int:
    """Rewrite ``results.md`` and the PNGs of ``out`` from its ``results.csv`` (no GPU: e.g.
    after a run on a machine without matplotlib)."""
    csv_path = out / "results.csv"
    if not csv_path.exists():
        log(f"--replot: {csv_path} does not exist")
        return 2
    with open(csv_path) as f:
        header = [line[2:].rstrip("\n") for line in f if line.startswith("# ")]
    rows = read_csv(csv_path)
    plots = write_plots(out, rows, header, log)
    write_markdown(out / "results.md", rows, header, plots)
    log(f"replotted {len(rows)} rows -> {out} ({', '.join(plots) or 'no plots'})")
    return 0


def print_plan(plan: list[Config]):
    keys = set()
    for c in plan:
        parts = []
        for w in c.workloads:
            new = w.key not in keys
            keys.add(w.key)
            counts = f" n={'-'.join(map(str, w.query_counts))}" if w.query_counts else ""
            parts.append(f"{w.label}(heads={w.heads}{counts}{'' if new else ', shared'})")
        print(f"{c.id:<24} B={c.B:<3} T={c.T:<6} H={c.H} K=V={c.K}: " + ", ".join(parts))
    print(f"{len(plan)} configurations, {len(keys)} distinct workloads")


def main(argv: Sequence[str] | None = None) -> int:
    """``ngdn bench [options]`` / ``python -m bench.nested_vs_flat [options]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        if not args.out:
            print("ngdn bench: --replot needs --out DIR (the folder holding results.csv)", file=sys.stderr)
            return 2
        return replot(Path(args.out))
    if args.list:
        from reference.nested import default_query_counts

        try:
            print_plan(make_plan(args, default_query_counts))
        except ValueError as e:
            print(f"ngdn bench: {e}", file=sys.stderr)
            return 2
        return 0
    notes = prepare_environment()
    if not torch.cuda.is_available():
        print("ngdn bench needs a CUDA GPU (do_bench, peak memory); use --list to see the plan", file=sys.stderr)
        return 2
    try:
        return run(args, Hooks(), argv=argv, notes=notes)
    except ValueError as e:   # a bad --sweeps / --tokens-per-batch combination
        print(f"ngdn bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
