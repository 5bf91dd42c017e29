"""``GDN2``: a flat GDN-2 attention layer in fla's conventions over ``optimized.chunk_gdn2``
(``backend="optimized"``) or the float64 reference ``reference.naive_gdn2``
(``backend="reference"``), ``[B, T, D]`` in and out: the flat arm beside ``NestedGDN2``.
"""
from __future__ import annotations

import torch

from layers.common import (GatedOutput, QKVProjections, RecurrentLayer)


class GDN2(RecurrentLayer):
    """Flat GDN-2 layer (CONTRACT §1) with per-channel gates.

    State size is matched to a ``NestedGDN2(num_heads=H, num_levels=L)`` by giving the flat layer
    ``num_heads = L·H`` heads of the same ``K × V``: both then carry ``L·H·K·V`` state elements per
    sequence (``state_size()``). The flat layer's q projection is then exactly as wide as the
    nested one's (``L·H·K``: one query per head there, one per head and level here); its k, v
    and gate projections are L times wider, and it has no router and no scheme parameters.

    Projections and output as ``NestedGDN2``: ``q_proj, k_proj, v_proj`` (short convolutions,
    l2-normalised q, k), ``a_proj`` → log-decay ``g``, ``b_proj``/``w_proj`` → erase and write
    gates (sigmoid), ``o_proj(RMSNorm(o) ⊙ SiLU(g_proj(x)))``.
    """

    def __init__(self, hidden_size: int = 256, num_heads: int = 8, head_dim: int = 64, head_v_dim: int | None = None,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False, use_gate: bool = True,
                 norm_eps: float = 1e-5, backend: str = "optimized", layer_idx: int | None = None):
        super().__init__()
        self._check_common(hidden_size, num_heads, head_dim, head_v_dim, use_short_conv, conv_size, conv_bias,
                           use_gate, norm_eps, backend, layer_idx)
        H, K, V = self.num_heads, self.head_dim, self.head_v_dim
        self.proj = QKVProjections(hidden_size, H, H, K, V, use_short_conv, conv_size, conv_bias)
        self.out = GatedOutput(hidden_size, H, V, use_gate, norm_eps)


    def inputs(self, hidden_states: torch.Tensor) -> dict:
        """``q, k, g, b [B, T, H, K]``, ``v, w [B, T, H, V]`` in one dtype (the projections')."""
        x = self.proj(hidden_states, plain=self.plain)
        dt = x["k"].dtype
        return {n: t.to(dt) for n, t in x.items()}


    def _mix(self, x: dict, output_final_state: bool):
        names = ("q", "k", "v", "g", "b", "w")
        if self.backend == "reference":
            from reference import naive_gdn2

            o, state = naive_gdn2(*[x[n].double() for n in names], output_final_state=output_final_state)
            return o.to(x["q"].dtype), state
        from optimized import chunk_gdn2

        self.check_optimized_dtype(x)
        return chunk_gdn2(*[x[n] for n in names], output_final_state=output_final_state)


    def state_size(self) -> int:
        """Recurrent state elements per sequence: ``H · K · V``."""
        return self.num_heads * self.head_dim * self.head_v_dim
