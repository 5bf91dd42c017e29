"""Bad input to the production Nested GDN-2 op and its launch functions fails early (before
any kernel runs) with a ValueError/TypeError naming the argument."""
import pytest
import torch

from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import chunk_nested_gdn2, triton_mode
from optimized.nested.level0 import injection_slots
from optimized.nested.promote_scan import promote_scan_bwd, promote_scan_fwd
from optimized.nested.promote_scan_two_phase import promote_scan_bwd_two_phase
from optimized.nested.state_grad import state_grad_bwd
from reference.nested import Level
from tests.backward_twice import check_backward_twice

SHAPE = NestedShape(B=1, T=8, H=2, L=3, K=16, V=16)
NAMES = ("q", "k", "v", "g", "b", "w", "r")
DEV = triton_mode.device()


def inputs(dtype=torch.float32, **override):
    x = nested_inputs(SHAPE, seed=0)
    args = {n: x[n].to(DEV, dtype) for n in NAMES}
    args["levels"] = [Level(lv.scheme, lv.interval, {n: p.to(DEV, torch.float32) for n, p in lv.params.items()},
                            lv.reduction) for lv in x["levels"]]
    args["initial_states"] = [s.to(DEV, torch.float32) for s in x["initial_states"]]
    args.update(override)
    return args


def with_level(args, i, **change):
    lv = args["levels"][i]
    fields = {"scheme": lv.scheme, "interval": lv.interval, "params": dict(lv.params), "reduction": lv.reduction}
    fields.update(change)
    args["levels"][i] = Level(**fields)
    return args


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_rejects_dtypes_other_than_float32_and_bfloat16(dtype):
    with pytest.raises(ValueError, match=r"q must have dtype in \['torch.bfloat16', 'torch.float32'\], "
                                         rf"got {dtype}"):
        chunk_nested_gdn2(**inputs(dtype=dtype))


def test_query_bank_larger_than_k():
    args = inputs()
    params = dict(args["levels"][0].params, Q=torch.zeros(2, 17, 16, device=DEV))
    with pytest.raises(ValueError, match=r"holds n = 17 queries but K = 16: a query bank larger than K"):
        chunk_nested_gdn2(**with_level(args, 0, params=params))


@pytest.mark.parametrize("interval", [0, -2])
def test_non_positive_interval(interval):
    with pytest.raises(ValueError, match=r"levels\[1\] \(level ℓ = 2\)\.interval must be a positive number"):
        chunk_nested_gdn2(**with_level(inputs(), 1, interval=interval))


def test_too_few_router_levels():
    args = inputs()
    args["r"] = args["r"][..., :2]
    with pytest.raises(ValueError, match=r"r must have shape \[B, T, H, L\] = \(1, 8, 2, 3\)"):
        chunk_nested_gdn2(**args)


def test_levels_count_must_match_queries():
    args = inputs()
    args["levels"] = args["levels"][:1]
    with pytest.raises(ValueError, match=r"q has L = 3 levels .* but levels has 1 entries"):
        chunk_nested_gdn2(**args)


def test_state_of_wrong_dtype():
    args = inputs()
    args["initial_states"][2] = args["initial_states"][2].double()
    with pytest.raises(ValueError, match=r"initial_states\[2\] must have dtype torch.float32, got torch.float64"):
        chunk_nested_gdn2(**args)


def test_non_finite_parameter():
    args = inputs()
    params = dict(args["levels"][0].params)
    params["W_beta"] = params["W_beta"].clone()
    params["W_beta"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"levels\[0\]\.params\['W_beta'\] contains non-finite values"):
        chunk_nested_gdn2(**with_level(args, 0, params=params))


def test_unknown_scheme():
    with pytest.raises(ValueError, match=r"unknown scheme 'fenwick'"):
        chunk_nested_gdn2(**with_level(inputs(), 0, scheme="fenwick"))


def test_key_dim_above_fla_limit():
    B, T, H, L, K, V = 1, 4, 1, 1, 272, 16
    z = lambda *s: torch.zeros(*s, device=DEV)  # noqa: E731
    with pytest.raises(ValueError, match=r"key dim K must be <= 256"):
        chunk_nested_gdn2(z(B, T, H, L, K), z(B, T, H, K), z(B, T, H, V), z(B, T, H, K), z(B, T, H, K),
                          z(B, T, H, V), z(B, T, H, L), [])


