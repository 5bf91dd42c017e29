"""Measure the optimized nested op (float32) against the float64 reference on the extreme-regime
inputs (``regime="extreme"``: log-decay to -60, β = 1 - 1e-6, ω ∈ {0, 1}, router logits ±30, state
norms 1e3 / 1e-6), beside flat GDN-2 (fla alone) on the same regime, and the nested op's earlier
path (generic probe, PyTorch reads) on one draw. The table gives, per quantity, the
draw closest to its bound as the kernel properties check it (``ngdn.checks.nested_optimized.
extreme_vs_reference``: "nested vs fed" against the float64 reference fed the kernel's level-0
snapshots, "nested vs float64" end to end; ``ngdn.checks.gdn2.optimized_vs_reference``: "flat").

``--diagnose``: where the nested op's gradient error comes from, per draw (results/2026-11-30-
extreme-regime-cpu.md, second section). Against the float64 reference ``ref`` (on the float32-rounded
inputs, as the property tests use it):

- ``opt``: the optimized op (float32);
- ``ref_f32``: ``reference.naive_nested_gdn2`` itself computed in float32 (a per-token float32 algorithm);
- ``ref32``: the reference loop run in float64 with every state rounded to float32 after every step
  (values and adjoints: ``Round32``), i.e. a per-token float32 recurrence;
- ``snap32``: only the level-0 snapshots rounded to float32 before level 1's probe (value and adjoint);
- ``inputs``: the float64 reference at inputs × (1 + u·2^-24), u ~ U(-1, 1), 3 perturbations, worst;
- ``inj``: the float64 reference fed the kernel's level-0 snapshots (``optimized.nested.level0``, fla's chunked
  GDN-2) in level 1's probe, forward value only (the gradient flows straight through);
- ``resid``: ``opt`` against ``inj`` (what the upper levels and level 0's backward add on their own);
- ``kappa_S``: normwise sensitivity to the snapshot: the reference with iid noise of norm 2^-24·‖S‖
  added to every level-0 snapshot, relative change / 2^-24 (3 perturbations, worst);
plus level 0's snapshot error (fla), the float64 snapshot gradient norm against ``‖do‖``, the smallest
argument of level 1's ``l2norm`` and the largest entry of the upper levels' initial states.

    python scripts/measure_extreme_regime.py             # CPU interpreter: about 6 min
    python scripts/measure_extreme_regime.py --diagnose  # about 8 min (draw numbers as arguments: only those)
"""
import sys

import optimized  # noqa: F401  (device mode before fla)

import torch  # noqa: E402

from ngdn.checks import gdn2 as gdn2_checks  # noqa: E402
from ngdn.checks import nested_optimized as checks  # noqa: E402
from ngdn.inputs import GDN2Shape, generator  # noqa: E402
from ngdn.nested_inputs import NestedShape, levels_as_reference, parameter_leaves  # noqa: E402
from ngdn.tolerances import relative_error  # noqa: E402
from optimized.nested import Pieces, _nested  # noqa: E402
from optimized.nested.pieces import reads_router_bwd_torch_levels  # noqa: E402
from optimized.nested.reads_torch import reads_router_fwd_torch  # noqa: E402

F32 = torch.float32
CASES = [(70, "learned"), (130, "bounded_erase"), (100, "merge"), (70, "learned"), (130, "learned"),
         (64, "bounded_erase"), (100, "learned"), (70, "merge")]


def case_of(seed):
    T, scheme = CASES[seed]
    return checks.OptCase(NestedShape(B=1, T=T, H=2, L=3, K=16, V=16), seed, scheme=scheme, intervals=(1, 1),
                          regime="extreme")


def op_with(pieces):
    def op(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False):
        return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state, pieces=pieces)
    return op


