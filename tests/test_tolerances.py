"""tolerances.yaml itself: every entry a usable bound, and the CUDA entries as complete as the
CPU ones. CPU CI reads only the ``cpu-interpret`` and ``any`` entries, so a broken ``cuda``
entry would otherwise first show as a failure on the GPU."""
import pytest
import yaml

from ngdn import tolerances

MODES = {"cpu-interpret", "cuda", "any"}
DTYPES = {"float64", "float32", "bfloat16", "float16"}
# Dot-precision variants of a float32 kernel (e.g. the promote scan with TF32 dots, as bf16 nested
# runs use it): they bound only what their own test measures, so the completeness check skips them.
PRECISION_KEYS = {"tf32"}


def bad_entries(table: dict) -> list:
    """Unknown modes or dtypes, bounds that are not a number in (0, 1) (a relative error of 1
    or more bounds nothing), and ``*_factor`` multipliers outside [1, 100]."""
    bad = []
    for component, modes in table.items():
        for mode, dtypes in modes.items():
            if mode not in MODES:
                bad.append(f"{component}.{mode}: unknown mode")
                continue
            for dtype, quantities in dtypes.items():
                if dtype not in DTYPES | PRECISION_KEYS:
                    bad.append(f"{component}.{mode}.{dtype}: unknown dtype")
                for quantity, bound in quantities.items():
                    if quantity.endswith("_factor"):    # a multiplier of a measured floor (the extreme
                        ok = tolerances.is_bound(bound) and 1 <= bound <= 100   # regime's bounds): 1 … 100
                    else:
                        ok = tolerances.is_bound(bound) and bound < 1
                    if not ok:
                        bad.append(f"{component}.{mode}.{dtype}.{quantity} = {bound!r}")
    return bad


def missing_cuda_entries(table: dict) -> list:
    """Quantities a kernel component bounds on the CPU but not, for some CUDA dtype, on CUDA."""
    missing = []
    for component, modes in table.items():
        if "cpu-interpret" not in modes:
            continue
        # no `cuda` mode at all: the GPU lookup would fall back to `any` or fail; count it as missing
        cuda = modes.get("cuda") or {"float32": {}}
        for quantities in modes["cpu-interpret"].values():
            for dtype, bounds in cuda.items():
                if dtype in PRECISION_KEYS:
                    continue
                missing += [f"{component}.cuda.{dtype}.{q}" for q in sorted(set(quantities) - set(bounds))]
    return missing


def test_every_entry_is_a_positive_number_below_one():
    assert not bad_entries(tolerances.table())


def test_cuda_entries_cover_the_cpu_entries():
    assert not missing_cuda_entries(tolerances.table())


def test_table_checks_catch_a_glued_comment_and_a_missing_cuda_entry(tmp_path, monkeypatch):
    """Mutations: `1.0e-05# note` is a string in YAML (lookup and table test both reject it);
    a quantity bounded on the CPU only."""
    path = tmp_path / "tolerances.yaml"
    path.write_text("gdn2:\n"
                    "  cpu-interpret:\n    float32:\n      output: 1.0e-05\n      dq: 1.0e-05\n"
                    "  cuda:\n    float32:\n      output: 1.0e-05# worst 2e-7\n")
    table = yaml.safe_load(path.read_text())
    assert bad_entries(table) == ["gdn2.cuda.float32.output = '1.0e-05# worst 2e-7'"]
    assert missing_cuda_entries(table) == ["gdn2.cuda.float32.dq"]
    monkeypatch.setenv("NGDN_TOLERANCES", str(path))
    with pytest.raises(ValueError, match="space before '#'"):
        tolerances.tolerance("gdn2", "output", "float32", mode="cuda")
    assert tolerances.tolerance("gdn2", "output", "float32", mode="cpu-interpret") == 1e-5
