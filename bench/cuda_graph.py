"""A call captured in a CUDA graph and timed by its replays: the device's time for the call with the
host's launches taken out.

A step whose host takes longer to launch it than the GPU takes to run it is host-paced
(``bench.report.HOST_PACED``): its ``do_bench`` time follows the host, and the same op moved 27 %
between rounds of one process at head dim 64 (``results/2026-12-04-nested-k64-host-pace-h200/``).
A graph's replay launches every kernel of the capture at once, so its time is the kernels' and the
gaps the GPU itself leaves. Timing both ops of a comparison this way gives their device ratio; the
eager ``do_bench`` ratio stays what an uncaptured training loop sees.

Capture needs a call without host syncs: the optimized ops' finiteness check must be off
(``optimized.checks.finite_checks(False)``), and every autotuner, plan table and launch memo must
have been filled by earlier calls (the warm-ups below run on a side stream first, as torch's CUDA
graph notes ask). A call that cannot be captured raises; the caller records the error.
"""
from __future__ import annotations

from typing import Callable

import torch

WARMUPS = 3         # eager calls on a side stream before the capture


def capture(fn: Callable[[], object], warmups: int = WARMUPS) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph (after ``warmups`` eager calls on a side stream); returns
    the graph's ``replay``. What ``fn`` allocates during the capture lives in the graph's pool and
    is rewritten by every replay. Raises ``RuntimeError`` without CUDA or when the capture fails."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graph capture needs a CUDA device")
    if warmups < 1:
        raise ValueError(f"warmups must be at least 1 (autotuners and tables fill there), got {warmups}")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def graph_ms(fn: Callable[[], object], timer: Callable[[Callable], float], warmups: int = WARMUPS) -> float:
    """``timer`` (e.g. ``do_bench``'s median) of the replays of ``fn``'s graph."""
    return timer(capture(fn, warmups))
