"""Side by side in one run: variants of the nested op's pieces next to flat GDN-2 with ``L·H``
heads. Variants (``--variants``, default all):

- ``torch``: upper-level reads and router in PyTorch (einsum per level, the path before the Triton reads),
  generic probe, IEEE scan;
- ``generic``: Triton reads (``optimized.nested.reads_fwd`` / ``reads_bwd``), generic probe
  replayed under autograd, IEEE scan;
- ``fused-ieee``: + the fused probe with its hand-written backward;
- ``scan-tf32``: + the reverse scans on TF32 tensor cores in bf16 runs;
- ``triton``: + the fused probe's float32 matmuls in TF32 in bf16 runs, its pre-activations
  recomputed in the backward: the default op;
- ``triton+check``: the default op with the finiteness check on;
- ``bv16``, ``bv64``: the default op with V blocks of 16 / 64 in the scans and the reads;
- ``keep-z``: the default op with the fused probe's pre-activations kept for the backward
  instead of recomputed (``Pieces.probe_keeps_preactivations=True``: one bmm per level less,
  0.75 GiB more at L = 4; the default until 2026-11-30, when that run was the variant
  ``recompute-z``);
- ``scan-2phase``: the default op with the reverse promote scans in two phases (the carried state
  gradient alone, then every firing's pair gradients in parallel: ``optimized.nested.promote_scan_two_phase``;
  H200 2026-11-30: slower, 37.45 against 35.46 ms at L = 4);
- ``scan-fwd-ieee-bv16``: the default op with its IEEE forward scans at V blocks of 16 (the programs
  rule runs IEEE at V blocks of 32 where TF32's one V block would not fill the GPU, as at B = 2):
  256 programs instead of 128 at the batch point's B = 2, H = 16, K = 128; B = 8 runs TF32, unchanged;
- ``scan-pf``, ``scan-fwd-pf``, ``scan-bwd-pf``: the default op with both promote scans, the forward
  or the reverse one loading their operands a step ahead (``promote_scan_fwd(prefetch=True)``, the
  same arithmetic: pair blocks, decays and the reverse scan's stored states no longer wait in the
  chain of firings); ``scan-pf-bv16``: ``scan-pf`` with its IEEE forward scans at V blocks of 16
  (as ``scan-fwd-ieee-bv16``);
- ``scan-bv16``: the default op with V blocks of 16 in the scans only (``Pieces.scan_block_v``; the
  reads keep 32): twice the programs for the scans' sequential chains;
- ``scan-bv32``: the default op with V blocks of 32 in both scans (the reverse scan's default is 64
  since 2026-12-02; 32 before, so this is the op before that change);
- ``bn32``, ``bn64``: the default op with pair blocks of 32 / 64 in the scans (default 16; 32 until
  2026-12-02, when the default's 16 was the variant ``bn16``): the ladder's upper levels (n = 64, 128)
  run n / BN pair blocks one after another per firing, but blocks over 16 spill registers at K = 128;
- ``rstates-bv32``, ``rstates-bv64``: the default op with V blocks of 32 / 64 in the reads'
  state-gradient kernel alone (``reads_router_bwd(states_block_v=…)``; default 128 at K ≤ 128,
  ``reads_bwd.states_block_v``; 32 until 2026-12-02);
- ``states-one-buffer``: the default op with every upper level's stored states in one allocation
  (``Pieces(split_stored_states=False)``; the default holds level 1's rows and the higher levels'
  in two, and frees the second after level 2's reverse scan);
- ``snapshot-copies``: the default op with the fused probe reading a gathered float32 copy of its
  snapshots in each pass (``Pieces(probe_reads_rows=False)``; the default reads ``ν = Q M`` and
  ``dQ`` from fla's chunk states and the stored states in place, ``optimized.nested.snapshot_reads``);
- ``dz-new-buffer``: the op with the gates on a bmm's ``z`` (``gates-triton``) and their backward
  writing ``dz`` into a new buffer (``Pieces(probe_gates="triton", gates_dz_over_z=False)``; by
  default that path writes it over the ``z`` the probe's backward recomputed; the default gates never
  store ``z``);
- ``l0-keep``, ``l0-recompute-wy``: the default op with level 0's backward keeping every fla
  intermediate from the forward (``Pieces(level0_recompute="none")``), or making again the WY keys
  and gated q, k besides the gates' chunk cumsum (``"cumsum+wy"``); the default makes again only
  the cumsum (``"cumsum"``);
- ``gates-triton``: the op before its gates made ``z`` themselves: the fused probe's gates (l2norm,
  sigmoids, softplus and its reduction, and their backward) in one Triton kernel per pass on the
  pre-activations ``z`` of a cuBLAS bmm (``Pieces(probe_gates="triton")``,
  ``optimized.nested.probe_gates``);
- ``snap-grads-materialised``: the default op with the fused probe's snapshot gradients ``Qᵀ dν'``
  made by a matmul as a ``[B, F, H, K, V]`` float32 tensor and read back (level 1's by level 0's
  state-gradient kernel, the others by a strided add: ``Pieces(snapshot_grads="materialised")``, the
  op before); the default forms the product where it is added;
- ``snap-add-kernel``: the default op with levels ≥ 2's factored snapshot gradients added by a
  kernel of their own after the level below's state gradients are made
  (``optimized.nested.snapshot_grads``, ``Pieces(snapshot_grads="factored-add")``, the op before
  2026-12-04's fold into the reads' state-gradient kernel);
- ``partials-sum``: the default op with the reverse scans' per-V-block partial gradients (dκ, dβ,
  dγ) summed by torch's ``sum(0)`` (the op before 2026-12-04's elementwise adds,
  ``promote_scan.sum_partials``);
- ``partials-add``: the default op with those partials summed by ``promote_scan.sum_partials``'
  elementwise adds before the probe's backward (the op before the gates summed them as they load
  them, ``promote_scan.keep_partials``);
- ``rtok-k32-v32``, ``rtok-k64-v64``, ``rtok-k128-v32``, ``rtok-k32-v64``: the default op with the
  reads' token kernel (``reads_bwd_tokens_kernel``) visiting keys and V in blocks of 32 / 32 (the op
  before 2026-12-04), 64 / 64 (the default since, at K = V = 128), 128 / 32, 32 / 64
  (``reads_router_bwd(tokens_blocks=…)``): wider blocks reload ``do`` fewer times and run fewer,
  larger dots;
- ``gates-nu``: the default op named by its gates, which make ``z = ν W`` inside their kernels and
  never store it (``Pieces(probe_gates="triton-nu")``, ``optimized.nested.probe_gates_nu``);
- ``l0-grads-f32``: the default op with level 0's ``dg``, ``db``, ``dw`` in float32, cast by the op's
  last step (``Pieces(level0_grads_in_input_dtype=False)``; the default writes them in the inputs'
  dtype); ``l0-db-add-torch``: the default op with ``db`` and fla's key-block partials added by
  torch over the permuted view instead of ``optimized.nested.key_block_partials``' kernel;
- ``uniform16``: the default op on levels of 16 queries each instead of the query ladder
  (``n_ℓ = min(K, 16·2^(ℓ-1))``; the same parameters' seed): ``ngdn bench``'s ladder row, side by
  side with the ladder (``triton``) and with stage tables; ``uniform16-scan-pf``: ``scan-pf`` on
  those levels (the ladder's measure for ``scan-pf``).

For each depth: forward and forward+backward times (``triton.testing.do_bench`` medians,
autotuners tuned: one warm step first), the nested/flat ratios, peak memory of one step,
and, with ``--profile``, the torch.profiler kernel table of one nested step for both read
paths (the stage-by-stage account). The finiteness check is off for every op
(``optimized.checks.finite_checks(False)``: the benchmark's inputs are finite) except the
row ``triton+check``, which shows what the check's one host sync costs.

    python -m bench.reads_ab --out results/DIR [--levels 4 6] [--profile]

Writes ``DIR/reads_ab.csv``, ``DIR/reads_ab.md`` and ``DIR/profile_L<L>_<reads>.txt``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import time
from pathlib import Path

import torch

from bench.harness import CudaDevice, prepare_environment, write_profile_table
from bench.measure import host_ms

HOST_REPS = 21      # launches from an idle GPU per host time (bench.measure.host_ms; its median)


def _log(message: str):
    print(f"[reads_ab] {message}", file=sys.stderr, flush=True)


def _inputs(B, T, H, K, V, L, dtype, seed, nested: bool, device="cuda"):
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    def leaf(x):
        return x.to(dtype).detach().requires_grad_(True)

    q_shape = (B, T, H, L, K) if nested else (B, T, H, K)
    x = {"q": leaf(rnd(*q_shape)), "k": leaf(F.normalize(rnd(B, T, H, K), dim=-1)), "v": leaf(rnd(B, T, H, V)),
         "g": leaf(F.logsigmoid(rnd(B, T, H, K) + 2.5)), "b": leaf(torch.sigmoid(rnd(B, T, H, K))),
         "w": leaf(torch.sigmoid(rnd(B, T, H, V)))}
    if nested:
        x["r"] = leaf(rnd(B, T, H, L))
    return x, rnd(B, T, H, V).to(dtype)


def _rates() -> dict:
    """The bf16 matmul rate and the copy bandwidth the floors use (``bench.harness.measure_rates``)."""
    from types import SimpleNamespace

    from bench.harness import CudaDevice, do_bench_timer, measure_rates

    args = SimpleNamespace(matmul_tflops=None, matmul_n=8192, copy_gbps=None, copy_mib=1024)
    rates = measure_rates(args, do_bench_timer(25, 200), CudaDevice())
    _log(f"rates: bf16 matmul {rates['matmul_tflops']:.0f} TFLOP/s, copy {rates['copy_gbps']:.0f} GB/s")
    return rates


def precompile_workloads(args) -> list:
    """What ``--precompile-workers`` compiles: per level count, flat GDN-2 with L·H heads (unless
    ``--no-flat``) and the nested op with its default query counts, at this run's shape."""
    from bench.plan import Workload
    from reference.nested import default_query_counts

    out = []
    for L in args.levels:
        if not args.no_flat:
            out.append(Workload("flat", args.B, args.T, args.H, args.K, args.K, L))
        out.append(Workload("nested", args.B, args.T, args.H, args.K, args.K, L, "ladder",
                            tuple(default_query_counts(L, args.K))))
    return out


