"""``bench.memory_at_peak`` on a synthetic allocator trace (the snapshot format of
``torch.cuda.memory._snapshot()``): the replay finds the peak of the step's own blocks, ignores
frees of blocks allocated before the recording, and names the line that allocated each block."""
from bench import memory_at_peak as m


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TORCH = frame("/usr/lib/python3/site-packages/torch/_tensor.py", 10, "empty")
OURS_FWD = frame("/repo/optimized/nested/fwd.py", 54, "nested_fwd")
OURS_BWD = frame("/repo/optimized/nested/bwd.py", 20, "nested_bwd")
FLA = frame("/tmp/site/fla/ops/gdn2/chunk_fwd.py", 99, "chunk_gdn2_fwd")
BENCH = frame("/repo/bench/reads_ab.py", 200, "step")

TRACE = [
    {"action": "alloc", "addr": 1, "size": 100, "frames": [TORCH, OURS_FWD, BENCH]},
    {"action": "alloc", "addr": 2, "size": 50, "frames": [TORCH, FLA, OURS_FWD, BENCH]},
    {"action": "free_completed", "addr": 99, "size": 1000},            # allocated before the recording
    {"action": "free_requested", "addr": 1, "size": 100},
    {"action": "free_completed", "addr": 1, "size": 100},
    {"action": "alloc", "addr": 3, "size": 120, "frames": [TORCH, OURS_BWD, BENCH]},   # peak: 50 + 120
    {"action": "alloc", "addr": 4, "size": 7, "frames": [TORCH, OURS_BWD, BENCH]},     # 177: the peak
    {"action": "free_completed", "addr": 3, "size": 120},
    {"action": "alloc", "addr": 5, "size": 60, "frames": []},
]


def test_peak_and_blocks_alive_there():
    peak, blocks, at = m.peak_blocks(TRACE)
    assert (peak, at) == (177, 6)
    assert sorted(size for size, _ in blocks) == [7, 50, 120]


def test_sites_name_our_line_and_who_called_fla():
    rows = m.by_site(m.peak_blocks(TRACE)[1])
    assert rows[0] == (("optimized/nested/bwd.py:20 nested_bwd", ""), 127, 2)
    assert rows[1] == (("fla/ops/gdn2/chunk_fwd.py:99 chunk_gdn2_fwd", "optimized/nested/fwd.py:54 nested_fwd"), 50, 1)
    assert m.site([]) == ("(no stack)", "")


def test_table(tmp_path):
    lines = m.write_table(tmp_path / "t.md", "synthetic", {"device_traces": [TRACE]}, top=1)
    text = (tmp_path / "t.md").read_text()
    assert "3 blocks" in text and "`optimized/nested/bwd.py:20 nested_bwd`" in text
    assert "(the other 1 sites)" in lines[-1]
