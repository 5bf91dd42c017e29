"""Shared memory of the kernels the launchers now run at one pipeline stage where a GPU refuses
Triton's default stages, at K = V = 256, compiled here for a compute capability (no GPU needed;
the H200 image's Triton 3.6 beside this machine's, as ``scripts/kernel_resources.py`` runs):

    PYTHONPATH=/tmp/t36site python results/2026-12-04-kernel-shared-memory-other-gpus-cpu/one_stage.py 86

The scans' rows at 8 warps, as their launcher picks them at K = 256 (V blocks of 16); the probe's
gates (K ≤ 128 only) at the benchmark's K = V = 128, the widest blocks they run; the snapshot reads at
K = V = 256 and 64 pairs; Fenwick GDN-2's intra-chunk backward at V = 128 (it takes K ≤ 128 on CUDA).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import kernel_resources as kr  # noqa: E402

kr.KV = 256
kr.ARCH = int(sys.argv[1]) if len(sys.argv) > 1 else 86
ROWS = ("state_grad_bwd", "state_grad_bwd factored", "promote_scan_fwd bv16", "promote_scan_bwd bv16",
        "probe_gates_nu_fwd (n = 16, κ)", "probe_gates_nu_bwd (n = 16, κ)", "probe_gates_nu_bwd (n = 64, ω)",
        "snapshot_read_fwd (n = 64)", "snapshot_read_dq (n = 64)", "fenwick_intra_bwd")
print("| kernel | warps | stages | registers / thread | spill bytes / thread | shared memory bytes |\n|---|---|---|---|---|---|")
for name, kernel, types, consts, warps in kr._kernels():
    if name not in ROWS:
        continue
    w = 8 if name.startswith("promote_scan") else (warps["num_warps"] if isinstance(warps, dict) else warps)
    for stages in (None, 2, 1):
        r = kr.resources(kernel, types, consts, {"num_warps": w} | ({} if stages is None else {"num_stages": stages}))
        print(f"| {name} | {w} | {stages or 'default'} | {r['REG']} | {r['STACK']} | {r['shared_dynamic']} |", flush=True)
