"""Rows, ratios and outputs of the benchmark: one row per (sweep, config, side) with its
floors (``bench.floors``) and nested/flat ratios, written as ``results.csv`` (and read back
for ``--resume``/``--replot``), ``results.md`` (targets, anchors, one table per figure,
floors, warm-up times, errors) and the four PNGs.
"""
from __future__ import annotations

import csv
import math
import re
import warnings
from pathlib import Path
from typing import Sequence

import torch

from bench import floors
from bench.measure import MEASURED
from bench.plan import DTYPES, IMPLS, SWEEPS, UNIFORM_QUERIES, Config, Workload


# --- what the design note and the performance targets ask for -----------------------

TARGETS = (
    "forward+backward <= 0.5x flat at L >= 4",
    "forward+backward <= 0.75x flat at L = 2",
    "forward <= 0.9x flat at every depth row",
    "query ladder within 5 % of uniform 16 queries (forward+backward)",
    "peak memory <= 0.30x flat at L = 4 (head dim 128)",
    "peak memory <= 0.22x flat at L = 6 (head dim 128)",
)
# the limits of TARGETS, in order
TARGET_LIMITS = (0.5, 0.75, 0.9, 1.05, 0.30, 0.22)
ANCHORS = (
    "forward 1.3-1.8x flat",
    "forward+backward 1.03x flat at head dim 128, 5 levels",
    "peak memory 1/2 of flat at 4 levels, 1/3 at 6",
)

COLUMNS = [
    "sweep", "config", "impl", "queries", "L", "B", "T", "H", "heads", "K", "V",
    "dtype", "param_dtype", "query_counts", "intervals", "param_elements",
    "warmup_s", "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_host_ms", "fwdbwd_host_ms", "fwd_graph_ms", "fwdbwd_graph_ms",
    "peak_gib", "peak_extra_gib",
    "fwd_gflop", "bwd_gflop", "fwd_min_mb", "bwd_min_mb",
    "fwd_floor_ms", "bwd_floor_ms", "fwdbwd_floor_ms",
    "fwd_x_floor", "bwd_x_floor", "fwdbwd_x_floor",
    "fwd_vs_flat", "bwd_vs_flat", "fwdbwd_vs_flat", "peak_vs_flat", "peak_extra_vs_flat",
    "fwd_graph_vs_flat", "fwdbwd_graph_vs_flat",
    "finite", "error",
]
INT_COLUMNS = {"L", "B", "T", "H", "heads", "K", "V", "param_elements"}
STR_COLUMNS = {"sweep", "config", "impl", "queries", "dtype", "param_dtype", "query_counts",
               "intervals", "error"}


# --- rows: measurements, floors, ratios ---------------------------------------------

def make_row(cfg: Config, w: Workload, m: dict, dtype: str) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(sweep=cfg.sweep, config=cfg.id, impl=w.impl, queries=w.queries, L=w.L, B=w.B, T=w.T,
               H=w.H, heads=w.heads, K=w.K, V=w.V, dtype=dtype)
    row.update({k: m.get(k) for k in MEASURED})
    if w.impl == "nested" and not row["query_counts"]:
        row["query_counts"] = "-".join(map(str, w.query_counts))
    return row


def _row_order(row: dict) -> tuple:
    """Sweep, head dim, depth, batch; nested before flat, ladder before uniform."""
    sweep = SWEEPS.index(row["sweep"]) if row["sweep"] in SWEEPS else len(SWEEPS)
    return (sweep, row["K"], row["L"], row["B"], IMPLS.index(row["impl"]), row["queries"] != "ladder")


def _key_of_row(row: dict) -> tuple:
    if row["impl"] == "flat":
        return ("flat", row["B"], row["T"], row["heads"], row["K"], row["V"])
    counts = tuple(int(n) for n in str(row["query_counts"]).split("-") if n)
    return ("nested", row["B"], row["T"], row["H"], row["K"], row["V"], row["L"], counts)


