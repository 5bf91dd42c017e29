"""CPU smoke tests of packed variable-length batches (``cu_seqlens``): the benchmark's code path
(``bench.varlen``) with stand-in ops, timer and device, and the NumPy twins' packed calls against
the torch references' (every reference loops over the sequences; these check the twins' loops)."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from bench import varlen
from bench.harness import CpuDevice, Hooks
from ngdn.fenwick_inputs import FenwickShape, fenwick_gdn2_inputs, fenwick_inputs
from ngdn.inputs import GDN2Shape, gdn2_inputs
from ngdn.nested_inputs import NestedShape, nested_inputs
from ngdn.tensor3d_inputs import Tensor3DShape, tensor3d_inputs
from reference import (naive_fenwick, naive_fenwick_gdn2, naive_fenwick_gdn2_numpy, naive_fenwick_numpy, naive_gdn2,
                       naive_gdn2_numpy, naive_nested_gdn2, naive_nested_gdn2_numpy, naive_tensor3d,
                       naive_tensor3d_numpy, quadratic_fenwick, quadratic_fenwick_numpy)

SEEN = []


def nested_stub(q, k, v, g, b, w, r, levels, scale=None, initial_states=None, output_final_state=False,
                cu_seqlens=None):
    """Cheap differentiable stand-in with the signature of optimized.nested.chunk_nested_gdn2."""
    SEEN.append(("nested", tuple(q.shape[:2]), None if cu_seqlens is None else cu_seqlens.tolist()))
    p = sum(x.float().mean() for lv in levels for x in lv.params.values())
    return v * w * torch.sigmoid((torch.softmax(r, -1)[..., :1] * q[..., 0, :] * k).sum(-1, keepdim=True)) + p, None


def flat_stub(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    SEEN.append(("flat", tuple(q.shape[:2]), None if cu_seqlens is None else cu_seqlens.tolist()))
    return v * w * torch.sigmoid((q * k * b).sum(-1, keepdim=True) + g.mean(-1, keepdim=True)), None


def test_bench_runs_packed_and_padded_and_writes_tables(tmp_path):
    SEEN.clear()
    args = varlen.parser().parse_args(["--quick", "--lengths", "5,9,3", "--out", str(tmp_path)])
    args = varlen.quick_defaults(args)
    hooks = Hooks(nested_op=nested_stub, flat_op=flat_stub, device=CpuDevice(), timer=varlen.wall_timer,
                  log=lambda message: None)
    rows = varlen.run(args, hooks, ["--quick"])
    assert [(r["op"], r["layout"]) for r in rows] == [("nested", "packed"), ("nested", "padded"),
                                                        ("flat", "packed"), ("flat", "padded")]
    assert not any(r["error"] for r in rows)
    assert ("nested", (1, 17), [0, 5, 14, 17]) in SEEN and ("flat", (3, 9), None) in SEEN
    assert rows[1]["computed_tokens"] == 27 and rows[0]["computed_tokens"] == rows[0]["tokens"] == 17
    assert rows[2]["heads"] == 4          # flat GDN-2 holds the nested state: L·H heads
    with open(tmp_path / "varlen.csv") as fh:
        table = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    assert len(table) == 4 and all(float(r["fwd_bwd_ms"]) > 0 for r in table)
    md = (tmp_path / "varlen.md").read_text()
    assert "| nested | padded | 3 × 9 |" in md and "Packed (cu_seqlens) vs padded batches" in md


def test_bench_records_an_op_error_and_goes_on(tmp_path):
    def broken(*args, **kwargs):
        raise ValueError("cu_seqlens refused")
    args = varlen.quick_defaults(varlen.parser().parse_args(["--quick", "--lengths", "4,2", "--out", str(tmp_path)]))
    rows = varlen.run(args, Hooks(nested_op=broken, flat_op=flat_stub, device=CpuDevice(), timer=varlen.wall_timer,
                                  log=lambda message: None))
    assert [bool(r["error"]) for r in rows] == [True, True, False, False]
    assert rows[0]["error"] == "ValueError: cu_seqlens refused"


def test_bench_warms_one_layout_without_timing(tmp_path):
    """``--layouts padded --warmup-only``: the padded rows only, one step each, nothing timed."""
    SEEN.clear()
    args = varlen.parser().parse_args(["--lengths", "5,9,3", "-L", "2", "-H", "2", "-K", "16", "-V", "16",
                                       "--dtype", "float32", "--layouts", "padded", "--warmup-only",
                                       "--out", str(tmp_path)])

    def timer(fn):
        raise AssertionError("--warmup-only must time nothing")
    rows = varlen.run(args, Hooks(nested_op=nested_stub, flat_op=flat_stub, device=CpuDevice(), timer=timer,
                                  log=lambda message: None))
    assert [(r["op"], r["layout"], r["error"]) for r in rows] == [("nested", "padded", ""), ("flat", "padded", "")]
    assert all(r["fwd_bwd_ms"] != r["fwd_bwd_ms"] for r in rows)          # NaN: not timed
    assert ("nested", (3, 9), None) in SEEN and ("flat", (3, 9), None) in SEEN


@pytest.mark.parametrize("flag, expected", [((), False), (("--check-finite",), True)])
def test_bench_times_with_the_finiteness_check_off_unless_asked(tmp_path, flag, expected):
    from optimized.checks import finite_checks_enabled

    seen = []

    def nested(*args, **kwargs):
        seen.append(finite_checks_enabled())
        return nested_stub(*args, **kwargs)
    args = varlen.quick_defaults(varlen.parser().parse_args(["--quick", "--lengths", "4,2", "--ops", "nested",
                                                             "--out", str(tmp_path), *flag]))
    varlen.run(args, Hooks(nested_op=nested, device=CpuDevice(), timer=varlen.wall_timer, log=lambda message: None))
    assert seen and set(seen) == {expected}
    assert ("ON (--check-finite)" if expected else "off (--check-finite turns it on)") in \
        (tmp_path / "varlen.md").read_text()


def test_bench_refuses_bad_lengths_and_ops():
    with pytest.raises(SystemExit):
        varlen.parser().parse_args(["--lengths", "4,0"])
    args = varlen.quick_defaults(varlen.parser().parse_args(["--quick", "--ops", "nested,gla"]))
    with pytest.raises(ValueError, match=r"--ops: unknown \['gla'\]"):
        varlen.run(args, Hooks(device=CpuDevice(), timer=varlen.wall_timer))
    args = varlen.quick_defaults(varlen.parser().parse_args(["--quick", "--layouts", "packed,ragged"]))
    with pytest.raises(ValueError, match=r"--layouts: unknown \['ragged'\]"):
        varlen.run(args, Hooks(device=CpuDevice(), timer=varlen.wall_timer))


# --- the NumPy twins' packed calls ---------------------------------------------------------------------

LENGTHS = (3, 1, 6)
CU = np.array([0, 3, 4, 10], dtype=np.int64)


def packed(x, lengths=LENGTHS):
    """Row i's first lengths[i] tokens, packed along T in one row."""
    return None if x is None else torch.cat([x[i:i + 1, :n] for i, n in enumerate(lengths)], dim=1)


