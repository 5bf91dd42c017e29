"""The nested forward: level 0, probes, scans, reads (launch functions, no autograd)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from optimized.nested.level0 import Level0Saved, drop_recomputed, level0_fwd_output, level0_fwd_states
from optimized.nested.pieces import DEFAULT_PIECES, Pieces
from optimized.nested.plan import DeviceTables, PackedPlan, Plan, device_tables, make_packed_plan
from optimized.nested.probe import _probe, _snapshots, snapshot_rows
from optimized.nested.probe_fused import FUSED_SCHEMES, probe_fwd
from optimized.nested.stored_states import StoredStates, as_stored
from optimized.nested.param_casts import float32_params
from reference.schemes import is_builtin
from optimized.nested.side_stream import fork, join
from optimized.nested.stages import stage


def final_states(rows, tables: DeviceTables, ℓ: int) -> torch.Tensor:
    """Level ℓ's final states out of every upper level's rows (the stored states: a
    ``StoredStates`` or one ``[B, S, H, K, V]`` tensor): ``[B, H, K, V]``, a view; packed
    sequences ``[n, H, K, V]``, a gather (each sequence's last row)."""
    level = as_stored(rows).level(tables, ℓ)
    if tables.packed is None:
        return level[:, -1]
    return level[0].index_select(0, tables.packed.final_rows[ℓ])


@dataclass
class NestedSaved:
    plan: Plan | PackedPlan
    tables: DeviceTables
    levels: list
    scale: float
    level0: Level0Saved
    h_final0: torch.Tensor
    states: StoredStates            # every upper level's stored states (level 1's rows, the others'), float32
    o0: torch.Tensor
    q: torch.Tensor
    r: torch.Tensor
    params: list                    # per level ℓ ≥ 1: {name: float32 tensor}, detached (index 0: None)
    has_initial: list
    probes: list                    # per level ℓ ≥ 1: (pairs, fused-probe intermediates) or None (generic)
    pieces: Pieces = field(default_factory=Pieces)

    def level_states(self, ℓ: int) -> torch.Tensor:
        """Level ℓ's stored states ``[B, F_ℓ + 1, H, K, V]`` (a view of ``states``)."""
        return self.states.level(self.tables, ℓ)

    def release_higher_states(self) -> None:
        """Drop the stored states of levels ≥ 2 (their own allocation), spent once level 2's
        reverse scan is done: level 2's and level 1's probe backwards and level 1's scan run
        without them (H200, L = 4: the step peaked in an upper level's probe backward with every
        level's stored states alive, 0.90 GiB; those of levels 2 and 3 are 0.39 GiB of it).
        Same condition as ``release_states``."""
        if self.states is not None:
            self.states.release_higher()

    def release_states(self) -> None:
        """Drop the stored states (level 1's, and the higher levels' if still held) and level 0's
        output (read by the reads' state gradients only), spent once level 1's reverse scan is
        done: level 1's probe backward, where a step peaked once the probe outputs went (H200,
        L = 4, B = 8, T = 4096, H = 16, K = V = 128: 6.58 GiB), runs without their 0.90 GiB.
        Only for a backward that does not keep the graph (which then drops the whole saved state:
        a second backward gets ``NestedGDN2Function``'s error)."""
        self.states = None
        self.o0 = None

    def release_probe(self, ℓ: int) -> None:
        """Drop level ℓ's probe outputs (the scan's pairs) and the probe's saved intermediates,
        spent once level ℓ's probe backward is done: the levels below run their scans and probe
        backwards without them (H200, L = 6, K = 128, B = 8, T = 4096: the step peaked in level 2's
        probe backward with every level's outputs alive, 1.13 GiB; those of levels 3–5 are
        0.63 GiB of it). Same condition as ``release_states``."""
        self.probes[ℓ] = None

    def release_upper_levels(self) -> None:
        """Drop the stored states and the probes' outputs and intermediates (spent once the upper
        levels' backward is done): level 0's backward runs without them (≈ 0.75 GiB of probe
        outputs at the shape above). Same condition as ``release_states``."""
        self.release_states()
        self.probes = [None] * len(self.probes)


def scan_kwargs(tables: DeviceTables, ℓ: int) -> dict:
    """The scans' packed-sequence argument for level ℓ (none for one sequence per row, so a scan
    function without it, e.g. a test's twin, still serves those)."""
    return {} if tables.packed is None else {"fire_offsets": tables.packed.fire_offsets[ℓ]}


def nested_fwd(q, k, v, g, b, w, r, levels, scale, initial_states, pieces: Pieces = DEFAULT_PIECES,
               lengths: tuple | None = None, finals: bool = True):
    """All levels, probes, scans and reads. Returns ``(o [B, T, H, V] in q's dtype,
    finals: L float32 [B, H, K, V], saved)``. ``lengths``: sequences packed in one row
    (``B = 1``), each on its own schedule (``plan.make_packed_plan``); initial and final
    states are then per sequence, ``[n, H, K, V]``. ``finals=False``: the final states are not
    made (an empty list: a call without ``output_final_state`` would copy them for nothing)."""
    B, T, H, L, K = q.shape
    V = v.shape[-1]
    intervals = tuple(lv.interval for lv in levels)
    plan = pieces.plan(T, intervals) if lengths is None else make_packed_plan(tuple(lengths), intervals, pieces.plan)
    tables = device_tables(plan, q.device)
    # stage ranges (under a profiler): the profiler's table gives each stage's device time (bench.reads_ab --profile)
    with stage("nested.level0_fwd"):
        ht0, h, saved0 = level0_fwd_states(q[:, :, :, 0].contiguous(), k, v, g, b, w, scale, initial_states[0],
                                           packed=tables.packed)
    # level 0's output: read by the reads only, so (on CUDA) beside the upper levels' probes and scans
    with fork(pieces.overlaps("fwd"), q.device) as side, stage("nested.level0_out"):
        o0 = level0_fwd_output(saved0)
    split = pieces.split_stored_states and L > 1
    states = StoredStates.empty(B, tables.S, tables.level_rows(1).stop if split else tables.S, H, K, V, q.device)
    # every level's scheme parameters in float32, cast together (one launch) and kept for the backward
    params = float32_params([None] + [lv.params for lv in levels])
    probes = [None]
    for ℓ in range(1, L):
        level = levels[ℓ - 1]
        # the fused probe is the built-in's: a scheme registered over its name runs its own probe
        fused = (pieces.fused_probe and level.scheme in FUSED_SCHEMES and is_builtin(level.scheme)
                 and plan.firings(ℓ) > 0)
        with stage("nested.snapshots"):
            p32 = params[ℓ]
            if fused and pieces.reads_rows(level.scheme):       # read in place by the probe: no copy
                snaps = snapshot_rows(tables, ℓ, states, h, ht0)
            else:
                snaps = _snapshots(plan, tables, ℓ, states, h, ht0)
        with stage("nested.probe_fwd"):
            if fused:
                # built-in scheme: fused probe; its outputs and intermediates kept for the hand backward
                pairs, probe_saved = probe_fwd(level.scheme, snaps, p32, level.reduction,
                                               keep_preactivations=pieces.probe_keeps_preactivations,
                                               precision=pieces.probe_precision(q.dtype),
                                               gates=pieces.probe_gates)
                pairs = tuple(x.contiguous() for x in pairs)
                probes.append((pairs, probe_saved))
            else:           # any registered scheme: its probe, replayed under autograd in the backward
                with torch.no_grad():
                    pairs = _probe(level, snaps, p32, H, K, V)
                probes.append(None)
        M0 = initial_states[ℓ]
        precision = pieces.scan_precision(q.dtype, "fwd")
        if pieces.scan_block() is None:     # at the scan's default V block: its precision for this launch
            seqs = B if tables.packed is None else len(lengths)
            precision = pieces.forward_precision(precision, seqs * H, q.device)
        with stage("nested.scan_fwd"):
            pieces.scan_fwd(None if M0 is None else M0.detach().float(), *pairs, block_v=pieces.scan_block(),
                            block_n=pieces.block_n, out=states.level(tables, ℓ),
                            precision=precision, **scan_kwargs(tables, ℓ))
    join(side, o0)
    drop_recomputed(saved0, pieces.level0_recompute)   # (the output read g_cumsum)
    with stage("nested.reads_fwd"):
        o = pieces.reads_fwd(q, r, o0, states, plan, tables, scale, block_v=pieces.block_v)
    # fresh tensors: outputs must not alias what the backward keeps (no reference cycles)
    made = [ht0.clone()] + [final_states(states, tables, ℓ).clone() for ℓ in range(1, L)] if finals else []
    saved = NestedSaved(plan, tables, list(levels), scale, saved0, ht0, states, o0, q, r, params,
                        [s is not None for s in initial_states], probes, pieces)
    return o, made, saved
