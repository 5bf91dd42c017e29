"""The recall benchmark's task and training set-up (``bench.recall_model``, ``bench.recall``), the
checks that a model can learn it at all: every label is the value of an earlier pair, due as the
token after the query key; the answer is never in the input before it is due; loss and accuracy
count the answers only; the learning-rate schedule; and every parameter of the nested and flat
models gets a finite, non-zero gradient (float64 reference backend). About 20 s on a 2-core CPU."""
import math

import pytest
import torch

from bench import recall
from bench.recall_model import (IGNORE, PAD, RecallModel, Vocab, check_mqar, loss_and_accuracy, mqar_batch,
                                n_queries)


@pytest.mark.parametrize("filler", ["pad", "noise"])
@pytest.mark.parametrize("T, kv_pairs, query_every", [(64, 4, 8), (256, 8, 8), (256, 8, 4), (128, 8, 10 ** 6),
                                                      (32, 8, 2)])
def test_every_label_is_the_value_of_an_earlier_pair(filler, T, kv_pairs, query_every):
    vocab = Vocab(64, filler)
    B, n = 8, kv_pairs
    tokens, labels = mqar_batch(B, T, n, vocab, torch.Generator().manual_seed(T + n), query_every)
    assert tokens.shape == labels.shape == (B, T) and tokens.dtype == labels.dtype == torch.long
    k0, k1 = vocab.keys()
    v0, v1 = vocab.values()
    nq = n_queries(T, n, query_every)
    for i in range(B):
        keys, values = tokens[i, 0:2 * n:2].tolist(), tokens[i, 1:2 * n:2].tolist()
        assert all(k0 <= k < k1 for k in keys) and len(set(keys)) == n
        assert all(v0 <= v < v1 for v in values)
        pair = dict(zip(keys, values))
        where = (labels[i] != IGNORE).nonzero().flatten().tolist()
        assert len(where) == nq
        asked = []
        for t in where:
            # The label at t is the next token due: the value of the key read at t, which was
            # written as a pair before t; the answer slot t + 1 holds filler, not the value.
            assert t >= 2 * n and t % 2 == 0 and t + 1 < T
            assert tokens[i, t].item() in pair and labels[i, t].item() == pair[tokens[i, t].item()]
            assert not (v0 <= tokens[i, t + 1].item() < v1)
            asked.append(tokens[i, t].item())
        assert set(asked) == set(keys)                 # every key is queried at least once
        if query_every >= T:
            assert sorted(asked) == sorted(keys)       # Zoology's layout: each key exactly once
        # No value token anywhere after the pairs: no answer can be copied from the input.
        rest = tokens[i, 2 * n:]
        assert not ((rest >= v0) & (rest < v1)).any()
        if filler == "pad":
            assert set(rest.tolist()) <= set(keys) | {PAD}


def test_queries_per_sequence():
    assert n_queries(512, 8, 8) == (512 - 16) // 8
    assert n_queries(8192, 8, 8) == (8192 - 16) // 8
    assert n_queries(64, 16, 8) == 16                 # at least one query per key
    assert n_queries(512, 8, 10 ** 6) == 8
    with pytest.raises(ValueError, match="query_every"):
        check_mqar(64, 4, Vocab(64), 1)


def test_loss_and_accuracy_count_answers_only():
    gen = torch.Generator().manual_seed(0)
    tokens, labels = mqar_batch(4, 64, 4, Vocab(32), gen)
    logits = torch.randn(4, 64, 32, generator=gen)
    mask = labels != IGNORE
    loss, acc = loss_and_accuracy(logits, labels)
    other = logits.clone()
    other[~mask] = torch.randn(int((~mask).sum()), 32, generator=gen) * 100      # non-answer positions
    loss2, acc2 = loss_and_accuracy(other, labels)
    assert loss2.item() == loss.item() and acc2.item() == acc.item()
    assert math.isclose(loss.item(), torch.nn.functional.cross_entropy(logits[mask], labels[mask]).item(),
                        rel_tol=1e-6)
    perfect = torch.zeros(4, 64, 32)
    perfect[mask] = torch.nn.functional.one_hot(labels[mask], 32).float() * 50
    loss3, acc3 = loss_and_accuracy(perfect, labels)
    assert acc3.item() == 1.0 and loss3.item() < 1e-6
    # The logits at t are scored against the label at t (the next token): shifting them by one fails.
    assert loss_and_accuracy(perfect.roll(1, dims=1), labels)[1].item() == 0.0


def test_learning_rate_schedule():
    steps, lr = 200, 3e-3
    model = torch.nn.Linear(4, 4)
    opt, sched = recall.optimizer_for(model, lr, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warm = steps // 10
    assert lrs[0] == pytest.approx(lr / warm) and lrs[warm - 1] == pytest.approx(lr)
    assert all(a < b for a, b in zip(lrs[:warm - 1], lrs[1:warm]))                # linear warm-up
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))                # then cosine down
    assert 0 < lrs[-1] < 0.01 * lr


@pytest.mark.parametrize("arm", ["flat", "learned"])
def test_every_parameter_gets_a_gradient(arm):
    """One backward of a tiny model on the float64 reference backend. T = 192 holds three chunks,
    so level 1 fires twice before a read and its erase and decay weights count."""
    from layers import GDN2, NestedGDN2
    from optimized import triton_mode

    torch.manual_seed(0)
    if arm == "flat":
        make = lambda i: GDN2(16, num_heads=2, head_dim=8, backend="reference")  # noqa: E731
    else:
        make = lambda i: NestedGDN2(16, num_heads=1, head_dim=8, num_levels=2, scheme=arm,  # noqa: E731
                                    backend="reference")
    device = triton_mode.device()      # the layers' Triton pieces run on the mode's device only
    model = RecallModel(32, 16, 2, make).to(device)
    tokens, labels = mqar_batch(2, 192, 4, Vocab(32), torch.Generator().manual_seed(0))
    loss, _ = loss_and_accuracy(model(tokens.to(device)), labels.to(device))
    loss.backward()
    missing = [name for name, p in model.named_parameters()
               if p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.abs().max() > 0]
    assert not missing, f"no finite non-zero gradient: {missing}"
