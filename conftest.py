"""Root test configuration: the suite's pytest plugin, ``suite.plugin``.

Named here rather than in ``addopts`` (``-p``) because pytest puts this file's folder, the repository
root, on ``sys.path`` before it imports a root conftest: the plugin then loads from a bare checkout as
well as after ``pip install -e .``. pytest imports the plugin while it reads this conftest, before any
test module, and the plugin's import pins the worker's GPU and then chooses the Triton device mode
(before anything touches CUDA or imports fla or a kernel): see its docstring.
"""
pytest_plugins = ["suite.plugin"]
