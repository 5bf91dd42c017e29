"""README.md and docs/*.md still resolve: every relative link names a file of the repository (and,
into a Markdown file, one of its headings), every repository path quoted in code exists, every
command quoted (`ngdn ...`, `python -m MODULE`, `python scripts/...`, `pytest -p PLUGIN`) names an
existing subcommand, option, module or script, README stays at most 250 lines, and no page cites
`SPEC.md` (the repository's restatement of the contract is docs/CONTRACT.md).

The checks read the pages as text; ``ngdn``'s subcommands and options come from ``ngdn.cli``'s own
parser. ``test_checker_catches_breakage`` shows each check failing on a copy with one thing broken.
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import os
import re
import shlex
import shutil
import unicodedata
from functools import lru_cache
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
# top-level folders of the repository: a quoted path starting with one of these must exist
REPO_DIRS = ("reference", "optimized", "ngdn", "bench", "layers", "property_tests", "tests", "scripts",
             "examples", "results", "docs")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(?<!`)`([^`]+?)`(?!`)")
PLACEHOLDER = re.compile(r"[<>{}]|\b[A-Z]{3,}\b")    # optimized/<op>/, results/DIR: not a real path


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def split_code(text: str) -> tuple[str, list[str]]:
    """``(prose, code blocks)``: the text without its fenced blocks, and the blocks' bodies."""
    blocks = [m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] for m in FENCE.finditer(text)]
    return FENCE.sub("", text), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in split_code(path.read_text(encoding="utf-8"))[0].splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    prose = split_code(page.read_text(encoding="utf-8"))[0]
    problems = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):        # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = Path(os.path.normpath(page.parent / path_part)) if path_part else page   # symlinks kept
        where = f"{page.relative_to(root)}: link {target!r}"
        if not dest.is_relative_to(root):
            problems.append(f"{where} leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}: {path_part} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def code_spans(text: str) -> list[str]:
    """Every inline code span of the prose and every line of the fenced blocks."""
    prose, blocks = split_code(text)
    spans = [span.replace("\n", " ") for span in INLINE_CODE.findall(prose)]
    return spans + [line for block in blocks for line in block.splitlines()]


def path_problems(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for span in code_spans(page.read_text(encoding="utf-8")):
        for token in re.split(r"[\s\"'(),=]+", span):
            token = token.rstrip(":;.]")
            if not token.startswith(tuple(d + "/" for d in REPO_DIRS)) or PLACEHOLDER.search(token):
                continue
            if "*" in token:
                if not glob.glob(str(root / token)):
                    problems.append(f"{page.relative_to(root)}: {token} matches no file")
            elif not (root / token).exists():
                problems.append(f"{page.relative_to(root)}: {token} does not exist")
    return problems


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


@lru_cache(maxsize=1)
def ngdn_parser() -> argparse.ArgumentParser:
    """``ngdn``'s parser as ``ngdn.cli.main`` builds it (caught at its ``parse_args``)."""
    from ngdn import cli

    def catch(self, *args, **kwargs):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            cli.main(["check"])
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError("ngdn.cli.main did not parse its arguments")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def module_file(name: str, root: Path) -> Path | None:
    """The file ``python -m name`` runs: ours under ``root``, anything else by ``find_spec``."""
    parts = name.split(".")
    if (root / parts[0]).is_dir():
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.is_file():
                return candidate
        return None
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def options_in(source: Path, args: list[str]) -> list[str]:
    """The ``--options`` of ``args`` that ``source`` never spells out as a string."""
    text = source.read_text(encoding="utf-8")
    return [a.split("=")[0] for a in args
            if a.startswith("--") and f'"{a.split("=")[0]}"' not in text and f"'{a.split('=')[0]}'" not in text]


def words(command: str) -> list[str]:
    command = command.split(" #")[0]
    command = re.split(r"&&|\|\||[|;]", command)[0]
    try:
        out = shlex.split(command)
    except ValueError:
        out = command.split()
    while out and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", out[0]):    # VAR=value before the command
        out.pop(0)
    return out


def command_problems(page: Path, root: Path = ROOT, parser: argparse.ArgumentParser | None = None) -> list[str]:
    from bench import SUBCOMMANDS as BENCH

    parser = parser or ngdn_parser()
    top = subparsers(parser)
    problems = []
    where = page.relative_to(root)
    for span in code_spans(page.read_text(encoding="utf-8")):
        for m in re.finditer(r"(?:^|(?<=[\s\[(]))(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(ngdn|python3?|pytest)\s+[^\n]*", span):
            w = [t.rstrip(":;,]") for t in words(m.group(0))]
            if not w or w[0] in ("python", "python3") and len(w) == 1:
                continue
            if w[0] == "ngdn" and len(w) > 1:
                sub = w[1]
                if sub not in top:
                    problems.append(f"{where}: `{m.group(0)}`: ngdn has no subcommand {sub!r}")
                elif sub == "bench":
                    name = w[2] if len(w) > 2 and not w[2].startswith("-") else None
                    if name is not None and name not in BENCH:
                        problems.append(f"{where}: `{m.group(0)}`: ngdn bench has no subcommand {name!r}")
                        continue
                    source = module_file(BENCH[name][0] if name else "bench.nested_vs_flat", root)
                    for option in options_in(source, w[3 if name else 2:]):
                        problems.append(f"{where}: `{m.group(0)}`: no option {option} in {source.name}")
                else:
                    p, rest = top[sub], w[2:]
                    if subparsers(p):
                        if not rest or rest[0] not in subparsers(p):
                            problems.append(f"{where}: `{m.group(0)}`: ngdn {sub} has no subcommand "
                                            f"{(rest or [''])[0]!r}")
                            continue
                        p, rest = subparsers(p)[rest[0]], rest[1:]
                    for a in rest:
                        if a.startswith("--") and a.split("=")[0] not in p._option_string_actions:
                            problems.append(f"{where}: `{m.group(0)}`: no option {a} for ngdn {sub}")
            elif w[0] in ("python", "python3"):
                if w[1] == "-m" and len(w) > 2:
                    source = module_file(w[2], root)
                    if source is None:
                        problems.append(f"{where}: `{m.group(0)}`: no module {w[2]}")
                    else:
                        problems += [f"{where}: `{m.group(0)}`: no option {o} in {w[2]}"
                                     for o in options_in(source, w[3:])]
                elif w[1].endswith(".py"):
                    script = root / w[1]
                    if not script.is_file():
                        problems.append(f"{where}: `{m.group(0)}`: no script {w[1]}")
                    else:
                        problems += [f"{where}: `{m.group(0)}`: no option {o} in {w[1]}"
                                     for o in options_in(script, w[2:])]
            elif w[0] == "pytest":
                for flag, value in zip(w, w[1:]):
                    if flag == "-p" and not value.startswith("no:") and module_file(value, root) is None:
                        problems.append(f"{where}: `{m.group(0)}`: no pytest plugin module {value}")
    return problems


def all_problems(root: Path = ROOT) -> list[str]:
    parser = ngdn_parser()
    problems = []
    readme = root / "README.md"
    n = len(readme.read_text(encoding="utf-8").splitlines())
    if n > README_MAX_LINES:
        problems.append(f"README.md has {n} lines, more than {README_MAX_LINES}")
    if "pytest -n auto" not in "\n".join(split_code(readme.read_text(encoding="utf-8"))[1]):
        problems.append("README.md has no code block with CI's test command `pytest -n auto` (.ci/run)")
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        if "SPEC.md" in text:
            problems.append(f"{page.relative_to(root)} cites SPEC.md, which is not in the repository "
                            f"(cite docs/CONTRACT.md)")
        problems += link_problems(page, root) + path_problems(page, root) + command_problems(page, root, parser)
    return problems


def test_readme_and_docs_resolve():
    problems = all_problems()
    assert not problems, "\n".join(problems)


def test_example_scheme_is_the_file():
    """README's and docs/schemes.md's `fixed_address` are examples/fixed_address.py as written."""
    source = (ROOT / "examples" / "fixed_address.py").read_text(encoding="utf-8")
    body = ast.get_docstring(ast.parse(source), clean=False)
    code = source.split('"""', 2)[2].strip() if body is not None else source.strip()
    for page in (ROOT / "README.md", ROOT / "docs" / "schemes.md"):
        blocks = [b.strip() for b in split_code(page.read_text(encoding="utf-8"))[1] if "def fixed_address(" in b]
        assert blocks == [code], f"{page.name}'s fixed_address differs from examples/fixed_address.py"


def _copy(tmp_path: Path) -> Path:
    """A repository beside the real one: README and docs copied, every other top-level entry linked."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "docs", root / "docs")
    for entry in ROOT.iterdir():
        if not (root / entry.name).exists() and not entry.name.startswith("."):
            (root / entry.name).symlink_to(entry)
    return root


@pytest.mark.parametrize("page, old, new, expected", [
    ("README.md", "](docs/gpu.md)", "](docs/gpu-gone.md)", "docs/gpu-gone.md does not exist"),
    ("README.md", "(docs/ops.md#the-modules-of-optimized)", "(docs/ops.md#the-modules-of-optimised)",
     "no heading #the-modules-of-optimised"),
    ("docs/gpu.md", "](ops.md#torchcompile)", "](ops.md#torch-compile)", "no heading #torch-compile"),
    ("README.md", "`reference/nested.py`", "`reference/nestd.py`", "reference/nestd.py does not exist"),
    ("README.md", "ngdn scheme check examples", "ngdn scheme chek examples", "has no subcommand 'chek'"),
    ("README.md", "ngdn check --dtype", "ngdn check --dtyp", "no option --dtyp"),
    ("docs/benchmarks.md", "python -m bench.varlen", "python -m bench.varlens", "no module bench.varlens"),
    ("docs/benchmarks.md", "ngdn bench long-context", "ngdn bench long-contxt", "no subcommand 'long-contxt'"),
    ("docs/gpu.md", "-p bench.interpreter_kernels", "-p bench.interpreter_kernel", "no pytest plugin module"),
    ("README.md", "docs/CONTRACT.md", "SPEC.md", "cites SPEC.md"),
])
def test_checker_catches_breakage(tmp_path, page, old, new, expected):
    root = _copy(tmp_path)
    text = (root / page).read_text(encoding="utf-8")
    assert old in text, f"{old!r} is not in {page}: update this test"
    (root / page).write_text(text.replace(old, new, 1), encoding="utf-8")
    problems = all_problems(root)
    assert any(expected in p for p in problems), problems


def test_unbroken_copy_passes(tmp_path):
    """The copy the breakage tests start from passes as the repository does."""
    assert all_problems(_copy(tmp_path)) == []


def test_readme_too_long_is_caught(tmp_path):
    root = _copy(tmp_path)
    with open(root / "README.md", "a", encoding="utf-8") as f:
        f.write("\n" * README_MAX_LINES)
    assert any("more than 250" in p for p in all_problems(root))
