"""``optimized.fits.first_that_fits``: forms tried in order past shared-memory refusals, the first
that fits remembered per launch key."""
from unittest import mock

import pytest
from triton.runtime.errors import OutOfResources

import optimized.fits as fits


def _forms(refused: int, ran: list):
    """Three forms; the first ``refused`` of them are refused for shared memory."""
    def form(i):
        def launch():
            ran.append(i)
            if i < refused:
                raise OutOfResources(262144, 232448, "shared memory")
            return i
        return launch
    return [form(i) for i in range(3)]


def _three_calls(first_that_fits) -> list:
    """The forms run by two calls with key "a" (two forms refused) and one with key "b" (none)."""
    ran = []
    with mock.patch.object(fits, "_FIRST_THAT_FITS", {}):
        assert first_that_fits("a", _forms(2, ran)) == 2
        assert first_that_fits("a", _forms(2, ran)) == 2
        assert first_that_fits("b", _forms(0, ran)) == 0
    return ran


def test_the_first_form_that_fits_runs_and_is_remembered():
    assert _three_calls(fits.first_that_fits) == [0, 1, 2, 2, 0]     # "b" starts at its first form


def test_the_last_forms_refusal_propagates_and_other_errors_pass_through():
    with mock.patch.object(fits, "_FIRST_THAT_FITS", {}):
        with pytest.raises(OutOfResources):
            fits.first_that_fits("c", _forms(3, []))

        def broken():
            raise ValueError("not a refusal")
        with pytest.raises(ValueError, match="not a refusal"):
            fits.first_that_fits("d", [broken, lambda: 1])


def test_remembering_catches_a_fallback_that_retries_every_call():
    def retry_every_call(key, forms):
        for form in forms[:-1]:
            try:
                return form()
            except OutOfResources:
                pass
        return forms[-1]()

    assert _three_calls(retry_every_call) == [0, 1, 2, 0, 1, 2, 0]


def test_one_stage_where_refused_runs_one_stage_after_a_refusal_and_remembers_it():
    calls = []

    def run(**stages):
        calls.append(stages.get("num_stages"))
        if "num_stages" not in stages:
            raise OutOfResources(131072, 101376, "shared memory")
        return "ran"

    with mock.patch.object(fits, "_FIRST_THAT_FITS", {}):
        assert fits.one_stage_where_refused("e", run) == "ran"
        assert fits.one_stage_where_refused("e", run) == "ran"
        assert fits.one_stage_where_refused("f", lambda **stages: stages) == {}
    assert calls == [None, 1, 1]
