"""The harness ``optimized.triton_mode`` installs under Triton's interpreter: autotuners pinned to
their largest blocks, a ``@triton.jit`` helper that patches ``triton.language`` once per launch, and
NumPy stand-ins for fla's token-parallel intra kernels (``optimized.interpreter_substitutes``).
Each changes what the interpreter costs, never what a kernel computes."""
import math

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from optimized import interpreter_substitutes, triton_mode

pytestmark = pytest.mark.skipif(triton_mode.MODE != triton_mode.CPU_INTERPRET,
                                reason="the harness is installed under the interpreter only")


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 64, 32)], key=["n"])
@triton.jit
def _doubled_kernel(x, y, blocks, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    offs = i * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)
    tl.store(blocks + i, BLOCK)


@triton.jit
def _halved(v):
    return v * 0.5


@triton.jit
def _halved_four_times_kernel(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)
    for _ in range(4):
        v = _halved(v)
    tl.store(y + offs, v, mask=offs < n)


def _blocks_run(n: int) -> list:
    """The block of each program of one launch (``n`` is the autotuner's key: a new ``n`` is a
    new choice)."""
    x = torch.randn(n)
    y = torch.empty(n)
    blocks = torch.zeros(16, dtype=torch.int32)
    _doubled_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, blocks, n)
    assert torch.equal(y, x * 2)
    return blocks[blocks > 0].tolist()


def test_autotuners_run_the_config_with_the_largest_blocks():
    assert _blocks_run(150) == [64, 64, 64]


def test_block_check_catches_a_pin_to_the_first_config(monkeypatch):
    monkeypatch.setattr(triton_mode, "_block_volume", lambda config: 0)     # every config alike
    assert _blocks_run(151) == [16] * 10


def _patches_per_launch(launches: int) -> int:
    count = 0
    patch = interpreter._patch_lang

    def counted(fn):
        nonlocal count
        count += 1
        return patch(fn)

    x = torch.randn(40)
    y = torch.empty(40)
    interpreter._patch_lang = counted
    try:
        for _ in range(launches):
            _halved_four_times_kernel[(3,)](x, y, 40, BLOCK=16)
    finally:
        interpreter._patch_lang = patch
    assert torch.equal(y, x / 16)
    return count


def test_a_helper_patches_the_language_once_per_launch():
    # per launch: the grid's patch and the helper's first call; three programs call it 12 times
    assert _patches_per_launch(2) == 4


def test_patch_count_catches_a_helper_that_patches_at_every_call(monkeypatch):
    def patch_every_call(self, *args, **kwargs):       # the interpreter's own device call
        interpreter._patch_lang(self.fn)
        return self.rewrite()(*args, **kwargs)

    monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", patch_every_call)
    assert _patches_per_launch(2) == 2 * (1 + 12)


# --- stand-ins for fla's token-parallel intra kernels ---------------------------------------------

def _intra_run(family: str, shape: tuple, cu_seqlens=None, seed: int = 0):
    """``(Aqk, Akk)`` of one launch of fla's token-parallel intra kernel (``family`` "gdn2" or
    "kda"; ``shape`` ``(B, T, H, HV, K)``), both filled with NaN first so the entries the launch
    leaves alone stay NaN. Runs whatever ``interpreter_substitutes.SUBSTITUTES`` holds then."""
    from fla.ops.gdn2.chunk_intra_token_parallel import chunk_gdn2_fwd_intra_token_parallel
    from fla.ops.kda.chunk_intra_token_parallel import chunk_kda_fwd_intra_token_parallel
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    B, T, H, HV, K = shape
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    varlen = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    # gates out of the easy regime: decays down to 2^-8 a token, so a sub-chunk spans 2^-120
    g = chunk_local_cumsum(-8 * torch.rand(B, T, HV, K, generator=gen), scale=RCP_LN2, chunk_size=64, **varlen)
    Aqk = torch.full((B, T, HV, 64), math.nan)
    Akk = torch.full((B, T, HV, 16), math.nan)
    if family == "gdn2":
        b = torch.rand(B, T, H, K, generator=gen)
        chunk_gdn2_fwd_intra_token_parallel(q, k, g, b, Aqk, Akk, 0.3, **varlen)
    else:
        beta = torch.rand(B, T, HV, generator=gen)
        chunk_kda_fwd_intra_token_parallel(q, k, g, beta, Aqk, Akk, 0.3, **varlen)
    return Aqk, Akk