def _ratio(a, b):
    if a is None or b is None or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def finalize(rows: list[dict], rates: dict, args) -> list[dict]:
    """Fill the floor and nested/flat columns of every row (in place; returns ``rows``)."""
    itemsize = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    flat_by_shape = {}
    for row in rows:
        if row["impl"] == "flat" and row["fwd_ms"] is not None:
            flat_by_shape[(row["B"], row["T"], row["heads"], row["K"], row["V"])] = row
    for row in rows:
        B, T, H, K, V, L = (row[c] for c in ("B", "T", "H", "K", "V", "L"))
        if row["impl"] == "flat":
            cost = floors.flat_cost(B, T, row["heads"], K, V, itemsize)
        else:
            counts = [int(n) for n in str(row["query_counts"]).split("-") if n]
            intervals = ([int(f) for f in str(row["intervals"]).split("-") if f] if row["intervals"]
                         else [2 ** i for i in range(L - 1)])
            p_dtype = DTYPES.get(row["param_dtype"] or args.dtype, DTYPES[args.dtype])
            cost = floors.nested_cost(B, T, H, K, V, counts, intervals, itemsize,
                                      torch.empty((), dtype=p_dtype).element_size(), scheme=args.scheme,
                                      param_elements=row["param_elements"] or None)
        fl = floors.floors(cost, rates["matmul_flops"], rates["copy_bytes"])
        row.update(fwd_gflop=cost.fwd_flops / 1e9, bwd_gflop=cost.bwd_flops / 1e9,
                   fwd_min_mb=cost.fwd_bytes / 1e6, bwd_min_mb=cost.bwd_bytes / 1e6,
                   fwd_floor_ms=fl.fwd_ms, bwd_floor_ms=fl.bwd_ms, fwdbwd_floor_ms=fl.fwdbwd_ms)
        for p in ("fwd", "bwd", "fwdbwd"):
            row[f"{p}_x_floor"] = _ratio(row[f"{p}_ms"], row[f"{p}_floor_ms"])
        flat = flat_by_shape.get((B, T, L * H, K, V)) if row["impl"] == "nested" else None
        for p in ("fwd", "bwd", "fwdbwd", "peak", "peak_extra", "fwd_graph", "fwdbwd_graph"):
            unit = "gib" if p.startswith("peak") else "ms"
            row[f"{p}_vs_flat"] = _ratio(row[f"{p}_{unit}"], flat[f"{p}_{unit}"]) if flat else None
    return rows


# --- outputs ---------------------------------------------------------------------------------

def _fmt(x, digits=4) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{digits}g}"
    return str(x)


def write_csv(path: Path, rows: list[dict], header: list[str]):
    with open(path, "w", newline="") as f:
        for line in header:
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c), 6) for c in COLUMNS})


def read_csv(path: Path) -> list[dict]:
    """Rows of a results.csv written by :func:`write_csv`, with their types back."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = []
    for raw in csv.DictReader(lines):
        row = {}
        for c in COLUMNS:
            v = raw.get(c, "")
            if c in STR_COLUMNS:
                row[c] = v or ("" if c in ("error", "queries") else None)
            elif v == "":
                row[c] = None
            elif c == "finite":
                row[c] = v == "True"
            elif c in INT_COLUMNS:
                row[c] = int(float(v))
            else:
                row[c] = float(v)
        rows.append(row)
    return rows


def _md_table(header: Sequence[str], rows: list[Sequence]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return out


def _ms(x):
    return "" if x is None else f"{x:.3f}"


def _x(x):
    return "" if x is None else f"{x:.2f}x"


def _gib(x):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _status(value, ok: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if ok else "not met"


def _index(rows):
    """(sweep, config, impl, queries) -> row."""
    return {(r["sweep"], r["config"], r["impl"], r["queries"] or ""): r for r in rows}


def _pairs(rows, sweep):
    """(nested row, flat row) per config of a nested-vs-flat sweep, in plan order."""
    idx = _index(rows)
    seen, out = set(), []
    for r in rows:
        if r["sweep"] == sweep and r["config"] not in seen:
            seen.add(r["config"])
            out.append((idx.get((sweep, r["config"], "nested", "ladder")),
                        idx.get((sweep, r["config"], "flat", ""))))
    return out


# A row whose host launch time is at least this share of its device time is host-paced: its time
# follows the host's speed (another process or machine gives another figure), not the kernels'.
HOST_PACED = 0.9


def host_paced(row: dict | None, kind: str = "fwdbwd") -> bool:
    """``row``'s ``kind`` (``"fwd"`` or ``"fwdbwd"``) host time ≥ ``HOST_PACED`` × its time."""
    if not row or row.get(f"{kind}_host_ms") is None or not row.get(f"{kind}_ms"):
        return False
    return row[f"{kind}_host_ms"] >= HOST_PACED * row[f"{kind}_ms"]


