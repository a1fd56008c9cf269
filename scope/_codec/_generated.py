"""The namespace the codec's generated functions live in.

The structurer and unstructurer of every class are generated as straight-line functions
(one per class, as cattrs and attrs do: decoding is hot). They share one namespace, like
the functions of one module: each refers to the others by name (``structure_Part``,
``encode_Message``), resolved when it runs, so the order the classes are registered in
does not matter and nested cycles (a Part holds a ToolResult, whose output holds Parts)
need nothing special. Each function's source is registered in ``linecache`` under its own
file name, so a traceback through it shows the generated line.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any, Final

__all__ = ["NAMESPACE", "constant", "define", "hook_name"]

#: The globals of every generated function: the helpers they call, each class's hooks
#: under ``hook_name`` and each function's own constants under ``constant`` names.
NAMESPACE: Final[dict[str, Any]] = {}

#: The class each hook-name suffix belongs to (names must not collide).
_OWNERS: Final[dict[str, type]] = {}


def hook_name(kind: str, cls: type) -> str:
    """The name of a class's hook in the namespace: ``structure_Part``."""
    owner = _OWNERS.setdefault(cls.__name__, cls)
    if owner is not cls:
        raise TypeError(f"scope.codec: two registered classes are named {cls.__name__}")
    return f"{kind}_{cls.__name__}"


def constant(kind: str, cls: type, name: str, value: Any) -> str:
    """Put one constant of a generated function into the namespace; its name there."""
    full = f"_{hook_name(kind, cls)}_{name}"
    NAMESPACE[full] = value
    return full


def define(kind: str, cls: type, body: list[str], variant: str = "") -> Callable[[Any], Any]:
    """Compile ``def <hook_name>(value):`` with ``body`` (lines indented four spaces)
    into the namespace and return it. A ``variant`` (``"shape0"``) names one more
    function of the same kind and class: ``<hook_name>_<variant>``."""
    name = hook_name(kind, cls) + (f"_{variant}" if variant else "")
    source = "\n".join([f"def {name}(value):", *body]) + "\n"
    filename = f"<scope.codec {kind} {cls.__module__}.{cls.__qualname__}"
    filename += f" {variant}>" if variant else ">"
    # mtime None: linecache.checkcache keeps the entry (there is no file to compare).
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), NAMESPACE)
    function: Callable[[Any], Any] = NAMESPACE[name]
    return function
