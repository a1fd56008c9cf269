"""The ``private_modules`` import contract (tests/import_contracts.py) that lint-imports
runs: it catches an import of a package's private module from outside the package, at
any depth, lets the package's own modules and the shared kernel through, refuses a
pattern that matches nothing, and is what pyproject.toml configures, with no exceptions."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.domain.contract import InvalidContractOptions

from tests.import_contracts import PrivateModulesContract, matches, private_below, reaches

ROOT = Path(__file__).resolve().parents[1]


def _graph(*imports: tuple[str, str, int]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for module in (
        "scope",
        "scope.a",
        "scope.a._x",
        "scope.a.y",
        "scope.a.sub",
        "scope.a.sub._deep",
        "scope.a._pkg",
        "scope.a._pkg.inner",
        "scope.b",
        "scope.b.c",
        "scope._kernel",
        "scope._kernel._part",
    ):
        graph.add_module(module)
    for importer, imported, line in imports:
        graph.add_import(
            importer=importer, imported=imported, line_number=line, line_contents="import"
        )
    return graph


def _contract(*patterns: str) -> PrivateModulesContract:
    return PrivateModulesContract("private", {}, {"packages": list(patterns)})


def test_segment_patterns() -> None:
    assert matches("scope.[!_]*", "scope.history")
    assert not matches("scope.[!_]*", "scope._json")
    assert not matches("scope.[!_]*", "scope.history._turn")  # * never crosses a dot
    assert not matches("scope.[!_]*", "scope")
    assert private_below("scope.a", "scope.a._x")
    assert private_below("scope.a", "scope.a.sub._deep")
    assert private_below("scope.a", "scope.a._pkg.inner")
    assert not private_below("scope.a", "scope.a.y")
    assert not private_below("scope.a", "scope.a.__main__")
    assert not private_below("scope.a", "scope.ab._x")


def test_imports_inside_the_package_and_of_the_kernel_keep_it() -> None:
    graph = _graph(
        ("scope.a", "scope.a._x", 1),
        ("scope.a.y", "scope.a._x", 2),
        ("scope.a.y", "scope.a.sub._deep", 3),
        ("scope.a._x", "scope.a._pkg.inner", 4),
        ("scope.b", "scope.a", 5),
        ("scope.b", "scope.a.y", 6),
        ("scope.b.c", "scope._kernel._part", 7),
    )
    check = _contract("scope.[!_]*").check(graph, verbose=False)
    assert check.kept
    assert check.metadata["reaches"] == []


@pytest.mark.parametrize("private", ["scope.a._x", "scope.a.sub._deep", "scope.a._pkg.inner"])
def test_an_import_from_another_package_breaks_it(private: str) -> None:
    graph = _graph(("scope.a.y", "scope.a._x", 2), ("scope.b.c", private, 12))
    check = _contract("scope.[!_]*").check(graph, verbose=False)
    assert not check.kept
    assert check.metadata["reaches"] == [
        {"importer": "scope.b.c", "imported": private, "lines": [12]}
    ]


def test_a_pattern_matching_nothing_breaks_it() -> None:
    check = _contract("scope.[!_]*", "scope.nothing*").check(_graph(), verbose=False)
    assert not check.kept
    assert check.metadata["error"] == "packages pattern 'scope.nothing*' matches no module"


def test_a_contract_without_patterns_is_invalid() -> None:
    with pytest.raises(InvalidContractOptions):
        _contract()


def test_pyproject_runs_it_over_every_package_without_exceptions() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    linter = config["tool"]["importlinter"]
    assert (
        "private_modules: tests.import_contracts.PrivateModulesContract" in linter["contract_types"]
    )
    (contract,) = [c for c in linter["contracts"] if c["type"] == "private_modules"]
    assert contract["packages"] == ["scope.[!_]*"]
    assert "ignore_imports" not in contract
    # The tree keeps it, and the patterns cover every package with private modules.
    graph = grimp.build_graph("scope", exclude_type_checking_imports=True)
    assert reaches(graph, contract["packages"]) == []
    covered = {
        ".".join(m.split(".")[:2])
        for m in graph.modules
        if any(private_below(p, m) for p in graph.modules if matches("scope.[!_]*", p))
    }
    packages = {"scope.chat", "scope.history", "scope.historystores", "scope.models"}
    assert packages | {"scope.web", "scope.cli", "scope.otel"} <= covered
