"""The README's main job (`ngdn check`) and `ngdn errors` run and say what they measured."""
import json
import re

import pytest

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


def test_check_rejects_unknown_component(capsys):
    """A usage error exits 2 (argparse's code), distinct from a tolerance failure (1), before any work."""
    import pytest

    with pytest.raises(SystemExit) as exit_:
        main(["check", "--only", "nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown component(s) ['nope'] for --only" in err and "[ngdn check]" not in err


def test_check_writes_the_error_log(tmp_path, monkeypatch, capsys):
    log = tmp_path / "check.jsonl"
    monkeypatch.setenv("NGDN_ERROR_LOG", str(log))
    assert main(["check", "--only", "fenwick"]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["component"] for r in records} == {"fenwick"}
    assert {"output", "dlevel_scales"} <= {r["quantity"] for r in records}
    assert main(["errors", str(log)]) == 0
    assert "| fenwick" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, r"cannot read .*missing\.jsonl: No such file or directory"),
    ("", r"no records \(an empty error log"),
    ("\n\n", r"no records"),
    ('{"component": "gdn2"\n', r":1: not a JSON line"),
    ('{"component": "gdn2", "mode": "cuda"}\n', r":1: not an error-log record \(missing dtype, quantity, error, "
                                                r"tolerance\)"),
    ("[1, 2]\n", r":1: not an error-log record"),
    ('{"component": "c", "mode": "m", "dtype": "d", "quantity": "q", "error": "x", "tolerance": 1}\n',
     r":1: error and tolerance must be numbers"),
])
def test_errors_refuses_bad_logs(tmp_path, capsys, content, message):
    """A missing, empty or malformed log: one line on stderr naming the file, exit 2, no table."""
    log = tmp_path / "missing.jsonl"
    if content is not None:
        log.write_text(content)
    assert main(["errors", str(log)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ngdn errors: ") and re.search(message, lines[0]), lines


def test_errors_reports_worst_case_and_margin(tmp_path, capsys):
    log = tmp_path / "errors.jsonl"
    rows = [dict(component="gdn2", mode="cuda", dtype="float32", quantity="dq", error=e, tolerance=1e-5)
            for e in (1e-7, 4e-7, 2e-7)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["errors", str(log)]) == 0
    out = capsys.readouterr().out
    assert "4.00e-07" in out and "| 3 " in out and "25x" in out
