"""``torch.compile(fullgraph=True)`` through every optimized op (``optimized.compile``).

The property: a function calling an op, compiled with ``fullgraph=True``, gives the eager
results: values, final states and every gradient, bit for bit (the compiled backward replays
the same eager op), and the fake implementation gives the eager outputs' shapes and dtypes. On
the CPU it runs under the ``aot_eager`` backend for one entry per custom op (dynamo, the fake
implementations, AOT autograd and the custom ops' autograd: all but inductor's code
generation) and under inductor for one; on CUDA under inductor at each entry's covering draw.
Planted breaks (a backward that drops the final states' cotangents, a fake implementation with
the wrong shape, a second-order refusal left out), registered under test-only custom op names,
show the properties fail.

Also: the custom ops are registered (``torch.library.opcheck`` on one); eager calls pass
through unchanged; a call's structure (lists with None, ``Level`` objects, ints, floats) is
rebuilt exactly and a changing int does not recompile; the finiteness check is skipped only
while compiling; second-order gradients stay refused; bad inputs raise the eager op's error.
"""
from __future__ import annotations

import inspect
import math
from unittest import mock

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import optimized
from ngdn import ops
from ngdn.checks import generic
from ngdn.testing import requires_cuda
from optimized import compile as oc
from optimized import fenwick, fenwick_gdn2, gdn2, nested, tensor3d, triton_mode
from optimized.checks import check_finite_activations, finite_checks_enabled
from property_tests.kernel_mutation import twin
from reference.nested import Level

MODULES = {"chunk_gdn2": gdn2, "chunk_nested_gdn2": nested, "chunk_tensor3d": tensor3d, "chunk_fenwick": fenwick,
           "chunk_fenwick_gdn2": fenwick_gdn2}
PUBLIC = [n for n in optimized.__all__ if n.startswith("chunk_")]
ENTRIES = [pytest.param(info, id=info.name) for info in ops.OPS]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def small(info) -> ops.Draw:
    """A cheap draw for the interpreter (one chunk, one sequence, one head) with distinct T, K, V
    (a swapped axis in a fake implementation shows); on CUDA the covering draw (a compile bucket's
    sizes: no kernel compiled for this file alone)."""
    if triton_mode.MODE == triton_mode.CUDA:
        return info.covering()
    return ops.Draw(info.edge_shape(1, 17, 1, 16, 32), seed=3, options=info.covering().options)


def calling(op):
    def fn(**kwargs):
        return op(**kwargs)
    return fn


# --- the property --------------------------------------------------------------------------------

def op_name(op) -> str:
    return op.custom_op_name.split("::")[1]


