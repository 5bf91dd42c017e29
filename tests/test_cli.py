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


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_check_help_describes_every_option_and_lists_the_components(capsys):
    from ngdn import agreement

    out = " ".join(help_text(capsys, "check").split())
    assert "seed of every component's input draw" in out and "dtype of the optimized paths" in out
    assert "components: " + ", ".join(agreement.COMPONENTS) in out, out


def test_errors_help_has_a_description(capsys):
    out = " ".join(help_text(capsys, "errors").split())
    assert "worst observed error per tolerance entry" in out and "NGDN_ERROR_LOG" in out, out


@pytest.mark.parametrize("bench, default_out", [("fenwick-gdn2", "results/<date>-fenwick-gdn2/"),
                                                ("long-context", "results/<date>-long-context/")])
def test_bench_subcommands_name_themselves_and_default_their_output(capsys, bench, default_out):
    out = help_text(capsys, "bench", bench)
    assert out.startswith(f"usage: ngdn bench {bench} [-h] [--out OUT]"), out
    assert default_out in " ".join(out.split()), out


def test_long_context_output_defaults_to_a_dated_results_folder_and_a_smoke_run_to_tmp():
    from bench.long_context import parse_args

    out = parse_args([]).out
    assert re.fullmatch(r"results/\d{4}-\d\d-\d\d-long-context", out), out
    assert parse_args(["--quick"]).out == "results/tmp/long-context-quick"


def test_long_context_full_sizes_are_refused_without_cuda(capsys):
    from bench.long_context import main as long_context_main
    from optimized import triton_mode

    if triton_mode.device() != "cpu":
        pytest.skip("the refusal is the CPU's (the interpreter)")
    assert long_context_main([]) == 2
    assert "use --quick on a CPU" in capsys.readouterr().err


def test_bench_offers_every_registered_scheme(capsys):
    from reference.schemes import SCHEMES

    out = help_text(capsys, "bench")
    assert "{" + ",".join(sorted(SCHEMES)) + "}" in out and "bounded_erase" in out, out


def test_bench_recall_dispatches_to_its_module(monkeypatch):
    """`ngdn bench recall ARGS` calls `bench.recall.main(ARGS)` (imported only then)."""
    import sys
    import types

    seen = []
    fake = types.ModuleType("bench.recall")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "bench.recall", fake)
    assert main(["bench", "recall", "--quick", "--out", "x"]) == 0
    assert seen == [["--quick", "--out", "x"]]


def test_bench_help_lists_its_subcommands_with_ngdn_examples_and_every_option_helped(capsys):
    """`ngdn bench --help`: one line per subcommand, examples that say `ngdn bench`, help on every option."""
    from bench import SUBCOMMANDS
    from bench.nested_vs_flat import parse_args

    out = help_text(capsys, "bench")
    for name in SUBCOMMANDS:
        assert re.search(rf"^  {re.escape(name)} +\S", out, flags=re.M), (name, out)
    assert "python -m bench" not in out and "    ngdn bench --quick" in out, out
    import argparse

    seen = {}
    real_add = argparse.ArgumentParser.add_argument

    def add(self, *names, **kwargs):
        seen[names] = kwargs.get("help")
        return real_add(self, *names, **kwargs)

    argparse.ArgumentParser.add_argument = add
    try:
        parse_args([])
    finally:
        argparse.ArgumentParser.add_argument = real_add
    unhelped = [names for names, text in seen.items() if not text and "-h" not in names]
    assert not unhelped, unhelped


def test_long_context_f32_dots_default_is_the_test_suites(capsys):
    """The help's default is the one the option has, and it is the suite's (NGDN_F32_DOTS=tf32x3);
    the choices are the float32-accurate precisions `optimized` knows, plus plain tf32."""
    from bench.long_context import F32_DOTS, parse_args
    from optimized import triton_mode

    assert parse_args([]).f32_dots == "tf32x3" and set(F32_DOTS) == set(triton_mode.F32_DOTS)
    out = " ".join(help_text(capsys, "bench", "long-context").split())
    assert "(default tf32x3, as the test suite" in out and "default ieee" not in out, out


def test_scheme_check_help_describes_itself_its_properties_and_its_examples(capsys):
    from ngdn import scheme_check

    out = " ".join(help_text(capsys, "scheme", "check").split())
    assert "The promotion-scheme battery" in out and "Exit 0" in out, out
    assert "properties: " + ", ".join(scheme_check.PROPERTY_NAMES) in out, out
    assert "optimized 1" in out and "stability 120" in out and "contract 30" in out, out
    assert "(default 30)" in out and "per property (default 30)" not in out, out


def test_bare_scheme_is_a_usage_message_naming_the_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["scheme"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "scheme_command" not in err and "usage: ngdn scheme" in err and "ngdn scheme check FILE.py" in err, err
