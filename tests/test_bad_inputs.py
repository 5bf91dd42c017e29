"""Bad inputs across every public entry point (the table in docs/bad-inputs.md), iterating the op
table (``ngdn.ops.OPS``): the cases common to every op run on each entry's valid small call
(``OpInfo.small_call``); each entry's own bad inputs (``OpInfo.error_inputs``: initial states of the
wrong type or count, sizes past int32 offsets, op-specific refusals) run in
``test_entry_error_inputs``. Common cases: bfloat16 under the interpreter, float16 and mixed dtypes
(one rule, one message), non-finite activations (the optimized ops raise; the references stay
causal), sizes past int32 offsets, the NumPy twins' checks, ``make_levels`` arguments and
``chunk_fenwick``'s return value. Every check fails before a kernel runs, so these tests are cheap."""
import re

import numpy as np
import pytest
import torch

from ngdn import ops
from optimized import chunk_fenwick, chunk_gdn2, triton_mode
from reference import (make_levels, naive_fenwick, naive_fenwick_gdn2_numpy, naive_fenwick_numpy, naive_gdn2,
                       naive_gdn2_numpy, naive_nested_gdn2, naive_nested_gdn2_numpy, naive_tensor3d,
                       naive_tensor3d_numpy, quadratic_fenwick, quadratic_fenwick_numpy)

DEV = triton_mode.device()
CPU = triton_mode.MODE != triton_mode.CUDA


# --- one valid call per entry: the op table's small calls ---------------------------------------

def first_activation(info) -> str:
    return next(iter(info.small_call()))


OP_PARAMS = [pytest.param(info.op, info.reference, info.small_call, first_activation(info), id=info.name)
             for info in ops.OPS]
gdn2_call, nested_call, fenwick_call = (ops.get(n).small_call for n in ("gdn2", "nested", "fenwick"))


def tensor3d_call(mode, dtype=torch.float32, device=DEV):
    return ops.get(f"tensor3d-{mode}").small_call(dtype, device)


def test_every_table_op_has_a_small_call():
    """The bad-input cases start from each entry's valid small call (``OpInfo.small_call``)."""
    assert all(callable(info.small_call) for info in ops.OPS)


# --- each entry's own error inputs (``OpInfo.error_inputs``) ------------------------------------

ERROR_INPUTS = [pytest.param(info, case, side, id=f"{info.name}-{case.id}-{side}")
                for info in ops.OPS for case in info.error_inputs() for side in case.sides]


@pytest.mark.parametrize("info, case, side", ERROR_INPUTS)
def test_entry_error_inputs(info, case, side):
    """The entry's bad calls raise its error and message before any kernel runs, optimized op and
    reference (float64 on the CPU)."""
    reason = ops.skip_reason(info, f"{side}: {case.id}")
    if reason is not None:
        pytest.skip(reason)
    op = info.op if side == "optimized" else info.reference
    args = info.small_call() if side == "optimized" else info.small_call(torch.float64, "cpu")
    with pytest.raises(case.error, match=case.match):
        op(**case.bad(args))


# --- types: a list where a tensor belongs, a non-finite scale -------------------------------------

@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("side", ["optimized", "reference"])
def test_a_list_where_a_tensor_belongs_is_a_type_error(opt, ref, call, first, side):
    """CONTRACT "Errors": a wrong type is a TypeError naming the argument (a list once reached
    ``.device`` and failed with an AttributeError)."""
    op = opt if side == "optimized" else ref
    args = call() if side == "optimized" else call(torch.float64, "cpu")
    args["v"] = [[0.0]]
    with pytest.raises(TypeError, match=r"\bv must be a torch.Tensor"):
        op(**args)


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_scale_is_refused(opt, ref, call, first, scale):
    for op, args in ((opt, call()), (ref, call(torch.float64, "cpu"))):
        with pytest.raises(ValueError, match=r"scale must be finite"):
            op(**args, scale=scale)


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("scale", [1e39, -1e39])
def test_a_scale_beyond_float32_is_refused_where_the_inputs_compute_in_float32(opt, ref, call, first, scale):
    """scale = ±1e39 is a finite Python float but ±inf in float32: the optimized ops returned NaN. Refused
    for float32 inputs (op and reference alike) whatever its sign, computed by the float64 reference."""
    for op in (opt, ref):
        with pytest.raises(ValueError, match=rf"scale = {scale:g} is not finite in float32".replace("+", r"\+")):
            op(**call(), scale=scale)
    assert torch.isfinite(ref(**call(torch.float64, "cpu"), scale=scale)[0]).all()


