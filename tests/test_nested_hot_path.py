"""The nested op's hot path: no host syncs with the finiteness check off,
the schedule's index tensors built once per (T, intervals, device), and the check's flag; its
memory: the upper levels' saved buffers gone before level 0's backward."""
import weakref

import pytest
import torch

from ngdn.compile_buckets import on_bucket
from ngdn.nested_inputs import NestedShape, nested_inputs
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes
from optimized import chunk_nested_gdn2, triton_mode
import optimized.nested.bwd as nested_bwd_module
from optimized.checks import finite_checks, finite_checks_enabled
from optimized.nested.plan import add_in_rounds, add_rounds, device_tables, make_plan
from reference.nested import Level

NAMES = ("q", "k", "v", "g", "b", "w", "r")
DEV = triton_mode.device()


def inputs(shape, dtype=torch.float32, scheme="learned"):
    x = nested_inputs(shape, seed=0, scheme=scheme)
    args = {n: x[n].to(DEV, dtype).requires_grad_() for n in NAMES}
    args["levels"] = [Level(lv.scheme, lv.interval, {n: p.to(DEV, torch.float32) for n, p in lv.params.items()},
                            lv.reduction) for lv in x["levels"]]
    return args


@pytest.mark.parametrize("index", [[0, 2, 4, 6], [3], [1, 1, 4, 1, 2], [0, 1, 3, 7], []],
                         ids=["even", "one", "repeated", "uneven", "none"])
def test_add_in_rounds_is_an_accumulating_scatter(index):
    """``dst[:, index[i]] += src[:, i]`` for every i, repeated targets included; evenly spaced
    targets take the one-add slice path (the built-in schedules' case)."""
    gen = torch.Generator().manual_seed(0)
    dst, src = torch.randn(2, 9, 3, generator=gen), torch.randn(2, len(index), 3, generator=gen)
    want = dst.clone()
    for i, t in enumerate(index):
        want[:, t] += src[:, i]
    rounds = add_rounds(index, "cpu")
    assert len(rounds) == max([index.count(t) for t in index], default=0)
    if index and index in ([0, 2, 4, 6], [3]):
        assert all(isinstance(x, slice) for x in rounds[0])
    add_in_rounds(dst, rounds, src)
    assert torch.equal(dst, want)       # the same float adds in the same order per element: exact


def test_device_tables_are_built_once_per_plan_and_device():
    plan = make_plan(300, (1, 2))
    assert device_tables(plan, torch.device(DEV)) is device_tables(plan, torch.device(DEV))
    t = device_tables(plan, torch.device(DEV))
    # every chunk of level ℓ reads a row of level ℓ; every row's chunk range reads that row
    for ℓ in range(1, plan.L):
        rows = t.read_row[ℓ].tolist()
        assert rows == [t.row_offset[ℓ] + i for i in plan.read_index[ℓ]]
    for s in range(t.S):
        lo, hi, ℓ = int(t.row_chunk_lo[s]), int(t.row_chunk_hi[s]), int(t.row_level[s])
        assert all(int(t.read_row[ℓ, j]) == s for j in range(lo, hi))
        assert sum(int(t.read_row[ℓ, j]) == s for j in range(plan.N)) == hi - lo


def test_finite_check_flag_skips_the_check():
    args = inputs(NestedShape(B=1, T=8, H=2, L=3, K=16, V=16))
    args["v"] = args["v"].detach().clone()
    args["v"][0, 3, 0, 0] = float("nan")
    assert finite_checks_enabled()
    with pytest.raises(ValueError, match="v holds a non-finite value"):
        chunk_nested_gdn2(**args)
    with finite_checks(False):
        assert not finite_checks_enabled()
        o, _ = chunk_nested_gdn2(**args)          # undefined output, but no error
    assert finite_checks_enabled()


@pytest.mark.skipif(triton_mode.MODE != triton_mode.CUDA, reason="host syncs exist only against a GPU stream")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_forward_and_backward_make_no_host_sync(dtype):
    """With the finiteness check off (its one sync is the documented price of the check) a
    forward and backward never wait for the GPU: ``torch.cuda.set_sync_debug_mode('error')``
    raises at any synchronising call."""
    shape = on_bucket(NestedShape(B=1, T=200, H=2, L=3, K=16, V=16))
    args = inputs(shape, dtype)
    with finite_checks(False):
        o, _ = chunk_nested_gdn2(**args)      # first call: compile, autotune, build the tables
        o.float().sum().backward()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            o, _ = chunk_nested_gdn2(**args)
            o.float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("T, intervals", [(640, (1, 2)), (700, (3, 2)), (130, (4,)), (64, (1,)), (1, (2,))])
