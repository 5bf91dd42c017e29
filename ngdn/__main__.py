"""``python -m ngdn``: the ``ngdn`` command (``ngdn.cli``)."""
import sys

from ngdn.cli import main

sys.exit(main())
