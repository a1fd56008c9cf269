"""A griffe extension for the API reference: a class's bases list only public classes.

``Bases: HTTPAdapter`` would send a reader to a class that is not documented and that
they cannot import. A base of the package is kept when it is public: its class says a
public module is its home (``scope._validate.publish`` sets ``__module__`` of every
exported class to the public path, so ``scope.history.Reader`` is kept though it is
defined in ``scope.history._protocols``). Bases from outside the package (``Protocol``,
``ValueError``) are always kept.
"""

from __future__ import annotations

import importlib
from typing import Any

import griffe


def _public(dotted: str) -> bool:
    return not any(part.startswith("_") for part in dotted.split("."))


def _is_public_class(path: str) -> bool:
    module_name, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return _public(path)
    return _public(f"{cls.__module__}.{cls.__qualname__}")


def _classes(module: griffe.Module) -> list[griffe.Class]:
    found: list[griffe.Class] = []
    stack: list[griffe.Object] = [module]
    while stack:
        obj = stack.pop()
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_class:
                found.append(member)  # type: ignore[arg-type]
            if member.is_class or member.is_module:
                stack.append(member)  # type: ignore[arg-type]
    return found


class PublicBases(griffe.Extension):
    """Hide the bases that are private classes of the package being documented; what
    the class inherits from them stays documented (it becomes the class's own entry)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        prefix = pkg.name + "."
        for cls in _classes(pkg):
            kept = [
                base
                for base in cls.bases
                if not (path := getattr(base, "canonical_path", str(base))).startswith(prefix)
                or _is_public_class(path)
            ]
            if len(kept) == len(cls.bases):
                continue
            for name, member in cls.inherited_members.items():
                if name not in cls.members:
                    cls.set_member(name, member)
            cls.bases = kept
