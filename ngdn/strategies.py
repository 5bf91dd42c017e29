"""Hypothesis strategies and profiles shared by every property test.

Hypothesis draws shapes, configs and seeds; tensors come from a seeded
``torch.Generator`` (``ngdn.inputs``). Shapes come from short fixed menus so
Triton compiles few variants.

Profiles (``NGDN_HYPOTHESIS_PROFILE``; default ``gpu`` with CUDA, else ``ci``):
``ci`` few examples, derandomized (CPU interpreter); ``gpu`` more examples;
``thorough`` many, for a long run before trusting a kernel.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from ngdn.inputs import GDN2Shape

HEAD_DIMS = (16, 32, 64, 128)
# T < 64, T = 64, T = 64·k, T not a multiple of 64, a single token.
SEQ_LENS = (1, 17, 64, 100, 128, 130)
CPU_SEQ_LENS = (1, 17, 64, 100, 130)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.differing_executors]

# Per-test example budgets scale from these: a test that costs seconds per example
# under the interpreter asks for `max_examples=budget(...)`.
# ci and gpu do not shrink: one kernel example costs seconds (interpreter) or a
# compile (GPU), and shrinking once took 5 minutes of a GPU lease. A failure
# reports the first failing draw and its seed; `thorough` shrinks.
_NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
PROFILES = {
    "ci": dict(max_examples=4, derandomize=True, deadline=None, suppress_health_check=_SLOW_OK,
               print_blob=True, phases=_NO_SHRINK),
    "gpu": dict(max_examples=10, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True,
                phases=_NO_SHRINK),
    "thorough": dict(max_examples=300, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True),
}


def register_profiles() -> None:
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, **kwargs)


def load_profile(cuda: bool) -> str:
    name = os.environ.get("NGDN_HYPOTHESIS_PROFILE") or ("gpu" if cuda else "ci")
    if name not in PROFILES:
        raise ValueError(f"NGDN_HYPOTHESIS_PROFILE must be one of {sorted(PROFILES)}, got {name!r}")
    settings.load_profile(name)
    return name


def examples(ci: int | None = None, scale: int = 1, family: str | None = None):
    """A ``settings`` decorator for one test: ``scale`` × the profile's budget
    (cheap reference-only tests), or exactly ``ci`` examples on the ``ci`` profile
    (tests that cost seconds per example under the interpreter). ``family``: the test runs
    once per compile bucket of that family (``ngdn.compile_buckets``) and the budget is split
    over the buckets, so the test sees as many examples in all.
    Applied at import, after the suite plugin (``suite.plugin``) has loaded the profile."""
    n = settings().max_examples * scale
    if ci is not None and settings.get_current_profile_name() == "ci":
        n = ci
    elif family is not None:
        from ngdn.compile_buckets import per_bucket

        n = per_bucket(n, family)
    return settings(max_examples=n)


def seeds():
    return st.integers(min_value=0, max_value=2**31 - 1)


def gdn2_shapes(max_batch: int = 2, max_heads: int = 2, seq_lens=SEQ_LENS, head_dims=HEAD_DIMS):
    return st.builds(
        GDN2Shape,
        B=st.integers(1, max_batch),
        T=st.sampled_from(seq_lens),
        H=st.integers(1, max_heads),
        K=st.sampled_from(head_dims),
        V=st.sampled_from(head_dims),
    )
