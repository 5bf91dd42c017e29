"""The Triton reads/router kernels (``optimized.nested.reads_fwd`` / ``reads_bwd``) against a
float64 PyTorch formula and its autograd, on shapes that reach every masked edge: a ragged
last chunk, K not a power of two, several V blocks with a ragged last one, 2-4 levels,
general monotone schedules with rows nobody reads, router logits of ±30, K over two key
blocks of the backward's token kernel. Mutants (``READS_MUTANTS``: a read one chunk late, a
forgotten level 0, a softmax backward without ``- Σ p dp``, a router softmax over the tokens
instead of the levels, a dropped dr, a state gradient summed over one chunk too few, a
router gradient from the last key block only) must fail; each is the production kernel with
one source substitution (``property_tests/kernel_mutation.py``)."""
import contextlib

import pytest
import torch
import triton

from optimized import triton_mode
from optimized.nested.level0 import CHUNK
from optimized.nested import reads_bwd as reads_bwd_module
from optimized.nested import reads_fwd as reads_fwd_module
from optimized.nested.reads_bwd import reads_bwd, token_blocks
from optimized.nested.reads_fwd import block_sizes, forward_block_v, read_tables, reads_fwd
from ngdn.tolerances import record, tolerance
from property_tests.kernel_mutation import Plant, planted

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
    # K = 80: the backward's token kernel visits K in two key blocks of 64 (the second 16 wide);
    # ragged last chunk (100 = 64 + 36), V = 24 in two V blocks of 16; level 1's last row unread
    "L3_two_key_blocks": (1, 100, 2, 80, 24, 16, [[0, 1], [0, 0]], [3, 1], 1.0),
    # B = 2, H = 2, two upper levels: the second allocation's batch and head strides when the
    # stored rows are split at level 1's (test_rows_split_in_two_allocations_read_the_same)
    "L3_batch2": (2, 150, 2, 24, 40, 16, [[0, 1, 1], [0, 0, 1]], [3, 2], 1.0),
}
if triton_mode.MODE == triton_mode.CUDA:
    # K = 128, V = 16: the [128, 16] float32 tile at 8 warps (optimized.warps), the shape at which
    # Triton 3.6 on the H200 miscompiled another kernel of this repo (Fenwick GDN-2's carry scan,
    # 2026-12-02); B = H = 2, ragged last chunk, level 1's last row unread
    CASES["K128_V16"] = (2, 150, 2, 128, 16, None, [[0, 1, 1]], [3], 1.0)
    # the forward's default for bf16 at 64 < K ≤ 128 (forward_block_v): one V block of 128, here
    # ragged (V = 100 of 128) with K = 112 masked; B = H = 2, ragged last chunk, two upper levels
    CASES["K112_V100_default"] = (2, 150, 2, 112, 100, None, [[0, 1, 1], [0, 0, 1]], [3, 2], 1.0)

