"""The scheme registry's errors (CONTRACT "Errors", Registry): a taken name needs ``replace=True``
(built-ins included), a probe or ``parameter_shapes`` that is not callable is refused at
once, and a probe's outputs are checked against the shapes of CONTRACT section 2; every error
names the scheme."""
import pytest
import torch

from ngdn.scheme_check import registry_restored
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
    with registry_restored():
        yield


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


def p_shapes(H, K, V, n):
    return {"P": (H, n, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}


def p_probe(M_below, params, reduction="mean"):
    return good_probe(M_below, {"Q": params["P"], **{k: v for k, v in params.items() if k != "P"}}, reduction)


def test_the_query_count_is_read_from_the_declared_shapes_not_a_name(registry):
    """A query bank called ``P``: its axis 1 is the query axis, so ``make_levels(query_counts=[4])``
    gives 4 pairs and the nested reference runs; a bank larger than K is refused naming ``P``."""
    from reference.nested import make_levels, naive_nested_gdn2

    register_scheme("p_bank", p_probe, p_shapes)
    assert SCHEMES["p_bank"].query_axes == (("P", 1),) and SCHEMES["learned"].query_axes == (("Q", 1),)
    assert SCHEMES["merge"].query_axes == ()
    level, = make_levels(2, H, K, V, scheme="p_bank", query_counts=[4])
    M_below = torch.randn(1, H, K, V, dtype=torch.float64)
    assert get_scheme("p_bank").probe(M_below, level.params)[0].shape == (1, H, 4, K)
    assert get_scheme("p_bank").query_count(level.params, H, K, V) == 4
    assert get_scheme("merge").query_count(make_levels(2, H, K, V, scheme="merge")[0].params, H, K, V) == K
    B, T, L = 1, 5, 2
    q = torch.randn(B, T, H, L, K, dtype=torch.float64)
    k, g, b = (torch.randn(B, T, H, K, dtype=torch.float64) for _ in range(3))
    v, w = (torch.randn(B, T, H, V, dtype=torch.float64) for _ in range(2))
    o, _ = naive_nested_gdn2(q, k, v, -g.abs(), b.sigmoid(), w.sigmoid(), torch.zeros(B, T, H, L, dtype=torch.float64),
                             [level], chunk_size=2)
    assert o.shape == (B, T, H, V)
    too_many = {**level.params, "P": torch.zeros(H, K + 1, K, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"params\['P'\] holds n = 9 queries but K = 8"):
        get_scheme("p_bank").probe(M_below, too_many)


@pytest.mark.parametrize("shapes_fn, message", [
    (lambda H, K, V, n: {"P": (H, n + 1, K)}, r"cannot determine the query count n.*axis 1 of 'P' depends on n "
                                              r"without being of size n \(sizes \[2, 3, 6\]"),
    (lambda H, K, V, n: {"W": (H, 2 * n)}, r"cannot determine the query count n.*axis 1 of 'W'"),
    (lambda H, K, V, n: {"P": (H, n, K)} if n < 5 else {"R": (H, n, K)}, r"must declare the same parameters"),
    (lambda H, K, V, n: [("P", (H, n, K))], r"must return a dict \{name: shape tuple of ints\}"),
    (lambda H, K, V, n: {"P": (H, n, K // 0)}, r"parameter_shapes\(3, 16, 12, 1\) raised ZeroDivisionError"),
], ids=["n_plus_one", "two_n", "names_change", "not_a_dict", "raises"])
def test_shapes_from_which_n_cannot_be_read_are_refused_at_once(registry, shapes_fn, message):
    with pytest.raises((ValueError, TypeError), match=f"scheme 'unreadable'.*{message}"):
        register_scheme("unreadable", good_probe, shapes_fn)
    assert "unreadable" not in SCHEMES


def test_a_probe_without_a_query_axis_returns_at_most_K_pairs(registry):
    def many_pairs(M_below, params, reduction="mean"):
        κ, ν, β, ω, γ = good_probe(M_below, params, reduction)
        cat = lambda x: torch.cat([x, x], dim=-2)  # noqa: E731
        return cat(κ), cat(ν), cat(β), cat(ω), γ

    fixed = lambda H, K, V, n: {"Q": (H, 5, K), "W_beta": (H, V, K), "W_omega": (H, V, V),  # noqa: E731
                                "W_gamma": (H, V, K)}
    register_scheme("ten_pairs", many_pairs, fixed)
    assert SCHEMES["ten_pairs"].query_axes == ()
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.randn(*s, generator=gen, dtype=torch.float64) for k, s in fixed(H, K, V, 0).items()}
    with pytest.raises(ValueError, match=r"scheme 'ten_pairs': probe returned n = 10 pairs .* but K = 8"):
        get_scheme("ten_pairs").probe(torch.randn(1, H, K, V, dtype=torch.float64), params)


def test_the_numpy_twin_refuses_a_scheme_registered_over_a_builtin(registry):
    """``SCHEMES_NUMPY`` holds the built-ins' twins by name: once a built-in's name is registered
    again (``replace=True``), the nested NumPy twin has no twin for it and says so, instead of
    running the built-in's."""
    import numpy as np
    from ngdn.nested_inputs import NestedShape, nested_inputs
    from reference import naive_nested_gdn2_numpy
    from reference.nested import Level
    x = nested_inputs(NestedShape(B=1, T=70, H=1, L=2, K=8, V=8), seed=0, scheme="learned")
    acts = {k: x[k].numpy() for k in ("q", "k", "v", "g", "b", "w", "r")}
    levels = [Level(lv.scheme, lv.interval, {k: p.numpy() for k, p in lv.params.items()}, lv.reduction)
              for lv in x["levels"]]
    naive_nested_gdn2_numpy(**acts, levels=levels)                 # the built-in: computed
    builtin = SCHEMES["learned"]
    register_scheme("learned", builtin.probe, builtin.parameter_shapes, replace=True)
    with pytest.raises(ValueError, match=r"levels\[0\].*'learned' was registered over the built-in.*still the "
                                         r"built-in's"):
        naive_nested_gdn2_numpy(**acts, levels=levels)
    assert np.isfinite(acts["q"]).all()
