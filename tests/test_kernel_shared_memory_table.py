"""The committed table of our Triton kernels' shared memory per GPU architecture
(``docs/kernel-shared-memory.md`` and its JSON, made by ``scripts/kernel_shared_memory.py``) is
current, and says that every launch fits sm_80, sm_89 and sm_90, falls back to a form that fits, or
is refused by its op first.

Current: every row's fingerprint (the kernel's source and helpers, argument types, constexprs,
warps, stages, the launcher's source, the architecture) is recomputed here without compiling, from
the launchers' own block choices; a changed kernel, block choice or fallback order names its rows
and the command that regenerates them. A sample (a default form of each module's first kernel, the
three architectures in turn) is compiled in a subprocess (Triton compiles for CUDA there, not under
this process's interpreter) and checked against the recorded bytes. Each check is also shown to fail on a planted change."""
import ast
import copy
import importlib.util
import inspect
import json
import os
import pathlib
import subprocess
import sys

import pytest
import triton

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kernel_shared_memory", ROOT / "scripts" / "kernel_shared_memory.py")
ksm = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(ksm)
TABLE = ROOT / ksm.TABLE


@pytest.fixture(scope="module")
def data():
    with open(ksm.json_path(str(TABLE))) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def items():
    return ksm.launches()


def _report(problems: list) -> str:
    shown = "\n  ".join(problems[:25]) + (f"\n  ... and {len(problems) - 25} more" if len(problems) > 25 else "")
    return f"{len(problems)} problems:\n  {shown}\nregenerate the table: {ksm.COMMAND}"


def test_table_is_current_and_every_launch_fits_or_falls_back(data, items):
    problems = ksm.check_table(data, items)
    assert not problems, _report(problems)


def test_markdown_is_the_json_rendered(data):
    assert TABLE.read_text() == ksm.render(data), f"the Markdown differs from its JSON: {ksm.COMMAND}"


def test_every_kernel_of_ours_is_in_the_table(items):
    """Every ``@triton.jit`` kernel under ``optimized/`` (a function named ``*_kernel``) has launches
    in the table or a reason it is not compiled for a GPU."""
    ours = set()
    for path in (ROOT / "optimized").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    "triton.jit" in ast.unparse(d) for d in node.decorator_list):
                ours.add(node.name)
    listed = {launch.name for launch in items} | set(ksm.NOT_COMPILED)
    assert ours == listed, f"not in the table: {sorted(ours - listed)}; no such kernel: {sorted(listed - ours)}"


def test_recorded_refusals_are_the_ops(data):
    """The shapes the table says an op refuses are refused by it (the check holds), in its words."""
    refusals = ksm.refusals()
    assert [dict(op=r.op, case=r.case, error=r.error) for r in refusals] == data["refusals"]
    assert all(r.holds() for r in refusals)


def test_a_changed_kernel_helper_or_block_choice_makes_its_rows_stale(monkeypatch, data, items):
    """A planted source change in a kernel, in a ``@triton.jit`` helper it calls, or a launcher's new
    default block is reported with the rows it touches; other kernels' rows stay current."""
    import optimized.nested.promote_scan as scan

    real = inspect.getsource

    def planted(name):
        return lambda fn: real(fn) + ("\n# planted" if getattr(fn, "__name__", "") == name else "")

    monkeypatch.setattr(ksm.inspect, "getsource", planted("state_grad_bwd_kernel"))
    stale = ksm.check_table(data, ksm.launches())
    assert stale and all(p.startswith("stale: state_grad_bwd_kernel") for p in stale), stale[:5]

    helper = _a_helper_of(scan.promote_scan_bwd_kernel)
    monkeypatch.setattr(ksm.inspect, "getsource", planted(helper))
    stale = ksm.check_table(data, ksm.launches())
    assert any(p.startswith("stale: promote_scan_bwd_kernel") for p in stale), (helper, stale[:5])
    assert not any("state_grad_bwd_kernel" in p for p in stale)

    monkeypatch.setattr(ksm.inspect, "getsource", real)
    wide = scan.block_sizes
    monkeypatch.setattr(scan, "block_sizes", lambda K, V, n, block_v=None, *a, reverse=False, **kw: wide(
        K, V, n, 128 if reverse and block_v is None and K <= 128 else block_v, *a, reverse=reverse, **kw))
    moved = ksm.check_table(data, ksm.launches())
    assert any(p.startswith("missing: promote_scan_bwd_kernel | K = V = 128") and "BV = 128" in p for p in moved)
    assert any(p.startswith("no such launch form any more: promote_scan_bwd_kernel") for p in moved)


