"""The probe's in-place snapshot reads (``optimized.nested.snapshot_reads``: ``ν = Q M`` and
``dQ = Σ dν Mᵀ`` from the rows that hold the snapshots) against a float64 gather-and-einsum, on
cases that reach every masked edge: pairs, keys and V columns over two blocks with a ragged last
one, B = 2 and H = 2, a batch-strided source (a slice of the stored states), negative rows (the
final states: per batch entry, and per packed sequence), bf16 and float32 sources, and the query
gradient's groups of (b, m) items with a ragged last group. Mutants (``MUTANTS``: each the
production kernel with one source substitution, ``property_tests/kernel_mutation.py``) must fail."""
import contextlib

import pytest
import torch

from ngdn.tolerances import record, tolerance
from optimized import triton_mode
from optimized.nested import snapshot_reads as module
from optimized.nested.snapshot_reads import SnapshotRows, block_sizes, snapshot_read, snapshot_read_dq
from property_tests.kernel_mutation import Plant, planted

DEV = triton_mode.device()
CUDA = triton_mode.MODE == triton_mode.CUDA
MUTANT_MIN_ERROR = 0.1      # a mutant misses by far more than any "snapshot_reads" tolerance (≤ 5e-3)

# name: (B, R, H, n, K, V, rows, finals, src dtype); finals: how many final states (0: none)
CASES = {
    # two blocks of pairs (80 = 64 + 16), keys (80) and V columns (72 = 64 + 8); B = H = 2; one
    # firing reads the batch entry's final state; the source a slice of a bigger buffer (batch-strided)
    "two_blocks": (2, 6, 2, 80, 80, 72, [3, 0, 5, 2, -1], 2, torch.float32),
    # packed sequences (B = 1): firings read three sequences' final states, -1 - i
    "packed_finals": (1, 4, 2, 8, 24, 40, [0, -3, 1, -1, -2, 3], 3, torch.float32),
    # level 1 in a bf16 run: fla's bf16 chunk states, the last firing the float32 final state
    "bf16_chunk_states": (2, 5, 2, 16, 32, 16, [1, 2, 3, 4, -1], 2, torch.bfloat16),
    # level ℓ ≥ 2: rows of the stored states, no final state
    "stored_rows": (2, 7, 2, 24, 24, 24, [2, 4, 6], 0, torch.float32),
    # dQ's tiles: more pair blocks than key blocks (a tile index read as (key, pair) instead of
    # (pair, key) only reorders the tiles where the counts are equal)
    "pairs_over_keys": (2, 5, 2, 80, 24, 40, [1, 4, 0, -1], 2, torch.float32),
}
if CUDA:    # the benchmark's head size in a bf16 run (TF32 dots), and float32 (IEEE)
    CASES["K128_bf16"] = (2, 5, 2, 16, 128, 128, [1, 2, 3, 4, -1], 2, torch.bfloat16)
    CASES["K128_f32"] = (2, 5, 2, 64, 128, 128, [0, 2, 4], 0, torch.float32)

MUTANTS = {
    # Q of head 0 for every head
    "head_zero_query": [Plant(module, "snapshot_read_fwd_kernel", "p_q = q + i_h * N * K", "p_q = q")],
    # the source's batch stride taken as a contiguous tensor's (R rows), not the slice's
    "dense_batch_stride": [Plant(module, "snapshot_read_fwd_kernel", "src + i_b.to(tl.int64) * stride_sb",
                                 "src + i_b.to(tl.int64) * (stride_sb - H * K * V)")],
    # a negative row reads the final state one before its own (clamped to the first)
    "final_one_early": [Plant(module, "snapshot_read_fwd_kernel", "final + ((i_b.to(tl.int64) - 1 - row)",
                              "final + (tl.maximum(i_b.to(tl.int64) - 2 - row, 0)"),
                        Plant(module, "snapshot_read_dq_kernel", "final + ((i_b - 1 - row)",
                              "final + (tl.maximum(i_b - 2 - row, 0)")],
    # only the first key block of Q @ S
    "first_key_block_only": [Plant(module, "_q_state", "for k0 in range(0, K, BK):", "for k0 in range(0, BK, BK):",
                                   rebind=((module, "snapshot_read_fwd_kernel"),))],
    # dQ over the first V block only
    "dq_first_v_block_only": [Plant(module, "_dnu_state_t", "for v0 in range(0, V, BV):",
                                    "for v0 in range(0, BV, BV):", rebind=((module, "snapshot_read_dq_kernel"),))],
    # dQ's program index split as (key block, pair block) instead of (pair block, key block)
    "dq_tiles_transposed": [Plant(module, "snapshot_read_dq_kernel", "i_n, i_k = i_nk // NK, i_nk % NK",
                                  "i_n, i_k = i_nk % NK, i_nk // NK")],
    # each group of dQ's (b, m) items drops its last item
    "dq_group_short": [Plant(module, "snapshot_read_dq_kernel", "for j in range(0, ITEMS):",
                             "for j in range(0, ITEMS - 1):")],
}


def make_case(name, seed=0):
    B, R, H, n, K, V, rows, finals, dtype = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(B, R + 2, H, K, V, generator=gen) / K ** 0.5
    src = buf.to(DEV, dtype)[:, 1:R + 1]                        # batch-strided, rows contiguous
    final = (torch.randn(max(finals, 1), H, K, V, generator=gen) / K ** 0.5).to(DEV) if finals else None
    Q = torch.randn(H, n, K, generator=gen).to(DEV)
    dnu = torch.randn(B, len(rows), H, n, V, generator=gen).to(DEV)
    return Q, SnapshotRows(src, torch.tensor(rows, dtype=torch.int32, device=DEV), final), dnu


