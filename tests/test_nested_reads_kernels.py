"""The Triton reads/router kernels (``optimized.nested.reads_fwd`` / ``reads_bwd``) against a
float64 PyTorch formula and its autograd, on shapes that reach every masked edge: a ragged
last chunk, K not a power of two, several V blocks with a ragged last one, 2-4 levels,
general monotone schedules with rows nobody reads, router logits of ±30. Mutants (a read
one chunk late, a forgotten level 0, a softmax backward without ``- Σ p dp``, a router
softmax over the tokens instead of the levels, a dropped dr, a state gradient summed over
one chunk too few) must fail."""
import pytest
import torch

from optimized import triton_mode
from optimized.level0 import CHUNK
from optimized.nested import reads_bwd as reads_bwd_module
from optimized.nested.reads_bwd import reads_bwd
from optimized.nested.reads_fwd import read_tables, reads_fwd
from ngdn.tolerances import record, tolerance

DEV = triton_mode.device()
# bfloat16 activations (q, r, o0, do) where the kernels compute them: the bf16 split dots
DTYPES = [torch.float32] + ([torch.bfloat16] if triton_mode.MODE == triton_mode.CUDA else [])
# A mutant must miss by far more than any tolerance of the "nested_reads" entry.
MUTANT_MIN_ERROR = 1e-2

# name: (B, T, H, K, V, block_v, read_index per level ℓ ≥ 1, rows per level ℓ ≥ 1, logit scale)
CASES = {
    # ragged last chunk (150 = 2·64 + 22), 3 V blocks of 16 (last one 8 wide), K = 24; level 1's
    # last row (its final state) is read by no chunk
    "L2_ragged": (2, 150, 1, 24, 40, 16, [[0, 1, 1]], [3], 1.0),
    # 4 levels: a delayed firing (level 1 reads 0, 0, 1, 3: rows 2 and 4 unread), a level that
    # never changes what it reads, ragged last chunk (200 = 3·64 + 8), logits ±30
    "L4_extreme": (1, 200, 2, 24, 40, 16, [[0, 0, 1, 3], [0, 0, 0, 0], [0, 1, 1, 2]], [5, 2, 3], 30.0),
    # one full chunk, default V block (one ragged block of 64 for V = 40), K = 16
    "L3_one_chunk": (1, 64, 1, 16, 40, None, [[0], [1]], [2, 2], 1.0),
}


def make_case(name, seed=0, dtype=torch.float32):
    B, T, H, K, V, block_v, reads, rows, logit = CASES[name]
    L = len(reads) + 1
    gen = torch.Generator().manual_seed(seed)
    S = sum(rows)
    x = {
        "q": torch.randn(B, T, H, L, K, generator=gen),
        "r": torch.randn(B, T, H, L, generator=gen),
        "o0": torch.randn(B, T, H, V, generator=gen),
        "states": torch.randn(B, S, H, K, V, generator=gen) / K ** 0.5,
        "do": torch.randn(B, T, H, V, generator=gen),
    }
    if logit != 1.0:        # ±logit, ties broken by a little noise: near one-hot and mixed rows
        x["r"] = logit * torch.randint(0, 2, (B, T, H, L), generator=gen).mul(2).sub(1) + 0.1 * x["r"]
    x = {n: t.to(DEV, dtype if n != "states" else torch.float32) for n, t in x.items()}
    tables = read_tables([()] + reads, [0] + rows, DEV)
    return x, tables, {"read_index": [()] + reads, "scale": K ** -0.5, "block_v": block_v}


def reference(x, tables, read_index, scale):
    """float64: ``o = p_0 o0 + Σ_ℓ p_ℓ scale M_ℓ^T q_ℓ`` token by token, gradients by autograd."""
    leaves = {n: x[n].double().cpu().requires_grad_() for n in ("q", "r", "o0", "states")}
    q, r, o0, states = leaves["q"], leaves["r"], leaves["o0"], leaves["states"]
    T, L = q.shape[1], q.shape[3]
    p = torch.softmax(r, dim=-1)
    o = p[..., 0, None] * o0
    chunk = torch.arange(T) // CHUNK
    for ℓ in range(1, L):
        rows = torch.tensor([tables.row_offset[ℓ] + read_index[ℓ][j] for j in chunk.tolist()])
        o_l = scale * torch.einsum("bthk,bthkv->bthv", q[:, :, :, ℓ], states[:, rows])
        o = o + p[..., ℓ, None] * o_l
    o.backward(x["do"].double().cpu())
    return o.detach(), {n: t.grad for n, t in leaves.items()}


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


