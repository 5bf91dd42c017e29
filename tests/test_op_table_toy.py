"""An op added to the table gets every generic property and its bad inputs with no other edit.

The toy op is a per-token decayed cumulative sum, ``o_t = exp(g_t) · o_{t-1} + v_t`` per head
(``v [B, T, H, V]``, ``g [B, T, H]``, state ``[B, H, V]``), with a float64 token-by-token
reference and an "optimized" PyTorch twin that computes it in one shot from cumulative log-decays.
Both take ``initial_state``, ``output_final_state`` and ``cu_seqlens`` and validate their inputs
with the project's checks. The test adds ONE entry to the op table at run time (its sample, covering
draw, edge shapes, tolerance component and error inputs: nothing else is edited), runs every generic
property of ``ngdn.checks.generic`` (``generic.battery``) and ``ngdn check``'s agreement on it, runs the bad-input cases
(the common ones of ``tests/test_bad_inputs.py`` the toy's checks cover, and its entry's own), and
shows a broken twin (the passed state dropped) fails the state-passing property and the battery. Pure PyTorch at
tiny sizes: a few seconds on the CPU.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch

import test_bad_inputs
from ngdn import agreement, ops
from ngdn.checks import generic
from ngdn.inputs import generator
from ngdn.tolerances import assert_passes, failures
from reference.validation import check_cu_seqlens, check_state_count, check_tensor, sequences


class ToyShape(NamedTuple):
    B: int
    T: int
    H: int
    V: int


# --- the toy op: its checks, its reference, its "optimized" twin ---------------------------------

def check_toy(v, g, initial_state, cu_seqlens, dtypes=(torch.float32, torch.float64)):
    check_tensor("v", v, 4, dtypes)
    check_tensor("g", g, 3, dtypes)
    B, T, H, V = v.shape
    if tuple(g.shape) != (B, T, H):
        raise ValueError(f"g must have shape [B, T, H] = {(B, T, H)}, got {tuple(g.shape)}")
    if initial_state is not None:
        check_tensor("initial_state", initial_state, 3, (torch.float32, torch.float64))
    if cu_seqlens is None:
        return [(b, b, 0, T) for b in range(B)]                    # (state row, batch row, start, end)
    check_cu_seqlens(cu_seqlens, B, T, v.device)
    N = len(cu_seqlens) - 1
    check_state_count("initial_state", initial_state, N, "[N, H, V]")
    return [(i, 0, s, e) for i, s, e in sequences(cu_seqlens)]


def per_sequence(scan, v, g, initial_state, output_final_state, cu_seqlens, dtypes):
    """Each sequence (a batch row, or a packed one) scanned from its own initial state."""
    pieces = check_toy(v, g, initial_state, cu_seqlens, dtypes)
    B, T, H, V = v.shape
    if not pieces:                                                 # B = 0: empty, on the inputs' graph
        final = v.sum(1) * 0 if initial_state is None else initial_state * 1
        return v * 1, (final if output_final_state else None)
    outs, finals = [], []
    for i, b, s, e in pieces:
        s0 = v.new_zeros(H, V) if initial_state is None else initial_state[i].to(v.dtype)
        o, final = scan(v[b, s:e], g[b, s:e], s0)
        outs.append(o)
        finals.append(final)
    o = torch.stack(outs) if cu_seqlens is None else torch.cat(outs)[None]
    return o, (torch.stack(finals).float() if output_final_state and v.dtype != torch.float64
               else torch.stack(finals) if output_final_state else None)


def token_by_token(v, g, s):
    outs = []
    for t in range(v.shape[0]):
        s = torch.exp(g[t])[:, None] * s + v[t]
        outs.append(s)
    return torch.stack(outs), s


def one_shot(v, g, s):
    """``o_t = exp(G_t) s_0 + Σ_{u ≤ t} exp(G_t − G_u) v_u`` with ``G`` the cumulative log-decay."""
    G = torch.cumsum(g, dim=0)                                       # [T, H]
    T = v.shape[0]
    causal = torch.ones(T, T, dtype=torch.bool, device=v.device).tril()[:, :, None]
    A = torch.exp(torch.where(causal, G[:, None] - G[None], torch.full_like(G[:, None] - G[None], -torch.inf)))
    o = torch.einsum("tuh,uhv->thv", A, v) + torch.exp(G)[:, :, None] * s
    return o, o[-1]


def toy_reference(v, g, initial_state=None, output_final_state=False, cu_seqlens=None):
    return per_sequence(token_by_token, v, g, initial_state, output_final_state, cu_seqlens,
                        (torch.float32, torch.float64))


def toy_op(v, g, initial_state=None, output_final_state=False, cu_seqlens=None):
    return per_sequence(one_shot, v, g, initial_state, output_final_state, cu_seqlens,
                        (torch.bfloat16, torch.float32))


# --- its entry -----------------------------------------------------------------------------------

def toy_sample(d: ops.Draw) -> ops.Sample:
    B, T, H, V = d.shape
    gen = generator(d.seed)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 2)
    s0 = torch.randn(B, H, V, generator=gen, dtype=torch.float64)
    return ops.Sample({"v": v, "g": g}, {"initial_state": s0}, {"output_final_state": True})


def toy_small_call(dtype=torch.float32, device=None):
    x = toy_sample(ops.Draw(ToyShape(B=2, T=8, H=1, V=8)))
    return {n: t.to(device or "cpu", dtype) for n, t in x.activations.items()}


def make_entry(op=toy_op) -> ops.OpInfo:
    return ops.OpInfo(
        "toy", op, toy_reference, toy_sample,
        covering=lambda: ops.Draw(ToyShape(B=2, T=100, H=2, V=12), seed=1),
        edge_shape=lambda B, T, H, K, V: ToyShape(B, T, H, V),
        tolerance="toy", second_order="supported",
        state_passing=ops.StatePassing("initial_state", ops.anywhere),
        small_call=toy_small_call,
        error_inputs=lambda: [ops.state_type_error("initial_state"),
                              *ops.packed_state_errors("initial_state", (1, 8), r"\[N, H, V\]")])


TOLERANCES = """
toy:
  any:
    float32: {output: 1.0e-5, final_state: 1.0e-5, dv: 1.0e-5, dg: 1.0e-5, dinitial_state: 1.0e-5}
