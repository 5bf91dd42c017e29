"""The properties every op of the table (``ngdn.ops``) gets, as functions ``(info, draw, ..., op) -> errors``.

Each returns ``{label: (error, bound)}`` like ``ngdn.tolerances.compare`` (``failures`` and
``assert_passes`` read it): a label passes when ``error ≤ bound``. Exact properties use bound 0
and the largest absolute difference as the error (``inf`` where a value is missing or an
exception stands for the property failing). ``op`` defaults to the entry's optimized function; a
test hands in a broken twin to show the property fails.

- ``vs_reference``: values, final states and every gradient against the float64 reference (the
  entry's own check, or a generic one made from its ``sample`` and ``reference``);
- ``bitwise``: two runs, values and every gradient, agree bit for bit;
- ``state_passing``: the sequence split at each allowed point (a chunk boundary and, where the
  op allows, off one), the first call's final state(s) passed on, equals one reference call:
  output, final states, every gradient, within the entry's tolerance;
- ``second_order``: a ``create_graph=True`` gradient is refused with an error saying so (the
  capability ``"refused"``), never returned without its graph;
- ``grad_modes``: ``torch.no_grad()`` and ``torch.inference_mode()`` give the values of an
  autograd run, bit for bit, and keep no graph;
- ``layouts``: non-contiguous, transposed and batch-expanded activations give the results of
  their contiguous copies, bit for bit (values and gradients);
- ``uninitialised_memory``: with every ``torch.empty`` / ``empty_like`` / ``new_empty`` /
  ``empty_strided`` of a floating dtype filled with NaN during the call, values and gradients
  are unchanged bit for bit (fla's own tests do the same: an output that turns NaN read a
  buffer nobody wrote);
- ``edge_shape``: one edge shape (B = 0, H = 0, T = 1, head dims off 16, the smallest) gives the
  reference's results within tolerance, or an up-front ``ValueError`` naming an argument;
- ``packed_equals_separate``: N sequences of ragged lengths packed in one row (``cu_seqlens``,
  per-sequence initial states) equal N separate float64 reference calls: outputs, per-sequence
  final states, every gradient, within the entry's tolerance (CONTRACT "Variable-length batches").

``battery`` runs them all on one entry (an op added to the table in a test gets every one).

The bit-for-bit properties (``bitwise``, ``grad_modes``, ``layouts``, ``uninitialised_memory``,
``packed_strided_cu_seqlens``) hold on any machine by construction: each compares the op's same
kernels, launches and block shapes on the same values (a second run; the same forward with autograd
not recording; a view's values against its contiguous copy's; NaN only in memory nobody should
read; the same ``cu_seqlens`` entries), never two different kernels.
"""
from __future__ import annotations

import contextlib
import math
import re

import torch

from ngdn.inputs import as_reference, cast, generator
from ngdn.nested_inputs import cast_levels, levels_as_reference
from ngdn.tolerances import record, relative_error, tolerance
from optimized import triton_mode

STATE_DTYPE = torch.float32


# --- running an entry on a sample ------------------------------------------------------------------

def _cast_states(name, value, to):
    """A sample's state entry cast by ``to(tensor, label) -> tensor``; levels' parameters keep their
    structure. Returns ``(value, {label: leaf})``."""
    leaves = {}
    if value is None:
        return None, leaves
    if name == "levels":
        out = to(value, "levels")
        for i, lv in enumerate(out):
            for n, p in lv.params.items():
                leaves[f"levels[{i}].{n}"] = p
        return out, leaves
    if isinstance(value, (list, tuple)):
        out = []
        for i, x in enumerate(value):
            y = None if x is None else to(x, f"{name}[{i}]")
            if y is not None:
                leaves[f"{name}[{i}]"] = y
            out.append(y)
        return out, leaves
    y = to(value, name)
    leaves[name] = y
    return y, leaves