def precompile_args(args):
    """The fields ``bench.precompile``'s workers build their inputs from, as this module builds
    its ops: float32 scheme parameters, the learned scheme (``make_levels``' default)."""
    import types

    return types.SimpleNamespace(dtype=args.dtype, param_dtype="float32", scheme="learned", seed=args.seed,
                                 warmup_ms=25, rep_ms=200)


def uniform_query_counts(L: int) -> list[int]:
    """Variant ``uniform16``'s query counts: 16 at every upper level."""
    return [16] * (L - 1)


def _floor_ms(name, B, T, H, K, L, dtype, rates) -> tuple[float, float]:
    """``(forward, forward+backward)`` floors (``bench/floors.py``: max of FLOPs at the matmul rate
    and minimum bytes at the copy bandwidth, per pass) of flat GDN-2 or the nested op."""
    from bench import floors
    from reference.nested import default_query_counts

    itemsize = torch.empty((), dtype=dtype).element_size()
    if name == "flat":
        cost = floors.flat_cost(B, T, L * H, K, K, itemsize)
    else:
        counts = uniform_query_counts(L) if name.startswith("uniform16") else default_query_counts(L, K)
        cost = floors.nested_cost(B, T, H, K, K, counts, [2 ** i for i in range(L - 1)], itemsize, 4)
    fl = floors.floors(cost, rates["matmul_flops"], rates["copy_bytes"])
    return fl.fwd_ms, fl.fwdbwd_ms


