"""No private name crosses a package of scope (DESIGN §6m): an AST walk over the source.

A package is ``scope.<name>`` (``scope.history``, ``scope.chat``, ``scope.conversation``
...); the top-level private modules (``scope._json``, ``scope._validate``, the codec's
machinery ``scope._codec`` ...) are the shared kernel, one package of their own. Across
packages, nothing may import a private module (``scope.history._turn``) or a private
name (``from scope.jsonvalue import _x``), nor reach an attribute ``obj._x`` whose name
only another package defines (``Conversation._format`` from ``scope.web``). What one
package needs of another is public: a documented method, a trusted constructor where a
fast path needs one (``Batch.from_verified``, ``RawJSON.from_canonical``,
``Request.with_checked_messages``).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

SCOPE = Path(__file__).resolve().parents[1] / "scope"


def _package(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and not parts[1].startswith("_"):
        return ".".join(parts[:2])
    return "scope"  # the kernel: scope itself and its private top-level modules


def _modules(root: Path) -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        trees[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return trees


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """The private names each package defines: functions, classes, assigned names and
    attributes, ``__slots__`` entries."""
    names: dict[str, set[str]] = collections.defaultdict(set)
    for module, tree in trees.items():
        mine = names[_package(module)]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mine.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                mine.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                mine.add(node.id)
            elif isinstance(node, ast.Constant) and str(node.value).isidentifier():
                mine.add(str(node.value))
    return names


def reaches(root: Path = SCOPE) -> list[str]:
    """Every private reach across packages under ``root``, one line each."""
    trees = _modules(root)
    defined = _defined(trees)
    found = []
    for module, tree in trees.items():
        package = _package(module)
        others = set().union(*(names for p, names in defined.items() if p != package))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scope"):
                target = node.module or ""
                if _package(target) in (package, "scope"):
                    continue
                if any(_private(part) for part in target.split(".")[2:]):
                    found.append(f"{module}:{node.lineno}: imports private module {target}")
                found.extend(
                    f"{module}:{node.lineno}: imports private name {target}.{alias.name}"
                    for alias in node.names
                    if _private(alias.name)
                )
            elif isinstance(node, ast.Import):
                found.extend(
                    f"{module}:{node.lineno}: imports private module {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("scope.")
                    and _package(alias.name) not in (package, "scope")
                    and any(_private(part) for part in alias.name.split(".")[2:])
                )
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if node.attr in others and node.attr not in defined[package]:
                    found.append(f"{module}:{node.lineno}: reaches .{node.attr} of another package")
    return found


def test_no_private_name_crosses_a_package() -> None:
    assert reaches() == []


def test_the_walk_finds_each_kind_of_reach(tmp_path: Path) -> None:
    """The check itself: a private module, a private name and a private attribute of
    another package are each found; the same within one package is not."""
    root = tmp_path / "scope"
    (root / "alpha").mkdir(parents=True)
    (root / "beta").mkdir()
    (root / "__init__.py").write_text("")
    (root / "alpha" / "__init__.py").write_text("from scope.alpha._inner import Thing\n")
    (root / "alpha" / "_inner.py").write_text(
        "class Thing:\n"
        "    def _hidden(self): ...\n"
        "def _helper(): ...\n"
        "Thing()._hidden()\n"  # within its own package: fine
    )
    (root / "beta" / "__init__.py").write_text(
        "from scope.alpha import Thing\n"
        "from scope.alpha._inner import Thing as Again\n"
        "from scope.alpha import _helper\n"
        "Thing()._hidden()\n"
    )
    found = reaches(root)
    assert found == [
        "scope.beta:2: imports private module scope.alpha._inner",
        "scope.beta:3: imports private name scope.alpha._helper",
        "scope.beta:4: reaches ._hidden of another package",
    ]
