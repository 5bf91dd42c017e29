"""The README's main job (`ngdn check`) and `ngdn errors` run and say what they measured."""
import json
import re

from ngdn.cli import main


def test_check_prints_a_table_and_passes(capsys):
    assert main(["check", "--only", "fenwick"]) == 0
    out = capsys.readouterr().out
    assert "| quantity" in out and "dlevel_scales" in out and "all within tolerance" in out


def test_check_shows_progress_on_stderr_only(capsys):
    assert main(["check", "--only", "fenwick"]) == 0
    captured = capsys.readouterr()
    assert "[ngdn check]" not in captured.out
    before, after = [line for line in captured.err.splitlines() if line.startswith("[ngdn check]")]
    assert before == "[ngdn check] 1/1 fenwick float32 ..."
    assert re.fullmatch(r"\[ngdn check\] 1/1 fenwick float32 \.\.\. \d+\.\d s", after), after


def test_check_rejects_unknown_component():
    import pytest

    with pytest.raises(SystemExit, match="unknown component"):
        main(["check", "--only", "nope"])


def test_errors_reports_worst_case_and_margin(tmp_path, capsys):
    log = tmp_path / "errors.jsonl"
    rows = [dict(component="gdn2", mode="cuda", dtype="float32", quantity="dq", error=e, tolerance=1e-5)
            for e in (1e-7, 4e-7, 2e-7)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["errors", str(log)]) == 0
    out = capsys.readouterr().out
    assert "4.00e-07" in out and "| 3 " in out and "25x" in out