VARIANTS = ("torch", "generic", "fused-ieee", "scan-tf32", "triton", "triton+check", "bv16", "bv64", "keep-z",
            "scan-2phase", "scan-fwd-ieee", "scan-fwd-tf32", "scan-fwd-ieee-bv16",
            "scan-pf", "scan-fwd-pf", "scan-bwd-pf", "scan-pf-bv16",
            "reads-fwd-bv32", "reads-fwd-bv64",
            "scan-bv16", "scan-bv32", "bn32", "bn64", "gates-nu", "gates-triton", "gates-torch",
            "rstates-bv32", "rstates-bv64",
            "states-one-buffer", "snapshot-copies", "dz-new-buffer", "l0-keep", "l0-recompute-wy", "ranges-always",
            "gates-nu-128", "l0-overlap", "l0-overlap-fwd", "l0-output-fla", "snap-grads-materialised",
            "snap-add-kernel", "partials-sum", "partials-add", "rtok-k32-v32", "rtok-k64-v64", "rtok-k128-v32", "rtok-k32-v64", "l0-grads-f32",
            "l0-db-add-torch", "uniform16", "uniform16-scan-pf", "scan-2phase-bv64", "scan-2phase-n32",
            "gates-one-launch",
            "params-run-dtype", "params-cast-each", "gates-per-block")


@contextlib.contextmanager
def ranges_always(on: bool):
    """With ``on``, the nested op's stage ranges are opened on every call, profiler or not (the op
    before ``optimized.nested.stages.stage``: variant ``ranges-always``, the default op otherwise)."""
    if not on:
        yield
        return
    from torch.profiler import record_function

    import optimized.nested.bwd
    import optimized.nested.function
    import optimized.nested.fwd

    modules = (optimized.nested.fwd, optimized.nested.bwd, optimized.nested.function)
    originals = [m.stage for m in modules]
    for m in modules:
        m.stage = record_function
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            m.stage = original


@contextlib.contextmanager
def nu_gates_up_to(pairs: int | None):
    """With ``pairs``, the gates that make ``z`` themselves serve firings of up to that many pairs
    (``probe_fused.NU_GATES_MAX_PAIRS``; variant ``gates-nu-128``, the op before the bound of 64)."""
    if pairs is None:
        yield
        return
    import optimized.nested.probe_fused as probe_fused

    original = probe_fused.NU_GATES_MAX_PAIRS
    probe_fused.NU_GATES_MAX_PAIRS = pairs
    try:
        yield
    finally:
        probe_fused.NU_GATES_MAX_PAIRS = original


@contextlib.contextmanager
def gates_in_one_launch(on: bool | None):
    """``on`` True: the gates that make ``z`` themselves run every block in one launch
    (``probe_gates_nu.ONE_LAUNCH``; variant ``gates-one-launch``); False: one launch per block
    (variant ``gates-per-block``, the op before 2026-12-04 at head dims up to 64); None: the
    default (one launch at head dims up to ``probe_gates_nu.ONE_LAUNCH_MAX_K``)."""
    if on is None:
        yield
        return
    import optimized.nested.probe_gates_nu as probe_gates_nu

    original = probe_gates_nu.ONE_LAUNCH
    probe_gates_nu.ONE_LAUNCH = on
    try:
        yield
    finally:
        probe_gates_nu.ONE_LAUNCH = original


@contextlib.contextmanager
def param_casts_each(on: bool):
    """With ``on``, the op casts its scheme parameters to float32 one tensor at a time, and each
    gradient back (variant ``params-cast-each``; the op before 2026-12-04 did that, and cast them
    again in the backward), instead of ``optimized.nested.param_casts``' one cast for all of them."""
    if not on:
        yield
        return
    import optimized.nested.fwd as fwd
    import optimized.nested.function as function

    def each_float32(groups):
        return [None if g is None else {n: t.detach().float() for n, t in g.items()} for g in groups]

    def each_like(grads, likes):
        return [None if g is None else g.to(like.dtype) for g, like in zip(grads, likes)]

    originals = fwd.float32_params, function.cast_like
    fwd.float32_params, function.cast_like = each_float32, each_like
    try:
        yield
    finally:
        fwd.float32_params, function.cast_like = originals


