"""bf16 agreement of the nested op's two Triton gate paths at the benchmark shape (L = 4, K = 128):
the default (z made inside the gates' kernels, TF32 dots) against the Triton gates on the bmm's z
(TF32 cuBLAS): max |a - b| / max |b| of the output and of every input's and parameter's gradient."""
import torch

from bench.reads_ab import _ops

torch.manual_seed(0)
res = {}
for name in ("triton", "gates-triton"):
    ops = _ops(8, 4096, 16, 128, 128, 4, torch.bfloat16, 0, [name])
    leaves, forward, do = ops[name]
    o = forward()
    o.backward(do)
    res[name] = [o.detach().float()] + [t.grad.detach().float() for t in leaves]
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
names = ["o"] + [f"grad{i}" for i in range(len(res["triton"]) - 1)]
for n, a, b in zip(names, res["triton"], res["gates-triton"]):
    rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    print(f"{n}: shape {tuple(a.shape)} max |a - b| / max |b| = {rel:.3e}")
