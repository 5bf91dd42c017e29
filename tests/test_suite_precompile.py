"""The GPU suite's precompile pool (``ngdn.suite_precompile``): its units name real buckets, a
unit's calls run (a small one, under the interpreter), a failing unit is reported without
stopping the pool, and only whole-suite runs in the controlling process precompile."""
import types

import pytest

from ngdn import compile_buckets, suite_precompile


def test_units_cover_every_bucket_and_dtype():
    names = suite_precompile.units()
    for kind, family in suite_precompile.FAMILY_OF.items():
        for bucket in family:
            for dtype in suite_precompile.DTYPES:
                assert f"{kind}:{bucket.name}:{dtype}" in names
    assert names[0].startswith("nested:")                           # longest first
    assert set(suite_precompile.FAMILY_OF.values()) <= set(compile_buckets.FAMILIES.values())


@pytest.mark.parametrize("unit", ["nested:z:float32", "nope:a:float32", "gla:a:float16", "gla:a"])
def test_bad_unit_names_are_refused(unit):
    with pytest.raises(ValueError, match="unit"):
        suite_precompile.parse_unit(unit)


def test_a_small_unit_runs_its_checks():
    suite_precompile.warm("fenwick:c:float32", require_cuda=False)


def test_a_failing_unit_is_reported_and_the_pool_goes_on():
    """Without CUDA every unit fails in its subprocess ("precompiling needs CUDA"): reported, not raised."""
    lines = []
    done = suite_precompile.run_pool(["fenwick:c:float32"], jobs=1, time_limit=120, log=lines.append)
    status, _ = done["fenwick:c:float32"]
    assert status.startswith("failed") and "CUDA" in status, status
    assert len(lines) == 1 and "fenwick:c:float32" in lines[0]


def fake_config(args_source, collectonly=False):
    ArgsSource = types.SimpleNamespace(TESTPATHS="testpaths", ARGS="args")
    return types.SimpleNamespace(ArgsSource=ArgsSource, args_source=getattr(ArgsSource, args_source),
                                 getoption=lambda name, default=None: collectonly)


@pytest.mark.parametrize("env, source, collectonly, expected", [
    ({}, "TESTPATHS", False, True),                                   # plain `pytest -n auto`
    ({}, "ARGS", False, False),                                       # `pytest some/file.py`
    ({"NGDN_PRECOMPILE": "1"}, "ARGS", False, True),
    ({"NGDN_PRECOMPILE": "0"}, "TESTPATHS", False, False),
    ({"PYTEST_XDIST_WORKER": "gw3"}, "TESTPATHS", False, False),      # workers never precompile
    ({}, "TESTPATHS", True, False),                                   # --collect-only
])
def test_only_whole_suite_runs_in_the_controller_precompile(monkeypatch, env, source, collectonly, expected):
    monkeypatch.delenv("NGDN_PRECOMPILE", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert suite_precompile.wanted(fake_config(source, collectonly)) is expected
