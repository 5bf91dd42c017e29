"""``bench.stage_peaks`` on a fake allocator and a fake module with ``stage`` stages."""
import contextlib
import types

from bench import stage_peaks


class FakeCounter:
    def __init__(self):
        self.allocated, self.high = 100, 100      # 100 bytes before the step (its inputs)

    def alloc(self, n):
        self.allocated += n
        self.high = max(self.high, self.allocated)

    def free(self, n):
        self.allocated -= n

    def reset(self):
        self.high = self.allocated

    def peak(self):
        return self.high

    def now(self):
        return self.allocated


def run(counter):
    """The fake step through ``stage_peaks.record``: returns ``(peaks, ranges entered, module)``."""
    entered = []

    @contextlib.contextmanager
    def original(name):
        entered.append(name)
        yield

    module = types.SimpleNamespace(stage=original)

    def step():
        with module.stage("a"):
            counter.alloc(50)
            counter.free(30)                   # a: peak 50, leaves 20
        counter.alloc(70)                      # between: 90
        counter.free(70)
        for size in (10, 40):                  # b twice: peaks 30 and 60 above the base
            with module.stage("b"):
                counter.alloc(size)
                counter.free(size)

    return stage_peaks.record(step, modules=[module], counter=counter), entered, module, original


WANT = {stage_peaks.BETWEEN: 90, "a": 50, "b": 60}


def test_each_stage_gets_its_own_peak_and_the_ranges_are_restored():
    peaks, entered, module, original = run(FakeCounter())
    assert peaks == WANT
    assert entered == ["a", "b", "b"]          # the op's own ranges still run (the profiler sees them)
    assert module.stage is original
    text = stage_peaks.write_table(None, "t", peaks, total_peak=90)
    assert text.index(stage_peaks.BETWEEN) < text.index("`b`") < text.index("`a`")


def test_the_property_catches_a_recorder_that_never_resets():
    """The broken twin: without the reset on entry every stage after ``a`` would show the earlier
    stages' peak; the property's expected peaks tell it apart."""
    counter = FakeCounter()
    counter.reset = lambda: None
    peaks, *_ = run(counter)
    assert peaks != WANT and peaks["b"] == 90
