"""Whether a parsed tree is in the one form the encoder writes, without encoding again.

A stored record must hold exactly the bytes ``to_json`` writes for its decoded values.
Checking that by encoding the decoded values again costs about as much as decoding
them. Instead, ``canonical_<Class>(tree)`` (generated per class, like the structurers)
checks a tree the structurer accepted for the three ways a tree can decode to values
whose encoding differs from the tree itself:

- a member present that the encoder omits: a field at its default (``""``, ``0``,
  ``false``, ``[]``, ``{}`` metadata, an attrs default value) or an optional field
  written as ``null``;
- a float field written as an integer (``1`` decodes to ``1.0``, which encodes as
  ``1.0``);
- the same, anywhere in a nested value.

Every other field encodes as the tree holds it: strings, integers, booleans and enum
values as they are; bytes as the base64 text (the structurer refuses any but the
canonical spelling); RawJSON and Metadata as the canonical JSON of their tree (keys
sorted). So for a tree from ``orjson.loads`` that the structurer accepted and whose
``orjson.dumps(tree, option=OPT_SORT_KEYS)`` gives back the input byte for byte, the
input is the canonical encoding of the decoded value exactly when ``canonical_<Class>``
holds (tests/chat/test_codec_canonical.py checks this with hypothesis against encoding
the value again). Trees with ``Num`` tokens (the exact reader's) are not covered: their
callers encode again.

Stores reading records apply the same rules inside the structuring pass: the strict
structurers (``_structure.strict_in``) check each member's rule (``field_rule``) where
they read it, so the tree is walked once; ``canonical_<Class>`` runs there only for an
object of a key layout not seen before.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable
from typing import Any, Final

import attrs
import orjson

from scope._codec._generated import NAMESPACE, constant, define, hook_name
from scope._codec._structure import _optional_type, wire_name
from scope.metadata import Metadata

__all__ = ["canonical_in", "field_rule", "register"]

#: The classes whose checks are generated on first use (their encoders must exist by
#: then: an attrs default is compared in its encoded form).
_PENDING: Final[set[type]] = set()

#: Fields written even when they hold their default value (as in ``_unstructure``).
_ALWAYS: Final[set[tuple[str, str]]] = {("ToolResult", "output")}


def register(cls: type) -> None:
    """Generate ``canonical_<cls>`` when it is first needed."""
    _PENDING.add(cls)
    NAMESPACE[hook_name("canonical", cls)] = _lazy(cls)


def _lazy(cls: type) -> Callable[[Any], bool]:
    """Stands in for ``canonical_<cls>`` until its first call generates it (a caller
    that kept this function goes on calling the generated one)."""
    made: list[Callable[[Any], bool]] = []

    def first_call(value: Any) -> bool:
        if not made:
            made.append(_make(cls))
        return made[0](value)

    return first_call


def canonical_in(cls: type) -> Callable[[Any], bool]:
    """The check of ``cls`` (a registered class)."""
    check: Callable[[Any], bool] = NAMESPACE[hook_name("canonical", cls)]
    return check


def _value_check(hint: Any, var: str) -> str | None:
    """An expression true when ``var`` (present, not omitted) encodes as it is, or None
    when it always does."""
    optional = _optional_type(hint)
    if optional is not None:
        hint = optional
    origin = typing.get_origin(hint)
    if origin is tuple or origin is list:
        inner = _value_check(typing.get_args(hint)[0], "e")
        return None if inner is None else f"all([{inner} for e in {var}])"
    if hint is float:
        return f"type({var}) is float"
    if isinstance(hint, type) and (issubclass(hint, enum.Enum) or issubclass(hint, Metadata)):
        return None
    if attrs.has(hint):
        return f"{hook_name('canonical', hint)}({var})"
    return None


def field_rule(cls: type, index: int, field: attrs.Attribute[Any]) -> tuple[str | None, str | None]:
    """The canonical rule of one init field of ``cls`` (field number ``index``), as two
    expressions over the member's JSON value ``v``: whether a present member is one the
    encoder writes (None for a required field, always written), and whether the value
    holds its encoder's form (None when it always does). A field always written may
    still be absent from a tree the structurer accepts (one with a default, written
    even at it): then the tree is not canonical."""
    from scope._codec._unstructure import encode_default  # imports this module's peers

    check = _value_check(field.type, "v")
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    if default is attrs.NOTHING or (cls.__name__, field.name) in _ALWAYS:
        return None, check
    if default is None:
        return "v is not None", check
    if isinstance(default, Metadata | str | bytes | bool | int | float | tuple):
        return "v", check  # the encoder omits the empty / zero / false value
    # an attrs default: omitted when the value equals it
    tree = constant(
        "canonical",
        cls,
        f"d{index}",
        orjson.loads(orjson.dumps(default, default=encode_default)),
    )
    return f"v != {tree}", check


def _make(cls: type) -> Callable[[Any], bool]:
    """Generate ``canonical_<cls>``: every present member is one the encoder writes, and
    every value holds its encoder's form (see the module docstring)."""
    _PENDING.discard(cls)
    body: list[str] = []
    for index, field in enumerate(attrs.fields(cls)):
        if not field.init:
            continue
        wire = wire_name(cls, field)
        written, check = field_rule(cls, index, field)
        if written is None:  # always written: absent (at its default) is not canonical
            body += [
                f"    v = get({wire!r}, MISSING)",
                "    if v is MISSING:",
                "        return False",
            ]
            if check is not None:
                body += [f"    if not ({check}):", "        return False"]
            continue
        body += [
            f"    v = get({wire!r}, MISSING)",
            "    if v is not MISSING:",
            f"        if not ({written}):",
            "            return False",
        ]
        if check is not None:
            body += [f"        if not ({check}):", "            return False"]
    body = ["    get = value.get", *body, "    return True"]
    return define("canonical", cls, body)
