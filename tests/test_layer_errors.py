"""The layers' input checks (CONTRACT "Errors"): every refusal is a ``ValueError`` or ``TypeError``
naming the argument, before any work; nothing the layers cannot honour is accepted silently
(fla's model blocks pass ``cu_seqlens`` and other keywords on to their layers)."""
import pytest
import torch

from layers import GDN2, NestedGDN2
from layers.common import check_forward_args
from optimized import triton_mode

DEV = triton_mode.device()
LAYERS = {"gdn2": lambda: GDN2(16, num_heads=1, head_dim=8),
          "nested": lambda: NestedGDN2(16, num_heads=1, head_dim=8, num_levels=2)}


@pytest.fixture(params=sorted(LAYERS))
def layer(request):
    torch.manual_seed(0)
    return LAYERS[request.param]().to(DEV)


def x(B=1, T=10, D=16, dtype=torch.float32, device=DEV):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(1)).to(device, dtype)


@pytest.mark.parametrize("kwargs, message", [
    ({"cu_seqlens": torch.tensor([0, 4, 10])}, r"cu_seqlens is not supported by the layers.*the ops take cu_seqlens"),
    ({"not_an_arg": 1}, r"unexpected keyword arguments \['not_an_arg'\]"),
    ({"attention_mask": torch.ones(1, 10)}, r"attention_mask is not supported"),
    ({"past_key_values": object()}, r"past_key_values / use_cache are not supported"),
    ({"use_cache": True}, r"past_key_values / use_cache are not supported"),
    ({"output_attentions": True}, r"output_attentions is not supported"),
])
def test_what_the_layers_cannot_honour_is_refused(layer, kwargs, message):
    kwargs = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        layer(x(), **kwargs)


def test_keywords_passed_as_none_are_accepted():
    """fla's blocks pass ``cu_seqlens=None`` and the like on: a keyword without a value asks nothing
    (the check alone: a layer's forward would compile kernels of sizes no other CUDA test uses)."""
    weight = torch.zeros(4, 16, device=DEV)
    check_forward_args(x(), 16, like=weight, extra={"cu_seqlens": None, "position_ids": None})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_an_input_in_another_dtype_than_the_layer_is_refused_naming_both(layer, dtype):
    with pytest.raises(ValueError, match=f"hidden_states has dtype {dtype} but the layer's parameters have "
                                         f"torch.float32"):
        layer(x(dtype=dtype))
    with pytest.raises(ValueError, match="hidden_states has dtype"):
        layer.forward_with_states(x(dtype=dtype))


def test_an_input_on_another_device_than_the_layer_is_refused_naming_both(layer):
    with pytest.raises(ValueError, match=f"hidden_states is on meta but the layer's parameters are on {DEV}"):
        layer(x(device="meta"))


def test_autocast_lets_the_input_dtype_differ():
    """Under autocast the projections cast: a bfloat16 input to a float32 layer is the usual mixed
    precision run, not an error of the check."""
    weight = torch.zeros(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_forward_args(x(dtype=torch.bfloat16, device="cpu"), 16, like=weight)
    with pytest.raises(ValueError, match="hidden_states has dtype torch.bfloat16"):
        check_forward_args(x(dtype=torch.bfloat16, device="cpu"), 16, like=weight)


@pytest.mark.parametrize("shape, message", [((0, 10, 16), "at least one sequence and one token"),
                                            ((1, 10, 12), "last dimension hidden_size = 16"),
                                            ((10, 16), r"shape \[B, T, D\]")])
def test_wrong_shapes_are_refused_naming_hidden_states(layer, shape, message):
    with pytest.raises(ValueError, match=f"hidden_states must.*{message}"):
        layer(torch.zeros(shape, device=DEV))


def test_a_checkpoint_loads_only_into_a_layer_with_its_levels_settings():
    """The levels' scheme, interval and reduction travel in the ``state_dict`` (their parameters
    alone have the same shapes under another setting, and loaded there computed another model)."""
    def nested(**kw):
        torch.manual_seed(0)
        return NestedGDN2(16, num_heads=1, head_dim=8, num_levels=3, **kw)

    state = nested().state_dict()
    nested().load_state_dict(state)
    for kw, shown in ((dict(scheme="bounded_erase"), "bounded_erase"), (dict(reduction="sum"), "sum"),
                      (dict(intervals=[2, 4]), "2")):
        with pytest.raises(ValueError, match=rf"state_dict: the levels' \(scheme, interval, reduction\) are .*"
                                             rf"this layer's .*{shown}"):
            nested(**kw).load_state_dict(state)
    assert "levels (scheme, interval, reduction)=[('learned', 1, 'mean'), ('learned', 2, 'mean')]" in repr(nested())


def test_a_float64_layer_on_the_optimized_backend_is_refused_before_any_kernel(layer):
    layer = layer.double()
    with pytest.raises(ValueError, match=r"optimized backend runs in float32 or bfloat16, the layer's parameters "
                                         r"are torch.float64 \(use backend='reference' for float64\)"):
        layer(x(dtype=torch.float64))


def bad_at(token=3, value=float("inf")):
    h = x()
    h[0, token, 2] = value
    return h


@pytest.mark.parametrize("backend", ["optimized", "reference"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_non_finite_input_is_named_as_hidden_states_with_its_position(layer, backend, value):
    """Not "q holds a non-finite value (nan)": the layer's input, its batch and token (before any kernel)."""
    layer.backend = backend
    with pytest.raises(ValueError, match=rf"^hidden_states holds a non-finite value \({value}\) at batch 0, token 3: "
                                         r"the layer refuses non-finite input"):
        layer(bad_at(value=value))


def test_a_non_finite_parameter_is_named_with_its_index(layer):
    """Not "g holds a non-finite value at token 0" (or "q"): the parameter by name, and where."""
    with torch.no_grad():
        layer.proj.a_proj.weight[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^parameter 'proj.a_proj.weight' holds a non-finite value \(nan\) at "
                                         r"index \(1, 2\): the layer refuses non-finite parameters"):
        layer(x())


def test_a_huge_input_is_named_as_too_large_not_told_to_clamp_g(layer):
    """A finite input scaled by 1e30 drives g below -745; the op's refusal comes back naming the
    layer's input and the token, without the op's advice about g."""
    h = x()
    h[0, 4] *= 1e30
    with pytest.raises(ValueError, match=r"^hidden_states is too large for the layer: at batch 0, token 4 its "
                                         r"entries reach \S+e\+30 in size, which drives the layer's log-decay g") as e:
        layer(h)
    assert "clamp g" not in str(e.value)


def test_parameters_that_drive_g_out_of_range_are_named_not_the_input(layer):
    """A moderate input, a decay rate exp(A_log) of e^100: the layer's parameters are blamed."""
    with torch.no_grad():
        layer.proj.decay.A_log.fill_(100.0)
    with pytest.raises(ValueError, match=r"^the layer's parameters drive its log-decay g .* at batch 0, token 0 from "
                                         r"an input of moderate size .* its largest parameter is 'proj.decay.A_log'"):
        layer(x())


def test_the_entry_check_follows_the_ops_switch(layer):
    """``finite_checks(False)`` skips the layer's check as it skips the ops'."""
    from layers.common import check_finite_entry
    from optimized.checks import finite_checks

    with finite_checks(False):
        check_finite_entry(bad_at(), layer.named_parameters())
    with pytest.raises(ValueError, match="hidden_states holds"):
        check_finite_entry(bad_at(), layer.named_parameters())
