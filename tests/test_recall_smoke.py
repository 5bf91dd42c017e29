"""``bench.recall`` (``ngdn bench recall``) end to end at a size far below ``--quick``: one layer,
one 64-token context, one training step, the ``learned`` nested arm and the flat arm; then the
files and columns it writes, and ``--plot-only`` on that CSV (the plot, or matplotlib's absence
noted); then, with stand-in models, that a run whose loss goes non-finite or that raises is recorded
in the status column and the other runs still go. About 15–25 s on a 2-core CPU (Triton interpreter)."""
import csv
import math

import pytest

from bench import recall

TINY = ["--quick", "--arms", "learned", "flat", "--T", "64", "--steps", "1", "--eval-sequences", "1",
        "--levels", "2", "--no-plot"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recall")
    assert recall.main(TINY + ["--out", str(out)]) == 0
    return out


def test_recall_writes_csv_and_markdown(run):
    with open(run / "recall.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == recall.COLUMNS
    assert [(r["arm"], r["T"], r["step"], r["status"]) for r in rows] == [("learned", "64", "1", "ok"),
                                                                          ("flat", "64", "1", "ok")]
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and float(r["loss"]) > 0
        assert float(r["tokens_per_s"]) > 0
        assert int(r["state_size"]) == 2 * 1 * 16 * 16      # L·H·K·V, the same for both arms
    nested, flat = rows
    assert float(nested["top_state_norm"]) > 0 and flat["top_state_norm"] == ""
    md = (run / "recall.md").read_text()
    for title in ("Accuracy at the last step", "Training tokens per second", "Top level's final state norm",
                  "Accuracy against training steps, T = 64"):
        assert title in md
    assert "| learned |" in md and "| flat |" in md


def test_recall_plot_only(run, capsys):
    assert recall.main(["--plot-only", str(run / "recall.csv")]) == 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in capsys.readouterr().out
    else:
        assert (run / "recall.png").stat().st_size > 0


def test_recall_refuses_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        recall.main(["--quick", "--steps", "0"])
    with pytest.raises(ValueError, match="unknown scheme"):
        recall.main(TINY[:1] + ["--arms", "nope", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="too short"):
        recall.main(["--quick", "--T", "8", "--out", str(tmp_path)])


def test_recall_records_a_failed_run_and_goes_on(tmp_path, monkeypatch):
    """``learned``'s model emits NaN logits, ``merge``'s construction raises; ``flat`` must still
    train, each failure is a row with its status, and the exit code says that a run failed."""
    import torch

    from bench.recall_model import RecallModel

    class Mixer(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.proj = torch.nn.Linear(d, d)

        def forward(self, x):
            return self.proj(x), None, None

    class NaNModel(RecallModel):
        def forward(self, tokens):
            return super().forward(tokens) * float("nan")

    def make_model(args, arm, device):
        if arm == "merge":
            raise RuntimeError("planted failure")
        cls = NaNModel if arm == "learned" else RecallModel
        return cls(args.vocab, args.d_model, 1, lambda i: Mixer(args.d_model)).to(device), 1

    monkeypatch.setattr(recall, "make_model", make_model)
    argv = ["--quick", "--arms", "learned", "merge", "flat", "--T", "64", "--steps", "2", "--eval-every", "1",
            "--no-plot", "--out", str(tmp_path)]
    assert recall.main(argv) == 1
    rows = recall.read_csv(tmp_path / "recall.csv")
    assert [(r["arm"], r["step"], r["status"]) for r in rows] == [
        ("learned", 1, "non-finite loss"), ("merge", 0, "error (RuntimeError)"), ("flat", 1, "ok"), ("flat", 2, "ok")]
    assert math.isnan(rows[0]["loss"]) and all(math.isfinite(r["loss"]) for r in rows[2:])
    md = (tmp_path / "recall.md").read_text()
    assert "(non-finite loss)" in md and "(error (RuntimeError))" in md
