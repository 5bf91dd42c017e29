"""The compile buckets (``ngdn.compile_buckets``): every CUDA bucket reaches every blocking path of
the kernels it feeds, the example budget is split without loss, and the compiling tests are spread
through the run order. Pure arithmetic: runs in every mode, for the CUDA menus too."""
import pytest

from ngdn import compile_buckets as cb
from optimized.nested.promote_scan import block_sizes as scan_block_sizes
from optimized.nested.state_grad import block_sizes as state_grad_block_sizes


def level0_paths(bucket) -> dict:
    """Blocking paths one draw of this bucket can reach in our kernels, at their default blocks:
    the scan (V blocks, pair blocks for a learned firing with ``covering_pairs(K)`` pairs; the
    reverse scan's wider V blocks) and the state gradient (V blocks)."""
    n = cb.covering_pairs(bucket.K)
    _, BN, BV = scan_block_sizes(bucket.K, bucket.V, n)
    _, BV_state, _ = state_grad_block_sizes(bucket.K, bucket.V)
    ragged_T = max(t for t in bucket.seq_lens if t % 64)
    paths = cb.covered_paths(V=bucket.V, BV=BV, n=n, BN=BN, T=ragged_T, K=bucket.K)
    _, _, BV_reverse = scan_block_sizes(bucket.K, bucket.V, n, reverse=True)
    paths["reverse scan: more than one V block, the last ragged"] = (
        -(-bucket.V // BV_reverse) >= 2 and bucket.V % BV_reverse != 0)
    paths["state gradient: three or more V blocks, the last ragged"] = (
        -(-bucket.V // BV_state) >= 3 and bucket.V % BV_state != 0)
    paths["lengths: one token, below a chunk, whole chunks, a ragged last chunk"] = (
        1 in bucket.seq_lens and any(t < 64 for t in bucket.seq_lens)
        and any(t % 64 == 0 for t in bucket.seq_lens) and any(t > 64 and t % 64 for t in bucket.seq_lens))
    return paths


@pytest.mark.parametrize("bucket", cb.LEVEL0, ids=lambda b: b.name)
def test_level0_buckets_reach_every_blocking_path(bucket):
    paths = level0_paths(bucket)
    assert all(paths.values()), {p: ok for p, ok in paths.items() if not ok}


@pytest.mark.parametrize("bucket", cb.TENSOR3D + cb.FENWICK, ids=lambda b: b.name)
def test_fla_buckets_have_ragged_widths(bucket):
    """fla's kernels block K and V (masked past the width): widths that are not powers of two."""
    width = bucket.K * bucket.E
    assert width & (width - 1) and bucket.V & (bucket.V - 1), bucket


@pytest.mark.parametrize("bucket", cb.FENWICK, ids=lambda b: b.name)
def test_fenwick_buckets_fix_the_chunk_and_level_counts(bucket):
    """fla's log-linear kernels take the chunk count and level count as constexpr: one of each per bucket."""
    from reference.fenwick import min_levels

    assert len({-(-t // 64) for t in bucket.seq_lens}) == 1
    assert len({min_levels(t) for t in bucket.seq_lens}) == 1


@pytest.mark.mutation
def test_level0_check_catches_a_power_of_two_bucket():
    paths = level0_paths(cb.Bucket("pow2", H=1, K=64, V=64, seq_lens=(1, 17, 64, 130)))
    assert not paths["ragged last V block"] and not paths["three or more V blocks"]
    assert not paths["K not a power of two (masked)"]


def test_budget_is_split_without_loss():
    for family, menu in cb.FAMILIES.items():
        if cb.buckets(family) == (None,):      # CPU: one bucket, the whole budget
            assert cb.per_bucket(10, family) == 10
        else:
            assert cb.per_bucket(10, family) * len(menu) >= 10


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown bucket family"):
        cb.buckets("nope")


def evenly_spread(order) -> bool:
    """The heavy items start the order and sit at gaps that differ by at most one."""
    positions = [i for i, x in enumerate(order) if x[0] == "heavy"]
    gaps = [b - a for a, b in zip(positions, positions[1:])]
    return positions[:1] == [0] and (not gaps or max(gaps) - min(gaps) <= 1) and (
        len(positions) == len(order) or max(gaps, default=len(order)) > 1)


@pytest.mark.parametrize("n_items, n_heavy", [(10, 3), (400, 40), (7, 1), (12, 5)])
def test_spread_evenly_keeps_items_and_spaces_the_heavy_ones(n_items, n_heavy):
    items = [("heavy" if i >= n_items - n_heavy else "light", i) for i in range(n_items)]
    out = cb.spread_evenly(items, lambda x: x[0] == "heavy")
    assert sorted(out) == sorted(items)
    assert [x for x in out if x[0] == "light"] == [x for x in items if x[0] == "light"]   # order kept
    assert evenly_spread(out), out


@pytest.mark.parametrize("n_heavy", [0, 4])
def test_spread_evenly_leaves_all_light_or_all_heavy_alone(n_heavy):
    items = [("heavy", i) for i in range(n_heavy)] + [("light", i) for i in range(4 - n_heavy)]
    assert cb.spread_evenly(items, lambda x: x[0] == "heavy") == items


@pytest.mark.mutation
def test_spread_check_catches_heavy_tests_left_together():
    items = [("heavy", i) for i in range(3)] + [("light", i) for i in range(9)]
    assert not evenly_spread(items)
    assert evenly_spread(cb.spread_evenly(items, lambda x: x[0] == "heavy"))
