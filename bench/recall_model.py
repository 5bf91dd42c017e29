"""Model and data of the associative-recall benchmark (``bench.recall``).

``mqar_batch``: multi-query associative recall in the style of Zoology's MQAR. A sequence of T
tokens opens with ``kv_pairs`` key-value pairs ``k_1 v_1 … k_n v_n`` (keys distinct within a
sequence, drawn from the key range; values from the value range), then the query section: one
query per ``query_every`` of its tokens (at least ``kv_pairs``), each a key of the pairs at a
random even offset, uniform over the section (so most queries lie far from the pairs at long T).
The first ``kv_pairs`` queries cover every key once, in random order; the rest draw their key
uniformly. The model reads the query key and must emit its value as the next token: labels hold
the value at each query position and ``-100`` (ignored) everywhere else, so loss and accuracy
count answers only. As in Zoology the answer is not echoed into the input (the token after a
query is filler): every answer must come from the pairs at the start, never from an earlier
query. With ``query_every >= T`` each key is queried once (Zoology's layout). Filler is one pad
token (``"pad"``, as Zoology) or random tokens from a noise range (``"noise"``: the memory must
also ignore writes it does not need).

``RecallModel``: token embedding, ``n_layers`` pre-norm blocks (RMSNorm → mixer → residual,
RMSNorm → SwiGLU MLP → residual), final RMSNorm, untied output head. The mixer is any
``[B, T, D] → [B, T, D]`` layer of fla's signature (``layers.NestedGDN2``, ``layers.GDN2``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
IGNORE = -100
DEFAULT_QUERY_EVERY = 8


@dataclass(frozen=True)
class Vocab:
    """Token ranges: 0 is the pad token, then keys, values and (filler ``noise``) noise tokens."""
    size: int
    filler: str = "pad"

    def __post_init__(self):
        if self.filler not in ("pad", "noise"):
            raise ValueError(f"filler must be 'pad' or 'noise', got {self.filler!r}")
        if self.size < 7:
            raise ValueError(f"vocab size must be >= 7, got {self.size}")

    @property
    def parts(self) -> int:
        return 3 if self.filler == "noise" else 2

    @property
    def n_keys(self) -> int:
        return (self.size - 1) // self.parts

    def keys(self) -> tuple[int, int]:
        return 1, 1 + self.n_keys

    def values(self) -> tuple[int, int]:
        return 1 + self.n_keys, 1 + 2 * self.n_keys

    def noise(self) -> tuple[int, int]:
        return 1 + 2 * self.n_keys, 1 + 3 * self.n_keys


def n_queries(T: int, kv_pairs: int, query_every: int) -> int:
    """Queries per sequence: one per ``query_every`` tokens after the pairs, at least ``kv_pairs``."""
    return max(kv_pairs, (T - 2 * kv_pairs) // query_every)


def check_mqar(T: int, kv_pairs: int, vocab: Vocab, query_every: int = DEFAULT_QUERY_EVERY) -> None:
    if kv_pairs < 1:
        raise ValueError(f"kv_pairs must be >= 1, got {kv_pairs}")
    if query_every < 2:
        raise ValueError(f"query_every must be >= 2 (a query and its answer slot), got {query_every}")
    if kv_pairs > vocab.n_keys:
        raise ValueError(f"kv_pairs = {kv_pairs} needs at least that many distinct keys; the vocabulary of "
                         f"{vocab.size} has {vocab.n_keys}")
    if 4 * kv_pairs > T:
        raise ValueError(f"T = {T} is too short for kv_pairs = {kv_pairs}: the pairs and their queries need "
                         f"4 * kv_pairs = {4 * kv_pairs} tokens")


def mqar_batch(B: int, T: int, kv_pairs: int, vocab: Vocab, generator: torch.Generator,
               query_every: int = DEFAULT_QUERY_EVERY):
    """``(tokens [B, T] int64, labels [B, T] int64)`` on the CPU from ``generator``."""
    check_mqar(T, kv_pairs, vocab, query_every)
    n, nq = kv_pairs, n_queries(T, kv_pairs, query_every)
    k0, _ = vocab.keys()
    v0, v1 = vocab.values()
    keys = torch.argsort(torch.rand(B, vocab.n_keys, generator=generator), dim=1)[:, :n] + k0
    values = torch.randint(v0, v1, (B, n), generator=generator)
    if vocab.filler == "noise":
        tokens = torch.randint(*vocab.noise(), (B, T), generator=generator)
    else:
        tokens = torch.full((B, T), PAD, dtype=torch.long)
    tokens[:, 0:2 * n:2], tokens[:, 1:2 * n:2] = keys, values
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    # Query slots: pairs of positions (p, p + 1) after the pairs; the key at p (its label: the
    # value, the token to emit next), filler at p + 1 (the answer is not echoed).
    slots = (T - 2 * n) // 2
    pos = 2 * n + 2 * torch.argsort(torch.rand(B, slots, generator=generator), dim=1)[:, :nq]
    which = torch.cat([torch.argsort(torch.rand(B, n, generator=generator), dim=1),
                       torch.randint(0, n, (B, nq - n), generator=generator)], dim=1)
    tokens.scatter_(1, pos, keys.gather(1, which))
    labels.scatter_(1, pos, values.gather(1, which))
    return tokens, labels


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, d: int, mixer: nn.Module, mlp_ratio: int):
        super().__init__()
        self.norm1, self.mixer = nn.RMSNorm(d, eps=1e-5), mixer
        self.norm2, self.mlp = nn.RMSNorm(d, eps=1e-5), SwiGLU(d, mlp_ratio * d)

    def forward(self, x):
        x = x + self.mixer(self.norm1(x))[0]
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Embedding, blocks over ``make_mixer(layer_idx)``, final norm, output head."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, make_mixer, mlp_ratio: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, make_mixer(i), mlp_ratio) for i in range(n_layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def top_state_norms(self, tokens) -> list[float]:
        """Per layer, the mean over sequences of ``‖M_{L-1}‖`` (Frobenius over heads, K, V), the
        top level's final state after ``tokens`` (nested mixers only; ``[]`` otherwise)."""
        norms = []
        x = self.embed(tokens)
        for block in self.blocks:
            h = block.norm1(x)
            if hasattr(block.mixer, "num_levels"):
                y, states = block.mixer.forward_with_states(h)
                norms.append(states[-1].float().flatten(1).norm(dim=1).mean().item())
            else:
                y = block.mixer(h)[0]
            x = x + y
            x = x + block.mlp(block.norm2(x))
        return norms


def loss_and_accuracy(logits, labels):
    """Cross-entropy and accuracy over the answer positions only (``labels != -100``)."""
    mask = labels != IGNORE
    picked = logits[mask].float()
    target = labels[mask]
    loss = F.cross_entropy(picked, target)
    acc = (picked.argmax(-1) == target).float().mean()
    return loss, acc
