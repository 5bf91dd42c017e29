"""Side by side in one process: the nested op's host time on the CPU (every Triton launch and autotuner
dispatch a no-op) with optimized.host_math's helpers and with triton's constexpr-function helpers put back.
Run from the repository root: python results/2026-12-04-host-helpers-cpu/host_ab.py"""
import sys, time, statistics
import torch
import optimized
from optimized import chunk_nested_gdn2
from optimized.checks import finite_checks
import triton, triton.runtime.interpreter as interp
import triton.runtime.autotuner as at
from ngdn.nested_inputs import NestedShape, nested_inputs
from reference.nested import Level
interp.InterpretedFunction.run = lambda self, *a, **k: None
at.Autotuner.run = lambda self, *a, **k: None
mods = [m for n, m in list(sys.modules.items()) if n.startswith("optimized") and hasattr(m, "cdiv") or hasattr(m, "next_power_of_2") and n.startswith("optimized")]
ours = {(m, a): getattr(m, a) for m in mods for a in ("cdiv", "next_power_of_2") if hasattr(m, a) and m.__name__ != "optimized.host_math"}
def use(which):
    for (m, a), f in ours.items():
        setattr(m, a, f if which == "host_math" else getattr(triton, a))
L, K = 4, 64
x = nested_inputs(NestedShape(B=2, T=512, H=2, L=L, K=K, V=K), seed=0, scheme="learned")
args = {n: x[n].float().requires_grad_() for n in ("q", "k", "v", "g", "b", "w", "r")}
levels = [Level(lv.scheme, lv.interval, {n: p.float().requires_grad_() for n, p in lv.params.items()}, lv.reduction) for lv in x["levels"]]
do = torch.ones(2, 512, 2, K)
def step():
    chunk_nested_gdn2(**args, levels=levels)[0].backward(do)
res = {"host_math": [], "triton": []}
with finite_checks(False):
    for _ in range(3): step()
    for rnd in range(25):
        for which in res:
            use(which)
            t = time.perf_counter()
            for _ in range(30): step()
            res[which].append(1e3 * (time.perf_counter() - t) / 30)
for k, v in res.items():
    print(k, "step host ms: median", round(statistics.median(v), 3), "min", round(min(v), 3), "max", round(max(v), 3))
print("patched module attributes:", len(ours))