# (family, (B, T, H, HV, K), cu_seqlens): two chunks with a ragged sub-chunk, heads not a multiple of
# the pinned head block, K off a power of two (padded lanes), K = 1, packed sequences off the
# sub-chunk grid, KDA's value heads over fewer key heads
INTRA_DRAWS = {
    "gdn2-two-chunks": ("gdn2", (2, 70, 3, 3, 20), None),
    "gdn2-K1": ("gdn2", (2, 19, 2, 2, 1), None),
    "gdn2-packed": ("gdn2", (1, 75, 2, 2, 16), torch.tensor([0, 21, 22, 75])),
    "kda-gva": ("kda", (2, 35, 1, 2, 20), None),
    "kda-packed": ("kda", (1, 40, 2, 2, 16), torch.tensor([0, 17, 40])),
}


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _stand_in_vs_kernel(draw: str) -> bool:
    family, shape, cu = INTRA_DRAWS[draw]
    stood_in = _intra_run(family, shape, cu)
    held = dict(interpreter_substitutes.SUBSTITUTES)
    interpreter_substitutes.SUBSTITUTES.clear()         # fla's kernel itself, interpreted
    try:
        kernel = _intra_run(family, shape, cu)
    finally:
        interpreter_substitutes.SUBSTITUTES.update(held)
    assert not kernel[0].isnan().all(), "the kernel wrote nothing"
    return all(_bitwise(a, b) for a, b in zip(stood_in, kernel))


@pytest.mark.parametrize("draw", list(INTRA_DRAWS))
def test_stand_in_writes_the_kernels_bits(draw):
    """Every entry the kernel writes, bit for bit, and no other (the gaps stay NaN). Interpreter only
    (one machine, one NumPy), and bit for bit on any CPU by construction: the same elementwise float32
    NumPy functions, and each ``np.sum`` over a contiguous last axis of the same length ``BK`` (whose
    pairwise order depends on that length only), as the interpreted kernel's ``tl.sum``; no matmul."""
    assert _stand_in_vs_kernel(draw)


def _diagonal_dropped(args, grid):
    """A broken stand-in: each token's own column (``j = i``) never written."""
    interpreter_substitutes.gdn2_intra_token_parallel(args, grid)
    Aqk = args["Aqk"]
    t = torch.arange(Aqk.shape[1])
    Aqk[:, t, :, t % Aqk.shape[3]] = math.nan


def _gaps_zeroed(args, grid):
    """A broken stand-in: the entries the kernel leaves alone written as zeros."""
    args["Aqk"].zero_()
    args["Akk"].zero_()
    interpreter_substitutes.gdn2_intra_token_parallel(args, grid)


@pytest.mark.parametrize("broken", [_diagonal_dropped, _gaps_zeroed])
def test_stand_in_check_catches_a_broken_stand_in(monkeypatch, broken):
    key = ("fla.ops.gdn2.chunk_intra_token_parallel", "chunk_gdn2_fwd_kernel_intra_token_parallel")
    monkeypatch.setitem(interpreter_substitutes.SUBSTITUTES, key, broken)
    assert not _stand_in_vs_kernel("gdn2-two-chunks")


def test_fla_forwards_launch_the_stand_ins(monkeypatch):
    """fla's GDN-2 and KDA forwards reach both stand-ins (a renamed kernel would silently run
    interpreted again: slower, not wrong)."""
    calls = []
    for key, fn in list(interpreter_substitutes.SUBSTITUTES.items()):
        monkeypatch.setitem(interpreter_substitutes.SUBSTITUTES, key,
                            lambda args, grid, fn=fn, key=key: (calls.append(key[1]), fn(args, grid)))
    from fla.ops.gdn2.chunk_fwd import chunk_gdn2_fwd
    from fla.ops.kda import chunk_kda

    B, T, H, K = 1, 20, 2, 16
    x = [torch.randn(B, T, H, K) for _ in range(4)]
    g = -torch.rand(B, T, H, K)
    chunk_gdn2_fwd(q=x[0], k=x[1], v=x[2], g=g, b=torch.rand(B, T, H, K), w_gate=torch.rand(B, T, H, K),
                   scale=0.25, initial_state=None, output_final_state=False)
    chunk_kda(q=x[0], k=x[1], v=x[2], g=g, beta=torch.rand(B, T, H), scale=0.25)
    assert sorted(set(calls)) == ["chunk_gdn2_fwd_kernel_intra_token_parallel",
                                  "chunk_kda_fwd_kernel_intra_token_parallel"]
