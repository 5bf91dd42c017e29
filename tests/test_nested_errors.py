"""Bad input to Nested GDN-2 (CONTRACT "Errors"), its schemes and promote fails early with a
message naming the argument. The nested checks run on the reference and, once it
exists, on ``optimized.nested.chunk_nested_gdn2`` (same ``validate_nested_inputs``)."""
import importlib.util

import pytest
import torch

from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import triton_mode
from reference import Level, make_levels, naive_nested_gdn2, promote
from reference.schemes import get_scheme

SHAPE = NestedShape(B=1, T=8, H=2, L=3, K=8, V=4)
NAMES = ("q", "k", "v", "g", "b", "w", "r")


def inputs(dtype=torch.float32, **override):
    x = nested_inputs(SHAPE, seed=0, query_counts=[2, 4])
    dev = triton_mode.device()
    args = {n: x[n].to(dev, dtype) for n in NAMES}
    args["levels"] = [Level(lv.scheme, lv.interval, {k: p.to(dev, torch.float32) for k, p in lv.params.items()},
                            lv.reduction) for lv in x["levels"]]
    args["initial_states"] = [s.to(dev, torch.float32) for s in x["initial_states"]]
    args.update(override)
    return args


def with_level(args, i, **changes):
    lv = args["levels"][i]
    levels = list(args["levels"])
    levels[i] = Level(**{"scheme": lv.scheme, "interval": lv.interval, "params": dict(lv.params),
                         "reduction": lv.reduction, **changes})
    return {**args, "levels": levels}


def with_param(args, i, key, value):
    return with_level(args, i, params={**args["levels"][i].params, key: value})


def _optimized_op():
    if importlib.util.find_spec("optimized.nested") is None:
        return None
    from optimized.nested import chunk_nested_gdn2
    return chunk_nested_gdn2


OPS = [pytest.param(naive_nested_gdn2, id="reference"),
       pytest.param(_optimized_op(), id="optimized",
                    marks=pytest.mark.skipif(_optimized_op() is None, reason="optimized.nested not built yet"))]