# The broken kernels: name -> plants (each one exact substitution in a production kernel).
_FWD, _BWD = reads_fwd_module, reads_bwd_module
READS_MUTANTS = {
    # the forward reads the row of the chunk before (read_row[ℓ, j - 1])
    "stale_read": [Plant(_FWD, "reads_fwd_kernel", "tl.load(read_row + l * N + i_c)",
                         "tl.load(read_row + l * N + tl.maximum(i_c - 1, 0))")],
    # the forward drops p_0 · o0, the backward dp_0 from dr
    "no_level0": [Plant(_FWD, "reads_fwd_kernel", "b_o = level_column(b_p, 0, BL)[:, None] * b_o0",
                        "b_o = 0.0 * level_column(b_p, 0, BL)[:, None] * b_o0"),
                  Plant(_BWD, "reads_bwd_tokens_kernel", "b_dp = tl.where(o_l[None, :] == 0, b_dp0[:, None], 0.0)",
                        "b_dp = tl.where(o_l[None, :] == 0, 0.0 * b_dp0[:, None], 0.0)")],
    # the softmax backward without its centring: dr = p ⊙ dp
    "no_centering": [Plant(_BWD, "reads_bwd_tokens_kernel",
                           "b_dr = b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None])", "b_dr = b_p * b_dp")],
    # the router normalises over the chunk's tokens, not the levels (every kernel that computes p;
    # columns ≥ L keep logit 0, so p stays finite)
    "softmax_wrong_axis": [Plant(
        _FWD, "router_probs",
        """    b_r = tl.where(m_l[None, :], b_r, float("-inf"))
    b_e = tl.exp(b_r - tl.max(b_r, axis=1)[:, None])
    b_p = b_e / tl.sum(b_e, axis=1)[:, None]""",
        """    b_e = tl.exp(b_r - tl.max(b_r, axis=0)[None, :])
    b_p = b_e / tl.sum(b_e, axis=0)[None, :]""",
        rebind=((_FWD, "reads_fwd_kernel"), (_BWD, "reads_bwd_tokens_kernel"), (_BWD, "reads_bwd_states_kernel")))],
    # the token kernel writes dr = 0
    "dropped_dr": [Plant(_BWD, "reads_bwd_tokens_kernel", "tl.store(dr + tok[:, None] * L + o_l[None, :], b_dr,",
                         "tl.store(dr + tok[:, None] * L + o_l[None, :], 0.0 * b_dr,")],
    # the state kernel sums each row over chunks [lo, hi - 1) when hi > lo
    "short_state_sum": [Plant(_BWD, "reads_bwd_states_kernel", "j_hi = tl.load(row_chunk_hi + i_s)",
                              "j_hi = tl.maximum(tl.load(row_chunk_hi + i_s) - 1, j_lo)")],
    # dp of level ℓ keeps only the last key block's part (no accumulation over key blocks):
    # the same kernel as the correct one while K fits one key block
    "last_key_block_only": [Plant(_BWD, "reads_bwd_tokens_kernel", "b_dpl += scale * tl.sum(b_q * b_u, axis=1)",
                                  "b_dpl = scale * tl.sum(b_q * b_u, axis=1)")],
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
    """Forward and backward; ``mutant``: with that entry of ``READS_MUTANTS`` planted."""
    with planted(*READS_MUTANTS[mutant]) if mutant is not None else contextlib.nullcontext():
        o = reads_fwd(x["q"], x["r"], x["o0"], x["states"], tables.read_row, scale, block_v=block_v)
        B, T, H, L, K = x["q"].shape
        dq = torch.full((B, T, H, L, K), 7.0, device=DEV)        # level 0 must stay untouched
        dr, do0, dstates = reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row,
                                     tables.row_level, tables.row_chunk_lo, tables.row_chunk_hi, scale, dq,
                                     block_v=block_v)
    return o, dq, dr, do0, dstates


def key_blocks(name) -> int:
    """How many key blocks the backward's token kernel visits on case ``name``."""
    B, T, H, K, V, block_v, *_ = CASES[name]
    BKA = token_blocks(K, V, block_v)[0]
    return triton.cdiv(K, BKA)


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
    # do0 asked for in the activations' dtype (the nested op's choice): the float32 one, rounded once
    B, T, H, L, K = x["q"].shape
    dq2 = torch.full((B, T, H, L, K), 7.0, device=DEV)
    _, do0_act, _ = reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                              tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], dq2, block_v=meta["block_v"],
                              with_states=False, do0_dtype=x["q"].dtype)
    # exact even where the store's dtype compiles another kernel: do0 = p0 · do is one float32 product
    # (nothing to contract into an FMA), rounded once to the narrower dtype either way
    assert do0_act.dtype == x["q"].dtype and torch.equal(do0_act, do0.to(x["q"].dtype))
    assert bool((dq[:, :, :, 0] == 7.0).all()), "dq level 0 was written"
    read = {tables.row_offset[ℓ] + i for ℓ, idx in enumerate(meta["read_index"]) for i in idx}
    unread = [s for s in range(dstates.shape[1]) if s not in read]
    assert unread, "the case should have rows nobody reads"
    assert bool((dstates[:, unread] == 0).all()), "rows read by no chunk must get zeros"


def mutant_errors(name, mutant):
    x, tables, meta = make_case(name)
    o, dq, dr, do0, dstates = run(x, tables, meta["scale"], meta["block_v"], mutant=mutant)
    o_ref, g = reference(x, tables, meta["read_index"], meta["scale"])
    return {"o": rel(o, o_ref), "dr": rel(dr, g["r"]), "dstates": rel(dstates, g["states"])}


# L2_ragged shows each of the first six: its rows 0 and 1 are read by 1 and 2 chunks
# (short_state_sum drops chunk 0's and chunk 2's terms); softmax_wrong_axis breaks p in all three
# kernels. last_key_block_only needs two key blocks (L3_two_key_blocks).
MUTANT_CASES = [("stale_read", ["o"], "L2_ragged"), ("no_level0", ["o", "dr"], "L2_ragged"),
                ("no_centering", ["dr"], "L2_ragged"), ("softmax_wrong_axis", ["o", "dr", "dstates"], "L2_ragged"),
                ("dropped_dr", ["dr"], "L2_ragged"), ("short_state_sum", ["dstates"], "L2_ragged"),
                ("last_key_block_only", ["dr"], "L3_two_key_blocks")]


