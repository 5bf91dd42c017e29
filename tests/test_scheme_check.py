"""``ngdn scheme check`` (``ngdn.scheme_check``): passes ``merge``, ``bounded_erase`` and the README's
``fixed_address`` (examples/fixed_address.py, as written), reports ``learned`` as expansive with
its growth factor, fails every deliberately broken scheme of ``tests/broken_schemes/`` on the
property that should catch it, and its reproduction command re-runs a failure.

Few examples per property (``--examples 8``) to keep CPU CI short; the default count is
measured in the README."""
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


@pytest.mark.parametrize("file, caught_by", [
    ("wrong_backward.py", "probe_gradcheck"),
    ("positive_gamma.py", "contract"),
    ("transposed_snapshot.py", "contract"),
    ("nan_on_zero.py", "contract"),
    ("shapes_disagree.py", "contract"),
])
def test_broken_scheme_fails(capsys, file, caught_by):
    rc, out = check(capsys, BROKEN / file, *FEW, *WITHOUT_OPTIMIZED)
    assert rc == 1 and verdicts(out)[caught_by] == "FAIL", out
    assert f"FAIL: {caught_by}" in out and "example: ProbeDraw(" in out


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
