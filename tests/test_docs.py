"""The README and the docs site: runnable examples run, every other example says it is a
fragment, and the README's set-up commands are the ones CI runs."""

from __future__ import annotations

import html as htmllib
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


INDEX = ROOT / "docs" / "index.md"


def site_home_page(readme: str) -> str:
    """``docs/index.md`` as the README makes it: the README without its "From this
    clone" section (the site is read by users, not by people in a clone), links into
    ``docs/`` made relative to the site, the CHANGELOG named rather than linked."""
    head, rest = readme.split("\n## From this clone\n", 1)
    page = head + "\n## " + rest.split("\n## ", 1)[1]
    page = re.sub(
        r"The guides live in \[`docs/`\]\(docs/\) \(build the site with [^)]*\):",
        "The guides:",
        page,
    )
    page = re.sub(r"\]\(docs/([^)]*)\)", r"](\1)", page)
    return page.replace(
        "Changes are listed in [CHANGELOG.md](CHANGELOG.md).",
        "Changes are listed in the repository's `CHANGELOG.md`.",
    )


def test_the_site_home_page_is_the_readme() -> None:
    # Regenerate with: python tests/test_docs.py --write-index
    assert _text(INDEX) == site_home_page(_text(README)), (
        "docs/index.md drifted from README.md: run python tests/test_docs.py --write-index"
    )


def test_the_site_home_page_keeps_no_link_into_the_clone() -> None:
    page = site_home_page(_text(README))
    assert "## From this clone" not in page and "](docs/" not in page
    for name in re.findall(r"\]\(([a-z]+\.md)(?:#[^)]*)?\)", page):
        assert (ROOT / "docs" / name).is_file(), name
    (readme_start,) = _RUNNABLE.findall(_text(README))
    assert readme_start in _RUNNABLE.findall(page)  # the quick start stays


def test_the_cli_page_names_every_provider() -> None:
    from scope.cli._chat import PROVIDERS

    page = _text(ROOT / "docs" / "cli.md")
    chat_heading = re.search(r"### `scope chat \[--provider ([a-z|-]+)\]", page)
    assert chat_heading is not None
    assert chat_heading[1].split("|") == list(PROVIDERS)
    for provider in PROVIDERS[1:]:  # openai is the default, described first
        assert f"`--provider {provider}`" in page, provider


def test_every_docs_page_is_in_the_site_navigation() -> None:
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r":\s*([a-z]+\.md)\s*$", mkdocs, re.M))
    assert nav == {page.name for page in PAGES if page != README}


# ---------------------------------------------------------------------- the built site

_LIST_ITEM = re.compile(r"^(- |\* |\d+\. )")
_LIST_OR_CONTINUATION = re.compile(r"^(\s*- |\s*\* |\s*\d+\. |\s+\S)")


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=_name)
def test_every_list_starts_after_a_blank_line(page: pathlib.Path) -> None:
    # Markdown (unlike GitHub's renderer) reads a list right under a paragraph line as
    # more of the paragraph: the items run on.
    lines = _text(page).splitlines()
    inside = False
    run_on = []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            inside = not inside
            continue
        previous = lines[number - 2] if number > 1 else ""
        if (
            not inside
            and _LIST_ITEM.match(line)
            and previous.strip()
            and not _LIST_OR_CONTINUATION.match(previous)
        ):
            run_on.append(f"{_name(page)}:{number}")
    assert run_on == []


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=_name)
def test_no_page_names_a_release_that_never_was(page: pathlib.Path) -> None:
    # The package is 0.1.0.dev0 and the CHANGELOG has only Unreleased.
    assert re.findall(r"\bv0\.1\b|\bscope 0\.1\b|\bby 0\.1\b", _text(page)) == []


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    pytest.importorskip("mkdocs", reason="the docs extra (.[docs]) is not installed")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] missing")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def _html(site: pathlib.Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def _visible(html: str) -> str:
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", "", html)))


def test_the_api_reference_hides_private_bases(site: pathlib.Path) -> None:
    bases = {_visible(m) for m in re.findall(r"Bases: (.*?)</p>", _html(site, "api"), flags=re.S)}
    shown = {name.strip() for listed in bases for name in listed.split(",")}
    assert "HTTPAdapter" not in shown and "RecordStore" not in shown
    assert not any(name.startswith("_") for name in shown), shown
    assert {"ScopeError", "ValueError", "Protocol"} <= shown  # public bases stay


def test_the_api_reference_shows_typed_constructor_signatures(site: pathlib.Path) -> None:
    html = _html(site, "api")
    signatures = [_visible(s) for s in re.findall(r'class="doc-signature.*?</code>', html, re.S)]
    chat_model = next(s for s in signatures if "OpenAIChatModel(" in s)
    assert "timeout: float | Timeout | None" in chat_model
    assert (
        'provider_name: str = "openai"' in chat_model
        or "provider_name: str = 'openai'" in chat_model
    )
    assert any("-> Tracing" in s for s in signatures)  # return types too
    # What a private base provides is still documented on the public class.
    assert 'id="scope.models.openai.OpenAIChatModel.aclose"' in html
    for adapter in (
        "openai.OpenAIChatModel",
        "openai.OpenAIResponsesModel",
        "anthropic.AnthropicModel",
        "gemini.GeminiModel",
    ):
        for method in ("call", "stream"):
            assert f'id="scope.models.{adapter}.{method}"' in html, (adapter, method)


def test_the_api_reference_has_no_stray_rst_markers(site: pathlib.Path) -> None:
    text = _visible(_html(site, "api"))
    assert re.findall(r".{30}(?<![:\w])::(?![:\w]).{10}", text) == []


@pytest.mark.parametrize(
    ("page", "lead"),
    [
        ("stores", "Validation, before any I/O"),
        ("stores", "Durability per backend."),
        ("history", "Choices worth knowing:"),
    ],
)
def test_lists_render_as_lists(site: pathlib.Path, page: str, lead: str) -> None:
    html = _html(site, page)
    at = html.index(lead)
    after = html[at : at + 400]
    assert re.search(r"</(p|strong)>\s*(</p>\s*)?<ul>", after), after


def test_the_site_links_its_repository(site: pathlib.Path) -> None:
    assert 'href="https://github.com/Tangerg/scope"' in _html(site, "")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-index"]:
        raise SystemExit("usage: python tests/test_docs.py --write-index")
    INDEX.write_text(site_home_page(_text(README)), encoding="utf-8")