# --- dtypes: bfloat16 under the interpreter, float16, mixed --------------------------------------

@pytest.mark.skipif(not CPU, reason="bfloat16 is computed (and tested) in cuda mode")
@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_bfloat16_refused_under_the_interpreter(opt, ref, call, first):
    """bf16 CPU tensors came back as 1e9-1e10; now refused, naming the mode."""
    with pytest.raises(ValueError, match=rf"{first} is torch.bfloat16, which the Triton interpreter "
                                         r"\(cpu-interpret mode\) does not compute correctly; use float32 on "
                                         r"the CPU \(bfloat16 runs on CUDA\)"):
        opt(**call(torch.bfloat16))


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_float16_one_rule_for_every_optimized_op(opt, ref, call, first):
    """Every optimized op takes float32 and bfloat16, none float16 (no kernel is tested in it)."""
    with pytest.raises(ValueError, match=rf"{first} must have dtype in \['torch.bfloat16', 'torch.float32'\], "
                                         r"got torch.float16"):
        opt(**call(torch.float16))


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_mixed_dtypes_one_message(opt, ref, call, first):
    """The reference and the optimized op give the same message for one mixed input."""
    messages = []
    for op in (opt, ref):
        args = call()
        args["v"] = args["v"].half()
        with pytest.raises(ValueError) as error:
            op(**args)
        messages.append(str(error.value))
    assert messages[0] == messages[1] == f"v has dtype torch.float16 but {first} has torch.float32; " \
                                         "inputs must share one dtype"


# --- non-finite activations ---------------------------------------------------------------------

def poisoned(call, name, value, b=1, t=5):
    return ops.poisoned(call(), name, value, b, t)


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("name, value", [("k", float("nan")), ("v", float("inf")), ("g", float("-inf")),
                                         ("g", float("nan"))])
def test_optimized_refuses_non_finite_activations(opt, ref, call, first, name, value):
    """fla's chunk kernels spread a NaN/inf to earlier tokens of its chunk (and turn
    g = -inf into NaN everywhere); the optimized ops raise instead, naming tensor, batch and token."""
    name = next(n for n in call() if n.startswith(name))       # the 3D state's k1
    with pytest.raises(ValueError, match=rf"{name} holds a non-finite value \({value}\) at batch 1, token 5: "
                                         r"the optimized ops refuse non-finite activations"):
        opt(**poisoned(call, name, value))


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_optimized_refuses_a_finite_g_below_the_floor_and_computes_one_above(opt, ref, call, first):
    """A finite g whose exp is 0 even in float64 (below optimized.checks.G_FLOOR) is a full forget,
    refused as g = -inf is (as a stand-in for -inf, -1e30 came back with relative error 1.0 at
    T = 130: the chunk kernels' float32 cumulative log-decays swamped); g = -100 (a full forget in
    float32) is computed."""
    with pytest.raises(ValueError, match=r"g holds -1e\+30 at batch 1, token 5, below -745.*clamp g at -100"):
        opt(**poisoned(call, "g", -1e30))
    with pytest.raises(ValueError, match=r"g holds -746 at batch 1, token 5"):
        opt(**poisoned(call, "g", -746.0))
    assert torch.isfinite(opt(**poisoned(call, "g", -100.0))[0]).all()


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_reference_non_finite_never_reaches_earlier_tokens(opt, ref, call, first, value):
    """CONTRACT "Errors": a NaN/inf at token t leaves every earlier output unchanged (the references)."""
    name = next(n for n in call() if n.startswith("k"))       # the 3D state's k1
    clean = ref(**call(torch.float64, "cpu"))[0]
    o = ref(**poisoned(lambda: call(torch.float64, "cpu"), name, value, t=5))[0]
    # exact: the references go token by token, so the outputs before t are the same operations
    assert torch.equal(o[:, :5], clean[:, :5])
    assert not torch.isfinite(o[1, 5:]).all()


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_reference_g_minus_inf_is_a_full_forget(opt, ref, call, first):
    """CONTRACT "Errors": g = -inf is finite in the references and forgets every earlier write: outputs from
    that token on do not depend on the values before it (nested: level 0's; the upper levels keep theirs)."""
    t = 5
    args = poisoned(lambda: call(torch.float64, "cpu"), "g", float("-inf"), b=slice(None), t=t)
    o = ref(**args)[0]
    assert torch.isfinite(o).all()
    reason = next(ops.skip_reason(info, "reference g = -inf forgets the past") for info in ops.OPS
                  if info.small_call is call)
    if reason is not None:
        pytest.skip(reason)
    args["v"] = args["v"].clone()
    args["v"][:, :t] += 1.0
    assert torch.allclose(ref(**args)[0][:, t:], o[:, t:], rtol=0, atol=1e-12)


