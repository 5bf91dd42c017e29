"""Bad input to the 3D tensor state entry points and helpers fails early with a message
naming the argument (CONTRACT "Errors")."""
import pytest
import torch

from ngdn.tensor3d_inputs import NAMES, Tensor3DShape, tensor3d_inputs
from optimized import chunk_tensor3d, triton_mode
from reference import naive_tensor3d, second_features, second_query_key, state_size

SHAPE = Tensor3DShape(B=1, T=8, H=2, K=8, E=4, V=16)
DEV = triton_mode.device()


def inputs(draw="gla", gate="tile", dtype=torch.float32, **override):
    """Valid inputs of mode ``draw`` (also passed as ``mode``), then ``override``."""
    x = tensor3d_inputs(SHAPE, 0, draw, gate)
    args = {n: x[n].to(DEV, dtype) for n in NAMES}
    args["g"] = None if x["g"] is None else x["g"].to(DEV, dtype)
    args["beta"] = None if x["beta"] is None else x["beta"].to(DEV, dtype)
    args["initial_state"] = x["initial_state"].to(DEV, torch.float32)
    args["mode"] = draw
    args.update(override)
    return args


OPS = [pytest.param(chunk_tensor3d, id="optimized"), pytest.param(naive_tensor3d, id="reference")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name, bad, message", [
    ("k1", torch.zeros(1, 8, 2, 4), r"k1 must have shape \[B, T, H, K\] = \(1, 8, 2, 8\), got \(1, 8, 2, 4\)"),
    ("q2", torch.zeros(1, 8, 2, 4, 1), r"q2 must have 4 dimensions, got shape \(1, 8, 2, 4, 1\)"),
    ("k2", torch.zeros(1, 8, 2, 3), r"k2 must have shape \[B, T, H, E\] = \(1, 8, 2, 4\), got \(1, 8, 2, 3\)"),
    ("v", torch.zeros(1, 7, 2, 16), r"v must have shape \[B, T, H, V\] = \(1, 8, 2, 16\), got \(1, 7, 2, 16\)"),
    ("g", torch.zeros(1, 8, 2, 8), r"g must have shape \[B, T, H, E\] = \(1, 8, 2, 4\), got \(1, 8, 2, 8\)"),
    ("g", torch.zeros(1, 8, 2, 4, 8),
     r"g must have shape \[B, T, H, K, E\] = \(1, 8, 2, 8, 4\), got \(1, 8, 2, 4, 8\)"),
    ("g", torch.zeros(1, 8), r"g must have shape \[B, T, H\] = \(1, 8, 2\), \[B, T, H, E\] = \(1, 8, 2, 4\) "
                             r"or \[B, T, H, K, E\] = \(1, 8, 2, 8, 4\), got \(1, 8\)"),
    ("g", torch.zeros(1, 8, 3), r"g must have shape \[B, T, H\] = \(1, 8, 2\), got \(1, 8, 3\)"),
    ("initial_state", torch.zeros(1, 2, 8, 16),
     r"initial_state must have 5 dimensions, got shape \(1, 2, 8, 16\)"),
    ("initial_state", torch.zeros(1, 2, 4, 8, 16),
     r"initial_state must have shape \[B, H, K, E, V\] = \(1, 2, 8, 4, 16\), got \(1, 2, 4, 8, 16\)"),
    ("initial_state", torch.zeros(1, 2, 8, 4, 16, dtype=torch.bfloat16),
     r"initial_state must have dtype torch.float32, got torch.bfloat16"),
    ("v", torch.zeros(1, 8, 2, 16, dtype=torch.int64), r"v must have dtype in .*, got torch.int64"),
])
def test_bad_shape_or_dtype(op, name, bad, message):
    with pytest.raises(ValueError, match=message):
        op(**inputs(**{name: bad.to(DEV)}))


@pytest.mark.parametrize("op", OPS)
def test_bad_beta(op):
    with pytest.raises(ValueError, match=r"beta \[B, T, H\] is required in mode 'delta', got None"):
        op(**inputs("delta", beta=None))
    with pytest.raises(ValueError, match=r"beta must have 3 dimensions, got shape \(1, 8, 2, 1\)"):
        op(**inputs("delta", beta=torch.zeros(1, 8, 2, 1, device=DEV)))
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, H\] = \(1, 8, 2\), got \(1, 8, 1\)"):
        op(**inputs("delta", beta=torch.zeros(1, 8, 1, device=DEV)))
    with pytest.raises(ValueError, match="beta is only used in mode 'delta'; pass beta=None in mode 'gla'"):
        op(**inputs("gla", beta=torch.zeros(1, 8, 2, device=DEV)))


@pytest.mark.parametrize("op", OPS)
def test_bad_mode(op):
    with pytest.raises(ValueError, match=r"mode must be one of \['gla', 'delta'\], got 'kda'"):
        op(**inputs(mode="kda"))
    with pytest.raises(TypeError, match="mode must be a str"):
        op(**inputs(mode=1))


