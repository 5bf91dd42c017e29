"""The nested op launches at the CONTRACT ladder's widest firings on CUDA.

The properties draw query counts capped at ``min(K // 2, V)`` (``bounded_query_counts``: long
sequences stay finite), so no property reaches a level with n close to K, the ladder's top
levels at L ≥ 5 (``min(K, 16·2^(ℓ-1))``: n = 128 at K = 128 in ``ngdn bench``). There a kernel
whose blocks follow n can ask for more shared memory than the GPU gives a block and be refused
at launch: the reads' state-gradient kernel, folding 128 pairs in one block, asked 256 KiB of an
H200's 227 (bench/NOTES.md). This test runs one bf16 forward and backward at the nested compile
bucket's sizes (K = 112, V = 100: the same [128, 128] state blocks as K = V = 128, and the
bucket's level-0 kernels) with the full ladder 16, 32, 64, 112 over enough tokens for the top
level to fire twice, and checks that every gradient is finite; once more with level 1 at 48 pairs
(level 0's state-gradient kernel adds them in blocks of 32). Values are the properties' job.
"""
import pytest
import torch

from ngdn.compile_buckets import on_bucket
from ngdn.nested_inputs import NestedShape, nested_inputs
from optimized import chunk_nested_gdn2, triton_mode
from reference.nested import Level, default_query_counts

NAMES = ("q", "k", "v", "g", "b", "w", "r")
CUDA = triton_mode.MODE == triton_mode.CUDA


# the CONTRACT ladder; and level 1 with 48 pairs, past level 0's factored injection's pair block (32)
# but under K / 2 (firing every chunk, more would grow without bound: ngdn.nested_inputs)
COUNTS = {"ladder": None, "wide_level1": [48, 32, 64, 112]}


@pytest.mark.skipif(not CUDA, reason="shared memory refusals happen on a GPU (the pair blocks: "
                                     "tests/test_snapshot_grads.py on the interpreter)")
@pytest.mark.parametrize("counts", list(COUNTS))
def test_full_ladder_launches_at_the_widest_firings(counts):
    from optimized.nested.state_grad import FACTORED_BLOCK_N

    shape = NestedShape(B=2, T=1100, H=2, L=5, K=112, V=100)
    assert on_bucket(shape, "level0", 1) == shape                            # the bucket's compiled sizes
    counts = COUNTS[counts] or default_query_counts(shape.L, shape.K)
    assert counts[-1] == shape.K > 64                                        # past the fold's pair block
    assert COUNTS["wide_level1"][0] > FACTORED_BLOCK_N
    x = nested_inputs(shape, seed=0, query_counts=counts)
    dev = triton_mode.device()
    args = {n: x[n].to(dev, torch.bfloat16).requires_grad_() for n in NAMES}
    levels = [Level(lv.scheme, lv.interval, {n: p.to(dev, torch.float32).requires_grad_() for n, p in lv.params.items()},
                    lv.reduction) for lv in x["levels"]]
    assert shape.T // 64 >= 2 * levels[-1].interval                          # the top level fires twice
    o, _ = chunk_nested_gdn2(**args, levels=levels)
    o.backward(x["do"].to(dev, o.dtype))
    grads = {n: args[n].grad for n in NAMES}
    grads |= {f"level {i + 1} {n}": p.grad for i, lv in enumerate(levels) for n, p in lv.params.items()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), \
        [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
