"""``ngdn``: the testbed's command line.

    ngdn check            agreement report, reference vs optimized, as a table
                          (progress per component on stderr; NGDN_ERROR_LOG=FILE logs
                          every measured error; exit 1: out of tolerance, 2: usage)
    ngdn errors LOG       worst observed error per tolerance entry (from NGDN_ERROR_LOG;
                          exit 2 on a missing, empty or malformed log)
    ngdn bench ...        Nested vs flat GDN-2 benchmark (GPU; see bench/README.md); also
                          `ngdn bench long-context`, `ngdn bench fenwick-gdn2`, `ngdn bench recall`
                          (forwarded to the benchmarks' own command line, bench/cli.py)
    ngdn scheme check FILE.py
                          the promotion-scheme battery on the scheme FILE registers
                          (ngdn/scheme_check.py; docs/schemes.md "Adding a promotion scheme")
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from ngdn.table import text_table as _table


class _CheckHelp(argparse.HelpFormatter):
    """``ngdn check --help``: lists the components of ``ngdn.agreement.COMPONENTS`` under ``--only``,
    read when the help is printed (the table is imported only then)."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if action.dest == "only":
            from ngdn import agreement

            text += f"; components: {', '.join(agreement.COMPONENTS)}"
        return text


class _SchemeCheckHelp(argparse.HelpFormatter):
    """``ngdn scheme check --help``: the battery's properties under ``--only`` and, under
    ``--examples``, what each row runs, read from ``ngdn.scheme_check.PROPERTIES`` when the help is
    printed (importing the battery imports ``optimized``: the measurement environment first)."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if action.dest in ("only", "examples"):
            _scheme_check_environment(None)
            from ngdn import scheme_check as battery

            if action.dest == "only":
                text += f"; properties: {', '.join(battery.PROPERTY_NAMES)}"
            else:
                text += "; " + battery.examples_text()
        return text


def check(args) -> int:
    import os

    import torch

    # A correctness report, measured like the test suite: float32-accurate dots on CUDA,
    # autotuners pinned to one config (no multi-minute autotuning).
    os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    os.environ.setdefault("NGDN_IEEE_F32", "1")
    os.environ.setdefault("NGDN_F32_DOTS", "tf32x3")

    from optimized import triton_mode

    mode = triton_mode.configure()
    from ngdn import agreement

    unknown = sorted(set(args.only or ()) - set(agreement.COMPONENTS))
    if unknown:     # a usage error (exit 2), not a tolerance failure (exit 1)
        args.parser.error(f"unknown component(s) {unknown} for --only; have {sorted(agreement.COMPONENTS)}")
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


LOG_FIELDS = ("component", "mode", "dtype", "quantity", "error", "tolerance")


def read_error_log(path: str):
    """The records of one ``NGDN_ERROR_LOG`` file (or its gzip, ``.gz``, as committed under
    ``results/``); a ``ValueError`` with a one-line reason for a missing, unreadable, empty or
    malformed file."""
    import gzip

    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON line ({e.msg})") from None
        missing = [k for k in LOG_FIELDS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"{path}:{number}: not an error-log record (missing {', '.join(missing)})")
        if not all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for k in ("error", "tolerance")):
            raise ValueError(f"{path}:{number}: error and tolerance must be numbers")
        records.append(r)
    if not records:
        raise ValueError(f"{path}: no records (an empty error log; set NGDN_ERROR_LOG=FILE when running "
                         "pytest or ngdn check to write one)")
    return records


def errors(args) -> int:
    worst = {}
    counts = defaultdict(int)
    try:
        records = [r for path in args.logs for r in read_error_log(path)]
    except ValueError as e:
        print(f"ngdn errors: {e}", file=sys.stderr)
        return 2
    for r in records:
        key = (r["component"], r["mode"], r["dtype"], r["quantity"])
        counts[key] += 1
        if key not in worst or r["error"] > worst[key][0]:
            worst[key] = (r["error"], r["tolerance"])
    rows = [(*k, counts[k], f"{e:.2e}", f"{t:.1e}", f"{t / e:.0f}x" if e > 0 else "inf")
            for k, (e, t) in sorted(worst.items())]
    print(_table(rows, ("component", "mode", "dtype", "quantity", "draws", "worst", "tolerance", "margin")))
    return 0


def _scheme_check_environment(device: str | None) -> None:
    """Measured like the test suite (float32-accurate dots, pinned autotuners; the interpreter for
    ``--device cpu``). Must run before anything imports ``optimized``, which fixes the mode at
    import: ``ngdn.scheme_check`` does at import (its draws use the compile buckets)."""
    import os

    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    os.environ.setdefault("NGDN_IEEE_F32", "1")
    os.environ.setdefault("NGDN_F32_DOTS", "tf32x3")


def scheme_check(args) -> int:
    _scheme_check_environment(args.device)
    import torch

    from optimized import triton_mode

    mode = triton_mode.configure()
    if args.device == "cuda" and mode != triton_mode.CUDA:
        print("--device cuda: no CUDA device (or TRITON_INTERPRET is set)", file=sys.stderr)
        return 2
    if mode != triton_mode.CUDA:
        torch.set_num_threads(1)          # the per-token references: see suite/plugin.py
    from ngdn import scheme_check as battery

    with battery.registry_restored():
        try:
            loaded = battery.load_scheme_file(args.file)
            scheme = battery.pick_scheme(args.file, loaded, args.scheme)
            only = args.only
            draw = battery.parse_draw(args.draw) if args.draw is not None else None
            if draw is not None and (not only or len(only) != 1):
                raise ValueError("--draw reproduces one property: pass exactly one --only NAME")
            for name in only or ():
                battery.get_property(name)
            if draw is not None:
                battery.check_draw(battery.get_property(only[0]), draw)
        except (ValueError, TypeError) as e:
            print(f"ngdn scheme check: {e}", file=sys.stderr)
            return 2
        print(f"device mode: {mode}; examples: {args.examples}; stability threshold: {args.threshold}")
        if draw is not None:
            rows = [battery.run_property(battery.get_property(only[0]), scheme, args.examples, args.threshold, draw)]
        else:
            rows = battery.battery(scheme, args.examples, args.threshold, only=only,
                                   cuda=mode == triton_mode.CUDA, progress=sys.stderr)
        text, ok = battery.report(args.file, scheme, rows, args.threshold)
    print(text)
    return 0 if ok else 1


# The benchmarks' command line, found by name when ``ngdn bench`` runs: ``bench`` imports the library,
# never the other way round (no import of ``bench`` here, only this name).
BENCH_CLI = "bench.cli"


def _bench(argv: list[str]) -> int:
    """``ngdn bench ARGS``: ``bench.cli.main(ARGS)`` (the same as ``python -m bench ARGS``)."""
    import importlib

    return importlib.import_module(BENCH_CLI).main(argv)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ngdn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("check", help="agreement report: reference vs optimized on default configurations",
                       description="Agreement report: each component's optimized path against its float64 "
                                   "reference on one default draw, as a table (exit 1: a quantity out of "
                                   "tolerance, 2: usage). Progress per component on stderr; NGDN_ERROR_LOG=FILE "
                                   "logs every measured error for `ngdn errors`.",
                       formatter_class=_CheckHelp)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the optimized paths (default float32; bfloat16 on CUDA only)")
    p.add_argument("--seed", type=int, default=0, help="seed of every component's input draw (default 0)")
    p.add_argument("--only", action="append", metavar="COMPONENT",
                   help="run only this component (repeatable; default all)")
    p.set_defaults(func=check, parser=p)
    p = sub.add_parser("errors", help="worst observed error per tolerance entry from NGDN_ERROR_LOG files",
                       description="The worst observed error per tolerance entry (component, mode, dtype, "
                                   "quantity), with the number of draws and the margin to its tolerance, from "
                                   "the JSON-lines logs that NGDN_ERROR_LOG=FILE makes pytest and `ngdn check` "
                                   "write. Exit 2 on a missing, empty or malformed log.")
    p.add_argument("logs", nargs="+", metavar="LOG", help="an NGDN_ERROR_LOG file (several are merged)")
    p.set_defaults(func=errors)
    p = sub.add_parser("scheme", help="promotion schemes: `ngdn scheme check FILE.py` runs the battery",
                       description="Promotion schemes. One subcommand: `ngdn scheme check FILE.py` runs the "
                                   "scheme battery on the scheme FILE registers (`ngdn scheme check --help`).")
    scheme_parser = p
    scheme_sub = p.add_subparsers(dest="scheme_command", metavar="SUBCOMMAND", title="subcommands")
    p = scheme_sub.add_parser("check", help="run the scheme battery on the scheme FILE registers",
                              formatter_class=_SchemeCheckHelp,
                              description="The promotion-scheme battery (ngdn/scheme_check.py; docs/schemes.md "
                                          "\"Adding a promotion scheme\"): the scheme FILE registers, checked property by "
                                          "property (its contract, batch and head independence, permutations, "
                                          "gradients, its NumPy twin, causality and firing timing through the "
                                          "float64 nested reference, the optimized op against that reference, "
                                          "stability), searched with Hypothesis. Prints one row per property, "
                                          "then each failure's example and the command that reproduces it. "
                                          "Exit 0: every property passes; 1: a property fails or the scheme is "
                                          "expansive; 2: usage (a bad FILE, scheme, property or draw).")
    p.add_argument("file", metavar="FILE", help="a .py file that calls register_scheme (or a module, "
                                                "e.g. reference.schemes, with --scheme)")
    p.add_argument("--scheme", help="the scheme to check (default: the one FILE registers)")
    p.add_argument("--examples", type=int, default=None, help="Hypothesis examples per searched property "
                                                              "(default 30)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="cpu: the Triton interpreter; cuda: require a GPU (default: CUDA when present)")
    p.add_argument("--threshold", type=float, default=None,
                   help="growth factor above which a scheme is expansive (default 1.001)")
    p.add_argument("--only", action="append", metavar="PROPERTY",
                   help="run only this property (repeatable; default all)")
    p.add_argument("--draw", help="re-run the one --only PROPERTY on this draw, as the report's reproduction "
                                  "command prints it (a draw of that property's type, e.g. "
                                  "\"ProbeDraw(K=4, V=3, n=1, snapshot='zero', gate_scale=1.0, reduction='mean', "
                                  "seed=0)\"; a malformed draw is a usage error)")
    p.set_defaults(func=scheme_check)
    sub.add_parser("bench", help="the benchmarks (GPU): Nested vs flat GDN-2 and its subcommands "
                                 "(`ngdn bench --help` lists them and its options)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:   # the benchmarks parse their own options
        return _bench(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "scheme" and args.scheme_command is None:
        scheme_parser.error("a subcommand is required: `ngdn scheme check FILE.py` runs the promotion-scheme "
                            "battery (`ngdn scheme check --help`)")
    if args.func is scheme_check:
        _scheme_check_environment(args.device)      # before the import below configures `optimized`
        from ngdn.scheme_check import DEFAULT_EXAMPLES, DEFAULT_THRESHOLD

        args.examples = DEFAULT_EXAMPLES if args.examples is None else args.examples
        args.threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
        if args.examples < 1:
            parser.error(f"--examples must be positive, got {args.examples}")
        if not args.threshold >= 1.0:
            parser.error(f"--threshold must be ≥ 1, got {args.threshold}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
