"""The import contract type ``private_modules`` (registered in pyproject.toml's
``[tool.importlinter] contract_types``), for ``lint-imports``.

import-linter's own wildcards match whole segments (``scope.*``, ``scope.**``): a
forbidden contract cannot say "every module named ``_x``", so it had to list private
modules one by one, and missed those added later. This contract says it with patterns
and no list, and takes no exceptions (it has no ``ignore_imports`` option):

    [[tool.importlinter.contracts]]
    type = "private_modules"
    packages = ["scope.[!_]*"]

Each module matching a pattern of ``packages`` is a package (a pattern matches a name
segment by segment, each with ``fnmatch``: ``*`` never crosses a dot). Whatever lies
below a package under a private segment (one that starts with a single underscore:
``scope.history._turn``, ``scope.models._wire.x``) is private to it: only the package
itself and the modules inside it may import it. Every import from outside breaks the
contract, with its line. A pattern that matches no module is an error, so a misspelt
one cannot make the contract hold by checking nothing.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck, InvalidContractOptions


def matches(pattern: str, module: str) -> bool:
    """Whether ``module`` matches ``pattern`` segment by segment (``fnmatch`` each)."""
    wanted, parts = pattern.split("."), module.split(".")
    return len(wanted) == len(parts) and all(map(fnmatchcase, parts, wanted))


def private_below(package: str, module: str) -> bool:
    """Whether ``module`` lies below ``package`` under a private segment."""
    if not module.startswith(package + "."):
        return False
    rest = module[len(package) + 1 :].split(".")
    return any(part.startswith("_") and not part.startswith("__") for part in rest)


def reaches(graph: ImportGraph, patterns: list[str]) -> list[dict[str, Any]]:
    """Every import of a package's private module from outside that package, sorted:
    ``{"importer", "imported", "lines"}``. ``ValueError`` names a pattern that matches
    no module of ``graph``."""
    modules = sorted(graph.modules)
    found = []
    for pattern in patterns:
        packages = [m for m in modules if matches(pattern, m)]
        if not packages:
            raise ValueError(f"packages pattern {pattern!r} matches no module")
        for package in packages:
            inside = package + "."
            for module in modules:
                if not private_below(package, module):
                    continue
                for importer in sorted(graph.find_modules_that_directly_import(module)):
                    if importer == package or importer.startswith(inside):
                        continue
                    details = graph.get_import_details(importer=importer, imported=module)
                    lines = sorted(d["line_number"] for d in details)
                    found.append({"importer": importer, "imported": module, "lines": lines})
    return found


class PrivateModulesContract(Contract):
    """See the module docstring."""

    packages = fields.ListField(subfield=fields.StringField())

    def validate(self) -> None:
        if not self.packages:  # type: ignore[attr-defined]
            raise InvalidContractOptions({"packages": "Name at least one pattern."})

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        try:
            found = reaches(graph, list(self.packages))  # type: ignore[attr-defined]
        except ValueError as exc:
            return ContractCheck(kept=False, metadata={"reaches": [], "error": str(exc)})
        return ContractCheck(kept=not found, metadata={"reaches": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        if "error" in check.metadata:
            output.print_error(check.metadata["error"])
            output.new_line()
        for reach in check.metadata["reaches"]:
            lines = ", ".join(f"l.{n}" for n in reach["lines"])
            output.print_error(
                f"{reach['importer']} imports {reach['imported']}, private to its package ({lines})"
            )
        output.new_line()
