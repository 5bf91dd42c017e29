"""``ngdn scheme check`` (``ngdn.scheme_check``): passes ``merge``, ``bounded_erase`` and the README's
``fixed_address`` (examples/fixed_address.py, as written), reports ``learned`` as expansive with
its growth factor, fails every deliberately broken scheme of ``tests/broken_schemes/`` on the
property that should catch it, and its reproduction command re-runs a failure.

Few examples per property (``--examples 8``) to keep CPU CI short; the default count is
measured in docs/schemes.md."""
import os
import re
import shlex
from pathlib import Path

import pytest

from ngdn import scheme_check
from ngdn.cli import main
from reference.schemes import SCHEMES

ROOT = Path(__file__).resolve().parents[1]
BROKEN = ROOT / "tests" / "broken_schemes"
FEW = ["--examples", "8"]
WITHOUT_OPTIMIZED = [a for p in scheme_check.PROPERTY_NAMES if p != "optimized" for a in ("--only", p)]


def verdicts(out: str) -> dict:
    """``{property: verdict}`` from the report table."""
    rows = re.findall(r"^\| (\w+) +\| ([^|]+)\|[^|]+\|[^|]+\|[^|]+\| (\S+) +\|$", out, flags=re.M)
    return {name: verdict for name, _, verdict in rows if name != "property"}


def check(capsys, *args):
    before = set(SCHEMES)
    rc = main(["scheme", "check", *map(str, args)])
    out = capsys.readouterr().out
    assert set(SCHEMES) == before, "the check must leave the registry as it found it"
    return rc, out


def test_readme_fixed_address_example_passes_the_whole_battery(capsys):
    rc, out = check(capsys, ROOT / "examples" / "fixed_address.py", *FEW)
    v = verdicts(out)
    assert rc == 0 and "all properties pass" in out, out
    assert v["optimized"] == "ok" and v["stability"] == "ok" and v["numpy_twin"] == "n/a", v


def test_bounded_erase_passes_the_whole_battery(capsys):
    rc, out = check(capsys, "reference.schemes", "--scheme", "bounded_erase", *FEW)
    assert rc == 0 and set(verdicts(out).values()) == {"ok"}, out


def test_merge_passes(capsys):
    rc, out = check(capsys, "reference.schemes", "--scheme", "merge", *FEW, *WITHOUT_OPTIMIZED)
    v = verdicts(out)
    assert rc == 0 and v.pop("one_pair") == "n/a" and set(v.values()) == {"ok"}, out   # n = K: no single pair


def test_learned_is_reported_expansive_with_its_growth_factor(capsys):
    rc, out = check(capsys, "reference.schemes", "--scheme", "learned", *FEW, "--only", "stability")
    assert rc == 1 and verdicts(out) == {"stability": "EXPANSIVE"}, out
    growth = float(re.search(r"expansive: growth factor (\S+)", out).group(1))
    assert growth > 1e6, out
    assert "example: StabilityDraw(" in out and "reproduce: ngdn scheme check" in out


@pytest.mark.parametrize("file, caught_by, cause", [
    ("wrong_backward.py", "probe_gradcheck", "Jacobian mismatch for output β with respect to input "),
    ("positive_gamma.py", "contract", "γ > 0"),
    ("transposed_snapshot.py", "contract", "do the declared parameter shapes match"),
    ("nan_on_zero.py", "contract", "not finite"),
    ("shapes_disagree.py", "contract", "do the declared parameter shapes match"),
    ("over_erase.py", "contract", "β outside [0, 1]"),
    ("batch_mixing.py", "independence", "(the scheme mixes the batch)"),
    ("decay_over_channels.py", "contract", "output γ must have shape [..., H, K]"),
    ("batch_size.py", "independence", "depends on the batch's size"),
    ("magnitude_guard.py", "independence", "times larger, did (the scheme mixes the batch)"),
    ("ignores_reduction.py", "contract", "the probe ignores `reduction`"),
    ("inplace_params.py", "contract", "the probe changed parameter(s) 'Q' in place"),
])
def test_broken_scheme_fails(capsys, file, caught_by, cause):
    rc, out = check(capsys, BROKEN / file, *FEW, *WITHOUT_OPTIMIZED)
    assert rc == 1 and verdicts(out)[caught_by] == "FAIL", out
    assert f"FAIL: {caught_by}" in out and "example: ProbeDraw(" in out
    assert cause in out.split(f"FAIL: {caught_by}")[1], out


def test_an_erase_gate_above_one_is_expansive_with_slow_decays(capsys):
    """``merge`` with β = 3σ(·): the decay at make_levels' scales hides the over-erase; slow decays do not."""
    rc, out = check(capsys, BROKEN / "over_erase.py", *FEW, "--only", "stability")
    assert rc == 1 and verdicts(out) == {"stability": "EXPANSIVE"}, out
    assert "with slow decays" in out and "decay=0.001" in out, out


