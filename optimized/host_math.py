"""Integer helpers for launch code on the host: block counts and power-of-two sizes.

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions in current Triton, callable
from kernels; called from host code each goes through that wrapper (its arguments unwrapped one by
one), about 2 µs a call against 0.02 µs for the arithmetic. The nested op's launchers made ≈ 165 such
calls a step (L = 4), a few tenths of a millisecond of host time in a step the host can pace (head
dim 64: bench/NOTES.md). Kernels keep Triton's own (``tl.cdiv``, ``triton.next_power_of_2`` on
constexprs)."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0``: as ``triton.cdiv``."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n``, 0 for ``n <= 0``: as ``triton.next_power_of_2``."""
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
