"""CPU smoke run of ``ngdn bench fenwick-gdn2`` (bench/fenwick_gdn2.py): the interpreter, float32,
one chunk; the CSV has a flat and a Fenwick row per T with ratios and the stacked-block
count of the floor model."""
import csv

import pytest

from bench import fenwick_gdn2 as bench
from ngdn.cli import main as cli_main
from optimized import triton_mode


def test_stacked_blocks_follow_the_chunk_counter():
    assert [bench.stacked_blocks(T) for T in (1, 64, 65, 128, 129, 4096, 65536)] == [7, 7, 2, 2, 3, 7, 11]


@pytest.mark.skipif(triton_mode.configure() == triton_mode.CUDA, reason="CPU smoke run")
def test_quick_run_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("NGDN_PIN_AUTOTUNE", "1")       # prepare_environment pops these: restore after
    monkeypatch.setenv("NGDN_IEEE_F32", "1")
    assert cli_main(["bench", "fenwick-gdn2", "--quick", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "fenwick_gdn2.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["T"], r["op"], r["status"]) for r in rows] == [("64", "flat", "ok"), ("64", "fenwick_gdn2", "ok")]
    assert all(float(r["vs_flat"]) > 0 and float(r["us_per_token"]) > 0 for r in rows)
    assert rows[1]["stacked_blocks"] == "7" and (tmp_path / "fenwick_gdn2.md").exists()


def test_one_piece_op_runs_its_step_in_one_time_piece():
    """``fenwick_gdn2_one_piece`` is the default op's step with ``TIME_PIECES = 1`` (the backward
    before the time pieces), restored after the step, also when it raises."""
    from optimized.fenwick_gdn2 import bwd

    default = bwd.TIME_PIECES
    seen = []
    bench._one_piece(lambda: seen.append(bwd.time_pieces(1, 6, None)))()
    assert seen == [[(0, 6)]] and bwd.TIME_PIECES == default
    assert len(bwd.time_pieces(1, 6, None)) > 1

    def fails():
        raise RuntimeError("step")
    with pytest.raises(RuntimeError):
        bench._one_piece(fails)()
    assert bwd.TIME_PIECES == default