def inputs_for(sample, dtype, grad: bool, reference: bool = False, transform=None):
    """The keyword arguments of one call and the leaves whose gradients are compared.
    ``reference``: float64 twins of the rounded values on the CPU (``as_reference``);
    ``transform(name, tensor)``: applied to each activation after the leaf is made (layouts)."""
    dev = "cpu" if reference else triton_mode.device()
    kwargs, leaves = {}, {}
    for name, x in sample.activations.items():
        if x is None:
            kwargs[name] = None
            continue
        leaf = as_reference(x, dtype, grad) if reference else cast(x, dtype, dev, grad)
        leaves[name] = leaf
        kwargs[name] = transform(name, leaf) if transform is not None else leaf
    for name, value in sample.states.items():
        if name == "levels":
            fn = (lambda lv, _: levels_as_reference(lv, STATE_DTYPE, grad)) if reference else \
                 (lambda lv, _: cast_levels(lv, STATE_DTYPE, dev, grad))
        else:
            fn = (lambda x, _: as_reference(x, STATE_DTYPE, grad)) if reference else \
                 (lambda x, _: cast(x, STATE_DTYPE, dev, grad))
        kwargs[name], new = _cast_states(name, value, fn)
        leaves.update(new)
    kwargs.update(sample.static)
    return kwargs, leaves


def flat_outputs(result) -> dict:
    """``(o, final)`` as ``{"output": o, "final_state": S}`` or ``{"final_state[ℓ]": S_ℓ}``."""
    o, final = result
    out = {"output": o}
    if isinstance(final, (list, tuple)):
        out.update({f"final_state[{i}]": s for i, s in enumerate(final)})
    elif final is not None:
        out["final_state"] = final
    return out


def cotangent(label: str, like: torch.Tensor, seed: int) -> torch.Tensor:
    """A fixed cotangent for output ``label`` (float64 CPU master, same for every call of a draw)."""
    gen = generator(seed * 1009 + sum(map(ord, label)))
    return torch.randn(like.shape, generator=gen, dtype=torch.float64)


def loss_of(outputs: dict, seed: int) -> torch.Tensor:
    total = 0
    for label, y in outputs.items():
        c = cotangent(label, y, seed).to(y.device, torch.float64 if y.dtype == torch.float64 else torch.float32)
        total = total + (y.to(c.dtype) * c).sum()
    return total


def run(info, draw, dtype, op=None, grad: bool = True, transform=None, sample=None, reference=False):
    """One call of ``op`` (default: the entry's optimized op; with ``reference``, the entry's
    reference in float64) on ``draw``: ``({label: value}, {"d<leaf>": gradient})``, detached."""
    sample = info.sample(draw) if sample is None else sample
    fn = info.reference if reference else (info.op if op is None else op)
    kwargs, leaves = inputs_for(sample, dtype, grad, reference=reference, transform=transform)
    outputs = flat_outputs(fn(**kwargs))
    grads = {}
    if grad:
        loss_of(outputs, draw.seed).backward()
        grads = gradients(leaves)
    return {k: v.detach() for k, v in outputs.items()}, grads


def gradients(leaves: dict) -> dict:
    """``{"d<leaf>": its gradient}`` after a backward (zeros where none reached it)."""
    return {f"d{n}": (x.grad if x.grad is not None else torch.zeros_like(x)) for n, x in leaves.items()}


# --- comparisons -----------------------------------------------------------------------------------

def exact(pairs: dict) -> dict:
    """``{label: (max |a − b|, 0)}``; ``inf`` for a shape mismatch or a NaN on either side."""
    out = {}
    for label, (a, b) in pairs.items():
        if a.shape != b.shape:
            out[label] = (math.inf, 0.0)
            continue
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
        if torch.equal(a64.isnan(), b64.isnan()) and torch.equal(torch.nan_to_num(a64), torch.nan_to_num(b64)):
            nan = bool(a64.isnan().any())
            out[label] = (math.inf if nan else 0.0, 0.0)
        else:
            diff = (a64 - b64).abs()
            out[label] = (math.inf if diff.isnan().any() else diff.max().item(), 0.0)
    return out


def same_results(first, second) -> dict:
    (va, ga), (vb, gb) = first, second
    pairs = {k: (va[k], vb.get(k, torch.full((0,), math.nan))) for k in va}
    pairs.update({k: (ga[k], gb.get(k, torch.full((0,), math.nan))) for k in ga})
    return exact(pairs)


def quantity(label: str) -> str:
    """The ``tolerances.yaml`` quantity of a label: indices dropped, scheme parameters ``dparams``,
    per-level initial states ``dinitial_state``."""
    if label.startswith("dlevels"):
        return "dparams"
    return re.sub(r"\[\d+\]", "", label).replace("dinitial_states", "dinitial_state")


