"""``torch.compile`` support: every public op as an opaque custom operator under compile.

Training code wraps models in ``torch.compile``. Traced by dynamo, an op's body (fla's and our
Triton launch code, its ``autograd.Function``\\ s, the finiteness check's host sync) would break the
graph, or be traced wrongly. ``compilable(name, eager_fn)`` returns ``eager_fn`` behind a switch:

- eager (not compiling): ``eager_fn`` itself runs, unchanged: same validation, same outputs.
- under ``torch.compile``: the call goes through one ``torch.library.custom_op``,
  ``ngdn::<name>``, which dynamo and AOT autograd treat as a single opaque operator (so
  ``fullgraph=True`` holds). Its arguments are the call's tensors flattened into a ``Tensor[]``
  (tensors, lists and tuples of tensors, ``reference.nested.Level`` objects and any other
  dataclass or dict holding tensors), its ints (``SymInt[]``: a changing ``offset`` does not
  recompile) and floats (``float[]``), and a string key naming the rest of the call (mode
  strings, bools, None, scheme names, the tree structure), held in a per-process registry
  (``static_call``). The output is a ``Tensor[]``: ``o``, then the final state(s).

What differs under compile, by design:

- The forward runs ``eager_fn`` under ``torch.no_grad()``; the backward is a second custom op,
  ``ngdn::<name>_backward``, that *replays* the forward with autograd on (on the saved inputs,
  detached) and returns ``torch.autograd.grad`` of it with the incoming cotangents. One extra
  forward per backward, only under compile; the inputs are kept for the backward instead of the
  op's own saved intermediates. The replay computes what the eager backward computes, so the
  compiled gradients equal the eager ones bit for bit.
- The finiteness check (``optimized.checks.check_finite_activations``) is skipped: it syncs the
  host (no place in a captured graph). The custom ops run ``eager_fn`` inside
  ``finite_checks(False)`` (the process-wide switch); compiled ops are undefined on non-finite
  input, as with ``NGDN_CHECK_FINITE=0``.
- The inputs are validated when the compiled graph runs (the op raises then, with the eager
  op's message), not while it is traced; tracing only needs the output shapes (``OUTPUTS``).
- Outputs are contiguous tensors that alias no input (a custom op's contract).
- Second-order gradients stay refused. Autograd records the backward op only for a
  ``create_graph=True`` backward, and then it raises the eager ops' first-order-only error
  (``optimized.autograd``): so under dynamo alone (``backend="eager"``) the call is refused as in
  eager mode. AOT autograd (``aot_eager``, inductor: the default) runs its compiled backward
  without recording, returns the first-order gradient, and refuses to differentiate it
  ("does not currently support double backward"): the second derivative is refused one step
  later than in eager mode, never computed without its graph.
- The registry lives in the process: a graph is traced where it runs (``torch.compile``), not
  exported to another process (``torch.export`` / AOTInductor packages would carry keys that
  process does not know).
"""
import contextlib
import dataclasses
import functools
import hashlib
import inspect

import torch

from optimized.autograd import refuse_second_order
from optimized.checks import finite_checks

NAMESPACE = "ngdn"

# --- output shapes (the fake implementations) ---------------------------------------------------
# Each takes the call's bound arguments ({name: value}, defaults applied) and returns the flat
# outputs' (shape, dtype): o first, then the final state(s), in the order the op returns them.


def _final_batch(a) -> int:
    """Sequences in the batch: ``B``, or ``N`` with varlen ``cu_seqlens [N + 1]`` (where an op takes it)."""
    cu = a.get("cu_seqlens")
    return a["q"].shape[0] if cu is None else cu.shape[0] - 1


def _gdn2_outputs(a):
    B, T, H, K = a["q"].shape
    V = a["v"].shape[-1]
    out = [((B, T, H, V), a["q"].dtype)]
    if a["output_final_state"]:
        out.append(((_final_batch(a), H, K, V), torch.float32))
    return out


def _nested_outputs(a):
    B, T, H, L, K = a["q"].shape
    V = a["v"].shape[-1]
    out = [((B, T, H, V), a["q"].dtype)]
    if a["output_final_state"]:
        out += [((_final_batch(a), H, K, V), torch.float32)] * L
    return out


