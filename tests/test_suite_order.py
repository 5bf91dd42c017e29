"""The GPU suite's run order (``suite.order``): the tests measured long are dealt to the fronts
of xdist's first shares, longest first and balanced; every test still runs once; the measured
seconds file reads back; the precompile pool starts its units longest measured first."""
import json

import pytest

from suite import order as suite_order
from suite import precompile as suite_precompile


@pytest.mark.parametrize("n, workers", [(10, 3), (1443, 16), (5, 8), (16, 16)])
def test_share_sizes_are_xdist_first_shares(n, workers):
    sizes = suite_order.share_sizes(n, workers)
    assert sum(sizes) == n and len(sizes) == workers and max(sizes) - min(sizes) <= 1


def shares(order, workers):
    out, at = [], 0
    for size in suite_order.share_sizes(len(order), workers):
        out.append(order[at:at + size])
        at += size
    return out


def test_long_tests_open_the_shares_longest_first_and_balanced():
    seconds = {f"long{i}": float(s) for i, s in enumerate([90, 70, 50, 40, 30, 20, 10, 5])}
    items = [f"t{i}" for i in range(40)] + list(seconds)
    out = suite_order.longest_first(items, lambda t: seconds.get(t, 0.5), workers=4)
    assert sorted(out) == sorted(items)
    got = shares(out, 4)
    assert [share[0] for share in got] == ["long0", "long1", "long2", "long3"]
    loads = [sum(seconds.get(t, 0.0) for t in share) for share in got]
    assert loads == [90, 70 + 10, 50 + 20 + 5, 40 + 30]     # each next to the least loaded share
    for share in got:       # the long tests first in a share, longest first; the rest in their order
        n = sum(t in seconds for t in share)
        assert all(t in seconds for t in share[:n]) and not any(t in seconds for t in share[n:])
        assert [seconds[t] for t in share[:n]] == sorted((seconds[t] for t in share[:n]), reverse=True)
        rest = [int(t[1:]) for t in share[n:]]
        assert rest == sorted(rest)


def test_order_unchanged_without_workers_or_long_tests():
    items = list("abcdef")
    assert suite_order.longest_first(items, lambda t: 99.0, workers=1) == items
    assert suite_order.longest_first(items, lambda t: 0.1, workers=4) == items


def test_more_long_tests_than_room_in_the_shares():
    items = [f"x{i}" for i in range(7)]
    out = suite_order.longest_first(items, lambda t: float(t[1:]) + 10, workers=3)
    assert sorted(out) == sorted(items) and [s[0] for s in shares(out, 3)] == ["x6", "x5", "x4"]


def test_durations_written_and_read_back(tmp_path):
    log = tmp_path / "tests-cold.jsonl"
    rows = [{"test": "a::x", "when": "call", "outcome": "passed", "duration_s": 12.3},
            {"test": "a::y", "when": "call", "outcome": "passed", "duration_s": 0.4},
            {"test": "a::z", "when": "setup", "outcome": "skipped", "duration_s": 5.0}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "durations.json"
    assert suite_order.write_durations(str(log), out) == 1
    assert suite_order.load_durations(out) == {"a::x": 12.3}
    assert suite_order.load_durations(tmp_path / "missing.json") == {}


def test_the_checked_in_durations_name_collected_tests(request):
    """The file is read by test id: most of its ids must still exist (renamed tests only lose
    their place at the front). Checked against this run's collection where it is the whole suite."""
    seconds = suite_order.load_durations()
    assert seconds and all(s >= suite_order.THRESHOLD_S for s in seconds.values())
    assert all("::" in t and t.split("::")[0].startswith(("tests/", "property_tests/")) for t in seconds)


def test_precompile_pool_starts_the_longest_measured_units_first():
    names = suite_precompile.longest_first(suite_precompile.units())
    assert sorted(names) == sorted(suite_precompile.units())
    assert set(suite_precompile.MEASURED_S) == set(suite_precompile.units())     # every unit measured
    measured = [suite_precompile.MEASURED_S[n] for n in names]
    assert measured == sorted(measured, reverse=True)
    assert suite_precompile.longest_first(["gla:a:float32", "nested:a:float32"]) == ["nested:a:float32",
                                                                                       "gla:a:float32"]
