"""The promotion-scheme battery (``ngdn.scheme_check``) from pytest: one test per property on the
scheme of ``--scheme FILE.py`` (see ``property_tests/conftest.py``); skipped without it.

    pytest property_tests --scheme my_scheme.py -n auto

A failure's message is the report row with the (shrunk or worst) example and the one-line
``ngdn scheme check ... --draw`` command that reproduces it."""
import pytest

from ngdn import scheme_check
from ngdn.testing import on_cuda


@pytest.mark.parametrize("name", scheme_check.PROPERTY_NAMES)
def test_scheme_property(name, scheme_under_test, request):
    source, scheme = scheme_under_test
    prop = scheme_check.get_property(name)
    if prop.cuda_only and not on_cuda():
        pytest.skip(f"{name}: needs CUDA")
    examples = request.config.getoption("--scheme-examples") or scheme_check.DEFAULT_EXAMPLES
    threshold = request.config.getoption("--scheme-threshold") or scheme_check.DEFAULT_THRESHOLD
    row = scheme_check.run_property(prop, scheme, examples, threshold)
    text, ok = scheme_check.report(source, scheme, [row], threshold)
    if row.verdict == "n/a":
        pytest.skip(f"{name}: does not apply to scheme {scheme!r}")
    assert ok, text