def test_level1_snapshots_from_the_cached_tables(T, intervals):
    """``chunk_end_states`` with the tables' ``end_index`` (a slice for an evenly spaced schedule:
    no gather, no concatenation) equals the states gathered chunk by chunk, final state last."""
    from optimized.nested.level0 import chunk_end_states

    plan = make_plan(T, intervals)
    tables = device_tables(plan, "cpu")
    assert isinstance(tables.end_index, slice)
    gen = torch.Generator().manual_seed(T)
    h = torch.randn(2, plan.N, 3, 4, 5, generator=gen)
    final = torch.randn(2, 3, 4, 5, generator=gen)
    got = chunk_end_states(h, final, plan.sources[1], index=tables.end_index,
                           includes_final=tables.end_includes_final)
    want = [final if c + 1 == plan.N else h[:, c + 1] for c in plan.sources[1]]
    want = torch.stack(want, 1) if want else h.new_zeros(2, 0, 3, 4, 5)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(chunk_end_states(h, final, plan.sources[1]), want)   # the tensor-index path
    # the in-place read's row table (snapshot_reads): row c + 1 of h, or -1 for the batch entry's final state
    rows = tables.snap_rows[1].tolist()
    by_rows = [torch.stack([h[b, r] if r >= 0 else final[b - 1 - r] for r in rows]) if rows else h.new_zeros(0, 3, 4, 5)
               for b in range(2)]
    assert torch.equal(torch.stack(by_rows), want)


@pytest.mark.parametrize("retain_graph", [False, True], ids=["plain", "retain_graph"])
def test_upper_level_buffers_released_before_level0_backward(monkeypatch, retain_graph):
    """A plain backward drops the stored states once level 1's scan is done (before level 1's
    probe backward, where the step peaked: H200, 6.58 GiB at L = 4), those of levels ≥ 2 (their
    own allocation) once level 2's scan is done, each level's probe outputs
    after its own probe backward, and the probes' outputs before level 0's backward; with
    retain_graph=True they stay (a second backward needs them, and agrees:
    tests/test_nested_optimized_errors.py)."""
    args = inputs(on_bucket(NestedShape(B=1, T=130, H=1, L=3, K=16, V=16)))
    o = chunk_nested_gdn2(**args)[0]
    saved = o.grad_fn.saved
    states, pairs = weakref.ref(saved.states), weakref.ref(saved.probes[1][0][0])
    pairs_2 = weakref.ref(saved.probes[2][0][0])
    higher = weakref.ref(saved.states.hi)                  # level 2's rows: their own allocation
    alive, states_at_probe_bwd, pairs_2_at_probe_bwd, higher_at_probe_bwd = {}, [], [], []
    level0_bwd, probe_bwd = nested_bwd_module.level0_bwd, nested_bwd_module.probe_bwd

    def spy(*a, **kw):
        alive["states"], alive["pairs"] = states() is not None, pairs() is not None
        return level0_bwd(*a, **kw)

    def probe_spy(*a, **kw):
        states_at_probe_bwd.append(states() is not None)
        higher_at_probe_bwd.append(higher() is not None)
        pairs_2_at_probe_bwd.append(pairs_2() is not None)
        return probe_bwd(*a, **kw)

    monkeypatch.setattr(nested_bwd_module, "level0_bwd", spy)
    monkeypatch.setattr(nested_bwd_module, "probe_bwd", probe_spy)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
    leaves = [args[n] for n in NAMES]
    torch.autograd.grad(o, leaves, do, retain_graph=retain_graph)
    assert alive == {"states": retain_graph, "pairs": retain_graph}
    # levels 2 then 1: level 1's scan still needs the states at level 2's probe backward
    assert states_at_probe_bwd == [True, retain_graph]
    # level 2's probe outputs are spent after its own probe backward: gone at level 1's
    assert pairs_2_at_probe_bwd == [True, retain_graph]
    # level 2's stored states are spent after its own scan: gone at both probe backwards
    assert higher_at_probe_bwd == [retain_graph, retain_graph]


