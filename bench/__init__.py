"""Benchmarks (GPU). ``python -m bench.nested_vs_flat`` or ``ngdn bench``; see bench/README.md."""
