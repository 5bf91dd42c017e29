"""Benchmarks (GPU). ``ngdn bench`` (``bench.cli``: ``bench.nested_vs_flat`` and its subcommands); see
bench/README.md."""

# ``ngdn bench SUBCOMMAND``: the module whose ``main(argv)`` runs it and its one-line summary. One
# table for the dispatch (``bench.cli``) and for the list in ``ngdn bench --help``.
SUBCOMMANDS = {
    "long-context": ("bench.long_context", "accuracy of Nested and flat GDN-2 against their float64 "
                                           "references as T grows (CSV + plot)"),
    "fenwick-gdn2": ("bench.fenwick_gdn2", "the Fenwick GDN-2 memory against flat GDN-2: time and peak "
                                           "memory per token as T grows"),
    "recall": ("bench.recall", "associative recall (MQAR): small Nested and flat GDN-2 models trained "
                               "per context length"),
}


def subcommands_help() -> str:
    """The subcommand list printed by ``ngdn bench --help``: one line each, ``ngdn bench NAME --help``
    for its options."""
    width = max(map(len, SUBCOMMANDS))
    lines = ["subcommands (`ngdn bench NAME --help` for each one's options):"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    return "\n".join(lines)
