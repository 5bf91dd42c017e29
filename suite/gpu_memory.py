"""GPU memory for the test suite's workers: how many fit, each one's share, and the tests that need more.

On CUDA ``pytest -n auto`` starts as many xdist workers as both the CPU cores and the GPUs' memory
allow, and every worker is held to its share of its GPU, so a test that outgrows its share fails
with PyTorch's out-of-memory error in its own worker, naming itself and its peak, never a
neighbour's allocation.

The numbers, per visible GPU:

- **budget** ``B``: the GPU's free memory when the run starts (``nvidia-smi``), less ``MARGIN_GIB``,
  capped by ``NGDN_GPU_MEMORY_GIB`` (an 80 GB card then stands in for a 24 GB or 40 GB one);
- **share** ``s = CONTEXT_GIB + BASE_GIB``: a worker's CUDA context and Triton modules (not seen by
  PyTorch's allocator) plus what its tests may hold in PyTorch's caching allocator;
- **workers** ``w = ⌊B / s⌋`` (at least 1), all GPUs together at most the CPU cores (``-n auto``),
  or as many as ``-n N`` asks, round-robin over the GPUs (``suite.gpu_workers``);
- **pool** ``P = B − w·s``: the memory above the shares. A test that the last measured run saw above
  ``BASE_GIB`` (``peaks.json``, test id -> GiB, written by ``python -m suite.gpu_memory
  LOG``) borrows ``peak − BASE_GIB`` from its GPU's pool for its run (a lock file per GPU shared
  by its workers; it waits while others hold too much) and its cap is raised by that much. A test
  whose extra need exceeds the whole pool is skipped, naming its measured need and the pool: on a
  card with less memory, or under ``NGDN_GPU_MEMORY_GIB``, such tests are the skips.

Each worker's cap is PyTorch's ``set_per_process_memory_fraction`` (the caching allocator refuses
past it). Each test's peak (``max_memory_reserved``) goes to the per-test log (``NGDN_TEST_LOG``:
``peak_gib``) so the next file is measured, not guessed.
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PEAKS = Path(__file__).resolve().parent / "peaks.json"
CAP_ENV = "NGDN_GPU_MEMORY_GIB"         # the user's cap per GPU, GiB
BUDGET_ENV = "NGDN_GPU_BUDGET_GIB"      # controller -> workers: the budget per GPU it measured, GiB
POOL_DIR_ENV = "NGDN_GPU_POOL_DIR"      # controller -> workers: where the pools' lock files live
GIB = 1024 ** 3
# A worker's memory outside PyTorch's allocator: the CUDA context with torch's and Triton's modules
# loaded and the local memory the driver reserves for kernels that spill (not measured yet: the GPU
# suite's gpu-memory.csv samples each process's use against its tests' allocator peaks).
CONTEXT_GIB = 1.0
# What a test may hold in the caching allocator without borrowing: with 16 workers on an 80 GB card
# (16 × 4 GiB beside a 14 GiB pool) a test's share is larger than the 79 GiB / 16 that ran out
# unshared, where a few tests' peaks met.
BASE_GIB = 3.0
# Left free on each GPU besides the budget: the controller's and other processes' growth.
MARGIN_GIB = 1.0
# Peaks the file keeps (GiB): a test under BASE_GIB never borrows, so only tests above are listed.
RECORD_ABOVE_GIB = BASE_GIB


@dataclass(frozen=True)
class Plan:
    """One GPU's division: ``workers`` workers of ``share`` GiB each and a ``pool`` GiB above them."""
    budget: float
    workers: int
    share: float
    pool: float

    def cap_fraction(self, total: float, extra: float = 0.0) -> float:
        """The fraction of a GPU of ``total`` GiB a worker's allocator may hold: its share less the
        context (which the allocator does not see), plus ``extra`` borrowed."""
        return max(0.0, min(1.0, (self.share - CONTEXT_GIB + extra) / total))


