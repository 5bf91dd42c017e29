"""Long-context accuracy of Nested GDN-2 and flat GDN-2 against their float64 references.

What it measures. For each sequence length T,
promotion scheme and seed, on one set of inputs whose activations are rounded to bfloat16
once (so every run sees exactly the same values):

- ``optimized.chunk_nested_gdn2`` in bfloat16 and in float32 against the float64 reference
  ``reference.naive_nested_gdn2`` (on the GPU, in float64): relative error
  ``‖opt − ref‖ / ‖ref‖`` of the output and of every level's final state, and the float64
  norm of every level's final state;
- the same for flat GDN-2, ``optimized.chunk_gdn2`` vs ``reference.naive_gdn2``, on the
  level-0 inputs (same B, T, H, K, V; level 0's query and initial state);
- a diagnostic of where the bfloat16 loss comes from: the float64 reference whose level 1
  probes bf16-rounded snapshots, as the optimized bf16 path's level 1 does (it probes fla's
  chunk-end states, which fla stores in bf16; the end of the last chunk is fla's float32
  final state, so a firing there probes an unrounded state), variant ``ref_bf16_snap_l1``;
  and the same with every level's snapshot rounded, ``ref_bf16_snap_all``. Both are
  compared with the plain float64 reference. If ``ref_bf16_snap_l1`` comes close to the
  optimized bf16 errors, the loss is in the math (promoting a rounded state), not in the
  kernels' arithmetic. The rounding is a temporary promotion scheme (registered through
  ``reference.schemes.register_scheme`` and removed afterwards) whose probe rounds
  ``M_below`` to bfloat16 and back and then calls the scheme's own probe; ``reference/``
  is unchanged. The two variants and the plain reference run as one reference call, stacked
  on the batch axis (rows 0, 1, 2; the reference is launch-bound on a GPU, so three rows
  cost about what one does).

Inputs: ``ngdn.nested_inputs.nested_inputs`` (seeded, B = 1, H = 16, K = V = 128, L = 4,
initial states included); scheme parameters from ``reference.nested.make_levels`` with the
default intervals ``f_ℓ = 2^(ℓ-1)`` and the bounded query ladder (16, 32, 64 at K = 128),
drawn from seed ``LEVEL_SEED + seed`` so that ``learned`` and ``bounded_erase`` (same
parameter shapes) get identical parameters. Parameters and initial states are float32, the
reference gets their float64 twins. Float32 dots are float32-accurate (``--f32-dots tf32x3``,
as in the test suite; or ``ieee``) and autotuners are pinned to one config (this measures accuracy, not speed).

Run on the GPU (from the repo root). The default sweep's time on one H200 is estimated, not
yet measured, at 3-6 min: the per-token float64 reference (about 0.4 ms per token nested,
0.15 ms flat: it is launch-bound) and drawing the float64 inputs on the CPU (serial randn,
about 1.3e9 numbers at T = 65536) dominate; kernel compilation adds about a minute.

    python -m bench.long_context --out results/long-context
    python -m bench.long_context --out DIR --T 4096 16384 65536 --schemes learned bounded_erase \
        --seeds 0 --time-budget 540        # skip what would not finish in 9 min

    python -m bench.long_context --out DIR --quick    # CPU smoke (Triton interpreter): float32 only

Writes ``DIR/long_context.csv`` (one row per T, scheme, seed, op and variant; rewritten after
every unit of work, so a run cut off keeps what it measured), ``DIR/long_context.md`` and
``DIR/long_context.png`` (if matplotlib is installed), then prints the Markdown to stdout.
Progress goes to stderr, one line per measurement. On the CPU
bfloat16 rows are ``skipped`` (the interpreter refuses bfloat16). ``--time-budget SECONDS``
skips the remaining (largest-T) work once the budget is spent or projected (from the
seconds per token measured so far) to be exceeded; skipped rows say so in ``status``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

B, L, CHUNK = 1, 4, 64
DEFAULT_SCHEMES = ("learned", "bounded_erase")
FULL = dict(H=16, K=128, V=128, T=(4096, 16384, 65536), schemes=DEFAULT_SCHEMES)
QUICK = dict(H=1, K=32, V=32, T=(64, 128), schemes=("learned",))
# The float32-accurate dot precisions of ``optimized.triton_mode.F32_DOTS`` (not imported here: importing
# ``optimized`` fixes the device mode before ``configure`` has set the environment); the default is the
# test suite's (its plugin, ``suite.plugin``, sets ``NGDN_F32_DOTS=tf32x3``), so the sweep measures the kernels as
# the tests do.
F32_DOTS = ("tf32x3", "ieee")
F32_DOTS_DEFAULT = "tf32x3"
LEVEL_SEED = 1_000_000          # scheme parameters come from seed LEVEL_SEED + seed
ACTIVATIONS = ("q", "k", "v", "g", "b", "w", "r")
FLAT = "-"                      # the scheme column of flat GDN-2 rows

# variants: the op's dtypes, the float64 reference itself and the two diagnostics
REF, BF16, F32 = "float64", "bfloat16", "float32"
SNAP_L1, SNAP_ALL = "ref_bf16_snap_l1", "ref_bf16_snap_all"
STACK_ROWS = {REF: 0, SNAP_L1: 1, SNAP_ALL: 2}   # batch rows of the stacked reference call

COLUMNS = (["T", "scheme", "seed", "op", "variant", "status", "out_err"]
           + [f"state_err_l{i}" for i in range(L)] + [f"state_norm_l{i}" for i in range(L)]
           + ["wall_s", "H", "K", "V"])


def log(message: str) -> None:
    print(f"[long_context] {message}", file=sys.stderr, flush=True)


# --- command line and environment --------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ngdn bench long-context", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None,
                   help="output folder (default results/<date>-long-context/; "
                        "--quick: results/tmp/long-context-quick/)")
    p.add_argument("--T", type=int, nargs="+", help=f"sequence lengths (default {FULL['T']}, --quick {QUICK['T']})")
    p.add_argument("--schemes", nargs="+",
                   help=f"promotion schemes (default {' '.join(DEFAULT_SCHEMES)}; --quick: learned)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--quick", action="store_true",
                   help=f"tiny sizes for a CPU smoke run (< 60 s): H={QUICK['H']}, K=V={QUICK['K']}, "
                        f"T {QUICK['T']}, scheme learned")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="skip the remaining (largest-T) work once this is spent or projected to be exceeded")
    p.add_argument("--f32-dots", choices=(*F32_DOTS, "tf32"), default=F32_DOTS_DEFAULT,
                   help=f"float32 dot precision of the kernels on CUDA: tf32x3 (three TF32 products per dot, "
                        f"float32-level error) or ieee, both float32-accurate, or plain tf32 (default "
                        f"{F32_DOTS_DEFAULT}, as the test suite sets NGDN_F32_DOTS)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    args = p.parse_args(argv)
    if args.out is None:        # a full run goes to a dated folder (to be committed), a smoke run to the untracked tmp/
        args.out = ("results/tmp/long-context-quick" if args.quick
                    else f"results/{_dt.date.today().isoformat()}-long-context")
    args.T_given = bool(args.T)
    shape = QUICK if args.quick else FULL
    args.H, args.K, args.V = shape["H"], shape["K"], shape["V"]
    args.T = sorted(set(args.T or shape["T"]))
    args.schemes = list(dict.fromkeys(args.schemes or shape["schemes"]))
    if any(t < 1 for t in args.T):
        p.error("--T must be positive")
    return args


def configure(args) -> dict:
    """Choose kernel settings before ``optimized`` is imported, then import it. Returns facts
    for the report (device mode, float32 dots, autotune)."""
    os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    if args.f32_dots in F32_DOTS:
        os.environ["NGDN_IEEE_F32"] = "1"
        os.environ["NGDN_F32_DOTS"] = args.f32_dots      # the option's choice, not an inherited one
    else:
        os.environ.pop("NGDN_IEEE_F32", None)
        os.environ.pop("TRITON_F32_DEFAULT", None)
    import optimized
    from triton.runtime import autotuner

    cuda = optimized.MODE == optimized.triton_mode.CUDA
    if not cuda:
        # The per-token CPU reference issues thousands of tiny ops; intra-op threads spinning
        # against each other made it ~50x slower on 2 cores (as in the suite plugin, ``suite.plugin``).
        torch.set_num_threads(1)
    return {
        "mode": optimized.MODE,
        "device": optimized.triton_mode.device(),
        "gpu": torch.cuda.get_device_name() if cuda else "none (CPU, Triton interpreter)",
        "f32_dots": ((os.environ.get("TRITON_F32_DEFAULT") or "tf32 (Triton default)") if cuda
                     else "exact (interpreter)"),
        "autotune": "pinned to one config" if getattr(autotuner.Autotuner, "_ngdn_pinned", False) else "on",
        "bf16": cuda,
    }


# --- inputs ---------------------------------------------------------------------------

@dataclass
class Inputs:
    """One draw on the device: activations (float64 twins of their bf16 rounding) and initial
    states (float64 twins of their float32 rounding); ``levels(scheme)`` draws the parameters."""
    T: int
    seed: int
    H: int
    K: int
    V: int
    acts: dict
    states: list
    device: str

    def levels(self, scheme: str):
        """``(levels32, levels64)``: float32 scheme parameters for the op and their float64 twins."""
        from ngdn.inputs import as_reference, generator
        from ngdn.nested_inputs import bounded_query_counts, cast_levels
        from reference.nested import Level, make_levels

        masters = make_levels(L, self.H, self.K, self.V, scheme=scheme, generator=generator(LEVEL_SEED + self.seed),
                              query_counts=bounded_query_counts(L, self.K, self.V))
        twins = [Level(lv.scheme, lv.interval, {n: as_reference(p, torch.float32).to(self.device)
                                                for n, p in lv.params.items()}, lv.reduction) for lv in masters]
        return cast_levels(masters, torch.float32, self.device), twins


def draw_inputs(T: int, seed: int, H: int, K: int, V: int, device: str) -> Inputs:
    """``nested_inputs`` masters, activations rounded to bfloat16 once (kept as float64)."""
    from ngdn.nested_inputs import NestedShape, nested_inputs

    x = nested_inputs(NestedShape(B, T, H, L, K, V), seed)
    acts = {}
    for n in ACTIVATIONS:
        acts[n] = x.pop(n).to(device).to(torch.bfloat16).to(torch.float64)
    states = [s.to(device).to(torch.float32).to(torch.float64) for s in x["initial_states"]]
    return Inputs(T, seed, H, K, V, acts, states, device)


def level0(acts: dict) -> dict:
    """The flat GDN-2 inputs: level 0's query and the level-0 activations."""
    return {"q": acts["q"][:, :, :, 0], **{n: acts[n] for n in ("k", "v", "g", "b", "w")}}


