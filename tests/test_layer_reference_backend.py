"""The layers on the reference backend are the float64 path: float64 end to end, with the short
convolutions and the output norms in PyTorch (``layers.common.causal_conv_silu``, ``rms_norm``:
fla's Triton convolution refuses float64, and fla's convolution and norm modules gave second-order
gradients silently wrong), and the gates and l2norm in float64. A gradient penalty's parameter
gradient (second order) agrees with central differences; the PyTorch forms equal fla's modules."""
import pytest
import torch
import torch.nn.functional as F

from layers import GDN2, NestedGDN2
from layers.common import GatedOutput, causal_conv_silu, rms_norm
from ngdn.tolerances import relative_error, tolerance
from optimized import triton_mode

F64 = torch.float64
EPS = 1e-6          # central differences' step, float64


def make(cls, **kw):
    torch.manual_seed(0)
    extra = dict(num_levels=2, intervals=[1], query_counts=[2]) if cls is NestedGDN2 else {}
    return cls(hidden_size=8, num_heads=1, head_dim=4, backend="reference", **extra, **kw).double()


def penalty(layer, x, c):
    """``‖∂(y·c)/∂x‖²``: a gradient penalty, whose parameter gradient is second order."""
    xx = x.clone().requires_grad_(True)
    g, = torch.autograd.grad((layer(xx)[0] * c).sum(), xx, create_graph=True)
    return (g * g).sum()


def second_order_error(layer, seed=1) -> float:
    """The penalty's directional derivative along a random direction of every parameter: autograd
    against central differences, relative (T = 70: level 1 fires once)."""
    gen = torch.Generator().manual_seed(seed)
    dev = next(layer.parameters()).device
    x, c = (torch.randn(1, 70, 8, generator=gen, dtype=F64).to(dev) for _ in range(2))
    params = list(layer.parameters())
    grads = torch.autograd.grad(penalty(layer, x, c), params, allow_unused=True)
    assert all(g is not None for g in grads), [n for (n, _), g in zip(layer.named_parameters(), grads) if g is None]
    d = [torch.randn(p.shape, generator=gen, dtype=F64).to(dev) for p in params]
    autograd = sum((g * di).sum() for g, di in zip(grads, d))
    with torch.no_grad():
        for p, di in zip(params, d):
            p.add_(EPS * di)
    plus = penalty(layer, x, c).detach()
    with torch.no_grad():
        for p, di in zip(params, d):
            p.sub_(2 * EPS * di)
    minus = penalty(layer, x, c).detach()
    return relative_error(autograd.reshape(1), ((plus - minus) / (2 * EPS)).reshape(1))


@pytest.mark.parametrize("cls", [GDN2, NestedGDN2])
def test_reference_backend_gives_second_order_gradients(cls):
    bound = tolerance("layer_reference_backend", "second_order", F64, mode="any")
    assert second_order_error(make(cls)) <= bound


@pytest.mark.mutation
def test_second_order_check_catches_fla_norms_in_the_reference_backend(monkeypatch):
    """With fla's norm modules on the reference backend (the layers before), the check fails. fla's
    norms are Triton kernels: on CUDA the layer and its inputs are on the GPU (the float64 check
    itself runs on any device)."""
    forward = GatedOutput.forward
    monkeypatch.setattr(GatedOutput, "forward", lambda self, o, h, plain=False: forward(self, o, h, plain=False))
    bound = tolerance("layer_reference_backend", "second_order", F64, mode="any")
    with pytest.raises(AssertionError):
        assert second_order_error(make(GDN2, use_short_conv=False).to(triton_mode.device())) <= bound


@pytest.mark.parametrize("cls", [GDN2, NestedGDN2])
def test_a_float64_layer_with_default_flags_runs_on_the_reference_backend(cls):
    layer = make(cls)
    x = torch.randn(2, 70, 8, dtype=F64, requires_grad=True)
    y = layer(x)[0]
    y.sum().backward()
    assert y.dtype == F64 and torch.isfinite(y).all() and torch.isfinite(x.grad).all()


def test_pytorch_forms_equal_fla_modules():
    """``causal_conv_silu`` and ``rms_norm`` (gated by SiLU) against fla's ``ShortConvolution``,
    ``RMSNorm`` and ``FusedRMSNormGated`` on the same float32 parameters."""
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution

    dev = triton_mode.device()
    torch.manual_seed(3)
    conv = ShortConvolution(hidden_size=12, kernel_size=4, bias=True, activation="silu", backend="triton").to(dev)
    norm, gated = RMSNorm(8, eps=1e-5).to(dev), FusedRMSNormGated(8, eps=1e-5).to(dev)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        gated.weight.uniform_(0.5, 1.5)
    x, o, z = torch.randn(2, 9, 12, device=dev), torch.randn(2, 9, 3, 8, device=dev), torch.randn(2, 9, 3, 8, device=dev)
    bound = tolerance("layer_reference_backend", "forms", torch.float32, mode="any")
    with torch.no_grad():
        assert relative_error(causal_conv_silu(conv, x), conv(x)[0]) <= bound
        assert relative_error(rms_norm(o, norm.weight, norm.eps), norm(o)) <= bound
        assert relative_error(rms_norm(o, gated.weight, gated.eps) * F.silu(z), gated(o, z)) <= bound


def test_the_pytorch_forms_refuse_mismatched_shapes():
    from fla.modules import ShortConvolution

    conv = ShortConvolution(hidden_size=12, kernel_size=4, activation="silu", backend="triton")
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 12\]"):
        causal_conv_silu(conv, torch.zeros(2, 9, 8))
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        rms_norm(torch.zeros(2, 8), torch.ones(4), 1e-5)