@contextlib.contextmanager
def level0_output_by_fla(on: bool):
    """With ``on``, level 0's output goes through fla's launcher ``chunk_gla_fwd_o_gk``, which
    zero-fills ``o`` before its kernel writes it (variant ``l0-output-fla``, the op before its own
    launch into an uninitialised ``o``)."""
    if not on:
        yield
        return
    import optimized.nested.fwd as fwd
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk

    from optimized.nested.level0 import CHUNK

    def output(s):
        return chunk_gla_fwd_o_gk(q=s.q, v=s.v_new, g=s.g_cumsum, A=s.Aqk, h=s.h, scale=s.scale,
                                  chunk_size=CHUNK, **s.varlen())

    original = fwd.level0_fwd_output
    fwd.level0_fwd_output = output
    try:
        yield
    finally:
        fwd.level0_fwd_output = original


@contextlib.contextmanager
def db_partials_by_torch(on: bool):
    """With ``on``, level 0's ``db`` and fla's key-block partials are added by torch over the
    permuted view into the output dtype (variant ``l0-db-add-torch``: torch's strided elementwise
    kernel) instead of ``optimized.nested.key_block_partials``' kernel."""
    if not on:
        yield
        return
    import optimized.nested.level0 as level0

    def add(db, parts, dtype):
        B, T, H, K = db.shape
        NK, BK = parts.shape[0], parts.shape[-1]
        out = torch.empty_like(db, dtype=dtype)
        if NK * BK == K:
            torch.add(db.view(B, T, H, NK, BK), parts.permute(1, 2, 3, 0, 4), out=out.view(B, T, H, NK, BK))
        else:
            torch.add(db, parts.permute(1, 2, 3, 0, 4).reshape(B, T, H, NK * BK)[..., :K], out=out)
        return out

    original = level0.add_key_block_partials
    level0.add_key_block_partials = add
    try:
        yield
    finally:
        level0.add_key_block_partials = original


def _reads_fwd_at(block_v: int):
    """The forward reads kernel at V blocks of ``block_v`` whatever the op asks (it passes its
    ``Pieces.block_v``, which also sets the scans')."""
    from optimized.nested.pieces import reads_router_fwd

    def reads_fwd(*args, block_v=None, _bv=block_v, **kwargs):
        return reads_router_fwd(*args, block_v=_bv, **kwargs)
    return reads_fwd


def _scan_fwd_tf32(*args, precision="ieee", **kwargs):
    """The forward promote scan on TF32 at its default V block (one of 128) whatever the op asks:
    the op's rule (``promote_scan.forward_precision``) runs IEEE where TF32's programs would not
    fill the GPU; this is the op without that rule (bf16 runs only: float32 runs ask IEEE)."""
    from optimized.nested.promote_scan import promote_scan_fwd
    return promote_scan_fwd(*args, precision="tf32", **kwargs)


def _scan_fwd_ieee_bv16(*args, precision="ieee", block_v=None, **kwargs):
    """The forward promote scan at V blocks of 16 where the op runs it in IEEE float32 (the
    programs rule's choice where TF32's one V block would not fill the GPU: B = 2's batch point),
    twice the programs of its default 32; TF32 launches as the op makes them."""
    from optimized.nested.promote_scan import promote_scan_fwd
    if precision == "ieee" and block_v is None:
        block_v = 16
    return promote_scan_fwd(*args, precision=precision, block_v=block_v, **kwargs)


def _torch_sum_partials(partials, blocks=None):
    """The reverse scans' per-V-block partials summed by torch's ``sum(0)`` (the op before
    2026-12-04's elementwise adds, ``promote_scan.sum_partials``)."""
    return partials.sum(0) if blocks is None else partials[:blocks].sum(0)


def _scan_bwd_two_phase_from(pairs: int):
    """The reverse promote scan in two phases (``pieces.scan_bwd_two_phase``) at levels whose
    firings hold at least ``pairs`` pairs, at the fused scan's V block (``block_sizes(reverse=True)``:
    64 at K ≤ 128) where the op asks none; the fused scan at the other levels. Variants
    ``scan-2phase-bv64`` (every level) and ``scan-2phase-n32`` (the ladder's levels 2 and up: the
    chain keeps two of the five dots per pair block, the other three run with F times the
    programs)."""
    from optimized.nested.pieces import scan_bwd_two_phase
    from optimized.nested.promote_scan import block_sizes, promote_scan_bwd

    def scan_bwd(states, kappa, *args, block_v=None, **kwargs):
        if kappa.shape[3] < pairs:
            return promote_scan_bwd(states, kappa, *args, block_v=block_v, **kwargs)
        if block_v is None:
            block_v = block_sizes(kappa.shape[-1], states.shape[-1], kappa.shape[3], reverse=True)[2]
        return scan_bwd_two_phase(states, kappa, *args, block_v=block_v, **kwargs)

    return scan_bwd


