"""The built wheel installs as ``scope-chat`` (import name ``scope``) with its extras and types."""

from __future__ import annotations

import email.parser
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # The project's own build backend (hatchling, a test dependency) without an isolated
    # build environment: offline and a second or two.
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("-q", "--disable-pip-version-check", "-w", str(out), str(ROOT)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (built,) = out.glob("*.whl")
    return built


def _metadata(wheel: pathlib.Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.BytesParser().parsebytes(archive.read(name))


def test_the_distribution_is_named_scope_chat(wheel: pathlib.Path) -> None:
    assert wheel.name.startswith("scope_chat-")
    assert _metadata(wheel)["Name"] == "scope-chat"


def test_the_extras_are_declared(wheel: pathlib.Path) -> None:
    extras = set(_metadata(wheel).get_all("Provides-Extra") or [])
    assert {
        "postgres",
        "redis",
        "openai",
        "anthropic",
        "otel",
        "pydantic",
        "mcp",
        "test",
        "dev",
        "docs",
    } <= extras


def test_extras_resolve_to_this_project_never_to_the_unrelated_scope(wheel: pathlib.Path) -> None:
    # The test extra names this project's own extras (scope-chat[postgres,...]); the
    # backend resolves them to their requirements. A stale "scope[...]" would stay a
    # requirement on the unrelated "scope" distribution of the package index.
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    names = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() for r in requires}
    assert not names & {"scope", "scope-chat"}, requires
    for dependency in ("asyncpg", "redis", "httpx", "opentelemetry-api", "pydantic", "mcp"):
        assert any(r.startswith(dependency) and "extra == 'test'" in r for r in requires)
    assert any(r.startswith("httpx") and "extra == 'openai'" in r for r in requires)


def test_the_wheel_ships_the_package_and_its_type_marker(wheel: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "scope/py.typed" in names
    assert "scope/history/storetest/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    entry_points = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert entry_points
