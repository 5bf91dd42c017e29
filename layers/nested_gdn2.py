"""``NestedGDN2``: a Nested GDN-2 attention layer in fla's conventions, ``[B, T, D]`` in and out.

Backed by ``optimized.chunk_nested_gdn2`` (``backend="optimized"``) or by the float64 per-token
reference ``reference.naive_nested_gdn2`` (``backend="reference"``, for tests: the same layer
with only the op swapped). Any registered promotion scheme works; its parameters are
``nn.Parameter``s of the layer (``scheme_params.level{ℓ}.{name}``), initialised by
``reference.make_levels`` from torch's global generator (``torch.manual_seed`` fixes them).
"""
from __future__ import annotations

import torch
from torch import nn

from layers.common import (GatedOutput, QKVProjections, RecurrentLayer, check_int, check_positive_float)


class NestedGDN2(RecurrentLayer):
    """Nested GDN-2 layer: level 0 is GDN-2 with per-channel gates, levels 1..L-1 are promoted
    memories, a per-token softmax router mixes the L reads (CONTRACT §3).

    Projections (bias-free, from ``hidden_size``): ``q_proj`` gives one query per head and level
    (``[B, T, H, L, K]``), ``k_proj``/``v_proj`` level 0's key and value, ``a_proj`` the log-decay
    ``g`` (``DecayGate``), ``b_proj``/``w_proj`` the erase and write gates (sigmoid), ``r_proj``
    the router logits ``[B, T, H, L]``; q, k, v go through short convolutions (``use_short_conv``)
    and q, k are l2-normalised. The output is ``o_proj(RMSNorm(o) ⊙ SiLU(g_proj(x)))`` per head
    (``use_gate``), as fla's GatedDeltaNet.

    Recurrent state per sequence: L levels × H heads × K × V.

    Args:
        hidden_size: model width D.
        num_heads: H heads per level.
        head_dim: key width K (≤ 256, fla's limit).
        head_v_dim: value width V (default ``head_dim``).
        num_levels: L ≥ 1 (L = 1 is GDN-2 with a router over one level).
        scheme: a registered promotion scheme name, or one name per level ℓ = 1..L-1.
        intervals, query_counts, reduction: as ``reference.make_levels`` (defaults: ``f_ℓ = 2^(ℓ-1)``
            chunks, the query ladder ``min(K, 16·2^(ℓ-1))``, ``"mean"``).
        gate_scale: ``make_levels``' initial spread of the scheme's gate weights.
        use_short_conv, conv_size, conv_bias: the short convolutions on q, k, v.
        use_gate: output gate (else RMSNorm only); norm_eps: its epsilon.
        backend: ``"optimized"`` or ``"reference"``; may be reassigned on the module.
        layer_idx: kept for fla's conventions (no cache uses it).
    """

    def __init__(self, hidden_size: int = 256, num_heads: int = 2, head_dim: int = 64, head_v_dim: int | None = None,
                 num_levels: int = 4, scheme="learned", intervals=None, query_counts=None, reduction="mean",
                 gate_scale: float = 1.0, use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False,
                 use_gate: bool = True, norm_eps: float = 1e-5, backend: str = "optimized",
                 layer_idx: int | None = None):
        super().__init__()
        from reference import make_levels

        self._check_common(hidden_size, num_heads, head_dim, head_v_dim, use_short_conv, conv_size, conv_bias,
                           use_gate, norm_eps, backend, layer_idx)
        self.num_levels = check_int("num_levels", num_levels)
        check_positive_float("gate_scale", gate_scale)
        H, K, V, L = self.num_heads, self.head_dim, self.head_v_dim, self.num_levels
        if not (isinstance(scheme, str) or (isinstance(scheme, (list, tuple)) and all(isinstance(s, str) for s in scheme))):
            raise TypeError(f"scheme must be a scheme name or a list of L - 1 names, got {type(scheme).__name__}")
        # make_levels checks scheme names, intervals, query counts and the reduction, naming each.
        levels = make_levels(L, H, K, V, scheme=scheme, intervals=intervals, query_counts=query_counts,
                             reduction=reduction, dtype=torch.float32, gate_scale=gate_scale)
        self.level_meta = [(lv.scheme, lv.interval, lv.reduction) for lv in levels]
        self.scheme_params = nn.ModuleDict({
            f"level{ℓ}": nn.ParameterDict({name: nn.Parameter(p) for name, p in lv.params.items()})
            for ℓ, lv in enumerate(levels, start=1)})

        self.proj = QKVProjections(hidden_size, H * L, H, K, V, use_short_conv, conv_size, conv_bias)
        self.r_proj = nn.Linear(hidden_size, H * L, bias=False)
        self.out = GatedOutput(hidden_size, H, V, use_gate, norm_eps)


    def get_extra_state(self) -> dict:
        """The levels' settings the parameters do not hold, kept in the ``state_dict``: each level's
        (scheme, interval, reduction)."""
        return {"levels": [list(m) for m in self.level_meta]}

    def set_extra_state(self, state) -> None:
        """A ``state_dict`` loads only into a layer with the same levels' settings: the same
        parameter shapes under another scheme, interval or reduction would compute another model."""
        got = [tuple(m) for m in state.get("levels", ())] if isinstance(state, dict) else None
        if got != [tuple(m) for m in self.level_meta]:
            raise ValueError(f"state_dict: the levels' (scheme, interval, reduction) are {got}, this layer's "
                             f"{self.level_meta}; build the layer with the checkpoint's settings")

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, heads={self.num_heads}, K={self.head_dim}, V={self.head_v_dim}, "
                f"levels (scheme, interval, reduction)={self.level_meta}, backend={self.backend!r}")

    def levels(self, dtype: torch.dtype | None = None) -> list:
        """The ``reference.nested.Level`` list over this layer's parameters (cast to ``dtype``
        if given; gradients flow back through the cast)."""
        from reference import Level

        return [Level(scheme, interval,
                      {n: (p if dtype is None else p.to(dtype)) for n, p in self.scheme_params[f"level{ℓ}"].items()},
                      reduction)
                for ℓ, (scheme, interval, reduction) in enumerate(self.level_meta, start=1)]

    def inputs(self, hidden_states: torch.Tensor) -> dict:
        """The op's activations ``q [B, T, H, L, K]``, ``k, g, b [B, T, H, K]``, ``v, w [B, T, H, V]``,
        ``r [B, T, H, L]``, all in one dtype (the projections')."""
        B, T = hidden_states.shape[:2]
        x = self.proj(hidden_states, plain=self.plain)
        x["q"] = x["q"].view(B, T, self.num_heads, self.num_levels, self.head_dim)
        x["r"] = self.r_proj(hidden_states).view(B, T, self.num_heads, self.num_levels)
        dt = x["k"].dtype
        return {n: t.to(dt) for n, t in x.items()}


    def _mix(self, x: dict, output_final_state: bool):
        names = ("q", "k", "v", "g", "b", "w", "r")
        if self.backend == "reference":
            from reference import naive_nested_gdn2

            dt = x["q"].dtype
            o, states = naive_nested_gdn2(*[x[n].double() for n in names], self.levels(torch.float64),
                                          output_final_state=output_final_state)
            return o.to(dt), states
        from optimized import chunk_nested_gdn2

        self.check_optimized_dtype(x)
        return chunk_nested_gdn2(*[x[n] for n in names], self.levels(), output_final_state=output_final_state)


    def state_size(self) -> int:
        """Recurrent state elements per sequence: ``L · H · K · V``."""
        return self.num_levels * self.num_heads * self.head_dim * self.head_v_dim