@pytest.mark.mutation
@pytest.mark.parametrize("mutant, broken, case", MUTANT_CASES)
def test_mutants_fail(mutant, broken, case):
    errors = mutant_errors(case, mutant)
    assert all(errors[k] > MUTANT_MIN_ERROR for k in broken), errors


def test_every_mutant_has_a_case():
    assert sorted(m for m, _, _ in MUTANT_CASES) == sorted(READS_MUTANTS)


@pytest.mark.mutation
def test_key_block_mutant_needs_two_key_blocks():
    """The case reaches the multi-key-block path (and the mutant is invisible with one key block:
    the case is what catches it)."""
    assert key_blocks("L3_two_key_blocks") == 2 and key_blocks("L2_ragged") == 1
    assert max(mutant_errors("L2_ragged", "last_key_block_only").values()) < 1e-5


def test_bad_inputs_fail_early():
    x, tables, meta = make_case("L3_one_chunk")
    args = [x["q"], x["r"], x["o0"], x["states"], tables.read_row, meta["scale"]]
    with pytest.raises(ValueError, match=r"r must have shape"):
        reads_fwd(args[0], args[1][..., :2], *args[2:])
    with pytest.raises(ValueError, match=r"states must have dtype"):
        reads_fwd(*args[:3], args[3].double(), *args[4:])
    with pytest.raises(ValueError, match=r"read_row must have shape \(3, 1\)"):
        reads_fwd(*args[:4], tables.read_row[:2], meta["scale"])
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
    # bitwise in float32 (both runs store into a float32 dq: the same kernel); in bf16 at most one
    # bf16 ulp apart (the two compiled variants may contract the float32 products into FMAs
    # differently before the one rounding)
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


def test_a_mutant_whose_text_is_gone_fails_loudly():
    """A plant must match its kernel exactly once: a kernel edited under it cannot make the
    mutant silently the correct code."""
    with pytest.raises(AssertionError, match="exactly once"):
        with planted(Plant(_FWD, "reads_fwd_kernel", "text that is not in the kernel", "x")):
            pass
    original = reads_bwd_module.reads_bwd_tokens_kernel
    with pytest.raises(AssertionError, match="found 2 times"):
        with planted(Plant(_BWD, "reads_bwd_tokens_kernel", "b_o0", "x")):
            pass
    assert reads_bwd_module.reads_bwd_tokens_kernel is original


# the higher levels' rows read one row early (clamped to the allocation's first): in range, wrong
SPLIT_MUTANT = Plant(_FWD, "state_row", "(i_row - S_LO)) * H + i_h) * K * V",
                     "tl.maximum(i_row - S_LO - 1, 0)) * H + i_h) * K * V",
                     rebind=((_FWD, "reads_fwd_kernel"), (_BWD, "reads_bwd_tokens_kernel")))


def split_run(name, mutant=False):
    """The case on one buffer, then on the same rows split at level 1's (``StoredStates``)."""
    from optimized.nested.stored_states import StoredStates

    x, tables, meta = make_case(name)
    whole = run(x, tables, meta["scale"], meta["block_v"])
    S1 = tables.row_offset[2]                       # level 1's rows come first
    split = {**x, "states": StoredStates(x["states"][:, :S1].clone(), x["states"][:, S1:].clone(),
                                         x["states"].shape[1])}
    with planted(SPLIT_MUTANT) if mutant else contextlib.nullcontext():
        parts = run(split, tables, meta["scale"], meta["block_v"])
    return whole, parts


@pytest.mark.parametrize("name", ["L4_extreme", "L3_two_key_blocks", "L3_batch2"])
def test_rows_split_in_two_allocations_read_the_same(name):
    """The reads kernels on the stored rows held as level 1's and the higher levels' allocations
    (the nested op's layout, ``optimized.nested.stored_states``) equal the one-buffer run bit for
    bit (``o, dq, dr, do0, dstates``): every level above 1 reads rows of the second allocation.
    Bit for bit by construction: the same kernels and constexprs; ``S_LO`` (which allocation a
    row is in) is a runtime argument the kernels do not specialise on."""
    whole, parts = split_run(name)
    for a, b in zip(whole, parts):
        assert torch.equal(a, b)


