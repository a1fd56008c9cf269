"""Encoding: from values into what ``orjson.dumps`` writes canonically.

Each attrs class gets one generated function (``fields_<Class>``, see ``_generated``)
that builds the dict of its fields that are set: zero values are omitted except the
required fields, an optional field (``None`` when unset) is written whenever it is set.
``encode_<Class>`` is what an enclosing value (and ``orjson``'s ``default``) calls: the
same function, except for ``Message``, which is written from the canonical bytes it
keeps (filled on first encode; a message is immutable, so they never go stale).
``Metadata`` keeps the canonical bytes of its map the same way.
"""

from __future__ import annotations

import binascii
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, Final

import attrs
import orjson

from scope._codec._generated import NAMESPACE, constant, define, hook_name
from scope._codec._structure import wire_name
from scope.chat import Message, ToolResult
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata

__all__ = [
    "CLASS_OUT",
    "Unstructurer",
    "encode_default",
    "message_bytes",
    "register",
    "register_own",
]

Unstructurer = Callable[[Any], Any]

#: Fields written even when they hold their default value (Go has no omitempty there).
_ALWAYS: Final[set[tuple[type, str]]] = {(ToolResult, "output")}

#: The encoder of every registered class, by exact type (orjson's ``default`` uses it).
CLASS_OUT: Final[dict[type, Unstructurer]] = {}


def _bytes_out(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


def _metadata_bytes(value: Metadata) -> bytes:
    """The canonical bytes of a metadata map, cached on the (immutable) map."""
    cached: bytes | None = value._json
    if cached is None:
        cached = orjson.dumps(
            {key: orjson.Fragment(raw._raw_json_bytes) for key, raw in value._data.items()},
            option=orjson.OPT_SORT_KEYS,
        )
        object.__setattr__(value, "_json", cached)
    return cached


def _metadata_out(value: Metadata) -> Any:
    return orjson.Fragment(_metadata_bytes(value))


def message_bytes(value: Message) -> bytes:
    """The canonical bytes of a message, computed once per (immutable) message."""
    cached = value._json
    if cached is None:
        cached = orjson.dumps(NAMESPACE[_MESSAGE_FIELDS](value), option=orjson.OPT_SORT_KEYS)
        object.__setattr__(value, "_json", cached)
    return cached


def _message_out(value: Message) -> Any:
    return orjson.Fragment(message_bytes(value))


_MESSAGE_FIELDS: Final = hook_name("fields", Message)

NAMESPACE.update(b64=_bytes_out, Fragment=orjson.Fragment, metadata_out=_metadata_out)


def _expression(hint: Any, var: str) -> str:
    """The expression that encodes ``var``, a value of type ``hint`` (``None`` is never
    written: it is omitted)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is tuple or origin is list:
        item = _expression(typing.get_args(hint)[0], "e")
        return var if item == "e" else f"[{item} for e in {var}]"
    if hint in (str, bool, int, float) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return var  # orjson writes these itself (str-valued enums by value)
    if hint is bytes:
        return f"b64({var})"
    if hint is RawJSON:
        return f"Fragment({var}._raw_json_bytes)"
    if isinstance(hint, type) and issubclass(hint, Metadata):
        return f"metadata_out({var})"
    if attrs.has(hint):
        return f"{hook_name('encode', hint)}({var})"
    raise TypeError(f"no unstructurer for {hint!r}")


def _make_class_out(cls: type) -> Unstructurer:
    """Generate ``fields_<Class>``: a dict of the fields that are set."""
    body = ["    out = {}"]
    for index, field in enumerate(attrs.fields(cls)):
        if not field.init:
            continue
        wire = wire_name(cls, field)
        expr = _expression(field.type, "v")
        body.append(f"    v = value.{field.name}")
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        if default is attrs.NOTHING or (cls, field.name) in _ALWAYS:
            body.append(f"    out[{wire!r}] = {expr}")
            continue
        if default is None:
            test = "v is not None"
        elif isinstance(default, Metadata):
            test = "v._data"  # non-empty (Metadata.__bool__ without the call)
        elif isinstance(default, str | bytes | bool | int | float | tuple):
            test = "v"  # falsy exactly when empty / zero / False
        else:  # an attrs value (Options, Usage, ToolOutput): omitted when it is the default
            name = constant("fields", cls, f"d{index}", default)
            test = f"v is not {name} and v != {name}"
        body += [f"    if {test}:", f"        out[{wire!r}] = {expr}"]
    body.append("    return out")
    return define("fields", cls, body)


def register(cls: type) -> None:
    """Generate the encoder of an attrs value class."""
    fields = _make_class_out(cls)
    encode = _message_out if cls is Message else fields
    CLASS_OUT[cls] = NAMESPACE[hook_name("encode", cls)] = encode


def register_own(cls: type, to_bytes: Callable[[Any], bytes]) -> Unstructurer:
    """Register a class that encodes itself: ``to_bytes`` gives its canonical JSON."""

    def unstructure(value: Any) -> Any:
        return orjson.Fragment(to_bytes(value))

    CLASS_OUT[cls] = NAMESPACE[hook_name("encode", cls)] = unstructure
    return unstructure


def encode_default(value: Any) -> Any:
    """orjson's ``default``: the registered classes, RawJSON and Metadata."""
    out = CLASS_OUT.get(type(value))
    if out is not None:
        return out(value)
    if isinstance(value, RawJSON):
        return orjson.Fragment(value._raw_json_bytes)
    if isinstance(value, Metadata):
        return _metadata_out(value)
    raise TypeError(f"scope.codec cannot encode {type(value).__name__}")
