"""``ngdn``: the testbed's command line.

    ngdn check            agreement report, reference vs optimized, as a table
                          (progress per component on stderr)
    ngdn errors LOG       worst observed error per tolerance entry (from NGDN_ERROR_LOG)
    ngdn bench ...        Nested vs flat GDN-2 benchmark (GPU; see bench/README.md)
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def _table(rows, header):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in rows])


def check(args) -> int:
    import os

    import torch

    # A correctness report, measured like the test suite: IEEE float32 dots on CUDA,
    # autotuners pinned to one config (no multi-minute autotuning).
    os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    os.environ.setdefault("NGDN_IEEE_F32", "1")

    from optimized import triton_mode

    mode = triton_mode.configure()
    from ngdn import agreement

    dtype = getattr(torch, args.dtype)
    if dtype == torch.bfloat16 and mode != triton_mode.CUDA:
        print("bfloat16 kernels run on CUDA only; use --dtype float32 on CPU", file=sys.stderr)
        return 2
    print(f"device mode: {mode}; dtype: {args.dtype}; seed: {args.seed}")
    ok = True
    results = agreement.run_all(dtype, args.seed, only=args.only, progress=sys.stderr)
    for name, (shape, errors) in results.items():
        print(f"\n{name}  {shape}")
        rows = []
        for quantity, (err, bound) in errors.items():
            passed = err <= bound
            ok &= passed
            rows.append((quantity, f"{err:.2e}", f"{bound:.1e}", "ok" if passed else "FAIL"))
        print(_table(rows, ("quantity", "rel. error", "tolerance", "")))
    print("\nall within tolerance" if ok else "\nSOME QUANTITIES OUT OF TOLERANCE")
    return 0 if ok else 1


def errors(args) -> int:
    worst = {}
    counts = defaultdict(int)
    for path in args.logs:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                key = (r["component"], r["mode"], r["dtype"], r["quantity"])
                counts[key] += 1
                if key not in worst or r["error"] > worst[key][0]:
                    worst[key] = (r["error"], r["tolerance"])
    rows = [(*k, counts[k], f"{e:.2e}", f"{t:.1e}", f"{t / e:.0f}x" if e > 0 else "inf")
            for k, (e, t) in sorted(worst.items())]
    print(_table(rows, ("component", "mode", "dtype", "quantity", "draws", "worst", "tolerance", "margin")))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ngdn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="agreement report: reference vs optimized on default configurations")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", action="append", help="run only these components (repeatable)")
    p.set_defaults(func=check)
    p = sub.add_parser("errors", help="worst observed error per tolerance entry from NGDN_ERROR_LOG files")
    p.add_argument("logs", nargs="+")
    p.set_defaults(func=errors)
    sub.add_parser("bench", help="Nested vs flat GDN-2 benchmark (GPU); `ngdn bench --help` for its options")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options
        from bench.nested_vs_flat import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
