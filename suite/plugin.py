"""The test suite's pytest plugin: GPU per worker, device mode, float32-accurate dots, pinned autotuners,
Hypothesis profile, the GPU memory plan, the per-test log, the precompile pool, the run order and the
compile clock.

Loaded by the root ``conftest.py`` (``pytest_plugins``), so pytest imports it while it reads that
conftest: before it imports any test module, and so before anything imports a kernel. Its import does
the ordering work, top to bottom: each pytest-xdist worker first pins its own GPU (``suite.gpu_workers``,
round-robin over the visible GPUs); then ``optimized.triton_mode.configure()`` chooses the device mode
before fla or a kernel module is imported: on CUDA it asks for float32-accurate dots (tight float32
tolerances; fla's as three TF32 products, ``NGDN_F32_DOTS``, see ``optimized.triton_mode``) and pins
every Triton autotuner to one config; without CUDA it switches Triton to its interpreter.
"""
import os
import time

from suite import gpu_workers

# First, before anything touches CUDA (``optimized`` asks torch.cuda.is_available(), and the CUDA
# runtime reads CUDA_VISIBLE_DEVICES once, when it initialises): this worker's GPU.
WORKER_DEVICE = gpu_workers.pin_worker_device()

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
os.environ.setdefault("NGDN_IEEE_F32", "1")
os.environ.setdefault("NGDN_F32_DOTS", "tf32x3")

# The device mode before fla or any kernel module is imported (without CUDA the Triton interpreter
# must be chosen first); the imports below this line may import kernels.
from optimized import triton_mode  # noqa: E402

MODE = triton_mode.configure()

# One torch thread for the whole suite: the per-token CPU references issue thousands of
# tiny ops, and intra-op threads spinning against each other (pytest -n on 2 cores) made
# them ~60x slower.
torch.set_num_threads(1)

from ngdn import strategies  # noqa: E402
from suite import compile_clock, gpu_memory  # noqa: E402

strategies.register_profiles()
PROFILE = strategies.load_profile(cuda=MODE == triton_mode.CUDA)

# GPU memory (``suite.gpu_memory``): the controller measures each visible GPU's budget once and hands
# it to the workers; each worker holds its allocator to its share of its GPU.
GPU_PLAN = None
GPU_TOTAL_GIB = None
if MODE == triton_mode.CUDA:
    if not os.environ.get(gpu_workers.WORKER_ID) and gpu_memory.BUDGET_ENV not in os.environ:
        _budgets = gpu_memory.controller_budgets(gpu_workers.visible_devices(os.environ))
        if _budgets:
            gpu_memory.export(_budgets)
    GPU_PLAN = gpu_memory.worker_plan()
    GPU_PEAKS = gpu_memory.load_peaks()
    GPU_POOL = (gpu_memory.Pool(os.environ[gpu_memory.POOL_DIR_ENV], os.environ.get(gpu_workers.CHOSEN, "0"),
                                GPU_PLAN.pool)
                if GPU_PLAN is not None and gpu_memory.POOL_DIR_ENV in os.environ else None)


def _hold_to_share():
    """This process's allocator held to its share (a worker, or the one process of a run without
    ``-n``); creates the CUDA context, so never in an xdist controller."""
    global GPU_TOTAL_GIB
    if GPU_PLAN is not None:
        GPU_TOTAL_GIB = torch.cuda.get_device_properties(0).total_memory / gpu_memory.GIB
        torch.cuda.set_per_process_memory_fraction(GPU_PLAN.cap_fraction(GPU_TOTAL_GIB))


