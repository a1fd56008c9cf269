"""The public API's types catch mistakes, and the documentation's examples type-check.

One ``mypy --strict`` run (in-process, ``mypy.api``) over:

- ``tests/typing/pass_*.py``: must type-check without a single error;
- ``tests/typing/fail_*.py``: every error announced by a ``# E: <text>`` comment line (for
  the next code line) must be reported, and nothing else;
- the runnable examples (``<!-- runnable -->`` blocks) of README.md and of every page under
  docs/, as a reader pasting one into a file would check it: ``--strict``, except that
  unannotated functions are allowed (their bodies are still checked).

The pass files are also run, so every example in them is correct at run time as well.
"""

from __future__ import annotations

import pathlib
import re
import runpy
import sys
from collections import defaultdict
from dataclasses import dataclass

import pytest
from mypy import api as mypy_api  # in the test extra, pinned like dev

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "typing"
#: The pages whose runnable blocks are checked (docs/ only when the docs site exists).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.S)
_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*)$")
_EXPECT = re.compile(r"^\s*# E: (?P<text>.+?)\s*$")

PASS_FILES = sorted(CASES.glob("pass_*.py"))
FAIL_FILES = sorted(CASES.glob("fail_*.py"))


def _config(cache: pathlib.Path) -> str:
    # mypy_path: this checkout's scope, not whichever one the environment has installed.
    return f"""\
[mypy]
strict = True
python_version = 3.11
mypy_path = {ROOT}
cache_dir = {cache}
show_error_codes = False
show_column_numbers = False
pretty = False

[mypy-scope_readme.*]
disallow_untyped_defs = False
disallow_incomplete_defs = False
"""


@dataclass(frozen=True)
class MypyRun:
    checked: list[str]  # file names
    errors: dict[str, list[tuple[int, str]]]  # file name -> [(line, message), ...]


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    """One mypy run over every file."""
    work = tmp_path_factory.mktemp("typing")
    package = work / "scope_readme"  # a package, so one config section covers its modules
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    readme_files = []
    for page_index, page in enumerate(PAGES):
        for index, block in enumerate(_BLOCK.findall(page.read_text(encoding="utf-8"))):
            path = package / f"readme_block_{page_index}_{index}.py"
            path.write_text(block + "\n", encoding="utf-8")
            readme_files.append(path)
    assert readme_files, "the README has runnable examples to check"
    config = work / "mypy.ini"
    config.write_text(_config(work / "cache"), encoding="utf-8")
    files = [*PASS_FILES, *FAIL_FILES, *readme_files]
    stdout, stderr, status = mypy_api.run(
        ["--config-file", str(config), "--no-error-summary", *map(str, files)]
    )
    assert status in (0, 1), f"mypy did not run (status {status}):\n{stderr}{stdout}"
    errors: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for line in stdout.splitlines():
        match = _LINE.match(line)
        assert match is not None, f"unexpected mypy output: {line!r}"
        if match["severity"] == "error":
            errors[pathlib.Path(match["path"]).name].append((int(match["line"]), match["message"]))
    return MypyRun([path.name for path in files], dict(errors))


def _expected(path: pathlib.Path) -> dict[int, list[str]]:
    """``{line: [text, ...]}`` from the ``# E:`` comment lines before each code line."""
    expected: dict[int, list[str]] = {}
    pending: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _EXPECT.match(line)
        if match is not None:
            pending.append(match["text"])
        elif line.strip() and not line.lstrip().startswith("#") and pending:
            expected[number], pending = pending, []
    assert not pending, f"{path.name}: '# E:' at the end of the file announces no line"
    return expected


def test_there_are_cases_of_each_kind() -> None:
    assert len(PASS_FILES) >= 3 and len(FAIL_FILES) >= 2


@pytest.mark.parametrize("path", PASS_FILES, ids=lambda p: p.name)
def test_pass_file_type_checks(path: pathlib.Path, mypy_run: MypyRun) -> None:
    assert path.name in mypy_run.checked
    assert mypy_run.errors.get(path.name, []) == []


@pytest.mark.parametrize("path", PASS_FILES, ids=lambda p: p.name)
def test_pass_file_runs(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")


@pytest.mark.parametrize("path", FAIL_FILES, ids=lambda p: p.name)
def test_fail_file_reports_exactly_the_announced_errors(
    path: pathlib.Path, mypy_run: MypyRun
) -> None:
    expected = _expected(path)
    assert expected, f"{path.name} announces no error"
    reported: dict[int, list[str]] = defaultdict(list)
    for line, message in mypy_run.errors.get(path.name, []):
        reported[line].append(message)
    problems = []
    for line, texts in sorted(expected.items()):
        messages = reported.pop(line, [])
        for text in texts:
            found = next((m for m in messages if text in m), None)
            if found is None:
                problems.append(f"line {line}: no error containing {text!r} (got {messages})")
            else:
                messages.remove(found)
        problems += [f"line {line}: unannounced error {m!r}" for m in messages]
    for line, messages in sorted(reported.items()):
        problems += [f"line {line}: unannounced error {m!r}" for m in messages]
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def _block_name(name: str) -> str:
    page, index = name.removeprefix("readme_block_").removesuffix(".py").split("_")
    return f"{PAGES[int(page)].relative_to(ROOT)}, runnable block {index}"


def test_documentation_examples_type_check(mypy_run: MypyRun) -> None:
    assert any(name.startswith("readme_block_0_") for name in mypy_run.checked)
    problems = [
        f"{_block_name(name)}, line {line}: {message}"
        for name, errors in sorted(mypy_run.errors.items())
        if name.startswith("readme_block_")
        for line, message in errors
    ]
    assert not problems, "\n".join(problems)
