"""Seconds this process spends compiling Triton kernels (or loading them from Triton's disk cache).

The GPU suite's cold time is mostly compiling: a test that compiles kernel variants no other test
compiled (a new dtype, a head dim of 1, one token) costs minutes on a busy machine, the same test
warm a second. ``install()`` times every compile through Triton's JIT hooks
(``triton.knobs.runtime.jit_cache_hook`` before a compile, ``jit_post_compile_hook`` after it);
the suite plugin (``suite.plugin``) records each test's share in the per-test log (``NGDN_TEST_LOG``), so a cold
run says which tests brought which compiles. ``compiled()`` also lists each compile's kernel and
its cache key (the kernel's name, then Triton's key: each argument's type, divisibility and
constexpr value, and the launch options) with its seconds, so a cold run says which
kernels compile in how many variants. Under the interpreter nothing compiles and nothing is
installed.
"""
from __future__ import annotations

import time

_started: list[tuple[float, str]] = []
_total = {"seconds": 0.0, "kernels": 0}
_compiled: list[tuple[str, float]] = []
_sink: dict = {"path": None, "label": None}


def _before(*args, **kwargs):
    fn = kwargs.get("fn")
    what = f"{getattr(fn, 'name', '?')}|{kwargs['key']}" if "key" in kwargs else str(kwargs.get("repr", "?"))
    _started.append((time.perf_counter(), what))
    return False            # a true value would tell Triton to skip the compile


def _after(*args, **kwargs):
    if _started:
        began, what = _started.pop()
        seconds = time.perf_counter() - began
        _total["seconds"] += seconds
        _total["kernels"] += 1
        _compiled.append((what, round(seconds, 3)))
        if _sink["path"]:
            import json

            # one line per compile, appended as it ends: a process killed later keeps its lines
            with open(_sink["path"], "a") as f:
                f.write(json.dumps({"test": _sink["label"], "when": "compile", "outcome": "compiled",
                                    "duration_s": round(seconds, 3), "compiled": [[what, round(seconds, 3)]]}) + "\n")
    return False


def install(sink: str | None = None, label: str | None = None) -> bool:
    """Time every later Triton compile in this process; ``False`` where this Triton has no JIT
    hooks (then ``read()`` stays at zero) or another hook is already installed (left alone).
    ``sink``: a file to which each compile is also appended as it ends, one JSON line in the
    per-test log's form (``test``: ``label``, ``when``: ``"compile"``, ``compiled``: that one
    compile): the GPU suite's precompile units write theirs into its per-test log this way,
    line by line, since its deadline may kill them."""
    _sink.update(path=sink, label=label)
    try:
        from triton import knobs
        runtime = knobs.runtime
    except (ImportError, AttributeError):
        return False
    if runtime.jit_cache_hook not in (None, _before) or runtime.jit_post_compile_hook not in (None, _after):
        return False
    runtime.jit_cache_hook = _before
    runtime.jit_post_compile_hook = _after
    return True


def read() -> tuple[float, int]:
    """(seconds spent compiling, kernels compiled) since the last ``reset()``."""
    return _total["seconds"], _total["kernels"]


def compiled() -> list[tuple[str, float]]:
    """Each compile (or disk-cache load) since the last ``reset()``: (``"name|key"``, the kernel's
    name and Triton's cache key, seconds), in order."""
    return list(_compiled)


def reset() -> None:
    _total.update(seconds=0.0, kernels=0)
    _started.clear()
    _compiled.clear()
