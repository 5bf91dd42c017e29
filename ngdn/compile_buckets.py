"""Compile buckets: which kernel sizes a kernel property draws, per device mode.

A Triton kernel compiles once per dtype and per value of its ``constexpr`` arguments:

- fla's GDN-2, GLA and KDA kernels (level 0, ``chunk_gdn2``, the 3D tensor state): ``H``,
  ``K``, ``V`` and flags such as "has an initial state"; ``T`` and ``B`` are runtime sizes;
- fla's log-linear kernels (``chunk_fenwick``) also the level count ``L``, the chunk count
  ``NT = ⌈T/64⌉`` and the scale, so there ``T`` picks a variant too;
- ours (promote scan, level-0 state gradient): ``H``, ``K``, ``V`` and the block sizes; the
  firing count, pair count ``n`` and ``T`` are runtime sizes (``do_not_specialize``), so level
  depth, schedules and query counts never compile anything new.

On CUDA every kernel property runs once per bucket of its family (a pytest parameter, so
pytest-xdist spreads the buckets over workers and GPUs) and draws only that bucket's
constexpr sizes: one test compiles one bucket's kernels, and everything else (``B``, the
runtime ``T``, seeds, schedules, schemes, query counts, gates, initial states) is still drawn
freely. The gpu profile's example budget is split over a family's buckets, so a test sees as
many examples in all as before.

Every bucket covers every blocking path of the kernels it reaches (``covered_paths`` checks it,
``tests/test_compile_buckets.py`` asserts it): more than one block and a ragged last block along
V (our ``BV = 32``, the reverse scan's 64; fla's V blocks; the bf16 forward reads' one block of
128 is split by the covering case's blocks of 32), K not a power of two (masked columns; fla's K
blocks of 64 at ``K > 64``), a ragged last chunk, and room for a ``learned`` firing with more pairs than one
pair block, the last ragged (``n > BN = 16``, ``covering_pairs``). Every scheme is drawn in every
bucket.

Under the interpreter nothing compiles: one bucket, ``cpu``, means "the CPU menu" (small
sizes, drawn freely), and the covering cases shrink the block sizes instead (``BV = BN = 16``).
"""
from __future__ import annotations

from typing import NamedTuple

from optimized import triton_mode


class Bucket(NamedTuple):
    """The constexpr sizes of one compile bucket; ``seq_lens`` are the lengths drawn in it
    (runtime for every kernel but fla's log-linear ones, where the range keeps ``NT`` and
    ``L`` fixed); ``E`` is the 3D tensor state's second key width (the flattened key is K·E);
    ``extra_levels`` the Fenwick levels beyond the minimum."""
    name: str
    H: int
    K: int
    V: int
    seq_lens: tuple
    E: int = 1
    extra_levels: int = 0


# Level 0 (fla GDN-2), the promote scan, the state-gradient kernel and the nested op.
# "a": K = 48 (one masked K block), V = 80 (three V blocks of 32, the last half empty).
# "b": K = 112 (fla's two K blocks of 64, the last ragged), V = 100 (four V blocks, the last
# 4 wide), two heads. T ≤ 320 in "b" bounds the float64 reference's cost (~10 s at L = 6).
LEVEL0 = (
    Bucket("a", H=1, K=48, V=80, seq_lens=(1, 17, 64, 100, 128, 130, 256, 320, 512)),
    Bucket("b", H=2, K=112, V=100, seq_lens=(1, 17, 64, 100, 130, 192, 320)),
)
# 3D tensor state, flattened onto fla's chunk_gla / chunk_kda with key width K·E (≤ 256 for KDA).
TENSOR3D = (
    Bucket("a", H=1, K=12, E=4, V=80, seq_lens=(1, 17, 64, 100, 128, 130)),
    Bucket("b", H=2, K=28, E=4, V=100, seq_lens=(1, 17, 64, 100, 128, 130)),
)
# Fenwick (fla's log-linear kernels): T ranges with one chunk count NT and one level count. Their
# kernels hold every level's state per program: K = V = 100 with 10 levels (the first menu) needed
# so much local memory per thread that its launch failed with "out of memory" while 15 other
# workers shared the H200 (run of 2026-11-30); "b" is smaller.
FENWICK = (
    Bucket("a", H=1, K=48, V=24, seq_lens=tuple(range(129, 193)), extra_levels=0),   # NT = 3, L = 9
    Bucket("b", H=2, K=80, V=40, seq_lens=tuple(range(65, 129)), extra_levels=1),    # NT = 2, L = 9
    Bucket("c", H=1, K=20, V=12, seq_lens=tuple(range(33, 65)), extra_levels=1),     # NT = 1, L = 8
)
FAMILIES = {"level0": LEVEL0, "tensor3d": TENSOR3D, "fenwick": FENWICK}

