"""The nested example of docs/schemes.md ("Nested GDN-2 in brief"): the float64 reference and the
optimized op side by side on the same rounded inputs, and how far apart they are.

    python examples/nested_side_by_side.py

Tiny on purpose (B=1, T=130, H=1, L=3, K=V=16): it runs in seconds under the CPU
interpreter. T=130 is two full chunks of 64 (levels 1 and 2 fire) plus a partial one.
"""
import torch

import optimized  # first: picks the device mode (CUDA, or the Triton interpreter on CPU)
from ngdn.nested_inputs import (NestedShape, cast_levels, cast_states, levels_as_reference,
                                nested_inputs, states_as_reference)
from ngdn.inputs import as_reference, cast
from optimized import chunk_nested_gdn2
from reference import naive_nested_gdn2

NAMES = ("q", "k", "v", "g", "b", "w", "r")   # q [B,T,H,L,K], k v g b w as GDN-2, r [B,T,H,L]


def rel(a, b):
    """‖a − b‖ / ‖b‖ in float64."""
    a, b = a.detach().double().cpu(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def main():
    # 1. Seeded float64 masters: activations, levels (scheme parameters) and initial states.
    x = nested_inputs(NestedShape(B=1, T=130, H=1, L=3, K=16, V=16), seed=0)

    # 2. The optimized op's inputs: float32 (it refuses float64) on the mode's device.
    dt, dev = torch.float32, optimized.triton_mode.device()
    o, states = chunk_nested_gdn2(*[cast(x[n], dt, dev) for n in NAMES], cast_levels(x["levels"], dt, dev),
                                  initial_states=cast_states(x["initial_states"], dt, dev),
                                  output_final_state=True)

    # 3. The float64 reference on the same float32-rounded values (so only the arithmetic differs).
    o_ref, states_ref = naive_nested_gdn2(*[as_reference(x[n], dt) for n in NAMES],
                                          levels_as_reference(x["levels"], dt),
                                          initial_states=states_as_reference(x["initial_states"], dt),
                                          output_final_state=True)

    # 4. Relative errors ‖opt − ref‖ / ‖ref‖: the output and each level's final state.
    errors = {"output": rel(o, o_ref)}
    errors.update({f"state M_{l}": rel(s, s_ref) for l, (s, s_ref) in enumerate(zip(states, states_ref))})
    print(f"device mode {optimized.MODE}, output {tuple(o.shape)} {o.dtype}")
    for name, e in errors.items():
        print(f"{name:>10}: {e:.1e}")
    return errors


if __name__ == "__main__":
    main()
