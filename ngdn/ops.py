"""The table of ops: one entry per public optimized op (PyTorch OpInfo's idea, this project's shape).

An entry names everything a generic check needs to run the op and its spec:

- ``op``: the optimized function (``optimized.__all__``), ``reference`` its float64 PyTorch
  reference;
- ``sample(draw)``: seeded float64 master inputs (``Sample``) for one ``Draw``: activations (cast to
  the kernel dtype), states and scheme parameters (float32 for the op, float64 for the reference),
  static keyword arguments;
- ``covering``: one fixed draw with B ≥ 2, H ≥ 2, more than one chunk and a ragged last chunk
  (on CUDA a compile bucket's sizes, ``ngdn.compile_buckets``);
- ``vs_reference(draw, dtype, op, log)`` / ``vs_numpy(draw, log)``: the op's own agreement checks
  (``ngdn.checks.<op>``: values, final states, every gradient); without ``vs_reference`` the
  generic one (``ngdn.checks.generic.vs_reference``: the op against ``reference`` on the sample's
  rounded inputs, every output and gradient), without ``vs_numpy`` no NumPy comparison;
- ``tolerance``: the ``tolerances.yaml`` component of ``vs_reference``; ``family`` the compile
  family (None: the op compiles no kernels of its own); ``dtypes`` per device mode;
- capabilities: ``state_passing`` (how a sequence may be
  split and continued, or None), ``deterministic`` (two runs agree bit for bit),
  ``second_order`` (``"refused"``: a ``create_graph=True`` backward raises; ``"supported"``: it
  returns a gradient with its graph), ``varlen`` (takes ``cu_seqlens``:
  sequences packed in one row, each computed as a separate call; the per-sequence initial state is
  the ``state_passing`` argument), ``positional`` (a token's result depends on its position in
  its sequence: a firing schedule or a Fenwick counter, so a packed sequence must start its own
  chunk grid);
- per-entry choices of the generic tests: ``short_T`` (the self-consistency draw's T: one ragged
  chunk, or as many tokens as the op needs to reach its schedule), ``packed_cu_dtype`` (the
  ``cu_seqlens`` dtype of its packed property: both index widths are reached across the table),
  ``packed_cases`` (further packed rows, ``PackedCase``), ``mutant_modes`` (the device modes in
  which the broken twins of ``property_tests/test_ops.py`` run on this entry: a twin wraps the op
  from outside, so a cheap entry or two per mode shows each property's teeth);
- ``small_call(dtype, device)``: the keyword arguments of one valid small call (B = 2, T = 8,
  H = 1; float64 on the CPU for the reference), the base of the bad-input cases
  (``tests/test_bad_inputs.py`` runs its cases common to every op on it); ``error_inputs()``: the
  entry's own bad inputs (``ErrorInput``: a bad call made from the small call, the error type and
  message it must raise, optimized op and reference);
- ``skips``: ``{property: reason}`` for a generic property (or bad-input case) that does not apply
  to this op, the reason saying why; the generic tests skip with it (``skip_reason``).

The generic checks (``ngdn.checks.generic``) and the generic properties
(``property_tests/test_ops.py``) iterate this table; ``ngdn check`` runs each entry's
``vs_reference``. Adding an op: docs/ops.md, "Adding an op".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from ngdn.compile_buckets import on_bucket
from ngdn.fenwick_inputs import FenwickShape, fenwick_gdn2_inputs, fenwick_inputs
from ngdn.inputs import GDN2Shape, gdn2_inputs
from ngdn.nested_inputs import NestedShape, cast_levels, nested_inputs
from ngdn.tensor3d_inputs import Tensor3DShape, tensor3d_inputs
from optimized import (chunk_fenwick, chunk_fenwick_gdn2, chunk_gdn2, chunk_nested_gdn2, chunk_tensor3d,
                       triton_mode)
from reference import naive_fenwick, naive_fenwick_gdn2, naive_gdn2, naive_nested_gdn2, naive_tensor3d
from reference.nested import CHUNK_SIZE

CHUNK = CHUNK_SIZE   # 64: every op's chunk


class Draw(NamedTuple):
    """One draw of an op: its shape NamedTuple, a seed, the input regime and op options
    (e.g. the tensor state's gate granularity, the nested op's scheme)."""
    shape: tuple
    seed: int = 0
    regime: str = "typical"
    options: tuple = ()            # sorted (name, value) pairs

    def option(self, name, default=None):
        return dict(self.options).get(name, default)


@dataclass
class Sample:
    """An op's inputs as float64 masters. ``activations`` are cast to the kernel dtype,
    ``states`` (initial states: a tensor or a list; scheme parameters: ``levels``) to float32;
    ``static`` are passed as they are."""
    activations: dict
    states: dict = field(default_factory=dict)
    static: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StatePassing:
    """How a call may be split at token ``split`` and continued: ``argument`` receives the first
    call's final state(s); ``splits(draw)`` lists the split points the contract allows for the
    draw (at a chunk boundary and, where allowed, off one); ``extra(split)`` further keyword
    arguments of the second call (e.g. Fenwick GDN-2's ``offset``)."""
    argument: str
    splits: Callable
    extra: Callable = lambda split: {}


@dataclass(frozen=True)
class ErrorInput:
    """One bad input of an entry (PyTorch's ErrorInput): ``id`` (the test id), ``bad(args) -> args``
    turning a valid small call's keyword arguments (``OpInfo.small_call``) into the bad call's,
    the ``error`` type and ``match``, a regex its message must match, and the ``sides``
    (``"optimized"``, ``"reference"``) that must raise it. A side in the entry's ``skips`` under
    ``"<side>: <id>"`` is skipped with its reason."""
    id: str
    bad: Callable
    error: type
    match: str
    sides: tuple = ("optimized", "reference")


@dataclass(frozen=True)
class PackedCase:
    """A packed row an entry is checked on beyond ``PACKED_LENGTHS``: ``name`` (a test id and the
    GPU suite's precompile unit), ``lengths`` of its sequences, ``shape`` fields replaced in the
    draw (sorted pairs), the ``cu_seqlens`` dtype, and ``why`` the row is there."""
    name: str
    lengths: tuple
    shape: tuple = ()
    cu_dtype: torch.dtype = torch.int32
    why: str = ""


@dataclass(frozen=True)
class OpInfo:
    name: str
    op: Callable
    reference: Callable
    sample: Callable                    # Draw -> Sample
    covering: Callable                  # () -> Draw
    edge_shape: Callable                # (B, T, H, K, V) -> shape NamedTuple
    tolerance: str
    family: str | None = None           # the compile family (ngdn.compile_buckets); None: no kernels of its own
    vs_reference: Callable | None = None    # (draw, dtype, op, log) -> {label: (error, bound)}; None: generic
    vs_numpy: Callable | None = None        # (draw, log) -> {quantity: (error, bound)}
    dtypes: dict = field(default_factory=lambda: {triton_mode.CPU_INTERPRET: (torch.float32,),
                                                  triton_mode.CUDA: (torch.float32, torch.bfloat16)})
    state_passing: StatePassing | None = None
    deterministic: bool = True
    second_order: str = "refused"
    varlen: bool = True
    positional: bool = False
    short_T: int = 20
    packed_cu_dtype: torch.dtype = torch.int32
    packed_cases: tuple = ()
    mutant_modes: tuple = ()
    small_call: Callable | None = None  # (dtype=float32, device=None: the mode's) -> kwargs
    error_inputs: Callable = lambda: []  # () -> [ErrorInput]
    skips: dict = field(default_factory=dict)

    def __repr__(self):
        return f"OpInfo({self.name})"


def options(**kwargs) -> tuple:
    return tuple(sorted(kwargs.items()))


def packed_draw(info, lengths, H=2, K=8, V=12, seed=1, **shape) -> Draw:
    """A draw for a packed call of ``lengths`` (``ngdn.checks.generic.packed_equals_separate``):
    ``B = len(lengths)`` rows of ``T = max(lengths)`` tokens, one row per sequence; ``shape``
    replaces further fields (e.g. ``L``). Fenwick shapes get one level more than the longest
    sequence needs (the levels a packed call takes are set by its longest sequence)."""
    base = info.edge_shape(len(lengths), max(lengths), H, K, V)
    if "extra_levels" in base._fields:
        shape = {"extra_levels": 1, **shape}
    return Draw(base._replace(**shape), seed=seed)


# The packed properties' calls (``property_tests/test_ops.py``, ``property_tests/test_fenwick_gdn2.py``),
# here so the GPU suite's precompile (``suite.precompile``) makes exactly the same calls: the
# same shapes on the same compile buckets and the same ``cu_seqlens`` dtype (int32 and int64 index
# tensors compile different kernels).
# Ragged lengths: one token, one short of a chunk, a chunk, one over (two chunks); packed T = 193,
# four chunks of the packed row, with the sequences starting off its chunk grid (at 65, 66, 129).
PACKED_LENGTHS = (65, 1, 63, 64)
# Fenwick GDN-2: a 3-chunk sequence (carries m = 0, 1; J = 2), a 1-token one, a 5-chunk one starting
# at chunk 4 of the packed grid (carries m = 0, 1, 0, 2 on its own counter; 0, 1, 0, 3 on the packed
# grid's; J = 3, the row's), and a full one-chunk one; the last chunks are 2, 1, 44 and 64 tokens,
# none on the packed row's chunk grid but the first two.
FENWICK_GDN2_RAGGED_LENGTHS = (130, 1, 300, 64)
# Nested GDN-2 at L = 3 (intervals 1, 2): the 130-token sequence fires levels 1 and 2, the 65-token
# one level 1 only, the 1-token one none (packed T = 196).
NESTED_LEVELS_LENGTHS = (1, 130, 65)


def packed_cu_dtype(info) -> torch.dtype:
    """The ``cu_seqlens`` dtype the packed property gives the op (the entry's ``packed_cu_dtype``:
    int64 for some, int32 for the others, so both index widths are reached)."""
    return info.packed_cu_dtype


def packed_case_draw(info, case: PackedCase) -> Draw:
    """The draw of one of the entry's ``packed_cases`` (``packed_test_draw`` with its shape fields)."""
    return packed_test_draw(info, case.lengths, **dict(case.shape))


def skip_reason(info, prop: str):
    """Why generic property (or bad-input case) ``prop`` does not apply to the entry, or None."""
    return info.skips.get(prop)


def packed_test_draw(info, lengths=PACKED_LENGTHS, **shape) -> Draw:
    """``packed_draw`` (H = 2, K = 8, V = 12, below the dots' 16: the head-dim padding runs with
    cu_seqlens). On CUDA the sizes of the family's second compile bucket (H = 2: kernels the bucket
    tests compile); for fla's log-linear kernels, whose level and chunk counts change with the packed
    T anyway, the smallest bucket's head dims at H = 2 (their local memory per program grows with K,
    V and the levels: ``fenwick_covering_shape``)."""
    from ngdn.testing import on_cuda

    d = packed_draw(info, lengths, **shape)
    if not on_cuda() or info.family is None:
        return d
    if info.family == "fenwick":
        return d._replace(shape=on_bucket(d.shape, "fenwick", 2)._replace(H=2))
    return d._replace(shape=on_bucket(d.shape, info.family, 1))


def fenwick_gdn2_ragged_draw() -> Draw:
    """Fenwick GDN-2's packed row of ``FENWICK_GDN2_RAGGED_LENGTHS`` (H = 1, the first level-0 bucket's
    head dims on CUDA; its packed property passes ``cu_seqlens`` as int64)."""
    d = packed_draw(get("fenwick-gdn2"), FENWICK_GDN2_RAGGED_LENGTHS, H=1, K=16, V=16, seed=11)
    return d._replace(shape=on_bucket(d.shape)._replace(H=1))


# --- bad inputs: helpers of the entries' error_inputs ---------------------------------------------

SMALL = dict(B=2, T=8, H=1)     # the small calls' sizes (K = V = 8; the 3D state K = 4, E = 2)


def _device(device):
    return triton_mode.device() if device is None else device


def one_row(args: dict) -> dict:
    """A valid call's inputs cut to batch row 0 (B = 1), as a packed call takes them."""
    return {n: (x[:1] if isinstance(x, torch.Tensor) and x.dim() >= 3 else x) for n, x in args.items()}


def poisoned(args: dict, name: str, value, b=1, t=5) -> dict:
    """``args`` with ``args[name][b, t] = value`` (a copy)."""
    x = args[name].clone()
    x[b, t] = value
    return dict(args, **{name: x})


def huge(*shape, device="cpu") -> torch.Tensor:
    """A zero-filled view of any size that allocates one element."""
    return torch.zeros(1, device=device).expand(*shape)


HUGE_T = 2 ** 31


def _first_device(args):
    return next(x.device for x in args.values() if isinstance(x, torch.Tensor))


def state_type_error(argument: str) -> ErrorInput:
    """A list where the initial state(s) belong: a TypeError naming the argument."""
    def bad(args):
        value = [[0.0]] if argument == "initial_state" else [[[0.0]]] * (len(args["levels"]) + 1)
        return dict(args, **{argument: value})
    return ErrorInput(f"{argument} a list", bad, TypeError, rf"{argument}(\[0\])? must be a torch.Tensor")


def packed_state_errors(argument: str, state: tuple, layout: str, per_level: bool = False) -> list:
    """``cu_seqlens = [0, 3, 8]`` holds two sequences: a per-sequence initial state of leading size 1
    or 3 (``state``: its other sizes; ``per_level``: one per upper level, two) is refused."""
    cases = []
    for N in (1, 3):
        def bad(args, N=N):
            args = one_row(args)
            device = _first_device(args)
            s = torch.zeros((N, *state), dtype=torch.float32, device=device)
            return dict(args, **{argument: [s, s] if per_level else s},
                        cu_seqlens=torch.tensor([0, 3, 8], device=device))
        cases.append(ErrorInput(f"packed {argument} of {N} for 2 sequences", bad, ValueError,
                                rf"{argument}(\[0\])? must have shape {layout} with one state per sequence, "
                                rf"N = 2 \(cu_seqlens holds 3 entries\), got \({N}, "))
    return cases


# --- GDN-2 ---------------------------------------------------------------------------------------

def gdn2_sample(d: Draw) -> Sample:
    x = gdn2_inputs(d.shape, d.seed, regime=d.regime)
    return Sample({n: x[n] for n in ("q", "k", "v", "g", "b", "w")}, {"initial_state": x["initial_state"]},
                  {"output_final_state": True})


def gdn2_vs_reference(d, dtype, op, log=True):
    from ngdn.checks import gdn2
    return gdn2.optimized_vs_reference(d.shape, d.seed, dtype, optimized=op, log=log, regime=d.regime)


def gdn2_vs_numpy(d, log=True):
    from ngdn.checks import gdn2
    return gdn2.torch_vs_numpy(d.shape, d.seed, log=log, regime=d.regime)


GDN2_INPUTS = ("q", "k", "v", "g", "b", "w")


def gdn2_small_call(dtype=torch.float32, device=None) -> dict:
    x = gdn2_inputs(GDN2Shape(K=8, V=8, **SMALL), seed=0)
    return {n: x[n].to(_device(device), dtype) for n in GDN2_INPUTS}


def gdn2_error_inputs() -> list:
    return [state_type_error("initial_state"),
            *packed_state_errors("initial_state", (1, 8, 8), r"\[N, H, K, V\]"),
            ErrorInput("g = -inf says what to do", lambda args: poisoned(args, "g", float("-inf")), ValueError,
                       r"g = -inf, a full forget, is computed by the references only.*clamp g at -100",
                       sides=("optimized",))]


def anywhere(d: Draw) -> list:
    """Split points for ops whose state passing holds at any token: a chunk boundary and off one."""
    T = d.shape.T
    return sorted({s for s in (CHUNK, CHUNK // 2 + 5) if 0 < s < T})


def chunk_boundaries(d: Draw) -> list:
    return [s for s in range(CHUNK, d.shape.T, CHUNK)][:2]


# --- Nested GDN-2 --------------------------------------------------------------------------------

def nested_sample(d: Draw) -> Sample:
    x = nested_inputs(d.shape, d.seed, scheme=d.option("scheme", "learned"),
                      reduction=d.option("reduction", "mean"), regime=d.regime)
    return Sample({n: x[n] for n in ("q", "k", "v", "g", "b", "w", "r")},
                  {"levels": x["levels"], "initial_states": x["initial_states"]}, {"output_final_state": True})


def nested_small_call(dtype=torch.float32, device=None) -> dict:
    x = nested_inputs(NestedShape(L=2, K=8, V=8, **SMALL), seed=0)
    args = {n: x[n].to(_device(device), dtype) for n in ("q", "k", "v", "g", "b", "w", "r")}
    args["levels"] = cast_levels(x["levels"], torch.float32 if dtype != torch.float64 else dtype, _device(device))
    return args


def nested_error_inputs() -> list:
    def huge_call(args):
        device = _first_device(args)
        x = {n: huge(1, HUGE_T, 1, 4, device=device) for n in ("k", "v", "g", "b", "w")}
        return dict(q=huge(1, HUGE_T, 1, 1, 4, device=device), **x, r=huge(1, HUGE_T, 1, 1, device=device), levels=[])
    return [state_type_error("initial_states"),
            *packed_state_errors("initial_states", (1, 8, 8), r"\[N, H, K, V\]", per_level=True),
            ErrorInput("T = 2**31", huge_call, ValueError, r"q \[B, T, H, L, K\] = \(1, 2147483648, 1, 1, 4\) would hold",
                       sides=("optimized",))]


def nested_vs_reference(d, dtype, op, log=True):
    from ngdn.checks import nested_optimized as checks
    case = checks.OptCase(shape=d.shape, seed=d.seed, scheme=d.option("scheme", "learned"),
                          reduction=d.option("reduction", "mean"), regime=d.regime)
    errors = checks.optimized_vs_reference(case, dtype, op=op, log=log)
    return {label: eb for label, eb in errors.items()}


def nested_vs_numpy(d, log=True):
    from ngdn.checks import nested
    case = nested.NestedCase(shape=d.shape, seed=d.seed, scheme=d.option("scheme", "learned"),
                             reduction=d.option("reduction", "mean"), regime=d.regime)
    return nested.nested_torch_vs_numpy(case, log=log)


def nested_splits(d: Draw) -> list:
    """CONTRACT §3: a split at a multiple of ``64 · lcm(f)`` (default intervals ``2^(ℓ-1)``) is one call."""
    period = CHUNK * 2 ** max(0, d.shape.L - 2)
    return [s for s in range(period, d.shape.T, period)][:1]


SCHEMES = ("learned", "merge", "bounded_erase")     # the built-in schemes


# --- 3D tensor state -----------------------------------------------------------------------------

def tensor3d_sample(mode):
    def sample(d: Draw) -> Sample:
        x = tensor3d_inputs(d.shape, d.seed, mode, d.option("gate", "tile"), d.option("key_mode", "sigmoid"),
                            regime=d.regime)
        return Sample({n: x[n] for n in ("q1", "k1", "q2", "k2", "v", "g", "beta")},
                      {"initial_state": x["initial_state"]}, {"mode": mode, "output_final_state": True})
    return sample


def tensor3d_small_call(mode):
    def call(dtype=torch.float32, device=None) -> dict:
        x = tensor3d_inputs(Tensor3DShape(K=4, E=2, V=8, **SMALL), 0, mode, "tile")
        args = {n: x[n].to(_device(device), dtype) for n in ("q1", "k1", "q2", "k2", "v", "g")}
        args["beta"] = None if x["beta"] is None else x["beta"].to(_device(device), dtype)
        return dict(args, mode=mode)
    return call


def tensor3d_error_inputs() -> list:
    def huge_call(args):
        device = _first_device(args)
        x = {n: huge(1, HUGE_T, 1, 4, device=device) for n in ("q1", "k1", "q2", "k2", "v")}
        beta = huge(1, HUGE_T, 1, device=device) if args["beta"] is not None else None
        return dict(x, beta=beta, mode=args["mode"])
    return [state_type_error("initial_state"),
            *packed_state_errors("initial_state", (1, 4, 2, 8), r"\[N, H, K, E, V\]"),
            ErrorInput("T = 2**31", huge_call, ValueError, r"more than 2\*\*31 - 1", sides=("optimized",))]


def tensor3d_vs_reference(mode):
    def check(d, dtype, op, log=True):
        from ngdn.checks import tensor3d
        return tensor3d.optimized_vs_reference(d.shape, d.seed, dtype, mode, d.option("gate", "tile"),
                                               d.option("key_mode", "sigmoid"), optimized=op, log=log)
    return check


def tensor3d_vs_numpy(mode):
    def check(d, log=True):
        from ngdn.checks import tensor3d
        return tensor3d.torch_vs_numpy(d.shape, d.seed, mode, d.option("gate", "tile"),
                                       d.option("key_mode", "sigmoid"), log=log, regime=d.regime)
    return check


# --- Fenwick router and Fenwick GDN-2 ------------------------------------------------------------

FENWICK_INPUTS = ("q", "k", "v", "g", "level_scales")
FENWICK_GDN2_INPUTS = ("q", "k", "v", "g", "b", "w", "level_scales")


def fenwick_small_call(dtype=torch.float32, device=None) -> dict:
    x = fenwick_inputs(FenwickShape(K=8, V=8, **SMALL), seed=0)
    return {n: x[n].to(_device(device), dtype) for n in FENWICK_INPUTS}


def fenwick_gdn2_small_call(dtype=torch.float32, device=None) -> dict:
    x = fenwick_gdn2_inputs(FenwickShape(K=8, V=8, **SMALL), seed=0)
    return {n: x[n].to(_device(device), dtype) for n in FENWICK_GDN2_INPUTS}


def fenwick_error_inputs() -> list:
    def huge_call(args):
        device = _first_device(args)
        return dict(q=huge(1, HUGE_T, 1, 4, device=device), k=huge(1, HUGE_T, 1, 4, device=device),
                    v=huge(1, HUGE_T, 1, 4, device=device), g=huge(1, HUGE_T, 1, device=device),
                    level_scales=huge(1, HUGE_T, 1, 33, device=device))
    return [ErrorInput("T = 2**31", huge_call, ValueError, r"more than 2\*\*31 - 1", sides=("optimized",))]


def fenwick_gdn2_error_inputs() -> list:
    def with_state(args):
        args = one_row(args)
        device = _first_device(args)
        state = torch.zeros(2, 1, args["level_scales"].shape[-1], 8, 8, device=device)
        return dict(args, initial_state=state, cu_seqlens=torch.tensor([0, 3, 8], device=device))
    return [state_type_error("initial_state"),
            ErrorInput("offset with cu_seqlens",
                       lambda args: dict(one_row(args), offset=64,
                                         cu_seqlens=torch.tensor([0, 3, 8], device=_first_device(args))),
                       ValueError, r"offset must be 0 with cu_seqlens", sides=("optimized",)),
            ErrorInput("initial_state with cu_seqlens", with_state, ValueError,
                       r"initial_state is not accepted with cu_seqlens", sides=("optimized",))]


def fenwick_sample(d: Draw) -> Sample:
    x = fenwick_inputs(d.shape, d.seed, regime=d.regime)
    return Sample({n: x[n] for n in FENWICK_INPUTS})


def fenwick_gdn2_sample(d: Draw) -> Sample:
    x = fenwick_gdn2_inputs(d.shape, d.seed, regime=d.regime)
    return Sample({n: x[n] for n in FENWICK_GDN2_INPUTS}, {}, {"output_final_state": True})


def fenwick_covering_shape() -> FenwickShape:
    """Two chunks, the last ragged, on the CPU; on CUDA the smallest compile bucket (``c``: one
    chunk, K = 20, V = 12), because fla's log-linear kernels hold every level's state per program
    and the local memory a CUDA context reserves for them is never given back: each test worker
    that runs a larger variant keeps gigabytes of the GPU (``ngdn.compile_buckets``)."""
    if triton_mode.configure() != triton_mode.CUDA:
        return FenwickShape(B=2, T=100, H=2, K=20, V=16)
    return on_bucket(FenwickShape(B=2, T=60, H=2, K=20, V=12), "fenwick", 2)


def fenwick_vs_reference(d, dtype, op, log=True):
    from ngdn.checks import fenwick
    return fenwick.optimized_vs_reference(d.shape, d.seed, dtype, optimized=op, log=log)


def fenwick_vs_numpy(d, log=True):
    from ngdn.checks import fenwick
    return fenwick.torch_vs_numpy(d.shape, d.seed, log=log, regime=d.regime)


def fenwick_gdn2_vs_reference(d, dtype, op, log=True):
    from ngdn.checks import fenwick_gdn2
    return fenwick_gdn2.optimized_vs_reference(d.shape, d.seed, dtype, optimized=op, log=log, regime=d.regime)


# --- the table -----------------------------------------------------------------------------------

def _gdn2_shape(B, T, H, K, V):
    return GDN2Shape(B, T, H, K, V)


OPS = (
    OpInfo("gdn2", chunk_gdn2, naive_gdn2, gdn2_sample,
           covering=lambda: Draw(on_bucket(GDN2Shape(B=2, T=100, H=2, K=32, V=48)), seed=1),
           edge_shape=_gdn2_shape, vs_reference=gdn2_vs_reference, vs_numpy=gdn2_vs_numpy, tolerance="gdn2",
           family="level0", state_passing=StatePassing("initial_state", anywhere), packed_cu_dtype=torch.int64,
           mutant_modes=(triton_mode.CUDA,), small_call=gdn2_small_call, error_inputs=gdn2_error_inputs),
    OpInfo("nested", chunk_nested_gdn2, naive_nested_gdn2, nested_sample,
           covering=lambda: Draw(on_bucket(NestedShape(B=2, T=130, H=2, L=2, K=16, V=24)), seed=1,
                                 options=options(scheme="learned", reduction="mean")),
           edge_shape=lambda B, T, H, K, V: NestedShape(B, T, H, 2, K, V), vs_reference=nested_vs_reference,
           vs_numpy=nested_vs_numpy, tolerance="nested", family="level0",
           state_passing=StatePassing("initial_states", nested_splits), positional=True, short_T=70,
           packed_cu_dtype=torch.int64, small_call=nested_small_call, error_inputs=nested_error_inputs,
           packed_cases=(PackedCase("nested-levels", NESTED_LEVELS_LENGTHS, options(L=3),
                                    why="sequences firing at different levels (L = 3)"),),
           skips={"reference g = -inf forgets the past": (
               "g = -inf forgets level 0 only; the upper levels keep their snapshots, and at T = 8 "
               "(no firing) the router still reads level 1, so outputs after it may depend on "
               "earlier values")}),
    OpInfo("tensor3d-gla", chunk_tensor3d, naive_tensor3d, tensor3d_sample("gla"),
           covering=lambda: Draw(on_bucket(Tensor3DShape(B=2, T=100, H=2, K=4, E=4, V=24), "tensor3d"), seed=1,
                                 options=options(gate="channel", key_mode="sigmoid")),
           edge_shape=lambda B, T, H, K, V: Tensor3DShape(B, T, H, K, 2, V),
           vs_reference=tensor3d_vs_reference("gla"), vs_numpy=tensor3d_vs_numpy("gla"), tolerance="tensor3d_gla",
           family="tensor3d", state_passing=StatePassing("initial_state", anywhere),
           mutant_modes=(triton_mode.CPU_INTERPRET,), small_call=tensor3d_small_call("gla"),
           error_inputs=tensor3d_error_inputs),
    OpInfo("tensor3d-delta", chunk_tensor3d, naive_tensor3d, tensor3d_sample("delta"),
           covering=lambda: Draw(on_bucket(Tensor3DShape(B=2, T=100, H=2, K=4, E=4, V=24), "tensor3d"), seed=1,
                                 options=options(gate="tile", key_mode="softmax")),
           edge_shape=lambda B, T, H, K, V: Tensor3DShape(B, T, H, K, 2, V),
           vs_reference=tensor3d_vs_reference("delta"), vs_numpy=tensor3d_vs_numpy("delta"),
           tolerance="tensor3d_delta", family="tensor3d", state_passing=StatePassing("initial_state", anywhere),
           small_call=tensor3d_small_call("delta"), error_inputs=tensor3d_error_inputs),
    OpInfo("fenwick", chunk_fenwick, naive_fenwick, fenwick_sample,
           covering=lambda: Draw(fenwick_covering_shape(), seed=1),
           edge_shape=lambda B, T, H, K, V: FenwickShape(B, T, H, K, V),
           vs_reference=fenwick_vs_reference, vs_numpy=fenwick_vs_numpy, tolerance="fenwick", family="fenwick",
           positional=True, packed_cu_dtype=torch.int64, mutant_modes=(triton_mode.CPU_INTERPRET,),
           small_call=fenwick_small_call, error_inputs=fenwick_error_inputs),
    OpInfo("fenwick-gdn2", chunk_fenwick_gdn2, naive_fenwick_gdn2, fenwick_gdn2_sample,
           covering=lambda: Draw(on_bucket(FenwickShape(B=2, T=130, H=2, K=20, V=24)), seed=1),
           edge_shape=lambda B, T, H, K, V: FenwickShape(B, T, H, K, V),
           vs_reference=fenwick_gdn2_vs_reference, vs_numpy=fenwick_vs_numpy, tolerance="fenwick_gdn2",
           family="level0",
           state_passing=StatePassing("initial_state", chunk_boundaries, extra=lambda split: {"offset": split}),
           positional=True, small_call=fenwick_gdn2_small_call, error_inputs=fenwick_gdn2_error_inputs,
           skips={"reference: initial_state a list": "naive_fenwick_gdn2 takes no initial state (state passing, "
                                             "initial_state with offset, is the optimized op's)"}),
)
BY_NAME = {info.name: info for info in OPS}


def get(name: str) -> OpInfo:
    if name not in BY_NAME:
        raise ValueError(f"unknown op {name!r}; the table has {sorted(BY_NAME)}")
    return BY_NAME[name]


def public_ops_missing() -> list:
    """Names in ``optimized.__all__`` that are ops (``chunk_*``) but have no table entry."""
    import optimized

    covered = {info.op.__name__ for info in OPS}
    return [n for n in optimized.__all__ if n.startswith("chunk_") and n not in covered]