def _tensor3d_outputs(a):
    B, T, H, K = a["q1"].shape
    E, V = a["q2"].shape[-1], a["v"].shape[-1]
    out = [((B, T, H, V), a["q1"].dtype)]
    if a["output_final_state"]:
        out.append(((_final_batch(dict(a, q=a["q1"])), H, K, E, V), torch.float32))
    return out


def _fenwick_outputs(a):
    B, T, H, _ = a["q"].shape
    return [((B, T, H, a["v"].shape[-1]), a["v"].dtype)]


def _fenwick_gdn2_outputs(a):
    B, T, H, K = a["q"].shape
    V, L = a["v"].shape[-1], a["level_scales"].shape[-1]
    out = [((B, T, H, V), a["v"].dtype)]
    if a["output_final_state"]:
        out.append(((_final_batch(a), H, L, K, V), torch.float32))
    return out


# name -> (output shapes, the final state's form: "tensor" (one tensor or None), "list" (a list of
# tensors or None), None (always None))
OUTPUTS = {
    "chunk_gdn2": (_gdn2_outputs, "tensor"),
    "chunk_nested_gdn2": (_nested_outputs, "list"),
    "chunk_tensor3d": (_tensor3d_outputs, "tensor"),
    "chunk_fenwick": (_fenwick_outputs, None),
    "chunk_fenwick_gdn2": (_fenwick_gdn2_outputs, "tensor"),
}

# --- flattening a call --------------------------------------------------------------------------
# A call's (args, kwargs) becomes a spec (nested tuples of constants) plus three flat lists: its
# tensors, ints and floats. Run by dynamo while tracing, so plain Python only.

_TENSOR, _INT, _FLOAT, _CONST, _LIST, _TUPLE, _DICT, _DATACLASS = "t", "i", "f", "c", "l", "u", "d", "dc"


def _flatten(value, tensors, ints, floats):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (_TENSOR,)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (_CONST, value)
    if isinstance(value, int):
        ints.append(value)
        return (_INT,)
    if isinstance(value, float):
        floats.append(value)
        return (_FLOAT,)
    if isinstance(value, (list, tuple)):
        kind = _LIST if isinstance(value, list) else _TUPLE
        return (kind, tuple(_flatten(x, tensors, ints, floats) for x in value))
    if isinstance(value, dict):
        return (_DICT, tuple((k, _flatten(x, tensors, ints, floats)) for k, x in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = tuple((f.name, _flatten(getattr(value, f.name), tensors, ints, floats))
                       for f in dataclasses.fields(value) if f.init)
        return (_DATACLASS, cls.__module__, cls.__qualname__, fields)
    return (_CONST, value)


def _class(module: str, qualname: str):
    import importlib

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _unflatten(spec, tensors, ints, floats):
    """The inverse of ``_flatten``; ``tensors``, ``ints``, ``floats`` are iterators."""
    kind = spec[0]
    if kind == _TENSOR:
        return next(tensors)
    if kind == _INT:
        return next(ints)
    if kind == _FLOAT:
        return next(floats)
    if kind == _CONST:
        return spec[1]
    if kind in (_LIST, _TUPLE):
        items = [_unflatten(s, tensors, ints, floats) for s in spec[1]]
        return items if kind == _LIST else tuple(items)
    if kind == _DICT:
        return {k: _unflatten(s, tensors, ints, floats) for k, s in spec[1]}
    if kind == _DATACLASS:
        _, module, qualname, fields = spec
        return _class(module, qualname)(**{n: _unflatten(s, tensors, ints, floats) for n, s in fields})
    raise ValueError(f"unknown spec entry {spec!r}")


_CALLS: dict[str, tuple] = {}          # key -> (op name, spec)
_KEYS: dict[tuple, str] = {}           # (op name, spec) -> key


@torch.compiler.assume_constant_result
def _static_key(name: str, spec: tuple) -> str:
    """The registry key of a call's static part: run once per trace by dynamo (a constant in the
    graph). Stable across processes where the spec's constants print the same."""
    entry = (name, spec)
    if entry not in _KEYS:
        key = f"{name}:{hashlib.sha1(repr(spec).encode()).hexdigest()[:16]}"
        while key in _CALLS:           # a repr collision between distinct specs: never shared
            key += "+"
        _KEYS[entry], _CALLS[key] = key, entry
    return _KEYS[entry]


def static_call(key: str) -> tuple:
    """``(op name, spec)`` registered under ``key`` (the custom ops' string argument)."""
    if key not in _CALLS:
        raise ValueError(f"key: no call registered under {key!r} in this process (the custom ops "
                         "ngdn::* are called by compiled graphs of the optimized ops, not directly)")
    return _CALLS[key]


def custom_op_arguments(name: str, args: tuple, kwargs: dict) -> tuple:
    """``(tensors, ints, floats, key)``: the arguments of ``ngdn::<name>`` for the call
    ``op(*args, **kwargs)`` (its static part registered under ``key``)."""
    tensors, ints, floats = [], [], []
    spec = _flatten((tuple(args), dict(kwargs)), tensors, ints, floats)
    return tensors, ints, floats, _static_key(name, spec)


def _call(name, key, tensors, ints, floats):
    op_name, spec = static_call(key)
    if op_name != name:
        raise ValueError(f"key: {key!r} names a call of {op_name}, not of {name}")
    return _unflatten(spec, iter(tensors), iter(ints), iter(floats))


# --- results ------------------------------------------------------------------------------------

def _flat_result(name, result, final_form):
    o, final = result
    if final is None:
        return [o]
    if final_form == "list":
        return [o, *final]
    if final_form == "tensor":
        return [o, final]
    raise ValueError(f"{name} returned a final state where none was expected")


def _result(flat, final_form):
    o, rest = flat[0], list(flat[1:])
    if not rest:
        return o, None
    return o, (rest if final_form == "list" else rest[0])


def _own(outputs, inputs):
    """Outputs as a custom op must return them: contiguous, aliasing no input and no other output
    (empty ones are always fresh: their storage says nothing)."""
    seen = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor) and x.numel()}
    out = []
    for y in outputs:
        if y.numel() == 0:
            y = torch.empty(y.shape, dtype=y.dtype, device=y.device)
        elif not y.is_contiguous() or y.untyped_storage().data_ptr() in seen:
            y = y.clone(memory_format=torch.contiguous_format)
        if y.numel():
            seen.add(y.untyped_storage().data_ptr())
        out.append(y)
    return out


