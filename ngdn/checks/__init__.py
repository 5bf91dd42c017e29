"""The testbed's checks as a library: each property a function ``(implementation, draw) -> errors``.

The property tests (``property_tests/``), ``ngdn check``, ``ngdn scheme check`` and the GPU
suite's precompile pool all import these modules, so each measures the same thing against the
same ``tolerances.yaml``. A check takes the implementation it checks as an argument (the real
op by default), so a test can hand it a broken twin and show the property fails.

Modules: ``gdn2``, ``nested`` (promote and the nested reference), ``nested_optimized``,
``tensor3d``, ``fenwick``, ``fenwick_gdn2``, and ``generic`` (the properties every op of the
table ``ngdn.ops`` gets). Importing a module that runs an optimized op chooses the device mode.
"""
