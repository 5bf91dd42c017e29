"""Production Nested GDN-2 (CONTRACT sections 2 and 3): ``chunk_nested_gdn2``.

Layout (fla's op shape): ``plan`` (the schedule), ``probe``, ``reads_torch`` / ``reads_fwd`` /
``reads_bwd`` (the upper levels' reads and the router), ``stored_states`` (the rows they read),
``snapshot_reads`` (the probe's read of the level below, in place),
``probe_fused`` (the built-in schemes' probe with its hand-written backward), ``fwd`` and ``bwd``
(launch functions),
``function`` (input checks and the autograd Function), ``pieces`` (the op's choices and
swappable parts: block sizes, precisions, the alternatives benchmarks compare).

Computes exactly what ``reference.nested.naive_nested_gdn2`` computes (chunk size 64),
stage by stage, level by level (level ℓ depends only on level ℓ-1):

1. Level 0 (``optimized.nested.level0``): fla-core's chunked GDN-2 on ``q[..., 0, :]``; keeps
   the state at the end of every chunk (the snapshots level 1 probes), and fla's intermediates
   for its backward but the gates' chunk cumsum, which that backward makes again
   (``Pieces.level0_recompute``: the upper levels' backward, where the step peaks, runs without it).
   Its backward writes ``dg``, ``db``, ``dw`` in the inputs' dtype as the last pass over each
   stores them (``Pieces.level0_grads_in_input_dtype``; no cast pass after).
2. Probe (plain PyTorch, cuBLAS): for level ℓ ≥ 1 gather the snapshots of level ℓ-1
   at all of ℓ's firings and run the registered scheme's probe on all of them at once
   (``reference.schemes.get_scheme(name).probe`` on ``[B, F, H, K, V]``). The built-in
   schemes (``learned``, ``merge``, ``bounded_erase``) go through ``probe_fused``: one
   batched matmul against the stacked gate weights, the nonlinearities on slices, and a
   hand-written backward from the kept pre-activations (no replay); ``Pieces(fused_probe=
   False)`` selects the generic path. For the schemes with a query (``learned``,
   ``bounded_erase``) the snapshots are not gathered: ``snapshot_reads`` reads ``ν = Q M`` and,
   in the backward, ``dQ`` from the rows that hold them (fla's chunk states for level 1, the
   stored states for ℓ ≥ 2). Any other registered scheme: the forward runs its probe
   without a graph, the backward replays it with gradients on and differentiates it.
3. Update (``optimized.nested.promote_scan``): a Triton scan over ℓ's firings, one stored
   state per firing; a hand-written reverse scan for the backward.
4. Reads and router (``reads_fwd``, one Triton kernel): token t of chunk c reads level 0
   after its own write (fla's output) and level ℓ ≥ 1 as it stood when chunk c began (after
   ``⌊(c-1)/f_ℓ⌋`` firings), ``o_t = Σ_ℓ softmax(r_t)_ℓ · scale · M_ℓ^T q_t^(ℓ)``: the softmax
   in registers, every level's state by its row ``0 .. S`` of the stored states that the scans
   write into (``plan.device_tables``: the schedule's index tensors, cached per plan and
   device; ``stored_states``: level 1's rows and the higher levels' in two allocations, so
   the backward frees the second once level 2's reverse scan is done), ``q`` read in place,
   ``o`` written once. Its backward (``reads_bwd``): ``dq`` of
   levels ≥ 1 straight into the ``[B, T, H, L, K]`` buffer, the router gradient from
   ``do · Mᵀ`` (no recomputed reads), each state's gradient summed over the chunks that read
   it (no atomics). ``Pieces(reads_fwd=..., reads_bwd=...)`` with ``reads_torch``'s functions
   selects the PyTorch reads they replaced (``bench/reads_ab.py``, variant ``torch``).

Schedule (host integers only): ``N = ⌈T/64⌉`` chunks, ``N_full = ⌊T/64⌋`` full ones;
level ℓ fires at chunks ``c = m·f_ℓ ≤ N_full`` (``m = 1..F_ℓ``, 1-based), probing
level ℓ-1 as it stands after chunk c: for ℓ = 1 the level-0 state at the end of
chunk c, for ℓ ≥ 2 level ℓ-1's state after ``⌊c / f_{ℓ-1}⌋`` firings.

Backward, top level first: read and final-state gradients land on ℓ's stored
states, the reverse scan turns them into gradients of the pairs and of ℓ's initial
state, the probe replay into gradients of the scheme parameters and of the
snapshots, which are added to the stored states of level ℓ-1 (for level 0: injected
into the state-gradient recurrence of ``optimized.nested.state_grad``). No atomics and no
scatter with repeated indices anywhere: two runs give bitwise-identical results.

Packed sequences (``cu_seqlens``, ``B = 1``): one launch set for the row. ``plan.make_packed_plan``
concatenates every sequence's own schedule (its chunks from its first token, its firings, its
stored states, each level's rows in sequence order); fla's level 0 takes ``cu_seqlens``; the
state-gradient kernel, the scans (one program per sequence, head and V block) and the reads (one
program per chunk of a sequence) read their sequence's offsets from ``plan.PackedTables``; the
probe runs once over every sequence's firings. The one-sequence-per-row kernels are the same
code with the packed indexing compiled out (an ``IS_VARLEN`` constexpr).

States are float32; inputs float32 or bfloat16 (level 0 computes in the inputs'
dtype as fla does; probes and scan in float32; the reads' dots take bf16 operands, the float32
state split into two bf16 parts, so good to 2^-16; the output is written in q's dtype).
With the finiteness check off (``NGDN_CHECK_FINITE=0``) a step makes no host sync.
"""
from optimized.nested.function import NestedGDN2Function, _nested, chunk_nested_gdn2
from optimized.nested.pieces import DEFAULT_PIECES, Pieces
from optimized.nested.plan import Plan, make_plan

__all__ = ["chunk_nested_gdn2", "make_plan", "Plan", "Pieces", "DEFAULT_PIECES", "NestedGDN2Function", "_nested"]
