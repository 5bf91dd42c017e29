"""Snapshot gradients kept factored (``state_grad.FactoredSnapGrads``: ``Qᵀ dν'`` formed where it is
added): ``optimized.nested.snapshot_grads.add_snapshot_grads`` (levels ≥ 2, into the level below's
state gradients) against a float64 einsum and index add, and level 0's state-gradient kernel with
factored injected gradients (level 1's) against per-token GDN-2 in float64. Cases reach every masked
edge: pairs over 16 and ragged (20 of a block of 32), keys not a power of two, two V blocks with a
ragged last one, B = 2 and H = 2, repeated targets (two rounds), a batch-strided target, packed
rows (B = 1). Mutants (production kernels with one source substitution,
``property_tests/kernel_mutation.py``) must fail; and the op with factored gradients agrees with
the op that materialises them."""
import contextlib

import pytest
import torch

from ngdn.checks import nested_optimized as checks
from ngdn.inputs import GDN2Shape
from ngdn.tolerances import assert_passes, compare, record, tolerance
from optimized.nested import state_grad as state_grad_module
from optimized import triton_mode
from optimized.nested import reads_bwd as reads_bwd_module
from optimized.nested import snapshot_grads as module
from optimized.nested.plan import inject_rounds
from optimized.nested.snapshot_grads import add_snapshot_grads, block_sizes
from optimized.nested.state_grad import FactoredSnapGrads
from property_tests.kernel_mutation import Plant, planted

DEV = triton_mode.device()
CUDA = triton_mode.MODE == triton_mode.CUDA
MUTANT_MIN_ERROR = 0.1      # a mutant misses by far more than any "snapshot_grads" tolerance (≤ 1e-2)

# name: (B, S, H, n, K, V, targets, precision)
CASES = {
    # pairs 20 (a block of 32), keys 24 (32), V 72 (64 + 8); targets 3 and 1 repeated: two rounds
    "two_rounds": (2, 7, 2, 20, 24, 72, [1, 3, 3, 6, 1], "ieee"),
    # evenly spaced targets (every built-in schedule): one round
    "one_round": (2, 9, 2, 16, 32, 32, [0, 2, 4, 6, 8], "ieee"),
    # packed sequences: one row (B = 1), a sequence's firings probe its own rows
    "packed": (1, 11, 3, 5, 16, 40, [0, 2, 3, 5, 7, 8, 10], "ieee"),
    # TF32 dots (a bf16 run's precision; the interpreter computes float32 either way)
    "tf32": (2, 7, 2, 16, 48, 40, [1, 2, 4, 6], "tf32"),
}
if CUDA:    # the benchmark's head size: IEEE (float32 runs) and TF32 (bf16 runs)
    CASES["K128_ieee"] = (2, 9, 2, 16, 128, 128, [0, 2, 4, 6, 8], "ieee")
    CASES["K128_tf32"] = (2, 9, 2, 16, 128, 128, [0, 2, 4, 6, 8], "tf32")

MUTANTS = {
    # Q of head 0 for every head
    "head_zero_query": [Plant(module, "add_snapshot_grads_kernel", "q + i_h * N_PAIRS * K", "q")],
    # the firing's own row instead of the row it probed
    "own_row": [Plant(module, "add_snapshot_grads_kernel", "t = tl.load(targets + m).to(tl.int64)",
                      "t = m")],
    # every V block's program works on the first block
    "first_v_block": [Plant(module, "add_snapshot_grads_kernel", "o_v = i_v * BV + tl.arange(0, BV)",
                            "o_v = tl.arange(0, BV)")],
    # the first round only (a repeated target keeps one firing's gradient)
    "first_round_only": [Plant(module, "add_snapshot_grads", "if r.numel() == 0:",
                               "if r.numel() == 0 or r is not rounds[0]:")],
    # the target's old value dropped (stored, not added)
    "overwrites": [Plant(module, "add_snapshot_grads_kernel",
                         "tl.store(p_dst, tl.load(p_dst, mask=m_kv, other=0.0) + b_add, mask=m_kv)",
                         "tl.store(p_dst, b_add, mask=m_kv)")],
}