# --- the wrapper --------------------------------------------------------------------------------

_COMPILE_NOTE = """

    Under ``torch.compile`` (``fullgraph=True`` works) the call is the custom operator
    ``{qualname}`` (``optimized.compile``): the finiteness check is skipped, inputs are validated
    when the compiled graph runs, and the backward replays the forward once with autograd (one
    extra forward per backward; gradients equal the eager ones bit for bit).
    """


def _defined(qualname: str) -> bool:
    ns, op = qualname.split("::")
    return hasattr(getattr(torch.ops, ns), op)


def compilable(name: str, eager_fn, outputs=None, final_form=None):
    """``eager_fn`` (an op returning ``(o, final state(s) or None)``) callable under
    ``torch.compile(fullgraph=True)``, as the custom operator ``ngdn::<name>`` (module docstring).

    ``outputs(arguments) -> [(shape, dtype), ...]`` gives the flat outputs' shapes from the
    call's bound arguments, ``final_form`` the final state's form (``"tensor"``, ``"list"`` or
    None); both default to ``OUTPUTS[name]``. Outside compile the returned function is
    ``eager_fn``'s behaviour exactly (same signature and docstring)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier string (the custom op's name), got {name!r}")
    if not callable(eager_fn):
        raise TypeError(f"eager_fn must be callable, got {type(eager_fn).__name__}")
    if outputs is None:
        if name not in OUTPUTS:
            raise ValueError(f"name {name!r} has no output shapes in optimized.compile.OUTPUTS; pass outputs=")
        outputs, final_form = OUTPUTS[name]
    if not callable(outputs):
        raise TypeError(f"outputs must be callable, got {type(outputs).__name__}")
    if final_form not in ("tensor", "list", None):
        raise ValueError(f"final_form must be 'tensor', 'list' or None, got {final_form!r}")
    qualname = f"{NAMESPACE}::{name}"
    if _defined(qualname) or _defined(qualname + "_backward"):
        raise ValueError(f"name: the custom op {qualname} is already defined in this process")
    signature = inspect.signature(eager_fn)

    def arguments(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    # forward ------------------------------------------------------------------------------------
    @torch.library.custom_op(qualname, mutates_args=(),
                             schema="(Tensor[] tensors, SymInt[] ints, float[] floats, str key) -> Tensor[]")
    def forward_op(tensors, ints, floats, key):
        args, kwargs = _call(name, key, tensors, ints, floats)
        with torch.no_grad(), finite_checks(False):
            result = eager_fn(*args, **kwargs)
        return _own(_flat_result(name, result, final_form), tensors)

    @forward_op.register_fake
    def _(tensors, ints, floats, key):
        args, kwargs = _call(name, key, tensors, ints, floats)
        device = tensors[0].device if tensors else torch.device("cpu")
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in outputs(arguments(args, kwargs))]

    # backward: a replay of the forward with autograd ----------------------------------------------
    @torch.library.custom_op(qualname + "_backward", mutates_args=(),
                             schema="(Tensor[] tensors, SymInt[] ints, float[] floats, str key, Tensor?[] grads, "
                                    "bool[] needs) -> Tensor[]")
    def backward_op(tensors, ints, floats, key, grads, needs):
        leaves = [x.detach().requires_grad_(bool(n)) for x, n in zip(tensors, needs)]
        wanted = [x for x in leaves if x.requires_grad]
        args, kwargs = _call(name, key, leaves, ints, floats)
        # a custom op's implementation runs below autograd (its dispatch keys excluded): lift that
        # for the replay, which records the eager op's graph
        with _autograd_dispatch(), torch.enable_grad(), finite_checks(False):
            flat = _flat_result(name, eager_fn(*args, **kwargs), final_form)
            pairs = [(y, g) for y, g in zip(flat, grads) if g is not None and y.requires_grad]
            got = (torch.autograd.grad([y for y, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                   if pairs and wanted else [None] * len(wanted))
        dx = [torch.zeros_like(x) if g is None else g for x, g in zip(wanted, got)]
        return _own(dx, [*tensors, *(g for g in grads if g is not None)])

    @backward_op.register_fake
    def _(tensors, ints, floats, key, grads, needs):
        return [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x, n in zip(tensors, needs) if n]

    def setup_context(ctx, inputs, output):
        tensors, ints, floats, key = inputs
        ctx.save_for_backward(*tensors)
        ctx.ints, ctx.floats, ctx.key = ints, floats, key

    def backward(ctx, grads):
        needs = [bool(n) for n in ctx.needs_input_grad[0]]
        dx = iter(backward_op(list(ctx.saved_tensors), ctx.ints, ctx.floats, ctx.key, list(grads), needs))
        # lists of non-tensors are leaves to autograd's list support, except empty ones: []
        return ([next(dx) if n else None for n in needs], None if ctx.ints else [], None if ctx.floats else [],
                None)

    forward_op.register_autograd(backward, setup_context=setup_context)

    def refuse(ctx, inputs, output):
        # autograd records the backward op (this runs) only when a backward builds a graph:
        # create_graph=True. Refused as the eager ops refuse it, with their message.
        with torch.enable_grad():
            refuse_second_order(name)

    def never(ctx, grads):
        raise RuntimeError(f"{name} supports first-order gradients only")

    backward_op.register_autograd(never, setup_context=refuse)

    # the public function --------------------------------------------------------------------------
    @functools.wraps(eager_fn)
    def op(*args, **kwargs):
        if not torch.compiler.is_compiling():
            return eager_fn(*args, **kwargs)
        return _result(forward_op(*custom_op_arguments(name, args, kwargs)), final_form)

    op.__doc__ = (eager_fn.__doc__ or "").rstrip() + _COMPILE_NOTE.format(qualname=qualname)
    op.custom_op = forward_op                    # torch.library.CustomOpDef of ngdn::<name>
    op.custom_op_name = qualname
    op.custom_op_backward = backward_op
    return op


@contextlib.contextmanager
def _autograd_dispatch():
    """Lift the exclusion of the autograd dispatch keys that a custom op's implementation runs
    under (below autograd), so that a replay inside it records its graph."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality,
                torch._C.DispatchKey.AutogradOther, torch._C.DispatchKey.AutogradNestedTensor):
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude):
        yield
