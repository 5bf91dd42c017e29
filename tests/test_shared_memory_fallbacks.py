"""Launches that a GPU refuses for shared memory (``OutOfResources``: an sm_86 or sm_89 GPU gives a
block 99 KiB, an A100 163, an H200 227) run a narrower form of the same kernel and give the same
values: the promote scans' V blocks of 32, then one pipeline stage; level 0's state-gradient kernel
at one stage. Each test stands a GPU with less shared memory in front of the real kernel: it refuses
the forms it would refuse, records the forms tried, and runs the rest."""
from unittest import mock

import pytest
import torch
from triton.runtime.errors import OutOfResources

import optimized.fits as fits
import optimized.nested.promote_scan as scan
import optimized.nested.state_grad as state_grad
from optimized import triton_mode
from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd

DEV = triton_mode.device()


class SmallGPU:
    """Stands for ``kernel``: a launch is refused where ``refuses(BV, num_stages)`` (``num_stages``
    None: Triton's default); the others run the real kernel. ``tried`` records ``(BV, num_stages)``."""

    def __init__(self, kernel, refuses):
        self.kernel, self.refuses, self.tried = kernel, refuses, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            form = (kwargs.get("BV"), kwargs.get("num_stages"))
            self.tried.append(form)
            if self.refuses(*form):
                raise OutOfResources(102400, 101376, "shared memory")
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture(autouse=True)
def no_remembered_refusals():
    with mock.patch.object(fits, "_FIRST_THAT_FITS", {}):
        yield


def scan_inputs(F=3, n=4, K=16, V=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, 1, K, V), (1, F, 1, n, K), (1, F, 1, n, V), (1, F, 1, n, K), (1, F, 1, n, V), (1, F, 1, K)]
    return [torch.rand(s, generator=gen).to(DEV) for s in shapes]


