"""``python -m bench ...``: the benchmarks' command line (``bench.cli``), as ``ngdn bench ...``."""
import sys

from bench.cli import main

sys.exit(main())
