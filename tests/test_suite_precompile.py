"""The GPU suite's precompile pool (``suite.precompile``): its units name real buckets, a
unit's calls run (a small one, under the interpreter), a failing unit is reported without
stopping the pool, and only whole-suite runs in the controlling process precompile."""
import sys
import time
import types

import pytest
import torch

from ngdn import compile_buckets
from ngdn.testing import on_cuda
from suite import precompile as suite_precompile


def test_units_cover_every_bucket_and_dtype():
    names = suite_precompile.units()
    for kind, family in suite_precompile.FAMILY_OF.items():
        for bucket in family:
            for dtype in suite_precompile.DTYPES:
                base = f"{kind}:{bucket.name}:{dtype}"
                ps = suite_precompile.parts(kind, bucket.name, dtype)
                if ps:
                    assert [f"{base}:{p}" for p in ps] == [n for n in names if n.startswith(base + ":")]
                    assert base not in names
                else:
                    assert (base in names) == (kind != "packed"), base
    assert names[0].startswith("fenwick_gdn2:")                     # longest first
    assert len(set(names)) == len(names)
    for name in names:
        suite_precompile.parse_unit(name)
    assert set(suite_precompile.FAMILY_OF.values()) <= set(compile_buckets.FAMILIES.values())


@pytest.mark.parametrize("unit", ["nested:z:float32", "nope:a:float32", "gla:a:float16", "gla:a",
                                  "fenwick_gdn2:a:float32", "fenwick_gdn2:a:float32:T999", "nested:a:float32:T100",
                                  "packed:a:bfloat16:gdn2", "packed:b:float32:gdn2:x"])
def test_bad_unit_names_are_refused(unit):
    with pytest.raises(ValueError, match="unit"):
        suite_precompile.parse_unit(unit)


def test_a_small_unit_runs_its_checks():
    suite_precompile.warm("fenwick:c:float32", require_cuda=False)


@pytest.mark.parametrize("unit", [u for u in suite_precompile.units() if u.startswith("packed:")])
def test_packed_units_make_the_packed_properties_calls(monkeypatch, unit):
    """Each packed unit makes its property's call: the same op, draw, lengths and cu_seqlens dtype
    (what Triton's cache keys on), from the functions the properties call."""
    from ngdn import ops
    from ngdn.checks import generic

    calls = []
    monkeypatch.setattr(generic, "packed_equals_separate",
                        lambda info, d, lengths, dtype, log=True, cu_dtype=torch.int32: calls.append(
                            (info.name, d, lengths, dtype, cu_dtype)))
    suite_precompile.warm(unit, require_cuda=False)
    part = unit.split(":")[-1]
    if part == "fenwick-gdn2-ragged":      # property_tests/test_fenwick_gdn2.py
        want = ("fenwick-gdn2", ops.fenwick_gdn2_ragged_draw(), ops.FENWICK_GDN2_RAGGED_LENGTHS, torch.float32,
                torch.int64)
    elif part == "nested-levels":          # property_tests/test_ops.py, the nested row at L = 3
        want = ("nested", ops.packed_test_draw(ops.get("nested"), ops.NESTED_LEVELS_LENGTHS, L=3),
                ops.NESTED_LEVELS_LENGTHS, torch.float32, torch.int32)
    else:                                  # property_tests/test_ops.py
        info = ops.get(part)
        want = (part, ops.packed_test_draw(info), ops.PACKED_LENGTHS, torch.float32, ops.packed_cu_dtype(info))
    assert calls == [want]


def test_failing_and_slow_units_are_reported_and_the_pool_goes_on():
    """Units stand in for subprocesses that fail, hang past the limit or succeed: each is
    reported with its status, none stops the pool or raises."""
    scripts = {"fenwick:c:float32": "raise SystemExit('boom: no kernel')",
               "fenwick:c:bfloat16": "import time; time.sleep(30)",
               "fenwick:a:float32": "pass"}
    lines = []
    done = suite_precompile.run_pool(list(scripts), jobs=2, time_limit=3, log=lines.append,
                                     command=lambda name: [sys.executable, "-c", scripts[name]])
    assert done["fenwick:c:float32"][0] == "failed: boom: no kernel"
    assert done["fenwick:c:bfloat16"][0] == "stopped after 3 s"
    assert done["fenwick:a:float32"][0] == "ok"
    assert len(lines) == 3


def test_the_deadline_stops_running_units_and_skips_pending_ones():
    """One slot: the first unit sleeps past the pool's deadline (but within its own limit) and is
    stopped there; the second is never started."""
    scripts = {"fenwick:c:float32": "import time; time.sleep(30)", "fenwick:a:float32": "pass"}
    t0 = time.monotonic()
    done = suite_precompile.run_pool(list(scripts), jobs=1, time_limit=60, deadline=2, log=lambda line: None,
                                     command=lambda name: [sys.executable, "-c", scripts[name]])
    assert time.monotonic() - t0 < 20
    assert done["fenwick:c:float32"][0] == "stopped at the 2 s deadline"
    assert done["fenwick:a:float32"] == ("not started by the 2 s deadline", 0.0)


def test_the_default_command_fails_without_cuda_and_says_why():
    if on_cuda():
        pytest.skip("on CUDA the unit compiles (checked by the GPU suite's own precompile)")
    done = suite_precompile.run_pool(["fenwick:c:float32"], jobs=1, time_limit=120, log=lambda line: None)
    status, _ = done["fenwick:c:float32"]
    assert status.startswith("failed") and "CUDA" in status, status


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