def _ops(B, T, H, K, V, L, dtype, seed, names=VARIANTS, device="cuda"):
    """name -> (step inputs, forward closure, do) on ``device`` (the CPU smoke test builds every
    variant there: tests/test_bench_smoke.py)."""
    from optimized import chunk_gdn2
    from optimized.nested import Pieces, _nested
    from functools import partial

    from optimized.nested.pieces import (reads_router_bwd, reads_router_bwd_torch_levels,
                                         scan_bwd_two_phase)
    from optimized.nested.reads_torch import reads_router_fwd_torch
    from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd, sum_partials
    from reference.nested import make_levels

    ops = {}
    if "flat" in names:
        x, do = _inputs(B, T, H * L, K, V, L, dtype, seed, nested=False, device=device)
        ops["flat"] = (list(x.values()), lambda x=x: chunk_gdn2(**x)[0], do)
    xn, don = _inputs(B, T, H, K, V, L, dtype, seed + 1, nested=True, device=device)
    def device_levels(query_counts=None, param_dtype=torch.float32):
        levels = make_levels(L, H, K, V, query_counts=query_counts, generator=torch.Generator().manual_seed(seed + 2))
        for lv in levels:
            for n in lv.params:
                lv.params[n] = lv.params[n].to(device, param_dtype).requires_grad_(True)
        return levels, [p for lv in levels for p in lv.params.values()]
    levels, params = device_levels()
    uniform = device_levels(uniform_query_counts(L)) if any(n.startswith("uniform16") for n in names) else None
    # the scheme parameters in the run's dtype, as ``ngdn bench --param-dtype auto`` gives them
    run_dtype_params = device_levels(param_dtype=dtype) if {"params-run-dtype", "params-cast-each"} & set(names) \
        else None
    ieee = lambda dtype, direction: "ieee"  # noqa: E731
    prefetched = Pieces(scan_fwd=partial(promote_scan_fwd, prefetch=True),
                        scan_bwd=partial(promote_scan_bwd, prefetch=True))
    variants = {
        "torch": Pieces(reads_fwd=reads_router_fwd_torch, reads_bwd=reads_router_bwd_torch_levels, fused_probe=False,
                        scan_precision=ieee),
        "generic": Pieces(fused_probe=False, scan_precision=ieee),
        "fused-ieee": Pieces(scan_precision=ieee, probe_precision=lambda dtype: "ieee"),
        "scan-tf32": Pieces(probe_precision=lambda dtype: "ieee"),
        "triton": Pieces(),
        # the op before the forward scans ran TF32 at one V block of 128: IEEE at V blocks of 32
        "scan-fwd-ieee": Pieces(scan_precision=lambda dtype, direction: (
            "tf32" if dtype == torch.bfloat16 and direction == "bwd" else "ieee")),
        # TF32 at one V block of 128 at every batch size (the op before its programs rule)
        "scan-fwd-tf32": Pieces(scan_fwd=_scan_fwd_tf32),
        # IEEE forward scans at V blocks of 16 (the batch point's: 256 programs instead of 128)
        "scan-fwd-ieee-bv16": Pieces(scan_fwd=_scan_fwd_ieee_bv16),
        # the scans whose operands are loaded a step ahead (promote_scan's prefetch kernels)
        "scan-pf": prefetched,
        "scan-fwd-pf": Pieces(scan_fwd=partial(promote_scan_fwd, prefetch=True)),
        "scan-bwd-pf": Pieces(scan_bwd=partial(promote_scan_bwd, prefetch=True)),
        # ... both, the IEEE forward at V blocks of 16 (the batch point's launch, as scan-fwd-ieee-bv16)
        "scan-pf-bv16": Pieces(scan_fwd=partial(_scan_fwd_ieee_bv16, prefetch=True),
                               scan_bwd=partial(promote_scan_bwd, prefetch=True)),
        "bv16": Pieces(block_v=16),     # the default op with V blocks of 16 in the scans and reads
        "bv64": Pieces(block_v=64),     # ... of 64 (default: 32 at K ≤ 128)
        "keep-z": Pieces(probe_keeps_preactivations=True),
        "scan-2phase": Pieces(scan_bwd=scan_bwd_two_phase),
        # the forward reads kernel alone at V blocks of 32 (the op before its bf16 default of 128 at
        # 64 < K ≤ 128, reads_fwd.forward_block_v) and 64
        "reads-fwd-bv32": Pieces(reads_fwd=_reads_fwd_at(32)),
        "reads-fwd-bv64": Pieces(reads_fwd=_reads_fwd_at(64)),
        "scan-bv16": Pieces(scan_block_v=16),
        "scan-bv32": Pieces(scan_block_v=32),
        "bn32": Pieces(block_n=32),
        "bn64": Pieces(block_n=64),
        "gates-nu": Pieces(probe_gates="triton-nu"),    # the default: z made inside the gates' kernels
        "gates-triton": Pieces(probe_gates="triton"),   # the op before: the gates on a bmm's z
        "gates-torch": Pieces(probe_gates="torch"),
        # the reads' state-gradient kernel alone with V blocks of 32 / 64 (default 128 at K ≤ 128: one
        # program per stored row and head; at 32, four, each recomputing the router and p ⊙ q)
        "rstates-bv32": Pieces(reads_bwd=partial(reads_router_bwd, states_block_v=32)),
        "rstates-bv64": Pieces(reads_bwd=partial(reads_router_bwd, states_block_v=64)),
        # every upper level's stored states in one allocation, alive until level 1's reverse scan
        # (the default splits off the levels ≥ 2, freed after level 2's scan)
        "states-one-buffer": Pieces(split_stored_states=False),
        "snapshot-copies": Pieces(probe_reads_rows=False),
        "dz-new-buffer": Pieces(probe_gates="triton", gates_dz_over_z=False),
        "l0-keep": Pieces(level0_recompute="none"),
        "l0-recompute-wy": Pieces(level0_recompute="cumsum+wy"),
        "ranges-always": Pieces(),      # the default op; main() opens its stage ranges on every call
        "gates-nu-128": Pieces(),       # the default op; main() lets its gates make z up to 128 pairs a firing
        "gates-one-launch": Pieces(),   # the default op; main() runs its gates' blocks in one launch
        "gates-per-block": Pieces(),    # the default op; main() runs its gates one launch per block
        # level 0's output and dAv on a side stream beside the upper levels (optimized.nested.side_stream),
        # and the output alone there; the default runs both in line
        "l0-overlap": Pieces(level0_overlap="fwd+bwd"),
        "l0-overlap-fwd": Pieces(level0_overlap="fwd"),
        "l0-output-fla": Pieces(),      # the default op; main() has fla's launcher zero-fill level 0's output
        "snap-grads-materialised": Pieces(snapshot_grads="materialised"),
        "snap-add-kernel": Pieces(snapshot_grads="factored-add"),
        "partials-sum": Pieces(reduce_partials=_torch_sum_partials),
        "partials-add": Pieces(reduce_partials=sum_partials),
        "scan-2phase-bv64": Pieces(scan_bwd=_scan_bwd_two_phase_from(1)),
        "scan-2phase-n32": Pieces(scan_bwd=_scan_bwd_two_phase_from(32)),
        # level 0's dg, db, dw in float32, cast by the op's last step (the default writes them in the
        # inputs' dtype, and db's key-block partials are added without fla's contiguous copy)
        "l0-grads-f32": Pieces(level0_grads_in_input_dtype=False),
        "l0-db-add-torch": Pieces(),    # the default op; main() has torch add db's key-block partials
        # the reads' token kernel at other key / V blocks (default 64 x 64 at K = V = 128, 8 warps;
        # 32 x 32 the op before: `do` loaded once per level, key block and V block)
        "rtok-k32-v32": Pieces(reads_bwd=partial(reads_router_bwd, tokens_blocks=(32, 32, 8))),
        "rtok-k64-v64": Pieces(reads_bwd=partial(reads_router_bwd, tokens_blocks=(64, 64, 8))),
        "rtok-k128-v32": Pieces(reads_bwd=partial(reads_router_bwd, tokens_blocks=(128, 32, 8))),
        "rtok-k32-v64": Pieces(reads_bwd=partial(reads_router_bwd, tokens_blocks=(32, 64, 8))),
        "uniform16": Pieces(),          # the default op; on levels of 16 queries each (below)
        "uniform16-scan-pf": prefetched,   # scan-pf, on the levels of uniform16 (below)
        "params-run-dtype": Pieces(),   # the default op; its scheme parameters in the run's dtype (below)
        "params-cast-each": Pieces(),   # the same; main() has the op cast them one at a time
    }
    for name in names:
        if name == "flat":
            continue
        pieces = variants[name.removesuffix("+check")]
        lv, ps = {"uniform16": uniform, "uniform16-scan-pf": uniform, "params-run-dtype": run_dtype_params,
                  "params-cast-each": run_dtype_params}.get(name, (levels, params))
        ops[name] = (list(xn.values()) + ps,
                     lambda pieces=pieces, lv=lv: _nested(levels=lv, pieces=pieces, **xn)[0], don)
    return ops