if MODE == triton_mode.CUDA and os.environ.get(gpu_workers.WORKER_ID):
    _hold_to_share()


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` on CUDA: as many workers as the CPU cores and every GPU's memory allow
    (``suite.gpu_memory.auto_workers``); elsewhere xdist's own choice (the CPU count)."""
    raw = os.environ.get(gpu_memory.BUDGET_ENV, "")
    if MODE != triton_mode.CUDA or not raw:
        return None
    budgets = [float(b) for b in raw.split(",")]
    return gpu_memory.auto_workers(budgets, len(os.sched_getaffinity(0)), gpu_memory.load_peaks())


def pytest_report_header(config):
    f32 = os.environ.get("TRITON_F32_DEFAULT", "unset (tf32 dots)") if MODE == triton_mode.CUDA else "exact"
    lines = [f"ngdn: device mode {MODE}, hypothesis profile {PROFILE}, float32 dots: {f32}"]
    workers = len(config.getoption("tx", None) or []) if config.getoption("dist", "no") != "no" else 0
    gpus = gpu_workers.report_line(os.environ, workers) if MODE == triton_mode.CUDA else None
    if gpus and os.environ.get(gpu_memory.BUDGET_ENV):
        plan = gpu_memory.plan(float(os.environ[gpu_memory.BUDGET_ENV].split(",")[0]),
                               gpu_memory.workers_on(0, max(workers, 1), len(gpu_workers.visible_devices(os.environ))))
        cap = os.environ.get(gpu_memory.CAP_ENV)
        gpus += (f"; GPU memory: budget {plan.budget:.1f} GiB per GPU (free less {gpu_memory.MARGIN_GIB} GiB"
                 f"{f', capped at {cap} GiB by ' + gpu_memory.CAP_ENV if cap else ''}), share "
                 f"{plan.share:.2f} GiB a worker, pool {plan.pool:.1f} GiB for the tests measured above it")
    return lines + [gpus] if gpus else lines


_LOG_START = time.monotonic()


_MEMORY_SKIPS = []


def pytest_runtest_logreport(report):
    """With ``NGDN_TEST_LOG=FILE``, append each test's outcome and duration as it finishes
    (JSON lines, written by the controlling process only). Unlike ``--durations`` this
    survives a suite that is cut off by a time limit, so a GPU run always says which tests
    failed and which were slow."""
    if report.skipped and "GPU memory:" in str(report.longrepr):
        _MEMORY_SKIPS.append(report.nodeid)
    path = os.environ.get("NGDN_TEST_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # a passed setup or teardown only when it took a second or more (module fixtures)
    if report.when != "call" and report.passed and report.duration < 1.0:
        return
    import json

    # "end_s": seconds since this plugin was imported (before the precompile); "worker": the xdist worker:
    # together they give each worker's timeline (where a cold run's end waited)
    entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
             "duration_s": round(report.duration, 3), "end_s": round(time.monotonic() - _LOG_START, 2)}
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker:
        entry["worker"] = worker
    entry.update((k, v) for k, v in report.user_properties
                 if k in ("compile_s", "kernels_compiled", "compiled", "peak_gib", "borrowed_gib", "memory", "pid"))
    if report.failed:
        entry["message"] = report.longreprtext[-3000:]
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def pytest_configure(config):
    """A run without ``-n`` holds its one process to its share of the GPU. ``-n`` without ``--dist``:
    schedule by work stealing (pytest-xdist >= 3.2). The compiling tests take minutes and the rest
    seconds; with plain ``load`` one worker can end up holding several compiling tests while the
    others idle."""
    if MODE == triton_mode.CUDA and not os.environ.get(gpu_workers.WORKER_ID) \
            and not getattr(config.option, "numprocesses", None):
        _hold_to_share()
    explicit = any(a == "-d" or a.startswith("--dist") for a in config.invocation_params.args)
    if getattr(config.option, "dist", None) == "load" and not explicit:
        try:
            from xdist.scheduler import WorkStealingScheduling  # noqa: F401
        except ImportError:
            return
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    """Spread the tests that compile kernels (marker ``compiles``: one per compile bucket, see
    ``ngdn.compile_buckets``) evenly through the run order; on CUDA under xdist, deal the tests
    measured long to the front of the workers' shares (``suite.order``). The order is a pure
    function of the collected items and the worker count (every xdist worker must collect the
    same order)."""
    from ngdn.compile_buckets import spread_evenly

    items[:] = spread_evenly(items, lambda item: item.get_closest_marker("compiles") is not None)
    # On CUDA under xdist, then: the tests the last cold run measured as long start first, one per
    # worker (``suite.order``): started late, their ends paced the run.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if MODE == triton_mode.CUDA and workers > 1:
        from suite import order

        seconds = order.load_durations()
        items[:] = order.longest_first(items, lambda item: seconds.get(item.nodeid, 0.0), workers)


if MODE == triton_mode.CUDA and compile_clock.install():
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        """Each test's Triton compile time in its report (``NGDN_TEST_LOG`` records it)."""
        compile_clock.reset()
        yield
        seconds, kernels = compile_clock.read()
        item.user_properties += [("compile_s", round(seconds, 2)), ("kernels_compiled", kernels),
                                 ("compiled", compile_clock.compiled())]


def pytest_terminal_summary(terminalreporter):
    """The count of tests skipped for GPU memory (``suite.gpu_memory``), one line."""
    if MODE == triton_mode.CUDA and not os.environ.get(gpu_workers.WORKER_ID):
        cap = os.environ.get(gpu_memory.CAP_ENV)
        terminalreporter.write_line(f"ngdn: {len(set(_MEMORY_SKIPS))} tests skipped for GPU memory"
                                    f"{f' ({gpu_memory.CAP_ENV}={cap})' if cap else ''}")


if MODE == triton_mode.CUDA:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """A test measured above its worker's share (``suite/peaks.json``) borrows the rest from
        its GPU's pool for its run (its cap raised by as much), or is skipped where the pool is too
        small; each test's allocator peak is measured from its start."""
        extra = 0.0
        if GPU_PLAN is not None:
            peak = GPU_PEAKS.get(item.nodeid)
            reason = gpu_memory.skip_reason(item.nodeid, peak, GPU_PLAN) if peak is not None else None
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
            else:
                extra = gpu_memory.extra_needed(peak, GPU_PLAN)
        if extra > 0 and GPU_POOL is not None:
            GPU_POOL.borrow(extra)
            torch.cuda.set_per_process_memory_fraction(GPU_PLAN.cap_fraction(GPU_TOTAL_GIB, extra))
            item.user_properties.append(("borrowed_gib", round(extra, 2)))
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            if extra > 0 and GPU_POOL is not None:
                torch.cuda.empty_cache()
                torch.cuda.set_per_process_memory_fraction(GPU_PLAN.cap_fraction(GPU_TOTAL_GIB))
                GPU_POOL.give_back(extra)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        """The test's allocator peak in its call report (``peak_gib`` in the per-test log); a test
        that ran out of GPU memory says so, with its peak, its share and what to change."""
        if call.when == "call":
            item.user_properties += [("peak_gib", round(torch.cuda.max_memory_reserved() / gpu_memory.GIB, 3)),
                                     ("pid", os.getpid())]
        outcome = yield
        report = outcome.get_result()
        if call.excinfo is not None and gpu_memory.is_out_of_memory(call.excinfo.value):
            text = gpu_memory.out_of_memory_message(item.nodeid, torch.cuda.max_memory_reserved() / gpu_memory.GIB,
                                                    GPU_PLAN, dict(item.user_properties).get("borrowed_gib", 0.0))
            report.sections.append(("ngdn GPU memory", text))
            report.user_properties.append(("memory", text))

    @pytest.fixture(autouse=True)
    def _return_cached_gpu_memory():
        """Hand each test's cached blocks back to the driver: up to 16 workers share one GPU,
        and a kernel that needs much local memory at launch fails with "out of memory" while
        other workers' caching allocators hold the rest (seen on the H200, 2026-11-30)."""
        yield
        torch.cuda.empty_cache()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """On CUDA, before the xdist workers start: compile every compile bucket's kernels once
    (``suite.precompile``; whole-suite runs only, ``NGDN_PRECOMPILE=0|1`` decides)."""
    from suite import precompile

    if MODE != triton_mode.CUDA or not precompile.wanted(session.config):
        return
    import time

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    log = reporter.write_line if reporter is not None else print
    start = time.monotonic()
    # no unit past 150 s and none after 150 s: the phase never holds the run longer than that
    # as many units at a time as the cores and the GPUs' memory allow (``suite.gpu_memory``)
    budgets = [float(b) for b in os.environ.get(gpu_memory.BUDGET_ENV, "").split(",") if b]
    cores = len(os.sched_getaffinity(0))
    jobs = gpu_memory.auto_workers(budgets, cores) if budgets else cores
    done = precompile.run_pool(jobs=jobs, time_limit=150.0, deadline=150.0, log=log)
    ok = sum(status == "ok" for status, _ in done.values())
    log(f"[ngdn precompile] {ok}/{len(done)} units compiled in {time.monotonic() - start:.0f} s "
        "(NGDN_PRECOMPILE=0 skips this)")
