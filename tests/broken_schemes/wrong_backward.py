"""BROKEN ON PURPOSE (tests/test_scheme_check.py): ``learned`` whose erase gate goes through a
hand-written sigmoid whose backward forgets the factor ``(1 − σ)``. Forward values are right,
so only a gradient check sees it: ``probe_gradcheck`` fails."""
import torch

from reference.schemes import learned_parameter_shapes, l2norm, register_scheme


class SigmoidWrongBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        s, = ctx.saved_tensors
        return grad * s                          # should be grad * s * (1 - s)


def wrong_backward(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    κ = l2norm(ν @ params["W_K"])
    β = SigmoidWrongBackward.apply(ν @ params["W_beta"])
    ω = torch.sigmoid(ν @ params["W_omega"])
    γ_i = -torch.nn.functional.softplus(ν @ params["W_gamma"])
    return κ, ν, β, ω, γ_i.mean(-2) if reduction == "mean" else γ_i.sum(-2)


register_scheme("broken_wrong_backward", wrong_backward, learned_parameter_shapes)
