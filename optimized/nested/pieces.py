"""The pluggable pieces of the nested op (``Pieces``): the op's choices, gathered in one place.

The default ``Pieces()`` is the production op. A field holds either a piece of the computation
(the schedule, a kernel's launch function, the partial-sum reduction) or a choice the op
supports (block sizes, dot precisions, the probe's gates, whether the probe keeps its
pre-activations). Tests swap a piece for a broken twin or shrink the blocks to reach several
of them on small CPU shapes; benchmarks (``bench/reads_ab.py``) build the supported
alternatives side by side (the PyTorch reads ``reads_torch``, the two-phase reverse scan).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from optimized.nested.level0 import RECOMPUTE
from optimized.nested.plan import make_plan
from optimized.nested.reads_bwd import reads_bwd, reads_bwd_states
from optimized.nested.reads_fwd import reads_fwd
from optimized.nested.reads_torch import reads_router_bwd_torch
from optimized.nested.snapshot_grads import add_snapshot_grads
from optimized.nested.promote_scan import forward_precision, keep_partials, promote_scan_bwd, promote_scan_fwd
from optimized.nested.promote_scan_two_phase import promote_scan_bwd_two_phase
from optimized.nested.state_grad import state_grad_bwd


def _chunk_bounds(tables):
    """Packed sequences: each packed chunk's tokens (the reads kernels index sequences), else None."""
    return None if tables.packed is None else tables.packed.chunk_bounds


def reads_router_fwd(q, r, o0, states, plan, tables, scale, block_v=None):
    """The reads and router kernel (``reads_fwd``) on the plan's device tables."""
    return reads_fwd(q, r, o0, states, tables.read_row, scale, block_v=block_v, chunk_bounds=_chunk_bounds(tables))


def reads_router_bwd(do, q, r, o0, states, plan, tables, scale, dq, block_v=None, states_block_v=None,
                     tokens_blocks=None):
    """Its backward (``reads_bwd``): ``dq`` levels ≥ 1 in place; returns ``(dr, do0, dstates_of)``
    (``do0`` in q's dtype, what level 0's backward reads),
    ``dstates_of(ℓ, snap_grads=None)`` level ℓ's state gradients
    ``[B, F_ℓ + 1, H, K, V]`` float32, made when asked for (``reads_bwd_states``: the nested
    backward holds at most two levels' at a time), with level ℓ+1's factored snapshot gradients
    ``snap_grads`` added in the same kernel.
    ``states_block_v``: the state-gradient kernel's V block alone (None: ``block_v``);
    ``tokens_blocks``: the token kernel's ``(BKA, BVA, warps)`` (None: ``reads_bwd.token_blocks``)."""
    do = do.to(q.dtype)
    bounds = _chunk_bounds(tables)
    dr, do0, _ = reads_bwd(do, q, r, o0, states, tables.read_row, tables.row_level, tables.row_chunk_lo,
                           tables.row_chunk_hi, scale, dq, block_v=block_v, with_states=False, chunk_bounds=bounds,
                           do0_dtype=q.dtype, tokens_blocks=tokens_blocks)

    def dstates_of(ℓ, snap_grads=None):
        return reads_bwd_states(do, q, r, o0, states, tables.read_row, tables.row_level, tables.row_chunk_lo,
                                tables.row_chunk_hi, scale, tables.level_rows(ℓ),
                                block_v=block_v if states_block_v is None else states_block_v, chunk_bounds=bounds,
                                snap_grads=snap_grads,
                                fire_ranges=None if snap_grads is None else tables.snap_fire_ranges[ℓ + 1])
    return dr, do0, dstates_of


def reads_router_bwd_torch_levels(do, q, r, o0, states, plan, tables, scale, dq, block_v=None):
    """``reads_router_bwd_torch`` with ``reads_router_bwd``'s return convention (``dstates_of(ℓ, ...)``:
    a view of its one buffer, factored snapshot gradients added by ``add_snapshot_grads``)."""
    dr, do0, dstates = reads_router_bwd_torch(do, q, r, o0, states, plan, tables, scale, dq, block_v)

    def dstates_of(ℓ, snap_grads=None):
        d = dstates[:, tables.level_rows(ℓ)]
        if snap_grads is not None:          # float32, as the reads' kernel adds them
            add_snapshot_grads(d, snap_grads, tables.snap_rows[ℓ + 1], tables.inject_rounds[ℓ + 1])
        return d
    return dr, do0, dstates_of