def fake_outputs(op, kwargs) -> list:
    """The custom op's fake implementation on fake copies of a call's inputs: the flat outputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors, ints, floats, key = oc.custom_op_arguments(op_name(op), (), kwargs)
    with FakeTensorMode() as mode:
        return op.custom_op([mode.from_tensor(x) for x in tensors], ints, floats, key)


def compiled_vs_eager(info, draw, dtype, op=None, backend="aot_eager") -> dict:
    """``torch.compile(fullgraph=True)`` of a function calling ``op`` (default: the entry's)
    against the entry's eager op: ``{label: (error, bound)}`` over values and every gradient,
    bound 0 (bit for bit) for deterministic entries, the entry's tolerance otherwise. Also
    ``"fake <output>"``: the fake implementation's shape and dtype are the eager output's;
    ``"one graph holding ngdn::<op>"``: the compiled function is one graph calling the custom op."""
    op = info.op if op is None else op
    sample = info.sample(draw)
    eager = generic.run(info, draw, dtype, sample=sample)
    kwargs, _ = generic.inputs_for(sample, dtype, False)
    fakes = fake_outputs(op, kwargs)
    errors = {f"fake {label}": (0.0 if i < len(fakes) and (fakes[i].shape, fakes[i].dtype) == (y.shape, y.dtype)
                                else math.inf, 0.0)
              for i, (label, y) in enumerate(eager[0].items())}
    errors["fake: output count"] = (0.0 if len(fakes) == len(eager[0]) else math.inf, 0.0)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    try:
        compiled = generic.run(info, draw, dtype, op=torch.compile(calling(op), fullgraph=True, backend=counter),
                               sample=sample)
    except Exception as e:        # noqa: BLE001  an error counts as the property failing, with its message
        errors[f"compiled run: {type(e).__name__}: {str(e)[:300]}"] = (math.inf, 0.0)
        return errors
    if info.deterministic:
        errors.update(generic.same_results(compiled, eager))
    else:
        errors.update(generic.against(info, dtype, {**compiled[0], **compiled[1]}, {**eager[0], **eager[1]},
                                      log=False))
    target = op.custom_op_name.replace("::", ".")
    held = counter.frame_count == 1 and any(target in g.code for g in counter.graphs)
    errors["one graph holding ngdn::<op>"] = (0.0 if held else math.inf, 0.0)
    return errors


def assert_holds(errors: dict):
    failed = {k: v for k, v in errors.items() if not v[0] <= v[1]}
    assert not failed, f"compiled != eager: {failed}"


# The CPU's inductor entry: the cheapest with initial and final states.
INDUCTOR_ENTRY = ops.get("tensor3d-gla")


def one_entry_per_custom_op(entries) -> list:
    """The first entry of each optimized function (each is one custom op ``ngdn::<op>``; the tensor
    state's two modes share ``ngdn::chunk_tensor3d``)."""
    chosen = {}
    for info in entries:
        chosen.setdefault(info.op, info)
    return list(chosen.values())


# On the CPU one entry per custom op under aot_eager, except the inductor entry's op (run below).
CPU_ENTRIES = [pytest.param(info, id=info.name) for info in one_entry_per_custom_op(ops.OPS)
               if info.op is not INDUCTOR_ENTRY.op]


@pytest.mark.parametrize("info", CPU_ENTRIES)
def test_compiled_equals_eager_cpu(info):
    """aot_eager on the interpreter: values and every gradient bit for bit."""
    if triton_mode.MODE == triton_mode.CUDA:
        pytest.skip("the CUDA twin of this test runs inductor at the covering draws")
    assert_holds(compiled_vs_eager(info, small(info), torch.float32))


def test_compiled_equals_eager_cpu_inductor():
    """Inductor on the CPU, one entry (the cheapest with initial and final states): the graph
    holds only the custom op, so inductor emits no C++ and the interpreter runs the kernels
    inside it."""
    if triton_mode.MODE == triton_mode.CUDA:
        pytest.skip("the CUDA twin of this test runs inductor at the covering draws")
    info = INDUCTOR_ENTRY
    assert_holds(compiled_vs_eager(info, small(info), torch.float32, backend="inductor"))


@requires_cuda("inductor at every entry's covering draw, float32 and bfloat16")
@pytest.mark.parametrize("info", ENTRIES)
@pytest.mark.compiles
def test_compiled_equals_eager_cuda(info):
    for dtype in info.dtypes[triton_mode.CUDA]:
        assert_holds(compiled_vs_eager(info, info.covering(), dtype, backend="inductor"))


def test_empty_batch_compiles():
    """B = 0 (no kernel runs; the eager op's empty gradients may share an input's storage, which a
    custom op's outputs must not)."""
    info = ops.get("fenwick")
    draw = ops.Draw(info.edge_shape(0, 17, 2, 16, 32), seed=1)
    assert_holds(compiled_vs_eager(info, draw, torch.float32))


# --- planted breaks ------------------------------------------------------------------------------

GLA = ops.get("tensor3d-gla")     # the cheapest entry with initial and final states


@pytest.mark.mutation
def test_planted_backward_break_is_caught():
    """A backward that replays with the output's cotangent only (the final state's dropped):
    the property fails on ``dinitial_state`` and friends."""
    broken_compilable = twin(oc.compilable, "if g is not None and y.requires_grad]",
                             "if g is not None and y.requires_grad][:1]")
    broken = broken_compilable("test_broken_backward_tensor3d", tensor3d.chunk_tensor3d,
                               *oc.OUTPUTS["chunk_tensor3d"])
    errors = compiled_vs_eager(GLA, small(GLA), torch.float32, op=broken)
    failed = {k for k, (e, b) in errors.items() if not e <= b}
    assert "dinitial_state" in failed and "output" not in failed, errors


def wrong_tensor3d_outputs(a):
    """The final state ``[B, H, V, E, K]``: K and V swapped."""
    (o, dtype), *final = oc.OUTPUTS["chunk_tensor3d"][0](a)
    return [(o, dtype)] + [((s[0], s[1], s[4], s[3], s[2]), d) for s, d in final]


@pytest.mark.mutation
def test_planted_fake_break_is_caught():
    """A fake implementation with the final state's K and V swapped: the property fails on it."""
    broken = oc.compilable("test_wrong_fake_tensor3d", tensor3d.chunk_tensor3d, wrong_tensor3d_outputs, "tensor")
    errors = compiled_vs_eager(GLA, small(GLA), torch.float32, op=broken)
    failed = {k for k, (e, b) in errors.items() if not e <= b}
    assert "fake final_state" in failed and "fake output" not in failed, errors


# --- registration, fake implementations, pass-through --------------------------------------------

def test_custom_ops_registered():
    assert sorted(PUBLIC) == sorted(oc.OUTPUTS)
    for name in PUBLIC:
        op, module_fn = getattr(optimized, name), getattr(MODULES[name], name)
        assert op.__wrapped__ is module_fn
        assert op.__doc__.startswith(module_fn.__doc__.rstrip()) and op.__name__ == name
        assert f"ngdn::{name}" in op.__doc__ and "finiteness check is skipped" in op.__doc__
        assert inspect.signature(op) == inspect.signature(module_fn)
        assert op.custom_op_name == f"ngdn::{name}"
        assert op.custom_op._opoverload is getattr(torch.ops.ngdn, name).default
        assert hasattr(torch.ops.ngdn, name) and hasattr(torch.ops.ngdn, f"{name}_backward")


def test_opcheck():
    """Every ``torch.library.opcheck`` test (schema, autograd registration, fake against real
    outputs, AOT dispatch with dynamic shapes) on the cheapest op; the other ops run the same
    code (``compilable``), and their own part, the fake implementation, is checked by the
    compiled property."""
    info = ops.get("fenwick")
    if triton_mode.MODE == triton_mode.CUDA:
        pytest.skip("the compiled property covers CUDA")
    kwargs, _ = generic.inputs_for(info.sample(small(info)), torch.float32, True)
    torch.library.opcheck(info.op.custom_op, oc.custom_op_arguments(op_name(info.op), (), kwargs))


def test_fake_shapes_under_fake_mode():
    """The fake implementations alone, under ``FakeTensorMode``: the shapes and dtypes each op's
    contract gives, without running a kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    B, T, H, K, V, L, E = 2, 5, 3, 4, 6, 3, 2
    f, cases = torch.float32, {}
    with FakeTensorMode() as mode:
        x = lambda *s: torch.empty(s)   # noqa: E731
        lv = [Level("learned", 1, {"Q": x(H, 16, K)}) for _ in range(L - 1)]
        cases["chunk_gdn2"] = ((x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H, K), x(B, T, H, K),
                                x(B, T, H, V)), {"output_final_state": True}, [(B, T, H, V), (B, H, K, V)])
        cases["chunk_nested_gdn2"] = ((x(B, T, H, L, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H, K),
                                       x(B, T, H, K), x(B, T, H, V), x(B, T, H, L), lv),
                                      {"output_final_state": True}, [(B, T, H, V)] + [(B, H, K, V)] * L)
        cases["chunk_tensor3d"] = ((x(B, T, H, K), x(B, T, H, K), x(B, T, H, E), x(B, T, H, E), x(B, T, H, V)),
                                   {"output_final_state": True}, [(B, T, H, V), (B, H, K, E, V)])
        cases["chunk_fenwick"] = ((x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H), x(B, T, H, L)), {},
                                  [(B, T, H, V)])
        cases["chunk_fenwick_gdn2"] = ((x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H, K),
                                        x(B, T, H, K), x(B, T, H, V), x(B, T, H, L)),
                                       {"output_final_state": True, "offset": 64}, [(B, T, H, V), (B, H, L, K, V)])
        for name, (args, kwargs, shapes) in cases.items():
            out = getattr(optimized, name).custom_op(*oc.custom_op_arguments(name, args, kwargs))
            assert [tuple(y.shape) for y in out] == shapes, name
            assert out[0].dtype == f and all(y.dtype == torch.float32 for y in out[1:]), name
            assert all(y.fake_mode is mode for y in out), name
            kwargs = dict(kwargs, output_final_state=False) if kwargs else kwargs
            out = getattr(optimized, name).custom_op(*oc.custom_op_arguments(name, args, kwargs))
            assert [tuple(y.shape) for y in out] == shapes[:1], name


class Spy:
    def __init__(self):
        self.calls = []
        self.result = (object(), None)

    def __call__(self, q, levels, scale=None, initial_states=None, output_final_state=False, offset=0):
        """The spy's docstring."""
        args = (q, levels, scale, initial_states, output_final_state, offset)
        self.calls.append((args, torch.compiler.is_compiling()))
        return self.result


def test_eager_calls_pass_through():
    """Not compiling, the wrapper is the module function: same argument objects in, the same
    result object out; errors are the eager op's, word for word."""
    spy = Spy()
    op = oc.compilable("test_pass_through", spy, lambda a: [], None)
    q, lv = torch.ones(1), [Level("merge", 1, {})]
    assert op(q, lv, 0.5, output_final_state=True, offset=64) is spy.result
    (args, compiling), = spy.calls
    assert args[0] is q and args[1] is lv and args[2:] == (0.5, None, True, 64) and not compiling
    for name in PUBLIC:
        wrapped, module_fn = getattr(optimized, name), getattr(MODULES[name], name)
        with pytest.raises(Exception) as want:
            module_fn([1.0], None, None, None, None, None, None)
        with pytest.raises(type(want.value), match=None) as got:
            wrapped([1.0], None, None, None, None, None, None)
        assert str(got.value) == str(want.value)


def test_eager_results_unchanged():
    """A real op through the wrapper (the cheapest, Fenwick) gives the module function's results bit
    for bit."""
    info = ops.get("fenwick")
    assert_holds(generic.same_results(generic.run(info, small(info), torch.float32),
                                      generic.run(info, small(info), torch.float32, op=fenwick.chunk_fenwick)))


def test_call_structure_rebuilt_and_ints_dynamic():
    """Under compile the eager function receives the call rebuilt: tensors, lists with None,
    ``Level`` objects with their parameter dicts, strings, bools, floats, ints; outputs come back
    as ``(o, [finals])``; a changing int (e.g. ``offset``) does not recompile after the first change."""
    seen = []

    def toy(q, levels, scale=None, initial_states=None, output_final_state=False, offset=0):
        seen.append((type(levels[0]), levels[0].scheme, levels[0].interval, sorted(levels[0].params), scale,
                     [s is None for s in initial_states], output_final_state, offset))
        o = q * scale * levels[0].params["a"] + offset
        return o, ([o.sum(-1), initial_states[0] * 2] if output_final_state else None)

    op = oc.compilable("test_structure", toy,
                       lambda a: [(a["q"].shape, a["q"].dtype)]
                       + [(a["q"].shape[:-1], torch.float32)] * (2 if a["output_final_state"] else 0), "list")
    counter = CompileCounterWithBackend("aot_eager")

    def fn(q, a, h0, offset):
        o, finals = op(q, [Level("learned", 3, {"a": a})], scale=0.5, initial_states=[h0, None],
                       output_final_state=True, offset=offset)
        return o, finals[0], finals[1]

    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    for offset in (0, 64, 128, 192):
        q, a, h0 = (torch.randn(2, 3, requires_grad=True), torch.randn(3, requires_grad=True),
                    torch.randn(2, requires_grad=True))
        got = compiled(q, a, h0, offset)
        want = fn(q, a, h0, offset)
        assert all(torch.equal(x, y) for x, y in zip(got, want))     # aot_eager replays the eager ops
        grads = [torch.autograd.grad(sum(y.sum() for y in out), (q, a, h0)) for out in (got, want)]
        assert all(torch.equal(x, y) for x, y in zip(*grads))
    assert counter.frame_count == 2        # static first, then dynamic in offset
    assert seen[0] == (Level, "learned", 3, ["a"], 0.5, [False, True], True, 0)

    def fn2(q, a, h0, final):              # a static argument changed: a new graph, its own key
        return op(q, [Level("merge", 2, {"a": a})], scale=0.25, initial_states=[h0, None],
                  output_final_state=final)

    compiled = torch.compile(fn2, fullgraph=True, backend="aot_eager")
    for final in (True, False):
        got, want = compiled(q, a, h0, final), fn2(q, a, h0, final)
        assert torch.equal(got[0], want[0]) and (got[1] is None) == (not final)
    assert seen[-1][1:3] == ("merge", 2) and seen[-1][6] is False


def test_compilable_validates():
    with pytest.raises(ValueError, match="name"):
        oc.compilable("not a name", gdn2.chunk_gdn2)
    with pytest.raises(TypeError, match="eager_fn"):
        oc.compilable("test_not_callable", 3)
    with pytest.raises(ValueError, match="outputs"):
        oc.compilable("test_unknown_op", gdn2.chunk_gdn2)
    with pytest.raises(ValueError, match="final_form"):
        oc.compilable("test_bad_form", gdn2.chunk_gdn2, lambda a: [], "dict")
    with pytest.raises(ValueError, match="already defined"):
        oc.compilable("chunk_gdn2", gdn2.chunk_gdn2)
    with pytest.raises(ValueError, match="key"):
        oc.static_call("chunk_gdn2:unregistered")


# --- the finiteness check, second order, errors ----------------------------------------------------

def test_finite_check_skipped_only_while_compiling():
    nan = torch.full((1, 2, 1), math.nan)
    with pytest.raises(ValueError, match="non-finite"):
        check_finite_activations([("x", nan)])
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        check_finite_activations([("x", nan)])          # skipped: its host sync would break the graph

    def fn(x):
        check_finite_activations([("x", x)])
        return x * 2

    assert torch.compile(fn, fullgraph=True, backend="eager")(nan).isnan().all()   # one graph, no raise
    with pytest.raises(ValueError, match="non-finite"):
        fn(nan)

    info = ops.get("fenwick")
    kwargs, _ = generic.inputs_for(info.sample(small(info)), torch.float32, False)
    kwargs["v"] = kwargs["v"].clone()
    kwargs["v"][0, 3] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        optimized.chunk_fenwick(**kwargs)
    o, _ = torch.compile(calling(optimized.chunk_fenwick), fullgraph=True, backend="aot_eager")(**kwargs)
    assert o.isnan().any()
    assert finite_checks_enabled()
    with pytest.raises(ValueError, match="non-finite"):
        optimized.chunk_fenwick(**kwargs)


def refused_at_create_graph(op, backend) -> bool:
    """Whether ``torch.autograd.grad(..., create_graph=True)`` through the compiled ``op`` (Fenwick's
    signature) raises the first-order-only error at that call."""
    info = ops.get("fenwick")
    torch._dynamo.reset()
    kwargs, leaves = generic.inputs_for(info.sample(small(info)), torch.float32, True)
    o, _ = torch.compile(calling(op), fullgraph=True, backend=backend)(**kwargs)
    try:
        torch.autograd.grad(o.square().sum(), leaves["q"], create_graph=True)
    except RuntimeError as e:
        assert generic.FIRST_ORDER_ONLY in str(e), e
        return True
    return False


def test_second_order_refused_under_compile():
    """``create_graph=True`` through a compiled op: with dynamo alone the op refuses it at the
    call, as in eager mode; with AOT autograd (the default backends) torch returns the
    first-order gradient and refuses to differentiate it."""
    assert refused_at_create_graph(optimized.chunk_fenwick, "eager")
    info = ops.get("fenwick")
    kwargs, leaves = generic.inputs_for(info.sample(small(info)), torch.float32, True)
    o, _ = torch.compile(calling(optimized.chunk_fenwick), fullgraph=True, backend="aot_eager")(**kwargs)
    (dq,) = torch.autograd.grad(o.square().sum(), leaves["q"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.square().sum().backward()


@pytest.mark.mutation
def test_second_order_refusal_catches_a_silent_twin():
    """Without the refusal where autograd records the backward op, ``create_graph=True`` passes
    silently under dynamo: the check above fails on that twin."""
    silent = twin(oc.compilable, "backward_op.register_autograd(never, setup_context=refuse)",
                  "backward_op.register_autograd(never)")("test_silent_second_order_fenwick", fenwick.chunk_fenwick,
                                                             *oc.OUTPUTS["chunk_fenwick"])
    assert not refused_at_create_graph(silent, "eager")


def test_bad_input_raises_the_eager_error_under_compile():
    info = ops.get("fenwick")
    kwargs, _ = generic.inputs_for(info.sample(small(info)), torch.float32, False)
    kwargs["q"] = kwargs["q"].double()
    with pytest.raises(ValueError) as want:
        optimized.chunk_fenwick(**kwargs)
    with pytest.raises(ValueError) as got:
        torch.compile(calling(optimized.chunk_fenwick), fullgraph=True, backend="aot_eager")(**kwargs)
    assert str(want.value) in str(got.value)