def test_reverse_scan_falls_back_to_v_blocks_of_32_without_the_shared_memory(monkeypatch):
    """The reverse scan's default V block (64) needs more shared memory per program than some GPUs
    have: the launch's ``OutOfResources`` makes it run V blocks of 32 (the same gradients); the
    refusal is remembered; an explicit ``block_v`` is not changed behind the caller's back."""
    M0, *pairs = scan_inputs()
    states = promote_scan_fwd(M0, *pairs)
    dstates = torch.rand(states.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    want = promote_scan_bwd(states, *pairs, dstates, block_v=32)
    gpu = SmallGPU(scan.promote_scan_bwd_kernel, lambda BV, stages: BV > 32)
    monkeypatch.setattr(scan, "promote_scan_bwd_kernel", gpu)
    got = promote_scan_bwd(states, *pairs, dstates)
    assert gpu.tried == [(64, None), (32, None)]
    for a, b in zip(got, want):     # bit for bit: both ran the same kernel at BV = 32, Triton's stages
        assert torch.equal(a, b)
    gpu.tried.clear()                                   # the refusal is remembered: no second one
    promote_scan_bwd(states, *pairs, dstates)
    assert gpu.tried == [(32, None)]
    with pytest.raises(OutOfResources):
        promote_scan_bwd(states, *pairs, dstates, block_v=64)


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
def test_scans_run_one_pipeline_stage_where_every_v_block_is_refused_at_triton_s(monkeypatch, prefetch):
    """At K = 256 a 99 KiB GPU refuses both scans at every V block with Triton's stages and takes them
    at one: the forward tries its V block then one stage, the reverse its default V block, 32, then
    32 at one stage; the states and gradients are those of the one-stage launch asked for by name.
    A caller's ``num_stages`` is kept: its refusal propagates."""
    name = {False: "promote_scan_{}_kernel", True: "promote_scan_{}_prefetch_kernel"}[prefetch]
    refuses = lambda BV, stages: stages != 1          # noqa: E731
    M0, *pairs = scan_inputs()
    want_states = promote_scan_fwd(M0, *pairs, num_stages=1, prefetch=prefetch)
    dstates = torch.rand(want_states.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    want_grads = promote_scan_bwd(want_states, *pairs, dstates, block_v=32, num_stages=1, prefetch=prefetch)

    fwd = SmallGPU(getattr(scan, name.format("fwd")), refuses)
    bwd = SmallGPU(getattr(scan, name.format("bwd")), refuses)
    monkeypatch.setattr(scan, name.format("fwd"), fwd)
    monkeypatch.setattr(scan, name.format("bwd"), bwd)
    states = promote_scan_fwd(M0, *pairs, prefetch=prefetch)
    grads = promote_scan_bwd(states, *pairs, dstates, prefetch=prefetch)
    assert fwd.tried == [(32, None), (32, 1)]
    assert bwd.tried == [(64, None), (32, None), (32, 1)]
    # bit for bit: the fallback and the named launch are the same kernel, V block and one stage
    assert torch.equal(states, want_states)
    for a, b in zip(grads, want_grads):
        assert torch.equal(a, b)
    fwd.tried.clear()
    promote_scan_fwd(M0, *pairs, prefetch=prefetch)
    assert fwd.tried == [(32, 1)]
    with pytest.raises(OutOfResources):
        promote_scan_fwd(M0, *pairs, num_stages=2, prefetch=prefetch)
    with pytest.raises(OutOfResources):
        promote_scan_bwd(states, *pairs, dstates, num_stages=3, prefetch=prefetch)


def _rand(*shape, gen):
    return torch.rand(shape, generator=gen).to(DEV)


def _state_grad(gen):
    """Level 0's state gradient (K = 256: 108–124 KiB with Triton's stages, sm_80 and sm_86)."""
    B, T, H, K, V = 2, 130, 2, 16, 24
    qg, kg, w = (_rand(B, T, H, K, gen=gen) for _ in range(3))
    args = (qg, kg, w, -_rand(B, T, H, K, gen=gen), _rand(B, T, H, V, gen=gen), _rand(B, T, H, V, gen=gen), 0.25)
    kwargs = dict(dht=_rand(B, H, K, V, gen=gen), ds=_rand(B, 2, H, K, V, gen=gen), want_dh0=True,
                  slots=torch.tensor([0, -1, 1], dtype=torch.int32, device=DEV))
    return state_grad, "state_grad_bwd_kernel", lambda: state_grad.state_grad_bwd(*args, **kwargs)


def _snapshot_reads(which):
    """The probe's snapshot reads ``ν = Q S`` and their ``dQ`` (64 pairs: 128 KiB with Triton's stages)."""
    def case(gen):
        from optimized.nested import snapshot_reads as module
        B, R, F, H, n, K, V = 2, 3, 4, 2, 20, 24, 40
        snaps = module.SnapshotRows(_rand(B, R, H, K, V, gen=gen), torch.tensor([0, 2, 1, 2], dtype=torch.int32,
                                                                               device=DEV))
        if which == "fwd":
            Q = _rand(H, n, K, gen=gen)
            return module, "snapshot_read_fwd_kernel", lambda: (module.snapshot_read(Q, snaps),)
        dnu = _rand(B, F, H, n, V, gen=gen)
        return module, "snapshot_read_dq_kernel", lambda: (module.snapshot_read_dq(dnu, snaps),)
    return case


def _fenwick_intra_bwd(gen):
    """Fenwick GDN-2's intra-chunk backward (V = 128: 128 KiB with Triton's stages, sm_80 and sm_86)."""
    from optimized.fenwick_gdn2 import intra as module
    B, T, H, V, L = 1, 100, 2, 24, 8
    args = (_rand(B, T, H, V, gen=gen), _rand(B, T, H, V, gen=gen), _rand(B, T, H, L, gen=gen),
            _rand(B, T, H, 64, gen=gen), _rand(B, T, H, 64, gen=gen), _rand(B, T, H, V, gen=gen))
    return module, "fenwick_intra_bwd_kernel", lambda: module.intra_bwd(*args)


def _reads_bwd_states(gen):
    """The reads' state gradients (float32 inputs: 162 KiB at K = V = 128 and 210 KiB at K = 256 with
    Triton's stages, sm_80 and sm_89), with factored snapshot gradients added."""
    from optimized.nested import reads_bwd as module
    from optimized.nested.state_grad import FactoredSnapGrads
    from tests.test_nested_reads_kernels import make_case
    x, tables, meta = make_case("L2_ragged")
    S, H, K, V, n = x["states"].shape[1], x["q"].shape[2], x["q"].shape[-1], x["o0"].shape[-1], 5
    snap = FactoredSnapGrads(_rand(H, n, K, gen=gen), _rand(1, 4, H, n, V, gen=gen).expand(2, 4, H, n, V))
    ranges = tuple(torch.tensor(r[:S], dtype=torch.int32, device=DEV) for r in ([0, 1, 3], [1, 3, 4]))
    return module, "reads_bwd_states_kernel", lambda: (module.reads_bwd_states(
        x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level, tables.row_chunk_lo,
        tables.row_chunk_hi, meta["scale"], slice(0, S), block_v=meta["block_v"], snap_grads=snap,
        fire_ranges=ranges),)


ONE_STAGE_CASES = {"state_grad": _state_grad, "snapshot_read": _snapshot_reads("fwd"),
                   "snapshot_read_dq": _snapshot_reads("dq"), "fenwick_intra_bwd": _fenwick_intra_bwd,
                   "reads_bwd_states": _reads_bwd_states}


@pytest.mark.parametrize("case", list(ONE_STAGE_CASES))
def test_launches_run_one_pipeline_stage_where_they_are_refused_at_triton_s(monkeypatch, case):
    """Launches whose pipeline stages ask more shared memory than a 99 KiB GPU gives (level 0's state
    gradient at K = 256, the snapshot reads at 64 pairs, Fenwick GDN-2's intra-chunk backward; figures
    in each launcher): refused, they run at one stage and give what a launch at one stage gives; the
    refusal is remembered."""
    module, name, call = ONE_STAGE_CASES[case](torch.Generator().manual_seed(0))
    kernel = getattr(module, name)

    class OneStage:
        def __getitem__(self, grid):
            return lambda *a, **kw: kernel[grid](*a, **{**kw, "num_stages": 1})

    monkeypatch.setattr(module, name, OneStage())
    want = call()
    gpu = SmallGPU(kernel, lambda BV, stages: stages != 1)
    monkeypatch.setattr(module, name, gpu)
    got = call()
    assert [stages for _, stages in gpu.tried] == [None, 1]
    for a, b in zip(got, want, strict=True):    # bit for bit: both the same kernel at one stage
        assert torch.equal(a, b)
    gpu.tried.clear()
    call()
    assert [stages for _, stages in gpu.tried] == [1]


class OneStage:
    """Stands for ``kernel``: every launch at one pipeline stage (what the fallback must equal)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *a, **kw: self.kernel[grid](*a, **{**kw, "num_stages": 1})


def test_two_phase_reverse_scan_runs_one_stage_where_refused(monkeypatch):
    """The two-phase reverse scan at K = 256 stages 100–133 KiB in phase 2 (sm_89 gives 99): refused,
    both phases run at one stage (phase 1 once: a refused launch never runs, and it writes its
    carried gradients in place) and give the one-stage launch's gradients; the refusal is
    remembered; a caller's ``num_stages`` is kept."""
    import optimized.nested.promote_scan_two_phase as two
    M0, *pairs = scan_inputs()
    states = promote_scan_fwd(M0, *pairs)
    dstates = torch.rand(states.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    want = two.promote_scan_bwd_two_phase(states, *pairs, dstates, num_stages=1)
    names = ("promote_scan_bwd_carry_kernel", "promote_scan_bwd_pairs_kernel")
    gpus = [SmallGPU(getattr(two, name), lambda BV, stages: stages != 1) for name in names]
    for name, gpu in zip(names, gpus):
        monkeypatch.setattr(two, name, gpu)
    got = two.promote_scan_bwd_two_phase(states, *pairs, dstates)
    assert [gpu.tried for gpu in gpus] == [[(32, None), (32, 1)]] * 2
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for gpu in gpus:
        gpu.tried.clear()
    two.promote_scan_bwd_two_phase(states, *pairs, dstates)
    assert [gpu.tried for gpu in gpus] == [[(32, 1)]] * 2
    with pytest.raises(OutOfResources):
        two.promote_scan_bwd_two_phase(states, *pairs, dstates, num_stages=2)


def test_fenwick_carry_scans_run_one_stage_where_two_are_refused(monkeypatch):
    """Fenwick GDN-2's carry scans with float32 activations stage 112–192 KiB at two stages
    (K = 64, 128; sm_80, sm_89): refused, both run at one stage and the op's output and gradients
    are those of one-stage launches; the refusal is remembered (per launch key: the backward
    launches its reverse scan with and without a final-state gradient)."""
    from optimized.fenwick_gdn2 import chunk_fenwick_gdn2
    from optimized.fenwick_gdn2 import states as module
    from tests.test_fenwick_gdn2_release import inputs

    names = ("fenwick_states_fwd_kernel", "fenwick_states_bwd_kernel")
    kernels = {name: getattr(module, name) for name in names}

    def step():
        x = inputs(B=1, T=70, H=1, K=16, V=16, L=8)
        o, _ = chunk_fenwick_gdn2(**x)
        return (o, *torch.autograd.grad(o.sum(), list(x.values())))

    for name in names:
        monkeypatch.setattr(module, name, OneStage(kernels[name]))
    want = step()
    gpus = [SmallGPU(kernels[name], lambda BV, stages: stages != 1) for name in names]
    for name, gpu in zip(names, gpus):
        monkeypatch.setattr(module, name, gpu)
    got = step()
    tried = [[stages for _, stages in gpu.tried] for gpu in gpus]     # the backward: two launch keys
    assert all(t and t == [2, 1] * (len(t) // 2) for t in tried), tried
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for gpu in gpus:
        gpu.tried.clear()
    step()
    assert [{stages for _, stages in gpu.tried} for gpu in gpus] == [{1}] * 2


def test_snapshot_grads_add_refuses_with_the_shape_and_the_limit(monkeypatch):
    """Adding factored snapshot gradients at K = 256, 64 pairs and TF32 asks 112 KiB at any stage
    (sm_89 gives 99): the launch's refusal becomes a ValueError that names the shape, the bytes, the
    GPU's limit and the nested op's other forms."""
    from optimized.nested import snapshot_grads as module
    from optimized.nested.plan import inject_rounds
    from optimized.nested.state_grad import FactoredSnapGrads
    gen = torch.Generator().manual_seed(0)
    B, S, H, n, K, V = 1, 3, 1, 4, 16, 16
    dst = _rand(B, S, H, K, V, gen=gen)
    grads = FactoredSnapGrads(_rand(H, n, K, gen=gen), _rand(B, 2, H, n, V, gen=gen))
    gpu = SmallGPU(module.add_snapshot_grads_kernel, lambda BV, stages: True)
    monkeypatch.setattr(module, "add_snapshot_grads_kernel", gpu)
    with pytest.raises(ValueError, match=r"K = 16, V = 16, n = 4 pairs at tf32 dots needs 102400 B .* this GPU "
                                         r"gives 101376 B; use the nested op's default snapshot_grads='factored'"):
        module.add_snapshot_grads(dst, grads, torch.tensor([0, 2], dtype=torch.int32, device=DEV),
                                  inject_rounds([0, 2], DEV), precision="tf32")