def scan_bwd_two_phase(*args, **kwargs):
    """``promote_scan_bwd_two_phase`` on the nested backward's per-level state gradients, which
    are spent once the scan has run (``consume_dstates``: no copy)."""
    return promote_scan_bwd_two_phase(*args, consume_dstates=True, **kwargs)


def scan_precision(dtype, direction: str) -> str:
    """The scans' dot precision for a run in ``dtype``, ``direction`` ``"fwd"`` or ``"bwd"``.

    Both scans run on TF32 tensor cores when the activations are bf16 (2^-11 per product, under
    bf16's own 2^-8), the forward one with a V block as wide as the state
    (``promote_scan.block_sizes``) where its programs fill the GPU (``nested_fwd`` applies
    ``Pieces.forward_precision``, by default ``promote_scan.forward_precision``: IEEE at V blocks
    of 32 elsewhere); float32 runs are IEEE
    float32 throughout. The direction stays
    an argument: a variant may choose per direction (bench/NOTES.md measured IEEE forward scans
    at V blocks of 32 beside TF32 ones)."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    return "tf32" if dtype == torch.bfloat16 else "ieee"


def probe_precision(dtype) -> str:
    """The fused probe's float32 matmul precision for a run in ``dtype``: TF32 when the
    activations are bf16 (2^-11 per product), IEEE otherwise."""
    return "tf32" if dtype == torch.bfloat16 else "ieee"


LEVEL0_OVERLAP = ("none", "fwd", "fwd+bwd")
SNAPSHOT_GRADS = ("factored", "factored-add", "materialised")


@dataclass(frozen=True)
class Pieces:
    """The nested op's pieces and choices (module docstring); the defaults are the op."""
    plan: Callable = make_plan                  # (T, intervals) -> the schedule
    state_grad: Callable = state_grad_bwd       # level 0's state-gradient recurrence
    reduce_partials: Callable = keep_partials   # the reverse scans' per-V-block partials of dκ, dβ, dγ: kept
    #                                             for the probe's gates to sum as they load them (sum_partials:
    #                                             summed by adds first)
    scan_fwd: Callable = promote_scan_fwd
    scan_bwd: Callable = promote_scan_bwd       # or scan_bwd_two_phase (the reverse scan in two phases)
    reads_fwd: Callable = reads_router_fwd      # or reads_torch.reads_router_fwd_torch (PyTorch reads)
    reads_bwd: Callable = reads_router_bwd      # or reads_router_bwd_torch_levels (with the PyTorch reads)
    fused_probe: bool = True                    # built-in schemes through probe_fused (False: the generic replay)
    probe_keeps_preactivations: bool = False    # True: the fused probe keeps z [H, B·F·n, 3K + V] for its
    #                                             backward (one bmm per level less, more memory) instead of
    #                                             recomputing it
    scan_precision: Callable = scan_precision   # (dtype, 'fwd'|'bwd') -> the scans' dot precision
    forward_precision: Callable = forward_precision  # (precision, programs, device) -> the forward scan's at
    #                                                  its default V block (promote_scan.forward_precision:
    #                                                  the sequential scan's TF32 only where its programs fill
    #                                                  the GPU)
    probe_precision: Callable = probe_precision  # dtype -> the fused probe's float32 matmul precision
    block_v: int | None = None      # the scan's V block and pair block (None: promote_scan's
    block_n: int | None = None      # defaults); tests shrink them to reach several blocks
    probe_gates: str = "triton-nu"  # the fused probe's gates in kernels that make z = ν W themselves
    #                                 (optimized.nested.probe_gates_nu; learned and merge with at most
    #                                 probe_fused.NU_GATES_MAX_PAIRS pairs a firing where its blocks fit,
    #                                 else "triton"'s path); "triton": one kernel per pass on a bmm's z
    #                                 (optimized.nested.probe_gates); bounded_erase keeps the PyTorch gates;
    #                                 "torch": the PyTorch gates (the measured choice: bench/NOTES.md)
    scan_block_v: int | None = None  # the scans' V block alone (None: block_v; the reads keep block_v)
    probe_reads_rows: bool = True   # the fused probe (learned, bounded_erase) reads ν = Q M and dQ from the
    #                                 rows of fla's h and of the stored states (optimized.nested.snapshot_reads);
    #                                 False: from a gathered float32 copy of the snapshots in each pass
    split_stored_states: bool = True  # level 1's stored states and the higher levels' in two allocations
    #                                   (optimized.nested.stored_states; the second freed after level 2's
    #                                   reverse scan); False: one allocation, alive until level 1's scan
    gates_dz_over_z: bool = True    # the Triton gates on a bmm's z ("triton", or "triton-nu" where its blocks
    #                                 do not fit): their backward writes dz over the z the probe's backward
    #                                 recomputed (never over kept z); False: dz in a new buffer
    level0_recompute: str = "cumsum"  # level 0's intermediates its backward makes again instead of keeping
    #                                   through the upper levels' backward (optimized.nested.level0.RECOMPUTE:
    #                                   "none", "cumsum" the gates' float32 chunk cumsum, "cumsum+wy" also
    #                                   fla's WY keys and gated q, k)

    snapshot_grads: str = "factored"  # the fused probe's snapshot gradients Qᵀ dν' (learned, bounded_erase
    #                                   reading their rows in place) formed where they are added: in
    #                                   level 0's state-gradient kernel (level 1's) and in the level
    #                                   below's reads state-gradient kernel (levels ≥ 2, reads_bwd_states);
    #                                   "factored-add": levels ≥ 2's by a kernel of their own after it
    #                                   (optimized.nested.snapshot_grads); "materialised": a
    #                                   [B, F, H, K, V] float32 tensor made by a matmul and read back
    level0_grads_in_input_dtype: bool = True  # level 0's dg, db, dw written in the inputs' dtype by the
    #                                           last pass over each (optimized.nested.level0.level0_bwd's
    #                                           grad_dtype: each float32 value rounded once); False:
    #                                           float32, cast by the op's last step
    level0_overlap: str = "none"    # level 0's work that no upper level reads, on a second CUDA stream
    #                                 beside the upper levels (optimized.nested.side_stream): "fwd" its output
    #                                 (fla's output kernel, level0_fwd_output) beside the probes and scans, "fwd+bwd"
    #                                 also its intra-chunk dAv beside the upper levels' backward; "none"
    #                                 in line (the measured choice: the scans' programs hold a whole SM's
    #                                 registers, so nothing ran beside them; bench/NOTES.md). The same
    #                                 kernels on the same inputs, so the same bits; on the CPU in line

    def __post_init__(self):
        if self.level0_recompute not in RECOMPUTE:
            raise ValueError(f"level0_recompute must be one of {RECOMPUTE}, got {self.level0_recompute!r}")
        if self.snapshot_grads not in SNAPSHOT_GRADS:
            raise ValueError(f"snapshot_grads must be one of {SNAPSHOT_GRADS}, got {self.snapshot_grads!r}")
        if self.level0_overlap not in LEVEL0_OVERLAP:
            raise ValueError(f"level0_overlap must be one of {LEVEL0_OVERLAP}, got {self.level0_overlap!r}")

    def overlaps(self, phase: str) -> bool:
        """Whether level 0's ``phase`` ("fwd" or "bwd") work runs on the side stream."""
        return phase in self.level0_overlap.split("+")

    def reads_rows(self, scheme: str) -> bool:
        """Whether the fused probe of ``scheme`` reads its snapshots in place (``probe_reads_rows``;
        merge's ν is the snapshots themselves)."""
        return self.probe_reads_rows and scheme != "merge"

    def factored_snapshot_grads(self, scheme: str) -> bool:
        """Whether the fused probe of ``scheme`` hands back its snapshot gradients factored
        (``snapshot_grads``; only where it reads its snapshots in place as ``ν = Q M``)."""
        return self.snapshot_grads != "materialised" and self.reads_rows(scheme)

    def scan_block(self) -> int | None:
        """The V block of the promote scans: ``scan_block_v``, else ``block_v``."""
        return self.block_v if self.scan_block_v is None else self.scan_block_v


DEFAULT_PIECES = Pieces()
