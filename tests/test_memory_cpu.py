"""``bench.memory_cpu``: the CPU tally of what is alive at a step's peak (its event log replayed by
``bench.memory_at_peak.peak_blocks``)."""
import pytest
import torch

from bench.memory_at_peak import peak_blocks
from bench.memory_cpu import record, table
from optimized import triton_mode

MIB = 2 ** 20


def test_peak_counts_what_is_alive_then_and_not_the_inputs():
    x = torch.zeros(MIB // 4)                            # an input: 1 MiB, not counted

    def step():
        a = torch.ones(MIB // 4)                         # 1 MiB
        b = torch.ones(2 * MIB // 4)                     # 2 MiB: peak 3 MiB with a
        x.view(-1)[:10].add_(1)                          # ops on the input's storage: not counted
        del a
        c = torch.ones(MIB // 8)                         # 0.5 MiB after a is gone: 2.5 MiB
        return b.sum() + c.sum()

    events = record(step, [x])
    peak, blocks, _ = peak_blocks(events)
    assert peak == 3 * MIB, peak
    assert sorted(size for size, _ in blocks) == [MIB, 2 * MIB]
    lines = table(events, "t")
    assert "3.00 MiB in 2 storages" in lines[2], lines[2]
    assert len(lines) == 6 + 2                           # one row per allocating line: a's and b's


def test_views_share_their_storage():
    def step():
        a = torch.ones(MIB // 4)
        views = [a.view(2, -1), a[: MIB // 8], a.reshape(-1), a.t() if a.dim() == 2 else a.unsqueeze(0)]
        return views                                     # no new memory

    peak, blocks, _ = peak_blocks(record(step, []))
    assert peak == MIB and len(blocks) == 1


@pytest.mark.skipif(triton_mode.configure() == triton_mode.CUDA,
                    reason="the CPU tally runs the op on CPU tensors: under the interpreter only")
def test_fenwick_gdn2_tally_sees_its_saved_stacked_states():
    """``--op fenwick-gdn2``: one step of the op on the CPU; its stacked per-chunk states (``h``,
    written by the carry scan and kept for the backward) are alive at the peak; the inputs are not
    counted."""
    from bench.memory_at_peak import site
    from bench.memory_cpu import fenwick_gdn2_step
    from optimized.checks import finite_checks

    step, known = fenwick_gdn2_step(1, 130, 1, 16, 16)
    with finite_checks(False):
        events = record(step, known)
    peak, blocks, _ = peak_blocks(events)
    sites = [site(frames)[0] for _, frames in blocks]
    assert any("fenwick_gdn2/states.py" in s and "states_fwd" in s for s in sites), sites
    inputs = {t.untyped_storage().data_ptr() for t in known}
    assert not inputs & {e["addr"] for e in events if e.get("action") == "alloc"}


def test_stage_peaks_on_the_cpu_tracker():
    """``bench.stage_peaks`` over the tracker's running total (``TrackerCounter``): each stage's
    own peak above the step's start, inputs not counted, the running total back to what is alive."""
    import contextlib
    import types

    from bench import stage_peaks
    from bench.memory_cpu import LiveStorages, TrackerCounter, storages_of

    x = torch.zeros(MIB // 4)                            # an input: not counted
    module = types.SimpleNamespace(stage=lambda name: contextlib.nullcontext())

    def step():
        with module.stage("big"):
            a = torch.ones(2 * MIB // 4)                 # 2 MiB, freed in the stage
            del a
        keep = torch.ones(MIB // 4)                      # 1 MiB between the stages, kept
        with module.stage("small"):
            b = torch.ones(MIB // 8)                     # 0.5 MiB on top of the kept 1 MiB
            del b
        return keep

    tracker = LiveStorages(storages_of([x]))
    with tracker:
        peaks = stage_peaks.record(step, modules=[module], counter=TrackerCounter(tracker))
    assert peaks == {stage_peaks.BETWEEN: MIB, "big": 2 * MIB, "small": MIB + MIB // 2}
    assert tracker.total == 0                            # everything the step made is gone
