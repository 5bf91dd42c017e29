"""Root test configuration: GPU per worker, device mode, float32-accurate dots, pinned autotuners, Hypothesis profile.

Runs before any test module imports a kernel: each pytest-xdist worker first
pins its own GPU (``ngdn.gpu_workers``, round-robin over the visible GPUs); on
CUDA it asks for float32-accurate dots (tight float32 tolerances; fla's as three
TF32 products, ``NGDN_F32_DOTS``, see ``optimized.triton_mode``) and pins every
Triton autotuner to one config; without CUDA ``optimized`` switches Triton to
its interpreter.
"""
import os
import time

from ngdn import gpu_workers

# First, before anything touches CUDA (``optimized`` asks torch.cuda.is_available()).
WORKER_DEVICE = gpu_workers.pin_worker_device()

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
os.environ.setdefault("NGDN_IEEE_F32", "1")
os.environ.setdefault("NGDN_F32_DOTS", "tf32x3")

from optimized import triton_mode  # noqa: E402

MODE = triton_mode.configure()

# One torch thread for the whole suite: the per-token CPU references issue thousands of
# tiny ops, and intra-op threads spinning against each other (pytest -n on 2 cores) made
# them ~60x slower.
torch.set_num_threads(1)

from ngdn import compile_clock, strategies  # noqa: E402

strategies.register_profiles()
PROFILE = strategies.load_profile(cuda=MODE == triton_mode.CUDA)


def pytest_report_header(config):
    f32 = os.environ.get("TRITON_F32_DEFAULT", "unset (tf32 dots)") if MODE == triton_mode.CUDA else "exact"
    lines = [f"ngdn: device mode {MODE}, hypothesis profile {PROFILE}, float32 dots: {f32}"]
    workers = len(config.getoption("tx", None) or []) if config.getoption("dist", "no") != "no" else 0
    gpus = gpu_workers.report_line(os.environ, workers) if MODE == triton_mode.CUDA else None
    return lines + [gpus] if gpus else lines


_LOG_START = time.monotonic()


def pytest_runtest_logreport(report):
    """With ``NGDN_TEST_LOG=FILE``, append each test's outcome and duration as it finishes
    (JSON lines, written by the controlling process only). Unlike ``--durations`` this
    survives a suite that is cut off by a time limit, so a GPU run always says which tests
    failed and which were slow."""
    path = os.environ.get("NGDN_TEST_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # a passed setup or teardown only when it took a second or more (module fixtures)
    if report.when != "call" and report.passed and report.duration < 1.0:
        return
    import json

    # "end_s": seconds since this conftest was imported (before the precompile); "worker": the xdist worker:
    # together they give each worker's timeline (where a cold run's end waited)
    entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
             "duration_s": round(report.duration, 3), "end_s": round(time.monotonic() - _LOG_START, 2)}
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker:
        entry["worker"] = worker
    entry.update((k, v) for k, v in report.user_properties if k in ("compile_s", "kernels_compiled", "compiled"))
    if report.failed:
        entry["message"] = report.longreprtext[-3000:]
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def pytest_configure(config):
    """``-n`` without ``--dist``: schedule by work stealing (pytest-xdist >= 3.2). The compiling
    tests take minutes and the rest seconds; with plain ``load`` one worker can end up holding
    several compiling tests while the others idle."""
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
    measured long to the front of the workers' shares (``ngdn.suite_order``). The order is a pure
    function of the collected items and the worker count (every xdist worker must collect the
    same order)."""
    from ngdn.compile_buckets import spread_evenly

    items[:] = spread_evenly(items, lambda item: item.get_closest_marker("compiles") is not None)
    # On CUDA under xdist, then: the tests the last cold run measured as long start first, one per
    # worker (``ngdn.suite_order``): started late, their ends paced the run.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if MODE == triton_mode.CUDA and workers > 1:
        from ngdn import suite_order

        seconds = suite_order.load_durations()
        items[:] = suite_order.longest_first(items, lambda item: seconds.get(item.nodeid, 0.0), workers)


if MODE == triton_mode.CUDA and compile_clock.install():
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        """Each test's Triton compile time in its report (``NGDN_TEST_LOG`` records it)."""
        compile_clock.reset()
        yield
        seconds, kernels = compile_clock.read()
        item.user_properties += [("compile_s", round(seconds, 2)), ("kernels_compiled", kernels),
                                 ("compiled", compile_clock.compiled())]


if MODE == triton_mode.CUDA:
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
    (``ngdn.suite_precompile``; whole-suite runs only, ``NGDN_PRECOMPILE=0|1`` decides)."""
    from ngdn import suite_precompile

    if MODE != triton_mode.CUDA or not suite_precompile.wanted(session.config):
        return
    import time

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    log = reporter.write_line if reporter is not None else print
    start = time.monotonic()
    # no unit past 150 s and none after 150 s: the phase never holds the run longer than that
    done = suite_precompile.run_pool(time_limit=150.0, deadline=150.0, log=log)
    ok = sum(status == "ok" for status, _ in done.values())
    log(f"[ngdn precompile] {ok}/{len(done)} units compiled in {time.monotonic() - start:.0f} s "
        "(NGDN_PRECOMPILE=0 skips this)")
