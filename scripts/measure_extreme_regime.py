"""Measure the optimized nested op (float32) against the float64 reference on the extreme-regime
inputs (``regime="extreme"``: log-decay to -60, β = 1 - 1e-6, ω ∈ {0, 1}, router logits ±30, state
norms 1e3 / 1e-6), beside flat GDN-2 (fla alone) on the same regime, and the nested op's pre-issue-12
path (generic probe, PyTorch reads) on one draw. Issue 15 "Also": the kernel properties do not draw
this regime yet; this is the measurement behind that decision (see the closing note of 2026-11-30).

    python scripts/measure_extreme_regime.py        # CPU interpreter: about 4 min
"""
import functools
import sys
from pathlib import Path

import optimized  # noqa: F401  (device mode before fla)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "property_tests"))
import torch  # noqa: E402

import gdn2_checks  # noqa: E402
import nested_optimized_checks as checks  # noqa: E402
from ngdn.inputs import GDN2Shape, gdn2_inputs  # noqa: E402
from ngdn.nested_inputs import NestedShape, nested_inputs  # noqa: E402
from optimized.nested import Pieces, _nested  # noqa: E402
from optimized.nested.reads_torch import reads_router_bwd_torch, reads_router_fwd_torch  # noqa: E402

checks.nested_inputs = functools.partial(nested_inputs, regime="extreme")
gdn2_checks.gdn2_inputs = functools.partial(gdn2_inputs, regime="extreme")
CASES = [(70, "learned"), (130, "bounded_erase"), (100, "merge"), (70, "learned"), (130, "learned"),
         (64, "bounded_erase"), (100, "learned"), (70, "merge")]


def op_with(pieces):
    def op(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False):
        return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state, pieces=pieces)
    return op


def main():
    worst = {}
    for seed, (T, scheme) in enumerate(CASES):
        case = checks.OptCase(NestedShape(B=1, T=T, H=2, L=3, K=16, V=16), seed, scheme=scheme, intervals=(1, 1))
        for label, (e, b) in checks.optimized_vs_reference(case, torch.float32, log=False).items():
            q = label.split("[")[0] if label.startswith(("output", "final")) else checks.tolerance_quantity(label)
            if e > worst.get(("nested", q), (0.0,))[0]:
                worst[("nested", q)] = (e, b, f"T={T} seed={seed} {scheme} {label}")
        flat = gdn2_checks.optimized_vs_reference(GDN2Shape(B=1, T=T, H=2, K=16, V=16), seed, torch.float32,
                                                  log=False)
        for q, (e, b) in flat.items():
            if e > worst.get(("flat", q), (0.0,))[0]:
                worst[("flat", q)] = (e, b, f"T={T} seed={seed}")
        print(f"draw {seed}: T={T} {scheme}", file=sys.stderr, flush=True)
    print("| op | quantity | worst | bound | where |\n|---|---|---|---|---|")
    for (op, q), (e, b, where) in sorted(worst.items()):
        print(f"| {op} | {q} | {e:.1e} | {b:.0e} | {where} |")
    old = Pieces(fused_probe=False, reads_fwd=reads_router_fwd_torch, reads_bwd=reads_router_bwd_torch)
    case = checks.OptCase(NestedShape(B=1, T=64, H=2, L=3, K=16, V=16), 5, scheme="bounded_erase", intervals=(1, 1))
    for name, pieces in (("today's path", Pieces()), ("generic probe + PyTorch reads", old)):
        errs = checks.optimized_vs_reference(case, torch.float32, op=op_with(pieces), log=False)
        print(f"{name}: worst {max(e for e, _ in errs.values()):.2e} (T=64 seed=5 bounded_erase)")


if __name__ == "__main__":
    main()
