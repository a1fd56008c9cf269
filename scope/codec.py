"""The wire codec: one cattrs converter, canonical JSON out, strict JSON in.

``to_json(value)`` is canonical by construction (keys sorted at every level, RawJSON
written verbatim, no whitespace): equal values give equal bytes. ``from_json(data, cls)``
reads the document with an exact reader, so number tokens inside RawJSON positions keep
their spelling, refuses duplicate member names, unknown keys, wrong JSON types (no
coercion of ``1`` to ``"1"``), non-canonical base64 and invalid values, and raises the
target type's ``Invalid…Error`` naming the path of the bad value
(``messages[1].parts[0].kind``) with the inner error as ``__cause__``.

Field names and omission rules follow the Go tags: zero values are omitted except the
required fields; an optional field (``None`` when unset) is written whenever it is set,
so ``temperature=0.0``, ``stop=()`` and ``reasoning_tokens=0`` all reach the wire.
"""

from __future__ import annotations

import base64
import binascii
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import cattrs
import orjson

from scope._json import Num, canonical, loads_exact
from scope.chat import (
    Message,
    Options,
    Output,
    OutputFormat,
    OutputMetadata,
    Part,
    Request,
    Response,
    ResponseMetadata,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
)
from scope.errors import (
    InvalidJSONError,
    InvalidMediaError,
    InvalidMessageError,
    InvalidMetadataError,
    InvalidOptionsError,
    InvalidOutputFormatError,
    InvalidPartError,
    InvalidRequestError,
    InvalidResponseError,
    InvalidToolCallError,
    InvalidToolDefinitionError,
    InvalidToolResultError,
    InvalidUsageError,
    ScopeError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, Source
from scope.metadata import Extensions, Metadata

__all__ = [
    "converter",
    "decode_error_for",
    "encode_messages",
    "from_builtins",
    "from_json",
    "register",
    "to_builtins",
    "to_json",
]

T = TypeVar("T")

#: The one converter. Its hooks are generated below for every protocol value; use
#: ``to_json``/``from_json`` rather than calling it directly when bytes are wanted.
converter: Final = cattrs.Converter()

#: The error each class raises when it cannot be decoded.
_ERRORS: dict[type, type[Exception]] = {
    Source: InvalidMediaError,
    Media: InvalidMediaError,
    ToolCall: InvalidToolCallError,
    ToolCallDelta: InvalidToolCallError,
    ToolOutput: InvalidToolResultError,
    ToolResult: InvalidToolResultError,
    Part: InvalidPartError,
    Message: InvalidMessageError,
    ToolDefinition: InvalidToolDefinitionError,
    OutputFormat: InvalidOutputFormatError,
    Options: InvalidOptionsError,
    Request: InvalidRequestError,
    Usage: InvalidUsageError,
    ResponseMetadata: InvalidResponseError,
    OutputMetadata: InvalidResponseError,
    Output: InvalidResponseError,
    Response: InvalidResponseError,
    Metadata: InvalidMetadataError,
    Extensions: InvalidMetadataError,
    RawJSON: InvalidJSONError,
}

#: JSON names that differ from the attribute names.
_WIRE_NAMES: Final[dict[tuple[type, str], str]] = {(Source, "data"): "bytes"}

#: Fields written even when they hold their default value.
_ALWAYS: Final[set[tuple[type, str]]] = {(ToolResult, "output")}


class _Fail(Exception):
    """A decoding failure on its way up; the path is built as it unwinds."""

    def __init__(self, message: str, error: type[Exception], cause: BaseException | None = None):
        super().__init__(message)
        self.message = message
        self.error = error
        self.cause = cause
        self.path: list[str | int] = []


def _json_type(value: Any) -> str:
    if isinstance(value, Num):
        return "number"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _expected(what: str, value: Any, error: type[Exception]) -> _Fail:
    return _Fail(f"expected {what}, got {_json_type(value)}", error)


# ---------------------------------------------------------------- structuring (decode)

Structurer = Callable[[Any], Any]


def _str_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> str:
        if type(value) is not str:
            raise _expected("a string", value, error)
        return value

    return structure


def _bool_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> bool:
        if type(value) is not bool:
            raise _expected("a boolean", value, error)
        return value

    return structure


def _int_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> int:
        kind = type(value)
        if kind is Num:
            if "." in value or "e" in value or "E" in value:
                raise _Fail(f"expected an integer, got {value}", error)
            return int(value)
        if kind is int:
            return value  # type: ignore[no-any-return]
        raise _expected("an integer", value, error)

    return structure


def _float_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> float:
        kind = type(value)
        if kind is Num:
            result = float(value)
            if result in (float("inf"), float("-inf")):
                raise _Fail(f"number {value} is out of range", error)
            return result
        if kind is float or kind is int:
            return float(value)
        raise _expected("a number", value, error)

    return structure


def _bytes_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> bytes:
        if type(value) is not str:
            raise _expected("a base64 string", value, error)
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _Fail("invalid base64 (standard alphabet, padded)", error) from None
        if base64.b64encode(data).decode("ascii") != value:
            raise _Fail("non-canonical base64 (standard alphabet, padded)", error)
        return data

    return structure


def _raw_json_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> RawJSON:
        try:
            return RawJSON._trusted(canonical(value, check_floats=True))
        except (ValueError, TypeError) as exc:
            raise _Fail(f"invalid JSON value: {exc}", error) from None

    return structure


def _metadata_in(cls: type[Metadata], error: type[Exception]) -> Structurer:
    raw = _raw_json_in(InvalidMetadataError)

    def structure(value: Any) -> Metadata:
        if type(value) is not dict:
            raise _expected("an object", value, error)
        data: dict[str, RawJSON] = {}
        for key, item in value.items():
            try:
                cls._check_key(key)
                data[key] = raw(item)
            except _Fail as fail:
                fail.path.insert(0, key)
                raise
            except InvalidMetadataError as exc:
                key_fail = _Fail(str(exc), InvalidMetadataError, exc)
                key_fail.path.insert(0, key)
                raise key_fail from None
        return cls._trusted(data)

    return structure


def _enum_in(cls: type[enum.Enum], error: type[Exception]) -> Structurer:
    members = {member.value: member for member in cls}
    allowed = ", ".join(repr(v) for v in members)

    def structure(value: Any) -> enum.Enum:
        if type(value) is not str:
            raise _expected("a string", value, error)
        member = members.get(value)
        if member is None:
            raise _Fail(f"must be one of {allowed}, got {value!r}", error)
        return member

    return structure


def _tuple_in(item: Structurer, error: type[Exception]) -> Structurer:
    def structure(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _expected("an array", value, error)
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except _Fail as fail:
                fail.path.insert(0, index)
                raise
        return tuple(out)

    return structure


def _optional_in(inner: Structurer) -> Structurer:
    def structure(value: Any) -> Any:
        return None if value is None else inner(value)

    return structure


_CLASS_IN: dict[type, Structurer] = {}


def _class_in(cls: type) -> Structurer:
    """The structurer of an attrs class, built on first use (classes may nest)."""
    found = _CLASS_IN.get(cls)
    if found is not None:
        return found

    def lazy(value: Any) -> Any:
        return _CLASS_IN[cls](value)

    return lazy


def _structurer_for(hint: Any, error: type[Exception]) -> Structurer:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        return _optional_in(_structurer_for(args[0], error))
    if origin is tuple:
        item_type, _ellipsis = typing.get_args(hint)
        return _tuple_in(_structurer_for(item_type, error), error)
    if hint is str:
        return _str_in(error)
    if hint is bool:
        return _bool_in(error)
    if hint is int:
        return _int_in(error)
    if hint is float:
        return _float_in(error)
    if hint is bytes:
        return _bytes_in(error)
    if hint is RawJSON:
        return _raw_json_in(error)
    if isinstance(hint, type) and issubclass(hint, Metadata):
        return _metadata_in(hint, error)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_in(hint, error)
    if attrs.has(hint):
        return _class_in(hint)
    raise TypeError(f"no structurer for {hint!r}")


def _make_class_in(cls: type) -> Structurer:
    error = _ERRORS[cls]
    hints = {field.name: field.type for field in attrs.fields(cls)}
    fields = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        wire = _WIRE_NAMES.get((cls, field.name), field.name)
        required = field.default is attrs.NOTHING
        fields.append((field.name, wire, _structurer_for(hints[field.name], error), required))
    allowed = frozenset(wire for _, wire, _, _ in fields)
    what = cls.__name__

    def structure(value: Any) -> Any:
        if type(value) is not dict:
            raise _expected(f"an object ({what})", value, error)
        if not allowed.issuperset(value):
            unknown = sorted(set(value) - allowed)[0]
            fail = _Fail(f"unknown field {unknown!r} in {what}", error)
            fail.path.append(unknown)
            raise fail
        kwargs = {}
        for name, wire, struct, required in fields:
            if wire in value:
                try:
                    kwargs[name] = struct(value[wire])
                except _Fail as fail:
                    fail.path.insert(0, wire)
                    raise
            elif required:
                missing = _Fail(f"missing required field {wire!r} of {what}", error)
                missing.path.append(wire)
                raise missing
        try:
            return cls(**kwargs)
        except ScopeError as exc:
            raise _Fail(str(exc), type(exc), exc) from None

    return structure


# ---------------------------------------------------------------- unstructuring (encode)

Unstructurer = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _bytes_out(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _raw_json_out(value: RawJSON) -> Any:
    return orjson.Fragment(value.bytes)


def _metadata_out(value: Metadata) -> Any:
    return {key: orjson.Fragment(raw.bytes) for key, raw in value.items()}


def _enum_out(value: enum.Enum) -> Any:
    return value.value


def _unstructurer_for(hint: Any) -> Unstructurer:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _unstructurer_for(inner)  # None is never written: it is omitted
    if origin is tuple:
        item_type, _ellipsis = typing.get_args(hint)
        item = _unstructurer_for(item_type)
        if item is _identity:
            return list
        return lambda value: [item(element) for element in value]
    if hint in (str, bool, int, float):
        return _identity
    if hint is bytes:
        return _bytes_out
    if hint is RawJSON:
        return _raw_json_out
    if isinstance(hint, type) and issubclass(hint, Metadata):
        return _metadata_out
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_out
    if attrs.has(hint):
        return lambda value: _CLASS_OUT[type(value)](value)
    raise TypeError(f"no unstructurer for {hint!r}")


_CLASS_OUT: dict[type, Unstructurer] = {}
_OMIT_NONE: Final = object()


def _make_class_out(cls: type) -> Unstructurer:
    hints = {field.name: field.type for field in attrs.fields(cls)}
    plan = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        wire = _WIRE_NAMES.get((cls, field.name), field.name)
        if field.default is attrs.NOTHING or (cls, field.name) in _ALWAYS:
            skip: Any = attrs.NOTHING  # always written
        elif field.default is None:
            skip = _OMIT_NONE
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            skip = field.default.factory()
        else:
            skip = field.default
        plan.append((field.name, wire, _unstructurer_for(hints[field.name]), skip))

    def unstructure(value: Any) -> dict[str, Any]:
        out = {}
        for name, wire, fn, skip in plan:
            item = getattr(value, name)
            if skip is _OMIT_NONE:
                if item is None:
                    continue
            elif skip is not attrs.NOTHING and item == skip:
                continue
            out[wire] = fn(item)
        return out

    return unstructure


def register(cls: type) -> None:
    """Generate and register the hooks of an attrs value class (and its error type)."""
    _CLASS_IN[cls] = _make_class_in(cls)
    _CLASS_OUT[cls] = _make_class_out(cls)
    converter.register_structure_hook(cls, lambda obj, _cls: _CLASS_IN[_cls](obj))
    converter.register_unstructure_hook(cls, _CLASS_OUT[cls])


for _cls in (
    Source,
    Media,
    ToolCall,
    ToolCallDelta,
    ToolOutput,
    ToolResult,
    Part,
    Message,
    ToolDefinition,
    OutputFormat,
    Options,
    Request,
    Usage,
    ResponseMetadata,
    OutputMetadata,
    Output,
    Response,
):
    register(_cls)
del _cls


def _top_in(cls: type[T]) -> Callable[[Any], T]:
    if cls in _CLASS_IN:
        return _CLASS_IN[cls]
    if cls is RawJSON:
        return _raw_json_in(InvalidJSONError)
    if isinstance(cls, type) and issubclass(cls, Metadata):
        return _metadata_in(cls, InvalidMetadataError)
    raise TypeError(f"scope.codec cannot decode {cls!r}")


def decode_error_for(cls: type) -> type[Exception]:
    """The error class ``from_json(..., cls)`` raises for bad input."""
    return _ERRORS.get(cls, InvalidJSONError)


def _raise_as(cls: type, fail: _Fail) -> typing.NoReturn:
    error = decode_error_for(cls)
    path = ""
    for step in fail.path:
        if isinstance(step, int):
            path += f"[{step}]"
        else:
            path += f".{step}" if path else step
    message = f"{path}: {fail.message}" if path else fail.message
    cause = fail.cause
    if cause is None and fail.error is not error:
        cause = fail.error(message)
    raise error(message) from cause


def _structure(obj: Any, cls: type[T]) -> T:
    try:
        return _top_in(cls)(obj)
    except _Fail as fail:
        _raise_as(cls, fail)


def from_json(data: str | bytes | bytearray | memoryview, cls: type[T]) -> T:
    """Decode one JSON document into ``cls``, strictly (see the module docstring)."""
    try:
        tree = loads_exact(data)
    except ValueError as exc:
        raise decode_error_for(cls)(f"invalid JSON: {exc}") from None
    return _structure(tree, cls)


def from_builtins(obj: Any, cls: type[T]) -> T:
    """Build ``cls`` from JSON-like Python objects (dicts, lists, str, int, float, ...)."""
    return _structure(obj, cls)


def _encode_default(value: Any) -> Any:
    out = _CLASS_OUT.get(type(value))
    if out is not None:
        return out(value)
    if isinstance(value, RawJSON):
        return orjson.Fragment(value.bytes)
    if isinstance(value, Metadata):
        return _metadata_out(value)
    raise TypeError(f"scope.codec cannot encode {type(value).__name__}")


_DUMP_OPTIONS: Final = orjson.OPT_SORT_KEYS


def to_json(value: Any) -> bytes:
    """The canonical JSON bytes of a value (or a list/tuple of values)."""
    try:
        return orjson.dumps(value, default=_encode_default, option=_DUMP_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc)) from exc


def to_builtins(value: Any) -> Any:
    """Plain JSON-compatible Python objects (RawJSON positions become decoded values)."""
    return orjson.loads(to_json(value))


def encode_messages(messages: tuple[Message, ...] | list[Message]) -> bytes:
    """The canonical JSON array of messages (what a history Batch digests)."""
    return to_json(messages)
