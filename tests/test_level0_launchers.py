"""Level 0's backward launches fla's WY and intra kernels itself (``optimized.nested.level0``:
``level0_bwd_wy``, ``level0_bwd_intra``, ``add_key_block_partials``) so that ``dg, db, dw`` come
out in the inputs' dtype and ``db``'s key-block partials are added without a copy.

In float32 every gradient equals fla's own launchers (``chunk_gdn2_bwd_wy_dqkg_fused``,
``chunk_gdn2_bwd_intra``) bit for bit. In a narrower ``grad_dtype`` the interpreter (float16: it
has no bf16) gives fla's float32 result cast, bit for bit. On CUDA (bf16) it did not always: in
one run 2 of 4 cases had ``dg`` (fla's reverse cumsum storing bf16) differ from the float32
result cast in some elements, with the autotuners pinned, so not a different configuration; the
cause is not isolated (a kernel compiled to store bf16 is another binary). There the gradients are
compared with ``tolerances.yaml`` ``level0_launchers``, one bf16 rounding.

Key widths with whole key blocks only and with a ragged last block
(``optimized.nested.key_block_partials``' masked columns); B = 2, H = 2, a ragged last chunk; packed
sequences. Broken twins of the partials' add fail the comparison."""
import pytest
import torch

from ngdn.checks.nested_optimized import GATES, level0_injection_chunks
from ngdn.compile_buckets import on_bucket
from ngdn.inputs import GDN2Shape, gdn2_inputs
from ngdn.tolerances import assert_passes, compare
from optimized import triton_mode
from optimized.nested.level0 import CHUNK, injection_slots, level0_bwd, level0_fwd
import optimized.nested.level0 as level0_module
from optimized.nested.plan import device_tables, make_packed_plan

DEV = triton_mode.device()
NARROW = torch.bfloat16 if DEV == "cuda" else torch.float16
LENGTHS = (70, 30)
# the interpreter: K = 64 (two whole key blocks of 32) and K = 48 (one whole, one ragged of 16);
# on CUDA the level-0 buckets' sizes (K = 48 and 112: whole blocks and a ragged one), whose
# kernels the suite compiles anyway
SHAPES = [on_bucket(GDN2Shape(B=2, T=80, H=2, K=64, V=16), index=1),
          on_bucket(GDN2Shape(B=2, T=80, H=2, K=48, V=16), index=0)]


def fla_wy(s, g_cumsum, do, dh, dv, dw_dtype=torch.float32):
    """fla's launcher of the WY kernel (float32 ``dw``), in ``level0_bwd_wy``'s place."""
    from fla.ops.gdn2.chunk_bwd import chunk_gdn2_bwd_wy_dqkg_fused

    return chunk_gdn2_bwd_wy_dqkg_fused(q=s.q, k=s.k, v=s.v, v_new=s.v_new, g=g_cumsum, b=s.b, w_gate=s.w,
                                        A=s.Akk, h=s.h, do=do, dh=dh, dv=dv, scale=s.scale, chunk_size=CHUNK,
                                        **s.varlen())


def fla_intra(s, g_cumsum, dAqk, dAkk, dq, dk, db, dg, grad_dtype=torch.float32):
    """fla's launcher of the intra kernel (float32 ``db``), in ``level0_bwd_intra``'s place."""
    from fla.ops.gdn2.chunk_intra import chunk_gdn2_bwd_intra

    return chunk_gdn2_bwd_intra(q=s.q, k=s.k, g=g_cumsum, b=s.b, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk, db=db,
                                dg=dg, chunk_size=CHUNK, **s.varlen())


def grads(shape, packed: bool, grad_dtype) -> list:
    """Level 0's gradients (``dq, dk, dv, dg, db, dw, dh0``) for fixed inputs, with gradients
    injected on end-of-chunk states."""
    if packed:
        shape = shape._replace(B=1, T=sum(LENGTHS))
    x = gdn2_inputs(shape, seed=5)
    ins = [x[n].to(DEV, torch.float32) for n in GATES]
    tables = device_tables(make_packed_plan(LENGTHS, (1,)), DEV).packed if packed else None
    n_seq = len(LENGTHS) if packed else shape.B
    h0 = x["initial_state"][:1].expand(n_seq, -1, -1, -1).to(DEV, torch.float32).contiguous()
    o, _, h, saved = level0_fwd(*ins, scale=shape.K ** -0.5, initial_state=h0, packed=tables)
    N = h.shape[1]
    ends = level0_injection_chunks(shape.T, 3) if not packed else [0, N - 2]
    gen = torch.Generator().manual_seed(6)
    d_ends = torch.randn(o.shape[0], len(ends), shape.H, shape.K, shape.V, generator=gen).to(DEV)
    do = torch.randn(o.shape, generator=gen).to(DEV)
    slots = injection_slots(N, ends, DEV) if packed else None
    return list(level0_bwd(saved, do, d_ends=d_ends, end_chunks=ends, slots=slots, grad_dtype=grad_dtype))


def fla_grads(monkeypatch, shape, packed: bool) -> list:
    with monkeypatch.context() as m:
        m.setattr(level0_module, "level0_bwd_wy", fla_wy)
        m.setattr(level0_module, "level0_bwd_intra", fla_intra)
        return grads(shape, packed, torch.float32)


