"""The compile clock the GPU suite's per-test log reads (``suite.compile_clock``), and the float32
dot precision the suite compiles fla's kernels with (``NGDN_F32_DOTS``): the two levers on its cold time."""
import time

from suite import compile_clock


def test_hooks_time_each_compile_and_reset_clears():
    compile_clock.reset()
    assert compile_clock._before(key="k") is False          # never asks Triton to skip the compile
    time.sleep(0.01)
    assert compile_clock._after(key="k") is False
    seconds, kernels = compile_clock.read()
    assert kernels == 1 and 0.005 < seconds < 5
    fn = type("Info", (), {"name": "kern"})()
    assert compile_clock._before(key="[('*fp32', 'D')]{'num_warps': 4}", fn=fn, repr="kern(...)") is False
    compile_clock._after()
    (first, s1), (second, s2) = compile_clock.compiled()
    assert first == "?|k" and second == "kern|[('*fp32', 'D')]{'num_warps': 4}" and s1 >= 0.005 and s2 >= 0
    compile_clock.reset()
    assert compile_clock.read() == (0.0, 0) and compile_clock.compiled() == []


def test_sink_gets_each_compile_as_a_per_test_log_line(tmp_path, monkeypatch):
    import json

    path = tmp_path / "tests.jsonl"
    monkeypatch.setitem(compile_clock._sink, "path", str(path))
    monkeypatch.setitem(compile_clock._sink, "label", "precompile::nested:a:float32")
    compile_clock.reset()
    for key in ("k1", "k2"):
        compile_clock._before(key=key)
        compile_clock._after()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["test"], e["when"], e["compiled"][0][0]) for e in lines] == [
        ("precompile::nested:a:float32", "compile", "?|k1"), ("precompile::nested:a:float32", "compile", "?|k2")]
    compile_clock.reset()


def test_install_leaves_a_foreign_hook_alone(monkeypatch):
    from triton import knobs

    def foreign(**kwargs):
        return False

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", foreign)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    assert compile_clock.install() is False
    assert knobs.runtime.jit_cache_hook is foreign and knobs.runtime.jit_post_compile_hook is None
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    assert compile_clock.install() is True
    assert knobs.runtime.jit_cache_hook is compile_clock._before


def test_float32_dot_precision_is_checked(monkeypatch):
    """``NGDN_F32_DOTS`` picks fla's float32 dots in tests: IEEE by default, or three TF32
    products; a precision that loses float32 accuracy is refused by name."""
    import pytest

    from optimized import triton_mode

    monkeypatch.delenv("NGDN_F32_DOTS", raising=False)
    assert triton_mode.f32_dots() == "ieee"
    monkeypatch.setenv("NGDN_F32_DOTS", "TF32x3")
    assert triton_mode.f32_dots() == "tf32x3"
    monkeypatch.setenv("NGDN_F32_DOTS", "tf32")
    with pytest.raises(ValueError, match="NGDN_F32_DOTS"):
        triton_mode.f32_dots()