# The block size the CPU covering cases ask of the scan (its defaults: promote_scan.block_sizes).
CPU_BLOCK = 16


def buckets(family: str) -> tuple:
    """The family's buckets on CUDA; ``(None,)`` under the interpreter (the CPU menu)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown bucket family {family!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[family] if triton_mode.configure() == triton_mode.CUDA else (None,)


def bucket_params(family: str):
    """``pytest.param`` per bucket (ids ``a``, ``b``, … or ``cpu``), marked ``compiles`` so the
    suite plugin (``suite.plugin``) spreads the compiling tests evenly through the collection order."""
    import pytest

    return [pytest.param(b, id=b.name if b is not None else "cpu", marks=pytest.mark.compiles)
            for b in buckets(family)]


def on_bucket(shape, family: str = "level0", index: int = 0):
    """A fixed test shape (a NamedTuple with ``H, K, V`` and, for the 3D state, ``E``) as it is
    under the interpreter, or with the sizes of the family's bucket ``index`` on CUDA: the
    mutation and named cases then reuse kernels the bucket's tests compile (one compile set
    fewer per case) and reach the bucket's blocking paths."""
    bucket = buckets(family)[min(index, len(buckets(family)) - 1)]
    if bucket is None:
        return shape
    sizes = {f: getattr(bucket, f) for f in ("H", "K", "V", "E") if f in shape._fields}
    return shape._replace(**sizes)


def per_bucket(budget: int, family: str) -> int:
    """A test's example budget split over the family's buckets (at least 2 per bucket)."""
    return max(2, -(-budget // len(buckets(family))))


def covering_pairs(K: int, BN: int = 16) -> int:
    """The most pairs a ``learned`` firing with key width ``K`` can have whose last pair block of
    ``BN`` is ragged: ``K``, or ``K − 4`` where ``K`` is a multiple of ``BN`` (the buckets' K = 48
    and 112 are)."""
    return K - 4 if K % BN == 0 and K > BN + 4 else K


def covered_paths(V: int, BV: int, n: int, BN: int, T: int, K: int) -> dict:
    """Which blocking paths one draw reaches, by name (all must be True for a covering case)."""
    chunks = -(-T // 64)
    return {
        "three or more V blocks": -(-V // BV) >= 3,
        "ragged last V block": V % BV != 0,
        "more than one pair block": n > BN,
        "ragged last pair block": n % BN != 0,
        "K not a power of two (masked)": K & (K - 1) != 0,
        "more than one chunk": chunks > 1,
        "ragged last chunk": T % 64 != 0,
    }


def spread_evenly(items: list, heavy) -> list:
    """``items`` reordered so that those with ``heavy(item)`` sit at evenly spaced positions (the
    first at position 0) and the rest keep their order between them. Used by the suite plugin
    on the ``compiles`` tests: pytest-xdist hands each worker a contiguous share of the order,
    so every share gets a few compiling tests instead of one worker getting all of them."""
    hard = [item for item in items if heavy(item)]
    if not hard or len(hard) == len(items):
        return list(items)
    easy = [item for item in items if not heavy(item)]
    step = len(items) / len(hard)
    slots = {int(i * step) for i in range(len(hard))}
    hard_iter, easy_iter = iter(hard), iter(easy)
    return [next(hard_iter) if i in slots else next(easy_iter) for i in range(len(items))]
