"""Every variant of ``variants.py`` (HEAD, the working tree, the working tree with one change reverted)
runs the nested op with its kernels (Triton's interpreter on the CPU) and must give HEAD's output, final
states and every gradient bit for bit: float32 activations, scheme parameters in float32 and in bf16,
with and without initial states and ``output_final_state``, L = 3 and 4.

Run from the repository root: python results/2026-12-04-nested-host-ops-cpu/bitwise_check.py"""
import sys

import torch

sys.path.insert(0, "results/2026-12-04-nested-host-ops-cpu")
import variants  # noqa: E402
from ngdn.nested_inputs import NestedShape, nested_inputs  # noqa: E402
from reference.nested import Level  # noqa: E402

NAMES = ("q", "k", "v", "g", "b", "w", "r")


def run(op, L, param_dtype, with_states, scheme):
    shape = NestedShape(B=1, T=200, H=2, L=L, K=16, V=16)
    x = nested_inputs(shape, seed=0, scheme=scheme)
    args = {n: x[n].float().requires_grad_() for n in NAMES}
    levels = [Level(lv.scheme, lv.interval, {n: p.to(param_dtype).requires_grad_() for n, p in lv.params.items()},
                    lv.reduction) for lv in x["levels"]]
    gen = torch.Generator().manual_seed(1)
    init = ([torch.randn(1, 2, 16, 16, generator=gen).requires_grad_() if ℓ % 2 == 0 else None for ℓ in range(L)]
            if with_states else None)
    o, finals = op(**args, levels=levels, initial_states=init, output_final_state=with_states)
    loss = (o * torch.randn(o.shape, generator=gen)).sum()
    if finals is not None:
        loss = loss + sum((f * torch.randn(f.shape, generator=gen)).sum() for f in finals)
    loss.backward()
    leaves = [*args.values(), *(p for lv in levels for p in lv.params.values()), *(init or [])]
    return [o, *(finals or [])] + [t.grad for t in leaves if t is not None]


def main():
    ops = variants.ops()
    bad = 0
    for L, param_dtype, with_states, scheme in [(4, torch.float32, False, "learned"),
                                                (4, torch.bfloat16, False, "learned"),
                                                (3, torch.bfloat16, True, "learned"),
                                                (3, torch.float32, True, ("merge", "bounded_erase"))]:
        want = run(ops["head"], L, param_dtype, with_states, scheme)
        for name, op in ops.items():
            got = run(op, L, param_dtype, with_states, scheme)
            same = len(got) == len(want) and all(
                (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                              and torch.equal(a, b)) for a, b in zip(got, want))
            bad += not same
            print(f"L={L} params {str(param_dtype)[6:]:8s} states {with_states!s:5s} {str(scheme):26s} {name:32s} "
                  f"{len(got)} tensors {'bit for bit' if same else 'DIFFERENT'}")
    print("all bit for bit" if not bad else f"{bad} DIFFERENT")
    return bad


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