# level 0's state-gradient kernel, its factored branch
STATE_GRAD_MUTANTS = {
    # Q of head 0 for every head
    "head_zero_query": [Plant(state_grad_module, "_query_block", "ds_q + i_h * N_PAIRS * K", "ds_q",
                              rebind=((state_grad_module, "state_grad_bwd_kernel"),))],
    # Q read as [K, n] (not transposed)
    "query_not_transposed": [Plant(state_grad_module, "_query_block",
                                   "o_n[None, :] * K + o_k[:, None]", "o_n[None, :] + o_k[:, None] * N_PAIRS",
                                   rebind=((state_grad_module, "state_grad_bwd_kernel"),))],
    # the chunk's dν' one slot early
    "slot_one_early": [Plant(state_grad_module, "_dnu_block",
                             "(ds + ((i_ds * S + tl.maximum(slot, 0).to(tl.int64)) * H + i_h) * N_PAIRS * V",
                             "(ds + ((i_ds * S + tl.maximum(slot - 1, 0).to(tl.int64)) * H + i_h) * N_PAIRS * V",
                             rebind=((state_grad_module, "state_grad_bwd_kernel"),))],
    # more pairs than a block: the last block never added
    "last_pair_block_dropped": [Plant(state_grad_module, "state_grad_bwd_kernel",
                                      "for i_n in range(0, tl.cdiv(N_PAIRS, BN)):",
                                      "for i_n in range(0, tl.cdiv(N_PAIRS, BN) - 1):")],
}
# pairs per case of the injection (and the block it is visited in: 40 pairs in blocks of 16, the
# last ragged, reach the kernel's loop over pair blocks; 3 and 20 its one-block form)
STATE_GRAD_PAIRS = {3: None, 20: None, 40: 16}
STATE_GRAD_MUTANT_PAIRS = {"last_pair_block_dropped": 40}


def make_case(name, seed=0):
    B, S, H, n, K, V, targets, precision = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(B, S + 3, H, K, V, generator=gen)
    dst = buf.to(DEV)[:, 2:S + 2]                              # batch-strided, rows contiguous
    Q = torch.randn(H, n, K, generator=gen) / n ** 0.5
    dnu = torch.randn(B, len(targets), H, n, V, generator=gen)
    return dst, FactoredSnapGrads(Q.to(DEV), dnu.to(DEV)), targets, precision


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def errors_of(name, mutant=None):
    """The relative error of what was added to the probed rows (``dst`` after minus before)
    against the float64 sum of ``Q[h]ᵀ dν'[b, m, h]`` over the firings that probed each row."""
    dst, grads, targets, precision = make_case(name)
    before = dst.clone()
    prod = torch.einsum("hnk,bfhnv->bfhkv", grads.q.double().cpu(), grads.dnu.double().cpu())
    want = torch.zeros(before.shape, dtype=torch.float64)
    for m, t in enumerate(targets):
        want[:, t] += prod[:, m]
    untouched = [s for s in range(dst.shape[1]) if s not in targets]
    rows = torch.tensor(targets, dtype=torch.int32, device=DEV)
    with planted(*MUTANTS[mutant]) if mutant else contextlib.nullcontext():
        module.add_snapshot_grads(dst, grads, rows, inject_rounds(targets, DEV), precision=precision)
    # rows no firing probed: untouched (the kernel writes the probed rows only, so exact)
    assert torch.equal(dst[:, untouched], before[:, untouched])
    hit = sorted(set(targets))
    return {"add": rel(dst[:, hit].double() - before[:, hit].double(), want[:, hit])}


def label(name):
    return torch.bfloat16 if CASES[name][-1] == "tf32" else torch.float32


@pytest.mark.parametrize("name", list(CASES))
def test_add_snapshot_grads_match_float64(name):
    errors = errors_of(name)
    bound = tolerance("snapshot_grads", "add", label(name))
    record("snapshot_grads", triton_mode.configure(), label(name), "add", errors["add"], bound)
    assert errors["add"] <= bound, (errors, bound)


