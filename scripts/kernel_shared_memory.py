"""The shared memory a block of each of our Triton kernels asks on sm_80, sm_89 and sm_90, at every
block / stage form its launcher can pick at the shapes the ops accept, and what the launcher does
where a GPU's limit refuses a form: the table ``docs/kernel-shared-memory.md`` (and its
machine-readable twin ``docs/kernel-shared-memory.json``, which ``tests/test_kernel_shared_memory_table.py``
reads).

Why: the blocks and pipeline stages were chosen on an H200 (227 KiB a block); an A100 gives 163 KiB,
an sm_86 / sm_89 GPU 99 KiB. Triton refuses a launch whose ``metadata.shared`` exceeds the device's
limit (``OutOfResources``, before it runs); the launchers then take a narrower form of the same
kernel (``optimized/fits.py``), or the op refuses the shape beforehand with a ``ValueError``.

How: each form is compiled here, without a GPU, for each architecture, through Triton's stages up to
LLVM IR, where Triton fixes ``metadata.shared`` (the figure it compares with the device's limit at
launch; ptxas, which sets registers and spills, does not change it: ``scripts/kernel_resources.py``
for those). Each row carries a fingerprint of what sets that figure: the kernel's source (with the
``@triton.jit`` helpers and constants it names), its argument types, constexprs, warps and stages,
the architecture, and the launcher's source (its fallback order); the test recomputes the
fingerprints without compiling and names the rows to regenerate.

    python scripts/kernel_shared_memory.py --table docs/kernel-shared-memory.md   # regenerate (and the .json)
    python scripts/kernel_shared_memory.py --table docs/kernel-shared-memory.md --again   # every row compiled
    python scripts/kernel_shared_memory.py --sample                               # compile the test's sample rows

Regenerating compiles only the rows whose fingerprints changed (the others keep the JSON's bytes
where it was made with this Triton); every row: about 24 minutes on the development CPU's 2 cores
(``KERNEL_TABLE_WORKERS`` processes, default 2), far too slow for the CPU suite, hence the
fingerprints. The compiler is this machine's Triton (recorded in the table); the GPU image runs
Triton 3.6, whose figures for the same forms differed from 3.9's by up to 32 KiB for some kernels
(``results/2026-12-04-kernel-shared-memory-other-gpus-cpu`` against this table), so a form near a
limit may fit in one and not the other: the launchers' fallbacks decide at launch either way.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TABLE = os.path.join("docs", "kernel-shared-memory.md")
COMMAND = f"python scripts/kernel_shared_memory.py --table {TABLE}"

# compute capability -> (GPUs, bytes of shared memory a block may opt in to: the limit Triton checks
# at launch, the device's sharedMemPerBlockOptin)
ARCHES = {
    80: ("A100", 166912),
    89: ("L40S, RTX 40xx; sm_86 (RTX 30xx, A6000) has the same limit", 101376),
    90: ("H100, H200", 232448),
}
KV = (64, 128, 256)           # K = V of the nested op's cases (fla's GDN-2 takes K <= 256)


@dataclasses.dataclass
class Form:
    """One launch form: ``label`` (as the table shows it), its constexprs and launch options."""
    label: str
    consts: dict
    options: dict


@dataclasses.dataclass
class Launch:
    """A kernel launched by ``launcher`` at one case of the op's shapes, with its forms in the order
    the launcher tries them (the first the GPU takes is run)."""
    kernel: object
    launcher: tuple            # the launcher's functions (their source is in every row's fingerprint)
    case: str
    types: dict
    forms: list
    note: str = ""
    refused: str = ""          # where no form fits: the error the launcher raises instead (its words)

    @property
    def name(self) -> str:
        return _fn(self.kernel).__name__


@dataclasses.dataclass
class Refusal:
    """A shape the op refuses before launching, with ``error`` (the ``ValueError``'s text, as the
    op words it) and ``holds``, a check that the op still refuses it."""
    op: str
    case: str
    error: str
    holds: object


def _fn(kernel):
    """The Python function under a ``@triton.jit`` kernel, compiled or interpreted."""
    return getattr(kernel, "fn", kernel)


def _scan_launches():
    import optimized.nested.promote_scan as scan
    import optimized.nested.promote_scan_two_phase as two

    f32 = "*fp32"
    fwd_types = dict.fromkeys(("m0", "kappa", "nu", "beta", "omega", "gamma", "states"), f32) | {
        "fire_offsets": "*i32", "F": "i32", "N": "i32", "stride_sb": "i32"}
    bwd_types = dict.fromkeys(("states", "kappa", "nu", "beta", "omega", "gamma", "dstates", "dm0", "dkappa_part",
                               "dnu", "dbeta_part", "domega", "dgamma_part"), f32) | {"fire_offsets": "*i32"} | \
        dict.fromkeys(("F", "B", "N", "stride_sb", "stride_db"), "i32")
    out = []
    for K in KV:
        for precision, dtype in (("ieee", "float32"), ("tf32", "bf16")):
            case = f"K = V = {K}, {dtype} ({precision} dots), n = 16"
            for reverse in (False, True):
                BK, BN, BV = scan.block_sizes(K, K, 16, reverse=reverse, precision=precision)
                forms = []
                # the launcher's own fallback order: _fallbacks with a run that names the form
                for form in scan._fallbacks(lambda bv, stages=None: (bv, stages), BV, None, None):
                    bv, stages = form()
                    opts = scan.launch_options(BK, bv, None, stages)
                    label = f"BV = {bv}" + ("" if stages is None else f", {stages} stage")
                    consts = dict(H=16, K=K, V=K, BK=BK, BN=BN, BV=bv, IS_VARLEN=False, DOT_PRECISION=precision)
                    if not reverse:
                        consts["HAS_M0"] = True
                    forms.append(Form(label, consts, opts))
                for prefetch in (False, True):
                    if reverse:
                        kernel = scan.promote_scan_bwd_prefetch_kernel if prefetch else scan.promote_scan_bwd_kernel
                        launcher = (scan.promote_scan_bwd, scan._fallbacks, scan.launch_options)
                    else:
                        kernel = scan.promote_scan_fwd_prefetch_kernel if prefetch else scan.promote_scan_fwd_kernel
                        launcher = (scan.promote_scan_fwd, scan._fallbacks, scan.launch_options)
                    out.append(Launch(kernel, launcher, case, bwd_types if reverse else fwd_types, forms,
                                      "prefetch=True (a caller's choice)" if prefetch else ""))
            # the two-phase reverse scan (an alternative reverse scan: NestedPieces.scan_bwd)
            BK, BN, BV = scan.block_sizes(K, K, 16)
            consts = dict(H=16, K=K, V=K, BK=BK, BN=BN, BV=BV, DOT_PRECISION=precision)
            launcher = (two.promote_scan_bwd_two_phase, scan.launch_options)
            opts = scan.launch_options(BK, BV, None, None)
            forms = [Form(f"BV = {BV}", consts, opts), Form(f"BV = {BV}, 1 stage", consts, opts | {"num_stages": 1})]
            out.append(Launch(two.promote_scan_bwd_carry_kernel, launcher, case,
                              dict.fromkeys(("kappa", "beta", "gamma", "g"), f32)
                              | dict.fromkeys(("F", "N", "stride_gb"), "i32"), forms))
            out.append(Launch(two.promote_scan_bwd_pairs_kernel, launcher, case, dict.fromkeys(
                ("states", "kappa", "nu", "beta", "omega", "gamma", "g", "dkappa_part", "dnu", "dbeta_part",
                 "domega", "dgamma_part"), f32) | dict.fromkeys(("F", "B", "N", "stride_sb", "stride_gb"), "i32"),
                forms))
    return out


def _gates_launches():
    import optimized.nested.probe_gates as gates
    import optimized.nested.probe_gates_nu as nu_gates
    import optimized.nested.promote_scan as scan
    from optimized.host_math import cdiv, next_power_of_2
    from optimized.nested.probe_fused import NU_GATES_MAX_PAIRS

    f32 = "*fp32"
    ints = dict.fromkeys(("Bt", "n", "H", "K", "V", "C", "OFF_B"), "i32") | {"c_reduce": "fp32"}
    out = []
    for K in KV:
        for n in (16, 64):
            BK, BV = next_power_of_2(K), next_power_of_2(K)
            BN = max(1, min(next_power_of_2(n), 4096 // max(BK, BV)))
            case = f"K = V = {K}, n = {n}"
            c = dict(BN=BN, BK=BK, BV=BV, HAS_KAPPA=True)
            out.append(Launch(gates.probe_gates_fwd_kernel, (gates.probe_gates_fwd, gates._sizes), case,
                              dict.fromkeys(("z", "kappa", "beta", "omega", "gamma"), f32) | ints,
                              [Form(f"BN = {BN}", c, {"num_warps": 4})]))
            out.append(Launch(gates.probe_gates_bwd_kernel, (gates.probe_gates_bwd, gates._sizes), case,
                              dict.fromkeys(("z", "dkappa", "dbeta", "domega", "dgamma", "dz"), f32) | ints,
                              [Form(f"BN = {BN}", c | dict(HAS_DK=True, HAS_DB=True, HAS_DW=True, HAS_DG=True),
                                    {"num_warps": 4})]))
    # the gates that make z = ν W themselves: n <= NU_GATES_MAX_PAIRS, blocks <= MAX_BLOCK (TF32),
    # <= IEEE_MAX_BLOCK (float32): elsewhere the op takes the bmm and the gates above
    for K in KV:
        for precision, dtype in (("ieee", "float32"), ("tf32", "bf16")):
            if not nu_gates.ieee_blocks_fit(K, K, precision):
                continue
            for n in (16, NU_GATES_MAX_PAIRS):
                sizes = nu_gates.blocks(n, K, K)
                if sizes is None:
                    continue
                G, NP, BV, BC = sizes
                warps = nu_gates._warps(G * NP, BV, BC)
                npart = cdiv(K, scan.block_sizes(K, K, n, reverse=True)[2])
                case = f"K = V = {K}, {dtype} ({precision} dots), n = {n}"
                g = dict(G=G, NP=NP, BV=BV, BC=BC, TILES=nu_gates.TILES, PREC=precision)
                launcher = (nu_gates.probe_gates_nu_fwd, nu_gates.probe_gates_nu_bwd, nu_gates._launch)
                for seg, gate in enumerate(("κ", "β", "ω", "γ")):
                    staged = [Form("Triton's stages", g | dict(SEG=seg), {"num_warps": warps}),
                              Form("1 stage", g | dict(SEG=seg), {"num_warps": warps, "num_stages": 1})]
                    out.append(Launch(nu_gates.probe_gates_nu_fwd_kernel, launcher, case + f", {gate}",
                                      dict.fromkeys(("nu", "w", "out"), f32) | ints, staged))
                    out.append(Launch(nu_gates.probe_gates_nu_bwd_kernel, launcher, case + f", {gate}",
                                      dict.fromkeys(("nu", "w", "dy", "dz"), f32) | ints | {"PART_STRIDE": "i32"},
                                      [Form(f.label, f.consts | dict(HAS_D=True, NPART=1 if seg == 2 else npart),
                                            f.options) for f in staged]))
                one = {"num_warps": warps, "num_stages": 1}          # the one-launch kernels: unpipelined
                note = "one launch for every gate (the default at K <= ONE_LAUNCH_MAX_K)"
                out.append(Launch(nu_gates.probe_gates_nu_fwd_one_kernel, launcher, case,
                                  dict.fromkeys(("nu", "w", "kappa", "beta", "omega", "gamma"), f32) | ints,
                                  [Form("1 stage", g | dict(FIRST=0), one)], note))
                out.append(Launch(nu_gates.probe_gates_nu_bwd_one_kernel, launcher, case,
                                  dict.fromkeys(("nu", "w", "dkappa", "dbeta", "domega", "dgamma", "dz"), f32) | ints
                                  | dict.fromkeys(("STRIDE_NK", "STRIDE_K"), "i32"),
                                  [Form("1 stage", g | dict(FIRST=0, NPART=npart)
                                        | dict.fromkeys(("HAS_D0", "HAS_D1", "HAS_D2", "HAS_D3"), True), one)], note))
    return out


def _snapshot_launches():
    import optimized.nested.snapshot_grads as grads
    import optimized.nested.snapshot_reads as reads

    f32, i32 = "*fp32", "i32"
    out = []
    for K in KV:
        for precision, dtype in (("ieee", "float32"), ("tf32", "bf16")):
            for n in (16, 64):
                case = f"K = V = {K}, {dtype} ({precision} dots), n = {n}"
                BN, BK, BV = reads.block_sizes(n, K, K)
                c = dict(H=16, K=K, V=K, BN=BN, BK=BK, BV=BV, PREC=precision)
                staged = [Form("Triton's stages", c, {"num_warps": 4}),
                          Form("1 stage", c, {"num_warps": 4, "num_stages": 1})]
                out.append(Launch(reads.snapshot_read_fwd_kernel, (reads.snapshot_read,), case,
                                  dict.fromkeys(("q", "src", "final", "nu"), f32) | {"rows": "*i32"}
                                  | dict.fromkeys(("F", "N", "stride_sb"), i32), staged))
                out.append(Launch(reads.snapshot_read_dq_kernel, (reads.snapshot_read_dq,), case,
                                  dict.fromkeys(("dnu", "src", "final", "dq_part"), f32) | {"rows": "*i32"}
                                  | dict.fromkeys(("F", "N", "BF", "ITEMS", "stride_sb"), i32), staged))
                BN, BK, BV = grads.block_sizes(n, K, K)
                c = dict(H=16, K=K, V=K, BN=BN, BK=BK, BV=BV, PRECISION=precision)
                out.append(Launch(grads.add_snapshot_grads_kernel, (grads.add_snapshot_grads, grads.refusal), case,
                                  dict.fromkeys(("dst", "q", "dnu"), f32)
                                  | dict.fromkeys(("firings", "targets"), "*i32")
                                  | dict.fromkeys(("stride_db", "F", "R", "N_PAIRS"), i32),
                                  [Form(f"BK = {BK}, BV = {BV}", c, {"num_warps": 8})],
                                  refused="ValueError: " + grads.refusal(n, K, K, precision, _Refused())))
    return out


class _Refused:
    """Stands for Triton's ``OutOfResources`` in a refusal's text: the bytes are the table's."""
    required, limit = "the bytes below", "its limit"


