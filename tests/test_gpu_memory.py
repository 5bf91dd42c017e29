"""GPU memory for the suite's workers (``suite.gpu_memory``): the worker count, shares, the pool of
memory borrowed above them and the tests skipped for memory. CPU-only: the GPUs are numbers and a
fake ``nvidia-smi``; nothing touches CUDA."""
import gzip
import json
import multiprocessing
import subprocess

import pytest

from suite import gpu_memory as gm

SHARE = gm.CONTEXT_GIB + gm.BASE_GIB


def test_an_80_gb_card_runs_a_worker_per_core_and_keeps_the_rest_as_pool():
    budget = gm.budget(79.0, None)
    assert budget == 79.0 - gm.MARGIN_GIB
    assert gm.auto_workers([budget], cores=16) == 16
    plan = gm.plan(budget, 16)
    assert plan.share == SHARE and plan.pool == pytest.approx(budget - 16 * SHARE)


def test_the_cap_stands_in_for_a_smaller_card():
    assert gm.user_cap({"NGDN_GPU_MEMORY_GIB": "24"}) == 24.0
    assert gm.budget(79.0, 24.0) == 24.0
    assert gm.auto_workers([24.0], cores=16) == int(24.0 // SHARE) < 16
    assert gm.user_cap({}) is None


@pytest.mark.parametrize("raw", ["24GB", "nan", "0", "-3", "inf"])
def test_a_malformed_cap_is_refused_naming_the_variable(raw):
    with pytest.raises(ValueError, match="NGDN_GPU_MEMORY_GIB"):
        gm.user_cap({"NGDN_GPU_MEMORY_GIB": raw})


def test_auto_keeps_the_pool_the_largest_measured_test_needs():
    """A 12 GiB test on a 24 GiB budget: fewer workers, so it runs instead of being skipped."""
    peaks = {"big": 12.0, "small": 1.0, "too big for the card": 30.0}
    workers = gm.auto_workers([24.0], cores=16, peaks=peaks)
    plan = gm.plan(24.0, workers)
    assert gm.skip_reason("big", 12.0, plan) is None
    assert workers == int((24.0 - (12.0 - gm.BASE_GIB)) // SHARE)
    reason = gm.skip_reason("too big for the card", 30.0, plan)
    assert reason and "30.0 GiB" in reason and "NGDN_GPU_MEMORY_GIB" in reason


def test_several_gpus_count_the_smallest_fit_for_each():
    assert gm.auto_workers([78.0, 10.0], cores=64) == 2 * gm.workers_fitting(10.0)
    assert [gm.workers_on(i, 5, 2) for i in range(2)] == [3, 2]


def test_explicit_workers_above_the_fit_split_the_budget_evenly():
    plan = gm.plan(24.0, 16)
    assert plan.pool == 0 and plan.share == pytest.approx(1.5)
    assert gm.extra_needed(1.0, plan) > 0 and gm.skip_reason("t", 1.0, plan) is not None


def test_cap_fraction_leaves_the_context_out_and_adds_what_was_borrowed():
    plan = gm.plan(78.0, 16)
    assert plan.cap_fraction(80.0) == pytest.approx(gm.BASE_GIB / 80.0)
    assert plan.cap_fraction(80.0, extra=4.0) == pytest.approx((gm.BASE_GIB + 4.0) / 80.0)


def test_worker_plan_reads_the_controllers_budget():
    env = {gm.BUDGET_ENV: "30.000,20.000", "PYTEST_XDIST_WORKER": "gw3", "PYTEST_XDIST_WORKER_COUNT": "5"}
    plan = gm.worker_plan(env)
    assert plan.budget == 20.0 and plan.workers == 2
    assert gm.worker_plan({}) is None
    alone = gm.worker_plan({gm.BUDGET_ENV: "30"})     # no xdist: the whole budget
    assert alone.workers == 1 and alone.share == 30.0 and alone.pool == 0.0


def fake_smi(text):
    return lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=text)


def test_free_memory_read_from_nvidia_smi_by_index_or_uuid(monkeypatch):
    monkeypatch.setattr(gm.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    text = "0, GPU-aaa, 81000\n1, GPU-bbb, 40960\n"
    assert gm.free_gib_nvidia_smi(["1", "GPU-aaa"], run=fake_smi(text)) == [40.0, 81000 / 1024]
    # an entry it does not list (a MIG device, say) gets the least free memory it reports
    assert gm.free_gib_nvidia_smi(["MIG-x"], run=fake_smi(text)) == [40.0]
    assert gm.free_gib_nvidia_smi(["0"], run=fake_smi("garbage\n")) is None
    monkeypatch.setattr(gm.shutil, "which", lambda name: None)
    assert gm.free_gib_nvidia_smi(["0"], run=fake_smi(text)) is None


def _borrow_and_hold(directory, gib, hold_s, out):
    import time

    pool = gm.Pool(directory, "0", size=10.0, poll_s=0.02)
    waited = pool.borrow(gib)
    time.sleep(hold_s)
    pool.give_back(gib)
    out.put(waited)


def test_the_pool_makes_a_second_borrower_wait_until_the_first_gives_back(tmp_path):
    """Two processes of 7 GiB each on a 10 GiB pool: one waits for the other (a lock file, not a
    process-local count)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_borrow_and_hold, args=(str(tmp_path), 7.0, 0.5, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    waits = sorted(out.get(timeout=5) for _ in procs)
    assert waits[0] < 0.3 and waits[1] >= 0.3
    assert gm.Pool(str(tmp_path), "0", size=10.0).borrowed() == 0.0


@pytest.mark.mutation
def test_a_pool_without_its_lock_lets_both_borrow_at_once(tmp_path, monkeypatch):
    """The twin: a pool whose check ignores what others borrowed never makes anyone wait."""
    pool = gm.Pool(str(tmp_path), "0", size=10.0)
    assert pool.try_borrow(7.0) and not pool.try_borrow(7.0)
    pool.give_back(7.0)

    def unlocked(self, gib):
        return True
    monkeypatch.setattr(gm.Pool, "try_borrow", unlocked)
    assert pool.try_borrow(7.0) and pool.try_borrow(7.0)


def test_a_borrow_larger_than_the_pool_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pool of 2.00 GiB"):
        gm.Pool(str(tmp_path), "0", size=2.0).borrow(3.0)


def test_peaks_file_from_per_test_logs(tmp_path):
    log = tmp_path / "tests-cold.jsonl.gz"
    lines = [{"test": "a::x", "when": "call", "peak_gib": 5.01}, {"test": "a::x", "when": "call", "peak_gib": 3.0},
             {"test": "a::y", "when": "call", "peak_gib": 0.2}, {"test": "c", "when": "compile"}]
    with gzip.open(log, "wt") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    out = tmp_path / "peaks.json"
    assert gm.write_peaks([str(log)], out) == 1
    assert gm.load_peaks(out) == {"a::x": 5.1}
    assert gm.load_peaks(tmp_path / "missing.json") == {}


def test_committed_peaks_are_above_the_share():
    assert all(gib > gm.RECORD_ABOVE_GIB for gib in gm.load_peaks().values())


def test_out_of_memory_is_recognised_and_named():
    class OutOfMemoryError(RuntimeError):
        pass
    assert gm.is_out_of_memory(OutOfMemoryError("x"))
    assert gm.is_out_of_memory(RuntimeError("Triton Error [CUDA]: out of memory"))
    assert not gm.is_out_of_memory(ValueError("shape mismatch"))
    text = gm.out_of_memory_message("t::a", 2.5, gm.plan(78.0, 16), borrowed_gib=1.0)
    assert "t::a" in text and "2.50 GiB" in text and "python -m suite.gpu_memory" in text
