"""The nested step's memory peak on the CPU (``bench.memory_cpu``'s tally: the step's own storages,
inputs not counted) with the reverse scans' per-V-block partials kept for the probe's gates
(``promote_scan.keep_partials``, the default) and summed by adds first (``sum_partials``), side by
side at K = V = 128 (two V blocks of 64 in the reverse scan), L = 4 and 6, B = 1, T = 512, H = 2,
float32 under the interpreter.

Run from the repository root: python results/2026-12-04-nested-partials-memory-cpu/memory_ab.py"""
from bench.memory_at_peak import peak_blocks
from bench.memory_cpu import nested_step, record
from optimized.checks import finite_checks
from optimized.nested import Pieces
from optimized.promote_scan import keep_partials, sum_partials

B, T, H, K = 1, 512, 2, 128
for L in (4, 6):
    for name, reduce in (("keep_partials", keep_partials), ("sum_partials", sum_partials)):
        step, known = nested_step(B, T, H, K, K, L, pieces=Pieces(reduce_partials=reduce))
        with finite_checks(False):
            step()
            for t in known:
                t.grad = None
            events = record(step, known)
        peak, _, at = peak_blocks(events)
        print(f"L={L} {name:14s} peak {peak / 2**20:.3f} MiB (event {at} of {len(events)})", flush=True)
