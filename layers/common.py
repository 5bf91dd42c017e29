"""Pieces shared by the layers: argument checks, the short convolutions, the per-channel
log-decay gate and the gated output head.

Conventions follow fla's GatedDeltaNet-style layers: bias-free input projections, a depthwise
causal short convolution with SiLU on q, k and v (``fla.modules.ShortConvolution``), a decay
``g = -exp(A_log) · softplus(a + dt_bias)`` (per head ``A_log``, per channel ``dt_bias``, as
fla's KDA layer: GDN-2's gates are per channel), an output gate through ``FusedRMSNormGated``
and an output projection.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("optimized", "reference")


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` is an int (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return float(value)


def check_backend(backend) -> str:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def check_forward_args(hidden_states, hidden_size: int, attention_mask=None, past_key_values=None,
                       use_cache: bool = False, like: torch.Tensor | None = None, extra: dict | None = None) -> None:
    """``hidden_states [B, T, hidden_size]``, floating point, ``T >= 1``, on the device of ``like``
    (a parameter of the layer) and, outside autocast, in its dtype; no mask, cache or ``use_cache``
    (these layers have a training forward only), no packed sequences (``cu_seqlens``) and no other
    keyword argument with a value (``extra``: what fla's model blocks may pass on)."""
    if extra:
        given = sorted(name for name, value in extra.items() if value is not None)
        if "cu_seqlens" in given:
            raise ValueError("cu_seqlens is not supported by the layers: they take [B, T, D] batches of "
                             "separate sequences (the ops take cu_seqlens: optimized.chunk_gdn2, "
                             "optimized.chunk_nested_gdn2, ...)")
        if given:
            raise ValueError(f"unexpected keyword arguments {given}: the layers take hidden_states, "
                             f"attention_mask=None, past_key_values=None, use_cache=False, output_attentions=False")
    if not isinstance(hidden_states, torch.Tensor):
        raise TypeError(f"hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must have shape [B, T, D] (3 dimensions), got {tuple(hidden_states.shape)}")
    if hidden_states.shape[-1] != hidden_size:
        raise ValueError(f"hidden_states must have last dimension hidden_size = {hidden_size}, "
                         f"got {tuple(hidden_states.shape)}")
    if hidden_states.shape[0] == 0 or hidden_states.shape[1] == 0:
        raise ValueError(f"hidden_states must hold at least one sequence and one token, got {tuple(hidden_states.shape)}")
    if not hidden_states.is_floating_point():
        raise ValueError(f"hidden_states must be floating point, got {hidden_states.dtype}")
    if like is not None:
        if hidden_states.device != like.device:
            raise ValueError(f"hidden_states is on {hidden_states.device} but the layer's parameters are on "
                             f"{like.device}; move one of them (layer.to(device))")
        if hidden_states.dtype != like.dtype and not torch.is_autocast_enabled(hidden_states.device.type):
            raise ValueError(f"hidden_states has dtype {hidden_states.dtype} but the layer's parameters have "
                             f"{like.dtype}; cast one of them (layer.to(dtype)), or run under torch.autocast")
    if attention_mask is not None:
        raise ValueError("attention_mask is not supported: these layers take unpadded [B, T, D] batches")
    if past_key_values is not None or use_cache:
        raise ValueError("past_key_values / use_cache are not supported: these layers have a training "
                         "forward without any cache")


# An input entry this large is no activation scale a normalised model produces (fla's blocks put an
# RMSNorm before each layer: entries of order 1). An activation the op refuses at a token whose input
# reaches it is blamed on the input; below it, on the layer's parameters.
HUGE_INPUT = 1e6


def check_finite_entry(hidden_states: torch.Tensor, parameters) -> None:
    """``hidden_states`` and every parameter of ``parameters`` (``(name, tensor)`` pairs, a module's
    ``named_parameters()``) are finite: one fused reduction (the max-norm of every tensor in one
    multi-tensor ``torch._foreach_norm``; NaN and ±inf propagate) and one host sync. A ``ValueError``
    names the layer's input with its (batch, token), or the parameter by name with the index of the
    bad entry, never an activation the layer computed from them (the op's ``q``, ``g``, …), which
    would point at the op's internals. Skipped as the optimized ops' own check is
    (``optimized.checks``: ``NGDN_CHECK_FINITE=0``, ``finite_checks(False)``, ``torch.compile``)."""
    from optimized.checks import finite_checks_enabled

    if not isinstance(hidden_states, torch.Tensor):
        raise TypeError(f"hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
    if not finite_checks_enabled() or torch.compiler.is_compiling():
        return
    named = [("hidden_states", hidden_states)] + [(n, p) for n, p in parameters if p.numel() > 0]
    with torch.no_grad():
        norms = torch._foreach_norm([t.detach() for _, t in named], float("inf"))
        finite = torch.isfinite(torch.stack([n.to(device=hidden_states.device, dtype=torch.float64)
                                             for n in norms]))
    if bool(finite.all()):
        return
    name, x = named[int((~finite).nonzero()[0])]
    bad = ~torch.isfinite(x.detach())
    index = tuple(int(i) for i in bad.nonzero()[0])
    value = x.detach()[index].item()
    if name == "hidden_states":
        raise ValueError(f"hidden_states holds a non-finite value ({value}) at batch {index[0]}, token {index[1]}: "
                         f"the layer refuses non-finite input (a NaN or inf reaches every later token through the "
                         f"recurrence, and earlier tokens of its 64-token chunk through the optimized backend's "
                         f"chunk kernels)")
    raise ValueError(f"parameter {name!r} holds a non-finite value ({value}) at index {index}: the layer refuses "
                     f"non-finite parameters (every token's output would be NaN; a diverged training step or a "
                     f"damaged checkpoint?)")


def activation_error(hidden_states: torch.Tensor, error, parameters) -> ValueError:
    """The layer's account of an op's refusal of an activation it computed (``error``: an
    ``optimized.checks.NonFiniteActivation``) from a finite input and finite parameters (both
    checked at the layer's entry): the magnitudes did it. Names the layer's input at the op's
    (batch, token) when its entries there reach ``HUGE_INPUT``, else the layer's largest parameter."""
    b, t, name, value = error.batch, error.token, error.name, error.value
    if not (0 <= b < hidden_states.shape[0] and 0 <= t < hidden_states.shape[1]):
        raise ValueError(f"error's (batch, token) = ({b}, {t}) lies outside hidden_states {tuple(hidden_states.shape)}")
    size = hidden_states[b, t].detach().abs().max().item()
    if name == "g":
        what = "log-decay g = -exp(A_log)·softplus(a_proj(x) + dt_bias)"
        why = (f"below -745, where exp(g) is 0 even in float64: a full forget, which the optimized ops refuse"
               if value == value and value > float("-inf") else "not finite: float32 overflows")
    else:
        what, why = f"activation {name} (a projection of the input)", "not finite: float32 overflows"
    if size >= HUGE_INPUT:
        return ValueError(f"hidden_states is too large for the layer: at batch {b}, token {t} its entries reach "
                          f"{size:.3g} in size, which drives the layer's {what} to {value:.3g} ({why}); give the "
                          f"layer an input of moderate size (normalised, e.g. an RMSNorm before it as in fla's "
                          f"blocks)")
    sizes = {n: p.detach().abs().max().item() for n, p in parameters if p.numel() > 0}
    largest = max(sizes, key=sizes.get)
    return ValueError(f"the layer's parameters drive its {what} to {value:.3g} ({why}) at batch {b}, token {t} "
                      f"from an input of moderate size (entries up to {size:.3g}); its largest parameter is "
                      f"{largest!r} (entries up to {sizes[largest]:.3g}): a diverged training step?")


def wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it is (a float64 layer keeps its precision throughout)."""
    return x if x.dtype == torch.float64 else x.float()


def short_conv(dim: int, conv_size: int, conv_bias: bool) -> nn.Module:
    """fla's depthwise causal convolution with SiLU (its Triton backend; interpreter on CPU)."""
    from fla.modules import ShortConvolution

    return ShortConvolution(hidden_size=dim, kernel_size=conv_size, bias=conv_bias, activation="silu",
                            backend="triton")


# The reference backend's forms of fla's convolution and norms, in PyTorch on the same parameters:
# any dtype (fla's Triton convolution refuses float64) and differentiable twice (fla's modules give
# second-order gradients silently wrong: measured against finite differences).

def causal_conv_silu(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``SiLU`` of the depthwise causal convolution of ``x [B, T, D]`` with ``conv``'s ``weight
    [D, 1, W]`` and ``bias`` (fla's ``ShortConvolution`` without its cache)."""
    W = conv.weight
    if x.dim() != 3 or x.shape[-1] != W.shape[0]:
        raise ValueError(f"x must have shape [B, T, {W.shape[0]}] (the convolution's channels), "
                         f"got {tuple(x.shape)}")
    y = F.conv1d(x.transpose(1, 2), W, conv.bias, padding=W.shape[-1] - 1, groups=W.shape[0])
    return F.silu(y[..., :x.shape[1]]).transpose(1, 2)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x²) + eps) ⊙ weight`` over the last axis (fla's ``RMSNorm``)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight must have shape ({x.shape[-1]},) (x's last axis), got {tuple(weight.shape)}")
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class DecayGate(nn.Module):
    """Per-channel log-decay ``g = -exp(A_log[h]) · softplus(a + dt_bias) ≤ 0`` from the
    projection ``a [B, T, H, K]``, computed in float32 (float64 in a float64 layer). Initialised as
    fla's GatedDeltaNet and KDA layers: ``A ~ U(1, 16)``, ``dt ~ logU(1e-3, 1e-1)`` (floor 1e-4) with
    ``dt_bias = softplus⁻¹(dt)``, so ``-g`` starts between about 1e-3 and 1.6 per token."""

    def __init__(self, num_heads: int, head_dim: int, dt_min=1e-3, dt_max=1e-1, dt_floor=1e-4):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        A = torch.empty(num_heads).uniform_(1, 16)
        self.A_log = nn.Parameter(torch.log(A))
        dt = torch.exp(torch.rand(num_heads * head_dim) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))    # softplus(dt_bias) = dt
        self.A_log._no_weight_decay = True
        self.dt_bias._no_weight_decay = True

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        bias = wide(self.dt_bias).view(self.num_heads, self.head_dim)
        return -wide(self.A_log).exp()[:, None] * F.softplus(wide(a) + bias)


class GatedOutput(nn.Module):
    """``o_proj(RMSNorm(o) ⊙ SiLU(g_proj(x)))`` per head (``use_gate``), else ``o_proj(RMSNorm(o))``."""

    def __init__(self, hidden_size: int, num_heads: int, head_v_dim: int, use_gate: bool, norm_eps: float):
        super().__init__()
        from fla.modules import FusedRMSNormGated, RMSNorm

        self.num_heads, self.head_v_dim, self.use_gate = num_heads, head_v_dim, use_gate
        value_dim = num_heads * head_v_dim
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
            self.o_norm = FusedRMSNormGated(head_v_dim, eps=norm_eps)
        else:
            self.o_norm = RMSNorm(head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def forward(self, o: torch.Tensor, hidden_states: torch.Tensor, plain: bool = False) -> torch.Tensor:
        """``plain``: the norms in PyTorch (``rms_norm``; the reference backend), else fla's."""
        B, T = o.shape[:2]
        if self.use_gate:
            gate = self.g_proj(hidden_states).view(B, T, self.num_heads, self.head_v_dim)
            o = (rms_norm(o, self.o_norm.weight, self.o_norm.eps) * F.silu(gate) if plain
                 else self.o_norm(o, gate))
        else:
            o = rms_norm(o, self.o_norm.weight, self.o_norm.eps) if plain else self.o_norm(o)
        return self.o_proj(o.reshape(B, T, self.num_heads * self.head_v_dim))


class QKVProjections(nn.Module):
    """The input side shared by both layers: ``q`` (``q_heads`` query heads), ``k, v`` (``heads``
    heads), each through an optional short convolution; ``k`` and ``q`` are l2-normalised per
    head (the ops expect unit-norm keys). Gates: ``a`` (into ``DecayGate``), ``b`` (erase, per
    key channel) and ``w`` (write, per value channel), both through a sigmoid."""

    def __init__(self, hidden_size, q_heads, heads, head_dim, head_v_dim, use_short_conv, conv_size, conv_bias):
        super().__init__()
        self.q_heads, self.heads, self.head_dim, self.head_v_dim = q_heads, heads, head_dim, head_v_dim
        self.use_short_conv = use_short_conv
        self.q_proj = nn.Linear(hidden_size, q_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, heads * head_v_dim, bias=False)
        if use_short_conv:
            self.q_conv1d = short_conv(q_heads * head_dim, conv_size, conv_bias)
            self.k_conv1d = short_conv(heads * head_dim, conv_size, conv_bias)
            self.v_conv1d = short_conv(heads * head_v_dim, conv_size, conv_bias)
        self.a_proj = nn.Linear(hidden_size, heads * head_dim, bias=False)
        self.decay = DecayGate(heads, head_dim)
        self.b_proj = nn.Linear(hidden_size, heads * head_dim, bias=False)
        self.w_proj = nn.Linear(hidden_size, heads * head_v_dim, bias=False)

    def forward(self, x: torch.Tensor, plain: bool = False) -> dict:
        """``{"q": [B, T, q_heads, K], "k", "g", "b": [B, T, H, K], "v", "w": [B, T, H, V]}``;
        ``g`` in float32, the rest in the projections' dtype. ``plain``: the short convolutions
        in PyTorch (``causal_conv_silu``; the reference backend), else fla's."""
        B, T = x.shape[:2]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv and plain:
            q, k, v = (causal_conv_silu(c, y) for c, y in ((self.q_conv1d, q), (self.k_conv1d, k), (self.v_conv1d, v)))
        elif self.use_short_conv:
            q, _ = self.q_conv1d(q)
            k, _ = self.k_conv1d(k)
            v, _ = self.v_conv1d(v)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        H, K, V = self.heads, self.head_dim, self.head_v_dim
        q = l2norm(q.view(B, T, self.q_heads, K))
        k = l2norm(k.view(B, T, H, K))
        return {"q": q, "k": k, "v": v.view(B, T, H, V),
                "g": self.decay(self.a_proj(x).view(B, T, H, K)),
                "b": torch.sigmoid(self.b_proj(x)).view(B, T, H, K),
                "w": torch.sigmoid(self.w_proj(x)).view(B, T, H, V)}


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(Σx² + eps)`` over the last axis, in float32 (float64 in a float64 layer; the
    contract's ``l2norm``)."""
    xf = wide(x)
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def op_dtype(x: torch.Tensor) -> torch.dtype:
    """The one activation dtype handed to an optimized op: the projections' dtype (bfloat16 under
    CUDA autocast or with bfloat16 parameters, else float32)."""
    return x.dtype


class RecurrentLayer(nn.Module):
    """What both layers share: the backend switch, the autocast-free recurrent core, fla's
    ``forward`` signature and ``forward_with_states``. A subclass defines ``inputs(hidden_states)
    -> dict`` (the op's activations), ``_mix(x, output_final_state)`` (the op call) and ``out``
    (``GatedOutput``)."""

    def _check_common(self, hidden_size, num_heads, head_dim, head_v_dim, use_short_conv, conv_size, conv_bias,
                      use_gate, norm_eps, backend, layer_idx) -> None:
        """The constructor arguments both layers take, checked and stored."""
        self.hidden_size = check_int("hidden_size", hidden_size)
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int("head_dim", head_dim)
        if head_dim > 256:
            raise ValueError(f"head_dim must be <= 256 (fla's GDN-2 kernels), got {head_dim}")
        self.head_v_dim = head_dim if head_v_dim is None else check_int("head_v_dim", head_v_dim)
        self.use_short_conv = check_bool("use_short_conv", use_short_conv)
        self.conv_size = check_int("conv_size", conv_size, minimum=2)
        check_bool("conv_bias", conv_bias)
        self.use_gate = check_bool("use_gate", use_gate)
        check_positive_float("norm_eps", norm_eps)
        self.backend = check_backend(backend)
        self.layer_idx = layer_idx

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value) -> None:
        self._backend = check_backend(value)

    def mix(self, x: dict, output_final_state: bool = False):
        """The recurrent core on ``inputs``' activations: ``(o [B, T, H, V], final state(s) or None)``."""
        # The ops take one explicit dtype (the projections'): autocast stays off inside them.
        with torch.autocast(device_type=x["q"].device.type, enabled=False):
            return self._mix(x, output_final_state)

    @staticmethod
    def check_optimized_dtype(x: dict) -> None:
        if x["q"].dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"hidden_states: the optimized backend runs in float32 or bfloat16, got activations "
                             f"in {x['q'].dtype} (use backend='reference' for float64)")

    @property
    def plain(self) -> bool:
        """Whether the convolutions and norms run as their PyTorch forms (the reference backend)."""
        return self.backend == "reference"

    def first_parameter(self) -> torch.Tensor:
        """The first weight ``hidden_states`` meets (the query projection's): the device and, outside
        autocast, the dtype the input must have."""
        return self.proj.q_proj.weight

    def check_backend_dtype(self) -> None:
        """A layer in float64 (or float16) runs on the reference backend only: said before fla's
        Triton convolution, which refuses it with an interpreter or compiler error."""
        dtype = self.first_parameter().dtype
        if self.backend == "optimized" and dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"hidden_states: the optimized backend runs in float32 or bfloat16, the layer's "
                             f"parameters are {dtype} (use backend='reference' for float64)")

    def core(self, hidden_states: torch.Tensor, output_final_state: bool = False):
        """``mix(inputs(hidden_states))`` with the errors in the layer's terms: ``hidden_states`` and the
        parameters checked finite at the entry (``check_finite_entry``), and an op's refusal of an
        activation computed from them (``g`` below -745, an overflowed projection) said of the layer's
        input or parameters (``activation_error``), not of the op's ``q``, ``g``, …"""
        from optimized.checks import NonFiniteActivation

        check_finite_entry(hidden_states, self.named_parameters())
        try:
            return self.mix(self.inputs(hidden_states), output_final_state=output_final_state)
        except NonFiniteActivation as e:
            raise activation_error(hidden_states, e, self.named_parameters()) from e

    def forward_with_states(self, hidden_states: torch.Tensor):
        """``(output [B, T, D], final state(s))``: the forward plus the recurrence's final state(s)."""
        check_forward_args(hidden_states, self.hidden_size, like=self.first_parameter())
        self.check_backend_dtype()
        o, states = self.core(hidden_states, output_final_state=True)
        return self.out(o, hidden_states, plain=self.plain), states

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, past_key_values=None, use_cache: bool = False,
                output_attentions: bool = False, **kwargs):
        """fla's layer signature: returns ``(output [B, T, D], None, None)`` (no attentions, no cache)."""
        check_forward_args(hidden_states, self.hidden_size, attention_mask, past_key_values, use_cache,
                           like=self.first_parameter(), extra=kwargs)
        self.check_backend_dtype()
        if output_attentions:
            raise ValueError("output_attentions is not supported: a linear-attention layer has no attention matrix")
        o, _ = self.core(hidden_states)
        return self.out(o, hidden_states, plain=self.plain), None, None