def _reads_launches():
    import optimized.nested.reads_bwd as rb
    import optimized.nested.reads_fwd as rf
    import optimized.nested.state_grad as sg
    from optimized.warps import num_warps

    f32, i32 = "*fp32", "i32"
    out = []
    for K in KV:
        for dtype, act in (("float32", f32), ("bf16", "*bf16")):
            torch_dtype = _torch_dtype(dtype)
            case = f"K = V = {K}, {dtype}, L = 4"
            ints = dict.fromkeys(("T", "N", "S", "S_LO", "L"), i32) | {"scale": "fp32"}
            split = dtype == "bf16"
            forms = []
            wide = rf.forward_block_v(K, torch_dtype)
            for bv in ((wide, None) if wide is not None else (None,)):
                BT, BK, BV, BL = rf.block_sizes(K, K, 4, bv)
                forms.append(Form(f"BV = {BV}", dict(H=16, K=K, V=K, BT=BT, BK=BK, BV=BV, BL=BL, SPLIT=split,
                                                     IS_VARLEN=False), {"num_warps": num_warps(BK, BV)}))
            out.append(Launch(rf.reads_fwd_kernel, (rf.reads_fwd, rf.forward_block_v), case,
                              dict.fromkeys(("q", "r", "o0", "o"), act) | {"states": f32, "states_hi": f32,
                                                                          "read_row": "*i32", "chunk_bounds": "*i32"}
                              | ints, forms))
            BT, BK, BV, BL = rf.block_sizes(K, K, 4)
            BKA, BVA, warps = rb.token_blocks(K, K)
            out.append(Launch(rb.reads_bwd_tokens_kernel, (rb.reads_bwd, rb.token_blocks), case,
                              dict.fromkeys(("do", "q", "r", "o0", "dq"), act)
                              | {"states": f32, "states_hi": f32, "read_row": "*i32", "chunk_bounds": "*i32",
                                 "dr": f32, "do0": f32} | ints,
                              [Form(f"BKA = {BKA}, BV = {BVA}", dict(H=16, K=K, V=K, BT=BT, BKA=BKA, BV=BVA, BL=BL,
                                                                    SPLIT=split, IS_VARLEN=False),
                                    {"num_warps": warps})]))
            BT, BK, BV, BL = rf.block_sizes(K, K, 4, rb.states_block_v(K))
            for snap, pairs in ((False, 1), (True, 16), (True, 64)):
                BN = rb.snap_blocks(pairs)
                out.append(Launch(rb.reads_bwd_states_kernel, (rb.reads_bwd_states, rb.states_block_v),
                                  case + (f", snapshot gradients of n = {pairs}" if snap else ""),
                                  dict.fromkeys(("do", "q", "r"), act) | dict.fromkeys(
                                      ("row_level", "row_chunk_lo", "row_chunk_hi", "chunk_bounds", "fire_lo",
                                       "fire_hi"), "*i32") | dict.fromkeys(("dstates", "snap_q", "snap_dnu"), f32)
                                  | dict.fromkeys(("T", "S", "L", "F_SNAP", "N_PAIRS"), i32) | {"scale": "fp32"},
                                  _staged(f"BV = {BV}, BN = {BN}", dict(H=16, K=K, V=K, BT=BT, BK=BK, BV=BV, BL=BL,
                                                                        BN=BN, SPLIT=split, IS_VARLEN=False, SNAP=snap),
                                          {"num_warps": num_warps(BK, BV)})))
            # level 0's state gradient: plain injection, factored with one pair block and with several
            SK, SV, SS = sg.block_sizes(K, K)
            for what, factored, n in (("plain", False, 1), ("factored, n = 16", True, 16),
                                      ("factored, n = 64", True, 64)):
                BN = sg.factored_blocks(n) if factored else sg.factored_blocks(1)
                c = dict(H=16, K=K, V=K, BT=64, BS=SS, BK=SK, BV=SV, BN=BN, HAS_DHT=True, HAS_INJECT=True,
                         FACTORED=factored, STORE_DH0=True, IS_VARLEN=False, ONE_PAIR_BLOCK=BN >= n)
                warps = 4 if SK <= 64 else 8
                out.append(Launch(sg.state_grad_bwd_kernel, (sg.state_grad_bwd,), f"K = V = {K}, {dtype}, {what}",
                                  dict.fromkeys(("qg", "kg", "w", "gk", "do", "dv", "dh", "dv2"), act)
                                  | dict.fromkeys(("dht", "ds", "ds_q", "dh0"), f32)
                                  | {"slots": "*i32", "cu_seqlens": "*i64", "chunk_offsets": "*i32", "scale": "fp32",
                                     "T": i32, "S": i32, "N_PAIRS": i32},
                                  [Form("Triton's stages", c, {"num_warps": warps}),
                                   Form("1 stage", c, {"num_warps": warps, "num_stages": 1})]))
    import optimized.nested.key_block_partials as kbp
    for BK in (32, 64):
        out.append(Launch(kbp.add_key_block_partials_kernel, (kbp.add_key_block_partials,),
                          f"key blocks of {BK} (fla's level-0 backward)",
                          {"db": "*fp32", "parts": "*fp32", "out": "*bf16", "R": i32, "K": i32},
                          [Form(f"BK = {BK}, BR = {kbp.ROWS}", dict(BK=BK, BR=kbp.ROWS), {"num_warps": 4})]))
    return out


