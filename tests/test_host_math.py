"""``optimized.host_math``: the host's block counts and power-of-two sizes equal Triton's own
(``triton.cdiv``, ``triton.next_power_of_2``) wherever the launchers call them, and the launchers
call no Triton constexpr function from the host (each such call costs ≈ 100x the arithmetic)."""
import ast
import pathlib

import triton

from optimized.host_math import cdiv, next_power_of_2

SIZES = list(range(-3, 600)) + [2 ** 20 - 1, 2 ** 20, 2 ** 20 + 1, 3 * 2 ** 31, 2 ** 40 + 7]


def test_cdiv_equals_tritons():
    for n in SIZES:
        for b in (1, 2, 3, 7, 16, 32, 64, 100, 128):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_next_power_of_2_equals_tritons():
    for n in SIZES:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_twins_fail():
    """A floor division, and a power of two one step too high at exact powers, differ somewhere."""
    assert any(n // b != triton.cdiv(n, b) for n in SIZES for b in (16, 64))
    assert any((1 << n.bit_length() if n > 0 else 0) != triton.next_power_of_2(n) for n in SIZES)


def _jit(fn) -> bool:
    return any(any(w in ast.unparse(d) for w in ("jit", "autotune", "heuristics")) for d in fn.decorator_list)


def test_launchers_call_no_triton_constexpr_helper_from_the_host():
    root = pathlib.Path(__file__).resolve().parents[1] / "optimized"
    found = []
    for path in root.rglob("*.py"):
        stack = []

        class Visit(ast.NodeVisitor):
            def visit_FunctionDef(self, node):
                stack.append(node)
                self.generic_visit(node)
                stack.pop()

            def visit_Call(self, node):
                if ast.unparse(node.func) in ("triton.cdiv", "triton.next_power_of_2") and \
                        not any(_jit(fn) for fn in stack):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
                self.generic_visit(node)

        Visit().visit(ast.parse(path.read_text()))
    assert not found, found