@pytest.mark.parametrize("op", OPS)
def test_not_a_tensor(op):
    with pytest.raises(TypeError, match="q1 must be a torch.Tensor, got list"):
        op(**inputs(q1=[[1.0]]))
    with pytest.raises(TypeError, match="g must be a torch.Tensor, got float"):
        op(**inputs(g=0.5))


@pytest.mark.parametrize("op", OPS)
def test_mixed_dtypes(op):
    args = inputs()
    args["k2"] = args["k2"].half()
    with pytest.raises(ValueError, match="k2 has dtype torch.float16 but q1 has torch.float32"):
        op(**args)
    args = inputs("delta")
    args["beta"] = args["beta"].half()
    with pytest.raises(ValueError, match="beta has dtype torch.float16 but q1 has torch.float32"):
        op(**args)


@pytest.mark.parametrize("op", OPS)
def test_empty_sequence(op):
    args = {n: (t[:, :0] if n in NAMES + ("g",) else t) for n, t in inputs().items()}
    with pytest.raises(ValueError, match="at least one token"):
        op(**args)


@pytest.mark.parametrize("op", OPS)
def test_bad_scale(op):
    with pytest.raises(TypeError, match="scale must be a float"):
        op(**inputs(), scale="0.5")
    with pytest.raises(ValueError, match="scale must be finite"):
        op(**inputs(), scale=float("nan"))


def test_reference_tensors_on_different_devices():
    args = inputs()
    args["v"] = torch.empty(args["v"].shape, device="meta")
    with pytest.raises(ValueError, match=f"v is on meta but q1 is on {DEV}"):
        naive_tensor3d(**args)


def test_optimized_rejects_float64():
    with pytest.raises(ValueError, match=r"q1 must have dtype in \['torch.bfloat16', "
                                         r"'torch.float32'\], got torch.float64"):
        chunk_tensor3d(**inputs(dtype=torch.float64))


def test_optimized_rejects_float64_state():
    with pytest.raises(ValueError, match="initial_state must have dtype torch.float32, got torch.float64"):
        chunk_tensor3d(**inputs(initial_state=torch.zeros(1, 2, 8, 4, 16, dtype=torch.float64, device=DEV)))


def test_optimized_rejects_wrong_device_for_mode():
    other = "meta" if DEV == "cpu" else "cpu"      # meta: a second device without CUDA, no memory
    args = {n: (t.to(other) if isinstance(t, torch.Tensor) else t) for n, t in inputs().items()}
    with pytest.raises(ValueError, match=f"q1 is on {other}, but optimized ops run on {DEV} tensors in "
                                         f"{triton_mode.MODE} mode"):
        chunk_tensor3d(**args)


def test_optimized_delta_rejects_wide_flattened_keys():
    B, T, H, K, E, V = 1, 8, 1, 64, 8, 16
    z = lambda *s: torch.zeros(*s, device=DEV)  # noqa: E731
    with pytest.raises(ValueError, match=r"flattened key width K·E must be <= 256 for fla's chunk_kda "
                                         r"\(mode 'delta'\), got K·E = 64·8 = 512"):
        chunk_tensor3d(z(B, T, H, K), z(B, T, H, K), z(B, T, H, E), z(B, T, H, E), z(B, T, H, V),
                       beta=z(B, T, H), mode="delta")


def test_second_query_key_helpers():
    x = torch.zeros(1, 2, 1, 3)
    with pytest.raises(ValueError, match=r"key_mode must be one of \['ones', 'sigmoid', 'softmax'\], got 'relu'"):
        second_query_key(x, x, "relu")
    with pytest.raises(TypeError, match="key_mode must be a str"):
        second_features(x, None)
    with pytest.raises(ValueError, match=r"k2_raw must have shape \[B, T, H, E\] \(the shape of q2_raw\) = "
                                         r"\(1, 2, 1, 3\), got \(1, 2, 1, 4\)"):
        second_query_key(x, torch.zeros(1, 2, 1, 4), "softmax")
    with pytest.raises(TypeError, match="q2_raw must be a torch.Tensor, got list"):
        second_query_key([0.0], x, "ones")
    with pytest.raises(ValueError, match=r"x must have a non-empty last axis E, got shape \(2, 0\)"):
        second_features(torch.zeros(2, 0), "sigmoid")


def test_state_size_arguments():
    with pytest.raises(ValueError, match=r"pairing must be one of \['diagonal', 'cross'\], got 'outer'"):
        state_size(4, 2, 8, "outer")
    with pytest.raises(ValueError, match="E must be >= 1, got 0"):
        state_size(4, 0, 8)
    with pytest.raises(TypeError, match="V must be an int, got float"):
        state_size(4, 2, 8.0)