def user_cap(environ=os.environ) -> float | None:
    """``NGDN_GPU_MEMORY_GIB`` as GiB, or None where unset; a ``ValueError`` naming it otherwise."""
    raw = environ.get(CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        cap = float(raw)
    except ValueError:
        raise ValueError(f"{CAP_ENV}={raw!r} is not a number of GiB (e.g. {CAP_ENV}=24)") from None
    if not math.isfinite(cap) or cap <= CONTEXT_GIB:
        raise ValueError(f"{CAP_ENV}={raw!r}: the cap must be a finite number of GiB above one worker's "
                         f"context ({CONTEXT_GIB} GiB)")
    return cap


def budget(free_gib: float, cap: float | None) -> float:
    """The GiB the suite may use on a GPU with ``free_gib`` free: less the margin, capped by ``cap``."""
    room = max(0.0, free_gib - MARGIN_GIB)
    return room if cap is None else min(room, cap)


def workers_fitting(budget_gib: float, share: float = CONTEXT_GIB + BASE_GIB) -> int:
    """How many workers of ``share`` GiB fit one GPU's budget (at least 1: a card smaller than one
    share still runs one worker, whose tests above it are skipped)."""
    return max(1, int(budget_gib // share))


def pool_needed(budget_gib: float, peaks: dict) -> float:
    """The largest extra any measured test needs that can run on this budget at all (its peak and
    a context within it): the pool ``-n auto`` keeps free, so only tests larger than the card skip."""
    fits = [extra_needed(p, plan(budget_gib, 1)) for p in peaks.values() if p + CONTEXT_GIB <= budget_gib]
    return max([0.0] + [e for e in fits])


def auto_workers(budgets: list[float], cores: int, peaks: dict | None = None) -> int:
    """``-n auto`` on CUDA: the workers every GPU's memory fits beside the pool its measured tests
    need (``pool_needed``), at most ``cores`` in all. Round-robin puts ``⌈n / G⌉`` on the first
    GPUs, so the count is G times the smallest fit."""
    if not budgets:
        raise ValueError("auto_workers needs at least one GPU budget")
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    peaks = peaks or {}
    per_gpu = min(workers_fitting(b - pool_needed(b, peaks)) for b in budgets)
    return max(1, min(cores, per_gpu * len(budgets)))


def plan(budget_gib: float, workers_on_gpu: int) -> Plan:
    """One GPU's plan for ``workers_on_gpu`` workers: the standard share where they fit (the rest is
    the pool), else the budget split evenly (no pool; tests above it are skipped)."""
    if workers_on_gpu < 1:
        raise ValueError(f"workers_on_gpu must be at least 1, got {workers_on_gpu}")
    share = CONTEXT_GIB + BASE_GIB
    if workers_on_gpu * share > budget_gib:
        return Plan(budget_gib, workers_on_gpu, budget_gib / workers_on_gpu, 0.0)
    return Plan(budget_gib, workers_on_gpu, share, budget_gib - workers_on_gpu * share)


def workers_on(device_index: int, workers: int, devices: int) -> int:
    """Round-robin: how many of ``workers`` land on GPU number ``device_index`` of ``devices``."""
    return workers // devices + (1 if device_index < workers % devices else 0)


def extra_needed(peak_gib: float | None, plan_: Plan) -> float:
    """GiB a test measured at ``peak_gib`` (allocator) must borrow beyond its worker's share."""
    if peak_gib is None:
        return 0.0
    return max(0.0, peak_gib - (plan_.share - CONTEXT_GIB))


def skip_reason(test: str, peak_gib: float, plan_: Plan) -> str | None:
    """Why ``test`` cannot run under ``plan_`` (its measured extra exceeds the pool), or None."""
    extra = extra_needed(peak_gib, plan_)
    if extra <= plan_.pool + 1e-9:
        return None
    return (f"GPU memory: {test} measured {peak_gib:.1f} GiB (suite/peaks.json); a worker's share "
            f"is {plan_.share - CONTEXT_GIB:.1f} GiB plus at most {plan_.pool:.1f} GiB borrowed on this GPU "
            f"(budget {plan_.budget:.1f} GiB, {plan_.workers} workers): run fewer workers (-n) or raise "
            f"{CAP_ENV}")


def is_out_of_memory(error: BaseException) -> bool:
    """PyTorch's allocator refusing (``torch.OutOfMemoryError``) or a launch that found no memory
    (Triton and the driver say "out of memory")."""
    return type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error).lower()


def out_of_memory_message(test: str, peak_gib: float, plan_: Plan | None, borrowed_gib: float = 0.0) -> str:
    """What a test that ran out of GPU memory is told: its peak, its worker's limit, what to do."""
    if plan_ is None:
        return (f"{test} ran out of GPU memory at an allocator peak of {peak_gib:.2f} GiB; no share was set "
                "(the controller measured no GPU budget)")
    limit = plan_.share - CONTEXT_GIB + borrowed_gib
    return (f"{test} ran out of GPU memory: its allocator peak reached {peak_gib:.2f} GiB against this worker's "
            f"limit of {limit:.2f} GiB (share {plan_.share - CONTEXT_GIB:.2f} GiB + {borrowed_gib:.2f} GiB borrowed; "
            f"budget {plan_.budget:.1f} GiB per GPU, {plan_.workers} workers on it). If the test truly needs more, "
            f"record its peak from a run with fewer workers (python -m suite.gpu_memory LOG rewrites "
            f"suite/peaks.json), and it borrows the rest from the pool")


# --- measuring the GPUs (controller) -------------------------------------------------------------

def free_gib_nvidia_smi(devices: list[str], run=subprocess.run) -> list[float] | None:
    """Free GiB of each entry of ``devices`` (indices or UUIDs, as in ``CUDA_VISIBLE_DEVICES``) by
    ``nvidia-smi``; None where it is absent or its answer names none of them. An entry it does not
    list gets the least free memory of those it does (MIG and such: never more than is there)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = run(["nvidia-smi", "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"],
                  capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    free = {}
    for line in out.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            mib = float(fields[2])
        except ValueError:
            continue
        free[fields[0]] = free[fields[1]] = mib / 1024
    if not free:
        return None
    least = min(free.values())
    return [free.get(d, least) for d in devices]


def controller_budgets(devices: list[str], environ=os.environ, free=free_gib_nvidia_smi) -> list[float] | None:
    """Each visible GPU's budget (GiB), measured once in the controller; None without a reading."""
    gib = free(devices) if devices else None
    if not gib:
        return None
    cap = user_cap(environ)
    return [budget(g, cap) for g in gib]


def export(budgets: list[float], environ=os.environ) -> None:
    """Hand the budgets and a pool directory to the workers (they inherit the environment)."""
    import tempfile

    environ[BUDGET_ENV] = ",".join(f"{b:.3f}" for b in budgets)
    environ.setdefault(POOL_DIR_ENV, tempfile.mkdtemp(prefix="ngdn-gpu-pool-"))


def worker_plan(environ=os.environ) -> Plan | None:
    """In an xdist worker (or a run without workers): its GPU's plan from the controller's budgets,
    the worker count and the worker's index; None where the controller measured nothing."""
    from suite import gpu_workers

    raw = environ.get(BUDGET_ENV, "")
    try:
        budgets = [float(b) for b in raw.split(",") if b.strip()]
    except ValueError:
        return None
    if not budgets:
        return None
    worker_id = environ.get(gpu_workers.WORKER_ID)
    if not worker_id:       # one process (no -n): the whole budget is its share
        return Plan(budgets[0], 1, budgets[0], 0.0)
    workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = gpu_workers.worker_index(worker_id) % len(budgets)
    return plan(budgets[index], workers_on(index, workers, len(budgets)))


# --- the pool: memory borrowed above the shares, per GPU -----------------------------------------

class Pool:
    """The GiB borrowed from one GPU's pool, kept in a JSON file under an exclusive ``flock``: the
    workers of that GPU are separate processes."""

    def __init__(self, directory: str, device: str, size: float, poll_s: float = 0.25):
        self.path = Path(directory) / f"pool-{device.replace('/', '_')}.json"
        self.size, self.poll_s = size, poll_s

    @contextlib.contextmanager
    def _locked(self):
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                text = f.read()
                state = json.loads(text) if text.strip() else {"borrowed": 0.0}
                yield state
                f.seek(0)
                f.truncate()
                f.write(json.dumps(state))
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def borrowed(self) -> float:
        with self._locked() as state:
            return state["borrowed"]

    def try_borrow(self, gib: float) -> bool:
        with self._locked() as state:
            if state["borrowed"] + gib > self.size + 1e-9:
                return False
            state["borrowed"] += gib
            return True

    def borrow(self, gib: float, timeout_s: float = 1800.0) -> float:
        """Borrow ``gib`` (waiting while others hold too much); returns the seconds waited."""
        if gib > self.size + 1e-9:
            raise ValueError(f"cannot borrow {gib:.2f} GiB from a pool of {self.size:.2f} GiB")
        start = time.monotonic()
        while not self.try_borrow(gib):
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {gib:.2f} GiB of GPU memory from the pool")
            time.sleep(self.poll_s)
        return time.monotonic() - start

    def give_back(self, gib: float) -> None:
        with self._locked() as state:
            state["borrowed"] = max(0.0, state["borrowed"] - gib)


# --- the measured peaks --------------------------------------------------------------------------

def load_peaks(path: Path = PEAKS) -> dict:
    """``{test id: GiB}``; empty where the file is missing or unreadable (no test then borrows)."""
    try:
        return {str(k): float(v) for k, v in json.loads(Path(path).read_text())["gib"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def peaks_from_log(log: str) -> dict:
    """The largest ``peak_gib`` per test in a per-test log (``NGDN_TEST_LOG``, plain or ``.gz``)."""
    opener = gzip.open if log.endswith(".gz") else open
    peaks = {}
    with opener(log, "rt") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            peak = entry.get("peak_gib")
            if isinstance(peak, (int, float)):
                peaks[entry["test"]] = max(peaks.get(entry["test"], 0.0), float(peak))
    return peaks


def write_peaks(logs: list[str], path: Path = PEAKS, above: float = RECORD_ABOVE_GIB) -> int:
    """Rewrite ``path`` from per-test logs: the tests that peaked above ``above`` GiB (rounded up to
    0.1 GiB); returns how many."""
    peaks = {}
    for log in logs:
        for test, gib in peaks_from_log(log).items():
            peaks[test] = max(peaks.get(test, 0.0), gib)
    kept = {t: math.ceil(g * 10) / 10 for t, g in sorted(peaks.items()) if g > above}
    Path(path).write_text(json.dumps({
        "about": "GiB each test held at most in PyTorch's caching allocator on CUDA (max_memory_reserved), "
                 f"tests above {above} GiB; written by `python -m suite.gpu_memory LOG...` from per-test logs "
                 "(NGDN_TEST_LOG); read by suite.gpu_memory: these tests borrow above their worker's share",
        "gib": kept}, indent=1, sort_keys=True) + "\n")
    return len(kept)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m suite.gpu_memory TESTS.jsonl[.gz] ...   (rewrites suite/peaks.json "
              "from per-test logs of CUDA runs)")
        return 0 if argv else 2
    n = write_peaks(argv)
    print(f"{PEAKS}: {n} tests above {RECORD_ABOVE_GIB} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