def main():
    worst = {}
    for seed, (T, scheme) in enumerate(CASES):
        case = case_of(seed)
        for label, (e, b) in checks.optimized_vs_reference(case, torch.float32, log=False).items():
            op = "nested vs float64" if label.endswith(checks.END_TO_END) else "nested vs fed"
            q = checks.quantity_of(label.removesuffix(checks.END_TO_END))
            if e / b > worst.get((op, q), (0.0, 1.0))[0] / worst.get((op, q), (0.0, 1.0))[1]:
                worst[(op, q)] = (e, b, f"T={T} seed={seed} {scheme} {label}")
        flat = gdn2_checks.optimized_vs_reference(GDN2Shape(B=1, T=T, H=2, K=16, V=16), seed, torch.float32,
                                                  log=False, regime="extreme")
        for q, (e, b) in flat.items():
            if e > worst.get(("flat", q), (0.0,))[0]:
                worst[("flat", q)] = (e, b, f"T={T} seed={seed}")
        print(f"draw {seed}: T={T} {scheme}", file=sys.stderr, flush=True)
    print("| op | quantity | error | bound | margin | where (the draw closest to its bound) |\n|---|---|---|---|---|---|")
    for (op, q), (e, b, where) in sorted(worst.items()):
        print(f"| {op} | {q} | {e:.1e} | {b:.1e} | {b / e:.0f}x | {where} |")
    old = Pieces(fused_probe=False, reads_fwd=reads_router_fwd_torch, reads_bwd=reads_router_bwd_torch_levels)
    for name, pieces in (("today's path", Pieces()), ("generic probe + PyTorch reads", old)):
        errs = checks.optimized_vs_reference(case_of(5), torch.float32, op=op_with(pieces), log=False)
        end = max(e for lb, (e, _) in errs.items() if lb.endswith(checks.END_TO_END))
        fed = max(e for lb, (e, _) in errs.items() if not lb.endswith(checks.END_TO_END))
        print(f"{name}: worst {end:.2e} vs float64, {fed:.2e} vs fed (T=64 seed=5 bounded_erase)")


# --- --diagnose ------------------------------------------------------------------------------

class Round32(torch.autograd.Function):
    """Round to float32 (value on the way forward, adjoint on the way back), stay float64."""
    @staticmethod
    def forward(ctx, x):
        return x.float().double()

    @staticmethod
    def backward(ctx, g):
        return g.float().double()


def perturbed_leaves(x, rel_noise, gen):
    """The reference's leaves (``checks.reference_leaves``), each × (1 + u·rel_noise), u ~ U(-1, 1)."""
    ins, levels, states = checks.reference_leaves(x, F32)
    for t in [*ins.values(), *parameter_leaves(levels).values(), *(s for s in states or [] if s is not None)]:
        with torch.no_grad():
            t.mul_(1 + rel_noise * (2 * torch.rand(t.shape, generator=gen, dtype=t.dtype) - 1))
    return ins, levels, states


def snapshot_noise(gen):
    """A snapshot hook: iid noise of norm 2^-24·‖S‖ added to the value (gradient straight through)."""
    def hook(c, S):
        noise = torch.randn(S.shape, generator=gen, dtype=S.dtype)
        return S + (noise * (2.0 ** -24 * S.norm() / noise.norm())).detach()
    return hook


def float32_reference(x):
    """``reference.naive_nested_gdn2`` computed in float32 throughout (a per-token float32 algorithm)."""
    from reference.nested import naive_nested_gdn2
    ins, levels, states = checks.reference_leaves(x, F32)
    ins = {n: t.detach().float().requires_grad_(True) for n, t in ins.items()}
    levels = levels_as_reference(x["levels"], F32)
    for lv in levels:
        lv.params = {n: p.float().requires_grad_(True) for n, p in lv.params.items()}
    states = None if states is None else [None if s is None else s.detach().float().requires_grad_(True)
                                          for s in states]
    o, finals = naive_nested_gdn2(*ins.values(), levels, scale=x["scale"], initial_states=states,
                                  output_final_state=True)
    f32 = {**x, "do": x["do"].float(), "dht": [d.float() for d in x["dht"]]}
    return checks.outputs_by_label(*checks.reference_gradients(f32, o, finals, ins, levels, states))


def run_ref(x, **kw):
    return checks.outputs_by_label(*checks.reference_loop(x, F32, **kw))


def errors(a, b):
    return {label: relative_error(a[label], b[label]) for label in b}