def test_cases_reach_the_multi_block_paths():
    """``two_rounds``: pairs, keys and V columns each in a block they do not fill (V over two
    blocks, the last ragged), a repeated target (two rounds); ``packed`` one row."""
    B, S, H, n, K, V, targets, _ = CASES["two_rounds"]
    BN, BK, BV = block_sizes(n, K, V)
    assert n < BN and K < BK and BV < V < 2 * BV and V % BV
    assert len(inject_rounds(targets, "cpu")) == 2 and B == H == 2
    assert CASES["packed"][0] == 1


MUTANT_CASES = [("head_zero_query", "two_rounds"), ("own_row", "one_round"), ("first_v_block", "two_rounds"),
                ("first_round_only", "two_rounds"), ("overwrites", "one_round")]


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, case", MUTANT_CASES)
def test_mutants_fail(mutant, case):
    try:
        errors = errors_of(case, mutant)
    except AssertionError:          # a mutant that writes rows no firing probed fails here already
        return
    assert errors["add"] > MUTANT_MIN_ERROR, errors


def test_every_mutant_has_a_case():
    assert sorted({m for m, _ in MUTANT_CASES}) == sorted(MUTANTS)


# Levels ≥ 2's, folded into the reads' state-gradient kernel (``reads_bwd_states(snap_grads=...)``)
# that makes the level below's rows: reads case name (tests/test_nested_reads_kernels.py), the
# level whose rows receive them, pairs, targets (nondecreasing rows of that level).
# L3_batch2: B = H = 2, K = 24 (a key block of 32), V = 40 in three V blocks of 16 (the last 8
# wide), a ragged last chunk; 20 pairs (a block of 32); row 1 probed by no firing, row 2 by two.
FOLD_CASES = {
    "two_firings_one_row": ("L3_batch2", 1, 20, [0, 2, 2]),
    "one_firing_a_row": ("L3_batch2", 1, 16, [0, 1, 2]),
    "top_level_rows": ("L3_batch2", 2, 5, [1, 1]),
    "pairs_in_three_blocks": ("L3_batch2", 1, 40, [0, 2, 2]),
}
# the fold's pair block where a case sets one (``snap_block_n``): 40 pairs in blocks of 16, the last ragged
FOLD_BLOCK_N = {"pairs_in_three_blocks": 16}
if CUDA:    # the kernel's default V block (128: one ragged block at V = 100) with K = 112, bf16 activations
    FOLD_CASES["K112_V100_bf16"] = ("K112_V100_default", 1, 16, [0, 2, 2])
    # 128 pairs (the ladder's n at K = 128, L ≥ 5) at the default pair block: in one block of 128 the
    # launch asked 256 KiB of shared memory and the H200 refused it
    FOLD_CASES["K112_V100_n128_bf16"] = ("K112_V100_default", 1, 128, [0, 2, 2])

