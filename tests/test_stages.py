"""``optimized.nested.stages.stage``: a profiler range while a profiler runs, nothing otherwise."""
import torch
from torch.profiler import profile

from optimized.nested.stages import _NONE, stage


def test_stage_is_recorded_under_a_profiler_and_free_without_one():
    assert stage("nested.test_stage") is _NONE          # no profiler: no range opened
    with profile() as prof:
        with stage("nested.test_stage"):
            torch.ones(4).sum()
    names = [e.name for e in prof.events()]
    assert "nested.test_stage" in names
