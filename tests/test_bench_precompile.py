"""The benchmarks' parallel pre-compilation in parts (``bench.precompile``): every autotuner
config compiled by some part, each part running every kernel, parts of a group waiting for all
parts of the group whose fla kernels they share; and what ``reads_ab --precompile-workers``
compiles."""
import types

import pytest
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

from bench import precompile


def _share_problems(slice_fn, n_configs, parts):
    """What is wrong with ``slice_fn`` as a share-out of ``n_configs`` configs over ``parts`` parts."""
    configs = [f"c{i}" for i in range(n_configs)]
    shares = [slice_fn(configs, p, parts) for p in range(parts)]
    problems = []
    if set().union(*map(set, shares)) != set(configs):
        problems.append("a config no part compiles")
    if configs and not all(shares):
        problems.append("a part that runs no config")
    if n_configs >= parts and sum(map(len, shares)) != n_configs:
        problems.append("a config compiled twice though there are enough to go round")
    return problems


CASES = [(n, parts) for n in (0, 1, 3, 7, 8, 24) for parts in (1, 2, 3, 8)]


@pytest.mark.parametrize("n_configs, parts", CASES)
def test_config_slice_shares_every_config_out_once(n_configs, parts):
    assert _share_problems(precompile.config_slice, n_configs, parts) == []


@pytest.mark.parametrize("twin", ["strided_only", "last_dropped", "first_block_only"])
def test_config_slice_check_catches_a_broken_share_out(twin):
    broken = {
        "strided_only": lambda c, p, P: c[p::P],                        # empty parts when P > len
        "last_dropped": lambda c, p, P: c[:-1][p::P] or c[:1],
        "first_block_only": lambda c, p, P: c[:max(1, len(c) // P)],    # every part the same configs
    }[twin]
    assert any(_share_problems(broken, n, parts) for n, parts in CASES)


def test_parts_share_the_slots_out():
    assert precompile.parts_per_group(2, 12) == 6
    assert precompile.parts_per_group(1, 12) == precompile.MAX_PARTS
    assert precompile.parts_per_group(28, 12) == 1 and precompile.parts_per_group(0, 4) == 4


def test_default_slots_are_filled_by_parts_when_there_are_few_groups(monkeypatch):
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 16)
    assert precompile.slots_and_parts(2, None) == (12, 6)       # reads_ab at one level: flat and nested
    assert precompile.slots_and_parts(28, None) == (12, 1)      # the full ngdn bench plan
    assert precompile.slots_and_parts(2, 4) == (4, 2) and precompile.slots_and_parts(3, 1) == (1, 1)
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 2)
    assert precompile.slots_and_parts(2, None) == (1, 1)


def test_split_tasks_wait_for_every_part_of_the_group_they_share_kernels_with():
    deps = [None, None, 0, 2]       # groups 2 and 3 wait for 0 and 2
    tasks, task_deps = precompile.split_tasks(deps, 3)
    assert tasks == [(g, p) for g in range(4) for p in range(3)]
    assert task_deps[:6] == [None] * 6
    assert all(d == (0, 1, 2) for d in task_deps[6:9]) and all(d == (6, 7, 8) for d in task_deps[9:])
    assert precompile.split_tasks(deps, 1) == ([(g, 0) for g in range(4)], [None, None, (0,), (2,)])


def test_schedule_starts_a_task_only_after_all_its_dependencies_ended():
    tasks, deps = precompile.split_tasks([None, 0, None], 3)
    ended, started = [], []

    class Proc:
        def __init__(self, i):
            self.left = 2 + (i % 3)

        def poll(self):
            self.left -= 1
            return 0 if self.left <= 0 else None

        def kill(self):
            pass

    def launch(i):
        assert all(d in ended for d in (deps[i] or ())), (i, deps[i], ended)
        started.append(i)
        return Proc(i)

    precompile.schedule(deps, 4, launch, lambda i, rc: ended.append(i), timeout_s=60, poll_s=0)
    assert sorted(started) == sorted(ended) == list(range(len(tasks)))
    # a one-index dependency still reads as before
    order = precompile.schedule([None, 0], 2, lambda i: Proc(0), lambda i, rc: None, timeout_s=60, poll_s=0)
    assert order == [0, 1]


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (1, 2, 4, 8, 16)], key=[])
@triton.jit
def _five_configs(x, BLOCK: tl.constexpr):
    pass


def test_worker_patch_leaves_each_part_its_share_of_the_pruned_configs():
    """``_patch_autotuner(part, parts)`` slices what the autotuner's own pruning returns (here a
    stand-in returning every config: the interpreter pins autotuners to one), and with one part
    changes nothing."""
    names = ("do_bench", "check_disk_cache", "prune_configs")
    saved = {n: Autotuner.__dict__[n] for n in names if n in Autotuner.__dict__}
    try:
        blocks = {}
        for part, parts in ((0, 1), (0, 2), (1, 2), (2, 8), (6, 8)):
            Autotuner.prune_configs = lambda self, kwargs: list(self.configs)
            precompile._patch_autotuner(part, parts)
            blocks[part, parts] = [c.kwargs["BLOCK"] for c in _five_configs.prune_configs({})]
        assert blocks == {(0, 1): [1, 2, 4, 8, 16], (0, 2): [1, 4, 16], (1, 2): [2, 8], (2, 8): [4], (6, 8): [2]}
    finally:
        for n in names:
            if n in saved:
                setattr(Autotuner, n, saved[n])
            elif n in Autotuner.__dict__:
                delattr(Autotuner, n)


def test_reads_ab_precompiles_flat_and_the_default_nested_op_per_level():
    from bench import reads_ab
    from reference.nested import default_query_counts

    args = types.SimpleNamespace(levels=[2, 4], B=8, T=4096, H=16, K=128, no_flat=False, dtype="bfloat16", seed=0)
    ws = reads_ab.precompile_workloads(args)
    assert [(w.impl, w.L, w.heads) for w in ws] == [("flat", 2, 32), ("nested", 2, 16), ("flat", 4, 64),
                                                    ("nested", 4, 16)]
    assert all((w.B, w.T, w.K, w.V) == (8, 4096, 128, 128) for w in ws)
    assert ws[3].query_counts == tuple(default_query_counts(4, 128))
    args.no_flat = True
    assert [w.impl for w in reads_ab.precompile_workloads(args)] == ["nested", "nested"]
    spec_args = reads_ab.precompile_args(args)
    assert set(precompile.ARG_FIELDS) <= set(vars(spec_args)) and spec_args.param_dtype == "float32"
    assert len(precompile.compile_groups(ws)) == 4
