"""Deliberately broken twins of the production Nested GDN-2 pieces: every property in
``ngdn.checks.nested_optimized`` must fail on one of them.

Each mutant has the signature of what it breaks and differs from it in one named way.
"""
from __future__ import annotations

import functools

import torch

from optimized.nested import Pieces, _nested, make_plan
from optimized.nested.promote_scan import Partials, block_sizes, promote_scan_bwd
from optimized.nested.state_grad import state_grad_bwd

SPLIT_V = 16     # the partial-sum mutants split V into blocks of 16 (V = 32: two blocks)


def state_grad_dropped_injection(qg, kg, w, gk, do, dv, scale, dht=None, ds=None, slots=None, want_dh0=False,
                                 block_v=None):
    """The state-gradient recurrence ignoring the injected end-of-chunk gradients."""
    return state_grad_bwd(qg, kg, w, gk, do, dv, scale, dht=dht, ds=None, slots=None, want_dh0=want_dh0,
                          block_v=block_v)


def drop_last_partial(partials: torch.Tensor) -> torch.Tensor:
    """Sums the per-V-block partial buffers but forgets the last block."""
    return partials[:-1].sum(0)


promote_scan_bwd_missing_partial_block = functools.partial(
    promote_scan_bwd, block_v=SPLIT_V, reduce_partials=drop_last_partial)
promote_scan_bwd_missing_partial_block.__name__ = "promote_scan_bwd_missing_partial_block"


def sum_outer_partials(partials: torch.Tensor) -> torch.Tensor:
    """Sums only the first and the last V block's partial buffers: with one or two V blocks
    this is the right sum, from three on it forgets the middle ones."""
    return partials[0] + partials[-1] if partials.shape[0] > 1 else partials[0]


def keep_outer_partials(partials: torch.Tensor, blocks: int | None = None):
    """``promote_scan.keep_partials`` handing the consumer only the first and the last V block's
    partial buffers: from three V blocks on, the gates' sum as they load them forgets the middle ones."""
    parts = partials if blocks is None else partials[:blocks]
    return Partials(parts[[0, -1]]) if parts.shape[0] > 1 else parts[0]


def promote_scan_fwd_blocks_in_sequence(M0, kappa, nu, beta, omega, gamma, block_v=None, block_n=None,
                                        out=None, precision="ieee"):
    """Applies a firing's pairs block by block, each block erasing from the state the previous
    blocks left (not from ``M'``), as the kernel would if it updated ``M'`` between pair
    blocks. Within a block the pairs act at once. Equal to the scan when ``n ≤ BN`` or when
    the keys of different blocks are orthogonal (``merge``); wrong for ``learned`` with
    ``n > BN``."""
    BN = block_sizes(kappa.shape[-1], nu.shape[-1], kappa.shape[3], block_v, block_n)[1]
    B, F, H, n, K = kappa.shape
    M = kappa.new_zeros(B, H, K, nu.shape[-1]) if M0 is None else M0.clone()
    states = [M]
    for m in range(F):
        M = torch.exp(gamma[:, m])[..., None] * M
        for lo in range(0, n, BN):
            k, b = kappa[:, m, :, lo:lo + BN], beta[:, m, :, lo:lo + BN]
            d = omega[:, m, :, lo:lo + BN] * nu[:, m, :, lo:lo + BN] - (b * k) @ M
            M = M + k.transpose(-1, -2) @ d
        states.append(M)
    states = torch.stack(states, dim=1)
    return states if out is None else out.copy_(states)


def promote_scan_fwd_sequential(M0, kappa, nu, beta, omega, gamma, block_v=None):
    """Applies the pairs of a firing one after another (pair i erases what pairs < i wrote),
    as a blocked kernel would if it updated ``M'`` between pair blocks. Order-dependent."""
    M = torch.zeros(kappa.shape[0], kappa.shape[2], kappa.shape[-1], nu.shape[-1], dtype=kappa.dtype,
                    device=kappa.device) if M0 is None else M0.clone()
    states = [M]
    for m in range(kappa.shape[1]):
        M = torch.exp(gamma[:, m])[..., None] * M
        for i in range(kappa.shape[3]):
            k, b = kappa[:, m, :, i], beta[:, m, :, i]
            e = torch.einsum("bhk,bhkv->bhv", b * k, M)
            M = M + k[..., None] * (omega[:, m, :, i] * nu[:, m, :, i] - e)[..., None, :]
        states.append(M)
    return torch.stack(states, dim=1)


plan_fires_late = functools.partial(make_plan, delay=1)
"""The schedule with every firing one chunk late (at chunk m·f + 1)."""


def chunk_nested_gdn2_fires_late(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                                 output_final_state=False):
    """Every level fires one chunk late (at chunk m·f + 1: probes that chunk's snapshot and is
    first read one chunk later)."""
    return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state,
                   pieces=Pieces(plan=plan_fires_late))