def _staged(label: str, consts: dict, options: dict) -> list:
    """A launcher's two forms under ``optimized.fits.one_stage_where_refused``: its stages, then one."""
    return [Form(label, consts, options), Form(f"{label}, 1 stage", consts, options | {"num_stages": 1})]


def _torch_dtype(name):
    import torch
    return {"float32": torch.float32, "bf16": torch.bfloat16}[name]


def _fenwick_launches():
    import optimized.fenwick_gdn2.intra as intra
    import optimized.fenwick_gdn2.router as router
    import optimized.fenwick_gdn2.states as st
    from optimized.fenwick_gdn2.chunk import max_head_dim
    from optimized.warps import num_warps

    f32, i32 = "*fp32", "i32"
    out = []
    for K in KV:
        if K > max_head_dim("cuda"):
            continue                        # refused by the op on CUDA (_refusals)
        for dtype, act in (("float32", f32), ("bf16", "*bf16")):
            dot = "tf32" if dtype == "bf16" else "ieee"
            ints = dict.fromkeys(("T", "N", "J", "L", "NB"), i32) | {"mtab": "*i32", "cu_seqlens": "*i64",
                                                                       "chunk_offsets": "*i64"}
            for NB in (2, 7, 11):        # a short sequence, T = 4096, T = 65536
                BK, NBP, BV = st.block_sizes(K, K, NB)
                c = dict(H=8, K=K, V=K, BT=64, BK=BK, NBP=NBP, BV=BV, DOT=dot, IS_VARLEN=False)
                case = f"K = V = {K}, {dtype}, NB = {NB}"
                opts = st.launch_options(BK, NBP, BV, None)
                form = f"[{BK}, {NBP} x {BV}], {opts['num_stages']} stages"
                staged = [(form, opts), (f"[{BK}, {NBP} x {BV}], 1 stage", opts | {"num_stages": 1})]
                out.append(Launch(st.fenwick_states_fwd_kernel, (st.states_fwd, st._launch, st.launch_options), case,
                                  dict.fromkeys(("kg", "wy", "u", "gk", "h", "vn"), act) | {"h0": f32, "final": f32}
                                  | ints, [Form(label, c, o) for label, o in staged]))
                out.append(Launch(st.fenwick_states_bwd_kernel, (st.states_bwd, st._launch, st.launch_options), case,
                                  dict.fromkeys(("qg", "kg", "wy", "gk", "do", "dv", "dh", "dv2"), act)
                                  | {"dfinal": f32, "dcarry": f32, "dpre": f32, "scale": "fp32"} | ints,
                                  [Form(label, c | dict(HAS_DFINAL=True, HAS_DCARRY=False), o) for label, o in staged]))
            V = K
            case = f"V = {V}, {dtype}"
            chunk = {"cu_seqlens": "*i64", "chunk_indices": "*i32", "T": i32, "L": i32}
            c = dict(H=8, V=V, BT=64, BV=intra._block_v(V), NL=intra.INTRA_LEVELS, DOT=dot, IS_VARLEN=False)
            warps = num_warps(intra.CHUNK, intra.CHUNK)
            out.append(Launch(intra.fenwick_intra_fwd_kernel, (intra.intra_fwd,), case,
                              dict.fromkeys(("v", "w", "Aqk", "Akk"), act) | {"lam": act, "o": f32} | chunk,
                              [Form(f"BV = {c['BV']}", c, {"num_warps": warps})]))
            out.append(Launch(intra.fenwick_intra_bwd_kernel, (intra.intra_bwd,), case,
                              dict.fromkeys(("v", "w", "Aqk", "Akk"), act) | {"lam": act}
                              | dict.fromkeys(("do", "dwv", "dlam", "dAqk", "dL"), f32) | chunk,
                              [Form("Triton's stages", c, {"num_warps": warps}),
                               Form("1 stage", c, {"num_warps": warps, "num_stages": 1})]))
            _, BR, BV = router.launch_blocks(V, 1)
            c = dict(V=V, BR=BR, BV=BV, OWN=st.OWN_LEVELS)
            r_ints = dict.fromkeys(("R", "L", "J", "NB"), i32)
            out.append(Launch(router.fenwick_router_fwd_kernel, (router.router_fwd, router.launch_blocks), case,
                              {"o_intra": f32, "reads": act, "lam": act, "o": act} | r_ints,
                              [Form(f"[{BR}, {BV}]", c, {"num_warps": num_warps(BR, BV)})]))
            out.append(Launch(router.fenwick_router_bwd_kernel, (router.router_bwd, router.launch_blocks), case,
                              {"do": f32, "reads": act, "lam": act, "dlam": f32, "do_st": act} | r_ints,
                              [Form(f"[{BR}, {BV}]", c, {"num_warps": num_warps(BR, BV)})]))
    return out


