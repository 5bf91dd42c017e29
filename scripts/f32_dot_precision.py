"""Diagnostic (GPU): relative error of a float32 Triton dot vs float64, under the
current TRITON_F32_DEFAULT. Run twice (unset / =ieee) to see whether the knob acts."""
import os

import torch
import triton
import triton.language as tl


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    idx = tl.arange(0, N)
    a = tl.load(a_ptr + idx[:, None] * N + idx[None, :])
    b = tl.load(b_ptr + idx[:, None] * N + idx[None, :])
    tl.store(c_ptr + idx[:, None] * N + idx[None, :], tl.dot(a, b))


g = torch.Generator().manual_seed(0)
a, b = (torch.randn(64, 64, generator=g, dtype=torch.float64) for _ in range(2))
c = torch.empty(64, 64, device="cuda")
dot_kernel[(1,)](a.float().cuda(), b.float().cuda(), c, N=64)
ref = a.float().double() @ b.float().double()
print(f"TRITON_F32_DEFAULT={os.environ.get('TRITON_F32_DEFAULT', 'unset')}: "
      f"rel. error {((c.double().cpu() - ref).norm() / ref.norm()).item():.2e}")
