"""Bad inputs to ``optimized.chunk_fenwick_gdn2`` (CONTRACT "Errors"): a ValueError/TypeError naming the
argument and what was expected, before any kernel runs."""
import re

import pytest
import torch

from optimized import triton_mode
from optimized.fenwick_gdn2 import chunk_fenwick_gdn2

B, T, H, K, V = 1, 5, 2, 16, 8
L = 4   # 1 + ceil(log2 5)
DEV = triton_mode.device()
OTHER = "meta" if DEV == "cpu" else "cpu"


def inputs(dtype=torch.float32, T_=T, L_=L, **overrides):
    x = {"q": torch.randn(B, T_, H, K), "k": torch.randn(B, T_, H, K), "v": torch.randn(B, T_, H, V),
         "g": -torch.rand(B, T_, H, K), "b": torch.rand(B, T_, H, K), "w": torch.rand(B, T_, H, V),
         "level_scales": torch.rand(B, T_, H, L_)}
    x = {n: t.to(DEV, dtype) for n, t in x.items()}
    x.update(overrides)
    return x


def _raises(error, fragment, **kwargs):
    with pytest.raises(error, match=re.escape(fragment)):
        chunk_fenwick_gdn2(**kwargs)


@pytest.mark.parametrize("overrides, error, fragment", [
    ({"level_scales": torch.rand(B, T, H, L - 1)}, ValueError, "at least 1 + ceil(log2 T) = 4 levels"),
    ({"level_scales": torch.rand(B, T, H)}, ValueError, "level_scales must have 4 dimensions"),
    ({"level_scales": torch.rand(B, T + 1, H, L)}, ValueError, "level_scales must have shape [B, T, H, L]"),
    ({"level_scales": torch.rand(B, T, H, L, dtype=torch.float64)}, ValueError,
     "level_scales has dtype torch.float64 but q has torch.float32"),
    ({"g": -torch.rand(B, T, H)}, ValueError, "g must have 4 dimensions"),
    ({"k": torch.randn(B, T, H, K + 1)}, ValueError, "k must have shape [B, T, H, K] = (1, 5, 2, 16)"),
    ({"w": torch.rand(B, T, H, K)}, ValueError, "w must have shape [B, T, H, V] = (1, 5, 2, 8)"),
    ({"v": torch.randn(B, T, H, V, dtype=torch.float16)}, ValueError, "v has dtype torch.float16"),
    ({"q": torch.randn(B, 0, H, K)}, ValueError, "at least one token"),
    ({"q": [[1.0]]}, TypeError, "q must be a torch.Tensor, got list"),
    ({"level_scales": torch.rand(B, T, H, L, device="meta")}, ValueError, "level_scales is on meta"),
])
def test_bad_inputs(overrides, error, fragment):
    moved = {n: t.to(DEV) if isinstance(t, torch.Tensor) and t.device.type != "meta" else t
             for n, t in overrides.items()}
    _raises(error, fragment, **inputs(**moved))


@pytest.mark.parametrize("scale, error, fragment", [
    ("0.5", TypeError, "scale must be a float"),
    (float("nan"), ValueError, "scale must be finite"),
])
def test_bad_scale(scale, error, fragment):
    _raises(error, fragment, **inputs(), scale=scale)


def test_rejects_float64():
    _raises(ValueError, "q must have dtype in ['torch.bfloat16', 'torch.float32'], got torch.float64",
            **inputs(dtype=torch.float64))


@pytest.mark.skipif(triton_mode.MODE == triton_mode.CUDA, reason="bfloat16 runs in cuda mode")
def test_rejects_bfloat16_under_the_interpreter():
    _raises(ValueError, "q is torch.bfloat16, which the Triton interpreter (cpu-interpret mode)",
            **inputs(dtype=torch.bfloat16))


def test_rejects_wrong_device_for_mode():
    _raises(ValueError, f"q is on {OTHER}, but optimized ops run on {DEV} tensors",
            **{n: t.to(OTHER) for n, t in inputs().items()})


def test_rejects_tensors_on_different_devices():
    x = inputs()
    x["v"] = x["v"].to(OTHER)
    _raises(ValueError, f"v is on {OTHER} but q is on {DEV}", **x)


