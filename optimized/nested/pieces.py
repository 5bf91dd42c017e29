"""The pluggable pieces of the nested op (the mutation tests swap one for a broken twin)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from optimized.nested.plan import make_plan
from optimized.nested.reads_torch import reads_router_bwd_torch, reads_router_fwd_torch
from optimized.promote_scan import promote_scan_fwd, sum_partials
from optimized.state_grad import state_grad_bwd


@dataclass(frozen=True)
class Pieces:
    plan: Callable = make_plan
    state_grad: Callable = state_grad_bwd
    reduce_partials: Callable = sum_partials
    scan_fwd: Callable = promote_scan_fwd
    reads_fwd: Callable = reads_router_fwd_torch      # reads and router, forward and backward
    reads_bwd: Callable = reads_router_bwd_torch
    block_v: int | None = None      # the scan's V block and pair block (None: promote_scan's
    block_n: int | None = None      # defaults); tests shrink them to reach several blocks


DEFAULT_PIECES = Pieces()