def twin_cases():
    g = gdn2_inputs(GDN2Shape(B=3, T=6, H=2, K=4, V=3), seed=1)
    n = nested_inputs(NestedShape(B=3, T=6, H=2, L=2, K=4, V=3), seed=1)
    t = tensor3d_inputs(Tensor3DShape(B=3, T=6, H=2, K=3, E=2, V=3), 1, "delta", "tile")
    f = fenwick_inputs(FenwickShape(B=3, T=6, H=2, K=4, V=3), seed=1)
    fg = fenwick_gdn2_inputs(FenwickShape(B=3, T=6, H=2, K=4, V=3), seed=1)
    yield "gdn2", naive_gdn2, naive_gdn2_numpy, dict(
        {k: packed(g[k]) for k in "qkvgbw"}, initial_state=g["initial_state"])
    yield "nested", naive_nested_gdn2, naive_nested_gdn2_numpy, dict(
        {k: packed(n[k]) for k in "qkvgbwr"}, levels=n["levels"], initial_states=n["initial_states"], chunk_size=2)
    yield "tensor3d", naive_tensor3d, naive_tensor3d_numpy, dict(
        {k: packed(t[k]) for k in ("q1", "k1", "q2", "k2", "v", "g", "beta")}, mode="delta",
        initial_state=t["initial_state"])
    yield "fenwick", naive_fenwick, naive_fenwick_numpy, {k: packed(f[k]) for k in ("q", "k", "v", "g", "level_scales")}
    yield "fenwick-quadratic", quadratic_fenwick, quadratic_fenwick_numpy, \
        {k: packed(f[k]) for k in ("q", "k", "v", "g", "level_scales")}
    yield "fenwick-gdn2", naive_fenwick_gdn2, naive_fenwick_gdn2_numpy, \
        {k: packed(fg[k]) for k in ("q", "k", "v", "g", "b", "w", "level_scales")}


@pytest.mark.parametrize("case", list(twin_cases()), ids=lambda c: c[0])
def test_numpy_twin_packed_equals_torch_reference(case):
    """A NumPy ``cu_seqlens`` for the twin, a torch one for the reference: outputs and per-sequence
    final states agree (float64, to 1e-12)."""
    name, ref, twin, args = case
    extra = {} if name == "fenwick-quadratic" else {"output_final_state": True}
    expected = ref(**args, **extra, cu_seqlens=torch.from_numpy(CU))
    got = twin(**{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}, cu_seqlens=CU)
    if name == "fenwick-quadratic":
        expected, got = (expected, None), (got, None)
    np.testing.assert_allclose(got[0], expected[0].numpy(), rtol=0, atol=1e-12)
    finals = got[1] if isinstance(got[1], list) else [got[1]]
    for a, b in zip(finals, expected[1] if isinstance(expected[1], list) else [expected[1]]):
        if b is not None:
            assert a.shape[0] == len(LENGTHS)
            np.testing.assert_allclose(a, b.numpy(), rtol=0, atol=1e-12)
