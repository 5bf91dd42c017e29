"""The benchmarks' command line: ``ngdn bench ...`` and ``python -m bench ...``.

``SUBCOMMAND ARGS`` runs that subcommand's module (``bench.SUBCOMMANDS``), anything else is the
Nested vs flat GDN-2 benchmark's options (``bench.nested_vs_flat``). Each module is imported only
when its command runs (they import torch and the kernels), and each parses its own options.
``ngdn bench`` forwards here by module name at run time (``ngdn.cli``): the library does not
import the benchmarks, they import it.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from bench import SUBCOMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]][0]).main(argv[1:])
    from bench.nested_vs_flat import main as nested_vs_flat_main

    return nested_vs_flat_main(argv)