def launches() -> list:
    """Every launch form of our kernels at the op's cases, in the table's order."""
    return _scan_launches() + _gates_launches() + _snapshot_launches() + _reads_launches() + _fenwick_launches()


def refusals() -> list:
    """The shapes of the cases above that an op refuses before any launch, with its error."""
    from optimized.fenwick_gdn2 import chunk
    out = []
    for K in KV:
        if K > chunk.max_head_dim("cuda"):
            out.append(Refusal(
                "fenwick_gdn2 (every Fenwick GDN-2 kernel)", f"K = {K} on CUDA",
                f"ValueError: q: key dim K must be <= {chunk.max_head_dim('cuda')} on cuda, got {K}: above it the "
                f"reverse carry scan needs more shared memory than the GPU has (280 KiB at K = 256 on an H200)",
                lambda K=K: K > chunk.max_head_dim("cuda")))
    return out


# Kernels compiled for no GPU: noted in the table instead of measured.
NOT_COMPILED = {
    "fenwick_wy_intra_kernel": "runs under the CPU interpreter only (optimized/fenwick_gdn2/wy.py); "
                               "on CUDA fla's WY kernels run instead",
}


# ---------------------------------------------------------------------------------------------------
# fingerprints (no compile)

def _walk(fn, seen: dict):
    key = f"{fn.__module__}.{fn.__qualname__}"
    if key in seen:
        return
    seen[key] = inspect.getsource(fn)
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    for name in fn.__code__.co_names:
        if name not in fn.__globals__:
            continue
        obj = fn.__globals__[name]
        inner = getattr(obj, "fn", None)
        if isinstance(obj, (JITFunction, InterpretedFunction)) and inspect.isfunction(inner):
            _walk(inner, seen)            # a @triton.jit helper (compiled or interpreted)
        elif isinstance(obj, (bool, int, float, str, tl.constexpr)):
            seen[f"{fn.__module__}.{name}"] = repr(getattr(obj, "value", obj))


