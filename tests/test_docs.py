"""The README and the docs site: runnable examples run, every other example says it is a
fragment, and the README's set-up commands are the ones CI runs."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.S)
_FENCE = re.compile(r"^```(.*)$", re.M)


def _name(page: pathlib.Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _text(page: pathlib.Path) -> str:
    return page.read_text(encoding="utf-8")


BLOCKS = [
    pytest.param(code, id=f"{_name(page)}#{n}")
    for page in PAGES
    for n, code in enumerate(_RUNNABLE.findall(_text(page)), 1)
]


def _opening_fences(text: str) -> list[tuple[int, str]]:
    """(line number, info string) of every opening code fence."""
    fences: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if not inside:
                fences.append((number, line[3:].strip()))
            inside = not inside
    assert not inside, "a code fence is never closed"
    return fences


def test_the_readme_and_the_docs_have_runnable_examples() -> None:
    assert len(_RUNNABLE.findall(_text(README))) == 1  # the quick start
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("code", BLOCKS)
def test_runnable_example_runs(code: str, tmp_path: pathlib.Path) -> None:
    # A fresh interpreter, as a reader pasting the example into a file would run it,
    # importing the package of this tree.
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_python_block_is_runnable_or_marked_as_a_fragment(page: pathlib.Path) -> None:
    lines = _text(page).splitlines()
    unmarked = [
        f"{_name(page)}:{number}"
        for number, info in _opening_fences(_text(page))
        if info == "python" and lines[number - 2] not in ("<!-- runnable -->", "<!-- fragment -->")
    ]
    assert unmarked == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_code_block_names_its_language(page: pathlib.Path) -> None:
    bare = [number for number, info in _opening_fences(_text(page)) if not info]
    assert bare == [], f"{_name(page)}: fences without a language at lines {bare}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_install_hints_name_the_distribution(page: pathlib.Path) -> None:
    # "scope" on the package index is an unrelated project.
    assert not re.search(r"install[^\n]*\bscope\[", _text(page))
    assert not re.search(r"(?<![-\w])scope\[(openai|anthropic|postgres|redis|otel)", _text(page))


def test_the_readme_is_short() -> None:
    assert len(_text(README).splitlines()) <= 250


def test_the_readme_set_up_commands_are_the_ones_ci_runs() -> None:
    section = _text(README).split("## From this clone", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in commands:
        assert command in ci, f"{command!r} is not a line of .ci/run"


def test_the_site_home_page_has_the_readme_quick_start() -> None:
    (readme_start,) = _RUNNABLE.findall(_text(README))
    assert readme_start in _RUNNABLE.findall(_text(ROOT / "docs" / "index.md"))


def test_every_docs_page_is_in_the_site_navigation() -> None:
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r":\s*([a-z]+\.md)\s*$", mkdocs, re.M))
    assert nav == {page.name for page in PAGES if page != README}
