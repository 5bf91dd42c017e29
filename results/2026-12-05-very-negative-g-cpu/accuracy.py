"""Relative output error of every optimized op (float32, the Triton interpreter) against its float64
reference when one token of every batch row has a very negative, finite log-decay ``g`` on every
channel; the calls of ``tests/test_bad_inputs.py`` (B = 2, T = 8, token 5), and ``chunk_gdn2`` at
B = 2, T = 130, H = 2, K = V = 32 with one or three such tokens.

    python results/2026-12-05-very-negative-g-cpu/accuracy.py
"""
import sys
import warnings

import torch

sys.path.insert(0, "tests")
warnings.simplefilter("ignore")
from ngdn.inputs import GDN2Shape, gdn2_inputs          # noqa: E402
from ngdn.tolerances import relative_error              # noqa: E402
from optimized import checks, chunk_gdn2                # noqa: E402
from reference import naive_gdn2                        # noqa: E402
from reference.nested import Level                      # noqa: E402
from test_bad_inputs import OPS, poisoned               # noqa: E402

VALUES = (-20.0, -50.0, -80.0, -100.0, -200.0, -700.0)


def as64(a, name):
    out = {n: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for n, x in a.items()}
    if name == "nested":
        out["levels"] = [Level(lv.scheme, lv.interval, {k: p.double() for k, p in lv.params.items()}, lv.reduction)
                         for lv in a["levels"]]
        if a.get("initial_states") is not None:
            out["initial_states"] = [None if s is None else s.double() for s in a["initial_states"]]
    return out


print("| op | " + " | ".join(f"g = {v:g}" for v in VALUES) + " |\n|---|" + "---|" * len(VALUES))
for name, opt, ref, call, _ in OPS:
    cells = []
    for value in VALUES:
        a = poisoned(call, "g", value, b=slice(None), t=5)
        o = opt(**a)[0].double()
        cells.append(f"{relative_error(o, ref(**as64(a, name))[0]):.1e}" + ("" if torch.isfinite(o).all() else " (non-finite)"))
    print(f"| {name} | " + " | ".join(cells) + " |")

x = gdn2_inputs(GDN2Shape(B=2, T=130, H=2, K=32, V=32), seed=0)
print("\n| chunk_gdn2, T = 130 | " + " | ".join(f"g = {v:g}" for v in (-20, -100, -200, -1e3, -1e4, -1e30)) + " |\n|---|" + "---|" * 6)
for tokens in ([5], [5, 70, 100]):
    cells = []
    for value in (-20.0, -100.0, -200.0, -1e3, -1e4, -1e30):
        a = {n: x[n].clone() for n in ("q", "k", "v", "g", "b", "w")}
        for t in tokens:
            a["g"][:, t] = value
        a["initial_state"] = x["initial_state"]
        with checks.finite_checks(False):          # -1e4 and -1e30 are below the ops' floor: measured with the check off
            o = chunk_gdn2(**{n: v.float() for n, v in a.items()})[0].double()
        cells.append(f"{relative_error(o, naive_gdn2(**a)[0]):.1e}")
    print(f"| tokens {tokens} | " + " | ".join(cells) + " |")