"""


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """The toy entry in the op table (and its tolerance block) for this test only."""
    path = tmp_path / "tolerances.yaml"
    path.write_text(TOLERANCES)
    monkeypatch.setenv("NGDN_TOLERANCES", str(path))
    info = make_entry()
    monkeypatch.setattr(ops, "OPS", ops.OPS + (info,))
    monkeypatch.setitem(ops.BY_NAME, info.name, info)
    return ops.get("toy")


def test_a_toy_entry_gets_every_generic_property(toy):
    """``generic.battery``: every property of ``ngdn.checks.generic`` as the op-table tests draw them."""
    errors = generic.battery(toy)
    for prop in ("vs_reference", "bitwise", "grad_modes", "layouts", "uninitialised_memory", "second_order",
                 "state_passing", *(f"edge_shape {e}" for e in generic.EDGE_SIZES), "packed_equals_separate",
                 "packed_strided_cu_seqlens"):
        assert any(k.startswith(prop) for k in errors), f"{prop} did not run: {sorted(errors)}"
    assert_passes(errors)


def test_a_toy_entry_gets_ngdn_check(toy):
    assert "toy" in agreement._components()
    _, worst = agreement.component(toy)(torch.float32, 1, False)
    assert set(worst) == {"output", "final_state", "dv", "dg", "dinitial_state"}
    assert all(err <= bound for err, bound in worst.values()), worst


def test_a_toy_entry_gets_its_bad_inputs(toy):
    """Its own error inputs, and the common cases of ``tests/test_bad_inputs.py`` its checks cover
    (a list where a tensor belongs, float16, every bad ``cu_seqlens``, a packed call of two rows)."""
    for case in toy.error_inputs():
        for side in case.sides:
            test_bad_inputs.test_entry_error_inputs(toy, case, side)
    common = (toy.op, toy.reference, toy.small_call, "v")
    for side in ("optimized", "reference"):
        test_bad_inputs.test_a_list_where_a_tensor_belongs_is_a_type_error(*common, side)
    test_bad_inputs.test_float16_one_rule_for_every_optimized_op(*common)
    for case in range(len(test_bad_inputs.BAD_CU_SEQLENS)):
        test_bad_inputs.test_bad_cu_seqlens_refused(*common, case)
    test_bad_inputs.test_cu_seqlens_needs_one_row_and_a_tensor(*common)


def test_a_broken_toy_twin_fails_the_state_passing_property(toy):
    """The twin drops the passed state (every call starts from zeros): state passing fails, and so
    does the whole battery."""
    def dropped(initial_state=None, **kwargs):
        return toy_op(**kwargs)
    d = toy.covering()
    bad = failures(generic.state_passing(toy, d, torch.float32, toy.state_passing.splits(d)[0], op=dropped,
                                         log=False))
    assert bad and any(k.startswith("output") for k in bad), bad
    assert failures(generic.battery(toy, op=dropped))


def test_a_skip_in_the_entry_leaves_its_property_out(toy, monkeypatch):
    """A property the entry's ``skips`` names is not run (the reason says why it does not apply)."""
    monkeypatch.setitem(ops.BY_NAME, "toy", dataclasses.replace(toy, skips={"layouts": "the toy reads no strides"}))
    errors = generic.battery(ops.get("toy"))
    assert errors and not any(k.startswith("layouts") for k in errors)