def gathered(snaps: SnapshotRows) -> torch.Tensor:
    """float64 ``[B, F, H, K, V]``: what the kernels read, gathered on the host."""
    src, rows, final = snaps
    B = src.shape[0]
    per_b = [[src[b, r] if r >= 0 else final[b - 1 - r] for r in rows.tolist()] for b in range(B)]
    return torch.stack([torch.stack(x) for x in per_b]).double().cpu()


def precision(dtype) -> str:
    """The dots' precision the nested op uses for a run whose level 0 is in ``dtype``."""
    return "tf32" if dtype == torch.bfloat16 else "ieee"


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def small_groups(monkeypatch):
    """dQ's (b, m) items in 3 groups (the last one ragged) instead of about 1024 programs' worth."""
    whole = module.dq_groups
    monkeypatch.setattr(module, "dq_groups", lambda items, per_group: whole(items, per_group, target=3 * per_group))


def errors_of(name, mutant=None):
    Q, snaps, dnu = make_case(name)
    prec = precision(snaps.src.dtype)
    with planted(*MUTANTS[mutant]) if mutant else contextlib.nullcontext():
        nu = snapshot_read(Q, snaps, prec)
        dq = snapshot_read_dq(dnu, snaps, prec)
    M = gathered(snaps)
    nu_ref = torch.einsum("hnk,bfhkv->bfhnv", Q.double().cpu(), M)
    dq_ref = torch.einsum("bfhnv,bfhkv->hnk", dnu.double().cpu(), M)
    assert nu.dtype == dq.dtype == torch.float32
    return {"nu": rel(nu, nu_ref), "dq": rel(dq, dq_ref)}


@pytest.mark.parametrize("groups", ["default", "three"])
@pytest.mark.parametrize("name", list(CASES))
def test_snapshot_reads_match_float64(name, groups, monkeypatch):
    if groups == "three":
        small_groups(monkeypatch)
    errors = errors_of(name)
    dtype = CASES[name][-1]
    bounds = {k: tolerance("snapshot_reads", k, dtype) for k in errors}
    for k in errors:
        record("snapshot_reads", triton_mode.configure(), dtype, k, errors[k], bounds[k])
    assert all(errors[k] <= bounds[k] for k in errors), (errors, bounds)


def test_cases_reach_the_multi_block_paths(monkeypatch):
    """``two_blocks`` visits two blocks of pairs, keys and V columns, each with a ragged last one;
    with three groups its dQ items split 4 + 4 + 2."""
    B, R, H, n, K, V, rows, *_ = CASES["two_blocks"]
    BN, BK, BV = block_sizes(n, K, V)
    assert all(b < x < 2 * b for x, b in ((n, BN), (K, BK), (V, BV)))
    small_groups(monkeypatch)
    assert module.dq_groups(B * len(rows), 1) == (3, 4)


MUTANT_CASES = [("head_zero_query", ["nu"], "two_blocks"), ("dense_batch_stride", ["nu"], "two_blocks"),
                ("final_one_early", ["nu", "dq"], "packed_finals"), ("final_one_early", ["nu", "dq"], "two_blocks"),
                ("first_key_block_only", ["nu"], "two_blocks"), ("dq_first_v_block_only", ["dq"], "two_blocks"),
                ("dq_group_short", ["dq"], "two_blocks"), ("dq_tiles_transposed", ["dq"], "pairs_over_keys")]


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken, case", MUTANT_CASES)
def test_mutants_fail(mutant, broken, case, monkeypatch):
    small_groups(monkeypatch)       # groups of more than one item: dq_group_short drops one
    errors = errors_of(case, mutant)
    assert all(errors[k] > MUTANT_MIN_ERROR for k in broken), errors


def test_every_mutant_has_a_case():
    assert sorted({m for m, _, _ in MUTANT_CASES}) == sorted(MUTANTS)


def test_bad_inputs_fail_early():
    Q, snaps, dnu = make_case("two_blocks")
    with pytest.raises(ValueError, match=r"snaps.rows must be int32"):
        snapshot_read(Q, snaps._replace(rows=snaps.rows.long()))
    with pytest.raises(ValueError, match=r"rows must be contiguous"):
        snapshot_read(Q, snaps._replace(src=snaps.src.transpose(3, 4)))
    with pytest.raises(ValueError, match=r"snaps.final must be float32"):
        snapshot_read(Q, snaps._replace(final=snaps.final.double()))
    with pytest.raises(ValueError, match=r"Q must be float32 \[2, 80, 80\]"):
        snapshot_read(Q[:, :, :-1], snaps)
    with pytest.raises(ValueError, match=r"precision must be one of"):
        snapshot_read(Q, snaps, "bf16")
    with pytest.raises(TypeError, match=r"snaps must be a SnapshotRows"):
        snapshot_read(Q, snaps.src)
    with pytest.raises(ValueError, match=r"dnu must be float32 \[2, 5, 2, 80, 72\]"):
        snapshot_read_dq(dnu[:, :-1], snaps)


def test_empty_reads():
    Q, snaps, dnu = make_case("stored_rows")
    none = snaps._replace(rows=snaps.rows[:0])
    assert snapshot_read(Q, none).shape == (2, 0, 2, 24, 24)
    assert torch.equal(snapshot_read_dq(dnu[:, :0], none), torch.zeros(2, 24, 24, device=DEV))