def pre_l2norm_norms(x, snaps):
    """Per firing of level 1: the smallest ‖ν_i W_K‖ over pairs and heads (l2norm's argument; its
    ε is 1e-6 under the root, so |x| ≈ 1e-3 is where the normalisation turns)."""
    lv = levels_as_reference(x["levels"], F32)[0]
    if "W_K" not in lv.params:
        return None
    out = []
    for S in snaps.values():
        ν = lv.params["Q"] @ S
        out.append((ν @ lv.params["W_K"]).norm(dim=-1).min().item())
    return min(out)


def diagnose(seeds):
    rows = []
    for seed in seeds:
        case = case_of(seed)
        x = checks.case_inputs(case)
        probed = {}
        ref = run_ref(x, capture=probed)
        naive = checks.outputs_by_label(*checks.run_reference(x, F32))
        assert all(relative_error(naive[lb], ref[lb]) <= 1e-14 for lb in ref)  # the loop is the reference
        opt = checks.outputs_by_label(*checks.run_optimized(optimized.chunk_nested_gdn2, x, F32))
        ks = checks.kernel_level0_snapshots(x, F32)
        inj = run_ref(x, snapshot=checks.with_snapshots(ks))
        e = {"opt": errors(opt, ref), "ref_f32": errors(float32_reference(x), ref),
             "ref32": errors(run_ref(x, state=Round32.apply), ref),
             "snap32": errors(run_ref(x, snapshot=lambda c, S: Round32.apply(S)), ref), "inj": errors(inj, ref),
             "resid": errors(opt, inj)}
        gen = generator(1000 + seed)
        pert = [errors(run_ref(x, leaves=perturbed_leaves(x, 2.0 ** -24, gen)), ref) for _ in range(3)]
        e["inputs"] = {label: max(p[label] for p in pert) for label in ref}
        noisy = [errors(run_ref(x, snapshot=snapshot_noise(gen)), ref) for _ in range(3)]
        e["kappa_S"] = {label: max(p[label] for p in noisy) / 2.0 ** -24 for label in ref}
        snaps = {c: S for c, (S, _) in probed.items()}
        snap_err = max(relative_error(ks[c], snaps[c]) for c in ks)
        d_snap = max(S.grad.norm().item() for _, S in probed.values())
        upper = max(s.abs().max().item() for s in x["initial_states"][1:])
        rows.append((seed, case, e, snap_err, d_snap, x["do"].norm().item(), pre_l2norm_norms(x, snaps), upper))
        print(f"draw {seed} done", file=sys.stderr, flush=True)
    return rows


def print_diagnosis(rows):
    cols = ("opt", "ref_f32", "ref32", "snap32", "inputs", "inj", "resid", "kappa_S")
    print("| draw | level-0 snapshot error (fla) | max ‖dS‖ / ‖do‖ | min ‖ν W_K‖ | upper levels' max initial entry "
          "| quantity | " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(cols))
    for seed, case, e, snap_err, d_snap, do, nrm, upper in rows:
        worst = max(e["opt"], key=e["opt"].get)
        labels = [worst] + [lb for lb in ("output", "final_state[0]") if lb != worst]
        for i, label in enumerate(labels):
            head = (f"{seed} T={case.shape.T} {case.scheme} | {snap_err:.1e} | {d_snap / do:.1e} | "
                    + ("—" if nrm is None else f"{nrm:.1e}") + f" | {upper:.0e}") if i == 0 else " | | | | "
            print(f"| {head} | {label} | " + " | ".join(f"{e[c][label]:.1e}" for c in cols) + " |")
    print()
    for c in ("opt", "ref_f32", "ref32", "snap32", "inputs", "inj", "resid"):
        worst = max((e[c][lb], lb, seed) for seed, _, e, *_ in rows for lb in e[c])
        print(f"- worst {c}: {worst[0]:.1e} ({worst[1]}, draw {worst[2]})")
    ratio = max(e["opt"][lb] / max(e["inj"][lb], 1e-30) for _, _, e, *_ in rows for lb in e["opt"]
                if e["opt"][lb] > 1e-4)
    print(f"- max opt / inj over labels with opt > 1e-4: {ratio:.2f}")


if __name__ == "__main__":
    if "--diagnose" in sys.argv:
        picked = [int(a) for a in sys.argv[1:] if a.isdigit()] or range(len(CASES))
        print_diagnosis(diagnose(picked))
    else:
        main()