# --- sizes past int32 offsets -------------------------------------------------------------------

def huge(*shape, device=DEV):
    return ops.huge(*shape, device=device)


HUGE_T = ops.HUGE_T


def huge_gdn2(device=DEV):
    return dict(q=huge(1, HUGE_T, 1, 4, device=device), k=huge(1, HUGE_T, 1, 4, device=device),
                v=huge(1, HUGE_T, 1, 4, device=device), g=huge(1, HUGE_T, 1, 4, device=device),
                b=huge(1, HUGE_T, 1, 4, device=device), w=huge(1, HUGE_T, 1, 4, device=device))


SIZE_MESSAGE = r"q \[B, T, H, K\] = \(1, 2147483648, 1, 4\) would hold 8589934592 elements, more than 2\*\*31 - 1"


@pytest.mark.parametrize("op", [chunk_gdn2, naive_gdn2, naive_gdn2_numpy])
def test_huge_sequence_refused_before_any_work(op):
    """T = 2**31 ended in an allocator error inside fla; naive_gdn2 started looping."""
    with pytest.raises(ValueError, match=SIZE_MESSAGE):
        op(**huge_gdn2())


def test_huge_per_chunk_states_refused():
    T, K = 64 * 2 ** 16, 256           # q holds 2**30 elements, the per-chunk states 2**32
    args = {n: huge(1, T, 1, K) for n in ("q", "k", "v", "g", "b", "w")}
    with pytest.raises(ValueError, match=r"the per-chunk states \[B, ceil\(T/64\), H, K, V\] = "
                                         r"\(1, 65536, 1, 256, 256\) would hold 4294967296 elements"):
        chunk_gdn2(**args)


# --- NumPy twins: the torch references' checks ---------------------------------------------------

def numpy_of(args):
    return {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in args.items()}


TWINS = [
    pytest.param(naive_gdn2_numpy, naive_gdn2, lambda: gdn2_call(torch.float64, "cpu"), id="gdn2"),
    pytest.param(naive_tensor3d_numpy, naive_tensor3d, lambda: tensor3d_call("delta", torch.float64, "cpu"),
                 id="tensor3d"),
    pytest.param(naive_fenwick_numpy, naive_fenwick, lambda: fenwick_call(torch.float64, "cpu"), id="fenwick"),
    pytest.param(quadratic_fenwick_numpy, quadratic_fenwick, lambda: fenwick_call(torch.float64, "cpu"),
                 id="fenwick-quadratic"),
    pytest.param(naive_nested_gdn2_numpy, naive_nested_gdn2, lambda: nested_call(torch.float64, "cpu"),
                 id="nested"),
]


@pytest.mark.parametrize("twin, ref, call", TWINS)
def test_every_reference_and_twin_computes_g_minus_inf(twin, ref, call):
    """CONTRACT "Errors": "The references compute it, finite", the quadratic form and the NumPy twins
    too (a log-decay taken as a difference of cumulative sums is -inf - (-inf) = NaN after it);
    each twin agrees with its reference there."""
    args = poisoned(call, "g", float("-inf"), b=slice(None), t=5)
    o, o_np = ref(**args), twin(**numpy_of(args))
    o, o_np = (x[0] if isinstance(x, tuple) else x for x in (o, o_np))     # (o, final) or o
    assert torch.isfinite(o).all() and np.isfinite(o_np).all()
    assert np.allclose(o_np, o.numpy(), rtol=0, atol=1e-12)


def same_error(twin, ref, args, error=ValueError):
    with pytest.raises(error) as from_ref:
        ref(**args)
    with pytest.raises(error, match=re.escape(str(from_ref.value))):
        twin(**numpy_of(args))
    return str(from_ref.value)


@pytest.mark.parametrize("twin, ref, call", TWINS)
def test_numpy_twin_wrong_shape(twin, ref, call):
    """A raw NumPy broadcast/IndexError before; now the torch reference's message."""
    args = call()
    args["v"] = args["v"][:, :3]
    assert "v must have shape [B, T, H, V]" in same_error(twin, ref, args)