def test_rejects_wide_keys():
    x = inputs()
    for n in ("q", "k", "g", "b"):
        x[n] = torch.zeros(B, T, H, 512, device=DEV)
    _raises(ValueError, "key dim K must be <= 256", **x)


def test_keys_over_128_refused_on_cuda_only():
    from optimized.fenwick_gdn2.chunk import max_head_dim
    assert max_head_dim("cuda") == 128
    assert max_head_dim("cpu") == 256
    if str(DEV).startswith("cuda"):
        x = inputs()
        for n in ("q", "k", "g", "b"):
            x[n] = torch.zeros(B, T, H, 160, device=DEV)
        _raises(ValueError, "key dim K must be <= 128 on cuda", **x)


@pytest.mark.parametrize("name, token", [("q", 3), ("g", 1), ("level_scales", 4)])
def test_rejects_non_finite_activations(name, token):
    x = inputs()
    x[name] = x[name].clone()
    x[name][0, token, 1] = float("nan")
    _raises(ValueError, f"{name} holds a non-finite value (nan) at batch 0, token {token}", **x)


def test_rejects_full_forget():
    x = inputs()
    x["g"] = x["g"].clone()
    x["g"][0, 2, 0, 3] = float("-inf")
    _raises(ValueError, "g holds a non-finite value (-inf) at batch 0, token 2", **x)


# --- state passing: offset and initial_state ----------------------------------------------

@pytest.mark.parametrize("offset, error, fragment", [
    (32, ValueError, "offset must be a non-negative multiple of 64"),
    (-64, ValueError, "offset must be a non-negative multiple of 64"),
    (64.0, TypeError, "offset must be an int, got float"),
    (True, TypeError, "offset must be an int, got bool"),
])
def test_bad_offset(offset, error, fragment):
    _raises(error, fragment, **inputs(L_=8), offset=offset)


def test_levels_count_the_absolute_positions():
    """At offset 64 the last of 5 tokens is token 68: 1 + ceil(log2 69) = 8 levels are needed."""
    _raises(ValueError, "at least 1 + ceil(log2(offset + T)) = 8 levels for offset = 64, T = 5, got L = 7",
            **inputs(L_=7), offset=64)


def test_initial_state_needs_an_offset():
    _raises(ValueError, "initial_state needs offset > 0", **inputs(),
            initial_state=torch.zeros(B, H, L, K, V, device=DEV))


@pytest.mark.parametrize("state, error, fragment", [
    (torch.zeros(B, H, K, V), ValueError, "initial_state must have 5 dimensions"),
    (torch.zeros(B, H, 7, K, V), ValueError, "initial_state must have shape [B, H, L, K, V] = (1, 2, 8, 16, 8)"),
    (torch.zeros(B, H, 8, K, V, dtype=torch.float64), ValueError,
     "initial_state must have dtype torch.float32, got torch.float64"),
    (torch.full((B, H, 8, K, V), float("inf")), ValueError, "initial_state contains non-finite values"),
    ([0.0], TypeError, "initial_state must be a torch.Tensor or None, got list"),
])
def test_bad_initial_state(state, error, fragment):
    if isinstance(state, torch.Tensor):
        state = state.to(DEV)
    _raises(error, fragment, **inputs(L_=8), initial_state=state, offset=64)


def test_initial_state_on_another_device():
    _raises(ValueError, f"initial_state is on {OTHER} but q is on {DEV}", **inputs(L_=8),
            initial_state=torch.zeros(B, H, 8, K, V, device=OTHER), offset=64)


def test_sizes_refused_before_any_work():
    """The stacked per-chunk states ``[B, N, H, K, (J + 1)·V]`` are sized before allocation."""
    T_ = 2 ** 16
    big = {n: torch.empty(1, T_, 1, 256, device="meta") for n in ("q", "k", "g", "b")}
    big.update({n: torch.empty(1, T_, 1, 1024, device="meta") for n in ("v", "w")})
    big["level_scales"] = torch.empty(1, T_, 1, 17, device="meta")
    _raises(ValueError, "the stacked per-chunk states [B, ceil(T/64), H, K, (J + 1) * V] = (1, 1024, 1, 256, 11264)",
            **big)
