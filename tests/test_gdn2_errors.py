"""Bad input to the level-0 entry points fails early with a message naming the argument."""
import pytest
import torch

from ngdn.inputs import GDN2Shape, gdn2_inputs
from optimized import chunk_gdn2, triton_mode
from reference import naive_gdn2

SHAPE = GDN2Shape(B=1, T=8, H=2, K=16, V=16)
NAMES = ("q", "k", "v", "g", "b", "w")


def inputs(dtype=torch.float32, **override):
    x = gdn2_inputs(SHAPE, seed=0)
    args = {n: x[n].to(triton_mode.device(), dtype) for n in NAMES}
    args["initial_state"] = x["initial_state"].to(triton_mode.device(), torch.float32)
    args.update(override)
    return args


OPS = [pytest.param(chunk_gdn2, id="optimized"), pytest.param(naive_gdn2, id="reference")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name, bad, message", [
    ("k", torch.zeros(1, 8, 2, 8), r"k must have shape \[B, T, H, K\] = \(1, 8, 2, 16\), got \(1, 8, 2, 8\)"),
    ("g", torch.zeros(1, 8, 2, 16, 1), r"g must have 4 dimensions, got shape \(1, 8, 2, 16, 1\)"),
    ("v", torch.zeros(1, 7, 2, 16), r"v must have shape \[B, T, H, V\] = \(1, 8, 2, 16\), got \(1, 7, 2, 16\)"),
    ("w", torch.zeros(1, 8, 2, 32), r"w must have shape \[B, T, H, V\] = \(1, 8, 2, 16\), got \(1, 8, 2, 32\)"),
    ("initial_state", torch.zeros(1, 2, 16, 8),
     r"initial_state must have shape \[B, H, K, V\] = \(1, 2, 16, 16\), got \(1, 2, 16, 8\)"),
    ("initial_state", torch.zeros(1, 2, 16, 16, dtype=torch.bfloat16),
     r"initial_state must have dtype torch.float32, got torch.bfloat16"),
    ("b", torch.zeros(1, 8, 2, 16, dtype=torch.int64), r"b must have dtype in .*, got torch.int64"),
])
def test_bad_shape_or_dtype(op, name, bad, message):
    args = inputs(**{name: bad.to(triton_mode.device())})
    with pytest.raises(ValueError, match=message):
        op(**args)


@pytest.mark.parametrize("op", OPS)
def test_not_a_tensor(op):
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        op(**inputs(q=[[1.0]]))


@pytest.mark.parametrize("op", OPS)
def test_mixed_dtypes(op):
    args = inputs()
    args["v"] = args["v"].half()
    with pytest.raises(ValueError, match="v has dtype torch.float16 but q has torch.float32"):
        op(**args)


@pytest.mark.parametrize("op", OPS)
def test_empty_sequence(op):
    args = inputs()
    args = {n: (t[:, :0] if n in NAMES else t) for n, t in args.items()}
    with pytest.raises(ValueError, match="at least one token"):
        op(**args)


@pytest.mark.parametrize("op", OPS)
def test_bad_scale(op):
    with pytest.raises(TypeError, match="scale must be a float"):
        op(**inputs(), scale="0.5")


def test_optimized_rejects_float64():
    with pytest.raises(ValueError, match=r"q must have dtype in \['torch.bfloat16', "
                                         r"'torch.float32'\], got torch.float64"):
        chunk_gdn2(**inputs(dtype=torch.float64))


OTHER = "meta" if triton_mode.device() == "cpu" else "cpu"   # meta: a second device without CUDA


def test_optimized_rejects_wrong_device_for_mode():
    with pytest.raises(ValueError, match=f"q is on {OTHER}, but optimized ops run on {triton_mode.device()} "
                                         f"tensors in {triton_mode.MODE} mode"):
        chunk_gdn2(**{n: t.to(OTHER) for n, t in inputs().items()})


@pytest.mark.parametrize("op", OPS)
def test_tensors_on_different_devices(op):
    args = inputs()
    args["v"] = args["v"].to(OTHER)
    with pytest.raises(ValueError, match=f"v is on {OTHER} but q is on {triton_mode.device()}"):
        op(**args)


def test_optimized_rejects_wide_keys():
    shape = (1, 8, 1, 512)
    args = {n: torch.zeros(shape, device=triton_mode.device()) for n in ("q", "k", "g", "b")}
    args.update(v=torch.zeros(1, 8, 1, 16, device=triton_mode.device()),
                w=torch.zeros(1, 8, 1, 16, device=triton_mode.device()))
    with pytest.raises(ValueError, match="key dim K must be <= 256"):
        chunk_gdn2(**args)