def test_a_launcher_without_its_fallback_fails(monkeypatch, data, items):
    """A launcher whose fallback is removed is reported: its rows are stale (its source changed)
    and the one-stage form the table lists is taken by no ``first_that_fits`` any more."""
    real = inspect.getsource

    def removed(fn):
        text = real(fn)
        return text.replace("one_stage_where_refused(", "run(") if getattr(fn, "__name__", "") == "snapshot_read" \
            else text

    monkeypatch.setattr(ksm.inspect, "getsource", removed)
    problems = ksm.check_table(data, ksm.launches())
    assert any(p.startswith("fallback forms listed, none taken: snapshot_read_fwd_kernel") for p in problems)
    assert any(p.startswith("stale: snapshot_read_fwd_kernel") for p in problems)
    assert not any("snapshot_read_dq_kernel" in p for p in problems)


def _a_helper_of(kernel) -> str:
    """The name of a ``@triton.jit`` helper the kernel calls."""
    fn = ksm._fn(kernel)
    for name in fn.__code__.co_names:
        obj = fn.__globals__.get(name)
        if obj is not None and obj is not kernel and inspect.isfunction(getattr(obj, "fn", None)):
            return name
    raise AssertionError(f"{fn.__name__} calls no @triton.jit helper")


def test_a_launch_that_fits_nowhere_or_a_wrong_fingerprint_fails(data, items):
    """A recorded default over an architecture's limit with no fallback, or a fallback that does not
    fit either, fails the check; so does an edited fingerprint."""
    bad = copy.deepcopy(data)
    row = next(r for r in bad["rows"] if r["kernel"] == "reads_bwd_tokens_kernel" and r["arch"] == 89)
    row["shared"] = int(bad["limits"]["89"]) + 1
    problems = ksm.check_table(bad, items)
    assert problems == [f"no form fits sm_89 ({bad['limits']['89']} B): reads_bwd_tokens_kernel | {row['case']} "
                        f"({row['form']}: {row['shared']} B)"]
    bad = copy.deepcopy(data)
    for r in bad["rows"]:
        if r["kernel"] == "state_grad_bwd_kernel" and r["arch"] == 80 and r["case"].startswith("K = V = 256"):
            r["shared"] = int(bad["limits"]["80"]) + 1              # its one-stage fallback too
    assert any(p.startswith("no form fits sm_80") and "state_grad_bwd_kernel" in p
               for p in ksm.check_table(bad, items))
    bad = copy.deepcopy(data)
    bad["rows"][0]["fingerprint"] = "0" * 16
    assert ksm.check_table(bad, items) == [f"stale: {ksm.key_of(bad['rows'][0])}"]


def test_verdict_takes_the_first_form_that_fits_as_first_that_fits_does():
    assert ksm.verdict([100, 50], 120) == ("default fits", True)
    assert ksm.verdict([130, 120, 50], 120) == ("fallback 1", True)
    assert ksm.verdict([130, 121, 50], 120) == ("fallback 2", True)
    assert ksm.verdict([130, 121], 120)[1] is False
    assert ksm.verdict([130], 120, refused_by="ValueError")[1] is True


def test_compiled_sample_matches_the_table(data):
    """A default form of each module's first kernel, compiled for sm_80, sm_89 or sm_90 (in turn),
    asks the recorded shared memory (the table's Triton only: another version may stage operands
    differently)."""
    if data["triton"] != triton.__version__:
        pytest.skip(f"the table was made with Triton {data['triton']}, this is {triton.__version__}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_shared_memory.py"), "--sample"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sample = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(sample) == len({key.split(" | ")[0] for key, _, _ in sample}) >= 12
    assert {key.rsplit(" | ", 1)[1] for key, _, _ in sample} == {f"sm_{a}" for a in ksm.ARCHES}
    wrong = [(key, recorded, compiled) for key, recorded, compiled in sample if recorded != compiled]
    assert not wrong, f"recorded vs compiled bytes differ: {wrong}; {ksm.COMMAND}"