H, K, V = SHAPE.H, SHAPE.K, SHAPE.V
Z = lambda *s, dtype=torch.float32: torch.zeros(*s, dtype=dtype, device=triton_mode.device())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("change, error, message", [
    # a query bank larger than K
    (lambda a: with_param(a, 0, "Q", Z(H, K + 1, K)), ValueError,
     r"levels\[0\].params\['Q'\] holds n = 9 queries but K = 8: a query bank larger than K is not allowed"),
    # a non-positive or non-integer firing interval
    (lambda a: with_level(a, 1, interval=0), ValueError,
     r"levels\[1\] \(level ℓ = 2\).interval must be a positive number of chunks \(f_ℓ ≥ 1\), got 0"),
    (lambda a: with_level(a, 0, interval=-2), ValueError, r"interval must be a positive number of chunks"),
    (lambda a: with_level(a, 0, interval=1.5), TypeError, r"levels\[0\] \(level ℓ = 1\).interval must be an int"),
    # a router with the wrong number of levels, levels not matching q
    (lambda a: {**a, "r": a["r"][..., :2]}, ValueError,
     r"r must have shape \[B, T, H, L\] = \(1, 8, 2, 3\) with one router logit per level "
     r"\(r.shape\[-1\] = L = len\(levels\) \+ 1 = 3\), got \(1, 8, 2, 2\)"),
    (lambda a: {**a, "levels": a["levels"][:1]}, ValueError,
     r"q has L = 3 levels \(q.shape\[3\]\) but levels has 1 entries; expected len\(levels\) = L - 1 = 2"),
    (lambda a: {**a, "levels": a["levels"][0]}, TypeError, r"levels must be a list of Level, got Level"),
    (lambda a: {**a, "levels": [a["levels"][0], {"scheme": "merge"}]}, TypeError,
     r"levels\[1\] \(level ℓ = 2\) must be a reference.nested.Level, got dict"),
    # shapes
    (lambda a: {**a, "k": Z(1, 8, 2, 4)}, ValueError,
     r"k must have shape \[B, T, H, K\] = \(1, 8, 2, 8\), got \(1, 8, 2, 4\)"),
    (lambda a: {**a, "w": Z(1, 7, 2, 4)}, ValueError,
     r"w must have shape \[B, T, H, V\] = \(1, 8, 2, 4\), got \(1, 7, 2, 4\)"),
    (lambda a: {**a, "q": Z(1, 8, 2, 8)}, ValueError, r"q must have 5 dimensions, got shape \(1, 8, 2, 8\)"),
    (lambda a: {**a, "q": Z(1, 0, 2, 3, 8), **{n: a[n][:, :0] for n in NAMES[1:]}}, ValueError,
     r"q must hold at least one token, got T = 0"),
    # dtypes and devices
    (lambda a: {**a, "v": a["v"].bfloat16()}, ValueError, r"v has dtype torch.bfloat16 but q has torch.float32"),
    (lambda a: {**a, "r": a["r"].bfloat16()}, ValueError, r"r has dtype torch.bfloat16 but q has torch.float32"),
    (lambda a: {**a, "g": a["g"].to(torch.int32)}, ValueError, r"g must have dtype in .*, got torch.int32"),
    (lambda a: {**a, "b": a["b"].to("meta")}, ValueError, r"b is on meta but q is on"),
    (lambda a: with_param(a, 1, "W_gamma", a["levels"][1].params["W_gamma"].to("meta")), ValueError,
     r"levels\[1\].params\['W_gamma'\] is on meta but q is on"),
    # initial states
    (lambda a: {**a, "initial_states": a["initial_states"][:2]}, ValueError,
     r"initial_states must be None or a list of L = 3 entries"),
    (lambda a: {**a, "initial_states": [None, Z(1, 2, 8, 4, dtype=torch.bfloat16), None]}, ValueError,
     r"initial_states\[1\] must have dtype torch.float32, got torch.bfloat16"),
    (lambda a: {**a, "initial_states": [Z(1, 2, 4, 8), None, None]}, ValueError,
     r"initial_states\[0\] must have shape \[B, H, K, V\] = \(1, 2, 8, 4\), got \(1, 2, 4, 8\)"),
    # parameters: shapes, keys, finiteness
    (lambda a: with_param(a, 0, "W_K", Z(H, K, V)), ValueError,
     r"levels\[0\].params\['W_K'\] for scheme 'learned' must have shape \(2, 4, 8\) \(H=2, K=8, V=4, n=2\), "
     r"got \(2, 8, 4\)"),
    (lambda a: with_param(a, 1, "W_omega", Z(1, V, V)), ValueError,
     r"levels\[1\].params\['W_omega'\] for scheme 'learned' must have shape \(2, 4, 4\)"),
    (lambda a: with_level(a, 0, params={k: p for k, p in a["levels"][0].params.items() if k != "W_beta"}),
     ValueError, r"levels\[0\].params for scheme 'learned' must have keys .*; missing \['W_beta'\], unexpected \[\]"),
    (lambda a: with_param(a, 0, "bias", Z(H, K)), ValueError, r"missing \[\], unexpected \['bias'\]"),
    (lambda a: with_param(a, 0, "W_gamma", torch.full((H, V, K), float("nan"), device=triton_mode.device())),
     ValueError, r"levels\[0\].params\['W_gamma'\] contains non-finite values"),
    (lambda a: with_param(a, 1, "Q", torch.full((H, 4, K), float("inf"), device=triton_mode.device())),
     ValueError, r"levels\[1\].params\['Q'\] contains non-finite values"),
    (lambda a: with_level(a, 0, params="W"), TypeError, r"levels\[0\].params must be a dict of tensors, got str"),
    # scheme and reduction
    (lambda a: with_level(a, 0, scheme="fancy"), ValueError,
     r"unknown scheme 'fancy'; registered schemes: \[.*'learned'.*'merge'.*\]"),
    (lambda a: with_level(a, 1, reduction="max"), ValueError,
     r"levels\[1\] \(level ℓ = 2\).reduction must be one of \['mean', 'sum'\], got 'max'"),
    (lambda a: {**a, "scale": "big"}, TypeError, r"scale must be a float or None, got str"),
])
def test_bad_nested_input(op, change, error, message):
    args = change(inputs())
    with pytest.raises(error, match=message):
        op(**args)


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        naive_nested_gdn2(**inputs(), chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an int, got float"):
        naive_nested_gdn2(**inputs(), chunk_size=8.0)


def test_merge_rejects_a_query_bank():
    """merge has no Q (n = K): passing one is an unexpected parameter."""
    args = inputs()
    merge_params = make_levels(2, H, K, V, scheme="merge", generator=torch.Generator().manual_seed(0),
                               dtype=torch.float32)[0].params
    args = with_level(args, 0, scheme="merge", params={**merge_params, "Q": Z(H, 2, K)})
    with pytest.raises(ValueError, match=r"unexpected \['Q'\]"):
        naive_nested_gdn2(**args)


# --- the probes and promote called directly ----------------------------------------------

PARAMS = make_levels(2, H, K, V, query_counts=[3], generator=torch.Generator().manual_seed(0))[0].params
M_BELOW = torch.zeros(1, H, K, V, dtype=torch.float64)


@pytest.mark.parametrize("M_below, params, reduction, error, message", [
    (M_BELOW, {**PARAMS, "Q": torch.zeros(H, K + 1, K, dtype=torch.float64)}, "mean", ValueError,
     r"params\['Q'\] holds n = 9 queries but K = 8: a query bank larger than K is not allowed \(n ≤ K"),
    (M_BELOW, PARAMS, "median", ValueError, r"reduction must be one of \['mean', 'sum'\], got 'median'"),
    (M_BELOW.float(), PARAMS, "mean", ValueError,
     r"params\['Q'\] has dtype torch.float64 but M_below has torch.float32"),
    (M_BELOW[0, 0], PARAMS, "mean", ValueError, r"M_below must have shape \[..., H, K, V\], got \(8, 4\)"),
    (torch.zeros(1, 3, K, V, dtype=torch.float64), PARAMS, "mean", ValueError,
     r"params\['Q'\] for scheme 'learned' must have shape \(3, 3, 8\)"),
    ([[0.0]], PARAMS, "mean", TypeError, r"M_below must be a torch.Tensor, got list"),
])
def test_bad_probe_input(M_below, params, reduction, error, message):
    with pytest.raises(error, match=message):
        get_scheme("learned").probe(M_below, params, reduction)


def test_unknown_scheme_lookup():
    with pytest.raises(ValueError, match=r"unknown scheme 'nope'"):
        get_scheme("nope")
    with pytest.raises(TypeError, match=r"scheme must be a str"):
        get_scheme(3)


def _pairs(n=2, **override):
    x = {"M": torch.zeros(2, K, V), "κ": torch.zeros(2, n, K), "ν": torch.zeros(2, n, V),
         "β": torch.zeros(2, n, K), "ω": torch.zeros(2, n, V), "γ": torch.zeros(2, K)}
    x.update(override)
    return [x[n] for n in ("M", "κ", "ν", "β", "ω", "γ")]


@pytest.mark.parametrize("args, message", [
    (_pairs(n=K + 1), r"κ holds n = 9 pairs but K = 8: more pairs than K is not allowed \(n ≤ K\)"),
    (_pairs(ν=torch.zeros(2, 2, V + 1)), r"ν must have shape \[..., n, V\] = \(2, 2, 4\), got \(2, 2, 5\)"),
    (_pairs(γ=torch.zeros(2, 2, K)), r"γ must have shape \[..., K\] = \(2, 8\), got \(2, 2, 8\)"),
    (_pairs(κ=torch.zeros(2, K)), r"κ must have shape \[..., n, K\]"),
    (_pairs(β=torch.zeros(2, 2, K, dtype=torch.float64)), r"β has dtype torch.float64 but M has torch.float32"),
])
def test_bad_promote_input(args, message):
    with pytest.raises(ValueError, match=message):
        promote(*args)


def test_make_levels_lengths():
    with pytest.raises(ValueError, match=r"intervals must have L - 1 = 2 entries, got 1"):
        make_levels(3, H, K, V, intervals=[1])