def test_rows_split_in_two_allocations_catch_a_shifted_row():
    """The broken twin (``SPLIT_MUTANT``) reads the second allocation one row early: the output
    and the router gradient no longer match the one-buffer run."""
    (o, dq, dr, *_), (o_m, dq_m, dr_m, *_) = split_run("L4_extreme", mutant=True)
    assert rel(o_m, o) > MUTANT_MIN_ERROR and rel(dr_m, dr) > MUTANT_MIN_ERROR


def test_forward_default_v_block():
    """V blocks of 128 for bfloat16 at 64 < K ≤ 128 only; the backward's blocks do not change."""
    assert forward_block_v(128, torch.bfloat16) == 128 and forward_block_v(112, torch.bfloat16) == 128
    assert forward_block_v(128, torch.float32) is None
    assert forward_block_v(64, torch.bfloat16) is None and forward_block_v(256, torch.bfloat16) is None
    assert block_sizes(128, 128, 4)[2] == 32


def test_forward_falls_back_without_the_shared_memory(monkeypatch):
    """The wide default needs more shared memory per program than some GPUs have: the launch's
    ``OutOfResources`` makes the forward run ``block_sizes``' default (the same output); an
    explicit ``block_v`` is not changed behind the caller's back. (The interpreter has no bf16
    dots: ``forward_block_v`` is patched to ask V blocks of 16 of a float32 case, which the fake
    launch refuses, the default there being 64.)"""
    from triton.runtime.errors import OutOfResources

    x, tables, meta = make_case("L2_ragged")
    args = (x["q"], x["r"], x["o0"], x["states"], tables.read_row, meta["scale"])
    want = reads_fwd(*args)
    kernel, tried = reads_fwd_module.reads_fwd_kernel, []

    class SmallGPU:
        def __getitem__(self, grid):
            def launch(*largs, BV, **kwargs):
                tried.append(BV)
                if BV == 16:
                    raise OutOfResources(163840, 101376, "shared memory")
                return kernel[grid](*largs, BV=BV, **kwargs)
            return launch

    monkeypatch.setattr(reads_fwd_module, "forward_block_v", lambda K, dtype: 16)
    monkeypatch.setattr(reads_fwd_module, "reads_fwd_kernel", SmallGPU())
    got = reads_fwd(*args)
    assert tried == [16, block_sizes(24, 40, 2)[2]] == [16, 64]
    assert torch.equal(got, want)       # bit for bit: both ran the kernel at the default V block (64)
    tried.clear()                                   # the refusal is remembered: no second one
    assert torch.equal(reads_fwd(*args), want) and tried == [64]
    with pytest.raises(OutOfResources):
        reads_fwd(*args, block_v=16)


@pytest.mark.parametrize("blocks", [(32, 32, 8), (128, 32, 8), (32, 64, 8), (16, 16, 4)], ids=str)
def test_token_kernel_blocks_match_float64(blocks):
    """The token kernel at other key and V blocks (``reads_bwd(tokens_blocks=…)``, reads_ab
    ``rtok-*``): its gradients agree with the float64 reference as at the default blocks. Case
    ``L3_batch2`` (K = 24, V = 40, B = H = 2): one ragged key block at 32 and up, two at 16; V in
    two blocks at 32 (the second 8 wide), three at 16."""
    x, tables, meta = make_case("L3_batch2")
    B, T, H, L, K = x["q"].shape
    dq = torch.full((B, T, H, L, K), 7.0, device=DEV)
    dr, do0, _ = reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                           tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], dq, block_v=meta["block_v"],
                           with_states=False, tokens_blocks=blocks)
    _, g = reference(x, tables, meta["read_index"], meta["scale"])
    errors = {"dr": rel(dr, g["r"]), "do0": rel(do0, g["o0"]), "dq": rel(dq[:, :, :, 1:], g["q"][:, :, :, 1:])}
    bounds = {k: tolerance("nested_reads", k, torch.float32) for k in errors}
    assert all(errors[k] <= bounds[k] for k in errors), (errors, bounds)
    assert bool((dq[:, :, :, 0] == 7.0).all())
    with pytest.raises(ValueError, match=r"powers of two ≥ 16"):
        reads_bwd(x["do"], x["q"], x["r"], x["o0"], x["states"], tables.read_row, tables.row_level,
                  tables.row_chunk_lo, tables.row_chunk_hi, meta["scale"], dq, tokens_blocks=(24, 32, 8))