def against(info, dtype, actual: dict, expected: dict, log: bool) -> dict:
    mode = triton_mode.configure()
    out = {}
    for label, a in actual.items():
        bound = tolerance(info.tolerance, quantity(label), dtype)
        error = relative_error(a, expected[label])
        if log:
            record(info.tolerance, mode, dtype, quantity(label), error, bound)
        out[label] = (error, bound)
    return out


# --- the generic properties ------------------------------------------------------------------------

def vs_reference(info, draw, dtype, op=None, log=True) -> dict:
    """Optimized == reference on ``draw``: the entry's own check (``info.vs_reference``) where it has
    one, else the generic one: ``op`` (default: the entry's) on the draw's sample against the
    entry's float64 reference on the same rounded inputs, every output, final state and
    gradient within the entry's tolerance (``info.tolerance``)."""
    op = info.op if op is None else op
    if info.vs_reference is not None:
        return info.vs_reference(draw, dtype, op, log)
    sample = info.sample(draw)
    values, grads = run(info, draw, dtype, op, sample=sample)
    ref_values, ref_grads = run(info, draw, dtype, sample=sample, reference=True)
    return labelled_against(info, dtype, {**values, **grads}, {**ref_values, **ref_grads}, log)


def labelled_against(info, dtype, actual: dict, expected: dict, log: bool) -> dict:
    """``against`` over the labels both sides hold; a label the op lacks, or returns in another
    shape (or one the reference lacks), is a failure of its own (an infinite error)."""
    actual = dict(actual)
    out = {f"{label} missing": (math.inf, 0.0) for label in sorted(set(expected) - set(actual))}
    for label in list(actual):
        if label not in expected or actual[label].shape != expected[label].shape:
            out[f"{label} shape {tuple(actual[label].shape)}"] = (math.inf, 0.0)
            del actual[label]
    out.update(against(info, dtype, actual, expected, log))
    return out


def bitwise(info, draw, dtype, op=None, baseline=None) -> dict:
    """``baseline``: this op's ``run`` on ``draw`` made earlier (one run fewer)."""
    baseline = run(info, draw, dtype, op) if baseline is None else baseline
    return same_results(run(info, draw, dtype, op), baseline)


def _sliced(sample, lo, hi):
    from ngdn.ops import Sample
    acts = {n: (None if x is None else x[:, lo:hi]) for n, x in sample.activations.items()}
    return Sample(acts, dict(sample.states), dict(sample.static))


def state_passing(info, draw, dtype, split: int, op=None, log=True) -> dict:
    """Two calls split at ``split`` against one float64 reference call: outputs, final states and
    the gradients of every input leaf of the first call (activations through both calls, initial
    states and scheme parameters)."""
    sp = info.state_passing
    op = info.op if op is None else op
    sample = info.sample(draw)
    kwargs, leaves = inputs_for(sample, dtype, True)
    first = {n: (x[:, :split] if n in sample.activations and x is not None else x) for n, x in kwargs.items()}
    second = {n: (x[:, split:] if n in sample.activations and x is not None else x) for n, x in kwargs.items()}
    first["output_final_state"] = second["output_final_state"] = True
    o1, s1 = op(**first)
    second[sp.argument] = s1
    second.update(sp.extra(split))
    o2, s2 = op(**second)
    outputs = flat_outputs((torch.cat([o1, o2], dim=1), s2))
    loss_of(outputs, draw.seed).backward()
    actual = {k: v.detach() for k, v in outputs.items()}
    actual.update(gradients(leaves))
    ref_values, ref_grads = run(info, draw, dtype, sample=sample, reference=True)
    return against(info, dtype, actual, {**ref_values, **ref_grads}, log)


FIRST_ORDER_ONLY = "supports first-order gradients only"


def second_order(info, draw, dtype, op=None) -> dict:
    """``torch.autograd.grad(loss, x, create_graph=True)`` for the first activation ``x``: refused
    with an error saying first-order only (capability ``"refused"``). Returning a gradient without
    a graph, or any other error, fails."""
    op = info.op if op is None else op
    sample = info.sample(draw)
    kwargs, leaves = inputs_for(sample, dtype, True)
    outputs = flat_outputs(op(**kwargs))
    name, x = next(iter(leaves.items()))
    try:
        (gx,) = torch.autograd.grad(loss_of(outputs, draw.seed), x, create_graph=True)
    except RuntimeError as e:
        refused = FIRST_ORDER_ONLY in str(e)
        return {f"d{name} create_graph refused": (0.0 if refused else math.inf, 0.0)}
    if info.second_order != "supported":
        return {f"d{name} create_graph refused": (math.inf, 0.0)}
    return {f"d{name} has a graph": (0.0 if gx.requires_grad else math.inf, 0.0)}


