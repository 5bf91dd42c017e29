"""Associative recall (MQAR) with Nested GDN-2 against flat GDN-2: ``ngdn bench recall``.

For every arm and context length T a small model (``bench.recall_model.RecallModel``: 2
blocks by default, ``d_model`` wide) is trained from a fixed seed on multi-query associative recall
(``bench.recall_model.mqar_batch``: ``kv_pairs`` key-value pairs, then one query of one of their
keys per ``query_every`` tokens, uniform over the rest of the sequence, the answer not echoed;
loss and accuracy on the answers only). Arms:

- ``learned``, ``merge``, ``bounded_erase`` (and every scheme a ``--scheme FILE.py`` registers):
  ``layers.NestedGDN2`` with ``L`` levels of ``H`` heads, that promotion scheme at every level;
- ``flat``: ``layers.GDN2`` with ``L·H`` heads of the same K × V: the same recurrent state size
  (``L·H·K·V`` per sequence and layer; the layer's docstring says what else differs).

Every arm sees the same batches (data seed) and starts from the same seed. Each run keeps
``--batch-tokens`` tokens per step (B = batch_tokens / T), so a step costs about the same at
every T. Reported per arm and T: accuracy and loss on a fixed held-out batch every
``--eval-every`` steps (accuracy against training steps) and at the end (against T), training
tokens per second (after the first ``WARMUP_STEPS`` steps, which include Triton compilation),
and for nested arms the norm of the top level's final state on the held-out batch (per layer,
mean over sequences of ``‖M_{L-1}‖_F``; a scheme that amplifies its state shows here).

Writes ``OUT/recall.csv`` (one row per evaluation; rewritten after every run, so a run cut
short keeps what it measured), ``OUT/recall.md`` and ``OUT/recall.png`` (matplotlib, if
installed; ``--plot-only OUT/recall.csv`` draws it later from the CSV on any machine).

    python -m bench.recall                  # default size, one H200 (see DEFAULT_* below)
    python -m bench.recall --quick          # CPU (Triton interpreter): 1 layer, T 64 and 128, 3 steps
                                            # (minutes: too short to learn, it exercises the whole path)
    python -m bench.recall --scheme my_scheme.py --arms flat learned
    python -m bench.recall --plot-only results/tmp/recall/recall.csv

Default size and its time on one H200 (measured: ``results/2026-12-01-recall-h200-learning/``,
299 s for the benchmark): d_model 128, 2 layers, H = 2 heads per level, K = V = 64, L = 4 (flat:
8 heads), vocab 64 (31 keys and 31 values: chance accuracy 1/31 ≈ 0.032), 4 key-value pairs,
one query per 8 tokens (63 answers per sequence at T = 512, 1023 at T = 8192), T in {512, 2048,
8192}, 32768 tokens per step, 500 steps, lr 3e-3. At that size a model learns the task at T = 512 within the 500 steps (flat and
``learned`` near 1.0 accuracy); the first default (vocab 8192, 64 pairs, one query per key, 250
steps) left every arm at chance (``results/2026-12-01-recall-h200/``). ``--time-budget`` (default
540 s) skips the remaining runs once the budget is spent or the next run is projected to exceed it.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import traceback
from pathlib import Path

DEFAULT_ARMS = ("learned", "merge", "bounded_erase", "flat")
DEFAULT_T = (512, 2048, 8192)
WARMUP_STEPS = 2
COLUMNS = ("arm", "scheme", "T", "step", "train_tokens", "loss", "accuracy", "tokens_per_s", "top_state_norm",
           "state_size", "params", "seconds", "status")
SIZES = {   # the defaults of the command-line options, per size
    "default": dict(layers=2, d_model=128, heads=2, head_dim=64, levels=4, vocab=64, kv_pairs=4, query_every=8,
                    T=DEFAULT_T, batch_tokens=32768, steps=500, eval_every=50, eval_sequences=16, lr=3e-3),
    # quick: one sequence per step, one layer; under the interpreter a nested layer's forward and
    # backward cost seconds per 64-token chunk, so this is a smoke-sized run, not a learning one.
    "quick": dict(layers=1, d_model=32, heads=1, head_dim=16, levels=3, vocab=64, kv_pairs=4, query_every=8,
                  T=(64, 128), batch_tokens=64, steps=3, eval_every=3, eval_sequences=1, lr=3e-3),
}


def log(msg: str) -> None:
    print(f"[bench recall] {msg}", file=sys.stderr, flush=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(prog="ngdn bench recall", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a CPU run of a few minutes")
    p.add_argument("--out", default=None, help="output folder (default results/tmp/recall[-quick])")
    p.add_argument("--arms", nargs="+", default=None,
                   help=f"arms to run: scheme names and/or 'flat' (default {' '.join(DEFAULT_ARMS)} + --scheme's)")
    p.add_argument("--scheme", action="append", default=[], metavar="FILE.py",
                   help="a file that registers promotion schemes; each becomes an arm (repeatable)")
    p.add_argument("--T", nargs="+", type=positive_int, default=None, help="context lengths")
    p.add_argument("--steps", type=positive_int, default=None)
    p.add_argument("--eval-every", type=positive_int, default=None)
    p.add_argument("--batch-tokens", type=positive_int, default=None, help="tokens per step (B = this / T, >= 1)")
    p.add_argument("--eval-sequences", type=positive_int, default=None, help="held-out sequences per evaluation")
    p.add_argument("--kv-pairs", type=positive_int, default=None)
    p.add_argument("--vocab", type=positive_int, default=None)
    p.add_argument("--query-every", type=positive_int, default=None,
                   help="one query per this many tokens after the pairs (>= 2; at least one per key; "
                        ">= T: each key queried once, as Zoology)")
    p.add_argument("--filler", choices=("pad", "noise"), default="pad")
    p.add_argument("--layers", type=positive_int, default=None, help="blocks of the model (default 2)")
    p.add_argument("--d-model", type=positive_int, default=None)
    p.add_argument("--heads", type=positive_int, default=None, help="heads per level (flat: levels × heads)")
    p.add_argument("--head-dim", type=positive_int, default=None, help="K = V")
    p.add_argument("--levels", type=positive_int, default=None, help="L")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget", type=float, default=540.0, help="seconds; later runs are skipped past it")
    p.add_argument("--autotune", action="store_true", help="let Triton autotune (default: pinned, less compiling)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--plot-only", metavar="CSV", default=None, help="only draw the plot from a recall.csv")
    args = p.parse_args(argv)
    size = SIZES["quick" if args.quick else "default"]
    for key, value in size.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.T = list(args.T)
    if args.out is None:
        args.out = os.path.join("results", "tmp", "recall-quick" if args.quick else "recall")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        p.error(f"--lr must be a positive number, got {args.lr}")
    if args.eval_every > args.steps:
        args.eval_every = args.steps
    return args


# --- setup ------------------------------------------------------------------------------

def configure(args) -> dict:
    """Kernel settings before ``optimized`` is imported (pinned autotuners unless ``--autotune``)."""
    if not args.autotune:
        os.environ.setdefault("NGDN_PIN_AUTOTUNE", "1")
    import torch

    import optimized

    cuda = optimized.MODE == optimized.triton_mode.CUDA
    if not cuda:
        torch.set_num_threads(1)   # tiny ops on a few cores: intra-op threads only contend
    return {"mode": optimized.MODE, "device": optimized.triton_mode.device(), "cuda": cuda,
            "gpu": torch.cuda.get_device_name() if cuda else "none (CPU, Triton interpreter)",
            "dtype": "bfloat16 autocast, float32 parameters" if cuda else "float32"}


def free_device_memory(cfg) -> None:
    import gc

    import torch

    gc.collect()
    if cfg["cuda"]:
        torch.cuda.empty_cache()


def resolve_arms(args) -> list[str]:
    from ngdn.scheme_check import load_scheme_file
    from reference.schemes import get_scheme

    added = []
    for source in args.scheme:
        names = load_scheme_file(source)
        if not names:
            raise SystemExit(f"ngdn bench recall: --scheme {source} registered no scheme")
        added += names
    arms = list(args.arms) if args.arms is not None else list(DEFAULT_ARMS) + added
    for arm in arms:
        if arm != "flat":
            get_scheme(arm)       # an unknown name fails before any training
    return arms


def make_model(args, arm: str, device):
    import torch

    from bench.recall_model import RecallModel
    from layers import GDN2, NestedGDN2

    torch.manual_seed(args.seed)
    H, K, L = args.heads, args.head_dim, args.levels
    if arm == "flat":
        make = lambda i: GDN2(args.d_model, num_heads=L * H, head_dim=K, layer_idx=i)  # noqa: E731
    else:
        make = lambda i: NestedGDN2(args.d_model, num_heads=H, head_dim=K, num_levels=L, scheme=arm,  # noqa: E731
                                    layer_idx=i)
    model = RecallModel(args.vocab, args.d_model, args.layers, make).to(device)
    return model, model.blocks[0].mixer.state_size()


def optimizer_for(model, lr: float, steps: int):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or getattr(p, "_no_weight_decay", False) or "embed" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    return opt, sched


# --- one run ------------------------------------------------------------------------------

def train_one(args, cfg, arm: str, T: int, rows: list) -> None:
    """Train one arm at one T, appending its evaluation rows to ``rows`` as they are made (the
    last one with tokens/s and state norm). A non-finite training loss ends the run with a
    ``non-finite loss`` row (the top state norm of the model that produced it, for nested arms);
    a non-finite held-out loss marks its row ``non-finite held-out loss`` and training goes on."""
    import torch

    from bench.recall_model import Vocab, loss_and_accuracy, mqar_batch
    from optimized.checks import finite_checks

    dev, cuda = cfg["device"], cfg["cuda"]
    vocab = Vocab(args.vocab, args.filler)
    B = max(1, args.batch_tokens // T)
    model, state_size = make_model(args, arm, dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt, sched = optimizer_for(model, args.lr, args.steps)
    data = torch.Generator().manual_seed(args.seed * 1000 + T)
    held = torch.Generator().manual_seed(10 ** 6 + args.seed * 1000 + T)
    eval_tokens, eval_labels = (t.to(dev) for t in mqar_batch(args.eval_sequences, T, args.kv_pairs, vocab, held,
                                                              args.query_every))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    scheme = "" if arm == "flat" else arm

    def evaluate():
        model.eval()
        with torch.no_grad(), autocast:
            losses, accs = [], []
            for i in range(0, args.eval_sequences, max(1, B)):
                loss, acc = loss_and_accuracy(model(eval_tokens[i:i + B]), eval_labels[i:i + B])
                losses.append(loss.item())
                accs.append(acc.item())
        model.train()
        return sum(losses) / len(losses), sum(accs) / len(accs)

    def top_state_norm():
        if not scheme:
            return None
        with torch.no_grad(), autocast:
            norms = model.top_state_norms(eval_tokens[:B])
        if not norms:
            return None
        return float("nan") if any(math.isnan(n) for n in norms) else max(norms)   # max() would skip a nan

    t_start, timed_s, timed_tokens = time.perf_counter(), 0.0, 0
    with finite_checks(False):
        for step in range(1, args.steps + 1):
            tokens, labels = (t.to(dev, non_blocking=True)
                              for t in mqar_batch(B, T, args.kv_pairs, vocab, data, args.query_every))
            t0 = time.perf_counter()
            with autocast:
                loss, _ = loss_and_accuracy(model(tokens), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if not math.isfinite(loss.item()):      # before the update: the model that made it is kept
                norm = top_state_norm()
                rows.append(row(arm, scheme, T, step, step * B * T, float("nan"), float("nan"), None, norm,
                                state_size, n_params, time.perf_counter() - t_start, "non-finite loss"))
                log(f"{arm:>14} T={T:<6} step {step:>5}/{args.steps}: non-finite training loss ({loss.item()}); "
                    f"run stopped" + ("" if norm is None else f", top state norm {norm:.3g}"))
                return
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if cuda:
                torch.cuda.synchronize()
            if step > WARMUP_STEPS or args.steps <= WARMUP_STEPS:
                timed_s += time.perf_counter() - t0
                timed_tokens += B * T
            if step % args.eval_every == 0 or step == args.steps:
                ev_loss, ev_acc = evaluate()
                rows.append(row(arm, scheme, T, step, step * B * T, ev_loss, ev_acc,
                                timed_tokens / timed_s if timed_s > 0 else None, None, state_size, n_params,
                                time.perf_counter() - t_start,
                                "ok" if math.isfinite(ev_loss) else "non-finite held-out loss"))
                log(f"{arm:>14} T={T:<6} step {step:>5}/{args.steps}: loss {ev_loss:.3f} acc {ev_acc:.3f} "
                    f"({time.perf_counter() - t_start:.1f} s)")
        rows[-1]["top_state_norm"] = top_state_norm()


def row(arm, scheme, T, step, train_tokens, loss, accuracy, tokens_per_s, top_state_norm, state_size, params,
        seconds, status) -> dict:
    return {"arm": arm, "scheme": scheme, "T": T, "step": step, "train_tokens": train_tokens, "loss": loss,
            "accuracy": accuracy, "tokens_per_s": tokens_per_s, "top_state_norm": top_state_norm,
            "state_size": state_size, "params": params, "seconds": seconds, "status": status}


# --- reports ------------------------------------------------------------------------------

def fmt(value, spec: str) -> str:
    if value is None or value == "":
        return ""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(value) else format(value, spec)


def write_csv(out: Path, rows: list[dict]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recall.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    return path


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: not a recall.csv (missing columns {missing})")
    for r in rows:
        for key in ("T", "step", "train_tokens", "state_size", "params"):
            r[key] = int(r[key]) if r[key] not in ("", None) else None
        for key in ("loss", "accuracy", "tokens_per_s", "top_state_norm", "seconds"):
            r[key] = float(r[key]) if r[key] not in ("", None) else None
    return rows


def finals(rows) -> dict:
    """``{(arm, T): last row}``."""
    last = {}
    for r in rows:
        last[(r["arm"], r["T"])] = r
    return last


def write_markdown(out: Path, rows: list[dict], meta: dict) -> Path:
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    Ts = sorted({r["T"] for r in rows})
    last = finals(rows)
    lines = ["# Associative recall (MQAR): Nested GDN-2 schemes vs flat GDN-2", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines.append("")

    def table(title, value):
        lines.extend([f"## {title}", "", "| arm | " + " | ".join(f"T={T}" for T in Ts) + " |",
                      "|---|" + "---|" * len(Ts)])
        for arm in arms:
            lines.append(f"| {arm} | " + " | ".join(value(last.get((arm, T))) for T in Ts) + " |")
        lines.append("")

    table("Accuracy at the last step (answers only)",
          lambda r: "" if r is None else (fmt(r["accuracy"], ".3f") + ("" if r["status"] == "ok" else f" ({r['status']})")))
    table("Held-out loss at the last step", lambda r: "" if r is None else fmt(r["loss"], ".3f"))
    table("Training tokens per second", lambda r: "" if r is None else fmt(r["tokens_per_s"], ".3g"))
    table("Top level's final state norm (nested arms; max over layers)",
          lambda r: "" if r is None else fmt(r["top_state_norm"], ".3g"))
    for T in Ts:
        steps = sorted({r["step"] for r in rows if r["T"] == T})
        lines.extend([f"## Accuracy against training steps, T = {T}", "",
                      "| arm | " + " | ".join(str(s) for s in steps) + " |", "|---|" + "---|" * len(steps)])
        for arm in arms:
            by_step = {r["step"]: r for r in rows if r["arm"] == arm and r["T"] == T}
            lines.append(f"| {arm} | " + " | ".join(fmt(by_step[s]["accuracy"], ".3f") if s in by_step else ""
                                                    for s in steps) + " |")
        lines.append("")
    path = out / "recall.md"
    path.write_text("\n".join(lines))
    return path


def write_plot(out: Path, rows: list[dict]):
    """``recall.png``: accuracy against T, accuracy against steps (largest T), tokens/s against T."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench recall] matplotlib is not installed: no plot (run `--plot-only recall.csv` where it is)")
        return None
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    Ts = sorted({r["T"] for r in rows})
    last = finals(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm in arms:
        style = dict(marker="o", linestyle="--" if arm == "flat" else "-", label=arm)
        xs = [T for T in Ts if (arm, T) in last and last[(arm, T)]["accuracy"] is not None]
        axes[0].plot(xs, [last[(arm, T)]["accuracy"] for T in xs], **style)
        tp = [T for T in xs if last[(arm, T)]["tokens_per_s"]]
        axes[2].plot(tp, [last[(arm, T)]["tokens_per_s"] for T in tp], **style)
        curve = [r for r in rows if r["arm"] == arm and r["T"] == Ts[-1] and r["accuracy"] is not None]
        axes[1].plot([r["step"] for r in curve], [r["accuracy"] for r in curve], **style)
    axes[0].set(xscale="log", xlabel="context length T", ylabel="recall accuracy", title="accuracy at the last step")
    axes[1].set(xlabel="training step", ylabel="recall accuracy", title=f"accuracy against steps, T = {Ts[-1]}")
    axes[2].set(xscale="log", yscale="log", xlabel="context length T", ylabel="tokens / s",
                title="training throughput")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = out / "recall.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- main ---------------------------------------------------------------------------------

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.plot_only:
        rows = read_csv(args.plot_only)
        if not rows:
            raise SystemExit(f"ngdn bench recall: {args.plot_only} holds no rows")
        out = Path(args.out if "--out" in argv else Path(args.plot_only).parent)
        out.mkdir(parents=True, exist_ok=True)
        path = write_plot(out, rows)
        if path:
            print(f"wrote {path}")
        return 0
    t0 = time.perf_counter()
    cfg = configure(args)
    arms = resolve_arms(args)
    from bench.recall_model import Vocab, check_mqar, n_queries

    vocab = Vocab(args.vocab, args.filler)
    for T in args.T:
        check_mqar(T, args.kv_pairs, vocab, args.query_every)
    if not cfg["cuda"] and not args.quick:
        log("WARNING: no CUDA: the default size under the Triton interpreter takes days; use --quick on a CPU")
    meta = {"device": cfg["gpu"], "mode": cfg["mode"], "dtype": cfg["dtype"],
            "model": f"{args.layers} layers, d_model {args.d_model}, vocab {args.vocab}",
            "nested": f"L = {args.levels} levels × H = {args.heads} heads, K = V = {args.head_dim}",
            "flat": f"{args.levels * args.heads} heads, K = V = {args.head_dim} (same state size)",
            "task": (f"{args.kv_pairs} key-value pairs, then one query per {args.query_every} tokens "
                     f"({', '.join(f'{n_queries(T, args.kv_pairs, args.query_every)} at T = {T}' for T in args.T)} "
                     f"per sequence), filler {args.filler}, {args.batch_tokens} tokens per step"),
            "training": f"{args.steps} steps, AdamW lr {args.lr}, warmup 10 % + cosine, seed {args.seed}",
            "command": "python -m bench.recall " + " ".join(argv)}
    log(f"device {cfg['gpu']}; arms {arms}; T {args.T}; {args.steps} steps each")
    out = Path(args.out)
    rows, run_s, errors = [], [], 0
    for T in args.T:
        for arm in arms:
            spent = time.perf_counter() - t0
            projected = spent + (max(run_s) if run_s else 0.0)   # a step costs about the same at every T
            if spent > args.time_budget or projected > args.time_budget:
                log(f"{arm} T={T}: skipped (time budget {args.time_budget:.0f} s; spent {spent:.0f} s)")
                rows.append(row(arm, "" if arm == "flat" else arm, T, 0, 0, None, None, None, None, None, None, 0.0,
                                "skipped (time budget)"))
                continue
            start, run = time.perf_counter(), []
            try:
                train_one(args, cfg, arm, T, run)
            except Exception as e:          # one run's failure (an error, out of memory) ends that run only
                errors += 1
                log(f"{arm} T={T}: failed, {type(e).__name__}: {e}\n" + traceback.format_exc())
                run.append(row(arm, "" if arm == "flat" else arm, T, run[-1]["step"] if run else 0,
                               run[-1]["train_tokens"] if run else 0, None, None, None, None, None, None,
                               time.perf_counter() - start, f"error ({type(e).__name__})"))
                free_device_memory(cfg)
            rows += run
            run_s.append(time.perf_counter() - start)
            write_csv(out, rows)
    meta["total seconds"] = f"{time.perf_counter() - t0:.0f}"
    written = [write_csv(out, rows), write_markdown(out, rows, meta)]
    if not args.no_plot:
        written.append(write_plot(out, rows))
    log("wrote " + ", ".join(str(p) for p in written if p))
    print((out / "recall.md").read_text())
    if errors:
        log(f"{errors} run(s) failed with an error (status column; the tracebacks are above)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