def kernel_digest(kernel) -> str:
    """A hash of the kernel's source, of every ``@triton.jit`` helper it calls (transitively) and of
    the module constants they name."""
    seen: dict = {}
    _walk(_fn(kernel), seen)
    return hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()


def launcher_digest(launcher) -> str:
    """A hash of the launcher's functions' source (their fallback order and block choices)."""
    return hashlib.sha256("\n".join(inspect.getsource(f) for f in launcher).encode()).hexdigest()


def fingerprint(launch: Launch, form: Form, arch: int, digests: dict | None = None) -> str:
    """What sets a form's shared memory on ``arch``, hashed: the kernel's source, argument types,
    constexprs, launch options, the launcher's source (and its refusal's text, where it has one).
    ``digests``: a cache of the source hashes across calls."""
    digests = {} if digests is None else digests
    k = id(launch.kernel), tuple(id(f) for f in launch.launcher)
    if k not in digests:
        digests[k] = kernel_digest(launch.kernel), launcher_digest(launch.launcher)
    what = [*digests[k], sorted(launch.types.items()), sorted((k, repr(v)) for k, v in form.consts.items()),
            sorted(form.options.items()), arch] + ([launch.refused] if launch.refused else [])
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def row_key(launch: Launch, form: Form, arch: int) -> str:
    """A row's name: kernel | case | note | form | architecture."""
    return f"{launch.name} | {launch.case}{' | ' + launch.note if launch.note else ''} | {form.label} | sm_{arch}"


