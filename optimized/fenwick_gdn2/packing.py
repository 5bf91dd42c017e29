"""Index tensors of a packed row (``cu_seqlens``): how the kernels find each sequence's chunks.

A packed row holds N sequences back to back (``B = 1``); each keeps its own chunk grid of 64
tokens from its first token (its last chunk may be partial). The chunks of all sequences, in
order, form the packed grid of ``NT = Σ_i ceil(T_i / 64)`` chunks. fla's chunk-parallel pieces
take ``cu_seqlens`` and ``chunk_indices`` (``[NT, 2]``: sequence, local chunk index; the layout
of fla's ``prepare_chunk_indices``, built here from the host copy of cu_seqlens that validation
already read) and index every per-chunk tensor (``h``, ``dh``) by the packed grid's
chunk index; the scan (one program per sequence) also needs ``chunk_offsets`` (``[N + 1]``:
the packed grid index of each sequence's first chunk).

The last chunks of all sequences form a second packed row (``last_chunks``): the pass that
splits each sequence's final own state by level runs on it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from optimized.checks import contiguous_cu_seqlens

CHUNK = 64


@dataclass(frozen=True)
class Packing:
    """A packed row: ``cu_seqlens [N + 1]`` (int32 or int64, the row's device) and its host copy
    ``bounds``, ``chunk_indices [NT, 2]``, ``chunk_offsets [N + 1]`` (both in cu_seqlens' dtype).
    ``rows`` (int64 ``[T]``, or None): for a row gathered from another packed row
    (``last_chunks``), where each of its tokens sits there."""
    cu_seqlens: torch.Tensor
    bounds: tuple[int, ...]
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def n_seqs(self) -> int:
        return len(self.bounds) - 1

    @property
    def n_chunks(self) -> int:
        """``NT``, the chunks of the packed grid."""
        return self.chunk_indices.shape[0]

    @property
    def max_len(self) -> int:
        """The longest sequence's length."""
        return max(e - s for s, e in zip(self.bounds[:-1], self.bounds[1:]))

    def fla(self) -> dict:
        """The keyword arguments fla's pieces take for this row."""
        return dict(cu_seqlens=self.cu_seqlens, chunk_indices=self.chunk_indices)


def _check_bounds(cu_seqlens: torch.Tensor, bounds: list[int]):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise TypeError("cu_seqlens must be a 1-D torch.Tensor [N + 1]")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must have dtype torch.int32 or torch.int64, got {cu_seqlens.dtype}")
    if not isinstance(bounds, (list, tuple)):
        raise TypeError(f"bounds must be cu_seqlens' host copy (a list of ints), got {type(bounds).__name__}")
    if len(bounds) != cu_seqlens.shape[0] or len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"bounds must be cu_seqlens' {cu_seqlens.shape[0]} entries from 0, got {len(bounds)}")
    if any(e <= s for s, e in zip(bounds[:-1], bounds[1:])):
        raise ValueError("bounds (cu_seqlens) must be strictly increasing: every sequence holds a token")


def packing(cu_seqlens: torch.Tensor, bounds: list[int]) -> Packing:
    """The ``Packing`` of a checked ``cu_seqlens`` whose host copy is ``bounds`` (``[0, T_1, …, T]``,
    the list ``reference.validation.check_cu_seqlens`` returns; no further host sync)."""
    _check_bounds(cu_seqlens, bounds)
    counts = [-(-(e - s) // CHUNK) for s, e in zip(bounds[:-1], bounds[1:])]
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)
    n_seqs = len(counts)
    device, dtype = cu_seqlens.device, cu_seqlens.dtype
    counts_t = torch.tensor(counts, device=device)
    offsets_t = torch.tensor(offsets, device=device, dtype=dtype)
    seq = torch.repeat_interleave(torch.arange(n_seqs, device=device), counts_t, output_size=offsets[-1])
    local = torch.arange(offsets[-1], device=device) - offsets_t[seq]
    chunk_indices = torch.stack([seq, local], dim=1).to(dtype)
    return Packing(contiguous_cu_seqlens(cu_seqlens), tuple(bounds), chunk_indices, offsets_t)


def last_chunks(p: Packing) -> Packing:
    """The packed row of every sequence's last chunk, in order; its ``rows`` are the tokens'
    positions in ``p``'s row."""
    if not isinstance(p, Packing):
        raise TypeError(f"p must be a Packing, got {type(p).__name__}")
    bounds = p.bounds
    starts = [s + CHUNK * ((e - s - 1) // CHUNK) for s, e in zip(bounds[:-1], bounds[1:])]
    tail_bounds = [0]
    for t0, e in zip(starts, bounds[1:]):
        tail_bounds.append(tail_bounds[-1] + e - t0)
    device = p.cu_seqlens.device
    tail_cu = torch.tensor(tail_bounds, device=device, dtype=p.cu_seqlens.dtype)
    lens = torch.tensor([b - a for a, b in zip(tail_bounds[:-1], tail_bounds[1:])], device=device)
    shift = torch.tensor([t0 - a for t0, a in zip(starts, tail_bounds[:-1])], device=device)
    rows = torch.arange(tail_bounds[-1], device=device) + torch.repeat_interleave(shift, lens,
                                                                                output_size=tail_bounds[-1])
    return replace(packing(tail_cu, tail_bounds), rows=rows)

