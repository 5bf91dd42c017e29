"""The Fenwick GDN-2 carry scans give the same values whatever their V block.

The V columns are independent in both scans (every dot contracts over K or the chunk's tokens),
so blocks of 16 and of 32 must agree bit for bit. On the H200 (Triton 3.6, TF32 dots) they did
not with ``BK = 128``, ``BV = 16`` and 8 warps: the reverse scan's outputs differed by up to 78
at V = 16 and the launch hit an illegal memory access at V = 100 and 128; the launchers now run
blocks of 16 with 4 warps (``states.scan_warps``). Blocks of 16 are what ``block_sizes`` gives
at V ≤ 16 and K > 128. Under the interpreter the comparison checks the V-block masks only.
"""
import pytest
import torch
import triton

from ngdn.testing import on_cuda
from optimized.fenwick_gdn2 import states as S

B, H, L, T = 1, 2, 12, 200          # four chunks, the last ragged; J = 2 bucket blocks and the own block


def _scans(K, V, BV, device, dtype, dot):
    """Both scan kernels launched with V blocks of ``BV`` (and the launchers' warps for it) on one
    seeded draw: ``(h, vn, final, dh, dv2, dpre)``."""
    N = triton.cdiv(T, S.CHUNK)
    J = (N - 1).bit_length()
    NBV = (J + 1) * V
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
    qg, kg, wy = (rnd(B, T, H, K, scale=0.1) for _ in range(3))
    gk = (-torch.rand(B, T, H, K, generator=g)).to(device=device, dtype=dtype)
    u, do, dv = (rnd(B, T, H, NBV) for _ in range(3))
    dfinal = rnd(B, H, L, K, V).float()
    mtab = torch.tensor([(c ^ (c + 1)).bit_length() - 1 for c in range(N)], dtype=torch.int32, device=device)
    BK = max(16, triton.next_power_of_2(K))
    opts = dict(H=H, K=K, V=V, BT=S.CHUNK, BK=BK, BV=BV, DOT=dot, IS_VARLEN=False, num_warps=S.scan_warps(BK, BV))
    grid = (triton.cdiv(V, BV), B * H)
    carry = torch.zeros(B, 2, H, K, NBV, device=device)
    h = torch.empty(B, N, H, K, NBV, device=device, dtype=dtype)
    vn = torch.empty(B, T, H, NBV, device=device, dtype=dtype)
    final = torch.zeros(B, H, L, K, V, device=device)
    S.fenwick_states_fwd_kernel[grid](kg, wy, u, gk, mtab, carry, h, vn, final, None, None, T, N, J, L, 1, **opts)
    dh = torch.empty(B, N, H, K, NBV, device=device, dtype=dtype)
    dv2 = torch.empty(B, T, H, NBV, device=device, dtype=dtype)
    dpre = torch.zeros(B, 2, H, K, J * V, device=device)
    S.fenwick_states_bwd_kernel[grid](qg, kg, wy, gk, do, dv, dfinal, mtab, dh, dv2, dpre, None, None, 0.1,
                                      T, N, J, L, 1, HAS_DFINAL=True, **opts)
    return h, vn, final, dh, dv2, dpre


@pytest.mark.parametrize("K,V", [(128, 16), (128, 40), (112, 100)])
def test_v_blocks_of_16_equal_blocks_of_32(K, V):
    device, dtype, dot = ("cuda", torch.bfloat16, "tf32") if on_cuda() else ("cpu", torch.float32, "ieee")
    names = ("h", "vn", "final", "dh", "dv2", "dpre")
    for name, a, b in zip(names, _scans(K, V, 16, device, dtype, dot), _scans(K, V, 32, device, dtype, dot)):
        assert torch.equal(a, b), f"{name}: max difference {(a.float() - b.float()).abs().max().item()}"


def test_blocks_of_16_run_four_warps():
    assert S.scan_warps(128, 16) == 4
    assert S.scan_warps(256, 16) == 4
    assert S.scan_warps(128, 32) == 8
    assert S.scan_warps(32, 32) == 4