def key_of(row: dict) -> str:
    """``row_key`` of a recorded row."""
    note = " | " + row["note"] if row["note"] else ""
    return f"{row['kernel']} | {row['case']}{note} | {row['form']} | sm_{row['arch']}"


def expected_rows(items=None) -> dict:
    """``{row key: fingerprint}`` of every (launch, form, arch), computed without compiling."""
    items = launches() if items is None else items
    digests: dict = {}
    out = {}
    for launch in items:
        for form in launch.forms:
            for arch in ARCHES:
                out[row_key(launch, form, arch)] = fingerprint(launch, form, arch, digests)
    return out


# ---------------------------------------------------------------------------------------------------
# verdicts (from the recorded numbers)

def verdict(shared: list, limit: int, refused_by: str | None = None) -> tuple[str, bool]:
    """What the launcher does with forms asking ``shared`` bytes (its order) under ``limit``:
    ``(text, ok)``; not ok where no form fits and no op refuses the shape first."""
    for i, s in enumerate(shared):
        if s <= limit:
            return ("default fits" if i == 0 else f"fallback {i}"), True
    if refused_by:
        return f"refused by the op: {refused_by}", True
    return "NO FORM FITS: Triton's OutOfResources at launch", False


def check_table(data: dict, items=None) -> list[str]:
    """The table's problems: stale, missing or extra rows (fingerprints), and launches where no
    recorded form fits an architecture's limit. Empty when the table is current and every launch
    fits or falls back."""
    items = launches() if items is None else items
    want = expected_rows(items)
    have = {key_of(r): r for r in data["rows"]}
    problems = [f"stale: {k}" for k in want if k in have and have[k]["fingerprint"] != want[k]]
    problems += [f"missing: {k}" for k in want if k not in have]
    problems += [f"no such launch form any more: {k}" for k in have if k not in want]
    items = launches() if items is None else items
    for launch in items:                # a listed fallback needs a launcher that falls back
        if len(launch.forms) > 1 and not any(word in inspect.getsource(f) for f in launch.launcher
                                             for word in ("first_that_fits", "one_stage_where_refused")):
            problems.append(f"fallback forms listed, none taken: {launch.name} | {launch.case} "
                            f"(no first_that_fits / one_stage_where_refused in {[f.__name__ for f in launch.launcher]})")
    limits = {int(a): v for a, v in data["limits"].items()}
    by_launch: dict = {}
    for r in data["rows"]:
        by_launch.setdefault((r["kernel"], r["case"], r["note"], r["arch"]), []).append(r)
    for (kernel, case, note, arch), rows in by_launch.items():
        rows = sorted(rows, key=lambda r: r["form_index"])
        text, ok = verdict([r["shared"] for r in rows], limits[arch], rows[0].get("refused"))
        if not ok:
            forms = ", ".join(f"{r['form']}: {r['shared']} B" for r in rows)
            problems.append(f"no form fits sm_{arch} ({limits[arch]} B): {kernel} | {case} ({forms})")
    return problems


# ---------------------------------------------------------------------------------------------------
# compiling (CUDA mode: run as a script, never inside the interpreter's process)

