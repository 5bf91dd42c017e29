"""The README's runnable examples. ``examples/fixed_address.py`` is
exercised by ``tests/test_scheme_check.py``."""
import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_nested_side_by_side_agrees():
    """The README's side-by-side example runs and the optimized op matches the float64 reference."""
    errors = runpy.run_path(str(EXAMPLES / "nested_side_by_side.py"))["main"]()
    assert set(errors) == {"output", "state M_0", "state M_1", "state M_2"}
    for name, e in errors.items():
        assert e < 1e-5, f"{name}: relative error {e:.1e} >= 1e-5"