def write_host_profile(path: Path, forward, step, reps: int = 5) -> None:
    """``cProfile`` of ``reps`` forwards and ``reps`` forward+backward steps, each launched from an
    idle GPU: the host functions a launch-bound op spends its time in (cumulative, top 60; then
    by own time, top 40: where the Python itself goes)."""
    import cProfile
    import io
    import pstats

    text = []
    for label, fn in (("forward", forward), ("forward+backward", step)):
        prof = cProfile.Profile()
        for _ in range(reps):
            torch.cuda.synchronize()
            prof.enable()
            fn()
            prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        text.append(f"## {label}: {reps} calls\n\n{buf.getvalue()}")
    path.write_text("\n".join(text))


def inputs_gib(tensors) -> float:
    """GiB held by an op's own inputs (each storage counted once): a step's peak with its inputs
    included is its own peak plus these, as ``ngdn bench`` measures it with only that op's
    inputs allocated. (Every op's inputs are built before the first step, so the allocator's
    absolute peak counts the other ops' inputs too.)"""
    seen = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) / 2 ** 30


def _graph_times(name, forward, leaves, do, bench) -> tuple:
    """``(forward, forward+backward)`` ms of the op's calls captured in CUDA graphs and replayed
    (``bench.cuda_graph``: the device's time without the host's launches); the step's gradients
    by ``torch.autograd.grad`` (graph-owned, no ``.grad`` accumulation). A capture that fails gives
    ``nan`` with the error in the log, and the other columns stand."""
    from bench.cuda_graph import graph_ms

    timer = lambda fn: float(bench(fn, warmup=25, rep=200))   # noqa: E731
    times = []
    for what, fn in (("forward", forward),
                     ("forward+backward", lambda: torch.autograd.grad(forward(), leaves, do, allow_unused=True))):
        try:
            times.append(round(graph_ms(fn, timer), 3))
        except Exception as e:      # noqa: BLE001 (the eager rows are measured already)
            _log(f"{name}: {what} not captured in a CUDA graph: {type(e).__name__}: {e}")
            times.append(float("nan"))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return tuple(times)