def grad_modes(info, draw, dtype, op=None, baseline=None) -> dict:
    op = info.op if op is None else op
    sample = info.sample(draw)
    values, _ = run(info, draw, dtype, op, sample=sample) if baseline is None else baseline
    out = {}
    for mode, ctx in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        kwargs, _ = inputs_for(sample, dtype, True)
        with ctx():
            got = flat_outputs(op(**kwargs))
        graph = any(y.requires_grad or y.grad_fn is not None for y in got.values())
        out[f"{mode}: no graph kept"] = (math.inf if graph else 0.0, 0.0)
        out.update({f"{mode}: {k}": e for k, e in exact({k: (got[k], values[k]) for k in values}).items()})
    return out


def _strided(name, x):
    """``x``'s values in a view whose last axis has stride 2 (every other element of a wider buffer)."""
    return torch.stack([x, torch.zeros_like(x)], dim=-1).flatten(-2)[..., ::2]


def _transposed(name, x):
    """``x``'s values in a view stored as ``[B, H, T, ...]`` (axes 1 and 2 swapped in memory)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2) if x.dim() >= 3 else x


def _batch_expanded(name, x):
    """Batch 0's values broadcast over the batch axis (an expanded view, stride 0)."""
    return x[:1].expand_as(x)


def _batch_expanded_copy(name, x):
    return x[:1].expand_as(x).contiguous()


def _strided_or_transposed(name, x):
    """Activations alternately in the two non-contiguous layouts (one run covers both)."""
    return _strided(name, x) if sum(map(ord, name)) % 2 else _transposed(name, x)


LAYOUTS = {"non-contiguous or transposed": (_strided_or_transposed, None),
           "expanded": (_batch_expanded, _batch_expanded_copy)}


def layouts(info, draw, dtype, op=None, baseline=None) -> dict:
    op = info.op if op is None else op
    sample = info.sample(draw)
    out = {}
    plain = run(info, draw, dtype, op, sample=sample) if baseline is None else baseline
    for layout, (view, copy) in LAYOUTS.items():
        baseline = plain if copy is None else run(info, draw, dtype, op, sample=sample, transform=copy)
        try:
            got = run(info, draw, dtype, op, sample=sample, transform=view)
        except Exception as e:      # a layout the op accepts must compute, not crash
            out[f"{layout}: {type(e).__name__}: {e}"[:200]] = (math.inf, 0.0)
            continue
        out.update({f"{layout}: {k}": e for k, e in same_results(got, baseline).items()})
    return out


