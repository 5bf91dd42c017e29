"""Spread pytest-xdist workers over the visible GPUs, one GPU per worker, round-robin.

Without this every worker of ``pytest -n auto`` opens CUDA device 0 and the other
GPUs of the machine sit idle. Worker ``gw<i>`` gets entry ``i mod N`` of the
visible device list, by setting its own ``CUDA_VISIBLE_DEVICES`` to that single
entry before anything in the worker touches CUDA (the CUDA runtime reads the
variable once, when it initialises). The suite plugin (``suite.plugin``) calls
``pin_worker_device()`` first thing, before ``optimized`` asks
``torch.cuda.is_available()``.

The visible device list is, in order of precedence:

1. the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (indices or GPU UUIDs,
   kept as written; an empty value means no GPU);
2. ``NGDN_WORKER_DEVICES``, which the controller (the process without
   ``PYTEST_XDIST_WORKER``) exports when ``CUDA_VISIBLE_DEVICES`` is unset: it
   counts the GPUs with ``torch.cuda.device_count()`` and the workers, spawned
   later by the controller, inherit the list. Workers never count GPUs
   themselves: that would touch CUDA before the pin.

``torch.cuda.device_count()`` is safe in the controller: before CUDA is
initialised it counts through NVML and caches nothing (torch caches the count
only once CUDA is initialised), and the controller never changes its own
``CUDA_VISIBLE_DEVICES``, so its count stays right.

The chosen entry is also written to ``NGDN_WORKER_DEVICE`` for reports.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, MutableMapping

WORKER_ID = "PYTEST_XDIST_WORKER"
VISIBLE = "CUDA_VISIBLE_DEVICES"
HANDOFF = "NGDN_WORKER_DEVICES"  # controller -> workers: the device list it counted
CHOSEN = "NGDN_WORKER_DEVICE"  # the entry a worker pinned, for reports

_WORKER_ID_FORMAT = re.compile(r"gw(\d+)")


def parse_devices(value: str) -> list[str]:
    """Comma-separated device entries, blanks stripped and empty entries dropped."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def visible_devices(environ: MutableMapping[str, str], count: int | None = None) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else the
    controller's ``NGDN_WORKER_DEVICES``, else indices ``0..count-1`` (``count``
    from ``torch.cuda.device_count()``, controller only), else none."""
    if VISIBLE in environ:
        return parse_devices(environ[VISIBLE])
    if HANDOFF in environ:
        return parse_devices(environ[HANDOFF])
    return [str(index) for index in range(count or 0)]


def worker_index(worker_id: str) -> int:
    """``"gw3"`` -> 3. Any other form is an error, not a silent device 0."""
    match = _WORKER_ID_FORMAT.fullmatch(worker_id)
    if match is None:
        raise ValueError(f"{WORKER_ID}={worker_id!r} is not a pytest-xdist worker id of the form 'gw<integer>'; "
                         "cannot choose this worker's GPU")
    return int(match.group(1))


def device_for_worker(worker_id: str, devices: list[str]) -> str | None:
    """Round-robin: worker ``gw<i>`` gets ``devices[i % len(devices)]``; None without devices."""
    index = worker_index(worker_id)
    return devices[index % len(devices)] if devices else None


def _torch_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def pin_worker_device(environ: MutableMapping[str, str] = os.environ,
                      count_devices: Callable[[], int] = _torch_device_count) -> str | None:
    """In an xdist worker, restrict CUDA to this worker's GPU; returns the entry chosen.

    In the controller (no worker id) nothing is pinned: when ``CUDA_VISIBLE_DEVICES``
    is unset it counts the GPUs (``count_devices``) and exports them to the workers as
    ``NGDN_WORKER_DEVICES``; otherwise it changes nothing. Returns None in the
    controller and when there is no GPU. Must run before anything touches CUDA.
    """
    worker_id = environ.get(WORKER_ID)
    if not worker_id:
        if VISIBLE not in environ:
            environ[HANDOFF] = ",".join(visible_devices({}, count=count_devices()))
        return None
    device = device_for_worker(worker_id, visible_devices(environ))
    if device is not None:
        environ[VISIBLE] = device
        environ[CHOSEN] = device
    return device


def workers_per_device(workers: int, devices: int) -> str:
    """``"4"`` for 8 workers on 2 GPUs; ``"2-3"`` for 5 on 2 (round-robin gives the first ones more)."""
    fewest, extra = divmod(workers, devices)
    return str(fewest) if extra == 0 else f"{fewest}-{fewest + 1}"


def report_line(environ: MutableMapping[str, str], workers: int) -> str | None:
    """The controller's header line: the GPUs workers are spread over and how many per GPU.
    None without GPUs; without workers (no ``-n``) only the visible list."""
    devices = visible_devices(environ)
    if not devices:
        return None
    source = VISIBLE if VISIBLE in environ else "torch.cuda.device_count()"
    line = f"ngdn: GPUs {','.join(devices)} (from {source})"
    if workers:
        line += f"; {workers} workers, {workers_per_device(workers, len(devices))} per GPU, round-robin"
    return line