def assert_equal_cast(want: list, got: list, dtype):
    """``got`` is ``want`` with ``dg, db, dw`` cast to ``dtype``, bit for bit: the same kernels with
    the same constexprs and grids as fla's launchers (an autotuned kernel looked up with the same key
    gets the same config), and ``db``'s partials added with one float32 add per element, as fla's
    ``add_`` does (each column is in one key block), which rounds alike on any machine. In a
    narrower dtype only under the interpreter (CUDA: ``assert_close_narrow``)."""
    assert [g.dtype for g in got[3:6]] == [dtype] * 3
    for i, (a, b) in enumerate(zip(want, got)):
        assert (a is None and b is None) or torch.equal(a.to(b.dtype) if 3 <= i < 6 else a, b), i


def assert_close_narrow(want: list, got: list):
    """CUDA: ``got`` (``dg, db, dw`` in bf16) within ``level0_launchers`` of fla's float32 ``want``."""
    assert [g.dtype for g in got[3:6]] == [NARROW] * 3
    names = ("dq", "dk", "dv", "dg", "db", "dw", "dh0")
    assert_passes(compare("level0_launchers", NARROW, {n: (b, a) for n, a, b in zip(names, want, got)}))


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"K{s.K}")
def test_level0_launchers_equal_fla_then_cast(monkeypatch, shape, packed):
    want = fla_grads(monkeypatch, shape, packed)
    assert_equal_cast(want, grads(shape, packed, torch.float32), torch.float32)
    narrow = grads(shape, packed, NARROW)
    if DEV == "cuda":
        assert_close_narrow(want, narrow)
    else:
        assert_equal_cast(want, narrow, NARROW)


def reversed_blocks(db, parts, dtype):
    """Broken twin: the key blocks' partials added in reverse block order."""
    return add_partials(db, parts.flip(0), dtype)


def whole_blocks_only(db, parts, dtype):
    """Broken twin: the ragged last block's columns never added (``db`` copied there)."""
    out = add_partials(db, parts, dtype)
    full = db.shape[-1] // parts.shape[-1] * parts.shape[-1]
    out[..., full:] = db[..., full:].to(dtype)
    return out


add_partials = level0_module.add_key_block_partials


@pytest.mark.parametrize("twin", [reversed_blocks, whole_blocks_only], ids=lambda f: f.__name__)
def test_level0_launchers_catch_a_broken_partials_add(monkeypatch, twin):
    """The property above fails on each twin, at the ragged key width (K = 48 on the interpreter,
    the first bucket's on CUDA: two key blocks, the last ragged)."""
    shape = SHAPES[1]
    want = fla_grads(monkeypatch, shape, packed=False)
    monkeypatch.setattr(level0_module, "add_key_block_partials", twin)
    got = grads(shape, False, torch.float32)
    with pytest.raises(AssertionError):
        assert_equal_cast(want, got, torch.float32)


def test_add_key_block_partials_against_a_float64_sum():
    """The kernel alone against the sum in float64: whole key blocks only and a ragged last one,
    B·T·H = 222 rows (four row blocks of ``ROWS = 64``, the last ragged); each element is the
    float32 sum, rounded once to a narrower output."""
    from optimized.nested.key_block_partials import ROWS

    gen = torch.Generator().manual_seed(0)
    B, T, H = 2, 37, 3
    assert B * T * H > 3 * ROWS and B * T * H % ROWS
    for K, BK in ((64, 32), (48, 32), (112, 32), (16, 16)):
        NK = -(-K // BK)
        db = torch.randn(B, T, H, K, generator=gen)
        parts = torch.randn(NK, B, T, H, BK, generator=gen)
        want = db.double() + parts.permute(1, 2, 3, 0, 4).reshape(B, T, H, NK * BK)[..., :K].double()
        db, parts = db.to(DEV), parts.to(DEV)
        # exact: each element is one float32 add (each column lies in one key block), correctly
        # rounded on any machine; float64 holds that sum of two float32 values exactly
        assert torch.equal(add_partials(db, parts, torch.float32).cpu(), want.float()), K
        assert torch.equal(add_partials(db, parts, NARROW).cpu(), want.float().to(NARROW)), K
        # the same comparison on the twin with the key blocks' order reversed fails
        assert not torch.equal(reversed_blocks(db, parts, torch.float32).cpu(), want.float()) or NK == 1, K


def test_level0_bwd_rejects_a_grad_dtype_that_is_not_floating_point():
    for bad in (torch.int32, "bfloat16", None):
        with pytest.raises(ValueError, match="grad_dtype must be"):
            level0_bwd(None, None, grad_dtype=bad)
    if DEV == "cpu":            # the interpreter's stores do not round to bf16 as torch does
        with pytest.raises(ValueError, match="interpreter"):
            level0_bwd(None, None, grad_dtype=torch.bfloat16)


def test_add_key_block_partials_rejects_bad_layouts():
    db = torch.zeros(2, 3, 2, 48, device=DEV)
    parts = torch.zeros(2, 2, 3, 2, 32, device=DEV)
    for bad_db, bad_parts, match in ((db, parts[:1], "parts must be"), (db, parts[..., :16], "parts must be"),
                                     (db.double(), parts, "float32"), (db, parts.transpose(1, 2), "parts must be"),
                                     (db.transpose(1, 2).contiguous().transpose(1, 2), parts, "contiguous")):
        with pytest.raises(ValueError, match=match):
            add_partials(bad_db, bad_parts, torch.float32)
    if DEV == "cpu":
        with pytest.raises(ValueError, match="interpreter"):
            add_partials(db, parts, torch.bfloat16)
    with pytest.raises(ValueError, match="optimized ops run on"):
        add_partials(db.to("meta"), parts.to("meta"), torch.float32)