# --- measuring --------------------------------------------------------------------------

def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``‖actual − expected‖ / ‖expected‖`` in float64 on ``expected``'s device (inf if ``actual``
    is not finite; the absolute error where ‖expected‖ = 0), as ``ngdn.tolerances.relative_error``."""
    actual = actual.detach().to(expected.device, torch.float64)
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, warm_up: bool):
    """``(result, seconds)``; with ``warm_up`` one untimed call first (kernel compilation)."""
    if warm_up:
        fn()
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def row(inp: Inputs, scheme: str, op: str, variant: str, status="ok", out_err=None, state_errs=(), norms=(),
        wall=None) -> dict:
    r = {"T": inp.T, "scheme": scheme, "seed": inp.seed, "op": op, "variant": variant, "status": status,
         "out_err": out_err, "wall_s": wall, "H": inp.H, "K": inp.K, "V": inp.V}
    for i in range(L):
        r[f"state_err_l{i}"] = state_errs[i] if i < len(state_errs) else None
        r[f"state_norm_l{i}"] = norms[i] if i < len(norms) else None
    return r


def op_rows(inp, scheme, op, call, o_ref, states_ref, norms, cfg, prefix):
    """The op in bfloat16 and float32 against the float64 reference: one row per dtype."""
    rows = []
    for dtype, variant in ((torch.bfloat16, BF16), (torch.float32, F32)):
        if dtype == torch.bfloat16 and not cfg["bf16"]:
            rows.append(row(inp, scheme, op, variant, f"skipped: bfloat16 needs CUDA ({cfg['mode']} mode)",
                            norms=norms))
            continue
        try:
            with torch.no_grad():
                (o, states), wall = timed(lambda: call(dtype), inp.device, warm_up=cfg["bf16"])
            errs = [rel_err(s, s_ref) for s, s_ref in zip(states, states_ref)]
            rows.append(row(inp, scheme, op, variant, out_err=rel_err(o, o_ref), state_errs=errs, norms=norms,
                            wall=wall))
            log(f"{prefix} {variant}: out {rows[-1]['out_err']:.2e}, states "
                + " ".join(f"{e:.2e}" for e in errs) + f" ({wall:.2f} s)")
        except Exception as e:  # noqa: BLE001 - record and go on (e.g. out of memory at the largest T)
            rows.append(row(inp, scheme, op, variant, f"error: {describe(e)}", norms=norms))
            log(f"{prefix} {variant}: {rows[-1]['status']}")
        finally:
            if inp.device == "cuda":
                torch.cuda.empty_cache()
    return rows


def flat_unit(inp: Inputs, cfg: dict) -> tuple[list, float]:
    """Flat GDN-2 on the level-0 inputs: float64 reference, then the op. Returns rows and the
    reference's seconds."""
    from optimized import chunk_gdn2
    from reference import naive_gdn2

    x, S0 = level0(inp.acts), inp.states[0]
    with torch.no_grad():
        (o_ref, S_ref), ref_s = timed(lambda: naive_gdn2(**x, initial_state=S0, output_final_state=True),
                                      inp.device, warm_up=False)
    norms = [S_ref.norm().item()]
    rows = [row(inp, FLAT, "flat", REF, norms=norms, wall=ref_s)]
    prefix = f"T={inp.T} seed={inp.seed} flat"
    log(f"{prefix} float64 reference: {ref_s:.1f} s, ‖M_0‖ {norms[0]:.3g}")

    def call(dtype):
        o, S = chunk_gdn2(**{n: t.to(dtype).contiguous() for n, t in x.items()}, initial_state=S0.float(),
                          output_final_state=True)
        return o, [S]

    return rows + op_rows(inp, FLAT, "flat", call, o_ref, [S_ref], norms, cfg, prefix), ref_s