@pytest.mark.parametrize("twin, ref, call", TWINS)
def test_numpy_twin_empty_sequence(twin, ref, call):
    args = {n: (x[:, :0] if isinstance(x, torch.Tensor) else x) for n, x in call().items()}
    assert "at least one token, got T = 0" in same_error(twin, ref, args)


@pytest.mark.parametrize("twin, ref, call", TWINS)
def test_numpy_twin_mixed_dtypes_and_wrong_rank(twin, ref, call):
    args = call()
    args["v"] = args["v"].float()
    assert "v has dtype torch.float32 but" in same_error(twin, ref, args)
    args = call()
    args["v"] = args["v"][0]
    assert "v must have 4 dimensions" in same_error(twin, ref, args)


def test_numpy_twin_not_an_array():
    args = numpy_of(gdn2_call(torch.float64, "cpu"))
    args["q"] = [[1.0]]
    with pytest.raises(TypeError, match="q must be a NumPy array or torch.Tensor, got list"):
        naive_gdn2_numpy(**args)
    args["q"] = np.array(["a"], dtype=object)
    with pytest.raises(ValueError, match="q must have dtype in .*, got NumPy object"):
        naive_gdn2_numpy(**args)


def test_numpy_twin_nested_query_bank_larger_than_k():
    args = nested_call(torch.float64, "cpu")
    level = args["levels"][0]
    level.params = dict(level.params, Q=np.zeros((1, 9, 8)))
    with pytest.raises(ValueError, match=r"holds n = 9 queries but K = 8: a query bank larger than K"):
        naive_nested_gdn2_numpy(**numpy_of(args))


def test_numpy_twin_fenwick_gdn2_checks():
    x = numpy_of(gdn2_call(torch.float64, "cpu"))
    with pytest.raises(ValueError, match=r"level_scales must have at least 1 \+ ceil\(log2 T\) = 4 levels"):
        naive_fenwick_gdn2_numpy(**x, level_scales=np.ones((2, 8, 1, 3)))


def test_numpy_twin_huge_sizes():
    x = {n: np.broadcast_to(np.zeros(1), (1, HUGE_T, 1, 4)) for n in ("q", "k", "v", "g", "b", "w")}
    with pytest.raises(ValueError, match=SIZE_MESSAGE):
        naive_gdn2_numpy(**x)


# --- packed batches: cu_seqlens ------------------------------------------------------------------

one_row = ops.one_row


def both_sides(call):
    """``(side, inputs)`` for the optimized op (kernel dtype and device) and the reference (float64)."""
    return (("optimized", call()), ("reference", call(torch.float64, "cpu")))


BAD_CU_SEQLENS = [
    (lambda dev: torch.tensor([0.0, 8.0], device=dev), r"cu_seqlens must have dtype torch.int32 or torch.int64, "
                                                       r"got torch.float32"),
    (lambda dev: torch.tensor([0, 8], dtype=torch.int16, device=dev), r"cu_seqlens must have dtype .*got torch.int16"),
    (lambda dev: torch.tensor([0, 8], device="meta"), r"cu_seqlens is on meta but the activations are on .*"
                                                      r"cu_seqlens must be on the tensors' device"),
    (lambda dev: torch.tensor([[0, 8]], device=dev), r"cu_seqlens must be 1-D \[N \+ 1\], got shape \(1, 2\)"),
    (lambda dev: torch.tensor([8], device=dev), r"cu_seqlens must hold at least 2 entries \[0, T\]"),
    (lambda dev: torch.tensor([1, 8], device=dev), r"cu_seqlens must start at 0, got 1"),
    (lambda dev: torch.tensor([0, 3, 7], device=dev), r"cu_seqlens must end at T = 8 \(the packed length\), got 7"),
    (lambda dev: torch.tensor([0, 3, 3, 8], device=dev), r"cu_seqlens must be strictly increasing .*sequence 1 has "
                                                         r"cu_seqlens\[1\] = 3, cu_seqlens\[2\] = 3"),
    (lambda dev: torch.tensor([0, 5, 2, 8], device=dev), r"cu_seqlens must be strictly increasing"),
]


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
@pytest.mark.parametrize("case", range(len(BAD_CU_SEQLENS)))
def test_bad_cu_seqlens_refused(opt, ref, call, first, case):
    """CONTRACT "Variable-length batches": a wrong dtype, device or rank, too few entries, not from 0
    to T, a zero-length (or negative) sequence: a ValueError naming cu_seqlens, optimized and reference."""
    make, message = BAD_CU_SEQLENS[case]
    for (side, args), op in zip(both_sides(call), (opt, ref)):
        args = one_row(args)
        with pytest.raises(ValueError, match=message):
            op(**args, cu_seqlens=make(args[first].device))


