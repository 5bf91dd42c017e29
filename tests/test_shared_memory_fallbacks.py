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
import optimized.promote_scan as scan
import optimized.state_grad as state_grad
from optimized import triton_mode
from optimized.promote_scan import promote_scan_bwd, promote_scan_fwd

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


ONE_STAGE_CASES = {"state_grad": _state_grad, "snapshot_read": _snapshot_reads("fwd"),
                   "snapshot_read_dq": _snapshot_reads("dq"), "fenwick_intra_bwd": _fenwick_intra_bwd}


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
