"""A long per-token reference call writes one time estimate on stderr; a short one, or one under
``NGDN_REFERENCE_PROGRESS=0`` / ``reference.progress.quiet()``, writes nothing. The estimate
reads the clock only: the results are the same with or without it."""
import re

import pytest
import torch

from ngdn.nested_inputs import NestedShape, nested_inputs
from reference import naive_gdn2, naive_nested_gdn2, progress


def gdn2_inputs(T=40):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(1, T, 1, 4, generator=gen, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(1, T, 1, 4, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, T, 1, 4, generator=gen, dtype=torch.float64)
    b, w = (torch.rand(1, T, 1, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v, g, b, w


def test_a_long_call_is_announced_once_and_its_results_unchanged(monkeypatch, capsys):
    x = gdn2_inputs()
    with progress.quiet():
        expected = naive_gdn2(*x)[0]
    monkeypatch.setattr(progress, "ANNOUNCE_ABOVE_S", 0.0)    # every call of more than 32 tokens is "long"
    assert torch.equal(naive_gdn2(*x)[0], expected)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"\[reference\] naive_gdn2: T = 40 tokens, about \d+ s \(from the "
                                            r"first 32 tokens; NGDN_REFERENCE_PROGRESS=0 silences this\)",
                                            lines[0]), lines


def test_the_nested_reference_is_announced_too(monkeypatch, capsys):
    x = nested_inputs(NestedShape(B=1, T=40, H=1, L=2, K=4, V=4), seed=0)
    monkeypatch.setattr(progress, "ANNOUNCE_ABOVE_S", 0.0)
    naive_nested_gdn2(*(x[n] for n in "qkvgbwr"), x["levels"], chunk_size=8)
    assert "[reference] naive_nested_gdn2: T = 40 tokens" in capsys.readouterr().err


def test_short_calls_and_silenced_calls_write_nothing(monkeypatch, capsys):
    naive_gdn2(*gdn2_inputs())                       # predicted far below 5 s
    monkeypatch.setattr(progress, "ANNOUNCE_ABOVE_S", 0.0)
    naive_gdn2(*gdn2_inputs(T=20))                   # shorter than the probe: nothing to time
    with progress.quiet():
        naive_gdn2(*gdn2_inputs())
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="silent must be a bool"):
        with progress.quiet("yes"):
            pass