# --- the diagnostic: bf16-rounded snapshots in the float64 reference ---------------------------

def last_chunk_firing(T: int, interval: int) -> int | None:
    """Which firing (1-based) of a level with this interval probes the end of the last chunk,
    or None if none does. The optimized path's level 1 probes that snapshot in float32 (fla's
    final state), every earlier one in fla's bfloat16 chunk states."""
    N = -(-T // CHUNK)
    return N // interval if T % CHUNK == 0 and N % interval == 0 else None


def rounding_probe(probe, rows: tuple, exempt_firing: int | None):
    """``probe`` with ``M_below`` rounded to bfloat16 and back on the given batch rows, except
    on firing ``exempt_firing`` (1-based count of calls; the reference calls once per firing)."""
    calls = [0]

    def rounded(M_below, params, reduction="mean"):
        calls[0] += 1
        if rows and calls[0] != exempt_firing:
            M_below = M_below.clone()
            idx = list(rows)
            M_below[idx] = M_below[idx].to(torch.bfloat16).to(M_below.dtype)
        return probe(M_below, params, reduction)

    return rounded


@contextlib.contextmanager
def stacked_levels(levels64: list, T: int):
    """Levels for the stacked reference call: level 1's probe rounds rows 1 and 2 (as the
    optimized bf16 path), levels ≥ 2 round row 2; temporary schemes, removed on exit."""
    from reference.nested import Level
    from reference.schemes import SCHEMES, get_scheme, register_scheme

    names, out = [], []
    try:
        for ℓ, lv in enumerate(levels64, start=1):
            base = get_scheme(lv.scheme)
            name = f"_long_context_bf16_snapshots_l{ℓ}_{lv.scheme}"
            rows = (STACK_ROWS[SNAP_L1], STACK_ROWS[SNAP_ALL]) if ℓ == 1 else (STACK_ROWS[SNAP_ALL],)
            exempt = last_chunk_firing(T, lv.interval) if ℓ == 1 else None
            register_scheme(name, rounding_probe(base.probe, rows, exempt), base.parameter_shapes, replace=True)
            names.append(name)
            out.append(Level(name, lv.interval, lv.params, lv.reduction))
        yield out
    finally:
        for name in names:
            SCHEMES.pop(name, None)


def stacked_reference(inp: Inputs, levels64: list):
    """One float64 reference call on three copies of the inputs (batch rows 0, 1, 2: plain,
    level-1 snapshots rounded, every snapshot rounded). Returns ``(o [3, T, H, V], states)``."""
    from reference import naive_nested_gdn2

    n = len(STACK_ROWS)
    acts = {k: t.expand(n, *t.shape[1:]) for k, t in inp.acts.items()}
    states = [s.expand(n, *s.shape[1:]) for s in inp.states]
    with stacked_levels(levels64, inp.T) as levels, torch.no_grad():
        return naive_nested_gdn2(**acts, levels=levels, initial_states=states, output_final_state=True)


def nested_unit(inp: Inputs, scheme: str, cfg: dict) -> tuple[list, float]:
    """Nested GDN-2 with one scheme: the stacked float64 reference, its two diagnostic rows,
    then the op. Returns rows and the reference's seconds."""
    from optimized import chunk_nested_gdn2

    levels32, levels64 = inp.levels(scheme)
    (o3, M3), ref_s = timed(lambda: stacked_reference(inp, levels64), inp.device, warm_up=False)
    ref = STACK_ROWS[REF]
    o_ref, states_ref = o3[ref:ref + 1].clone(), [M[ref:ref + 1].clone() for M in M3]
    norms = [M.norm().item() for M in states_ref]
    prefix = f"T={inp.T} seed={inp.seed} {scheme}"
    status = "ok" if all(map(math.isfinite, norms)) else "non-finite float64 reference"
    rows = [row(inp, scheme, "nested", REF, status, norms=norms, wall=ref_s)]
    log(f"{prefix} float64 reference (+2 diagnostic rows, stacked): {ref_s:.1f} s, norms "
        + " ".join(f"{x:.3g}" for x in norms))
    for variant in (SNAP_L1, SNAP_ALL):
        i = STACK_ROWS[variant]
        errs = [rel_err(M[i:i + 1], M_ref) for M, M_ref in zip(M3, states_ref)]
        rows.append(row(inp, scheme, "nested", variant, status, out_err=rel_err(o3[i:i + 1], o_ref),
                        state_errs=errs, norms=norms))
        log(f"{prefix} {variant}: out {rows[-1]['out_err']:.2e}, states " + " ".join(f"{e:.2e}" for e in errs))
    del o3, M3      # frees the diagnostic rows before the op runs

    def call(dtype):
        return chunk_nested_gdn2(**{n: t.to(dtype) for n, t in inp.acts.items()}, levels=levels32,
                                 initial_states=[s.float() for s in inp.states], output_final_state=True)

    return rows + op_rows(inp, scheme, "nested", call, o_ref, states_ref, norms, cfg, prefix), ref_s


def placeholder_rows(T: int, seed: int, units, status: str, shape: dict) -> list:
    """The rows of work not done (skipped or failed) for ``units``, (scheme, op) pairs."""
    inp = Inputs(T, seed, shape["H"], shape["K"], shape["V"], {}, [], "")
    variants = {"flat": [REF, BF16, F32], "nested": [REF, SNAP_L1, SNAP_ALL, BF16, F32]}
    return [row(inp, scheme, op, v, status) for scheme, op in units for v in variants[op]]


def describe(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


# --- the sweep ---------------------------------------------------------------------------

class Budget:
    """``--time-budget``: the elapsed time plus a projection (seconds per token measured so far,
    per kind of work, times T) must stay within the budget."""

    def __init__(self, seconds):
        self.seconds, self.start, self.rate = seconds, time.perf_counter(), {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def note(self, kind: str, seconds: float, T: int) -> None:
        self.rate[kind] = max(self.rate.get(kind, 0.0), seconds / T)

    def refuses(self, kinds, T: int) -> str | None:
        """Why work of these kinds at length T does not fit, or None."""
        if self.seconds is None:
            return None
        projected = sum(self.rate.get(k, 0.0) for k in kinds) * T
        if self.elapsed() + projected > self.seconds:
            return (f"time budget {self.seconds:g} s (elapsed {self.elapsed():.0f} s, "
                    f"projected {projected:.0f} s more)")
        return None


def run(args, cfg) -> tuple[list, dict]:
    """The sweep, smallest T first; a unit (flat, or nested with one scheme) that fails is
    recorded and the sweep goes on. Returns the rows and the seconds spent drawing each
    (T, seed)'s inputs."""
    shape = {"H": args.H, "K": args.K, "V": args.V}
    budget, rows, input_s = Budget(args.time_budget), [], {}
    out = Path(args.out)
    for T in args.T:
        for seed in args.seeds:
            units = [(FLAT, "flat")] + [(s, "nested") for s in args.schemes]
            why = budget.refuses(["inputs", "flat"], T)
            if why:
                rows += placeholder_rows(T, seed, units, f"skipped: {why}", shape)
                log(f"T={T} seed={seed}: skipped ({why})")
                write_csv(out, rows)
                continue
            try:
                t0 = time.perf_counter()
                inp = draw_inputs(T, seed, args.H, args.K, args.V, cfg["device"])
            except Exception as e:  # noqa: BLE001 - e.g. out of memory
                rows += placeholder_rows(T, seed, units, f"error: drawing inputs: {describe(e)}", shape)
                log(f"T={T} seed={seed}: {rows[-1]['status']}")
                write_csv(out, rows)
                continue
            input_s[T, seed] = time.perf_counter() - t0
            budget.note("inputs", input_s[T, seed], T)
            log(f"T={T} seed={seed}: inputs drawn and rounded in {input_s[T, seed]:.1f} s")
            for scheme, op in units:
                why = budget.refuses([op], T)
                if why:
                    rows += placeholder_rows(T, seed, [(scheme, op)], f"skipped: {why}", shape)
                    log(f"T={T} seed={seed} {scheme} {op}: skipped ({why})")
                else:
                    try:
                        unit_rows, ref_s = flat_unit(inp, cfg) if op == "flat" else nested_unit(inp, scheme, cfg)
                    except Exception as e:  # noqa: BLE001 - record and go on
                        rows += placeholder_rows(T, seed, [(scheme, op)], f"error: {describe(e)}", shape)
                        log(f"T={T} seed={seed} {scheme} {op}: {rows[-1]['status']}")
                    else:
                        rows += unit_rows
                        op_s = sum(r["wall_s"] or 0 for r in unit_rows if r["variant"] in (BF16, F32))
                        budget.note(op, ref_s + 2 * op_s, T)     # 2: the warm-up call and the timed one
                    finally:
                        if cfg["device"] == "cuda":
                            torch.cuda.empty_cache()
                write_csv(out, rows)
            del inp
    return rows, input_s


# --- outputs ---------------------------------------------------------------------------

def fmt(x, spec=".2e") -> str:
    if x is None or x == "":
        return ""
    return format(x, spec) if isinstance(x, float) else str(x)


def write_csv(out: Path, rows: list) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "long_context.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else ("" if v is None else v)) for k, v in r.items()})
    return path


def find(rows, T, scheme, op, variant):
    return next((r for r in rows if (r["T"], r["scheme"], r["op"], r["variant"]) == (T, scheme, op, variant)), None)


def mean_over_seeds(rows: list) -> list:
    """Rows with ``ok`` status averaged over seeds (geometric mean of errors), one per
    (T, scheme, op, variant); ``seeds`` counts them."""
    groups = {}
    for r in rows:
        if r["status"] == "ok" or r["status"].startswith("non-finite"):
            groups.setdefault((r["T"], r["scheme"], r["op"], r["variant"]), []).append(r)
    out = []
    for (T, scheme, op, variant), rs in groups.items():
        m = {"T": T, "scheme": scheme, "op": op, "variant": variant, "seeds": len(rs)}
        for k in COLUMNS[6:]:
            vals = [r[k] for r in rs if isinstance(r[k], (int, float))]
            if not vals:
                m[k] = None
            elif k.startswith(("out_err", "state_err")) and all(v > 0 for v in vals):
                m[k] = math.exp(sum(math.log(v) for v in vals) / len(vals))
            else:
                m[k] = sum(vals) / len(vals)
        out.append(m)
    return out


def write_markdown(out: Path, rows: list, args, cfg, meta: dict) -> Path:
    m = mean_over_seeds(rows)
    Ts = sorted({r["T"] for r in m})
    schemes = [s for s in args.schemes if any(r["scheme"] == s for r in m)]
    lv = range(L)
    lines = [
        "# Long-context accuracy: Nested GDN-2 and flat GDN-2 vs the float64 reference",
        "",
        f"- date: {meta['date']}; device: {cfg['gpu']} (mode {cfg['mode']}); torch {torch.__version__}, "
        f"triton {meta['triton']}, fla-core {meta['fla']}",
        f"- command: `{meta['command']}`",
        f"- shapes: B={B}, H={args.H}, K=V={args.K}, L={L}, chunk {CHUNK}; intervals {meta['intervals']}, "
        f"query counts {meta['query_counts']} (bounded ladder); seeds {args.seeds}",
        "- inputs: `ngdn.nested_inputs.nested_inputs` (initial states included), activations rounded to bfloat16 "
        "once; scheme parameters and initial states float32 (`make_levels`, seed "
        f"{LEVEL_SEED} + seed, the same for every scheme of the same shapes); every run sees the same values",
        f"- float32 dots: {cfg['f32_dots']}; autotune: {cfg['autotune']}",
        "- errors: ‖x − x_ref‖ / ‖x_ref‖ against the float64 reference (`naive_nested_gdn2` / `naive_gdn2`, run "
        f"on {cfg['device']} in float64); norms: ‖M_ℓ‖_F of the float64 reference's final states",
    ]
    if len(args.seeds) > 1:
        lines.append("- several seeds: errors are geometric means over seeds, norms and times arithmetic means")
    if not cfg["bf16"]:
        lines.append("- **no CUDA: bfloat16 rows are skipped** (the Triton interpreter refuses bfloat16); the "
                     "tables show float32 only")
    lines += ["", "## 1. Output error: nested vs flat", "",
              "| T | scheme | nested bf16 | flat bf16 | nested/flat bf16 | nested f32 | flat f32 | nested/flat f32 |",
              "|---|---|---|---|---|---|---|---|"]
    for T in Ts:
        fb, ff = find(m, T, FLAT, "flat", BF16), find(m, T, FLAT, "flat", F32)
        for s in schemes:
            nb, nf = find(m, T, s, "nested", BF16), find(m, T, s, "nested", F32)
            cells = []
            for n, f in ((nb, fb), (nf, ff)):
                a, b = (n or {}).get("out_err"), (f or {}).get("out_err")
                ratio = a / b if a is not None and b else None
                cells += [fmt(a), fmt(b), fmt(ratio, ".2f")]
            lines.append(f"| {T} | {s} | " + " | ".join(cells) + " |")
    lines += ["", "## 2. Final-state errors per level and float64 norms", "",
              "| T | scheme | op | dtype | out | " + " | ".join(f"M_{i}" for i in lv) + " | "
              + " | ".join(f"‖M_{i}‖" for i in lv) + " | op s |",
              "|---|---|---|---|---|" + "---|" * (2 * L) + "---|"]
    for T in Ts:
        for s, op in [(s, "nested") for s in schemes] + [(FLAT, "flat")]:
            for variant in (BF16, F32):
                r = find(m, T, s, op, variant)
                if r:
                    lines.append(f"| {T} | {s} | {op} | {variant} | {fmt(r['out_err'])} | "
                                 + " | ".join(fmt(r[f'state_err_l{i}']) for i in lv) + " | "
                                 + " | ".join(fmt(r[f'state_norm_l{i}'], '.3g') for i in lv)
                                 + f" | {fmt(r['wall_s'], '.3f')} |")
    lines += ["", "## 3. Diagnostic: is the bfloat16 loss in the math?", "",
              f"`{SNAP_L1}`: the float64 reference with level 1's snapshots (level-0 chunk-end states) rounded to "
              "bfloat16 and back before the probe, exactly where the optimized bf16 path has them in bfloat16 (fla "
              "stores its chunk states in the input dtype; the end of the last chunk is fla's float32 final state "
              f"and stays unrounded). `{SNAP_ALL}`: every level's snapshot rounded (the optimized path keeps levels "
              "≥ 1 in float32: an upper bound). Errors against the plain float64 reference; next to them the "
              "optimized bf16 op's errors. If the first come close to the second, the bf16 error of the upper "
              "levels is the rounding of the snapshots propagated by the promotion math, not kernel arithmetic.", "",
              "| T | scheme | variant | out | " + " | ".join(f"M_{i}" for i in range(1, L))
              + " | op bf16 out | " + " | ".join(f"op bf16 M_{i}" for i in range(1, L)) + " |",
              "|---|---|---|---|" + "---|" * (2 * (L - 1) + 1)]
    for T in Ts:
        for s in schemes:
            ob = find(m, T, s, "nested", BF16) or {}
            for variant in (SNAP_L1, SNAP_ALL):
                r = find(m, T, s, "nested", variant)
                if r:
                    lines.append(f"| {T} | {s} | {variant} | {fmt(r['out_err'])} | "
                                 + " | ".join(fmt(r[f'state_err_l{i}']) for i in range(1, L))
                                 + f" | {fmt(ob.get('out_err'))} | "
                                 + " | ".join(fmt(ob.get(f'state_err_l{i}')) for i in range(1, L)) + " |")
    lines += ["", "## 4. Time of the float64 references and of drawing the inputs", "",
              "The nested reference runs its plain row and both diagnostic rows in one call (batch of 3). "
              "Inputs: `nested_inputs` on the CPU (float64 masters), then rounded on the device.", "",
              "| T | scheme | op | seconds | µs per token |", "|---|---|---|---|---|"]
    for (T, seed), sec in sorted(meta.get("input_s", {}).items()):
        lines.append(f"| {T} | - | inputs (seed {seed}) | {sec:.1f} | {1e6 * sec / T:.0f} |")
    for T in Ts:
        for s, op in [(FLAT, "flat")] + [(s, "nested") for s in schemes]:
            r = find(m, T, s, op, REF)
            if r and r["wall_s"] is not None:
                lines.append(f"| {T} | {s} | {op} | {r['wall_s']:.1f} | {1e6 * r['wall_s'] / T:.0f} |")
    other = [r for r in rows if r["status"] != "ok" and not r["status"].startswith("skipped: bfloat16")]
    if other:
        lines += ["", "## Skipped, failed or non-finite", "", "| T | scheme | seed | op | variants | status |",
                  "|---|---|---|---|---|---|"]
        groups = {}
        for r in other:
            groups.setdefault((r["T"], r["scheme"], r["seed"], r["op"], r["status"]), []).append(r["variant"])
        lines += [f"| {T} | {s} | {seed} | {op} | {', '.join(vs)} | {status} |"
                  for (T, s, seed, op, status), vs in groups.items()]
    lines += ["", f"Total wall time {meta['total_s']:.0f} s." if "total_s" in meta else ""]
    path = out / "long_context.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


SERIES = [  # (op, variant, label, style) for the figure; nested series get one colour per scheme
    ("nested", BF16, "nested bf16", dict(marker="o", linestyle="-")),
    ("flat", BF16, "flat bf16", dict(marker="s", linestyle="-", color="black")),
    ("nested", SNAP_L1, "ref, bf16 snapshots (level 1)", dict(marker="^", linestyle="--")),
    ("nested", SNAP_ALL, "ref, bf16 snapshots (all levels)", dict(marker="v", linestyle=":")),
    ("nested", F32, "nested f32", dict(marker=".", linestyle="-", alpha=0.4)),
    ("flat", F32, "flat f32", dict(marker=".", linestyle="-", color="gray", alpha=0.4)),
]


def write_plot(out: Path, rows: list, args) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        warnings.warn("matplotlib is not installed: long_context.png not written (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = mean_over_seeds(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, title in ((axes[0], "out_err", "output"), (axes[1], "state_err_l1", "final state of level 1")):
        for op, variant, label, style in SERIES:
            for s in ([FLAT] if op == "flat" else args.schemes):
                pts = [(r["T"], r[key]) for r in m if (r["scheme"], r["op"], r["variant"]) == (s, op, variant)
                       and r[key] is not None and 0 < r[key] < math.inf]
                if pts:
                    pts.sort()
                    colour = {} if op == "flat" else {"color": f"C{args.schemes.index(s) % 10}"}
                    ax.plot(*zip(*pts), label=label if op == "flat" else f"{label}, {s}", **colour, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("‖x − x_ref‖ / ‖x_ref‖ (float64 reference)")
        ax.set_title(f"relative error of the {title}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Nested GDN-2 (L={L}) and flat GDN-2 vs float64, H={args.H}, K=V={args.K}")
    fig.tight_layout()
    path = out / "long_context.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def collect_meta(args, argv) -> dict:
    import triton
    from importlib import metadata

    from ngdn.nested_inputs import bounded_query_counts
    from reference.nested import default_intervals

    try:
        fla = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        fla = "not installed"
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "triton": triton.__version__, "fla": fla,
            "command": "python -m bench.long_context " + " ".join(argv),
            "intervals": default_intervals(L), "query_counts": bounded_query_counts(L, args.K, args.V)}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    cfg = configure(args)
    meta = collect_meta(args, argv)
    from reference.schemes import get_scheme

    for scheme in args.schemes:
        get_scheme(scheme)      # an unknown name fails here, not after the first unit
    log(f"device {cfg['gpu']} (mode {cfg['mode']}), float32 dots {cfg['f32_dots']}, autotune {cfg['autotune']}; "
        f"T {args.T}, schemes {args.schemes}, seeds {args.seeds}, H={args.H}, K=V={args.K}, L={L}")
    if not cfg["bf16"] and not args.quick and not args.T_given:
        print("ngdn bench long-context: no CUDA: the full sizes under the Triton interpreter take hours; "
              "use --quick on a CPU (or name the lengths with --T)", file=sys.stderr)
        return 2
    rows, meta["input_s"] = run(args, cfg)
    meta["total_s"] = time.perf_counter() - t0
    out = Path(args.out)
    written = [write_csv(out, rows), write_markdown(out, rows, args, cfg, meta)]
    if not args.no_plot:
        written.append(write_plot(out, rows, args))
    log(f"done in {meta['total_s']:.0f} s; wrote " + ", ".join(str(p) for p in written if p))
    print((out / "long_context.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
