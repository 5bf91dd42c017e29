"""scripts/sensitivity_factor_needed.py reads a raised-factor error log back into the factor each
comparison needed: bound = q + factor × e_inj, needed = (error - q) / e_inj."""
import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sensitivity_factor_needed.py"


def test_needed_factor_from_a_raised_bound(tmp_path, capsys):
    q = 0.05                                     # nested cuda bfloat16 dk (tolerances.yaml)
    log = tmp_path / "errors.jsonl"
    rows = [dict(component="nested", mode="cuda", dtype="bfloat16", quantity="dk", error=0.09,
                 tolerance=q + 1000 * 0.02),      # e_inj 0.02: needs (0.09 - 0.05) / 0.02 = 2
            dict(component="nested", mode="cuda", dtype="bfloat16", quantity="dk", error=0.01,
                 tolerance=q + 1000 * 0.001),     # under q: needs nothing
            dict(component="nested", mode="cuda", dtype="float32", quantity="dk", error=1.0, tolerance=1.0)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert runpy.run_path(str(SCRIPT))["main"]([str(log), "--factor", "1000"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| nested | dk"))
    assert line == "| nested | dk | 2 | 0.09 | 1 | 2 | 0.02 |"
