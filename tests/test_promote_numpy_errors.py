"""The NumPy twins of promote and of the schemes (``reference.promote_numpy``, one head at a time)
share the PyTorch references' checks (CONTRACT "Errors": "This holds for the NumPy twins too"): what
``promote`` and a registered probe refuse, they refuse with the same error, instead of computing
it or failing inside NumPy."""
import importlib

import numpy as np
import pytest

from reference import SCHEMES_NUMPY, promote_numpy, promote_sequential_numpy

K, V = 4, 3
RNG = np.random.default_rng(0)


def pairs(n, K=K, V=V):
    return (RNG.standard_normal((K, V)), RNG.standard_normal((n, K)), RNG.standard_normal((n, V)),
            RNG.random((n, K)), RNG.random((n, V)))


def learned_params(n, K=K, V=V):
    return {"Q": RNG.standard_normal((n, K)), "W_K": RNG.standard_normal((V, K)),
            "W_beta": RNG.standard_normal((V, K)), "W_omega": RNG.standard_normal((V, V)),
            "W_gamma": RNG.standard_normal((V, K))}


def test_good_inputs_compute():
    M, κ, ν, β, ω = pairs(2)
    assert promote_numpy(M, κ, ν, β, ω, -RNG.random(K)).shape == (K, V)
    assert promote_sequential_numpy(M, κ, ν, β, ω, -RNG.random((2, K))).shape == (K, V)
    κ, ν, β, ω, γ = SCHEMES_NUMPY["learned"](M, learned_params(2))
    assert κ.shape == (2, K) and ν.shape == (2, V) and γ.shape == (K,)


@pytest.mark.parametrize("case, message", [
    ("more pairs than K", r"κ holds n = 5 pairs but K = 4"),
    ("γ of one channel", r"γ must have shape \[\.\.\., K\] = \(4,\), got \(1,\)"),
    ("ν of another V", r"ν must have shape \[\.\.\., n, V\] = \(2, 3\), got \(2, 2\)"),
    ("M not an array", r"M must be"),
])
def test_promote_numpy_refuses_what_promote_refuses(case, message):
    n = 5 if case == "more pairs than K" else 2
    M, κ, ν, β, ω = pairs(n)
    γ = -RNG.random(1 if case == "γ of one channel" else K)
    if case == "ν of another V":
        ν = ν[:, :2]
    if case == "M not an array":
        M = M.tolist()
    with pytest.raises((ValueError, TypeError), match=message):
        promote_numpy(M, κ, ν, β, ω, γ)


def test_promote_sequential_numpy_refuses_more_pairs_than_K():
    M, κ, ν, β, ω = pairs(5)
    with pytest.raises(ValueError, match=r"κ holds n = 5 pairs but K = 4"):
        promote_sequential_numpy(M, κ, ν, β, ω, -RNG.random((5, K)))


@pytest.mark.parametrize("case, message", [
    ("query bank larger than K", r"a query bank larger than K is not allowed"),
    ("unknown reduction", r"reduction must be one of"),
    ("W_omega of another V", r"W_omega"),
])
def test_scheme_twins_refuse_what_the_registered_probes_refuse(case, message):
    params = learned_params(5 if case == "query bank larger than K" else 2)
    if case == "W_omega of another V":
        params["W_omega"] = params["W_omega"][:, :2]
    reduction = "bogus" if case == "unknown reduction" else "mean"
    with pytest.raises(ValueError, match=message):
        SCHEMES_NUMPY["learned"](RNG.standard_normal((K, V)), params, reduction)


def test_a_scheme_twin_whose_outputs_break_the_shapes_is_named():
    """The output check runs on the twins too (a twin edited to return a wrong γ is caught, named)."""
    module = importlib.import_module("reference.promote_numpy")   # the package re-exports a function of its name
    broken = module._checked_scheme("learned", lambda M, p, r="mean": module.learned_numpy(M, p, r)[:4]
                                    + (np.zeros(K + 1),))
    with pytest.raises(ValueError, match=r"scheme 'learned': probe output γ must have shape"):
        broken(RNG.standard_normal((K, V)), learned_params(2))


def test_a_twin_registered_from_a_scheme_file_runs_in_the_nested_twin():
    """docs/schemes.md, "Adding a promotion scheme": a scheme's NumPy twin is an entry of ``SCHEMES_NUMPY``;
    the nested twin runs it (as registered) and agrees with the PyTorch reference."""
    import torch
    from ngdn.nested_inputs import NestedShape, nested_inputs
    from reference import naive_nested_gdn2, naive_nested_gdn2_numpy
    from reference.nested import Level
    from ngdn.scheme_check import registry_restored
    from reference.schemes import get_scheme, register_scheme
    module = importlib.import_module("reference.promote_numpy")
    with registry_restored():
        builtin = get_scheme("learned")
        register_scheme("learned_copy", builtin.probe, builtin.parameter_shapes)
        SCHEMES_NUMPY["learned_copy"] = module.learned_numpy              # a plain, unwrapped twin
        x = nested_inputs(NestedShape(B=1, T=70, H=2, L=2, K=8, V=8), seed=0, scheme="learned")
        levels = [Level("learned_copy", lv.interval, lv.params, lv.reduction) for lv in x["levels"]]
        acts = {k: x[k] for k in ("q", "k", "v", "g", "b", "w", "r")}
        o_ref = naive_nested_gdn2(**acts, levels=levels)[0]
        o_np = naive_nested_gdn2_numpy(**{k: t.numpy() for k, t in acts.items()}, levels=[
            Level(lv.scheme, lv.interval, {k: p.numpy() for k, p in lv.params.items()}, lv.reduction)
            for lv in levels])[0]
        assert np.allclose(o_np, o_ref.numpy(), rtol=0, atol=1e-12)
        assert torch.isfinite(o_ref).all()


def test_unchecked_twin_names_a_scheme_without_one():
    module = importlib.import_module("reference.promote_numpy")
    with pytest.raises(ValueError, match=r"scheme 'nope' has no NumPy twin"):
        module.unchecked_twin("nope")
