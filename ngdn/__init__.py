"""Testbed plumbing: tolerances, seeded inputs, Hypothesis strategies, the ``ngdn`` CLI."""
