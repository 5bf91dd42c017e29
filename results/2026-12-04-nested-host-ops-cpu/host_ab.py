"""Side by side in one process: the nested op's host time and op counts per forward and per step on
the CPU, every Triton launch and autotuner dispatch a no-op, for each variant of ``variants.py``
(HEAD, the working tree, the working tree with one change reverted), in turn, round after round.

Shape: B = 2, T = 512, H = 2, K = V = 64, learned, ``nested_inputs(seed=0)``, L = 4 and 6, finiteness
check off. The variants take turns, each round starting one later. ``--dtype``: ``f32-bf16params`` (float32 activations, scheme parameters in bf16, as
``ngdn bench --param-dtype auto`` gives them: the default, since the CPU's own bf16 compute of the
torch ops, e.g. the probe's bmm, takes tens of ms a step here and drowns the host work) or ``bf16``
(activations too; the interpreter's bf16 refusal is lifted, no kernel runs). The forward is the
graph-building one (inputs need gradients); a step is forward + backward with the gradients then set
to None. Counted once per variant: Triton launches (calls of the stubbed run functions) and ATen ops
(a TorchDispatchMode). Timed: medians over rounds of the mean of ``--per`` calls, in wall time
(``--clock process``: this process's CPU time, which counts torch's idle intra-op threads too).

Run from the repository root:
    python results/2026-12-04-nested-host-ops-cpu/host_ab.py [--dtype bf16] [--rounds 15] [--per 10] [--clock process]"""
import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, "results/2026-12-04-nested-host-ops-cpu")
import host_counts as hc  # noqa: E402  (stubs the launches and lifts the bf16 refusal)
import variants  # noqa: E402
from optimized.checks import finite_checks  # noqa: E402


def make(L, dtype_name):
    args, levels, do = hc.make(L, torch.bfloat16)
    if dtype_name == "f32-bf16params":
        args = {n: x.detach().float().requires_grad_() for n, x in args.items()}
        do = do.float()
    return args, levels, do


def fwd(op, args, levels, do):
    return op(**args, levels=levels)


def step(op, args, levels, do):
    op(**args, levels=levels)[0].backward(do)
    for x in [*args.values(), *(p for lv in levels for p in lv.params.values())]:
        x.grad = None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="f32-bf16params", choices=("f32-bf16params", "bf16"))
    ap.add_argument("--levels", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per", type=int, default=10)
    ap.add_argument("--clock", default="wall", choices=("process", "wall"))
    a = ap.parse_args(argv)
    clock = time.process_time if a.clock == "process" else time.perf_counter
    ops = variants.ops()
    print(f"torch {torch.__version__}; {a.dtype}; B=2 T=512 H=2 K=V=64 learned; launches stubbed; "
          f"{a.rounds} rounds of {a.per} calls, medians (min) in ms of {a.clock} time")
    with finite_checks(False):
        for L in a.levels:
            inputs = make(L, a.dtype)
            counts, ms = {}, {}
            for name, op in ops.items():
                for what, fn in (("forward", fwd), ("step", step)):
                    for _ in range(2):
                        fn(op, *inputs)
                    n_launch, n_ops, _ = hc.counts(lambda *x: fn(op, *x), inputs)
                    counts[name, what] = (n_launch, n_ops)
                    ms[name, what] = []
            names = list(ops)
            for r in range(a.rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:    # each round a turn later
                    op = ops[name]
                    for what, fn in (("forward", fwd), ("step", step)):
                        t = clock()
                        for _ in range(a.per):
                            fn(op, *inputs)
                        ms[name, what].append(1e3 * (clock() - t) / a.per)
            print(f"\nL = {L}")
            print("| variant | fwd launches | fwd ATen ops | fwd ms | step launches | step ATen ops | step ms |")
            print("|---|---|---|---|---|---|---|")
            for name in ops:
                cells = []
                for what in ("forward", "step"):
                    v = ms[name, what]
                    cells += [str(counts[name, what][0]), str(counts[name, what][1]),
                              f"{statistics.median(v):.3f} ({min(v):.3f})"]
                print(f"| {name} | " + " | ".join(cells) + " |")
            base = {w: statistics.median(ms["new", w]) for w in ("forward", "step")}
            print("gain of each change (its revert's median minus the working tree's):",
                  "; ".join(f"{name[6:]}: fwd {statistics.median(ms[name, 'forward']) - base['forward']:+.3f}, "
                            f"step {statistics.median(ms[name, 'step']) - base['step']:+.3f}"
                            for name in ops if name.startswith("new - ")))
            print("all changes (head minus new): fwd "
                  f"{statistics.median(ms['head', 'forward']) - base['forward']:+.3f}, step "
                  f"{statistics.median(ms['head', 'step']) - base['step']:+.3f}")


if __name__ == "__main__":
    main()