@contextlib.contextmanager
def nan_filled_allocations():
    """Every floating ``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty``
    made inside comes back filled with NaN (integer buffers are left as allocated)."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def filled(fn):
        def make(*args, **kwargs):
            x = fn(*args, **kwargs)
            if x.is_floating_point() and x.numel():
                with torch.no_grad():
                    x.fill_(math.nan)
            return x
        return make

    try:
        for name, fn in originals.items():
            setattr(torch, name, filled(fn))
        torch.Tensor.new_empty = filled(new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty


def uninitialised_memory(info, draw, dtype, op=None, baseline=None) -> dict:
    op = info.op if op is None else op
    sample = info.sample(draw)
    baseline = run(info, draw, dtype, op, sample=sample) if baseline is None else baseline
    with nan_filled_allocations():
        poisoned = run(info, draw, dtype, op, sample=sample)
    return same_results(poisoned, baseline)


def edge_shape(info, shape, dtype, op=None, log=False) -> dict:
    """``vs_reference`` (the entry's or the generic one) on ``shape``; an up-front ``ValueError`` that names an argument of the
    op passes too (CONTRACT "Errors", edge shapes). Any other exception fails."""
    from ngdn.ops import Draw

    op = info.op if op is None else op
    try:
        return vs_reference(info, Draw(shape, seed=3), dtype, op, log)
    except ValueError as e:
        names = set(info.sample(Draw(shape, seed=3)).activations) | {"levels", "initial_state", "initial_states"}
        named = any(re.search(rf"\b{re.escape(n)}\b", str(e)) for n in names)
        return {f"ValueError naming an argument: {e}"[:200]: (0.0 if named else math.inf, 0.0)}
    except Exception as e:
        return {f"{type(e).__name__}: {e}"[:200]: (math.inf, 0.0)}


# --- packed variable-length batches ----------------------------------------------------------------

def per_sequence_states(info, sample) -> list:
    """The names of ``sample``'s per-sequence initial states (the entry's state-passing argument,
    where the sample holds one); scheme parameters (``levels``) are shared by every sequence."""
    name = None if info.state_passing is None else info.state_passing.argument
    return [name] if name is not None and sample.states.get(name) is not None else []


def cu_seqlens_of(lengths, device=None, dtype=torch.int32) -> torch.Tensor:
    """``[0, T_1, T_1 + T_2, …]`` for ``lengths`` on ``device`` (the op's by default)."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    return torch.tensor(bounds, dtype=dtype, device=triton_mode.device() if device is None else device)


def packed_sample(info, draw, lengths):
    """``info.sample(draw)`` (``draw.shape.B = N`` rows, ``T ≥ max(lengths)``) packed in one row:
    row ``i``'s first ``lengths[i]`` tokens, in order, along T (B = 1). The per-sequence initial
    states keep their leading ``N``, one per sequence."""
    from ngdn.ops import Sample

    sample = info.sample(draw)
    if draw.shape.B != len(lengths) or max(lengths) > draw.shape.T or min(lengths) < 1:
        raise ValueError(f"lengths {list(lengths)} need a draw with B = {len(lengths)} rows of T >= {max(lengths)} "
                         f"tokens, got B = {draw.shape.B}, T = {draw.shape.T}")
    acts = {n: (None if x is None else torch.cat([x[i:i + 1, :n_i] for i, n_i in enumerate(lengths)], dim=1))
            for n, x in sample.activations.items()}
    return Sample(acts, dict(sample.states), dict(sample.static))


def _sequence_state(value, i):
    if isinstance(value, (list, tuple)):
        return [None if x is None else x[i:i + 1] for x in value]
    return value[i:i + 1]


def _stacked_finals(finals):
    if finals[0] is None:
        return None
    if isinstance(finals[0], (list, tuple)):
        return [torch.cat([f[l] for f in finals], dim=0) for l in range(len(finals[0]))]
    return torch.cat(finals, dim=0)


def packed_equals_separate(info, draw, lengths, dtype, op=None, log=True, cu_dtype=torch.int32) -> dict:
    """One packed call of ``op`` (default: the entry's op) with ``cu_seqlens`` against N separate
    float64 reference calls (each on its own sequence and initial state): the output, the
    per-sequence final states and the gradients of every leaf (packed activations, per-sequence
    initial states, scheme parameters), within the entry's tolerance. ``draw`` has ``B = N`` rows
    (``packed_sample``); a sequence's cotangent is its slice of the packed one."""
    op = info.op if op is None else op
    sample = packed_sample(info, draw, lengths)
    states = per_sequence_states(info, sample)
    kwargs, leaves = inputs_for(sample, dtype, True)
    try:
        outputs = flat_outputs(op(**kwargs, cu_seqlens=cu_seqlens_of(lengths, dtype=cu_dtype)))
    except Exception as e:      # a packed call the contract accepts must compute
        return {f"packed call: {type(e).__name__}: {e}"[:200]: (math.inf, 0.0)}
    loss_of(outputs, draw.seed).backward()
    actual = {k: v.detach() for k, v in outputs.items()}
    actual.update(gradients(leaves))

    ref_kwargs, ref_leaves = inputs_for(sample, dtype, True, reference=True)
    pieces, finals, start = [], [], 0
    for i, n_i in enumerate(lengths):
        call = {n: (x[:, start:start + n_i] if n in sample.activations and x is not None else x)
                for n, x in ref_kwargs.items()}
        call.update({n: _sequence_state(ref_kwargs[n], i) for n in states})
        o_i, final_i = info.reference(**call)
        pieces.append(o_i)
        finals.append(final_i)
        start += n_i
    expected = flat_outputs((torch.cat(pieces, dim=1), _stacked_finals(finals)))
    loss_of(expected, draw.seed).backward()
    expected = {k: v.detach() for k, v in expected.items()}
    expected.update(gradients(ref_leaves))
    return labelled_against(info, dtype, actual, expected, log)


def packed_strided_cu_seqlens(info, draw, lengths, dtype, op=None, cu_dtype=torch.int32) -> dict:
    """One packed call of ``op`` with ``cu_seqlens`` as a strided view (every other element of a
    buffer, the same ``[0, T_1, …]``) against the same call with a contiguous ``cu_seqlens``: the
    output, final states and every gradient bit for bit. A kernel indexing ``cu_seqlens`` by
    pointer reads the view's gaps unless the op makes it contiguous first."""
    op = info.op if op is None else op
    sample = packed_sample(info, draw, lengths)
    cu = cu_seqlens_of(lengths, dtype=cu_dtype)
    strided = torch.stack([cu, torch.full_like(cu, -7)], dim=1)[:, 0]       # stride 2, gaps of -7

    def call(cu_seqlens):
        kwargs, leaves = inputs_for(sample, dtype, True)
        outputs = flat_outputs(op(**kwargs, cu_seqlens=cu_seqlens))
        loss_of(outputs, draw.seed).backward()
        return {k: v.detach() for k, v in outputs.items()}, gradients(leaves)

    plain = call(cu)
    try:
        got = call(strided)
    except Exception as e:      # a cu_seqlens the contract accepts must compute
        return {f"strided cu_seqlens: {type(e).__name__}: {e}"[:200]: (math.inf, 0.0)}
    return {f"strided cu_seqlens: {k}": e for k, e in same_results(got, plain).items()}


# --- every property at once ------------------------------------------------------------------------

# (B, T, H, K, V): an empty batch, no heads, one token, head dims off 16, the smallest head dims.
EDGE_SIZES = {"B=0": (0, 5, 2, 16, 16), "H=0": (2, 5, 0, 16, 16), "T=1": (2, 1, 2, 16, 16),
              "K,V off 16": (2, 5, 2, 20, 12), "K=V=1": (2, 5, 2, 1, 1)}


def battery(info, dtype=torch.float32, op=None, log=False) -> dict:
    """Every generic property on the entry, as ``property_tests/test_ops.py`` draws them (the
    covering draw; the self-consistency draw at the entry's ``short_T``; each allowed split; each
    edge shape at its plain sizes; the packed rows), skipping the properties the entry's ``skips``
    name: ``{"<property> <label>": (error, bound)}``. For an op added to the table in a test
    (``tests/test_op_table_toy.py``); the property tests run the same calls one test each."""
    from ngdn import ops

    applies = lambda prop: prop not in info.skips                                     # noqa: E731
    d = info.covering()
    short = d._replace(shape=d.shape._replace(T=info.short_T))
    errors = {}

    def add(prop, got):
        errors.update({f"{prop} {k}": e for k, e in got.items()})

    if applies("vs_reference"):
        add("vs_reference", vs_reference(info, d, dtype, op, log))
    baseline = run(info, short, dtype, op)
    for prop in ("bitwise", "grad_modes", "layouts", "uninitialised_memory"):
        if applies(prop):
            add(prop, globals()[prop](info, short, dtype, op, baseline=baseline))
    if applies("second_order"):
        add("second_order", second_order(info, short, dtype, op))
    if info.state_passing is not None and applies("state_passing"):
        long = d._replace(shape=d.shape._replace(T=max(d.shape.T, 70)))
        for split in info.state_passing.splits(long):
            add(f"state_passing at {split}", state_passing(info, long, dtype, split, op, log))
    if applies("edge_shape"):
        for edge, sizes in EDGE_SIZES.items():
            add(f"edge_shape {edge}", edge_shape(info, info.edge_shape(*sizes), dtype, op, log))
    if info.varlen:
        rows = [(ops.packed_test_draw(info), ops.PACKED_LENGTHS, info.packed_cu_dtype)]
        rows += [(ops.packed_case_draw(info, c), c.lengths, c.cu_dtype) for c in info.packed_cases]
        for i, (draw, lengths, cu_dtype) in enumerate(rows):
            if applies("packed_equals_separate"):
                add(f"packed_equals_separate {lengths}",
                    packed_equals_separate(info, draw, lengths, dtype, op, log, cu_dtype=cu_dtype))
            if i == 0 and applies("packed_strided_cu_seqlens"):
                add("packed_strided_cu_seqlens", packed_strided_cu_seqlens(info, draw, lengths, dtype, op, cu_dtype))
    return errors