FOLD_MUTANTS = {
    # Q of head 0 for every head
    "head_zero_query": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                              "snap_q + i_h * N_PAIRS * K + o_n[None, :] * K", "snap_q + o_n[None, :] * K")],
    # one firing per row (a row probed twice keeps the first firing's gradient)
    "first_firing_only": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                                "for m in range(tl.load(fire_lo + i_s), tl.load(fire_hi + i_s)):",
                                "for m in range(tl.load(fire_lo + i_s), tl.minimum(tl.load(fire_hi + i_s), "
                                "tl.load(fire_lo + i_s) + 1)):")],
    # the last pair masked out
    "last_pair_dropped": [Plant(reads_bwd_module, "reads_bwd_states_kernel", "m_n = o_n < N_PAIRS",
                                "m_n = o_n < N_PAIRS - 1")],
    # batch entry 0's dν' for every batch entry
    "batch_zero": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                         "((i_b.to(tl.int64) * F_SNAP + m) * H + i_h)", "((0 * F_SNAP + m) * H + i_h)")],
    # the last pair block never added
    "last_pair_block_dropped": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                                      "for i_n in range(0, tl.cdiv(N_PAIRS, BN)):",
                                      "for i_n in range(0, tl.cdiv(N_PAIRS, BN) - 1):")],
    # every pair block multiplies the first block's Q
    "first_block_query": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                                "o_n[None, :] * K + o_k[:, None]", "(o_n - i_n * BN)[None, :] * K + o_k[:, None]")],
    # every V block's program adds the first V block's product
    "first_v_block": [Plant(reads_bwd_module, "reads_bwd_states_kernel",
                            "b_dnu = tl.load(p_dnu + o_n[:, None] * V + o_v[None, :]",
                            "b_dnu = tl.load(p_dnu + o_n[:, None] * V + (o_v - i_v * BV)[None, :]")],
    # bf16 inputs: the split product without Q's low half (about 2^-9 of it)
    "split_without_q_lo": [Plant(reads_bwd_module, "dot_split_both",
                                 "acc = tl.dot(a_lo, b_hi, out_dtype=tl.float32)",
                                 "acc = tl.dot(a_lo, b_hi, out_dtype=tl.float32) * 0.0",
                                 rebind=((reads_bwd_module, "reads_bwd_states_kernel"),))],
}


def reads_rows(x, tables, meta, rows, **snap):
    """``reads_bwd_states`` on a reads case (tests/test_nested_reads_kernels.py) for ``rows``."""
    from optimized.nested.reads_bwd import reads_bwd_states

    return reads_bwd_states(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                            tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], rows, block_v=meta["block_v"],
                            **snap)


def fold_errors(name, mutant=None):
    """The relative error of what the folded snapshot gradients added to the probed rows (the
    kernel's rows with them minus without) against the float64 sum of ``Q[h]ᵀ dν'[b, m, h]`` over
    the firings that probed each row; rows no firing probed must be the rows without, to float32
    rounding (``tolerances.yaml`` ``snapshot_grads_unprobed_rows``: the kernel with the fold is
    compiled apart, so not bit for bit)."""
    from optimized.nested.plan import fire_ranges
    from tests.test_nested_reads_kernels import make_case as reads_case

    case, level, n, targets = FOLD_CASES[name]
    x, tables, meta = reads_case(case, dtype=torch.bfloat16 if name.endswith("bf16") else torch.float32)
    B, T, H, L, K = x["q"].shape
    V = x["do"].shape[-1]
    rows = slice(tables.row_offset[level], tables.row_offset[level + 1])
    count = rows.stop - rows.start
    gen = torch.Generator().manual_seed(3)
    grads = FactoredSnapGrads((torch.randn(H, n, K, generator=gen) / n ** 0.5).to(DEV),
                              torch.randn(B, len(targets), H, n, V, generator=gen).to(DEV))

    before = reads_rows(x, tables, meta, rows)
    with planted(*FOLD_MUTANTS[mutant]) if mutant else contextlib.nullcontext():
        after = reads_rows(x, tables, meta, rows, snap_grads=grads, fire_ranges=fire_ranges(targets, count, DEV),
                           snap_block_n=FOLD_BLOCK_N.get(name))
    prod = torch.einsum("hnk,bfhnv->bfhkv", grads.q.double().cpu(), grads.dnu.double().cpu())
    want = torch.zeros(before.shape, dtype=torch.float64)
    for m, t in enumerate(targets):
        want[:, t] += prod[:, m]
    untouched = [s for s in range(count) if s not in targets]
    assert_passes(compare("snapshot_grads_unprobed_rows", x["q"].dtype,
                          {"dstates": (after[:, untouched], before[:, untouched])}, mode="any", log=mutant is None))
    hit = sorted(set(targets))
    return rel(after[:, hit].double() - before[:, hit].double(), want[:, hit])