@pytest.mark.parametrize("opt, ref, call, first", OP_PARAMS)
def test_cu_seqlens_needs_one_row_and_a_tensor(opt, ref, call, first):
    for (side, args), op in zip(both_sides(call), (opt, ref)):
        cu = torch.tensor([0, 3, 8], device=args[first].device)
        with pytest.raises(ValueError, match=r"cu_seqlens packs the sequences along T in one row: the activations "
                                             r"must have B = 1, got B = 2"):
            op(**args, cu_seqlens=cu)
        with pytest.raises(TypeError, match=r"cu_seqlens must be a torch.Tensor of int32 or int64 or None, got list"):
            op(**one_row(args), cu_seqlens=[0, 3, 8])


@pytest.mark.parametrize("twin, ref, call", TWINS)
def test_numpy_twin_bad_cu_seqlens(twin, ref, call):
    """The NumPy twins take a NumPy or torch integer cu_seqlens, with the references' checks."""
    args = one_row(call())
    assert "cu_seqlens must start at 0" in same_error(twin, ref, dict(args, cu_seqlens=torch.tensor([1, 8])))
    with pytest.raises(ValueError, match=r"cu_seqlens must have dtype int32 or int64, got NumPy float64"):
        twin(**numpy_of(args), cu_seqlens=np.array([0.0, 8.0]))
    with pytest.raises(ValueError, match=r"cu_seqlens must be strictly increasing"):
        twin(**numpy_of(args), cu_seqlens=np.array([0, 8, 8]))


# --- make_levels ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(query_counts=[4, 9]), ValueError, r"query_counts\[1\] \(level ℓ = 2\) must be in 1\.\.K = 8 .*got n = 9"),
    (dict(query_counts=[0, 4]), ValueError, r"query_counts\[0\] \(level ℓ = 1\) must be in 1\.\.K = 8"),
    (dict(intervals=[1, 0]), ValueError, r"intervals\[1\] \(level ℓ = 2\) must be a positive number of chunks"),
    (dict(intervals=[-1, 2]), ValueError, r"intervals\[0\] \(level ℓ = 1\) must be a positive number"),
    (dict(intervals=[1, 2.0]), TypeError, r"intervals\[1\] \(level ℓ = 2\) must be an int, got float"),
    (dict(reduction="bogus"), ValueError, r"reduction must be one of \['mean', 'sum'\], got 'bogus'"),
    (dict(reduction=["mean", "max"]), ValueError, r"reduction of level ℓ = 2 must be one of"),
    (dict(scheme=5), TypeError, r"scheme must be a str or one str per level"),
    (dict(scheme=["learned", "nope"]), ValueError, r"unknown scheme 'nope'"),
    (dict(L=1, scheme="nope"), ValueError, r"unknown scheme 'nope'"),
    (dict(gate_scale=float("nan")), ValueError, r"gate_scale must be a finite number ≥ 0, got nan"),
    (dict(gate_scale=-1.0), ValueError, r"gate_scale must be a finite number ≥ 0"),
    (dict(L=2.0), TypeError, r"L must be an int, got float"),
    (dict(L=0), ValueError, r"L must be ≥ 1, got 0"),
    (dict(H=-1), ValueError, r"H must be ≥ 0, got -1"),
    (dict(K=0), ValueError, r"K must be ≥ 1, got 0"),
    (dict(V=True), TypeError, r"V must be an int, got bool"),
])
def test_make_levels_refuses_bad_arguments_at_once(kwargs, error, message):
    """These failed only when the levels were used, or inside torch naming another argument."""
    sizes = dict(L=3, H=1, K=8, V=8)
    sizes.update({k: kwargs.pop(k) for k in list(kwargs) if k in sizes})
    with pytest.raises(error, match=message):
        make_levels(**sizes, **kwargs)


# --- return values -------------------------------------------------------------------------------

def test_chunk_fenwick_returns_output_and_none():
    """``o, _ = chunk_fenwick(...)`` kept batch 0 of a bare tensor; now ``(o, None)``."""
    o, final = chunk_fenwick(**fenwick_call())
    assert final is None and o.shape == (2, 8, 1, 8)
