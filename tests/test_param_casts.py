"""The scheme parameters' casts (``optimized.nested.param_casts``): every parameter that needs a cast goes
through one ``cat`` and one cast, each ends up with its own values and shape, float32 ones pass
untouched; the nested op with bf16 parameters gives exactly the float32 parameters' gradients,
rounded once."""
import pytest
import torch

import optimized.nested.param_casts as param_casts
from ngdn.compile_buckets import on_bucket
from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import chunk_nested_gdn2, triton_mode
from reference.nested import Level

NAMES = ("q", "k", "v", "g", "b", "w", "r")
DEV = triton_mode.device()


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(3, 5, generator=gen).bfloat16(), torch.randn(4, generator=gen),
            torch.randn(2, 2, 3, generator=gen).bfloat16(), torch.randn(7, generator=gen).half(),
            torch.randn(1, 6, generator=gen).bfloat16()]


def test_float32_params_casts_each_parameter_to_its_own_values():
    ts = _tensors()
    groups = [None, {"a": ts[0], "b": ts[1]}, {"c": ts[2], "d": ts[3], "e": ts[4]}]
    got = param_casts.float32_params(groups)
    assert got[0] is None and list(got[1]) == ["a", "b"] and list(got[2]) == ["c", "d", "e"]
    for want, have in zip(ts, [*got[1].values(), *got[2].values()]):
        assert have.dtype == torch.float32 and have.shape == want.shape
        assert torch.equal(have, want.float())
    # float32 passes as it is (detached, no copy)
    assert got[1]["b"].data_ptr() == ts[1].data_ptr() and not got[1]["b"].requires_grad


def test_cast_like_rounds_each_gradient_to_its_parameters_dtype():
    gen = torch.Generator().manual_seed(1)
    likes = _tensors()
    grads = [torch.randn(t.shape, generator=gen) for t in likes]
    grads[1] = None
    got = param_casts.cast_like(grads, likes)
    assert got[1] is None
    for g, like, have in zip(grads, likes, got):
        if g is not None:
            assert have.dtype == like.dtype and have.shape == like.shape
            assert torch.equal(have, g.to(like.dtype))


def test_a_twin_that_splits_in_the_wrong_order_fails():
    """A twin that hands each tensor its neighbour's part of the buffer (same sizes here) must fail
    the value check above: the check sees which part went where."""
    def twin(tensors, dtypes):
        out = list(tensors)
        idx = [i for i, (t, d) in enumerate(zip(tensors, dtypes)) if t is not None and t.dtype != d]
        flat = torch.cat([tensors[i].reshape(-1) for i in idx]).to(dtypes[idx[0]])
        parts = list(flat.split([tensors[i].numel() for i in idx]))
        for i, part in zip(idx, parts[::-1]):
            out[i] = part
        return out
    a, b = torch.randn(4).bfloat16(), torch.randn(4).bfloat16()
    got = twin([a, b], [torch.float32] * 2)
    assert not torch.equal(got[0], a.float())


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float16])
def test_the_op_with_low_precision_parameters_gives_the_float32_parameters_gradients_rounded_once(param_dtype):
    """The op with parameters in bf16 (or fp16) against the same values in float32: the forward
    is the same (the kernels read float32 either way) and each parameter's gradient is the float32
    run's, cast once to the parameter's dtype. B = 2, H = 2, T = 130, three levels (both upper
    levels fire, their parameters cast together)."""
    shape = on_bucket(NestedShape(B=2, T=130, H=2, K=16, V=16, L=3), index=1)
    x = nested_inputs(shape, seed=0, scheme="learned")

    def run(dtype):
        args = {n: x[n].to(DEV, torch.float32).requires_grad_() for n in NAMES}
        levels = [Level(lv.scheme, lv.interval,
                        {n: p.to(param_dtype).to(DEV, dtype).requires_grad_() for n, p in lv.params.items()},
                        lv.reduction) for lv in x["levels"]]
        o, _ = chunk_nested_gdn2(**args, levels=levels)
        o.backward(torch.ones_like(o))
        return o.detach(), [p.grad for lv in levels for p in lv.params.values()], levels

    o32, g32, _ = run(torch.float32)
    o16, g16, levels = run(param_dtype)
    assert torch.equal(o32, o16)            # the same kernels on the same float32 values
    assert len(g16) == 2 * len(levels[0].params) and all(g is not None for g in g16)
    for want, have in zip(g32, g16):
        assert have.dtype == param_dtype and torch.equal(have, want.to(param_dtype))


def test_the_op_casts_its_bf16_parameters_in_one_launch_each_way():
    """Counted under a dispatch mode (float32 activations, so every bf16 copy is a parameter's):
    one bf16 → float32 cast in the forward, none in the backward but one float32 → bf16 for every
    parameter's gradient. The op before cast each of the 10 parameters of this L = 3 op in the
    forward, again in the backward, and each gradient back. (Casts between other dtypes, such as
    the finiteness check's float64 copies on the CPU, are not counted.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and \
                    {args[0].dtype, out.dtype} == {torch.bfloat16, torch.float32}:
                self.seen.append((args[0].dtype, out.dtype))
            return out

    shape = on_bucket(NestedShape(B=2, T=80, H=2, K=16, V=16, L=3), index=1)
    x = nested_inputs(shape, seed=0, scheme="learned")
    args = {n: x[n].to(DEV, torch.float32).requires_grad_() for n in NAMES}
    levels = [Level(lv.scheme, lv.interval, {n: p.to(DEV, torch.bfloat16).requires_grad_() for n, p in lv.params.items()},
                    lv.reduction) for lv in x["levels"]]
    with Casts() as fwd:
        o, _ = chunk_nested_gdn2(**args, levels=levels)
    with Casts() as bwd:
        o.backward(torch.ones_like(o))
    assert fwd.seen == [(torch.bfloat16, torch.float32)]
    assert bwd.seen == [(torch.float32, torch.bfloat16)]
