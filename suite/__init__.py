"""The test suite's machinery, apart from the library: the pytest plugin (``suite.plugin``, loaded by the
root ``conftest.py``) and what it runs: a GPU per xdist worker (``gpu_workers``), the workers' GPU
memory (``gpu_memory``), the kernels compiled before the tests (``precompile``), the run order
(``order``) and each test's compile time (``compile_clock``)."""
