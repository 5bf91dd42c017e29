"""``pytest property_tests --scheme FILE.py``: the promotion-scheme battery (``ngdn.scheme_check``)
as one test per property, for a scheme author's CI (``-n auto`` spreads the properties).

Options (this conftest only; the root conftest is shared):
``--scheme FILE``        a .py file that calls ``register_scheme`` (or a module name such as
                         ``reference.schemes`` together with ``--scheme-name``); with it, only
                         ``test_scheme_battery.py`` runs and every other property test is deselected;
``--scheme-name NAME``   the scheme to check when FILE registers several (or a built-in);
``--scheme-examples N``  Hypothesis examples per property (default: ``ngdn scheme check``'s);
``--scheme-threshold X`` the stability threshold (default 1.001).
Each xdist worker imports FILE itself (registrations are per process).
"""
import pytest


def pytest_addoption(parser):
    group = parser.getgroup("ngdn scheme battery")
    group.addoption("--scheme", default=None, metavar="FILE",
                    help="run the promotion-scheme battery on the scheme FILE registers (only that)")
    group.addoption("--scheme-name", default=None, metavar="NAME", help="which scheme of FILE to check")
    group.addoption("--scheme-examples", type=int, default=None, metavar="N",
                    help="Hypothesis examples per property of the scheme battery")
    group.addoption("--scheme-threshold", type=float, default=None, metavar="X",
                    help="growth factor above which the scheme is expansive (default 1.001)")


def pytest_collection_modifyitems(config, items):
    """With ``--scheme``: keep only the battery's tests."""
    if config.getoption("--scheme") is None:
        return
    keep = [item for item in items if item.nodeid.split("::")[0].endswith("test_scheme_battery.py")]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def scheme_under_test(request):
    """``(source, scheme name)`` for ``--scheme``, imported once per process."""
    from ngdn import scheme_check

    source = request.config.getoption("--scheme")
    if source is None:
        pytest.skip("no --scheme FILE given (pytest property_tests --scheme FILE.py runs the scheme battery)")
    loaded = scheme_check.load_scheme_file(source)
    return source, scheme_check.pick_scheme(source, loaded, request.config.getoption("--scheme-name"))