def _paced_note(kind: str, *rows, graph_ratio: float | None = None) -> str:
    """`` (host-paced: …)`` naming the rows of ``rows`` that are, else ``""``; with the ratio of
    the captured graphs (``--graph``) where one of them is."""
    notes = [f"{r['impl'] if r['impl'] == 'flat' else r['queries'] or r['impl']} host "
             f"{r[kind + '_host_ms']:.2f} of {r[kind + '_ms']:.2f} ms" for r in rows if host_paced(r, kind)]
    if notes and graph_ratio is not None:
        notes.append(f"captured graphs: {graph_ratio:.3f}x")
    return f" (host-paced: {'; '.join(notes)})" if notes else ""


def target_rows(rows: list[dict]) -> tuple[list, list]:
    """(targets, anchors) as Markdown table rows: what, where, measured, status. The memory
    targets are judged on the peak with inputs included (``peak_vs_flat``, the ratio column of
    section 3); the step's own allocations (``peak_extra_vs_flat``) are shown beside it. A time
    target measured on a host-paced row (``host_paced``) says so beside its figure."""
    depth = [n for n, _ in _pairs(rows, "depth") if n is not None]
    targets, anchors = [], []
    fb_L4, fb_L2, fwd_t, ladder_t, peak4, peak6 = zip(TARGETS, TARGET_LIMITS)

    def x3(v):      # three decimals: a ratio just over its limit must not print as the limit
        return "" if v is None else f"{v:.3f}x"

    def judged(target, where, v, shown=None):
        what, limit = target
        targets.append((what, where, x3(v) if shown is None else shown, _status(v, v is not None and v <= limit)))

    for n in depth:
        if n["L"] >= 4:
            v = n["fwdbwd_vs_flat"]
            judged(fb_L4, f"L={n['L']}, K={n['K']}", v,
                   x3(v) + _paced_note("fwdbwd", n, graph_ratio=n.get("fwdbwd_graph_vs_flat")))
    for n in depth:
        if n["L"] == 2:
            v = n["fwdbwd_vs_flat"]
            judged(fb_L2, f"L=2, K={n['K']}", v,
                   x3(v) + _paced_note("fwdbwd", n, graph_ratio=n.get("fwdbwd_graph_vs_flat")))
    fwd = [(n["fwd_vs_flat"], n) for n in depth if n["fwd_vs_flat"] is not None]
    if fwd:
        worst, n = max(fwd, key=lambda t: t[0])
        judged(fwd_t, f"worst over depth rows: L={n['L']}, K={n['K']}", worst,
               x3(worst) + _paced_note("fwd", n, graph_ratio=n.get("fwd_graph_vs_flat")))
    else:
        targets.append((fwd_t[0], "depth rows", "", "not measured"))
    idx = _index(rows)
    ladder = []
    for cfg in dict.fromkeys(r["config"] for r in rows if r["sweep"] == "ladder"):
        a = idx.get(("ladder", cfg, "nested", "ladder"))
        u = idx.get(("ladder", cfg, "nested", f"uniform{UNIFORM_QUERIES}"))
        v = _ratio(a and a["fwdbwd_ms"], u and u["fwdbwd_ms"])
        if v is not None:
            ladder.append((v, a, u))
    if ladder:
        worst, a, u = max(ladder, key=lambda t: t[0])
        graph = _ratio(a.get("fwdbwd_graph_ms"), u.get("fwdbwd_graph_ms"))
        judged(ladder_t, f"worst over ladder rows: L={a['L']}, K={a['K']}", worst,
               x3(worst) + _paced_note("fwdbwd", a, u, graph_ratio=graph))
    for n in depth:
        for L, target in ((4, peak4), (6, peak6)):
            if n["L"] == L and n["K"] == 128:
                v, extra = n["peak_vs_flat"], n["peak_extra_vs_flat"]
                shown = f"{x3(v)} (step's own allocations: {x3(extra)})" if extra is not None else x3(v)
                judged(target, f"L={L}, K=128", v, shown)
    if fwd:
        lo, hi = min(v for v, _ in fwd), max(v for v, _ in fwd)
        anchors.append((ANCHORS[0], "range over depth rows", f"{lo:.2f}x - {hi:.2f}x"))
    for n in depth:
        if n["K"] == 128 and n["L"] == 5:
            anchors.append((ANCHORS[1], f"L=5, K={n['K']}", _x(n["fwdbwd_vs_flat"])))
    for n in depth:
        if n["L"] in (4, 6):
            anchors.append((ANCHORS[2], f"L={n['L']}, K={n['K']} (design note: {'0.50' if n['L'] == 4 else '0.33'}x)",
                            _x(n["peak_vs_flat"])))
    return targets, anchors


