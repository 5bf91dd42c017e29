"""Bad inputs to the Fenwick level router (CONTRACT section 5, "Errors"): every public function
raises ValueError/TypeError naming the argument and what was expected, before any compute."""
import pytest
import torch

from optimized import chunk_fenwick, triton_mode
from reference import (fenwick_level, naive_fenwick, naive_fenwick_gdn2, quadratic_fenwick)

B, T, H, K, V = 1, 5, 2, 16, 8
L = 4   # 1 + ceil(log2 5)


def scalar_inputs(dtype=torch.float32, device="cpu", **overrides):
    x = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, H, V),
         "g": -torch.rand(B, T, H), "level_scales": torch.rand(B, T, H, L)}
    x = {n: t.to(device=device, dtype=dtype) for n, t in x.items()}
    x.update(overrides)
    return x


def gdn2_inputs(**overrides):
    x = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, H, V),
         "g": -torch.rand(B, T, H, K), "b": torch.rand(B, T, H, K), "w": torch.rand(B, T, H, V),
         "level_scales": torch.rand(B, T, H, L)}
    x.update(overrides)
    return x


SCALAR_OPS = [pytest.param(naive_fenwick, id="naive_fenwick"),
              pytest.param(quadratic_fenwick, id="quadratic_fenwick"),
              pytest.param(chunk_fenwick, id="chunk_fenwick")]


@pytest.mark.parametrize("op", SCALAR_OPS)
@pytest.mark.parametrize("overrides, error, fragment", [
    ({"level_scales": torch.rand(B, T, H, L - 1)}, ValueError, "at least 1 + ceil(log2 T) = 4 levels"),
    ({"level_scales": torch.rand(B, T, H)}, ValueError, "level_scales must have 4 dimensions"),
    ({"level_scales": torch.rand(B, T + 1, H, L)}, ValueError, "level_scales must have shape [B, T, H, L]"),
    ({"g": -torch.rand(B, T, H, K)}, ValueError, "g must have 3 dimensions"),
    ({"g": -torch.rand(B, T, H + 1)}, ValueError, "g must have shape [B, T, H]"),
    ({"k": torch.randn(B, T, H, K + 1)}, ValueError, "k must have shape [B, T, H, K]"),
    ({"v": torch.randn(B, T + 1, H, V)}, ValueError, "v must have shape [B, T, H, V]"),
    ({"q": torch.randn(B, 0, H, K)}, ValueError, "at least one token"),
    ({"v": torch.randn(B, T, H, V, dtype=torch.float16)}, ValueError, "v has dtype torch.float16"),
    ({"q": torch.randn(B, T, H, K).numpy()}, TypeError, "q must be a torch.Tensor"),
    ({"level_scales": torch.rand(B, T, H, L, device="meta")}, ValueError, "level_scales is on meta"),
])
def test_bad_scalar_inputs(op, overrides, error, fragment):
    with pytest.raises(error, match=_escape(fragment)):
        op(**scalar_inputs(**overrides))


@pytest.mark.parametrize("op", SCALAR_OPS)
@pytest.mark.parametrize("scale, error, fragment", [
    ("0.5", TypeError, "scale must be a float"),
    (float("nan"), ValueError, "scale must be finite"),
])
def test_bad_scale(op, scale, error, fragment):
    with pytest.raises(error, match=_escape(fragment)):
        op(**scalar_inputs(), scale=scale)


@pytest.mark.parametrize("T_, L_ok", [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (64, 7), (65, 8)])
def test_level_count_boundary(T_, L_ok):
    """``L = 1 + ceil(log2 T)`` is accepted and one fewer is rejected."""
    x = {"q": torch.randn(1, T_, 1, 4), "k": torch.randn(1, T_, 1, 4), "v": torch.randn(1, T_, 1, 4),
         "g": -torch.rand(1, T_, 1)}
    quadratic_fenwick(**x, level_scales=torch.rand(1, T_, 1, L_ok))
    if L_ok > 1:
        with pytest.raises(ValueError, match=f"at least 1 \\+ ceil\\(log2 T\\) = {L_ok} levels"):
            quadratic_fenwick(**x, level_scales=torch.rand(1, T_, 1, L_ok - 1))


def test_optimized_rejects_float64():
    with pytest.raises(ValueError, match="q must have dtype in"):
        chunk_fenwick(**scalar_inputs(dtype=torch.float64))


def test_optimized_rejects_wrong_device():
    wrong = "cpu" if triton_mode.device() == "cuda" else "meta"
    with pytest.raises(ValueError, match=f"q is on {wrong}"):
        chunk_fenwick(**scalar_inputs(device=wrong))


def test_optimized_rejects_sequences_fla_cannot_run():
    T_ = 2 ** 17
    x = {"q": torch.empty(1, T_, 1, 1), "k": torch.empty(1, T_, 1, 1), "v": torch.empty(1, T_, 1, 1),
         "g": torch.empty(1, T_, 1), "level_scales": torch.empty(1, T_, 1, 18)}
    with pytest.raises(ValueError, match=r"needs T < 2\*\*17, got T = 131072"):
        chunk_fenwick(**x)


@pytest.mark.parametrize("overrides, fragment", [
    ({"level_scales": torch.rand(B, T, H, L - 1)}, "at least 1 + ceil(log2 T) = 4 levels"),
    ({"level_scales": torch.rand(B, T, H + 1, L)}, "level_scales must have shape [B, T, H, L]"),
    ({"level_scales": torch.rand(B, T, H, L, dtype=torch.float64)}, "level_scales has dtype torch.float64"),
    ({"g": -torch.rand(B, T, H)}, "g must have 4 dimensions"),
    ({"w": torch.rand(B, T, H, K + 1)}, "w must have shape [B, T, H, V]"),
])
def test_bad_gdn2_variant_inputs(overrides, fragment):
    with pytest.raises(ValueError, match=_escape(fragment)):
        naive_fenwick_gdn2(**gdn2_inputs(**overrides))


def test_fenwick_level_rejects_s_after_t():
    with pytest.raises(ValueError, match="0 <= s <= t"):
        fenwick_level(3, 4)


def _escape(fragment: str) -> str:
    import re

    return re.escape(fragment)
