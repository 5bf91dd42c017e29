"""pytest-xdist workers are spread over the visible GPUs, one each, round-robin (suite.gpu_workers).

CPU-only: every case runs on a plain dict standing in for the environment and a fake
GPU counter, so nothing here touches CUDA or this process's own environment.
"""
import re

import pytest

from suite import gpu_workers
from suite.gpu_workers import device_for_worker, pin_worker_device, visible_devices

WORKERS = [f"gw{i}" for i in range(6)]


def no_count():
    raise AssertionError("a worker, or a controller with CUDA_VISIBLE_DEVICES set, must not count GPUs")


def pinned(environ, worker_ids=WORKERS, count_devices=no_count, pin=pin_worker_device):
    """Start each worker in its own copy of ``environ``, as xdist does; the device each pinned."""
    chosen = []
    for worker_id in worker_ids:
        worker_env = {**environ, "PYTEST_XDIST_WORKER": worker_id}
        device = pin(worker_env, count_devices=count_devices)
        if device is not None:
            assert worker_env["CUDA_VISIBLE_DEVICES"] == worker_env["NGDN_WORKER_DEVICE"] == device
        chosen.append(device)
    return chosen


def assert_round_robin(chosen, devices):
    """Worker i on devices[i % N], and every device used once there are N workers."""
    assert chosen == [devices[i % len(devices)] for i in range(len(chosen))]
    assert set(chosen[:len(devices)]) == set(devices)


def test_workers_alternate_over_the_visible_gpus():
    chosen = pinned({"CUDA_VISIBLE_DEVICES": "2,3"})
    assert chosen == ["2", "3", "2", "3", "2", "3"]
    assert_round_robin(chosen, ["2", "3"])


def test_entries_are_kept_as_written_and_blanks_stripped():
    uuids = ["GPU-8f6e1c2a-0000-1111-2222-333344445555", "GPU-1b2c3d4e-aaaa-bbbb-cccc-ddddeeeeffff"]
    chosen = pinned({"CUDA_VISIBLE_DEVICES": f" {uuids[0]} , {uuids[1]},"}, WORKERS[:3])
    assert chosen == [uuids[0], uuids[1], uuids[0]]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-abc, 7"}) == ["MIG-abc", "7"]


def test_one_gpu_is_every_workers_gpu():
    assert pinned({"CUDA_VISIBLE_DEVICES": "1"}) == ["1"] * len(WORKERS)


@pytest.mark.parametrize("environ", [{"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": " , "},
                                     {"NGDN_WORKER_DEVICES": ""}, {}],
                         ids=["empty", "blank entries", "controller found none", "unset, no handoff"])
def test_without_a_gpu_workers_change_nothing(environ):
    for worker_id in WORKERS:
        worker_env = {**environ, "PYTEST_XDIST_WORKER": worker_id}
        assert pin_worker_device(worker_env, count_devices=no_count) is None
        assert worker_env == {**environ, "PYTEST_XDIST_WORKER": worker_id}


def test_empty_cuda_visible_devices_wins_over_the_handoff():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "", "NGDN_WORKER_DEVICES": "0,1"}, count=2) == []


@pytest.mark.parametrize("environ", [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_controller_with_cuda_visible_devices_leaves_the_environment_alone(environ):
    controller_env = dict(environ)
    assert pin_worker_device(controller_env, count_devices=no_count) is None
    assert controller_env == environ


def test_controller_counts_gpus_and_workers_inherit_the_list():
    controller_env = {"PATH": "/usr/bin"}
    assert pin_worker_device(controller_env, count_devices=lambda: 3) is None
    # the controller itself is not pinned; it only hands the list over
    assert controller_env == {"PATH": "/usr/bin", "NGDN_WORKER_DEVICES": "0,1,2"}
    assert_round_robin(pinned(controller_env), ["0", "1", "2"])


def test_controller_without_gpus_hands_over_an_empty_list():
    controller_env = {}
    pin_worker_device(controller_env, count_devices=lambda: 0)
    assert controller_env == {"NGDN_WORKER_DEVICES": ""}
    assert pinned(controller_env) == [None] * len(WORKERS)


@pytest.mark.parametrize("worker_id", ["gw", "gwx", "1", "gw-1", "gw1.5", "worker3", "gw 2"])
def test_a_worker_id_that_is_not_gw_integer_is_an_error(worker_id):
    with pytest.raises(ValueError, match="gw<integer>"):
        device_for_worker(worker_id, ["0", "1"])
    with pytest.raises(ValueError, match=re.escape(repr(worker_id))):
        pin_worker_device({"PYTEST_XDIST_WORKER": worker_id, "CUDA_VISIBLE_DEVICES": "0"}, count_devices=no_count)


def test_report_line_names_the_gpus_and_workers_per_gpu():
    assert gpu_workers.report_line({"CUDA_VISIBLE_DEVICES": "1,3"}, workers=8) == (
        "ngdn: GPUs 1,3 (from CUDA_VISIBLE_DEVICES); 8 workers, 4 per GPU, round-robin")
    assert gpu_workers.report_line({"NGDN_WORKER_DEVICES": "0,1"}, workers=5).endswith(
        "5 workers, 2-3 per GPU, round-robin")
    assert gpu_workers.report_line({"NGDN_WORKER_DEVICES": "0"}, workers=0) == (
        "ngdn: GPUs 0 (from torch.cuda.device_count())")
    assert gpu_workers.report_line({"CUDA_VISIBLE_DEVICES": ""}, workers=8) is None


# Mutation checks: the assertions above must reject a broken assignment.

def everyone_on_the_first_gpu(environ, count_devices):
    """The bug this module fixes: every worker on device 0."""
    devices = visible_devices(environ)
    if environ.get("PYTEST_XDIST_WORKER") and devices:
        environ["CUDA_VISIBLE_DEVICES"] = environ["NGDN_WORKER_DEVICE"] = devices[0]
        return devices[0]
    return None


def off_by_one(environ, count_devices):
    """gw<i> on device i + 1: still round-robin, but not from the first GPU."""
    devices = visible_devices(environ)
    index = gpu_workers.worker_index(environ["PYTEST_XDIST_WORKER"]) + 1
    environ["CUDA_VISIBLE_DEVICES"] = environ["NGDN_WORKER_DEVICE"] = devices[index % len(devices)]
    return devices[index % len(devices)]


@pytest.mark.mutation
@pytest.mark.parametrize("broken", [everyone_on_the_first_gpu, off_by_one])
def test_round_robin_check_rejects_a_broken_assignment(broken):
    devices = ["2", "3"]
    with pytest.raises(AssertionError):
        assert_round_robin(pinned({"CUDA_VISIBLE_DEVICES": ",".join(devices)}, pin=broken), devices)
