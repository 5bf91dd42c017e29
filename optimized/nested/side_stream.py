"""A second CUDA stream for work that does not wait on the chain in front of it.

The nested op's upper levels run latency-bound chains (the promote scans: one program per
(batch, head, V block), each a sequential loop over firings). Work of level 0 that none of those
chains reads (its output in the forward, its intra-chunk ``dAv`` in the backward) may run beside
them on this stream (``Pieces.level0_overlap``, opt-in: on the H200 it gained nothing, since a scan
program holds its SM's whole register file and nothing else fits beside it; bench/NOTES.md).
``fork`` starts the side stream after what the current stream has queued; ``join`` makes the
current stream wait for it and marks the tensors the side stream made as used by the current
stream (the caching allocator then does not hand their memory to the side stream while the
current stream may still read them).

Without CUDA (or with ``enabled`` false) both are no-ops and the work runs in line, in the same
order: the same kernels on the same inputs, so the results are bit for bit those of the in-line
run (``tests/test_level0_overlap.py``).
"""
from __future__ import annotations

import contextlib

import torch

_STREAMS: dict = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """This process's side stream on ``device`` (one per device, made once)."""
    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=key)
    return _STREAMS[key]


@contextlib.contextmanager
def fork(enabled: bool, device: torch.device):
    """Run the block's kernels on the side stream, after everything the current stream has queued
    so far; yields the stream (None when not ``enabled`` or not on CUDA: the block runs in line).
    Tensors the block reads must stay referenced until ``join``."""
    if not enabled or torch.device(device).type != "cuda":
        yield None
        return
    stream = side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield stream


def join(stream, *made) -> None:
    """The current stream waits for ``stream``'s work; each tensor in ``made`` (made on ``stream``)
    is marked as used by the current stream. No-op for ``stream`` None."""
    if stream is None:
        return
    current = torch.cuda.current_stream(stream.device)
    current.wait_stream(stream)
    for t in made:
        if t is not None:
            t.record_stream(current)