def test_a_query_count_that_cannot_be_read_is_refused(capsys):
    """A query bank declared ``(H, n + 1, K)``: no axis of size n, so the scheme is refused (exit 2)."""
    assert main(["scheme", "check", str(BROKEN / "unreadable_query_count.py")]) == 2
    err = capsys.readouterr().err
    assert "cannot determine the query count n from the parameter shapes" in err and "'P'" in err, err


P_BANK = '''from reference.schemes import gates, l2norm, reduce_log_decay, register_scheme

def shapes(H, K, V, n):
    return {"P": (H, n, K), "W_beta": (H, V, K), "W_omega": (H, V, V), "W_gamma": (H, V, K)}

def p_bank(M_below, params, reduction="mean"):
    ν = params["P"] @ M_below
    κ = l2norm(params["P"]).expand(*ν.shape[:-1], -1)
    β, ω, γ_i = gates(ν, params)
    return κ, ν, β, ω, reduce_log_decay(γ_i, reduction)

register_scheme("p_bank", p_bank, shapes)
'''


def test_the_query_count_comes_from_the_shapes_not_the_name(capsys, tmp_path):
    """``fixed_address`` with its bank called ``P``: n is read from ``P``'s axis 1, so ``one_pair``
    (n = 1) applies and the query-row permutation is checked."""
    path = tmp_path / "p_bank.py"
    path.write_text(P_BANK)
    rc, out = check(capsys, path, *FEW, "--only", "one_pair", "--only", "permutation", "--only", "contract")
    assert rc == 0 and verdicts(out) == {"contract": "ok", "permutation": "ok", "one_pair": "ok"}, out


STATEFUL = '''from reference.schemes import learned, learned_parameter_shapes, register_scheme

calls = [0]

def stateful(M_below, params, reduction="mean"):
    calls[0] += 1
    κ, ν, β, ω, γ = learned(M_below, params, reduction)
    return κ, ν * (1 + 1e-3 * (calls[0] % 2)), β, ω, γ

register_scheme("stateful", stateful, learned_parameter_shapes)
'''


def test_a_stateful_probe_is_named_impure(capsys, tmp_path):
    path = tmp_path / "stateful.py"
    path.write_text(STATEFUL)
    rc, out = check(capsys, path, *FEW, "--only", "contract")
    assert rc == 1 and "a probe must be a pure function of (M_below, params)" in out, out
    assert "FlakyFailure" not in out and "unreliable" not in out, out


def test_the_reproduction_command_reruns_the_failure(capsys):
    rc, out = check(capsys, BROKEN / "nan_on_zero.py", *FEW, "--only", "contract")
    assert rc == 1
    command = re.search(r"reproduce: (.*)$", out, flags=re.M).group(1)
    argv = shlex.split(command)
    assert argv[:3] == ["ngdn", "scheme", "check"]
    rc, again = check(capsys, *argv[3:])
    assert rc == 1 and verdicts(again) == {"contract": "FAIL"} and "not finite on a finite zero snapshot" in again


def test_threshold_is_settable(capsys):
    """The growth factor of a non-expansive scheme is ≤ 1; a threshold below it is refused."""
    rc, out = check(capsys, "reference.schemes", "--scheme", "merge", *FEW, "--only", "stability")
    assert rc == 0
    with pytest.raises(SystemExit):
        main(["scheme", "check", "reference.schemes", "--scheme", "merge", "--threshold", "0.5"])


