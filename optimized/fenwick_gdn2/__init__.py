"""Chunked Fenwick GDN-2 memory (docs/CONTRACT.md section 5, the GDN-2 variant): ``chunk_fenwick_gdn2``.

Same contract as ``reference.fenwick.naive_fenwick_gdn2``: every Fenwick bucket is a GDN-2
state, every token applies the same transition ``A_t = (I − k_t (b_t ⊙ k_t)^T) diag(e^{g_t})``
to every bucket and writes ``k_t (w_t ⊙ v_t)^T`` into its own level-0 bucket, buckets merge
as a binary counter, and ``o_t = scale · Σ_ℓ λ_t[ℓ] (S^(ℓ)_t)^T q_t``. Chunk size ``C = 64``.

Derivation
----------

Token s's write reaches token t ≥ s through ``Φ_{t,s} = A_t … A_{s+1}`` (identity for
s = t) and sits in bucket ``level(t, s)`` (CONTRACT section 5), so

    o_t = scale · Σ_{s ≤ t} λ_t[level(t, s)] · q_t^T Φ_{t,s} k_s (w_s ⊙ v_s)^T.        (1)

Levels across chunks. For C = 64 = 2^6 and t, s in different chunks c_t > c_s (0-based
chunk indices), ``t XOR s = 64 (c_t XOR c_s) + (t mod 64 XOR s mod 64)`` with
``c_t XOR c_s ≥ 1``, so

    level(t, s) = 1 + floor(log2(t XOR s)) = 6 + level_c(c_t, c_s),
    level_c(c, c') = 1 + floor(log2(c XOR c')) ≥ 1:

across chunks the buckets form a Fenwick counter over chunk indices (token level 6 + j is
chunk-level j); inside a chunk ``level(t, s)`` depends only on the local indices and is
0 … 6 (the bit length of ``t mod 64 XOR s mod 64``).

The chunk's WY form (fla's ``chunk_gdn2_fwd_intra``). With the in-chunk cumulative
log-decay ``G_t = Σ_{i ≤ t} g_i`` (from the chunk start), ``Lkk[t, s] = (b_t ⊙ k_t)·(e^{G_t−G_s} ⊙ k_s)``
for s < t and ``Akk = (I + Lkk)^{-1}``:

    w_wy = Akk (b ⊙ k ⊙ e^{G}),   u = Akk (w ⊙ v),   Aqk[t, s] = scale · q_t·(e^{G_t−G_s} ⊙ k_s) (s ≤ t)
    Φ_t (from the chunk start) = diag(e^{G_t}) − Σ_{s ≤ t} (e^{G_t−G_s} ⊙ k_s) w_wy_s^T
    Φ_{t,r} k_r = Σ_{r ≤ s ≤ t} (e^{G_t−G_s} ⊙ k_s) Akk[s, r]                               (2)

(induction on t: ``A_t Φ_{t−1}`` has this form with ``w_wy_t = b_t ⊙ k_t ⊙ e^{G_t} −
Σ_{s<t} Lkk[t, s] w_wy_s``; (2) because ``S_t = Σ_{s≤t} (e^{G_t−G_s} ⊙ k_s) u_s^T`` is the
chunk's state from zero for any values, and ``u = Akk (w ⊙ v)``).

Chunk c then has three parts.

- Its own tokens (levels 0 … 6), from (1) and (2): ``M = Aqk Akk`` is the intra-chunk
  GDN-2 attention (``M[t, r] = scale · q_t^T Φ_{t,r} k_r``), masked entrywise by the level
  weights: ``o_t += Σ_{r ≤ t} λ_t[level(t, r)] M[t, r] (w_r ⊙ v_r)``  (``intra.py``).
- Older chunks (token levels 6 + j, chunk-levels j = 1 … J): the read of a bucket state
  ``Z`` held at the chunk start is ``scale · q_t^T Φ_t Z = q̂_t^T Z`` with
  ``q̂_t = scale · (q_t ⊙ e^{G_t}) − Σ_{s≤t} Aqk[t, s] w_wy_s``, the same for every bucket:
  ``o_t += Σ_j λ_t[6 + j] q̂_t^T Z_j``, a router over stacked states. Computed as fla's
  GDN-2 output ``scale · qg Z + Aqk (−w_wy Z)``.
- Every bucket advances to the chunk end by ``Φ_C Z = diag(e^{G_C}) Z − kg^T (w_wy Z)``
  (``kg = k ⊙ e^{G_C − G}``, two matmuls per bucket), and the chunk's own end state from zero,
  ``E = kg^T u``, becomes chunk-level bucket 0; before chunk c + 1 the counter carries:
  with m the trailing ones of c, chunk-levels 0 … m merge (sum) into m + 1.

Final states: levels 6 + j (j = 1 … J) are the buckets after the last chunk; levels 0 … 6 are the last
chunk's own tokens split by ``level(T − 1, s)``:
``S^(ℓ) = kg^T Akk ([level(T−1, s) = ℓ] ⊙ w ⊙ v)``. In every other chunk those seven parts
sum to ``E``.

Layout: stacked values
----------------------

All bucket states of a chunk are stacked along V: ``NB = J + 1`` blocks of width V,
``J = bit length of the last absolute chunk index`` bucket blocks (block j − 1 holds
chunk-level j, token level 6 + j, read with ``λ[6 + j]``), then one own block, the chunk's
end state ``E``. Since the transition acts on the K side only, one GDN-2 chunk computation
with values ``v_st = [0, …, 0, v]``, write gates ``w_st = [0, …, 0, w]`` and pre-state
``h = [Z_1 … Z_J, 0]`` does every part at once: ``vn = u_st − w_wy h`` and
``end = diag(e^{G_C}) h + kg^T vn`` are each block's ``Φ_C Z_j`` and ``E``. The carry is a fixed
linear map between chunks (``states.py``). So fla's GDN-2 chunk pieces, forward and backward,
run unchanged on the stacked values; ours are the carry scan and the masked intra read.

The split of ``E`` by level is needed only for the final states (every carry merges all seven
own levels, m ≥ 0): a second pass over the last chunk alone, with no bucket blocks and seven
own blocks ``v ⊙ [level(T − 1, s) = ℓ]`` (write gates ``w`` on each), gives ``S^(0) … S^(6)``; its
backward adds the final states' gradient of levels 0 … 6 to that chunk's inputs. Without
``output_final_state`` that pass is skipped; a one-chunk call runs only the split pass. (Until
2026-11-30 every chunk carried the seven own blocks: ``J + 7`` blocks, 13 instead of 7 at
T = 4096.)

What runs where
---------------

Triton (ours): ``intra.py`` (masked level-weighted intra-chunk read, forward and backward,
including the backward through the WY inverse of its own ``Akk`` use), ``states.py``
(the chunk-level Fenwick scan: per-bucket advance, carry/merge, final states; and its
reverse), ``router.py`` (the λ-weighted sum of the bucket blocks' reads, read in place in the
stacked reads, and in the backward its ``dλ`` and the stacked output cotangent) and, in
cpu-interpret mode only, ``wy.py`` (the intra matrices ``Aqk``, ``Akk``; fla's
token-parallel kernel for them costs ~0.1 s per token and head under the interpreter).
Triton (fla-core 0.6.0, called, not copied): ``chunk_local_cumsum``, ``chunk_gdn2_fwd_intra``
(cuda mode), ``recompute_w_u_fwd_gdn2``, ``chunk_gla_fwd_o_gk`` (forward); ``chunk_kda_bwd_dAv``,
``chunk_gdn2_bwd_wy_dqkg_fused``, ``chunk_gdn2_bwd_intra``, ``chunk_local_cumsum``
(backward). PyTorch: stacking and unstacking the values (own-level masks), the initial-state
carry and its transpose. The backward is hand-written (a ``torch.autograd.Function``; no autograd inside),
deterministic (no atomics: one program per chunk, or per sequence, head and group of V columns
of every stacked block).

Packed rows
-----------

With ``cu_seqlens`` (``B = 1``, N sequences back to back; ``packing.py``) one launch set runs the
whole row, forward and backward. Each sequence keeps its own chunk grid from its first token
(its last chunk may be partial; a 1-token sequence is one partial chunk), and all sequences'
chunks in order form the packed grid (``chunk_indices``: sequence and local chunk index of each;
``chunk_offsets``: where each sequence's chunks start in it). fla's pieces take
``cu_seqlens``/``chunk_indices`` and index ``h``, ``dh`` by the packed grid. Ours: ``wy.py``
and ``intra.py`` run one program per packed-grid chunk and head, reading the chunk's sequence
and local index; ``states.py`` runs one program per (sequence, head, group of V columns),
walking that sequence's chunks with the carries of its LOCAL chunk index (its own Fenwick
counter) and writing its final states ``[N, H, L, K, V]`` from its own last chunk. One ``NB``
for the row, the longest sequence's: a shorter sequence's higher bucket blocks stay zero. The
split pass runs on a second packed row, every sequence's last chunk (``packing.last_chunks``;
a one-chunk sequence's whole chunk, so its tokens run in both passes); its gradients go back
to those rows. A row whose sequences are all one chunk long runs the split pass alone. A
constexpr ``IS_VARLEN`` selects the packed indexing: without ``cu_seqlens`` the kernels and
their grids are those of a ``[B, T]`` batch.

State passing (this op's contract; the reference has none)
-----------------------------------------------------------

``offset`` is the absolute index of the first token, a multiple of 64; ``level(t, s)`` is
that of the absolute positions. ``initial_state [B, H, L, K, V]`` (float32) is the bucket
states after token ``offset − 1``, as returned by ``output_final_state=True`` of the call that
ended there (same L in both calls; L ≥ 1 + ceil(log2(offset + T))). The token-level carry
``offset − 1 → offset`` (``offset − 1`` ends in ``6 + m0`` one-bits, m0 the trailing ones of
``offset/64 − 1``) sums levels ``0 … 6 + m0`` into level ``7 + m0`` and keeps every higher level;
the states are taken as given (what level ``7 + m0``, the carry target, holds is added to the
sum; a bucket that the counter says is empty is carried like any other). So splitting a sequence at a
multiple of 64 and passing ``(final states, offset)`` on equals one call, in value and in
gradient (the initial state is differentiable).

Dtypes: float32 everywhere; bfloat16 is accepted in cuda mode only (the interpreter's
bfloat16 dots are wrong, ``optimized.checks``); its properties passed on an H200 (worst 4.5e-3,
``tolerances.yaml``).
"""
from optimized.fenwick_gdn2.chunk import ChunkFenwickGDN2Function, chunk_fenwick_gdn2

__all__ = ["chunk_fenwick_gdn2", "ChunkFenwickGDN2Function"]