@pytest.mark.parametrize("name", list(FOLD_CASES))
def test_folded_snapshot_grads_match_float64(name):
    """IEEE float32 products for float32 activations, three bf16 dots for bf16 ones."""
    err = fold_errors(name)
    dtype = torch.bfloat16 if name.endswith("bf16") else torch.float32
    bound = tolerance("snapshot_grads", "fold", dtype)
    record("snapshot_grads", triton_mode.configure(), dtype, "fold", err, bound)
    assert err <= bound, (err, bound)


def test_fold_cases_reach_the_multi_block_paths():
    """Pairs, keys and V each in a block they do not fill, V over several blocks (the last
    ragged), a row probed twice and one by nobody, B = H = 2."""
    from optimized.nested.reads_fwd import block_sizes as reads_blocks
    from tests.test_nested_reads_kernels import CASES as READS_CASES

    case, level, n, targets = FOLD_CASES["two_firings_one_row"]
    B, T, H, K, V, block_v, *_ = READS_CASES[case]
    _, BK, BV, _ = reads_blocks(K, V, 2, block_v)
    assert K < BK and V > 2 * BV and V % BV and n < 32 and 16 < n
    assert len(set(targets)) < len(targets) and 1 not in targets and B == H == 2
    n = FOLD_CASES["pairs_in_three_blocks"][2]
    assert 2 * FOLD_BLOCK_N["pairs_in_three_blocks"] < n < 3 * FOLD_BLOCK_N["pairs_in_three_blocks"]


def test_fold_pair_blocks():
    """``snap_blocks``: the default block is ``SNAP_BLOCK_N`` (64: 128 asked more shared memory than
    an H200 gives), never wider than the pairs' power of two; anything else is refused."""
    from optimized.nested.reads_bwd import SNAP_BLOCK_N, snap_blocks

    assert SNAP_BLOCK_N == 64 and snap_blocks(128) == 64 and snap_blocks(40) == 64 and snap_blocks(20) == 32
    assert snap_blocks(5) == 16 and snap_blocks(128, 32) == 32 and snap_blocks(20, 64) == 32
    for bad in (8, 48, 0, 32.0, True):
        with pytest.raises(ValueError, match="snap_block_n"):
            snap_blocks(40, bad)


FOLD_MUTANT_CASES = [("head_zero_query", "two_firings_one_row"), ("first_firing_only", "two_firings_one_row"),
                     ("last_pair_dropped", "two_firings_one_row"), ("batch_zero", "two_firings_one_row"),
                     ("first_v_block", "two_firings_one_row"), ("last_pair_block_dropped", "pairs_in_three_blocks"),
                     ("first_block_query", "pairs_in_three_blocks")]
# the split dots run only for bf16 inputs (CUDA): a low half missing is far above the bf16 bound
FOLD_SPLIT_MUTANT_MIN_ERROR = 5e-4


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, case", FOLD_MUTANT_CASES)
def test_fold_mutants_fail(mutant, case):
    try:
        err = fold_errors(case, mutant)
    except AssertionError:          # a mutant that changes rows no firing probed fails here already
        return
    assert err > MUTANT_MIN_ERROR, err


@pytest.mark.mutation
@pytest.mark.skipif(not CUDA, reason="bf16 inputs (the split dots) run on CUDA only")
def test_fold_split_mutant_fails():
    err = fold_errors("K112_V100_bf16", "split_without_q_lo")
    assert err > FOLD_SPLIT_MUTANT_MIN_ERROR > tolerance("snapshot_grads", "fold", torch.bfloat16), err


def test_every_fold_mutant_has_a_case():
    assert sorted({m for m, _ in FOLD_MUTANT_CASES} | {"split_without_q_lo"}) == sorted(FOLD_MUTANTS)


