"""From an error log (``NGDN_ERROR_LOG``, ``.jsonl`` or ``.jsonl.gz``) of a run whose
``bf16_sensitivity_factor`` was raised to ``--factor`` (so every bf16 draw passes and is logged),
print per component and quantity what factor each draw would have needed:

    logged bound = q + factor × e_inj (+ other floors)  =>  e_inj ≈ (bound - q) / factor
    needed       = (error - q) / e_inj, over the comparisons whose error exceeds q

(``q`` the plain bound of ``tolerances.yaml``; the other floors, small in bf16, are counted in
``e_inj``, so "needed" is a lower estimate). How results/2026-11-30-thorough-nested/run2-measure/
was read:

    python scripts/sensitivity_factor_needed.py results/2026-11-30-thorough-nested/run2-measure/errors.jsonl.gz
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys

from ngdn.tolerances import tolerance


def rows(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            yield json.loads(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--factor", type=float, default=1000.0, help="the factor the run used")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    import torch

    dtype = getattr(torch, args.dtype)
    by = collections.defaultdict(list)
    for r in rows(args.log):
        if r["dtype"] != args.dtype or r["quantity"].endswith(" vs float64"):
            continue
        q = tolerance(r["component"], r["quantity"], dtype, r["mode"])
        by[(r["component"], r["quantity"])].append((r["error"], (r["tolerance"] - q) / args.factor, q))
    print("| component | quantity | comparisons | worst error | over q | needed factor | largest e_inj |")
    print("|---|---|---|---|---|---|---|")
    for (component, quantity), v in sorted(by.items()):
        over = [(e, ei, q) for e, ei, q in v if e > q]
        needed = max([(e - q) / max(ei, 1e-30) for e, ei, q in over] or [0.0])
        print(f"| {component} | {quantity} | {len(v)} | {max(e for e, _, _ in v):.3g} | {len(over)} | "
              f"{needed:.3g} | {max(ei for _, ei, _ in v):.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
