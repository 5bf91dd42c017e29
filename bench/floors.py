"""FLOP and minimum-byte models for flat and nested GDN-2, and the floor times they give.

Every benchmark row gets a *floor*: the time the pass could not beat on this GPU,

    floor(pass) = max(FLOPs(pass) / R_matmul, bytes(pass) / BW_copy)

with ``R_matmul`` the measured bf16 matmul rate (FLOP/s) and ``BW_copy`` the
measured device-to-device copy bandwidth (read + write bytes per second). Forward
and backward are separate passes (separate kernel launches), so

    floor(forward + backward) = floor(forward) + floor(backward),

which is still a lower bound and tighter than one max over the summed work.
``time / floor`` says how far a measurement is from it.

FLOP model (products only)
--------------------------
Only matrix products are counted, a multiply-add as 2 FLOPs; elementwise work
(gates, exponentials, l2norm, sigmoid, the router softmax) is memory-bound and
left to the byte model. A causal (lower-triangular) ``C×C`` product counts half
of its dense size. Symbols: chunk ``C = 64``, key dim ``K``, value dim ``V``.

Chunked GDN-2 (fla's WY form), per head and per chunk of ``c ≤ C`` tokens,
forward (:func:`gdn2_chunk_flops`):

    intra-chunk C×C products
        A_kk = tril(k_b k_g^T)              c²K      (triangular)
        A_qk = tril(q_g k_g^T)              c²K      (triangular)
        T = (I + A_kk)^{-1}                 c³/3     (unit lower-triangular inverse)
        W = T (b ⊙ k ⊙ e^g)                 c²K      (triangular)
        U = T (w ⊙ v)                       c²V      (triangular)
        o_intra = A_qk v_new                c²V      (triangular)
    state read / update products
        v_new = U - W S                     2cKV
        o_inter = q_g S                     2cKV
        S <- diag(e^g) S + k_g^T v_new      2cKV

    total = 3c²K + 2c²V + c³/3 + 6cKV.

A sequence of ``T`` tokens is ``floor(T/C)`` full chunks plus one partial chunk of
``T mod C`` tokens. Flat GDN-2 with ``heads`` heads costs ``B · heads`` times that.

Nested GDN-2 (CONTRACT section 3), per batch element and head (:func:`nested_flops`):

    level 0                 the GDN-2 chunks above (H heads, not L·H)
    reads per level ℓ ≥ 1   each token reads every upper level:
                            per chunk q^(ℓ) [c, K] @ M_ℓ [K, V]  ->  2cKV, so 2TKV per level
    promote (one firing)    learned scheme, n queries (:func:`promote_flops`):
                                ν = Q M_below          2nKV     (probe matmul)
                                κ = ν W_K              2nVK
                                β = ν W_β              2nVK
                                ω = ν W_ω              2nV²
                                γ_i = ν W_γ            2nVK
                                e = (β ⊙ κ) M'         2nKV     (erase read)
                                M += κ^T (ω⊙ν - e)     2nKV     (write)
                            = 2n(6KV + V²)
                            merge scheme (n = K, κ = I, ν = M_below): only the three
                            gate products 2K(2KV + V²); the update is elementwise.
    firings of level ℓ      floor(floor(T / C) / f_ℓ): a partial last chunk never fires.

Backward: every forward product ``Y = A B`` needs ``dA = dY B^T`` and
``dB = A^T dY``, so backward FLOPs = 2 × forward FLOPs (no recomputation counted:
fla recomputes part of its forward in the backward, which a floor does not charge).

Minimum bytes
-------------
Each input read once, each output (and each state the caller asks for) written
once; nothing else. Activations are ``itemsize`` bytes (2 for bf16), states 4.

    forward   read  inputs;                  write o (and final states if asked)
    backward  read  inputs and do (and dht); write a gradient for every input
              (activations, router logits, scheme parameters, initial states)

Flat inputs per token and head: ``q, k, g, b`` (K each), ``v, w`` (V each).
Nested inputs per token and head: ``q`` (L·K), ``k, g, b`` (K each), ``v, w``
(V each), router logits ``r`` (L), plus the scheme parameters once
(:func:`scheme_param_elements`). This ignores the per-chunk states a chunked
backward must store or recompute (``B·H·N·K·V`` float32 for flat GDN-2), so the
byte floor is a true lower bound but not an achievable one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

CHUNK = 64
STATE_ITEMSIZE = 4  # states are float32 (CONTRACT conventions)


@dataclass(frozen=True)
class Cost:
    """Work of one configuration: FLOPs and minimum bytes, forward and backward."""
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float

    @property
    def fwdbwd_flops(self) -> float:
        return self.fwd_flops + self.bwd_flops

    @property
    def fwdbwd_bytes(self) -> float:
        return self.fwd_bytes + self.bwd_bytes


@dataclass(frozen=True)
class Floors:
    """Floor times in milliseconds for one :class:`Cost` at given rates."""
    fwd_ms: float
    bwd_ms: float

    @property
    def fwdbwd_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms


# --- FLOPs ---------------------------------------------------------------------------

def gdn2_chunk_flops(c: int, K: int, V: int) -> float:
    """Forward product FLOPs of one chunk of ``c`` tokens of GDN-2, one head:
    ``3c²K + 2c²V + c³/3 + 6cKV`` (see the module docstring)."""
    return 3 * c * c * K + 2 * c * c * V + c ** 3 / 3 + 6 * c * K * V


def gdn2_sequence_flops(T: int, K: int, V: int, chunk: int = CHUNK) -> float:
    """Forward product FLOPs of one head over ``T`` tokens: full chunks plus the partial one."""
    full, rest = divmod(T, chunk)
    flops = full * gdn2_chunk_flops(chunk, K, V)
    if rest:
        flops += gdn2_chunk_flops(rest, K, V)
    return flops


def promote_flops(n: int, K: int, V: int, scheme: str = "learned") -> float:
    """Product FLOPs of one firing for one head: ``2n(6KV + V²)`` (learned),
    ``2K(2KV + V²)`` (merge, n = K)."""
    if scheme == "learned":
        return 2 * n * (6 * K * V + V * V)
    if scheme == "merge":
        return 2 * K * (2 * K * V + V * V)
    raise ValueError(f"scheme must be 'learned' or 'merge' for the FLOP model, got {scheme!r}")


def firings(T: int, interval: int, chunk: int = CHUNK) -> int:
    """How often a level with firing interval ``interval`` fires over ``T`` tokens."""
    return (T // chunk) // interval


def flat_gdn2_flops(B: int, T: int, heads: int, K: int, V: int) -> float:
    """Forward product FLOPs of flat GDN-2 with ``heads`` heads."""
    return B * heads * gdn2_sequence_flops(T, K, V)


def nested_flops(B: int, T: int, H: int, K: int, V: int, query_counts: Sequence[int],
                 intervals: Sequence[int], scheme: str = "learned") -> float:
    """Forward product FLOPs of nested GDN-2 with ``L = len(query_counts) + 1`` levels:
    level-0 GDN-2, ``2TKV`` reads per upper level, and every firing's promote."""
    if len(query_counts) != len(intervals):
        raise ValueError(f"query_counts and intervals must both have L-1 entries, got "
                         f"{len(query_counts)} and {len(intervals)}")
    per_head = gdn2_sequence_flops(T, K, V)
    per_head += len(query_counts) * 2 * T * K * V
    for n, f in zip(query_counts, intervals):
        per_head += firings(T, f) * promote_flops(n, K, V, scheme)
    return B * H * per_head