def chunk_nested_gdn2_dropped_injection(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                                        output_final_state=False):
    """Level 0's backward drops the gradient injected on its end-of-chunk states by level 1."""
    return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state,
                   pieces=Pieces(state_grad=state_grad_dropped_injection))


def chunk_nested_gdn2_missing_partial_block(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                                            output_final_state=False):
    """The scan's backward forgets the last V block's partial sums (dκ, dβ, dγ)."""
    return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state,
                   pieces=Pieces(block_v=SPLIT_V, reduce_partials=drop_last_partial))


def nested_with(pieces: Pieces):
    """``chunk_nested_gdn2`` built from ``pieces`` (block sizes, or a broken piece)."""
    def op(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False):
        return _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state, pieces=pieces)
    op.__name__ = "chunk_nested_gdn2_with_" + "_".join(
        f"{f}={getattr(pieces, f)}" for f in ("block_v", "block_n") if getattr(pieces, f) is not None)
    return op


_noise = torch.Generator().manual_seed(12345)


def chunk_nested_gdn2_nondeterministic(q, k, v, g, b, w, r, levels, scale=None, initial_states=None,
                                       output_final_state=False):
    """Adds run-dependent noise of one ulp's order to the output (a stand-in for an atomic
    reduction whose order changes between runs)."""
    o, finals = _nested(q, k, v, g, b, w, r, levels, scale, initial_states, output_final_state)
    eps = torch.rand((), generator=_noise).item() * 1e-6
    return o * (1 + eps), finals


# --- packed sequences: the kernels' per-sequence indexing, each broken in one named way --------

PACKED_TWINS = ("reads_on_packed_grid", "scan_on_previous_sequence", "snapshot_from_next_sequence",
                "state_grad_from_chunk_zero")


def packed_tables_twin(kind: str):
    """A ``device_tables`` twin whose packed-sequence tables are wrong in one way ``kind``:

    - ``reads_on_packed_grid``: the reads' chunks on the packed row's 64-token grid, not on
      each sequence's own (``chunk_bounds``);
    - ``scan_on_previous_sequence``: sequence i's scans run on sequence i-1's firings
      (``fire_offsets`` shifted by one sequence; the first has none);
    - ``snapshot_from_next_sequence``: a firing at a sequence's last (whole) chunk probes the
      next packed chunk's start (the next sequence's initial state), not the sequence's final
      state (a state carried across the sequence boundary), in the gathered snapshots' tables
      and in the in-place read's rows (``snap_rows``) alike;
    - ``state_grad_from_chunk_zero``: level 0's state-gradient kernel reads every sequence's
      chunks from the packed row's first (``chunk_offsets`` all 0).
    One sequence per row is left alone."""
    import dataclasses

    from optimized.nested.plan import device_tables

    if kind not in PACKED_TWINS:
        raise ValueError(f"unknown packed twin {kind!r}; known: {PACKED_TWINS}")

    def twin(plan, device):
        tables = device_tables(plan, device)
        p = tables.packed
        if p is None:
            return tables
        if kind == "reads_on_packed_grid":
            lo = torch.arange(plan.N, device=device, dtype=torch.int32) * 64
            p = dataclasses.replace(p, chunk_bounds=torch.stack([lo, torch.clamp(lo + 64, max=plan.T)], 1).contiguous())
        elif kind == "scan_on_previous_sequence":
            p = dataclasses.replace(p, fire_offsets=tuple(None if fo is None else torch.cat([fo[:1], fo[:-1]])
                                                          for fo in p.fire_offsets))
        elif kind == "snapshot_from_next_sequence":
            seq = p.final_seq.tolist()
            moved = [k for k, i in enumerate(seq) if i + 1 < len(plan.lengths)]
            kept = [k for k in range(len(seq)) if k not in moved]
            next_first = torch.tensor([plan.chunk_offset[seq[k] + 1] for k in moved], dtype=torch.long, device=device)
            p = dataclasses.replace(p, end_pos=torch.cat([p.end_pos, p.final_pos[moved]]),
                                    end_chunk=torch.cat([p.end_chunk, next_first]),
                                    final_pos=p.final_pos[kept], final_seq=p.final_seq[kept])
            level1 = tables.snap_rows[1].clone()        # the probe's in-place read: the same wrong rows
            level1[tables.packed.final_pos[moved]] = next_first.to(torch.int32)
            tables = dataclasses.replace(tables, snap_rows=(None, level1, *tables.snap_rows[2:]))
        else:
            p = dataclasses.replace(p, chunk_offsets=torch.zeros_like(p.chunk_offsets))
        return dataclasses.replace(tables, packed=p)
    return twin