def write_markdown(path: Path, rows: list[dict], header: list[str], plots: list[str]):
    out = [f"# {header[0]}", ""] + [f"- {line}" for line in header[1:]] + [""]
    out += ["Times are do_bench medians in ms (forward; backward alone on a kept graph; one "
            "forward+backward step). `x floor` = time / floor (bench/floors.py: max(FLOPs / matmul "
            "rate, min bytes / copy bandwidth) per pass). Ratios are nested / flat GDN-2 with L·H heads. "
            "Peak memory is torch.cuda.max_memory_allocated over one forward+backward, inputs included; "
            "`extra` counts only what the step allocates on top of its inputs. `host` is the median host "
            "time to launch one step from an idle GPU; a row whose host time is at least "
            f"{HOST_PACED:g}x its device time is host-paced (its time follows the host's speed), and a "
            "target measured on one says so.", ""]
    targets, anchors = target_rows(rows)
    out += ["## Targets (this run only measures against them)", ""]
    out += _md_table(("target", "where", "measured", "status"), targets) + [""]
    out += ["Design note anchors:", ""]
    out += _md_table(("anchor", "where", "measured"), anchors) + [""]

    errors: dict[str, str] = {}   # message -> label; the tables show labels, "Errors" the messages

    def eref(*rows_):
        labels = []
        for r in rows_:
            for text in _split_errors((r or {}).get("error")):
                if text:
                    labels.append(errors.setdefault(text, f"E{len(errors) + 1}"))
        return " ".join(dict.fromkeys(labels))

    def cost_table(sweep, first_col):
        body = []
        for n, f in _pairs(rows, sweep):
            r = n or f
            lead = {"depth": f"{r['L']}", "batch": f"{r['B']} x {r['T']}"}[sweep]
            body.append((lead, r["K"], (n or {}).get("query_counts") or "",
                         _ms(n and n["fwd_ms"]), _ms(n and n["bwd_ms"]), _ms(n and n["fwdbwd_ms"]),
                         _ms(n and n.get("fwdbwd_host_ms")),
                         _ms(f and f["fwd_ms"]), _ms(f and f["bwd_ms"]), _ms(f and f["fwdbwd_ms"]),
                         _x(n and n["fwd_vs_flat"]), _x(n and n["bwd_vs_flat"]), _x(n and n["fwdbwd_vs_flat"]),
                         _x(n and n["fwdbwd_x_floor"]), _x(f and f["fwdbwd_x_floor"]),
                         eref(n, f)))
        return _md_table((first_col, "K", "queries", "nested fwd", "nested bwd", "nested f+b", "nested f+b host", "flat fwd",
                          "flat bwd", "flat f+b", "fwd ratio", "bwd ratio", "f+b ratio", "nested f+b x floor",
                          "flat f+b x floor", "error"), body)

    if any(r["sweep"] == "depth" for r in rows):
        out += [f"## 1. Training cost vs depth (B={_first(rows, 'depth', 'B')}, T={_first(rows, 'depth', 'T')}, "
                f"H={_first(rows, 'depth', 'H')})", ""] + cost_table("depth", "L") + [""]
    if any(r["sweep"] == "batch" for r in rows):
        out += [f"## 2. Training cost vs batch size at fixed tokens per batch (L={_first(rows, 'batch', 'L')}, "
                f"H={_first(rows, 'batch', 'H')})", ""] + cost_table("batch", "B x T") + [""]
    if any(r["sweep"] == "depth" for r in rows):
        body = [(n["L"], n["K"], _gib(n["peak_gib"]), _gib(f and f["peak_gib"]), _x(n["peak_vs_flat"]),
                 _gib(n["peak_extra_gib"]), _gib(f and f["peak_extra_gib"]), _x(n["peak_extra_vs_flat"]))
                for n, f in _pairs(rows, "depth") if n is not None]
        out += ["## 3. Peak memory of one forward+backward vs depth (GiB)", ""]
        out += _md_table(("L", "K", "nested", "flat", "ratio", "nested extra", "flat extra", "extra ratio"), body)
        out += [""]
    if any(r["sweep"] == "ladder" for r in rows):
        idx = _index(rows)
        body = []
        for cfg in dict.fromkeys(r["config"] for r in rows if r["sweep"] == "ladder"):
            a = idx.get(("ladder", cfg, "nested", "ladder"))
            u = idx.get(("ladder", cfg, "nested", f"uniform{UNIFORM_QUERIES}"))
            r = a or u
            body.append((r["L"], r["K"], (a or {}).get("query_counts") or "", (u or {}).get("query_counts") or "",
                         _ms(a and a["fwd_ms"]), _ms(u and u["fwd_ms"]), _ms(a and a["fwdbwd_ms"]),
                         _ms(u and u["fwdbwd_ms"]), _x(_ratio(a and a["fwd_ms"], u and u["fwd_ms"])),
                         _x(_ratio(a and a["bwd_ms"], u and u["bwd_ms"])),
                         _x(_ratio(a and a["fwdbwd_ms"], u and u["fwdbwd_ms"])),
                         eref(a, u)))
        out += [f"## 4. Query ladder vs uniform {UNIFORM_QUERIES} queries per level (nested only)", ""]
        out += _md_table(("L", "K", "ladder", "uniform", "ladder fwd", "uniform fwd", "ladder f+b", "uniform f+b",
                          "fwd ladder/uniform", "bwd ladder/uniform", "f+b ladder/uniform", "error"), body) + [""]
    graphed = [r for r in rows if r.get("fwd_graph_ms") is not None or r.get("fwdbwd_graph_ms") is not None]
    if graphed:
        body = [(r["config"], r["impl"] + (f"/{r['queries']}" if r["queries"] else ""),
                 _ms(r["fwd_ms"]), _ms(r.get("fwd_graph_ms")), _x(r.get("fwd_graph_vs_flat")),
                 _ms(r["fwdbwd_ms"]), _ms(r.get("fwdbwd_graph_ms")), _x(r.get("fwdbwd_graph_vs_flat")))
                for r in graphed]
        out += ["## Captured CUDA graphs (`--graph`): the device's time without the host's launches", "",
                "Each forward and step captured in a CUDA graph and timed by its replays (bench/cuda_graph.py), "
                "beside the eager times above; ratios against flat's graph on the same shape. The targets "
                "are judged on the eager times; a host-paced target row shows its graph ratio beside it.", ""]
        out += _md_table(("config", "impl", "fwd", "fwd graph", "fwd graph / flat", "f+b", "f+b graph",
                          "f+b graph / flat"), body) + [""]
    body = [(r["config"], r["impl"] + (f"/{r['queries']}" if r["queries"] else ""), r["heads"],
             _fmt(r["fwd_gflop"]), _fmt(r["fwd_min_mb"]), _ms(r["fwd_floor_ms"]), _x(r["fwd_x_floor"]),
             _ms(r["bwd_floor_ms"]), _x(r["bwd_x_floor"]), _ms(r["fwdbwd_floor_ms"]), _x(r["fwdbwd_x_floor"]),
             _fmt(r["finite"]))
            for r in rows]
    out += ["## Floors (every row)", ""]
    out += _md_table(("config", "impl", "heads", "fwd GFLOP", "fwd min MB", "fwd floor", "fwd x floor",
                      "bwd floor", "bwd x floor", "f+b floor", "f+b x floor", "finite"), body) + [""]
    body = [(r["config"], r["impl"] + (f"/{r['queries']}" if r["queries"] else ""),
             "" if r["warmup_s"] is None else f"{r['warmup_s']:.1f}") for r in rows]
    out += ["## Autotune / warm-up (s; one forward+backward, not part of any timing; "
            "repeated shapes reuse the first measurement)", ""]
    out += _md_table(("config", "impl", "warm-up s"), body) + [""]
    for r in rows:
        eref(r)
    if errors:
        out += ["## Errors (labels used in the tables above)", ""]
        out += _md_table(("label", "error", "rows"), [
            (label, text, ", ".join(f"{r['config']} {r['impl']}" + (f"/{r['queries']}" if r["queries"] else "")
                                    for r in rows if text in _split_errors(r["error"])))
            for text, label in errors.items()]) + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    path.write_text("\n".join(out))


