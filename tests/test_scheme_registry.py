"""The scheme registry's errors (SPEC "Errors", Registry): a taken name needs ``replace=True``
(built-ins included), a probe or ``parameter_shapes`` that is not callable is refused at
once, and a probe's outputs are checked against the shapes of SPEC section 2; every error
names the scheme."""
import pytest
import torch

from reference.schemes import SCHEMES, gates, get_scheme, l2norm, reduce_log_decay, register_scheme

H, K, V, n = 2, 8, 4, 3


def shapes(H, K, V, n):
    return {"Q": (H, n, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}


def good_probe(M_below, params, reduction="mean"):
    ν = params["Q"] @ M_below
    κ = l2norm(params["Q"]).expand(*ν.shape[:-1], -1)
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)


def inputs():
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.randn(*s, generator=gen, dtype=torch.float64) for k, s in shapes(H, K, V, n).items()}
    return torch.randn(1, H, K, V, generator=gen, dtype=torch.float64), params


@pytest.fixture
def registry():
    """Restore the registry after the test (it registers throwaway schemes)."""
    saved = dict(SCHEMES)
    yield
    SCHEMES.clear()
    SCHEMES.update(saved)


def test_a_taken_name_needs_replace(registry):
    register_scheme("registry_probe", good_probe, shapes)
    with pytest.raises(ValueError, match="'registry_probe' is already registered.*replace=True"):
        register_scheme("registry_probe", good_probe, shapes)
    register_scheme("registry_probe", good_probe, shapes, replace=True)


@pytest.mark.parametrize("name", ["learned", "merge"])
def test_a_builtin_name_needs_replace(registry, name):
    builtin = SCHEMES[name]
    with pytest.raises(ValueError, match=f"'{name}' is already registered"):
        register_scheme(name, good_probe, shapes)
    assert SCHEMES[name] is builtin


@pytest.mark.parametrize("which", ["probe", "parameter_shapes"])
def test_a_non_callable_is_refused_at_once_naming_the_scheme(registry, which):
    args = {"probe": good_probe, "parameter_shapes": shapes, which: {"Q": (H, n, K)}}
    with pytest.raises(TypeError, match=f"scheme 'not_callable'.*{which} must be callable"):
        register_scheme("not_callable", args["probe"], args["parameter_shapes"])
    assert "not_callable" not in SCHEMES


def bad_output(index, fn):
    """``good_probe`` with output ``index`` replaced by ``fn(output)``."""
    def probe(M_below, params, reduction="mean"):
        outs = list(good_probe(M_below, params, reduction))
        outs[index] = fn(outs[index])
        return tuple(outs)
    return probe


@pytest.mark.parametrize("probe, message", [
    (bad_output(0, lambda κ: κ[..., :-1]), r"output κ must have shape \[\.\.\., H, n, K\] = \(1, 2, 3, 8\) \(n = 3\), got \(1, 2, 3, 7\)"),
    (bad_output(1, lambda ν: ν.transpose(-1, -2)), r"ν must have shape \[\.\.\., H, n, V\]"),
    (bad_output(2, lambda β: β[..., :1, :]), r"β must have shape \[\.\.\., H, n, K\]"),
    (bad_output(3, lambda ω: ω[0]), r"ω must have shape \[\.\.\., H, n, V\]"),
    (bad_output(4, lambda γ: γ[..., None, :]), r"γ must have shape \[\.\.\., H, K\]"),
    (bad_output(4, lambda γ: γ.float()), r"output γ has dtype torch.float32 but M_below has torch.float64"),
    (bad_output(0, lambda κ: κ.detach().numpy()), r"output κ must be a torch.Tensor"),
    (lambda M_below, params, reduction="mean": good_probe(M_below, params, reduction)[:4],
     r"must return 5 tensors \(κ, ν, β, ω, γ\), got a tuple of 4"),
], ids=["kappa_K", "nu_transposed", "beta_one_pair", "omega_no_batch", "gamma_per_pair", "gamma_dtype",
        "kappa_numpy", "four_outputs"])
def test_probe_outputs_are_checked_naming_the_scheme(registry, probe, message):
    register_scheme("bad_outputs", probe, shapes)
    M_below, params = inputs()
    with pytest.raises(ValueError, match=f"scheme 'bad_outputs'.*{message}"):
        get_scheme("bad_outputs").probe(M_below, params)


def test_a_good_probe_passes_the_output_check(registry):
    register_scheme("good_outputs", good_probe, shapes)
    M_below, params = inputs()
    κ, ν, β, ω, γ = get_scheme("good_outputs").probe(M_below, params)
    assert κ.shape == (1, H, n, K) and γ.shape == (1, H, K)
