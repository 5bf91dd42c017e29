"""The harness ``optimized.triton_mode`` installs under Triton's interpreter: autotuners pinned to
their largest blocks, and a ``@triton.jit`` helper that patches ``triton.language`` once per launch.
Both change what the interpreter costs, never what a kernel computes."""
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from optimized import triton_mode

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