# --- bytes ---------------------------------------------------------------------------

def scheme_param_elements(H: int, K: int, V: int, n: int, scheme: str = "learned") -> int:
    """Parameter count of one level: learned ``H(nK + 3VK + V²)`` (Q, W_K, W_β, W_γ, W_ω);
    merge ``H(2VK + V²)`` (W_β, W_γ, W_ω)."""
    if scheme == "learned":
        return H * (n * K + 3 * V * K + V * V)
    if scheme == "merge":
        return H * (2 * V * K + V * V)
    raise ValueError(f"scheme must be 'learned' or 'merge' for the byte model, got {scheme!r}")


def flat_gdn2_bytes(B: int, T: int, heads: int, K: int, V: int, itemsize: int,
                    initial_state: bool = False, output_final_state: bool = False) -> tuple[float, float]:
    """Minimum (forward, backward) bytes of flat GDN-2 with ``heads`` heads."""
    tokens = B * T * heads
    inputs = tokens * (4 * K + 2 * V) * itemsize
    out = tokens * V * itemsize
    state = B * heads * K * V * STATE_ITEMSIZE
    h0 = state if initial_state else 0
    ht = state if output_final_state else 0
    fwd = inputs + h0 + out + ht
    bwd = (inputs + h0 + out + ht) + (inputs + h0)  # read inputs, do, dht; write grads
    return fwd, bwd


