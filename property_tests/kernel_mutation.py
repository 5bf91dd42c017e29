"""Broken twins of production functions and Triton kernels, derived from their source in the tests.

The production code under ``optimized/`` holds no mutation switches. A mutation test instead
takes a function living in some module (a ``@triton.jit`` kernel or helper, a
``triton.autotune`` / ``triton.heuristics`` wrapper around one, or a plain Python function),
applies ONE exact text substitution to its source, executes the result in a copy of the
module's globals (which re-applies every decorator, ``triton.jit`` and its options included)
and swaps the module attribute for the duration of a ``with`` block, so the launch functions,
which look their kernels up in the module's globals at every call, run the twin.

The substituted text must occur exactly once in the source: a mutant whose text no longer
matches (the kernel changed) fails loudly instead of silently becoming the correct code.

Works under Triton's interpreter (CPU) and compiled (CUDA): the twin's source is registered
with ``linecache`` under a name of its own, which is where ``triton.jit`` (and the
interpreter's loop rewriting) read a function's source; the twin is a new function object, so
it never shares a compiled kernel or cache entry with the original.

Tests in one process run one at a time: the swap is process-wide while the block runs.
"""
from __future__ import annotations

import __future__
import contextlib
import inspect
import itertools
import linecache
import textwrap
import types
from typing import NamedTuple, Sequence
from unittest import mock

_serial = itertools.count()


class Plant(NamedTuple):
    """One substitution: ``module.name``'s source with ``old`` replaced by ``new`` (exactly once).

    ``rebind``: ``(module, name)`` of other functions that call this one by its global name
    from another module or must see the twin in their own globals (a ``@triton.jit`` helper is
    resolved from the calling kernel's globals): each is re-created, unchanged, in a copy of its
    module's globals where ``name`` is the twin, and swapped too."""
    module: types.ModuleType
    name: str
    old: str
    new: str
    rebind: tuple = ()


def python_function(obj) -> types.FunctionType:
    """The plain Python function under a Triton wrapper (``JITFunction``, the interpreter's
    ``InterpretedFunction``, ``Autotuner``, ``Heuristics``: each keeps what it wraps as ``.fn``)."""
    fn = obj
    for _ in range(8):
        if isinstance(fn, types.FunctionType):
            return fn
        fn = getattr(fn, "fn", None)
    raise TypeError(f"{obj!r} is not a Python function or a Triton wrapper around one")


def source_of(obj) -> str:
    """The dedented source of ``obj``'s Python function, decorators included."""
    return textwrap.dedent(inspect.getsource(python_function(obj)))


def twin(obj, old: str | None = None, new: str | None = None, overrides: dict | None = None):
    """A copy of ``obj`` (a function or a Triton wrapper of one, decorators re-applied) with
    ``old`` replaced by ``new`` in its source (``old=None``: the source unchanged), executed in
    a copy of its module's globals updated with ``overrides``."""
    fn = python_function(obj)
    src = source_of(obj)
    if old is not None:
        count = src.count(old)
        if count != 1:
            raise AssertionError(f"the mutant's text must occur exactly once in {fn.__module__}.{fn.__qualname__}, "
                                 f"found {count} times: {old!r}")
        if new == old:
            raise AssertionError(f"the substitution in {fn.__qualname__} changes nothing")
        src = src.replace(old, new)
    filename = f"<twin {next(_serial)} of {fn.__module__}.{fn.__qualname__}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = dict(fn.__globals__)
    namespace.update(overrides or {})
    flags = fn.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(src, filename, "exec", flags=flags, dont_inherit=True), namespace)
    made = namespace[fn.__name__]
    if python_function(made) is fn or python_function(made).__code__.co_filename != filename:
        raise AssertionError(f"re-executing {fn.__qualname__}'s source did not make a new function")
    return made


def twins(plants: Sequence[Plant]) -> list[tuple[types.ModuleType, str, object]]:
    """``(module, name, replacement)`` for every plant and every function it rebinds."""
    swaps = []
    for p in plants:
        made = twin(getattr(p.module, p.name), p.old, p.new)
        swaps.append((p.module, p.name, made))
        for module, name in p.rebind:
            swaps.append((module, name, twin(getattr(module, name), overrides={p.name: made})))
    return swaps


@contextlib.contextmanager
def planted(*plants: Plant):
    """Inside the block, every plant's module attribute (and those it rebinds) is its twin."""
    with contextlib.ExitStack() as stack:
        for module, name, made in twins(plants):
            if not hasattr(module, name):
                raise AttributeError(f"{module.__name__} has no {name}")
            stack.enter_context(mock.patch.object(module, name, made))
        yield