class NaNEmpty:
    """``torch`` for ``reads_bwd``'s module, except that ``empty`` fills with NaN: an output
    element the kernels forget to write shows up."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*size, **kwargs):
        return torch.full(size, float("nan"), **kwargs)


def run(x, tables, scale, block_v, mutant=None):
    o = reads_fwd(x["q"], x["r"], x["o0"], x["states"], tables.read_row, scale, block_v=block_v, _mutant=mutant)
    B, T, H, L, K = x["q"].shape
    dq = torch.full((B, T, H, L, K), 7.0, device=DEV)        # level 0 must stay untouched
    dr, do0, dstates = reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row,
                                 tables.row_level, tables.row_chunk_lo, tables.row_chunk_hi, scale, dq,
                                 block_v=block_v, _mutant=mutant)
    return o, dq, dr, do0, dstates


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_reads_match_float64(name, dtype, monkeypatch):
    monkeypatch.setattr(reads_bwd_module, "torch", NaNEmpty())
    x, tables, meta = make_case(name, dtype=dtype)
    o, dq, dr, do0, dstates = run(x, tables, meta["scale"], meta["block_v"])
    o_ref, g = reference(x, tables, meta["read_index"], meta["scale"])
    errors = {
        "output": rel(o, o_ref),
        "dr": rel(dr, g["r"]),
        "do0": rel(do0, g["o0"]),
        "dq": rel(dq[:, :, :, 1:], g["q"][:, :, :, 1:]),
        "dstates": rel(dstates, g["states"]),
    }
    bounds = {k: tolerance("nested_reads", k, dtype) for k in errors}
    for k in errors:                                  # NGDN_ERROR_LOG: `ngdn errors` measures the margins
        record("nested_reads", triton_mode.configure(), dtype, k, errors[k], bounds[k])
    assert all(errors[k] <= bounds[k] for k in errors), (errors, bounds)
    assert o.dtype == x["q"].dtype and dr.dtype == do0.dtype == dstates.dtype == torch.float32
    assert bool((dq[:, :, :, 0] == 7.0).all()), "dq level 0 was written"
    read = {tables.row_offset[ℓ] + i for ℓ, idx in enumerate(meta["read_index"]) for i in idx}
    unread = [s for s in range(dstates.shape[1]) if s not in read]
    assert unread, "the case should have rows nobody reads"
    assert bool((dstates[:, unread] == 0).all()), "rows read by no chunk must get zeros"


# L2_ragged shows each: its rows 0 and 1 are read by 1 and 2 chunks (short_state_sum drops
# chunk 0's and chunk 2's terms); softmax_wrong_axis breaks p in all three kernels.
@pytest.mark.parametrize("mutant, broken", [("stale_read", ["o"]), ("no_level0", ["o", "dr"]),
                                            ("no_centering", ["dr"]),
                                            ("softmax_wrong_axis", ["o", "dr", "dstates"]),
                                            ("dropped_dr", ["dr"]), ("short_state_sum", ["dstates"])])
def test_mutants_fail(mutant, broken):
    x, tables, meta = make_case("L2_ragged")
    o, dq, dr, do0, dstates = run(x, tables, meta["scale"], meta["block_v"], mutant=mutant)
    o_ref, g = reference(x, tables, meta["read_index"], meta["scale"])
    errors = {"o": rel(o, o_ref), "dr": rel(dr, g["r"]), "dstates": rel(dstates, g["states"])}
    assert all(errors[k] > MUTANT_MIN_ERROR for k in broken), errors


def test_bad_inputs_fail_early():
    x, tables, meta = make_case("L3_one_chunk")
    args = [x["q"], x["r"], x["o0"], x["states"], tables.read_row, meta["scale"]]
    with pytest.raises(ValueError, match=r"r must have shape"):
        reads_fwd(args[0], args[1][..., :2], *args[2:])
    with pytest.raises(ValueError, match=r"states must have dtype"):
        reads_fwd(*args[:3], args[3].double(), *args[4:])
    with pytest.raises(ValueError, match=r"read_row must have shape \(3, 1\)"):
        reads_fwd(*args[:4], tables.read_row[:2], meta["scale"])
    with pytest.raises(ValueError, match=r"_mutant must be one of"):
        reads_fwd(*args, _mutant="typo")
    B, T, H, L, K = x["q"].shape
    dq = torch.zeros(B, T, H, K, L, device=DEV).transpose(3, 4)         # right shape, not contiguous
    with pytest.raises(ValueError, match=r"dq must be contiguous"):
        reads_bwd(x["do"], *args[:5], tables.row_level, tables.row_chunk_lo, tables.row_chunk_hi,
                  meta["scale"], dq)
    with pytest.raises(ValueError, match=r"read_index\[1\] must be nondecreasing"):
        read_tables([(), [1, 0]], [0, 2], DEV)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dq_in_q_dtype_is_the_float32_dq_rounded_once(dtype):
    """The nested backward passes a ``dq`` buffer in q's dtype (no float32 buffer, no cast copy):
    the kernel's store rounds each float32 value once, as ``.to(dtype)`` would."""
    x, tables, meta = make_case("L2_ragged", dtype=dtype)
    _, dq32, *_ = run(x, tables, meta["scale"], meta["block_v"])
    B, T, H, L, K = x["q"].shape
    dq = torch.full((B, T, H, L, K), 7.0, device=DEV, dtype=dtype)
    reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
              tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], dq, block_v=meta["block_v"])
    # bitwise in float32; in bf16 at most one bf16 ulp apart (the two compiled variants may contract
    # the float32 products into FMAs differently before the one rounding)
    want = dq32.to(dtype)
    assert torch.equal(dq, want) if dtype == torch.float32 else \
        bool(((dq.float() - want.float()).abs() <= 2.0 ** -7 * want.float().abs()).all())


@pytest.mark.parametrize("name", ["L3_one_chunk", "L2_ragged"])
def test_state_rows_one_level_at_a_time_equal_all_at_once(name):
    """``reads_bwd_states`` on a level's rows (what the nested backward asks for, one level at a
    time) is that slice of ``reads_bwd``'s ``dstates``, bit for bit (the same programs)."""
    from optimized.nested.reads_bwd import reads_bwd_states

    x, tables, meta = make_case(name)
    *_, dstates = run(x, tables, meta["scale"], meta["block_v"])
    S = dstates.shape[1]
    cuts = sorted(set(tables.row_offset[1:]) | {S})
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        part = reads_bwd_states(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                                tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], slice(lo, hi),
                                block_v=meta["block_v"])
        assert torch.equal(part, dstates[:, lo:hi]), (lo, hi)
    with pytest.raises(ValueError, match="step 1"):
        reads_bwd_states(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                         tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], slice(0, S, 2))
