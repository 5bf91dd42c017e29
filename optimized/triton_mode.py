"""How Triton kernels run in this process: compiled on CUDA, or interpreted on CPU.

Two device modes:

- ``cuda``: a CUDA device is present; Triton compiles kernels for it.
- ``cpu-interpret``: no CUDA device (or ``TRITON_INTERPRET=1`` set by the user);
  Triton's interpreter runs every kernel, ours and fla's, on CPU tensors.

``configure()`` must run before any Triton kernel module (ours or fla's) is
imported, because ``triton.jit`` decides at decoration time whether a kernel is
interpreted. ``import optimized`` calls it first thing.

Under the interpreter five harness fixes are installed:

1. Autotuners are pinned to one config (the interpreter cannot time kernels): the
   surviving config with the largest blocks, since the interpreter's cost is per
   program and per operation, not per element. In ``cuda`` mode a pin to the
   first surviving config is applied when ``NGDN_PIN_AUTOTUNE=1`` (the test
   suite sets it), so tests never pay fla's multi-minute autotuning; benchmarks
   leave it unset and autotune.
2. Loop variables of ``for i in range(...)`` inside kernels are turned into
   interpreter tensors: the interpreter hands them over as Python ints, and fla
   calls ``.to()`` on them.
3. ``tl.load``/``tl.store`` masks are cast to bool (some fla kernels build masks
   with integer arithmetic, which the interpreter rejects).
4. A ``@triton.jit`` helper called from inside a kernel patches ``triton.language``
   once per launch, not at every call (the interpreter's own cost, not a
   semantic change: the later patches replace nothing).
5. A dependency kernel whose interpreted cost is out of all proportion to its work
   runs as a NumPy stand-in that writes the same bits (``optimized.interpreter_substitutes``:
   fla's token-parallel GDN-2 intra kernel, 43 % of the CPU suite's kernel time;
   ``NGDN_INTERPRETER_SUBSTITUTES=0`` runs the kernel itself).

``NGDN_IEEE_F32=1`` (set by the test suite on CUDA) asks for float32 dots at
float32 accuracy, not TF32: it sets ``TRITON_F32_DEFAULT`` to
``NGDN_F32_DOTS``: ``ieee`` (the default here) or ``tf32x3`` (three TF32
tensor-core products per dot, float32-level error; the test suite's choice,
set by the suite plugin, ``suite.plugin``). fla 0.6.0 pins its triangular solves to TF32 on Ampere
and newer (module constants ``SOLVE_TRIL_DOT_PRECISION``, which override that
default); in this mode they are set to the same precision before any kernel
compiles. Measured on the H200 before this: float32 GDN-2 agreed with the
float64 reference to only ~1e-4. Our own kernels name their dots' precision
themselves (IEEE for float32 operands), whatever the default.
"""
from __future__ import annotations

import ast
import math
import os
import sys
import warnings

CUDA = "cuda"
CPU_INTERPRET = "cpu-interpret"

MODE: str | None = None
# What ``configure()`` saw (the variables that change how kernels compute), for reports and
# for tests that check an entry point set them before ``optimized`` was imported.
CONFIGURED_WITH: dict = {}

# Triton's interpreter in 3.6 cannot run fla's GDN-2 kernels; 3.9.0 is tested.
MIN_INTERPRETER_TRITON = (3, 9)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def configure() -> str:
    """Choose the device mode and install the harness. Idempotent; returns the mode."""
    global MODE
    if MODE is not None:
        return MODE

    interpret = _truthy("TRITON_INTERPRET") or not _cuda_available()
    CONFIGURED_WITH.update({v: os.environ.get(v) for v in ("TRITON_INTERPRET", "NGDN_IEEE_F32", "NGDN_F32_DOTS",
                                                            "NGDN_PIN_AUTOTUNE", "TRITON_F32_DEFAULT")})
    kernel_modules = [m for m in ("fla.ops", "optimized.nested.promote_scan", "optimized.nested.state_grad")
                      if m in sys.modules]
    if interpret and not _truthy("TRITON_INTERPRET") and kernel_modules:
        raise RuntimeError(
            f"optimized.triton_mode.configure() ran after {kernel_modules} were imported; "
            "without CUDA the Triton interpreter must be chosen first. "
            "Import `optimized` (or set TRITON_INTERPRET=1) before importing fla."
        )
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif _truthy("NGDN_IEEE_F32"):
        os.environ["TRITON_F32_DEFAULT"] = f32_dots()

    import triton

    if interpret:
        version = tuple(int(p) for p in triton.__version__.split(".")[:2])
        if version < MIN_INTERPRETER_TRITON:
            raise RuntimeError(
                f"CPU mode runs Triton's interpreter, which needs triton>="
                f"{'.'.join(map(str, MIN_INTERPRETER_TRITON))} for fla's kernels; "
                f"found triton {triton.__version__}. Install triton==3.9.0."
            )
        _pin_autotuners(largest_blocks=True)
        _install_interpreter_fixes()
        # fla warns once that it "rolls back to CPU"; in this mode that is the point.
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        MODE = CPU_INTERPRET
    else:
        if _truthy("NGDN_PIN_AUTOTUNE"):
            _pin_autotuners()
        if _truthy("NGDN_IEEE_F32"):
            _fla_solves_in(f32_dots())
        MODE = CUDA
    return MODE


def device() -> str:
    """The torch device optimized ops run on in this mode."""
    return "cuda" if configure() == CUDA else "cpu"