@pytest.mark.parametrize("retain_graph", [False, True], ids=["plain", "retain_graph"])
def test_level0_forward_tensors_released_before_fla_intra_backward(monkeypatch, retain_graph):
    """A plain backward drops what level 0's backward has spent before fla's intra backward
    (where the step peaked: H200, L = 4, 5.66 GiB): fla's forward tensors read only by the earlier
    pieces (``Aqk``, ``qg``, ``kg``, ``w_wy``, ``h``, ``v_new``, ``Akk``) and level 0's output, read
    by the reads' backward only; with retain_graph=True they stay. fla's WY values ``u`` are
    never kept (the backward reads ``v_new``)."""
    import optimized.nested.level0 as level0_module

    args = inputs(on_bucket(NestedShape(B=1, T=130, H=1, L=3, K=16, V=16)))
    o = chunk_nested_gdn2(**args)[0]
    saved = o.grad_fn.saved
    assert not hasattr(saved.level0, "u_wy")
    names = ("Aqk", "qg", "kg", "w_wy", "h", "v_new", "Akk")
    refs = {n: weakref.ref(getattr(saved.level0, n)) for n in names} | {"o0": weakref.ref(saved.o0)}
    at_intra = []
    intra = level0_module.level0_bwd_intra

    def spy(*a, **kw):
        at_intra.append({n: r() is not None for n, r in refs.items()})
        return intra(*a, **kw)

    monkeypatch.setattr(level0_module, "level0_bwd_intra", spy)
    del saved
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
    torch.autograd.grad(o, [args[n] for n in NAMES], do, retain_graph=retain_graph)
    assert at_intra == [{n: retain_graph for n in refs}]


def test_scan_block_v_splits_the_scans_alone_and_agrees():
    """``Pieces(scan_block_v=16)`` (reads_ab ``scan-bv16``): the promote scans run on V blocks of 16
    while the reads keep their default, and the op's values and gradients agree with the default
    pieces (only the order of the per-V-block partial sums differs)."""
    from optimized.nested import Pieces, _nested
    import optimized.nested.pieces as pieces_module

    seen = []
    scan_fwd = pieces_module.promote_scan_fwd

    def spy(*a, block_v=None, **kw):
        seen.append(block_v)
        return scan_fwd(*a, block_v=block_v, **kw)

    results = []
    for pieces in (Pieces(), Pieces(scan_fwd=spy, scan_block_v=16)):
        args = inputs(on_bucket(NestedShape(B=1, T=130, H=1, L=3, K=32, V=32)))
        o = _nested(pieces=pieces, **args)[0]
        leaves = [args[n] for n in NAMES]
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
        results.append([o, *torch.autograd.grad(o, leaves, do)])
    assert seen == [16, 16]
    assert_passes(variant_errors(*results))


def test_stored_states_in_one_allocation_agree_bit_for_bit():
    """``Pieces(split_stored_states=False)`` (reads_ab ``states-one-buffer``): every upper level's
    stored states in one allocation instead of level 1's and the higher levels' apart; the same
    kernels, launches and constexprs on the same rows (where a row lives is runtime arguments: the
    reads' ``S_LO``, not specialised, and batch strides, multiples of H·K·V in both layouts, which
    is a multiple of 16 at the shapes this runs, so Triton specialises them alike), so the op's
    values and gradients are bit-identical (L = 3: the reads of level 2 come from the second
    allocation in the default)."""
    from optimized.nested import Pieces, _nested

    results, his = [], []
    for pieces in (Pieces(), Pieces(split_stored_states=False)):
        # B = 2: the two allocations' batch strides differ (S_lo and S - S_lo rows); H = 2 and
        # more levels: the reads kernels' own split test (tests/test_nested_reads_kernels.py)
        args = inputs(on_bucket(NestedShape(B=2, T=130, H=1, L=3, K=16, V=16)))
        o = _nested(pieces=pieces, **args)[0]
        his.append(o.grad_fn.saved.states.hi.shape[1])
        leaves = [args[n] for n in NAMES]
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
        results.append([o, *torch.autograd.grad(o, leaves, do)])
    assert his[0] > 0 and his[1] == 0
    for want, got in zip(*results):
        assert torch.equal(got, want)


def variant_errors(want: list, got: list) -> dict:
    """The op's output (first) and every gradient of another form against the default's, relative
    (``tolerances.yaml`` ``nested_variants``: different kernels or blocks round differently)."""
    from ngdn.tolerances import compare

    return {f"{'output' if i == 0 else f'gradient {i}'}":
            compare("nested_variants", torch.float32, {"output" if i == 0 else "gradients": (g, w)}, mode="any")
            ["output" if i == 0 else "gradients"] for i, (w, g) in enumerate(zip(want, got))}