def test_wrong_device_for_mode():
    other = "meta" if DEV == "cpu" else "cpu"      # meta: a second device without CUDA, no memory
    x = inputs()
    x = {n: (t.to(other) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    x["levels"] = [Level(lv.scheme, lv.interval, {n: p.to(other) for n, p in lv.params.items()}, lv.reduction)
                   for lv in x["levels"]]
    x["initial_states"] = [s.to(other) for s in x["initial_states"]]
    with pytest.raises(ValueError, match=f"q is on {other}, but optimized ops run on {DEV} tensors in "
                                         f"{triton_mode.MODE} mode"):
        chunk_nested_gdn2(**x)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        chunk_nested_gdn2(**inputs(q=[[1.0]]))


# --- launch functions ------------------------------------------------------------------------

def scan_args(F=2, n=4, K=16, V=16, dtype=torch.float32):
    z = lambda *s: torch.zeros(*s, device=DEV, dtype=dtype)  # noqa: E731
    return [z(1, 1, K, V), z(1, F, 1, n, K), z(1, F, 1, n, V), z(1, F, 1, n, K), z(1, F, 1, n, V), z(1, F, 1, K)]


def test_scan_rejects_bad_shape():
    args = scan_args()
    args[4] = args[4][..., :8]
    with pytest.raises(ValueError, match=r"omega must have shape \(1, 2, 1, 4, 16\), got \(1, 2, 1, 4, 8\)"):
        promote_scan_fwd(*args)


def test_scan_rejects_non_float32():
    with pytest.raises(ValueError, match="kappa must be float32, got torch.float64"):
        promote_scan_fwd(*scan_args(dtype=torch.float64))


@pytest.mark.parametrize("scan_bwd", [promote_scan_bwd, promote_scan_bwd_two_phase], ids=["fused", "two_phase"])
def test_scan_backward_rejects_bad_state_count(scan_bwd):
    M0, *pairs = scan_args()
    states = torch.zeros(1, 3, 1, 16, 16, device=DEV)          # F + 1 = 3 stored states
    with pytest.raises(ValueError, match=r"dstates must have shape \(1, 3, 1, 16, 16\) .*, "
                                         r"got \(1, 2, 1, 16, 16\)"):
        scan_bwd(states, *pairs, states[:, :2])
    with pytest.raises(ValueError, match="precision must be one of"):
        scan_bwd(states, *pairs, states, precision="bf16")


@pytest.mark.parametrize("scan", ["fwd", "fused", "two_phase"])
def test_scan_rejects_bad_launch_options(scan):
    """``num_warps`` (a power of two, 1 to 16) and ``num_stages`` (an int, 1 to 6) are checked
    before the launch; None keeps the defaults."""
    M0, *pairs = scan_args()
    states = torch.zeros(1, 3, 1, 16, 16, device=DEV)
    call = {"fwd": lambda **kw: promote_scan_fwd(M0, *pairs, **kw),
            "fused": lambda **kw: promote_scan_bwd(states, *pairs, states, **kw),
            "two_phase": lambda **kw: promote_scan_bwd_two_phase(states, *pairs, states, **kw)}[scan]
    with pytest.raises(ValueError, match="num_warps must be a power of two from 1 to 16, got 3"):
        call(num_warps=3)
    for bad in (0, 7, 2.0):
        with pytest.raises(ValueError, match="num_stages must be an int from 1 to 6"):
            call(num_stages=bad)
    call(num_warps=4, num_stages=1)


def test_state_grad_rejects_bad_slots():
    z = lambda *s: torch.zeros(*s, device=DEV)  # noqa: E731
    qkwg = [z(1, 130, 1, 16) for _ in range(4)]
    with pytest.raises(ValueError, match=r"slots must hold one entry per chunk \(3\)"):
        state_grad_bwd(*qkwg, z(1, 130, 1, 16), z(1, 130, 1, 16), 0.25, ds=z(1, 1, 1, 16, 16),
                       slots=torch.zeros(2, dtype=torch.int32, device=DEV))


def test_scans_reject_a_prefetch_that_is_not_a_bool():
    args = scan_args()
    with pytest.raises(TypeError, match="prefetch must be a bool, got str"):
        promote_scan_fwd(*args, prefetch="yes")
    states = promote_scan_fwd(*args)
    with pytest.raises(TypeError, match="prefetch must be a bool, got int"):
        promote_scan_bwd(states, *args[1:], torch.zeros_like(states), prefetch=1)


def test_scan_rejects_bad_fire_offsets():
    """Packed sequences' firing offsets: int32 ``[n + 1]`` on the pairs' device, pairs in one row."""
    args = scan_args()
    i32 = dict(dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"fire_offsets must be int32 \[n \+ 1\]"):
        promote_scan_fwd(*args, fire_offsets=torch.tensor([0, 2], dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match=r"fire_offsets must be int32 \[n \+ 1\] with n >= 1"):
        promote_scan_fwd(*args, fire_offsets=torch.tensor([0], **i32))
    with pytest.raises(TypeError, match="fire_offsets must be a torch.Tensor"):
        promote_scan_fwd(*args, fire_offsets=[0, 2])
    two_rows = [torch.cat([x, x]) for x in args[1:]]
    with pytest.raises(ValueError, match=r"packed sequences \(fire_offsets\) need the pairs in one row"):
        promote_scan_fwd(None, *two_rows, fire_offsets=torch.tensor([0, 1, 2], **i32))
    with pytest.raises(ValueError, match=r"M0 must have shape \(2, 1, 16, 16\)"):     # one per sequence
        promote_scan_fwd(*args, fire_offsets=torch.tensor([0, 1, 2], **i32))
    states = promote_scan_fwd(None, *args[1:], fire_offsets=torch.tensor([0, 1, 2], **i32))
    assert states.shape == (1, 4, 1, 16, 16)          # F + n rows: each sequence's initial state and firings
    with pytest.raises(ValueError, match="the two-phase reverse scan does not take packed sequences"):
        promote_scan_bwd_two_phase(states, *args[1:], states, fire_offsets=torch.tensor([0, 1, 2], **i32))


def test_state_grad_packed_arguments_go_together():
    z = lambda *s: torch.zeros(*s, device=DEV)  # noqa: E731
    qkwg = [z(1, 130, 1, 16) for _ in range(4)]
    cu = torch.tensor([0, 65, 130], device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens and chunk_offsets go together"):
        state_grad_bwd(*qkwg, z(1, 130, 1, 16), z(1, 130, 1, 16), 0.25, cu_seqlens=cu)
    with pytest.raises(ValueError, match="packed sequences: slots is needed"):
        state_grad_bwd(*qkwg, z(1, 130, 1, 16), z(1, 130, 1, 16), 0.25, cu_seqlens=cu,
                       chunk_offsets=torch.tensor([0, 2, 4], dtype=torch.int32, device=DEV))
    two = [torch.cat([x, x]) for x in qkwg]
    with pytest.raises(ValueError, match="packed sequences need B = 1, got B = 2"):
        state_grad_bwd(*two, z(2, 130, 1, 16), z(2, 130, 1, 16), 0.25, cu_seqlens=cu,
                       chunk_offsets=torch.tensor([0, 2, 4], dtype=torch.int32, device=DEV))


def test_reads_refuse_chunk_bounds_with_several_rows():
    from optimized.nested.reads_fwd import reads_fwd

    q = torch.zeros(2, 64, 1, 2, 16, device=DEV)
    r = torch.zeros(2, 64, 1, 2, device=DEV)
    o0 = torch.zeros(2, 64, 1, 16, device=DEV)
    states = torch.zeros(2, 1, 1, 16, 16, device=DEV)
    bounds = torch.tensor([[0, 64]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="chunk_bounds: packed sequences need B = 1, got B = 2"):
        reads_fwd(q, r, o0, states, torch.zeros(2, 1, dtype=torch.int32, device=DEV), 0.25, chunk_bounds=bounds)
    with pytest.raises(ValueError, match=r"chunk_bounds must have dtype in \['torch.int32'\], got torch.int64"):
        reads_fwd(q[:1], r[:1], o0[:1], states[:1], torch.zeros(2, 1, dtype=torch.int32, device=DEV), 0.25,
                  chunk_bounds=bounds.to(torch.int64))


@pytest.mark.compiles
def test_packed_call_with_the_pytorch_reads_is_refused():
    """The PyTorch reads (a benchmark's alternative piece) take one sequence per row: a packed
    call with them says so instead of reading the wrong tokens."""
    from optimized.nested import Pieces, _nested
    from optimized.nested.pieces import reads_router_bwd_torch_levels
    from optimized.nested.reads_torch import reads_router_fwd_torch

    args = inputs()
    args = {n: (x[:1] if n in NAMES else x) for n, x in args.items()}
    args["initial_states"] = None
    pieces = Pieces(reads_fwd=reads_router_fwd_torch, reads_bwd=reads_router_bwd_torch_levels)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="the PyTorch reads take one sequence per row"):
        _nested(*(args[n] for n in NAMES), args["levels"], pieces=pieces, cu_seqlens=cu)


def test_injection_chunks_distinct():
    with pytest.raises(ValueError, match="chunk 1 is injected twice"):
        injection_slots(3, [1, 1], DEV)


@pytest.mark.compiles
def test_backward_twice_needs_retain_graph_and_then_agrees():
    """retain_graph=True keeps the saved state (the benchmark times backward that way);
    a second backward without it fails with a message saying what to do."""
    args = inputs()
    leaves = [args[n].requires_grad_() for n in NAMES]
    o = chunk_nested_gdn2(**args)[0]
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
    check_backward_twice(o, leaves, do)
