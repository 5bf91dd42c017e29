"""Building and measuring one workload: random inputs on the device, a warm-up (where
Triton and fla autotune, timed on its own), ``do_bench`` timings of forward, backward and
forward+backward, and the peak memory of one forward+backward; with ``--graph`` also the
forward's and the step's replays as captured CUDA graphs (``bench.cuda_graph``).

:func:`measure_workload` returns a measurement dict (the :data:`MEASURED` fields); any
exception (OOM included) lands in its ``error`` field and never stops the run. With
``--param-dtype auto`` a nested workload whose op rejects the run dtype for its scheme
parameters is measured once more with float32 parameters (:func:`param_dtypes`).
"""
from __future__ import annotations

import dataclasses
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from bench.harness import Hooks
from bench.plan import DTYPES, Workload
from reference.schemes import get_scheme

GIB = 2 ** 30
MEASURED = ("param_dtype", "query_counts", "intervals", "param_elements", "warmup_s", "fwd_ms",
            "bwd_ms", "fwdbwd_ms", "fwd_host_ms", "fwdbwd_host_ms", "fwd_graph_ms", "fwdbwd_graph_ms",
            "peak_gib", "peak_extra_gib", "finite", "error")
HOST_REPS = 11      # launches from an idle device per host time (their median)


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

    # n as each scheme declares it (its query axis, or what its probe returns), never a parameter's name
    counts = [get_scheme(lv.scheme).query_count(lv.params, w.H, w.K, w.V) for lv in levels]
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


def host_ms(fn: Callable, dev, reps: int = HOST_REPS) -> float:
    """Median host time of one call of ``fn`` launched from an idle device (``dev.sync()`` before
    each, none inside the timing): what the CPU spends issuing its kernels. Near the call's device
    time it says the call is host-paced: its time then follows the host's speed, not the GPU's."""
    times = []
    for _ in range(reps):
        dev.sync()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    dev.sync()
    return 1e3 * statistics.median(times)


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
            m["fwd_host_ms"] = host_ms(forward, dev)
            m["fwdbwd_host_ms"] = host_ms(lambda: grads(forward()), dev)
        except Exception as e:  # noqa: BLE001
            errors.append(describe("host timing", e))
        if hooks.graph is not None:     # --graph: the device's time of captured calls (bench.cuda_graph)
            for key, fn in (("fwd_graph_ms", forward), ("fwdbwd_graph_ms", lambda: grads(forward()))):
                try:
                    m[key] = hooks.graph(fn, timer)
                except Exception as e:  # noqa: BLE001
                    errors.append(describe(f"graph capture ({key.split('_')[0]})", e))
                dev.cleanup()
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