# fla modules whose triangular solve hard-codes TF32 on GPUs that support it.
FLA_TF32_SOLVES = ("fla.ops.gdn2.chunk_intra", "fla.ops.kda.chunk_intra", "fla.ops.gated_delta_rule.chunk_fwd")


# The float32 dot precisions that keep float32 accuracy (``NGDN_F32_DOTS``).
F32_DOTS = ("ieee", "tf32x3")


def f32_dots() -> str:
    """``NGDN_F32_DOTS`` (default ``ieee``), checked: the precision of fla's float32 dots when
    ``NGDN_IEEE_F32`` asks for float32 accuracy."""
    value = os.environ.get("NGDN_F32_DOTS", "").strip().lower() or "ieee"
    if value not in F32_DOTS:
        raise ValueError(f"NGDN_F32_DOTS={value!r}: expected one of {F32_DOTS} (float32-accurate dots)")
    return value


def _fla_solves_in(precision: str) -> None:
    import importlib

    import triton.language as tl

    for name in FLA_TF32_SOLVES:
        module = importlib.import_module(name)
        if hasattr(module, "SOLVE_TRIL_DOT_PRECISION"):
            module.SOLVE_TRIL_DOT_PRECISION = tl.constexpr(precision)


def _block_volume(config) -> int:
    """The product of a config's integer meta-parameters (its block sizes)."""
    return math.prod(v for v in config.kwargs.values() if isinstance(v, int) and not isinstance(v, bool))


def _pin_autotuners(largest_blocks: bool = False) -> None:
    """Every autotuner runs one config: the first that survives its pruning, or with
    ``largest_blocks`` (the interpreter) the one with the largest blocks (the first of those).
    The interpreter pays per program and per operation, not per element: fla's token-parallel
    intra-chunk kernel at four heads a program, say, runs a quarter of the programs at one head's
    cost each."""
    from triton.runtime import autotuner

    if getattr(autotuner.Autotuner, "_ngdn_pinned", False):
        return
    prune_all = autotuner.Autotuner.prune_configs

    def prune_to_one(self, kwargs):
        configs = prune_all(self, kwargs)
        if largest_blocks and configs:
            return [max(configs, key=_block_volume)]
        return configs[:1]

    autotuner.Autotuner.prune_configs = prune_to_one
    autotuner.Autotuner._ngdn_pinned = True


def _install_interpreter_fixes() -> None:
    import inspect

    from triton.runtime import interpreter

    from optimized import interpreter_substitutes

    if getattr(interpreter, "_ngdn_fixed", False):
        return

    class LoopVariablesAsTensors(interpreter.ASTTransformer):
        """Rewrite ``for i in range(...): body`` to start the body with ``i = to_tensor(i)``."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            func = node.iter.func if isinstance(node.iter, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name == "range" and isinstance(node.target, ast.Name):
                as_tensor = ast.Call(
                    func=ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                                       attr="to_tensor", ctx=ast.Load()),
                    args=[ast.Name(id=node.target.id, ctx=ast.Load()), ast.Constant(value=False)],
                    keywords=[],
                )
                node.body.insert(0, ast.Assign(targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
                                               value=as_tensor))
            return node

    interpreter.FunctionRewriter.ast_transformer = LoopVariablesAsTensors()

    import triton.language as tl

    builder = interpreter.interpreter_builder
    create_masked_load = builder.create_masked_load
    create_masked_store = builder.create_masked_store

    def masked_load(ptrs, mask, other, *args, **kwargs):
        if mask is not None and mask.data.dtype != bool:
            mask = interpreter.TensorHandle(mask.data.astype(bool), tl.int1)
        return create_masked_load(ptrs, mask, other, *args, **kwargs)

    def masked_store(ptrs, value, mask, *args, **kwargs):
        if mask is not None and mask.data.dtype != bool:
            mask = interpreter.TensorHandle(mask.data.astype(bool), tl.int1)
        return create_masked_store(ptrs, value, mask, *args, **kwargs)

    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store

    # Each call of a ``@triton.jit`` helper from inside a kernel (fla's ``exp2``, for one) makes
    # the interpreter patch ``triton.language`` again: ``inspect.getmembers`` over its modules,
    # ≈ 1 ms a call, a quarter of a fla kernel whose loop calls one. The first call of each
    # helper in a launch patches as before; later calls in the same launch find every builtin
    # already replaced (the patch skips non-builtins, and its unconditional parts set the same
    # attributes again), so they skip it.
    patched_in_launch = set()
    run_grid = interpreter.GridExecutor.__call__

    substitutes_on = os.environ.get("NGDN_INTERPRETER_SUBSTITUTES", "1").strip().lower() not in {"0", "false", "no", "off"}

    def run_grid_fresh(self, *args, **kwargs):
        substitute = interpreter_substitutes.lookup(self.fn) if substitutes_on else None
        if substitute is not None:      # 5. a dependency kernel's NumPy stand-in (``optimized.interpreter_substitutes``)
            spec = inspect.getfullargspec(self.fn)
            kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
            call = inspect.getcallargs(self.fn, *args, **kwargs)
            return substitute(call, self.grid(call) if callable(self.grid) else self.grid)
        patched_in_launch.clear()
        return run_grid(self, *args, **kwargs)

    def call_device_function(self, *args, **kwargs):
        if self.fn not in patched_in_launch:
            interpreter._patch_lang(self.fn)
            patched_in_launch.add(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = run_grid_fresh
    interpreter.InterpretedFunction.__call__ = call_device_function
    interpreter._ngdn_fixed = True