def _cuda_mode():
    """Compile for CUDA, not the interpreter: ``optimized.triton_mode`` picks the interpreter when no
    GPU is visible, and ``triton.jit`` decides at decoration time (before any kernel import)."""
    import torch
    from triton._C.libtriton import llvm
    # LLVM's optimisation of the kernel's IR comes after Triton fixed its shared memory and does not
    # change it; skipped, the compiles take half the time (the same bytes: checked against
    # triton.compile's metadata.shared)
    llvm.optimize_module = lambda *args, **kwargs: None
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    os.environ.pop("TRITON_INTERPRET", None)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def shared_bytes(launch: Launch, form: Form, arch: int) -> int:
    """``metadata.shared`` of the form compiled for ``arch``: Triton's stages up to LLVM IR, where the
    figure is fixed (ptxas after it sets registers, not shared memory)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_resources import _signature
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    src = _signature(launch.kernel, launch.types, form.consts)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = backend.parse_options(dict(form.options, **src.parse_options()))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    metadata = {"target": target}
    for ext in ("ttir", "ttgir", "llir"):
        module = stages[ext](module, metadata)
    return int(metadata["shared"])


def _measure(index: int) -> list:
    """Worker: the shared bytes of every form of launch ``index`` on every architecture."""
    _cuda_mode()
    launch = launches()[index]
    return [[shared_bytes(launch, form, arch) for arch in ARCHES] for form in launch.forms]


def _recorded(previous: str | None) -> dict:
    """``{(row key, fingerprint): bytes}`` of a table's JSON made by this machine's Triton, else {}."""
    import triton
    if not previous or not os.path.exists(previous):
        return {}
    with open(previous) as f:
        data = json.load(f)
    if data.get("triton") != triton.__version__:
        return {}
    return {(r.get("key") or key_of(r), r["fingerprint"]): r["shared"] for r in data["rows"]}


def build(workers: int = 2, previous: str | None = None) -> dict:
    """Compiles every form on every architecture (those of ``previous``, a table's JSON, whose
    fingerprints still match keep its bytes): the table's data."""
    import triton
    items = launches()
    known = _recorded(previous)
    measured: dict = {}
    digests: dict = {}
    for i, launch in enumerate(items):       # rows whose fingerprints match the previous table: its bytes
        keep = [[known.get((row_key(launch, f, a), fingerprint(launch, f, a, digests))) for a in ARCHES]
                for f in launch.forms]
        if all(b is not None for per in keep for b in per):
            measured[i] = keep
    todo = [i for i in range(len(items)) if i not in measured]
    print(f"{len(items)} launches, {len(todo)} to compile", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(workers) as pool:
        for n, (i, m) in enumerate(zip(todo, pool.map(_measure, todo))):
            measured[i] = m
            if (n + 1) % 20 == 0 or n + 1 == len(todo):
                print(f"{n + 1} / {len(todo)} launches compiled", file=sys.stderr, flush=True)
    measured = [measured[i] for i in range(len(items))]
    rows, summary = [], []
    refused = {r.case: r for r in refusals()}
    for launch, per_form in zip(items, measured):
        for arch_i, arch in enumerate(ARCHES):
            limit = ARCHES[arch][1]
            shared = [per_form[i][arch_i] for i in range(len(launch.forms))]
            text, ok = verdict(shared, limit, launch.refused)
            for i, form in enumerate(launch.forms):
                rows.append(dict(kernel=launch.name, case=launch.case,
                                 note=launch.note, form=form.label, form_index=i, arch=arch, options=form.options,
                                 shared=shared[i], fits=shared[i] <= limit, refused=launch.refused,
                                 fingerprint=fingerprint(launch, form, arch, digests)))
            if text != "default fits":
                taken = next((launch.forms[i].label for i, s in enumerate(shared) if s <= limit), None)
                summary.append(dict(arch=arch, kernel=launch.name, case=launch.case, note=launch.note,
                                    default=f"{launch.forms[0].label}: {shared[0]} B",
                                    outcome=(f"takes {taken} ({shared[[f.label for f in launch.forms].index(taken)]} B)"
                                             if taken else launch.refused or "no form fits")))
    return dict(triton=triton.__version__, limits={str(a): v[1] for a, v in ARCHES.items()},
                gpus={str(a): v[0] for a, v in ARCHES.items()}, rows=rows, not_fitting_defaults=summary,
                refusals=[dict(op=r.op, case=r.case, error=r.error) for r in refused.values()],
                not_compiled=NOT_COMPILED)


def render(data: dict) -> str:
    """The Markdown table of ``data`` (what ``build`` returns; the test compares the committed
    Markdown with this rendering of the committed JSON)."""
    archs = [int(a) for a in data["limits"]]
    lines = [
        "# Shared memory a block of our Triton kernels asks, per GPU architecture",
        "",
        f"Generated by `{COMMAND}` (Triton {data['triton']}, compiled here without a GPU up to LLVM IR, "
        "where Triton fixes `metadata.shared`, the figure it holds against the device's limit at launch). "
        "Do not edit by hand: `tests/test_kernel_shared_memory_table.py` recomputes every row's "
        "fingerprint (the kernel's source and helpers, its argument types, constexprs, warps, stages, the "
        "launcher's source, the architecture) and names the stale rows. The GPU image's Triton (3.6) stages "
        "some kernels differently (up to 32 KiB apart at the last comparison): the launchers' fallbacks decide "
        "at launch either way.",
        "",
        "Limits (bytes a block, Triton's `OutOfResources` above them):",
        "",
    ]
    for a in archs:
        lines.append(f"- sm_{a} ({data['gpus'][str(a)]}): {data['limits'][str(a)]} B "
                     f"({data['limits'][str(a)] // 1024} KiB)")
    lines += ["", "The forms of each launch are listed in the order its launcher tries them "
              "(`optimized/fits.py`: the first the GPU takes runs; every form computes the same values). "
              "✓ fits, ✗ refused by that GPU.", "", "## Defaults that do not fit, and what happens", ""]
    lines.append("| sm | kernel | case | default | outcome |")
    lines.append("|---|---|---|---|---|")
    for s in data["not_fitting_defaults"]:
        note = f"; {s['note']}" if s["note"] else ""
        lines.append(f"| {s['arch']} | {s['kernel']} | {s['case']}{note} | {s['default']} | {s['outcome']} |")
    if data["refusals"]:
        lines += ["", "## Shapes the ops refuse before launching", "", "| op | case | error |", "|---|---|---|"]
        for r in data["refusals"]:
            lines.append(f"| {r['op']} | {r['case']} | {r['error']} |")
    if data["not_compiled"]:
        lines += ["", "## Kernels not compiled for a GPU", ""]
        for k, why in data["not_compiled"].items():
            lines.append(f"- `{k}`: {why}")
    lines += ["", "## Every launch form", ""]
    head = "| kernel | case | form | warps, stages | " + " | ".join(f"sm_{a} B" for a in archs) + " |"
    table: dict = {}
    for r in data["rows"]:
        table.setdefault((r["kernel"], r["case"], r["note"], r["form_index"]), {})[r["arch"]] = r
    kernel = None
    for (k, case, note, _), per_arch in table.items():
        if k != kernel:
            kernel = k
            lines += ["", f"### {k}", "", head, "|---|---|---|---|" + "---|" * len(archs)]
        first = per_arch[archs[0]]
        opts = first["options"]
        stages = opts.get("num_stages", "Triton's")
        cells = " | ".join(f"{per_arch[a]['shared']} {'✓' if per_arch[a]['fits'] else '✗'}" for a in archs)
        lines.append(f"| {k} | {case}{'; ' + note if note else ''} | {first['form']} | "
                     f"{opts['num_warps']}, {stages} | {cells} |")
    return "\n".join(lines) + "\n"


def json_path(table: str) -> str:
    return os.path.splitext(table)[0] + ".json"


def write(table: str, workers: int = 2, again: bool = False) -> dict:
    """Writes the table and its JSON; ``again``: compile every row, none kept from the JSON there."""
    data = build(workers, None if again else json_path(table))
    with open(json_path(table), "w") as f:       # a row a line: diffs name the rows that changed
        head = {k: v for k, v in data.items() if k != "rows"}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "rows": [\n')
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in data["rows"]) + "\n]}\n")
    with open(table, "w") as f:
        f.write(render(data))
    return data


