"""The nested op's per-call host savings keep its results: the backward's weights ``W`` reused from
the forward only for the very tensors, unmodified, that made them (``probe_fused._weights``); the
scheme parameters' float32 copies detached (``param_casts.float32_params``, with and without grad
mode); the final states made only when asked for (L copies fewer a call). Each check fails on a
broken twin defined here."""
import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import optimized.nested.function as function
import optimized.nested.probe_fused as probe_fused
import optimized.nested.param_casts as param_casts
from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import chunk_nested_gdn2, triton_mode
from reference.nested import Level

DEV = triton_mode.device()
NAMES = ("q", "k", "v", "g", "b", "w", "r")


def _probe_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    H, K, V, n, B, F = 2, 8, 6, 4, 2, 2
    rnd = lambda *s: torch.randn(*s, generator=gen).to(DEV)      # noqa: E731
    params = {"Q": rnd(H, n, K) * K ** -0.5, "W_K": rnd(H, V, K) * V ** -0.5, "W_beta": rnd(H, V, K) * 0.3,
              "W_omega": rnd(H, V, V) * 0.3, "W_gamma": rnd(H, V, K) * 0.1}
    snaps = rnd(B, F, H, K, V)
    grads = [rnd(B, F, H, n, K), rnd(B, F, H, n, V), rnd(B, F, H, n, K), rnd(B, F, H, n, V), rnd(B, F, H, K)]
    return snaps, params, grads


def _stale_weights(scheme, params, saved=None):
    """Broken twin: the forward's W whenever one was kept, whatever tensors are given now."""
    if saved is not None and saved.weights is not None:
        return probe_fused._weight_names(scheme), saved.weights[2]
    return probe_fused._weights(scheme, params)


def _backward_after(change, weights=None):
    """``probe_bwd``'s gradients after ``change(params)`` between the forward and the backward, and
    those of a forward and backward both on the changed parameters (what it must equal)."""
    snaps, params, grads = _probe_case()
    _, saved = probe_fused.probe_fwd("learned", snaps, params, "mean", keep_preactivations=False, gates="torch")
    params = change(params)
    if weights is None:
        got = probe_fused.probe_bwd("learned", saved, snaps, params, "mean", *grads, gates="torch")
    else:
        real = probe_fused._weights
        probe_fused._weights = weights
        try:
            got = probe_fused.probe_bwd("learned", saved, snaps, params, "mean", *grads, gates="torch")
        finally:
            probe_fused._weights = real
    _, fresh = probe_fused.probe_fwd("learned", snaps, params, "mean", keep_preactivations=False, gates="torch")
    want = probe_fused.probe_bwd("learned", fresh._replace(weights=None), snaps, params, "mean", *grads,
                                 gates="torch")
    return got, want


def _same(a, b):
    """Bit for bit: both backwards run the same PyTorch ops on the same values (kept or rebuilt W)."""
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def _in_place(params):
    params["W_beta"].mul_(2.0)          # the same tensor, a new version
    return params


def _other_tensors(params):
    return {k: p * 2.0 if k == "W_omega" else p for k, p in params.items()}


CHANGES = {"unchanged": lambda p: p, "modified_in_place": _in_place, "other_tensors": _other_tensors}


@pytest.mark.parametrize("change", list(CHANGES))
def test_backward_weights_are_those_of_the_parameters_it_is_given(change):
    got, want = _backward_after(CHANGES[change])
    assert _same(got, want)


@pytest.mark.parametrize("change", ["modified_in_place", "other_tensors"])
def test_a_twin_reusing_the_forward_weights_regardless_fails(change):
    got, want = _backward_after(CHANGES[change], weights=_stale_weights)
    assert not _same(got, want)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_backward_reuses_the_forward_weights_without_a_cat():
    snaps, params, grads = _probe_case()
    _, saved = probe_fused.probe_fwd("learned", snaps, params, "mean", keep_preactivations=False, gates="torch")
    with _CountOps() as mode:
        probe_fused.probe_bwd("learned", saved, snaps, params, "mean", *grads, gates="torch")
    assert mode.ops["cat"] == 0
    with _CountOps() as mode:
        probe_fused.probe_bwd("learned", saved._replace(weights=None), snaps, params, "mean", *grads, gates="torch")
    assert mode.ops["cat"] == 1


def _float32_params_undetached(groups):
    """Broken twin: under no grad, the parameters passed through (float32) are not detached."""
    flat = [t for g in groups if g is not None for t in g.values()]
    cast = iter(param_casts._cast_together(flat, [torch.float32] * len(flat)))
    return [None if g is None else {name: next(cast) for name in g} for g in groups]


def _detached_float32(cast):
    groups = [None, {"a": torch.randn(3, 4).bfloat16().requires_grad_(), "b": torch.randn(5).requires_grad_()},
              {"c": torch.randn(2, 3).half().requires_grad_(), "d": torch.randn(4).bfloat16().requires_grad_()}]
    ok = True
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = cast(groups)
        for g, h in zip(groups[1:], got[1:]):
            for name, p in g.items():
                ok &= (h[name].dtype == torch.float32 and not h[name].requires_grad and h[name].grad_fn is None
                       and torch.equal(h[name], p.detach().float()))
        ok &= got[1]["b"].data_ptr() == groups[1]["b"].data_ptr()     # float32: no copy
    return ok


def test_float32_params_are_detached_float32_copies_with_and_without_grad_mode():
    assert _detached_float32(param_casts.float32_params)


def test_a_twin_that_leaves_pass_throughs_attached_fails():
    assert not _detached_float32(_float32_params_undetached)


def _op_inputs(L=3):
    x = nested_inputs(NestedShape(B=1, T=130, H=2, L=L, K=16, V=16), seed=0, scheme="learned")
    args = {n: x[n].to(DEV, torch.float32).requires_grad_() for n in NAMES}
    args["levels"] = [Level(lv.scheme, lv.interval, {n: p.to(DEV, torch.float32).requires_grad_()
                                      for n, p in lv.params.items()},
                            lv.reduction) for lv in x["levels"]]
    return args


def _clones(output_final_state):
    with _CountOps() as mode:
        chunk_nested_gdn2(**_op_inputs(), output_final_state=output_final_state)
    return mode.ops["clone"]


def _finals_always(*args, **kwargs):
    """Broken twin of the forward: the final states made whether or not they are asked for."""
    return _real_nested_fwd(*args, **{**kwargs, "finals": True})


_real_nested_fwd = function.nested_fwd


def _finals_made_only_when_asked(nested_fwd):
    real = function.nested_fwd
    function.nested_fwd = nested_fwd
    try:
        return _clones(True) - _clones(False) == 3         # L = 3 final states, one copy each
    finally:
        function.nested_fwd = real


def test_final_states_are_made_only_when_asked_for():
    assert _finals_made_only_when_asked(_real_nested_fwd)
    o, finals = chunk_nested_gdn2(**_op_inputs(), output_final_state=False)
    assert finals is None
    o.sum().backward()                  # no final state: the backward has no gradient of one


def test_a_twin_that_always_makes_the_final_states_fails():
    assert not _finals_made_only_when_asked(_finals_always)