@pytest.mark.parametrize("scheme", ["learned", "merge"])
def test_triton_probe_gates_in_the_op_agree(scheme, monkeypatch):
    """The op's default gates, which make ``z`` themselves from ν and the weights
    (``Pieces(probe_gates="triton-nu")``, reads_ab ``gates-nu``), and the Triton gates on a bmm's
    ``z`` (``"triton"``, reads_ab ``gates-triton``): their values and every gradient agree with the
    PyTorch gates (``probe_gates="torch"``, reads_ab ``gates-torch``), and each runs its own
    kernels, once per upper level and pass. The kernels' own properties: property_tests/test_probe_fused.py."""
    from optimized.nested import Pieces, _nested
    import optimized.nested.probe_fused as probe_fused_module

    calls = []

    def spy(name):
        real = getattr(probe_fused_module, name)

        def call(*a, **kw):
            calls.append(name)
            return real(*a, **kw)
        monkeypatch.setattr(probe_fused_module, name, call)

    for name in ("probe_gates_fwd", "probe_gates_bwd", "probe_gates_nu_fwd", "probe_gates_nu_bwd"):
        spy(name)
    results, seen = [], []
    assert Pieces().probe_gates == "triton-nu"
    for pieces in (Pieces(probe_gates="torch"), Pieces(probe_gates="triton"), Pieces()):
        calls.clear()
        args = inputs(on_bucket(NestedShape(B=1, T=130, H=1, L=3, K=16, V=16)), scheme=scheme)
        args["levels"] = [Level(lv.scheme, lv.interval, {n: p.requires_grad_() for n, p in lv.params.items()},
                                lv.reduction) for lv in args["levels"]]
        o = _nested(pieces=pieces, **args)[0]
        leaves = [args[n] for n in NAMES] + [p for lv in args["levels"] for p in lv.params.values()]
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
        results.append([o, *torch.autograd.grad(o, leaves, do)])
        seen.append(sorted(calls))
    # The default's kernels where the op's own query says its blocks fit (on the CPU's sizes; on
    # CUDA bucket a's V = 80 is above the IEEE block limit, and the default runs "triton"'s kernels)
    from optimized.nested.probe_fused import _gates_from_nu
    from reference.schemes import get_scheme

    H, K, V = args["q"].shape[2], args["k"].shape[-1], args["v"].shape[-1]
    from_nu = [_gates_from_nu("triton-nu", lv.scheme, get_scheme(lv.scheme).query_count(lv.params, H, K, V), K, V,
                              Pieces().probe_precision(torch.float32)) for lv in args["levels"]]
    default = sorted(f"probe_gates{'_nu' if nu else ''}_{phase}" for nu in from_nu for phase in ("fwd", "bwd"))
    assert seen == [[], ["probe_gates_bwd"] * 2 + ["probe_gates_fwd"] * 2, default]
    assert on_cuda() or all(from_nu), "the CPU's sizes reach the kernels that make z from ν"
    for twin in results[1:]:
        assert_passes(variant_errors(results[0], twin))


@pytest.mark.parametrize("scheme", ["learned", "merge"])
def test_a_level_that_never_fires_gets_no_parameter_gradient(scheme):
    """T = 70, intervals (1, 2): level 1 fires once, level 2 never. Its scheme parameters are read
    by no computation: their ``.grad`` stays None, as the float64 reference's autograd leaves it
    (zeros would still draw an optimizer's weight decay and moments); level 1's are tensors."""
    from reference import naive_nested_gdn2

    x = nested_inputs(on_bucket(NestedShape(B=1, T=70, H=1, L=3, K=16, V=16)), seed=0, scheme=scheme,
                      intervals=[1, 2])
    for op, dtype, dev in ((chunk_nested_gdn2, torch.float32, DEV), (naive_nested_gdn2, torch.float64, "cpu")):
        acts = [x[n].to(dev, dtype).requires_grad_() for n in NAMES]
        levels = [Level(lv.scheme, lv.interval, {n: p.to(dev, dtype).requires_grad_() for n, p in lv.params.items()},
                        lv.reduction) for lv in x["levels"]]
        op(*acts, levels)[0].sum().backward()
        assert all(p.grad is not None for p in levels[0].params.values()), op.__name__
        assert all(p.grad is None for p in levels[1].params.values()), op.__name__
