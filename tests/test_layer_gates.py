"""The layers' decay gate against an independent statement of it: fla's fused KDA gate
(``fla.ops.kda.gate.fused_kda_gate``, the Triton kernel behind ``use_gate_in_kernel=True`` in fla's
KDA chunk function), ``g = -exp(A_log) · softplus(a + dt_bias)``, forward and gradients in the
projection and both gate parameters. Both layer backends share ``layers.common.DecayGate``, so
comparing them cannot see a wrong gate; this does (its planted twin: a wrong formula, caught)."""
import pytest
import torch
import torch.nn.functional as F

from layers import GDN2, NestedGDN2
from layers.common import DecayGate
from ngdn.tolerances import assert_passes, compare, failures
from optimized import triton_mode

DEV = triton_mode.device()
LAYERS = {"gdn2": lambda: GDN2(16, num_heads=2, head_dim=8),
          "nested": lambda: NestedGDN2(16, num_heads=2, head_dim=8, num_levels=2)}


def gate_errors(layer, seed: int, log: bool = True) -> dict:
    """The layer's ``g`` (``proj(x)["g"]``, as its forward computes it) against fla's fused gate on the
    same projection ``a`` and parameters; gradients of ``Σ g · dg`` (random ``dg``) in ``a``, ``A_log``
    and ``dt_bias``. Gate parameters are moved off their initial values so every term matters."""
    from fla.ops.kda.gate import fused_kda_gate

    gen = torch.Generator().manual_seed(seed)
    proj = layer.proj
    with torch.no_grad():
        proj.decay.A_log.add_(torch.randn(proj.decay.A_log.shape, generator=gen).to(DEV))
        proj.decay.dt_bias.add_(torch.randn(proj.decay.dt_bias.shape, generator=gen).to(DEV))
    x = torch.randn(2, 10, 16, generator=gen).to(DEV)
    B, T = x.shape[:2]
    H, K = proj.heads, proj.head_dim
    ours_g = proj(x)["g"]
    a = proj.a_proj(x).view(B, T, H, K).detach()
    dg = torch.randn(ours_g.shape, generator=gen).to(DEV)

    def grads(g, a_leaf):
        return torch.autograd.grad((g * dg).sum(), [a_leaf, proj.decay.A_log, proj.decay.dt_bias])

    a_ours = a.clone().requires_grad_()
    ours = proj.decay(a_ours)
    a_fla = a.clone().requires_grad_()
    theirs = fused_kda_gate(a_fla, proj.decay.A_log, proj.decay.dt_bias)
    assert torch.equal(ours_g, ours), "proj's g is DecayGate of a_proj(x)"
    pairs = {"g": (ours, theirs)}
    for name, mine, fla in zip(("da", "dA_log", "ddt_bias"), grads(ours, a_ours), grads(theirs, a_fla)):
        pairs[name] = (mine, fla)
    return compare("layer_gate", torch.float32, pairs, mode="any", log=log)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_layer_gate_is_flas_in_kernel_gate(kind):
    torch.manual_seed(0)
    assert_passes(gate_errors(LAYERS[kind]().to(DEV), seed=1))


def test_a_wrong_gate_formula_is_caught(monkeypatch):
    """The twin: softplus applied before the bias (``-exp(A_log) · (softplus(a) + dt_bias)``)."""
    def wrong(self, a):
        bias = self.dt_bias.float().view(self.num_heads, self.head_dim)
        return -self.A_log.float().exp()[:, None] * (F.softplus(a.float()) + bias)

    monkeypatch.setattr(DecayGate, "forward", wrong)
    torch.manual_seed(0)
    errors = gate_errors(LAYERS["gdn2"]().to(DEV), seed=1, log=False)
    assert {"g", "da"} <= set(failures(errors)), errors