@pytest.mark.parametrize("args, message", [
    (["tests/broken_schemes/nope.py"], "does not exist"),
    (["reference.schemes"], "pass --scheme NAME"),
    (["reference.schemes", "--scheme", "nope"], "unknown scheme 'nope'"),
    (["reference.schemes", "--scheme", "merge", "--only", "nope"], "unknown property 'nope'"),
    (["reference.schemes", "--scheme", "merge", "--draw", repr(scheme_check.STABILITY_SEEDS[0])], "exactly one --only"),
    (["reference.schemes", "--scheme", "merge", "--only", "contract", "--draw", "os.system('x')"],
     "cannot read draw"),
])
def test_bad_arguments_exit_2_with_a_message(capsys, args, message):
    assert main(["scheme", "check", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_sets_the_measurement_environment_before_optimized_is_imported(tmp_path):
    """`ngdn scheme check` measures like the suite: IEEE float32 dots and pinned autotuners must be
    in the environment when `optimized` configures itself (at import). They once were set only
    after `ngdn.scheme_check` had imported it, so on CUDA fla ran TF32 dots (level-0 errors
    1e-3 against bounds of 2e-5) and autotuned for 100 s."""
    import subprocess
    import sys

    code = ("import os\n"
            "for v in ('NGDN_IEEE_F32', 'NGDN_PIN_AUTOTUNE'): os.environ.pop(v, None)\n"
            "from ngdn import cli\n"
            "cli.main(['scheme', 'check', 'reference.schemes', '--scheme', 'merge', '--only', 'contract',\n"
            "          '--examples', '1'])\n"
            "from optimized import triton_mode\n"
            "print(triton_mode.CONFIGURED_WITH)\n"
            "assert triton_mode.CONFIGURED_WITH['NGDN_IEEE_F32'] == '1', triton_mode.CONFIGURED_WITH\n"
            "assert triton_mode.CONFIGURED_WITH['NGDN_PIN_AUTOTUNE'] == '1', triton_mode.CONFIGURED_WITH\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NGDN_IEEE_F32", "NGDN_PIN_AUTOTUNE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("draw, message", [
    ("ProbeDraw(K=4, V=3, n=1, snapshot='bogus', gate_scale=1.0, reduction='mean', seed=0)", "snapshot must be one of"),
    ("ProbeDraw(K=4, V=3, n=5, snapshot='zero', gate_scale=1.0, reduction='mean', seed=0)", "n = 5 > K = 4"),
    ("ProbeDraw(K=4, V=3, n=1, snapshot='zero', gate_scale=1.0, reduction='max', seed=0)", "reduction must be"),
    ("ProbeDraw(K=0, V=3, n=1, snapshot='zero', gate_scale=1.0, reduction='mean', seed=0)", "K must be an int ≥ 1"),
    ("NestedDraw(T=12, L=2, K=4, V=3, t0=1, chunk=1, level=1, gate_scale=1.0, seed=0)", "runs on a ProbeDraw"),
])
def test_a_malformed_draw_is_a_usage_error(capsys, draw, message):
    """A draw the property cannot run (another type, a value outside its domain) exits 2 before
    measuring anything, not 1 as if the scheme had failed."""
    assert main(["scheme", "check", "reference.schemes", "--scheme", "merge", "--only", "contract",
                 "--draw", draw]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "FAIL" not in captured.out, (captured.out, captured.err)


def test_the_battery_draws_pass_check_draw():
    """The fixed and explicit draws are well formed (a reproduction of them is not refused)."""
    for prop in scheme_check.PROPERTIES:
        for d in (*prop.fixed, *prop.explicit):
            scheme_check.check_draw(prop, d)


def test_an_in_place_change_that_keeps_the_values_is_named(capsys):
    """A probe that clamps its snapshot in place (no value changes, so a second call gives the same
    outputs) is refused by the contract row, naming the in-place change."""
    rc, out = check(capsys, BROKEN / "inplace_snapshot.py", *FEW, "--only", "contract")
    assert rc == 1 and verdicts(out) == {"contract": "FAIL"}, out
    assert "the probe changed M_below in place (an in-place operation on it" in out, out


def off_by_a_relative_error(scheme, d: scheme_check.ProbeDraw) -> scheme_check.Measured:
    """A property of a scheme whose promoted state is off by 3.5 % of the snapshot's entries: the
    error scales with the snapshot, so the shrunk (tiny) snapshot's reads as round-off."""
    M_below, _ = scheme_check.probe_inputs(scheme, d)
    return scheme_check.from_errors({"M_new": (0.035 * M_below.abs().max().item(), 1e-13)})


def test_a_shrunk_failure_is_measured_again_on_a_random_snapshot():
    """The report gives, beside the shrunk example, the same property's error on a random snapshot
    at full size: 3.5e-10 > 1e-13 at the tiny snapshot Hypothesis shrinks to, ~0.1 on a random one."""
    prop = scheme_check.Property("off_by_a_relative_error", off_by_a_relative_error, scheme_check.probe_draws)
    row = scheme_check.run_property(prop, "merge", examples=8)
    assert row.verdict == "FAIL" and row.draw.snapshot == "tiny" and row.measured.figure < 1e6, row
    (draw, m), = row.unshrunk
    assert draw.snapshot == "random" and (draw.K, draw.V) == (8, 6) and not m.passed and m.figure > 1e10, row
    text, ok = scheme_check.report("x.py", "merge", [row], scheme_check.DEFAULT_THRESHOLD)
    assert not ok and f"on a random snapshot, not shrunk ({draw!r}): M_new: " in text, text
    assert float(re.search(r"not shrunk \(.*\): M_new: (\S+) >", text).group(1)) > 1e-3, text
