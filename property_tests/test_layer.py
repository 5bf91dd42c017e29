"""The Nested GDN-2 layer (``layers.NestedGDN2``): with the optimized op its output, its input
gradient and every parameter gradient equal those of the same layer on the float64 reference op
(``backend="reference"``), within ``tolerances.yaml``'s ``nested_layer`` entry. Everything
around the op (projections, short convolutions, gates, router projection, gated RMSNorm,
output projection) is the same function in float32 (the convolution and the norms are fla's on
one backend, their PyTorch forms on the other), so this checks the op inside a layer: the
layer's dtype handling, its scheme parameters as ``nn.Parameter``s and the gradients back
through them.

Shapes keep two full chunks with every level firing at every chunk (``intervals = [1, 1]``),
so each level fires twice and the second firing erases and decays a non-zero state (every
scheme parameter gets a gradient). CPU (``ci`` profile): one draw, B = H = 1, T = 130, about
15 s; the mutation test another ~12 s. CUDA: three draws of B, T and scheme at the head dims of
the level-0 compile bucket ``a`` (K = 48, V = 80: kernels the other nested tests compile).
"""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layers import NestedGDN2
from ngdn.compile_buckets import LEVEL0
from ngdn.strategies import seeds
from ngdn.testing import on_cuda
from ngdn.tolerances import assert_passes, failures, record, relative_error, tolerance
from optimized import triton_mode

COMPONENT = "nested_layer"
SCHEMES = ("learned", "merge", "bounded_erase")
HIDDEN = 32


def layer_errors(layer: NestedGDN2, B: int, T: int, seed: int, log: bool = True) -> dict:
    """``{quantity: (worst relative error, bound)}`` of ``layer`` (optimized backend) against a
    deep copy of it on the reference backend, on one seeded input and output cotangent:
    ``output``, ``dhidden`` (the input's gradient), ``dscheme_params`` (worst over the scheme's
    parameters), ``dA_log`` (the decay's one scalar per head: a sum over every token and channel
    whose terms cancel, hence its own bound) and ``dlayer_params`` (worst over every other
    parameter). Each parameter's
    error is logged to ``$NGDN_ERROR_LOG`` unless ``log`` is false (mutants)."""
    dev = triton_mode.device()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, layer.hidden_size, generator=gen).to(dev)
    do = torch.randn(B, T, layer.hidden_size, generator=gen).to(dev)
    ref = copy.deepcopy(layer)
    ref.backend = "reference"

    def run(module):
        xx = x.clone().requires_grad_(True)
        y, _, _ = module(xx)
        (y * do).sum().backward()
        return y, xx.grad, {n: p.grad for n, p in module.named_parameters()}

    y, dx, grads = run(layer)
    y_ref, dx_ref, grads_ref = run(ref)
    mode, dtype = triton_mode.configure(), torch.float32
    measured = {"output": [relative_error(y, y_ref)], "dhidden": [relative_error(dx, dx_ref)],
                "dscheme_params": [], "dlayer_params": [], "dA_log": []}
    for name, g_ref in grads_ref.items():
        g = grads[name]
        if g_ref is None or g is None:      # a parameter the op never reached: both must agree on that
            assert g is None and g_ref is None, f"{name}: gradient on one backend only"
            continue
        quantity = ("dscheme_params" if name.startswith("scheme_params.") else
                    "dA_log" if name.endswith("decay.A_log") else "dlayer_params")
        measured[quantity].append(relative_error(g, g_ref))
    out = {}
    for quantity, errors in measured.items():
        bound = tolerance(COMPONENT, quantity, dtype, mode)
        for error in errors:
            if log:
                record(COMPONENT, mode, dtype, quantity, error, bound)
        out[quantity] = (max(errors), bound)
    return out


def make_layer(scheme: str, H: int, K: int, seed: int, cls=NestedGDN2, V: int | None = None) -> NestedGDN2:
    torch.manual_seed(seed)
    return cls(hidden_size=HIDDEN, num_heads=H, head_dim=K, head_v_dim=V, num_levels=3, scheme=scheme,
               intervals=[1, 1], query_counts=[min(4, K), min(8, K)]).to(triton_mode.device())


@st.composite
def layer_cases(draw):
    """``(scheme, B, H, T, K, V, seed)``: the CPU draws one tiny shape, CUDA a few at bucket a's sizes."""
    scheme = draw(st.sampled_from(SCHEMES))
    if on_cuda():
        bucket = LEVEL0[0]
        B, H, K, V = draw(st.integers(1, 2)), bucket.H, bucket.K, bucket.V
        T = draw(st.sampled_from((130, 200)))
    else:
        B, H, T, K, V = 1, 1, 130, 16, 16
    return scheme, B, H, T, K, V, draw(seeds())


@settings(max_examples=3 if on_cuda() else 1)
@given(case=layer_cases())
def test_layer_optimized_equals_reference(case):
    scheme, B, H, T, K, V, seed = case
    assert_passes(layer_errors(make_layer(scheme, H, K, seed, V=V), B, T, seed))


class RouterOnWrongLevels(NestedGDN2):
    """Broken twin: the router logits reach the op with the level axis reversed (level ℓ's
    weight applied to level L-1-ℓ's read), on the optimized backend only."""

    def mix(self, x, output_final_state=False):
        if self.backend == "optimized":
            x = dict(x, r=x["r"].flip(-1))
        return super().mix(x, output_final_state)


@pytest.mark.mutation
@pytest.mark.compiles
def test_layer_property_catches_a_router_on_the_wrong_levels():
    """On CUDA at bucket a's head dims, as the property above (H = 1, K = 16 compiled the whole
    nested kernel set for this test alone: ≈ 40 s of a cold run)."""
    H, K, V = (LEVEL0[0].H, LEVEL0[0].K, LEVEL0[0].V) if on_cuda() else (1, 16, None)
    layer = make_layer("learned", H, K, seed=1, cls=RouterOnWrongLevels, V=V)
    bad = failures(layer_errors(layer, 1, 130, seed=1, log=False))
    assert {"output", "dhidden", "dlayer_params"} <= set(bad), bad