def test_fold_bad_inputs_fail_early():
    from optimized.nested.plan import fire_ranges
    from tests.test_nested_reads_kernels import make_case as reads_case

    x, tables, meta = reads_case("L3_batch2")
    B, T, H, L, K = x["q"].shape
    V = x["do"].shape[-1]
    grads = FactoredSnapGrads(torch.zeros(H, 4, K, device=DEV), torch.zeros(B, 2, H, 4, V, device=DEV))
    ranges = fire_ranges([0, 2], 3, DEV)

    def call(**snap):
        return reads_rows(x, tables, meta, slice(0, 3), **snap)
    with pytest.raises(ValueError, match=r"fire_ranges given without snap_grads"):
        call(fire_ranges=ranges)
    with pytest.raises(TypeError, match=r"snap_grads must be a FactoredSnapGrads"):
        call(snap_grads=grads.materialise(), fire_ranges=ranges)
    with pytest.raises(ValueError, match=r"snap_grads.q must have shape"):
        call(snap_grads=grads._replace(q=grads.q[..., :-1]), fire_ranges=ranges)
    with pytest.raises(ValueError, match=r"snap_grads.dnu must have dtype"):
        call(snap_grads=grads._replace(dnu=grads.dnu.double()), fire_ranges=ranges)
    with pytest.raises(ValueError, match=r"fire_ranges must be a \(lo, hi\) pair"):
        call(snap_grads=grads)
    with pytest.raises(ValueError, match=r"fire_ranges' hi must have shape"):
        call(snap_grads=grads, fire_ranges=(ranges[0], ranges[1][:2]))
    with pytest.raises(ValueError, match=r"targets must be nondecreasing rows"):
        fire_ranges([2, 0], 3, DEV)
    with pytest.raises(ValueError, match=r"targets must be nondecreasing rows"):
        fire_ranges([0, 3], 3, DEV)


# level 1's gradients, folded into level 0's state-gradient recurrence: B = H = 2, a ragged last
# chunk, V over two of the kernel's V blocks (32), pairs under and over 16
LEVEL0_SHAPE = GDN2Shape(B=2, T=200, H=2, K=24, V=40)


def level0_factored_result(pairs, monkeypatch, log=True):
    """``checks.level0_states_vs_reference`` with level 1's ``pairs`` pairs injected factored, in
    the pair blocks ``STATE_GRAD_PAIRS`` gives them."""
    if STATE_GRAD_PAIRS[pairs] is not None:
        monkeypatch.setattr(state_grad_module, "FACTORED_BLOCK_N", STATE_GRAD_PAIRS[pairs])
    return checks.level0_states_vs_reference(LEVEL0_SHAPE, 1, torch.float32, pairs=pairs, log=log)


@pytest.mark.parametrize("pairs", list(STATE_GRAD_PAIRS))
def test_level0_factored_injection_matches_float64(pairs, monkeypatch):
    assert state_grad_module.block_sizes(LEVEL0_SHAPE.K, LEVEL0_SHAPE.V)[1] < LEVEL0_SHAPE.V
    result = level0_factored_result(pairs, monkeypatch)
    assert all(err <= bound for err, bound in result.values()), result


def test_level0_factored_pair_blocks():
    """``factored_blocks``: ``FACTORED_BLOCK_N`` (32) by default, never wider than the pairs' power
    of two; the 40-pair case runs three blocks, the last ragged; anything else is refused."""
    blocks = state_grad_module.factored_blocks
    assert state_grad_module.FACTORED_BLOCK_N == 32 and blocks(16) == 16 and blocks(20) == 32 and blocks(128) == 32
    assert blocks(3) == 16 and blocks(40, 16) == 16 and 2 * 16 < 40 < 3 * 16
    for bad in (8, 24, 0, 16.0, True):
        with pytest.raises(ValueError, match="factored_block_n"):
            blocks(40, bad)


@pytest.mark.mutation
@pytest.mark.parametrize("mutant", list(STATE_GRAD_MUTANTS))
def test_level0_factored_injection_mutants_fail(mutant, monkeypatch):
    with planted(*STATE_GRAD_MUTANTS[mutant]):
        result = level0_factored_result(STATE_GRAD_MUTANT_PAIRS.get(mutant, 20), monkeypatch, log=False)
    bad = {k for k, (err, bound) in result.items() if err > bound}
    assert {"dk", "dv", "dw"} <= bad and not {"output", "chunk_end_states"} & bad, result