def _write(out: Path, rows: list, B, T, H, K, dtype: str):
    """``reads_ab.csv`` and ``reads_ab.md`` from the rows so far (rewritten after every depth)."""
    import triton

    flat = {r["L"]: r for r in rows if r["op"] == "flat" and r.get("round", 1) == 1}
    for r in rows:
        f = flat.get(r["L"])
        if f is None:           # --no-flat: no ratios
            r["fwd_vs_flat"] = r["fwdbwd_vs_flat"] = r["peak_vs_flat"] = r["peak_incl_vs_flat"] = ""
            r["fwdbwd_graph_vs_flat"] = ""
            continue
        r["fwd_vs_flat"] = round(r["fwd_ms"] / f["fwd_ms"], 3)
        r["fwdbwd_vs_flat"] = round(r["fwdbwd_ms"] / f["fwdbwd_ms"], 3)
        r["peak_vs_flat"] = round(r["peak_extra_gib"] / f["peak_extra_gib"], 3) if f["peak_extra_gib"] else ""
        r["peak_incl_vs_flat"] = round(r["peak_gib"] / f["peak_gib"], 3) if f["peak_gib"] else ""
        graphed = isinstance(r.get("fwdbwd_graph_ms"), float) and isinstance(f.get("fwdbwd_graph_ms"), float)
        r["fwdbwd_graph_vs_flat"] = round(r["fwdbwd_graph_ms"] / f["fwdbwd_graph_ms"], 3) if graphed else ""
    with open(out / "reads_ab.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Nested op variants beside flat GDN-2 ({torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, triton {triton.__version__})", "",
             f"B={B}, T={T}, H={H} per level (flat: L·H heads), K=V={K}, {dtype}; do_bench medians; "
             f"finiteness check off except `triton+check`; `peak` = memory one step allocates on top of its inputs; "
             f"`peak incl. inputs` adds the op's own inputs (the targets' measure, as `ngdn bench`'s).",
             "`host ms`: the host's time to launch one forward (or forward+backward) from an idle GPU (`bench.measure.host_ms`).",
             "`graph ms` (`--graph`): the same calls captured in a CUDA graph and replayed (`bench.cuda_graph`): "
             "the device's time without the host's launches.",
             "", "| L | op | fwd ms | fwd host ms | fwd+bwd ms | fwd+bwd host ms | fwd / flat | fwd+bwd / flat | "
                 "fwd+bwd floor ms | × floor | "
                 "peak GiB | peak / flat | peak incl. inputs GiB | incl. inputs / flat | "
                 "fwd graph ms | fwd+bwd graph ms | graph f+b / flat |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['L']} | {r['op']}{'' if r.get('round', 1) == 1 else ' #' + str(r['round'])} | {r['fwd_ms']} | {r['fwd_host_ms']} | {r['fwdbwd_ms']} | {r['fwdbwd_host_ms']} | "
              f"{r['fwd_vs_flat']} | "
              f"{r['fwdbwd_vs_flat']} | {r['fwdbwd_floor_ms']} | {r['fwdbwd_x_floor']} | {r['peak_extra_gib']} | "
              f"{r['peak_vs_flat']} | {r['peak_gib']} | {r['peak_incl_vs_flat']} | "
              f"{r.get('fwd_graph_ms', '')} | {r.get('fwdbwd_graph_ms', '')} | {r.get('fwdbwd_graph_vs_flat', '')} |"
              for r in rows]
    (out / "reads_ab.md").write_text("\n".join(lines) + "\n")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/tmp/reads_ab",
                        help="output folder (default results/tmp/reads_ab, not tracked)")
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 6])
    parser.add_argument("-B", type=int, default=8)
    parser.add_argument("-T", type=int, default=4096)
    parser.add_argument("-H", type=int, default=16)
    parser.add_argument("-K", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--no-flat", action="store_true", help="leave flat GDN-2 out (no ratios)")
    parser.add_argument("--memory-at-peak", action="store_true",
                        help="one more step per op with the allocator history on: memory_L<L>_<op>.md lists what "
                             "is alive at the peak and which line allocated it (bench.memory_at_peak)")
    parser.add_argument("--stage-peaks", action="store_true",
                        help="one more step per nested op: stage_peaks_L<L>_<op>.md gives every stage's memory "
                             "peak (bench.stage_peaks), not only the step's")
    parser.add_argument("--host-profile", action="store_true",
                        help="host_profile_L<L>_<op>.txt: cProfile of the host's forward and step launches "
                             "(write_host_profile)")
    parser.add_argument("--graph", action="store_true",
                        help="also time each op's forward and step captured in a CUDA graph and replayed "
                             "(bench.cuda_graph: the device's time without the host's launches)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every op this many times in turn (rows `op #2`, …; profiles in the first round only)")
    parser.add_argument("--precompile-workers", type=int, default=None,
                        help="before timing, compile flat's and the default nested op's kernels (every "
                             "autotuner config) in this many parallel processes (bench.precompile; default: "
                             "one per core less two, at most 12; 0: off). The variants' own kernels still "
                             "compile in the timing process")
    parser.add_argument("--warmup-only", action="store_true",
                        help="one step per op and exit: fills the Triton cache (compiled kernels and autotune "
                             "candidates) for a later timed run in another process")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not torch.cuda.is_available():
        parser.error("needs a GPU")
    prepare_environment()
    import triton

    from optimized.checks import finite_checks

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    device = CudaDevice()
    rows = []
    if args.precompile_workers != 0:
        from bench import precompile

        precompile.run_workers(precompile_workloads(args), precompile_args(args), args.precompile_workers, _log)
    rates = None if args.warmup_only else _rates()
    B, T, H, K = args.B, args.T, args.H, args.K
    for L in args.levels:
        ops = _ops(B, T, H, K, K, L, dtype, args.seed, ([] if args.no_flat else ["flat"]) + args.variants)
        # --rounds: every op timed again in turn, so a spread between rounds shows beside the ops' gaps
        for rnd, (name, (leaves, forward, do)) in ((rnd, op) for rnd in range(args.rounds) for op in ops.items()):
            check = name == "triton+check"

            def step(forward=forward, do=do):
                forward().backward(do)

            try:
                with finite_checks(check), ranges_always(name == "ranges-always"), \
                        nu_gates_up_to(128 if name == "gates-nu-128" else None), \
                        gates_in_one_launch({"gates-one-launch": True, "gates-per-block": False}.get(name)), \
                        param_casts_each(name == "params-cast-each"), \
                        level0_output_by_fla(name == "l0-output-fla"), \
                        db_partials_by_torch(name == "l0-db-add-torch"):
                    started = time.perf_counter()
                    _log(f"L={L} {name}: first step (compile, autotune) …")
                    step()                                   # compile, autotune, tables
                    torch.cuda.synchronize()
                    _log(f"L={L} {name}: first step took {time.perf_counter() - started:.0f} s")
                    if args.warmup_only:
                        _log(f"L={L} {name}: compiled (warm-up only)")
                        continue
                    fwd = triton.testing.do_bench(forward, warmup=25, rep=200, grad_to_none=leaves)
                    fwdbwd = triton.testing.do_bench(step, warmup=25, rep=200, grad_to_none=leaves)
                    fwd_host = host_ms(forward, device, reps=HOST_REPS)
                    fwdbwd_host = host_ms(step, device, reps=HOST_REPS)
                    fwd_graph = fwdbwd_graph = ""
                    if args.graph and not check:
                        fwd_graph, fwdbwd_graph = _graph_times(name, forward, leaves, do, triton.testing.do_bench)
                    for t in leaves:
                        t.grad = None
                    for t in leaves:
                        t.grad = None
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    step()
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
                    peak_total = peak + inputs_gib([*leaves, do])
                    for t in leaves:
                        t.grad = None
                    if rnd == 0 and args.memory_at_peak and not check:
                        from bench import memory_at_peak

                        snapshot = memory_at_peak.record(step)
                        memory_at_peak.write_table(
                            out / f"memory_L{L}_{name}.md",
                            f"L={L} {name}: memory alive at the peak of one forward+backward "
                            f"(B={B}, T={T}, H={H}, K=V={K}, {args.dtype})", snapshot)
                        for t in leaves:
                            t.grad = None
                    if rnd == 0 and args.stage_peaks and not check and name != "flat":
                        from bench import stage_peaks

                        stage_peaks.write_table(
                            out / f"stage_peaks_L{L}_{name}.md",
                            f"L={L} {name}: memory peak of each stage of one forward+backward "
                            f"(B={B}, T={T}, H={H}, K=V={K}, {args.dtype})",
                            stage_peaks.record(step), int(peak * 2 ** 30))
                        for t in leaves:
                            t.grad = None
                    if rnd == 0 and args.host_profile:
                        write_host_profile(out / f"host_profile_L{L}_{name}.txt", forward, step)
                        for t in leaves:
                            t.grad = None
                    if rnd == 0 and args.profile and not check and L == args.levels[0]:
                        write_profile_table(out / f"profile_L{L}_{name}.txt", step, leaves)
            except Exception as e:      # one broken op must not cost the others' numbers
                import traceback

                traceback.print_exc()
                _log(f"L={L} {name}: {type(e).__name__}: {e}")
                if args.warmup_only:    # no rates, no row: go on compiling the rest
                    continue
                fwd = fwdbwd = peak = peak_total = fwd_host = fwdbwd_host = float("nan")
                fwd_graph = fwdbwd_graph = ""
            floor = _floor_ms(name, B, T, H, K, L, dtype, rates)
            row = {"L": L, "op": name, "B": B, "T": T, "H": H, "K": K, "dtype": args.dtype,
                   "fwd_ms": round(fwd, 3), "fwd_host_ms": round(fwd_host, 3), "fwdbwd_ms": round(fwdbwd, 3),
                   "fwdbwd_host_ms": round(fwdbwd_host, 3), "peak_extra_gib": round(peak, 3),
                   "peak_gib": round(peak_total, 3), "fwd_floor_ms": round(floor[0], 3),
                   "fwdbwd_floor_ms": round(floor[1], 3), "fwdbwd_x_floor": round(fwdbwd / floor[1], 2),
                   "fwd_graph_ms": fwd_graph, "fwdbwd_graph_ms": fwdbwd_graph, "round": rnd + 1}
            rows.append(row)
            _log(str(row))
        del ops
        torch.cuda.empty_cache()
        if rows:
            lines = _write(out, rows, B, T, H, K, args.dtype)
    if rows:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