# The rows the test compiles: one per module of kernels, the architectures in turn.
def sample_keys(items) -> list:
    """``[(launch, form, arch)]``: for each module of kernels, its first kernel's first bf16 launch
    (TF32 dots compile faster than IEEE ones, which Triton unrolls into FMA loops; else its first
    launch) at the default form, on sm_80, sm_89, sm_90 in turn from module to module. About 8 s
    of compiling on the development CPU, where every row of the table takes about 20 minutes."""
    first: dict = {}
    for launch in items:
        module = _fn(launch.kernel).__module__
        kept = first.get(module)
        if kept is None or (kept.name == launch.name and "bf16" in launch.case and "bf16" not in kept.case):
            first[module] = launch
    arches = list(ARCHES)
    return [(launch, launch.forms[0], arches[i % len(arches)]) for i, launch in enumerate(first.values())]


def sample(table: str) -> list:
    """``[(row key, recorded bytes, compiled bytes)]`` of ``sample_keys``' rows."""
    _cuda_mode()
    with open(json_path(table)) as f:
        recorded = {key_of(r): r["shared"] for r in json.load(f)["rows"]}
    return [(row_key(launch, form, arch), recorded.get(row_key(launch, form, arch)), shared_bytes(launch, form, arch))
            for launch, form, arch in sample_keys(launches())]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table = os.path.join(ROOT, TABLE)
    if argv[:1] == ["--table"]:
        table = os.path.abspath(argv[1]) if len(argv) > 1 and not argv[1].startswith("--") else table
        _cuda_mode()
        data = write(table, workers=int(os.environ.get("KERNEL_TABLE_WORKERS", "2")), again="--again" in argv)
        bad = [f"sm_{s['arch']} {s['kernel']} {s['case']}" for s in data["not_fitting_defaults"]
               if s["outcome"] == "no form fits"]
        print(f"{len(data['rows'])} rows written to {table} and {json_path(table)}")
        if bad:
            print("no form fits:\n  " + "\n  ".join(bad))
        return 0
    if argv[:1] == ["--sample"]:
        print(json.dumps(sample(table)))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