def _split_errors(text: str | None) -> list[str]:
    """A row's ``error`` is phase messages joined by "; " (messages may contain "; " too)."""
    return [e for e in re.split(r"; (?=(?:build|forward|backward|peak memory|skipped)\b)", text or "") if e]


def _first(rows, sweep, col):
    for r in rows:
        if r["sweep"] == sweep:
            return r[col]
    return ""


def write_plots(out: Path, rows: list[dict], header: list[str], log) -> list[str]:
    """The four PNGs; skipped with a warning when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        message = "matplotlib is not installed: skipping the PNG plots (pip install matplotlib)"
        warnings.warn(message, stacklevel=2)
        log(f"warning: {message}")
        return []
    footer = " | ".join(header[1:3]) + "\n" + header[3]
    metadata = {"Title": header[0], "Description": "\n".join(header)}
    written = []

    def save(fig, name):
        fig.text(0.01, 0.005, footer, fontsize=6, color="0.35")
        fig.tight_layout(rect=(0, 0.045, 1, 1))
        fig.savefig(out / name, dpi=120, metadata=metadata)
        plt.close(fig)
        written.append(name)

    def series(pairs, xkey, side, col):
        pts = [(r[xkey], r[col]) for r in (p[side] for p in pairs) if r is not None and r[col] is not None
               and not (isinstance(r[col], float) and math.isnan(r[col]))]
        return [p[0] for p in pts], [p[1] for p in pts]

    def cost_figure(sweep, xkey, xlabel, name, logx=False):
        pairs = _pairs(rows, sweep)
        if not pairs:
            return
        Ks = sorted({(n or f)["K"] for n, f in pairs})
        fig, axes = plt.subplots(2, len(Ks), figsize=(6 * len(Ks), 8), squeeze=False)
        for j, K in enumerate(Ks):
            pk = [p for p in pairs if (p[0] or p[1])["K"] == K]
            ax = axes[0][j]
            for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                ax.plot(*series(pk, xkey, 0, col), "o-", color=color, label=f"nested {col[:-3]}")
                ax.plot(*series(pk, xkey, 1, col), "s--", color=color, label=f"flat {col[:-3]}")
            ax.plot(*series(pk, xkey, 0, "fwdbwd_floor_ms"), ":", color="C2", label="nested f+b floor")
            ax.plot(*series(pk, xkey, 1, "fwdbwd_floor_ms"), ":", color="0.5", label="flat f+b floor")
            ax.set_yscale("log")
            ax.set_title(f"{sweep}: head dim {K}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("ms (do_bench median)")
            ax.legend(fontsize=7)
            ax = axes[1][j]
            for col, color in (("fwd_vs_flat", "C0"), ("bwd_vs_flat", "C1"), ("fwdbwd_vs_flat", "C2")):
                ax.plot(*series(pk, xkey, 0, col), "o-", color=color, label=col.replace("_vs_flat", ""))
            xs = sorted({(n or f)[xkey] for n, f in pk})
            ax.axhline(0.9, color="C0", ls="--", lw=0.8, label="target fwd <= 0.9x")
            if any((n or f)["L"] >= 4 for n, f in pk):
                lo = 4 if sweep == "depth" else xs[0]
                ax.hlines(0.5, lo, max(lo, xs[-1]), color="C2", ls="--", lw=0.8,
                          label="target f+b <= 0.5x (L>=4)")
            if sweep == "depth" and K == 128:
                ax.plot([5], [1.03], "k*", label="design note f+b 1.03x (L=5)")
            for a in (axes[0][j], ax):
                if logx:
                    a.set_xscale("log", base=2)
                a.set_xticks(xs)
                a.set_xticklabels([str(x) for x in xs])
                a.minorticks_off()
            ax.set_xlabel(xlabel)
            ax.set_ylabel("nested / flat")
            ax.legend(fontsize=7)
        save(fig, name)

    cost_figure("depth", "L", "levels L", "fig1_depth.png")
    cost_figure("batch", "B", "batch size B (B*T fixed)", "fig2_batch.png", logx=True)

    pairs = [p for p in _pairs(rows, "depth") if p[0] is not None]
    if pairs:
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(12, 4.5))
        for j, K in enumerate(sorted({n["K"] for n, _ in pairs})):
            pk = [p for p in pairs if p[0]["K"] == K]
            a0.plot(*series(pk, "L", 0, "peak_gib"), "o-", color=f"C{j}", label=f"nested K={K}")
            a0.plot(*series(pk, "L", 1, "peak_gib"), "s--", color=f"C{j}", label=f"flat K={K}")
            a1.plot(*series(pk, "L", 0, "peak_vs_flat"), "o-", color=f"C{j}", label=f"K={K}")
        a1.plot([4, 6], [0.30, 0.22], "rv", label="targets <= 0.30x at L=4, <= 0.22x at L=6 (K=128)")
        a1.plot([4, 6], [0.5, 1 / 3], "k*", label="design note 1/2 at L=4, 1/3 at L=6")
        Ls = sorted({n["L"] for n, _ in pairs} | {4, 6})
        for a in (a0, a1):
            a.set_xticks(Ls)
        a0.set_xlabel("levels L")
        a0.set_ylabel("peak GiB (forward+backward)")
        a0.legend(fontsize=7)
        a1.set_xlabel("levels L")
        a1.set_ylabel("nested / flat peak memory")
        a1.legend(fontsize=7)
        save(fig, "fig3_memory.png")

    ladder = [r for r in rows if r["sweep"] == "ladder"]
    if ladder:
        Ks = sorted({r["K"] for r in ladder})
        fig, axes = plt.subplots(2, len(Ks), figsize=(6 * len(Ks), 8), squeeze=False)
        uniform = f"uniform{UNIFORM_QUERIES}"
        for j, K in enumerate(Ks):
            ax, axr = axes[0][j], axes[1][j]
            by = {(r["queries"], r["L"]): r for r in ladder if r["K"] == K}
            Ls = sorted({L for _, L in by})
            for q, style in (("ladder", "o-"), (uniform, "s--")):
                for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                    pts = [(L, by[(q, L)][col]) for L in Ls if (q, L) in by and by[(q, L)][col] is not None]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{q} {col[:-3]}")
            for col, color in (("fwd_ms", "C0"), ("bwd_ms", "C1"), ("fwdbwd_ms", "C2")):
                pts = [(L, _ratio(by.get(("ladder", L), {}).get(col), by.get((uniform, L), {}).get(col))) for L in Ls]
                pts = [p for p in pts if p[1] is not None]
                axr.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=col[:-3])
            axr.axhline(1.0, color="0.5", lw=0.8)
            ax.set_title(f"query ladder vs uniform {UNIFORM_QUERIES}: head dim {K}")
            ax.set_ylabel("ms (do_bench median)")
            axr.set_ylabel(f"ladder / uniform {UNIFORM_QUERIES}")
            for a in (ax, axr):
                a.set_xticks(Ls)
                a.set_xlabel("levels L")
                a.legend(fontsize=7)
        save(fig, "fig4_ladder.png")
    return written

