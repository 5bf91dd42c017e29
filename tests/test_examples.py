"""The runnable examples of README.md and docs/. ``examples/fixed_address.py`` is exercised by
``tests/test_scheme_check.py`` (and ``tests/test_readme.py`` checks the pages quote it as written)."""
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_nested_side_by_side_agrees():
    """docs/schemes.md's side-by-side example runs and the optimized op matches the float64 reference."""
    errors = runpy.run_path(str(EXAMPLES / "nested_side_by_side.py"))["main"]()
    assert set(errors) == {"output", "state M_0", "state M_1", "state M_2"}
    for name, e in errors.items():
        assert e < 1e-5, f"{name}: relative error {e:.1e} >= 1e-5"


def test_readme_reference_example_runs(capsys):
    """README's "Read a reference as the spec" snippet runs: the torch reference and its NumPy twin agree."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("python") and "naive_gdn2_numpy" in b]
    assert len(blocks) == 1, "README should hold one python block calling naive_gdn2_numpy"
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert float(capsys.readouterr().out.split()[-1]) < 1e-12
