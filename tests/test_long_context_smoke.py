"""CPU smoke test of the long-context accuracy sweep (bench/long_context.py): one short run
under the Triton interpreter (float32 only, bfloat16 rows skipped), the time guard, and the
pieces of the bf16-snapshot diagnostic (which firing stays unrounded, the stacked reference)."""
from __future__ import annotations

import csv

import pytest
import torch

from bench import long_context as lc
from optimized import triton_mode

cpu_only = pytest.mark.skipif(triton_mode.configure() == triton_mode.CUDA,
                              reason="CPU smoke run (new kernel sizes would compile on CUDA); on a GPU run "
                                     "`python -m bench.long_context --quick --out DIR`")


def read_rows(path):
    with open(path) as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.fixture
def env(monkeypatch):
    """``main`` sets these before importing ``optimized``; restore them afterwards."""
    monkeypatch.setenv("NGDN_PIN_AUTOTUNE", "1")
    monkeypatch.setenv("NGDN_IEEE_F32", "1")


@cpu_only
def test_quick_run_writes_csv_markdown_plot(tmp_path, env):
    from reference.schemes import SCHEMES

    registered = set(SCHEMES)
    out = tmp_path / "lc"
    assert lc.main(["--quick", "--T", "64", "--out", str(out)]) == 0     # one chunk: ~20 s on a CPU
    assert set(SCHEMES) == registered                      # the temporary schemes are gone
    columns, rows = read_rows(out / "long_context.csv")
    assert columns == lc.COLUMNS
    assert sorted((r["op"], r["variant"]) for r in rows) == sorted(
        [("flat", v) for v in (lc.REF, lc.BF16, lc.F32)]
        + [("nested", v) for v in (lc.REF, lc.SNAP_L1, lc.SNAP_ALL, lc.BF16, lc.F32)])
    assert all(r["T"] == "64" and r["seed"] == "0" and (r["K"], r["V"]) == ("32", "32") for r in rows)
    by = {(r["op"], r["variant"]): r for r in rows}
    assert by[("nested", lc.REF)]["scheme"] == "learned" and by[("flat", lc.REF)]["scheme"] == lc.FLAT

    for op, n_levels in (("flat", 1), ("nested", lc.L)):
        f32 = by[(op, lc.F32)]
        assert f32["status"] == "ok" and float(f32["wall_s"]) > 0
        errs = [float(f32["out_err"])] + [float(f32[f"state_err_l{i}"]) for i in range(n_levels)]
        assert all(0 <= e < 1e-3 for e in errs), errs
        assert by[(op, lc.BF16)]["status"].startswith("skipped: bfloat16 needs CUDA")
        norms = [float(by[(op, lc.REF)][f"state_norm_l{i}"]) for i in range(n_levels)]
        assert all(0 < x < 1e3 for x in norms), norms

    # T = 64: level 1's one firing probes the end of the last chunk, which the optimized bf16 path
    # reads from fla's float32 final state: both diagnostic rows equal the plain reference
    # (rounded firings: test_stacked_reference_rows).
    for variant in (lc.SNAP_L1, lc.SNAP_ALL):
        r = by[("nested", variant)]
        assert r["status"] == "ok" and r["wall_s"] == ""
        assert [float(r[k]) for k in ["out_err"] + [f"state_err_l{i}" for i in range(lc.L)]] == [0.0] * (1 + lc.L)

    md = (out / "long_context.md").read_text()
    for text in ("## 1. Output error: nested vs flat", "## 2. Final-state errors", "## 3. Diagnostic",
                 "## 4. Time of the float64 references", "bfloat16 rows are skipped", "| 64 | learned |"):
        assert text in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "long_context.png").stat().st_size > 0


def test_time_budget_skips_and_marks_rows(tmp_path, env):
    out = tmp_path / "lc"
    argv = ["--quick", "--T", "64", "128", "--schemes", "learned", "bounded_erase", "--time-budget", "0",
            "--no-plot", "--out", str(out)]
    assert lc.main(argv) == 0
    _, rows = read_rows(out / "long_context.csv")
    assert len(rows) == 2 * (3 + 2 * 5)                     # per T: flat 3 rows, each scheme 5
    assert all(r["status"].startswith("skipped: time budget 0 s") and r["out_err"] == "" for r in rows)
    assert "## Skipped, failed or non-finite" in (out / "long_context.md").read_text()


def test_budget_projects_from_seconds_per_token():
    budget = lc.Budget(100.0)
    assert budget.refuses(["nested"], 10 ** 9) is None      # nothing measured yet: no projection
    budget.note("nested", 10.0, 1000)                       # 10 ms per token
    assert budget.refuses(["nested"], 5000) is None         # ~50 s more: fits
    assert "projected" in budget.refuses(["nested"], 20000)  # ~200 s more: skipped
    assert lc.Budget(None).refuses(["nested"], 10 ** 9) is None


def test_last_chunk_firing():
    """Which firing of a level probes the end of the last chunk (fla's float32 final state)."""
    assert lc.last_chunk_firing(128, 1) == 2
    assert lc.last_chunk_firing(256, 2) == 2
    assert lc.last_chunk_firing(64, 1) == 1
    assert lc.last_chunk_firing(130, 1) is None             # partial last chunk: never fires
    assert lc.last_chunk_firing(192, 2) is None             # 3 chunks, level fires at chunk 2 only


def test_stacked_reference_rows():
    """Row 0 of the stacked call is the plain float64 reference; the rounded rows share level 0
    and differ from row 0 only where a snapshot was rounded."""
    from reference import naive_nested_gdn2

    inp = lc.draw_inputs(128, 3, 1, 16, 16, "cpu")
    _, levels64 = inp.levels("bounded_erase")
    o3, M3 = lc.stacked_reference(inp, levels64)
    with torch.no_grad():
        o, M = naive_nested_gdn2(**inp.acts, levels=levels64, initial_states=inp.states, output_final_state=True)
    torch.testing.assert_close(o3[:1], o, rtol=1e-13, atol=1e-13)
    for ℓ in range(lc.L):
        torch.testing.assert_close(M3[ℓ][:1], M[ℓ], rtol=1e-13, atol=1e-13)
    # bit for bit: rows of one batched float64 call on the same values (equal-sized rows), level 0
    # never rounded: every op treats each row alike
    assert torch.equal(M3[0][1], M3[0][0]) and torch.equal(M3[0][2], M3[0][0])
    assert not torch.equal(M3[1][1], M3[1][0])              # level 1's first firing probed a rounded state
    assert not torch.equal(M3[2][2], M3[2][1])              # level 2 rounds only in the all-levels row
    # T = 64: level 1's only firing probes the last chunk's end, which stays unrounded
    short = lc.draw_inputs(64, 3, 1, 16, 16, "cpu")
    o3, M3 = lc.stacked_reference(short, short.levels("learned")[1])
    assert torch.equal(o3[1], o3[0]) and torch.equal(M3[1][1], M3[1][0])    # one batched call, as above


def test_ngdn_bench_long_context_is_the_sweep(capsys):
    """`ngdn bench long-context` reaches this sweep (the sweep lives in `ngdn bench`)."""
    import pytest

    from ngdn.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "long-context", "--help"])
    assert exit_info.value.code == 0
    assert "--time-budget" in capsys.readouterr().out