def test_bad_inputs_fail_early():
    dst, grads, targets, _ = make_case("two_rounds")
    rows = torch.tensor(targets, dtype=torch.int32, device=DEV)
    rounds = inject_rounds(targets, DEV)
    with pytest.raises(ValueError, match=r"precision must be one of"):
        add_snapshot_grads(dst, grads, rows, rounds, precision="bf16")
    with pytest.raises(ValueError, match=r"dst must be a float32 \[B, S, H, K, V\]"):
        add_snapshot_grads(dst.transpose(3, 4), grads, rows, rounds)
    with pytest.raises(ValueError, match=r"grads.q must be float32 \[H, n, K\]"):
        add_snapshot_grads(dst, grads._replace(q=grads.q[:, :, :-1]), rows, rounds)
    with pytest.raises(ValueError, match=r"grads.dnu must be float32 \[B, F, H, n, V\]"):
        add_snapshot_grads(dst, grads._replace(dnu=grads.dnu.double()), rows, rounds)
    with pytest.raises(ValueError, match=r"targets must be int32 \[F\]"):
        add_snapshot_grads(dst, grads, rows.long(), rounds)
    with pytest.raises(ValueError, match=r"each round must be an int32 vector"):
        add_snapshot_grads(dst, grads, rows, tuple(r.long() for r in rounds))


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if CUDA else []), ids=str)
@pytest.mark.parametrize("scheme", ["learned", "bounded_erase"])
def test_factored_snapshot_grads_in_the_op_agree(scheme, dtype, monkeypatch):
    """The op's default (``Pieces(snapshot_grads="factored")``: level 2's ``Qᵀ dν'`` formed in the
    reads' state-gradient kernel), ``"factored-add"`` (in ``add_snapshot_grads`` after it) and the op
    that materialises ``Qᵀ dν'`` (``"materialised"``, reads_ab ``snap-grads-materialised``): the same
    forward bit for bit and the same gradients to float32 rounding; each factored path runs where
    it should (level 1's into level 0's state-gradient kernel in both)."""
    from ngdn.nested_inputs import NestedShape
    from optimized.nested import Pieces, _nested
    import optimized.nested.bwd as bwd_module
    import optimized.nested.pieces as pieces_module
    from tests.test_nested_hot_path import NAMES, inputs, on_bucket

    adds, folds = [], []
    real_add, real_states = bwd_module.add_snapshot_grads, pieces_module.reads_bwd_states
    monkeypatch.setattr(bwd_module, "add_snapshot_grads", lambda *a, **k: (adds.append(1), real_add(*a, **k))[1])
    monkeypatch.setattr(pieces_module, "reads_bwd_states",
                        lambda *a, **k: (folds.append(k["snap_grads"] is not None), real_states(*a, **k))[1])
    results = []
    for pieces in (Pieces(), Pieces(snapshot_grads="factored-add"), Pieces(snapshot_grads="materialised")):
        args = inputs(on_bucket(NestedShape(B=2, T=200, H=2, L=3, K=16, V=16)), dtype, scheme=scheme)
        o = _nested(pieces=pieces, **args)[0]
        leaves = [args[n] for n in NAMES]
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.device)
        results.append([o, *torch.autograd.grad(o, leaves, do)])
    # levels 2 then 1 per run: level 1's rows with level 2's gradients folded in the default run only
    assert folds == [False, True, False, False, False, False] and adds == [1]
    bound = tolerance("snapshot_grads", "op", dtype)
    for got in results[:2]:
        assert torch.equal(got[0], results[2][0])     # the forward: the same kernels (the choice is the backward's)
        errors = [rel(g, want) for g, want in zip(got[1:], results[2][1:])]
        for name, err in zip(NAMES, errors):
            record("snapshot_grads", triton_mode.configure(), dtype, "op", err, bound)
        assert max(errors) <= bound, dict(zip(NAMES, errors))


def test_pieces_reject_an_unknown_snapshot_grads():
    from optimized.nested import Pieces

    with pytest.raises(ValueError, match=r"snapshot_grads must be one of"):
        Pieces(snapshot_grads="dense")