def nested_bytes(B: int, T: int, H: int, K: int, V: int, L: int, itemsize: int,
                 param_elements: int, param_itemsize: int,
                 initial_states: bool = False, output_final_state: bool = False) -> tuple[float, float]:
    """Minimum (forward, backward) bytes of nested GDN-2 with ``L`` levels."""
    tokens = B * T * H
    inputs = tokens * (L * K + 3 * K + 2 * V + L) * itemsize + param_elements * param_itemsize
    out = tokens * V * itemsize
    states = L * B * H * K * V * STATE_ITEMSIZE
    h0 = states if initial_states else 0
    ht = states if output_final_state else 0
    fwd = inputs + h0 + out + ht
    bwd = (inputs + h0 + out + ht) + (inputs + h0)
    return fwd, bwd


# --- costs and floors ----------------------------------------------------------------

def flat_cost(B: int, T: int, heads: int, K: int, V: int, itemsize: int) -> Cost:
    """Cost of flat GDN-2 (``chunk_gdn2`` with ``heads`` heads), no initial/final states."""
    fwd = flat_gdn2_flops(B, T, heads, K, V)
    fwd_b, bwd_b = flat_gdn2_bytes(B, T, heads, K, V, itemsize)
    return Cost(fwd, 2 * fwd, fwd_b, bwd_b)


def nested_cost(B: int, T: int, H: int, K: int, V: int, query_counts: Sequence[int],
                intervals: Sequence[int], itemsize: int, param_itemsize: int,
                scheme: str = "learned", param_elements: int | None = None) -> Cost:
    """Cost of nested GDN-2, no initial/final states. ``param_elements`` defaults to
    :func:`scheme_param_elements` summed over the levels; the benchmark passes the
    actual parameter count."""
    L = len(query_counts) + 1
    if param_elements is None:
        param_elements = sum(scheme_param_elements(H, K, V, n, scheme) for n in query_counts)
    fwd = nested_flops(B, T, H, K, V, query_counts, intervals, scheme)
    fwd_b, bwd_b = nested_bytes(B, T, H, K, V, L, itemsize, param_elements, param_itemsize)
    return Cost(fwd, 2 * fwd, fwd_b, bwd_b)


def floor_ms(flops: float, nbytes: float, matmul_flops_per_s: float, copy_bytes_per_s: float) -> float:
    """Roofline floor of one pass in ms: ``max(FLOPs / R_matmul, bytes / BW_copy)``."""
    return 1e3 * max(flops / matmul_flops_per_s, nbytes / copy_bytes_per_s)


def floors(cost: Cost, matmul_flops_per_s: float, copy_bytes_per_s: float) -> Floors:
    """Forward and backward floors of ``cost``; forward+backward is their sum."""
    return Floors(floor_ms(cost.fwd_flops, cost.fwd_bytes, matmul_flops_per_s, copy_bytes_per_s),
                  floor_ms(cost.bwd_flops, cost.bwd_bytes, matmul_flops_per_s, copy_bytes_per_s))
