"""Where the CPU suite's time goes: every launch under Triton's interpreter timed by kernel name.

A pytest plugin (each xdist worker writes its totals when it exits) and a summary:

    NGDN_KERNEL_TIMES=/tmp/kt pytest -n auto -p bench.interpreter_kernels
    python -m bench.interpreter_kernels /tmp/kt            # Markdown table, largest first

A launch's time includes its host copies and, for a kernel with a NumPy stand-in
(``optimized.interpreter_substitutes``), the stand-in's time under the kernel's name. Without CUDA
only: on a GPU launches are asynchronous and this would time the queue.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import time
from pathlib import Path

TOTAL = collections.Counter()
COUNT = collections.Counter()


def pytest_configure(config):
    out = os.environ.get("NGDN_KERNEL_TIMES")
    if not out:
        return
    import optimized  # noqa: F401  (the device mode before any kernel module)
    from optimized import triton_mode

    if triton_mode.MODE != triton_mode.CPU_INTERPRET:
        return
    from triton.runtime import interpreter

    launch = interpreter.GridExecutor.__call__

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return launch(self, *args, **kwargs)
        finally:
            name = getattr(self.fn, "__name__", str(self.fn))
            TOTAL[name] += time.perf_counter() - start
            COUNT[name] += 1

    interpreter.GridExecutor.__call__ = timed

    def write():
        Path(out).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"{worker}.json").write_text(json.dumps({"seconds": TOTAL, "launches": COUNT}))

    atexit.register(write)


def summary(folder: str, top: int = 30) -> str:
    """The workers' totals merged: one Markdown row per kernel, largest first."""
    seconds, launches = collections.Counter(), collections.Counter()
    for f in sorted(Path(folder).glob("*.json")):
        d = json.loads(f.read_text())
        seconds.update(d["seconds"])
        launches.update(d["launches"])
    total = sum(seconds.values())
    lines = [f"{total:.1f} s in {sum(launches.values())} launches", "",
             "| kernel | s | share | launches | ms a launch |", "|---|---|---|---|---|"]
    for name, s in seconds.most_common(top):
        lines.append(f"| `{name}` | {s:.1f} | {100 * s / total:.1f} % | {launches[name]} | "
                     f"{1000 * s / launches[name]:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
