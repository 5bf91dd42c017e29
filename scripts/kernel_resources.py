"""Registers, spill stack and shared memory of our Triton kernels on an H100/H200 (sm_90, or the
compute capability ``--arch`` names), compiled here without a GPU: Triton generates the cubin with
its bundled ptxas and ``cuobjdump --dump-resource-usage`` reads the counts back. A kernel that
needs more than 255 registers per thread spills to a local stack (``STACK`` bytes per thread): the
usual reason a latency-bound kernel runs far slower than its traffic (bench/NOTES.md, the two-phase
scan). The shared memory is the figure Triton holds against the GPU's limit a block at launch
(``OutOfResources`` above it: the launchers' fallbacks in ``optimized/fits.py``).

Shapes are the benchmark's (K = V = 128 unless ``--kv``, H = 16; the scans' and gates' operands are float32);
block sizes and warps as the launchers pick them, plus the variants ``reads_ab`` times. (The reads
kernels' blocks were chosen the same way earlier: ``optimized/warps.py``, ``reads_bwd``.)

    python scripts/kernel_resources.py            # every kernel below, one Markdown table
    python scripts/kernel_resources.py scan       # those whose name contains "scan"
    python scripts/kernel_resources.py --arch 80 scan    # compiled for an A100 (sm_80) instead
    python scripts/kernel_resources.py --kv 256 state_grad   # the scans, reads, state gradient at K = V = 256
    python scripts/kernel_resources.py --sass "promote_scan_fwd prefetch"   # the row of that exact name:
        # its machine code's global loads and stores, waits, dots, exponentials, spills and loops in
        # program order (runs of one kind as one line), to see where a loop's loads are issued
        # relative to the arithmetic that needs them

The shared memory of every kernel's launch forms on sm_80, sm_89 and sm_90, and what the launchers do
where a form does not fit: ``scripts/kernel_shared_memory.py`` (the table ``docs/kernel-shared-memory.md``),
which reads each kernel's signature from here.

The compiler is this machine's Triton (the H200 image runs 3.6; register allocation can differ
between versions by a few registers, spills seldom appear or vanish between them)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch

# compile for CUDA, not the interpreter: optimized.triton_mode picks the interpreter when no GPU is
# visible, and triton.jit decides at decoration time
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


def _kernels():
    from optimized.nested.probe_gates import probe_gates_bwd_kernel, probe_gates_fwd_kernel
    from optimized.nested.promote_scan import (num_warps, promote_scan_bwd_kernel, promote_scan_bwd_prefetch_kernel,
                                        promote_scan_fwd_kernel, promote_scan_fwd_prefetch_kernel)
    from optimized.nested.promote_scan_two_phase import promote_scan_bwd_carry_kernel, promote_scan_bwd_pairs_kernel

    f32 = "*fp32"
    scan_sizes = dict(H=16, K=KV, V=KV, BK=max(16, 1 << (KV - 1).bit_length()))
    fwd_args = dict.fromkeys(("m0", "kappa", "nu", "beta", "omega", "gamma", "states"), f32) | {
        "fire_offsets": "*i32", "F": "i32", "N": "i32", "stride_sb": "i32"}
    bwd_args = dict.fromkeys(("states", "kappa", "nu", "beta", "omega", "gamma", "dstates", "dm0", "dkappa_part",
                              "dnu", "dbeta_part", "domega", "dgamma_part"), f32) | {"fire_offsets": "*i32"} | \
        dict.fromkeys(("F", "B", "N", "stride_sb", "stride_db"), "i32")
    rows = []
    # the default blocks (BN = 16; 32 until 2026-12-02, reads_ab's bn32; BV = 32, the reverse scan's
    # default is the " bv64" row's since 2026-12-02), and reads_ab's variants
    # ... and packed sequences (IS_VARLEN: per-sequence firing offsets), at the default blocks
    # " w4": 4 warps instead of the launchers' 8 (bench.scan_ab's -w4 variants)
    for name, BN, BV, prec, varlen, w in (("", 16, 32, "tf32", False, None), (" bv64", 16, 64, "tf32", False, None),
                                          (" bn32", 32, 32, "tf32", False, None),
                                          (" bv16", 16, 16, "tf32", False, None), (" bn64", 64, 32, "tf32", False, None),
                                          (" packed", 16, 32, "tf32", True, None), (" w4", 16, 32, "tf32", False, 4),
                                          (" bv16 w4", 16, 16, "tf32", False, 4)):
        warps = num_warps(128, BV) if w is None else w      # as the scans' launchers pick them
        c = dict(scan_sizes, BN=BN, BV=BV, IS_VARLEN=varlen)
        rows.append((f"promote_scan_fwd{name}", promote_scan_fwd_kernel, fwd_args,
                     c | dict(HAS_M0=True, DOT_PRECISION="ieee"), warps))
        rows.append((f"promote_scan_bwd{name}", promote_scan_bwd_kernel, bwd_args, c | dict(DOT_PRECISION=prec), warps))
    # the scans loading their operands a step ahead (prefetch=True), beside the rows above: the forward
    # at the IEEE launches (V blocks of 32, 16) and at the bf16 op's TF32 one (one V block of 128, plain
    # too), the reverse scan at its default V block (64)
    for name, kernel, BV, prec in ((" prefetch", promote_scan_fwd_prefetch_kernel, 32, "ieee"),
                                   (" prefetch bv16", promote_scan_fwd_prefetch_kernel, 16, "ieee"),
                                   (" tf32 bv128", promote_scan_fwd_kernel, 128, "tf32"),
                                   (" prefetch tf32 bv128", promote_scan_fwd_prefetch_kernel, 128, "tf32")):
        c = dict(scan_sizes, BN=16, BV=BV, IS_VARLEN=False, HAS_M0=True, DOT_PRECISION=prec)
        rows.append((f"promote_scan_fwd{name}", kernel, fwd_args, c, num_warps(128, BV)))
    rows.append(("promote_scan_bwd prefetch bv64", promote_scan_bwd_prefetch_kernel, bwd_args,
                 dict(scan_sizes, BN=16, BV=64, IS_VARLEN=False, DOT_PRECISION="tf32"), num_warps(128, 64)))
    rows += _reads_and_state_grad_kernels()
    rows += _fenwick_states_kernels()
    # the two-phase reverse scan at its old default V block (32) and at the fused scan's (64:
    # reads_ab's scan-2phase-bv64 and scan-2phase-n32)
    for BN, BV in ((32, 32), (16, 32), (16, 64)):
        c = dict(scan_sizes, BN=BN, BV=BV)
        blocks = f"BN = {BN}" + ("" if BV == 32 else f", BV = {BV}")
        rows.append((f"promote_scan_bwd_carry (two-phase 1, {blocks})", promote_scan_bwd_carry_kernel,
                     dict.fromkeys(("kappa", "beta", "gamma", "g"), f32) | dict.fromkeys(("F", "N", "stride_gb"), "i32"),
                     c | dict(DOT_PRECISION="tf32"), num_warps(128, BV)))
        rows.append((f"promote_scan_bwd_pairs (two-phase 2, {blocks})", promote_scan_bwd_pairs_kernel, dict.fromkeys(
            ("states", "kappa", "nu", "beta", "omega", "gamma", "g", "dkappa_part", "dnu", "dbeta_part", "domega",
             "dgamma_part"), f32) | dict.fromkeys(("F", "B", "N", "stride_sb", "stride_gb"), "i32"),
            c | dict(DOT_PRECISION="tf32"), num_warps(128, BV)))
    for n in (16, 32):
        g = dict(BN=n, BK=128, BV=128)
        rows.append((f"probe_gates_fwd (n = {n})", probe_gates_fwd_kernel,
                     dict.fromkeys(("z", "kappa", "beta", "omega", "gamma"), f32) | {"c_reduce": "fp32"}
                     | dict.fromkeys(("Bt", "n", "H", "K", "V", "C", "OFF_B"), "i32"), g | dict(HAS_KAPPA=True), 4))
        rows.append((f"probe_gates_bwd (n = {n})", probe_gates_bwd_kernel,
                     dict.fromkeys(("z", "dkappa", "dbeta", "domega", "dgamma", "dz"), f32) | {"c_reduce": "fp32"}
                     | dict.fromkeys(("Bt", "n", "H", "K", "V", "C", "OFF_B"), "i32"),
                     g | dict(HAS_KAPPA=True, HAS_DK=True, HAS_DB=True, HAS_DW=True, HAS_DG=True), 4))
    rows += _gates_from_nu_kernels()
    rows += _snapshot_and_fenwick_chunk_kernels()
    return rows


def _gates_from_nu_kernels():
    """The gates that make ``z = ν W`` themselves (``optimized.nested.probe_gates_nu``) at the
    launcher's blocks (tiles of 64 rows: 4 firings of n = 16, 1 of 64; at n = 128, which the op
    leaves to the bmm (``probe_fused.NU_GATES_MAX_PAIRS``), one firing of 128 rows) and warps."""
    from optimized.nested.probe_gates_nu import (TILES, probe_gates_nu_bwd_kernel, probe_gates_nu_bwd_one_kernel,
                                                 probe_gates_nu_fwd_kernel, probe_gates_nu_fwd_one_kernel)

    f32, rows = "*fp32", []
    ints = dict.fromkeys(("Bt", "n", "H", "K", "V", "C", "OFF_B"), "i32") | {"c_reduce": "fp32"}
    for n, G in ((16, 4), (64, 1), (128, 1)):
        for seg, gate in enumerate(("κ", "β", "ω", "γ")):
            g = dict(G=G, NP=n, BV=128, BC=128, SEG=seg, TILES=TILES, PREC="tf32")
            rows.append((f"probe_gates_nu_fwd (n = {n}, {gate})", probe_gates_nu_fwd_kernel,
                         dict.fromkeys(("nu", "w", "out"), f32) | ints, g, 8))
            # the reverse scans' dκ, dβ, dγ as two V blocks' partials (NPART, the op's at V = 128)
            rows.append((f"probe_gates_nu_bwd (n = {n}, {gate})", probe_gates_nu_bwd_kernel,
                         dict.fromkeys(("nu", "w", "dy", "dz"), f32) | ints | {"PART_STRIDE": "i32"},
                         g | dict(HAS_D=True, NPART=1 if seg == 2 else 2), 8))
    one_stage = {"num_warps": 8, "num_stages": 1}      # as the launcher runs them (unpipelined)
    for n, G in ((16, 4), (64, 1)):         # every block in one launch (probe_gates_nu.ONE_LAUNCH)
        g = dict(G=G, NP=n, BV=128, BC=128, FIRST=0, TILES=TILES, PREC="tf32")
        rows.append((f"probe_gates_nu_fwd_one (n = {n})", probe_gates_nu_fwd_one_kernel,
                     dict.fromkeys(("nu", "w", "kappa", "beta", "omega", "gamma"), f32) | ints, g, one_stage))
        rows.append((f"probe_gates_nu_bwd_one (n = {n})", probe_gates_nu_bwd_one_kernel,
                     dict.fromkeys(("nu", "w", "dkappa", "dbeta", "domega", "dgamma", "dz"), f32) | ints
                     | dict.fromkeys(("STRIDE_NK", "STRIDE_K"), "i32"),
                     g | dict.fromkeys(("HAS_D0", "HAS_D1", "HAS_D2", "HAS_D3"), True) | dict(NPART=2), one_stage))
    return rows


def _snapshot_and_fenwick_chunk_kernels():
    """The probe's snapshot reads (``ν = Q S`` and ``dQ``, TF32 as in bf16 runs, n = 16 and 64 pairs),
    the key-block partial sum, and Fenwick GDN-2's intra-chunk output, forward and backward (bf16
    activations, V = 128; its WY kernel runs under the interpreter only), at their launchers' blocks
    and warps."""
    from optimized.fenwick_gdn2.intra import INTRA_LEVELS, _block_v, fenwick_intra_bwd_kernel, fenwick_intra_fwd_kernel
    from optimized.nested.key_block_partials import ROWS, add_key_block_partials_kernel
    from optimized.nested.snapshot_reads import block_sizes as snapshot_blocks
    from optimized.nested.snapshot_reads import snapshot_read_dq_kernel, snapshot_read_fwd_kernel
    from optimized.warps import num_warps

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    rows = []
    for n in (16, 64):
        BN, BK, BV = snapshot_blocks(n, KV, KV)
        c = dict(H=16, K=KV, V=KV, BN=BN, BK=BK, BV=BV, PREC="tf32")
        rows.append((f"snapshot_read_fwd (n = {n})", snapshot_read_fwd_kernel,
                     dict.fromkeys(("q", "src", "final", "nu"), f32) | {"rows": "*i32"}
                     | dict.fromkeys(("F", "N", "stride_sb"), i32), c, 4))
        rows.append((f"snapshot_read_dq (n = {n})", snapshot_read_dq_kernel,
                     dict.fromkeys(("dnu", "src", "final", "dq_part"), f32) | {"rows": "*i32"}
                     | dict.fromkeys(("F", "N", "BF", "ITEMS", "stride_sb"), i32), c, 4))
    rows.append(("add_key_block_partials", add_key_block_partials_kernel,
                 {"db": bf16, "parts": f32, "out": bf16, "R": i32, "K": i32}, dict(BK=64, BR=ROWS), 4))
    chunk = {"cu_seqlens": "*i64", "chunk_indices": "*i32", "T": i32}
    intra = dict(H=8, V=128, BT=64, BV=_block_v(128), NL=INTRA_LEVELS, DOT="tf32", IS_VARLEN=False)
    rows.append(("fenwick_intra_fwd", fenwick_intra_fwd_kernel,
                 dict.fromkeys(("v", "w", "Aqk", "Akk"), bf16) | {"lam": f32, "o": f32, "L": i32} | chunk,
                 intra, num_warps(64, 64)))
    rows.append(("fenwick_intra_bwd", fenwick_intra_bwd_kernel,
                 dict.fromkeys(("v", "w", "Aqk", "Akk"), bf16) | dict.fromkeys(("lam", "do", "dwv", "dlam", "dAqk",
                                                                                 "dL"), f32) | {"L": i32} | chunk,
                 intra, num_warps(64, 64)))
    return rows


def _fenwick_states_kernels():
    """Fenwick GDN-2's carry scans (bf16 activations, TF32 dots, H = 8, K = V = 128 as
    ``bench.fenwick_gdn2`` runs them) at the stacked blocks of T = 4096 and 65536 (NB = 7, 11)
    and of a short sequence (NB = 2), with the launchers' blocks and warps; and its router
    kernels at V = 128."""
    from optimized.fenwick_gdn2.states import (block_sizes, fenwick_states_bwd_kernel, fenwick_states_fwd_kernel,
                                               launch_options)

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    ints = dict.fromkeys(("T", "N", "J", "L", "NB"), i32) | {"mtab": "*i32", "cu_seqlens": "*i64",
                                                               "chunk_offsets": "*i64"}
    fwd = dict.fromkeys(("kg", "wy", "u", "gk", "h", "vn"), bf16) | {"h0": f32, "final": f32} | ints
    bwd = (dict.fromkeys(("qg", "kg", "wy", "gk", "do", "dv", "dh", "dv2"), bf16)
           | {"dfinal": f32, "dcarry": f32, "dpre": f32, "scale": "fp32"} | ints)
    rows = []
    for NB in (7, 11, 2):
        BK, NBP, BV = block_sizes(128, 128, NB)
        c = dict(H=8, K=128, V=128, BT=64, BK=BK, NBP=NBP, BV=BV, DOT="tf32", IS_VARLEN=False)
        name = f"NB = {NB}: [{BK}, {NBP} x {BV}]"
        opts = launch_options(BK, NBP, BV, None)
        rows.append((f"fenwick_states_fwd ({name})", fenwick_states_fwd_kernel, fwd, c, opts))
        rows.append((f"fenwick_states_bwd ({name})", fenwick_states_bwd_kernel, bwd,
                     c | dict(HAS_DFINAL=True, HAS_DCARRY=False), opts))
    from optimized.fenwick_gdn2.router import OWN_LEVELS, fenwick_router_bwd_kernel, fenwick_router_fwd_kernel
    from optimized.fenwick_gdn2.router import launch_blocks as router_launch
    from optimized.warps import num_warps

    _, BR, BV = router_launch(128, 1)
    c = dict(V=128, BR=BR, BV=BV, OWN=OWN_LEVELS)
    ints = dict.fromkeys(("R", "L", "J", "NB"), i32)
    rows.append((f"fenwick_router_fwd ([{BR}, {BV}])", fenwick_router_fwd_kernel,
                 {"o_intra": f32, "reads": bf16, "lam": bf16, "o": bf16} | ints, c, num_warps(BR, BV)))
    rows.append((f"fenwick_router_bwd ([{BR}, {BV}])", fenwick_router_bwd_kernel,
                 {"do": f32, "reads": bf16, "lam": bf16, "dlam": f32, "do_st": bf16} | ints, c, num_warps(BR, BV)))
    return rows


def _reads_and_state_grad_kernels():
    """The reads kernels and level 0's state-gradient kernel (bf16 activations, as the benchmark
    runs them), one sequence per row and packed."""
    from optimized.nested.reads_bwd import (SNAP_BLOCK_N, reads_bwd_states_kernel, reads_bwd_tokens_kernel, states_block_v,
                                            token_blocks)
    from optimized.nested.reads_fwd import block_sizes as reads_blocks
    from optimized.nested.reads_fwd import reads_fwd_kernel
    from optimized.nested.state_grad import FACTORED_BLOCK_N
    from optimized.nested.state_grad import block_sizes as state_grad_blocks
    from optimized.nested.state_grad import state_grad_bwd_kernel
    from optimized.warps import num_warps as reads_warps

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    BT, BK, BV, BL = reads_blocks(KV, KV, 4)
    BKA, BVA, warps_a = token_blocks(KV, KV)
    SBV = reads_blocks(KV, KV, 4, states_block_v(KV))[2]          # the state-gradient kernel's own V block
    sizes = dict(H=16, K=KV, V=KV, BT=BT, BL=BL, SPLIT=True)
    SK, SV, SS = state_grad_blocks(KV, KV)
    rows = []
    for name, varlen in (("", False), (" packed", True)):
        ints = dict.fromkeys(("T", "N", "S", "S_LO", "L"), i32) | {"scale": "fp32"}
        rows.append((f"reads_fwd{name}", reads_fwd_kernel,
                     dict.fromkeys(("q", "r", "o0", "o"), bf16) | {"states": f32, "states_hi": f32, "read_row": "*i32",
                                                                  "chunk_bounds": "*i32"} | ints,
                     sizes | dict(BK=BK, BV=BV, IS_VARLEN=varlen), reads_warps(BK, BV)))
        for bv in (() if varlen else (32, 64, 128)):      # reads_ab's forward-reads variants
            rows.append((f"reads_fwd bv{bv}", reads_fwd_kernel,
                         dict.fromkeys(("q", "r", "o0", "o"), bf16) | {"states": f32, "states_hi": f32, "read_row": "*i32",
                                                                      "chunk_bounds": "*i32"} | ints,
                         sizes | dict(BK=BK, BV=bv, IS_VARLEN=varlen), reads_warps(BK, bv)))
        rows.append((f"reads_bwd_tokens{name}", reads_bwd_tokens_kernel,
                     dict.fromkeys(("do", "q", "r", "o0", "dq"), bf16) | {"states": f32, "states_hi": f32, "read_row": "*i32",
                     "chunk_bounds": "*i32", "dr": f32, "do0": f32} | ints,
                     sizes | dict(BKA=BKA, BV=BVA, IS_VARLEN=varlen), warps_a))
        # levels ≥ 2's factored snapshot gradients added, in pair blocks of 16 and SNAP_BLOCK_N (the
        # pairs of a level with n ≥ 64); 128 is what n = 128 took before the blocks were capped
        for form, snap, bn in (("", False, 16), (" snap", True, 16), (f" snap bn{SNAP_BLOCK_N}", True, SNAP_BLOCK_N),
                               (" snap bn128", True, 128)):
            rows.append((f"reads_bwd_states{name}{form}", reads_bwd_states_kernel,
                         dict.fromkeys(("do", "q", "r"), bf16) | dict.fromkeys(("row_level", "row_chunk_lo",
                         "row_chunk_hi", "chunk_bounds", "fire_lo", "fire_hi"), "*i32")
                         | dict.fromkeys(("dstates", "snap_q", "snap_dnu"), f32)
                         | dict.fromkeys(("T", "S", "L", "F_SNAP", "N_PAIRS"), i32) | {"scale": "fp32"},
                         sizes | dict(BK=BK, BV=SBV, BN=bn, IS_VARLEN=varlen, SNAP=snap),
                         reads_warps(BK, SBV)))
        for form, factored in (("", False), (" factored", True)):     # injected gradients Qᵀ dν formed inside
            rows.append((f"state_grad_bwd{name}{form}", state_grad_bwd_kernel,
                         dict.fromkeys(("qg", "kg", "w", "gk", "do", "dv", "dh", "dv2"), bf16)
                         | dict.fromkeys(("dht", "ds", "ds_q", "dh0"), f32) | {"slots": "*i32", "cu_seqlens": "*i64",
                         "chunk_offsets": "*i32", "scale": "fp32", "T": i32, "S": i32, "N_PAIRS": i32},
                         dict(H=16, K=KV, V=KV, BT=64, BS=SS, BK=SK, BV=SV, BN=16, HAS_DHT=True, HAS_INJECT=True,
                              FACTORED=factored, STORE_DH0=True, IS_VARLEN=varlen, ONE_PAIR_BLOCK=True), 8))
    # the factored injection with more pairs than its block (level 1 with n > FACTORED_BLOCK_N), at
    # K = V = 128 and 256 (the launcher's blocks for each)
    for K in (128, 256):
        SK, SV, SS = state_grad_blocks(K, K)
        rows.append((f"state_grad_bwd factored K{K} pair blocks of {FACTORED_BLOCK_N}", state_grad_bwd_kernel,
                     dict.fromkeys(("qg", "kg", "w", "gk", "do", "dv", "dh", "dv2"), bf16)
                     | dict.fromkeys(("dht", "ds", "ds_q", "dh0"), f32) | {"slots": "*i32", "cu_seqlens": "*i64",
                     "chunk_offsets": "*i32", "scale": "fp32", "T": i32, "S": i32, "N_PAIRS": i32},
                     dict(H=16, K=K, V=K, BT=64, BS=SS, BK=SK, BV=SV, BN=FACTORED_BLOCK_N, HAS_DHT=True, HAS_INJECT=True,
                          FACTORED=True, STORE_DH0=True, IS_VARLEN=False, ONE_PAIR_BLOCK=False), 8))
    for bka, bva, warps in ((32, 32, 8), (128, 32, 8), (32, 64, 8), (128, 16, 8)):   # reads_ab rtok-*
        rows.append((f"reads_bwd_tokens k{bka} v{bva}", reads_bwd_tokens_kernel,
                     dict.fromkeys(("do", "q", "r", "o0", "dq"), bf16) | {"states": f32, "states_hi": f32, "read_row": "*i32",
                     "chunk_bounds": "*i32", "dr": f32, "do0": f32} | dict.fromkeys(("T", "N", "S", "S_LO", "L"), i32)
                     | {"scale": "fp32"},
                     sizes | dict(BKA=bka, BV=bva, IS_VARLEN=False), warps))
    from optimized.nested.snapshot_grads import add_snapshot_grads_kernel
    from optimized.nested.snapshot_grads import block_sizes as snapshot_grads_blocks
    BN, BKS, BVS = snapshot_grads_blocks(16, KV, KV)
    for precision in ("ieee", "tf32"):
        rows.append((f"add_snapshot_grads {precision}", add_snapshot_grads_kernel,
                     dict.fromkeys(("dst", "q", "dnu"), f32) | dict.fromkeys(("firings", "targets"), "*i32")
                     | dict.fromkeys(("stride_db", "F", "R", "N_PAIRS"), i32),
                     dict(H=16, K=KV, V=KV, BN=BN, BK=BKS, BV=BVS, PRECISION=precision), 8))
    return rows


def _signature(kernel, pointers_and_ints: dict, constexprs: dict):
    names = kernel.arg_names
    missing = [a for a in names if a not in pointers_and_ints and a not in constexprs]
    if missing:
        raise ValueError(f"{kernel.__name__}: no type for {missing}")
    sig = {a: ("constexpr" if a in constexprs else pointers_and_ints[a]) for a in names}
    consts = {(names.index(a),): v for a, v in constexprs.items() if a in names}
    # pointers 16-byte aligned and the stride/size ints divisible by 16, as Triton specialises them
    # at launch for the benchmark's shapes (unless the kernel lists them in do_not_specialize)
    skip = set(getattr(kernel, "do_not_specialize", ()) or ())
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if a not in constexprs and a not in skip and a != "c_reduce" and pointers_and_ints[a] != "fp32"}
    return ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)


ARCH = 90      # the compute capability compiled for (``--arch``: 80 for an A100)
# K = V of the scans', reads' and state-gradient rows (``--kv``; the gates' and Fenwick GDN-2's rows stay at 128)
KV = 128


def _compile(kernel, pointers_and_ints, constexprs, warps):
    src = _signature(kernel, pointers_and_ints, constexprs)
    options = dict(warps) if isinstance(warps, dict) else {"num_warps": warps}
    return triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options=options)


def _cuobjdump(compiled, flag: str) -> str:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([cuobjdump, flag, f.name], capture_output=True, text=True, check=True).stdout


def resources(kernel, pointers_and_ints, constexprs, warps) -> dict:
    """``{"REG": ..., "STACK": ..., "SHARED": ..., "LOCAL": ...}`` of ``kernel`` compiled for sm_90
    (``warps``: ``num_warps``, or the launch's options, ``num_stages`` too)."""
    compiled = _compile(kernel, pointers_and_ints, constexprs, warps)
    out = _cuobjdump(compiled, "--dump-resource-usage")
    line = next(s for s in out.splitlines() if "REG:" in s)
    counts = dict(part.split(":") for part in line.split() if ":" in part)
    return {k: int(counts[k]) for k in ("REG", "STACK", "SHARED", "LOCAL")} | {"shared_dynamic": compiled.metadata.shared}


# the machine instructions sass_order keeps, by opcode (the part before the first dot)
_SASS_KINDS = {"LDG": "global load", "LDGSTS": "global load to shared", "STG": "global store",
               "DEPBAR": "wait for async loads", "HMMA": "dot (tensor cores)", "HGMMA": "dot (tensor cores)",
               "FFMA": "FMA", "MUFU": "exp / rcp", "LDL": "spill load", "STL": "spill store", "BAR": "barrier",
               "EXIT": "exit", "BRA": "branch"}


def sass_order(sass: str) -> list[str]:
    """The kinds of ``_SASS_KINDS`` in program order, a run of one kind as one line (``0x17a0 global
    load ×6``); a branch to a lower address is a loop's back edge (``loop back to 0x1300``)."""
    lines, run = [], None
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9]+)[^;]*;", sass):
        addr, op = int(m.group(1), 16), m.group(3)
        if op not in _SASS_KINDS:
            continue
        if op == "BRA":
            target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", m.group(0))
            if target and target.group(1) and int(target.group(1), 16) < addr:
                lines.append(f"0x{addr:04x} loop back to 0x{int(target.group(1), 16):04x}")
                run = None
            continue
        if run and run[1] == op:
            run[2] += 1
            lines[-1] = f"0x{run[0]:04x} {_SASS_KINDS[op]} ×{run[2]}"
        else:
            run = [addr, op, 1]
            lines.append(f"0x{addr:04x} {_SASS_KINDS[op]}")
    return lines


def main(argv=None) -> int:
    global ARCH, KV
    argv = list(argv if argv is not None else sys.argv[1:])
    while argv[:1] in (["--arch"], ["--kv"]):
        if argv[0] == "--arch":
            ARCH = int(argv[1])
        else:
            KV = int(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--sass"]:
        names = argv[1:]
        rows = [r for r in _kernels() if r[0] in names]
        if not rows:
            raise SystemExit(f"no row named {names}; the rows: {[r[0] for r in _kernels()]}")
        for name, kernel, types, consts, warps in rows:
            print(f"## {name}\n")
            print("\n".join(sass_order(_cuobjdump(_compile(kernel, types, consts, warps), "-sass"))), "\n")
        return 0
    pattern = argv or [""]
    print("| kernel | warps | registers / thread | spill stack bytes / thread | shared memory bytes |")
    print("|---|---|---|---|---|")
    for name, kernel, types, consts, warps in _kernels():
        if not any(p in name for p in pattern):
            continue
        r = resources(kernel, types, consts, warps)
        warps = warps["num_warps"] if isinstance(warps, dict) else warps
        print(f"| {name} | {warps} | {r['REG']} | {r['STACK']} | {r['shared_dynamic']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
