"""The wire codec: canonical JSON out, strict JSON in.

``to_json(value)`` is canonical by construction (keys sorted at every level, RawJSON
written verbatim, no whitespace): equal values give equal bytes. ``from_json(data, cls)``
reads the document exactly, so number tokens inside RawJSON positions keep their
spelling; it refuses duplicate member names, unknown keys, wrong JSON types (no coercion
of ``1`` to ``"1"``), non-canonical base64 and invalid values, and raises the target
type's ``Invalid…Error`` naming the path of the bad value (``messages[1].parts[0].kind``)
with the inner error as ``__cause__``.

Field names and omission rules follow the Go tags: zero values are omitted except the
required fields; an optional field (``None`` when unset) is written whenever it is set,
so ``temperature=0.0``, ``stop=()`` and ``reasoning_tokens=0`` all reach the wire.

How decoding stays exact and fast: a document is first parsed with ``orjson.loads`` and
accepted only when ``orjson.dumps`` of the result gives back the input byte for byte.
That holds for every document ``to_json`` writes, and it proves the parse lost nothing:
no duplicate member was dropped and every number is already in the one spelling orjson
writes, so re-encoding a RawJSON position reproduces its tokens. Any other document
(indented, reordered, ``2.50``, ``1E-7``, duplicates ...) goes through the exact reader
of ``scope._json``, which keeps every number token as written.

Encoding caches: a ``Message`` keeps its canonical bytes in a private slot filled on
first encode (it is immutable, so they never go stale), and ``Metadata`` keeps the
canonical bytes of its map. Encoding a stored history or a request that repeats earlier
messages therefore costs little more than joining bytes.

The hooks are also registered on ``converter`` (a ``cattrs.Converter``), so
``converter.unstructure(value)`` gives orjson-ready objects (RawJSON positions as
``orjson.Fragment``) and ``converter.structure(obj, cls)`` equals ``from_builtins``.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import enum
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import cattrs
import orjson

from scope._json import Num, canonical, parse_exact_fast, parse_plain_unchecked
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

#: The shared cattrs converter, with scope's strict hooks for every protocol value.
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

#: Fields written even when they hold their default value (Go has no omitempty there).
_ALWAYS: Final[set[tuple[type, str]]] = {(ToolResult, "output")}


# ---------------------------------------------------------------- parsing


# ---------------------------------------------------------------- decode failures


class _Key(str):
    """A metadata key in an error path (shown as ``['key']``)."""

    __slots__ = ()


class _Fail(Exception):
    """A decoding failure on its way up; the path is built as it unwinds."""

    def __init__(
        self, message: str, error: type[Exception], cause: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error = error
        self.cause = cause
        self.path: list[str | int] = []

    def at(self, step: str | int) -> _Fail:
        self.path.insert(0, step)
        return self


def _json_type(value: Any) -> str:
    if isinstance(value, Num):
        return f"number {value}"
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
        return f"number {value!r}"
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
        if kind is int:
            return value  # type: ignore[no-any-return]
        if kind is Num:
            if "." in value or "e" in value or "E" in value:
                raise _Fail(f"expected an integer, got {value}", error)
            if len(value) > 20:  # longer than any 64-bit integer; int() would be slow
                raise _Fail(f"integer {value[:20]}... does not fit in 64 bits", error)
            return int(value)
        raise _expected("an integer", value, error)

    return structure


def _float_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> float:
        kind = type(value)
        if kind is float:
            return value  # type: ignore[no-any-return]
        if kind is int:
            try:
                return float(value)
            except OverflowError:  # from_builtins: a Python int beyond any float
                raise _Fail(f"number {value} is out of range", error) from None
        if kind is Num:
            result = float(value)
            if math.isinf(result):
                raise _Fail(f"number {value} is out of range", error)
            return result
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
        # validate=True already refused stray characters and bad padding; what remains
        # non-canonical is non-zero unused bits in the last, padded group.
        tail = len(data) % 3
        if tail and base64.b64encode(data[-tail:]).decode("ascii") != value[-4:]:
            raise _Fail("non-canonical base64 (unused bits set in the last group)", error)
        return data

    return structure


#: True while from_builtins runs: Python objects may hold NaN/Infinity, which orjson
#: would silently write as null. Parsed trees cannot (both readers refuse them).
_FROM_BUILTINS: Final = contextvars.ContextVar("scope_codec_from_builtins", default=False)


def _raw_json_in(error: type[Exception]) -> Structurer:
    def structure(value: Any) -> RawJSON:
        # canonical() enforces the depth limit relative to this value.
        try:
            return RawJSON._trusted(canonical(value, check_floats=_FROM_BUILTINS.get()))
        except (ValueError, TypeError) as exc:
            raise _Fail(f"invalid JSON value: {exc}", error) from None

    return structure


def _metadata_in(cls: type[Metadata], error: type[Exception]) -> Structurer:
    raw = _raw_json_in(InvalidMetadataError)
    check_key = cls._check_key

    def structure(value: Any) -> Metadata:
        if type(value) is not dict:
            raise _expected("an object", value, error)
        data: dict[str, RawJSON] = {}
        for key, item in value.items():
            try:
                check_key(key)
                data[key] = raw(item)
            except _Fail as fail:
                raise fail.at(_Key(key)) from None
            except InvalidMetadataError as exc:
                raise _Fail(str(exc), InvalidMetadataError, exc).at(_Key(key)) from None
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
                raise fail.at(index) from None
        return tuple(out)

    return structure


def _list_in(item: Structurer, error: type[Exception]) -> Structurer:
    as_tuple = _tuple_in(item, error)

    def structure(value: Any) -> list[Any]:
        return list(as_tuple(value))

    return structure


def _optional_in(inner: Structurer) -> Structurer:
    def structure(value: Any) -> Any:
        return None if value is None else inner(value)

    return structure


_CLASS_IN: dict[type, Structurer] = {}


def _class_in(cls: type) -> Structurer:
    """The structurer of an attrs class, looked up on use (classes may nest)."""
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
    if origin is list:
        (item_type,) = typing.get_args(hint)
        return _list_in(_structurer_for(item_type, error), error)
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
    """Generate the structurer of an attrs class: one straight-line function per class
    (as cattrs does), since decoding is hot.

    The fields it produces already have their exact types (tuples, enum members, bytes,
    Metadata, RawJSON, floats), which is what the class converters would make of them, so
    the value is assembled without ``__init__`` (slots written through their member
    descriptors) and then checked with ``validate()``: the same checks construction runs
    (every ``__attrs_post_init__`` is ``validate()``).
    """
    error = _ERRORS[cls]
    what = cls.__name__
    namespace: dict[str, Any] = {
        "cls": cls,
        "error": error,
        "_Fail": _Fail,
        "ScopeError": ScopeError,
        "_expected": _expected,
        "_unknown": _unknown_field(cls, error),
        "_missing": _missing_field(cls, error),
        "_new": object.__new__,
        "_set": object.__setattr__,
        "_MISSING": _MISSING,
    }
    allowed = []
    lines = [
        "def structure(value):",
        "    if type(value) is not dict:",
        f"        raise _expected('an object ({what})', value, error)",
        "    if not allowed.issuperset(value):",
        "        raise _unknown(value)",
        "    get = value.get",
    ]
    assign = ["    obj = _new(cls)"]
    for index, field in enumerate(attrs.fields(cls)):
        local = f"f{index}"
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()  # values are immutable: one shared default
        namespace[f"d{index}"] = default
        slot = cls.__dict__.get(field.name)
        if isinstance(slot, types.MemberDescriptorType):
            # The slot's own setter: what object.__setattr__ ends up calling, without
            # the attribute lookup (frozen classes refuse plain assignment).
            namespace[f"w{index}"] = slot.__set__
            assign.append(f"    w{index}(obj, {local})")
        else:  # pragma: no cover - every value class is slotted
            assign.append(f"    _set(obj, {field.name!r}, {local})")
        if not field.init:
            lines.append(f"    {local} = d{index}")
            continue
        wire = _WIRE_NAMES.get((cls, field.name), field.name)
        allowed.append(wire)
        fn = f"s{index}"
        namespace[fn] = _structurer_for(field.type, error)
        lines.append(f"    v = get({wire!r}, _MISSING)")
        if default is attrs.NOTHING:
            lines += ["    if v is _MISSING:", f"        raise _missing({wire!r})"]
            indent = "    "
        else:
            lines += ["    if v is _MISSING:", f"        {local} = d{index}", "    else:"]
            indent = "        "
        hint = field.type
        item_type = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None
        optional = None
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = inner[0] if len(inner) == 1 else None
        if hint is str:
            # Inlined: the commonest field type.
            lines += [
                f"{indent}if type(v) is not str:",
                f"{indent}    raise _expected('a string', v, error).at({wire!r})",
                f"{indent}{local} = v",
            ]
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            # Inlined: a dict lookup; the structurer only runs to report a bad value.
            namespace[f"m{index}"] = {member.value: member for member in hint}
            lines += [
                f"{indent}{local} = m{index}.get(v) if type(v) is str else None",
                f"{indent}if {local} is None:",
                f"{indent}    try:",
                f"{indent}        {fn}(v)",
                f"{indent}    except _Fail as fail:",
                f"{indent}        raise fail.at({wire!r}) from None",
            ]
        elif optional is not None and attrs.has(optional):
            # Inlined: an optional nested value (a part's media or tool call).
            namespace[f"c{index}"] = _class_in(optional)
            lines += [
                f"{indent}try:",
                f"{indent}    {local} = None if v is None else c{index}(v)",
                f"{indent}except _Fail as fail:",
                f"{indent}    raise fail.at({wire!r}) from None",
            ]
        elif item_type is not None and attrs.has(item_type):
            # Inlined: a list comprehension; on failure the loop structurer re-runs to
            # name the index of the bad element.
            namespace[f"i{index}"] = _class_in(item_type)
            lines += [
                f"{indent}try:",
                f"{indent}    if type(v) is not list:",
                f"{indent}        raise _Fail('', error)",
                f"{indent}    {local} = tuple([i{index}(e) for e in v])",
                f"{indent}except _Fail:",
                f"{indent}    try:",
                f"{indent}        {fn}(v)",
                f"{indent}    except _Fail as fail:",
                f"{indent}        raise fail.at({wire!r}) from None",
                f"{indent}    raise",  # pragma: no cover - the loop fails the same way
            ]
        else:
            lines += [
                f"{indent}try:",
                f"{indent}    {local} = {fn}(v)",
                f"{indent}except _Fail as fail:",
                f"{indent}    raise fail.at({wire!r}) from None",
            ]
    lines += assign
    lines += [
        "    try:",
        "        obj.validate()",
        "    except ScopeError as exc:",
        "        raise _Fail(str(exc), type(exc), exc) from None",
        "    return obj",
    ]
    namespace["allowed"] = frozenset(allowed)
    exec(compile("\n".join(lines), f"<scope.codec structure {what}>", "exec"), namespace)
    structure: Structurer = namespace["structure"]
    return structure


_MISSING: Final = object()


def _unknown_field(cls: type, error: type[Exception]) -> Callable[[dict[str, Any]], _Fail]:
    names = {_WIRE_NAMES.get((cls, f.name), f.name) for f in attrs.fields(cls) if f.init}

    def unknown(value: dict[str, Any]) -> _Fail:
        name = sorted(set(value) - names)[0]
        return _Fail(f"unknown field {name!r} in {cls.__name__}", error).at(name)

    return unknown


def _missing_field(cls: type, error: type[Exception]) -> Callable[[str], _Fail]:
    def missing(name: str) -> _Fail:
        return _Fail(f"missing required field {name!r} of {cls.__name__}", error).at(name)

    return missing


# ---------------------------------------------------------------- unstructuring (encode)

Unstructurer = Callable[[Any], Any]


def _bytes_out(value: bytes) -> str:
    return binascii.b2a_base64(value, newline=False).decode("ascii")


def _raw_json_out(value: RawJSON) -> Any:
    return orjson.Fragment(value._raw_json_bytes)


def _metadata_out(value: Metadata) -> Any:
    return orjson.Fragment(_metadata_bytes(value))


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


def _unstructurer_for(hint: Any) -> Unstructurer | None:
    """The encoder of one field type; ``None`` when orjson writes the value itself."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _unstructurer_for(inner)  # None is never written: it is omitted
    if origin is tuple or origin is list:
        item = _unstructurer_for(typing.get_args(hint)[0])
        if item is None:
            return None  # orjson writes a tuple of str as an array
        return lambda value: [item(element) for element in value]
    if hint in (str, bool, int, float) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return None  # orjson writes str-valued enums by value
    if hint is bytes:
        return _bytes_out
    if hint is RawJSON:
        return _raw_json_out
    if isinstance(hint, type) and issubclass(hint, Metadata):
        return _metadata_out
    if attrs.has(hint):
        out = _CLASS_OUT.get(hint)
        if out is not None:
            return out
        return lambda value: _CLASS_OUT[type(value)](value)
    raise TypeError(f"no unstructurer for {hint!r}")


_CLASS_OUT: dict[type, Unstructurer] = {}


def _make_class_out(cls: type) -> Unstructurer:
    """Generate the unstructurer of an attrs class: a dict of the fields that are set."""
    namespace: dict[str, Any] = {}
    lines = ["def unstructure(value):", "    out = {}"]
    for index, field in enumerate(attrs.fields(cls)):
        if not field.init:
            continue
        wire = _WIRE_NAMES.get((cls, field.name), field.name)
        hint = field.type
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        item_fn = None
        if typing.get_origin(hint) is tuple:
            item_fn = _unstructurer_for(typing.get_args(hint)[0])
        if item_fn is not None:
            # Inlined: a list of encoded items without a helper call per field.
            namespace[f"u{index}"] = item_fn
            expr = f"[u{index}(e) for e in v]"
        else:
            fn = _unstructurer_for(field.type)
            namespace[f"u{index}"] = fn
            expr = "v" if fn is None else f"u{index}(v)"
        lines.append(f"    v = value.{field.name}")
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        if default is attrs.NOTHING or (cls, field.name) in _ALWAYS:
            lines.append(f"    out[{wire!r}] = {expr}")
            continue
        if default is None:
            test = "v is not None"
        elif isinstance(default, Metadata):
            test = "v._data"  # non-empty (Metadata.__bool__ without the call)
        elif isinstance(default, str | bytes | bool | int | float | tuple):
            test = "v"  # falsy exactly when empty / zero / False
        else:  # an attrs value (Options, Usage, ToolOutput): omitted when it is the default
            namespace[f"d{index}"] = default
            test = f"v is not d{index} and v != d{index}"
        lines += [f"    if {test}:", f"        out[{wire!r}] = {expr}"]
    lines.append("    return out")
    exec(compile("\n".join(lines), f"<scope.codec unstructure {cls.__name__}>", "exec"), namespace)
    unstructure: Unstructurer = namespace["unstructure"]
    return unstructure


def _message_bytes(value: Message) -> bytes:
    """The canonical bytes of a message, computed once per (immutable) message."""
    cached = value._json
    if cached is None:
        cached = orjson.dumps(_MESSAGE_DICT(value), option=orjson.OPT_SORT_KEYS)
        object.__setattr__(value, "_json", cached)
    return cached


def _message_out(value: Message) -> Any:
    return orjson.Fragment(_message_bytes(value))


def register(cls: type) -> None:
    """Generate and register the hooks of an attrs value class (its error type must be
    in the error table)."""
    _CLASS_IN[cls] = _make_class_in(cls)
    _CLASS_OUT[cls] = _make_class_out(cls)
    converter.register_structure_hook(cls, lambda obj, _cls: from_builtins(obj, _cls))
    converter.register_unstructure_hook(cls, _CLASS_OUT[cls])


def _register_own(
    cls: type[T],
    error: type[Exception],
    from_tree: Callable[[Any], T],
    to_bytes: Callable[[T], bytes],
) -> None:
    """Internal: register a class that encodes and decodes itself (``scope.history``'s
    ``Batch``, whose JSON form carries a digest the generated hooks know nothing of).

    ``from_tree`` builds the value from a parsed tree and raises ``error`` for bad
    input; ``to_bytes`` gives the value's canonical JSON. Registered by the class's own
    module, so this module never imports ``scope.history``.
    """

    def structure(value: Any) -> T:
        try:
            return from_tree(value)
        except ScopeError as exc:
            if type(exc) is not error:
                raise
            # The value's own message already names the path inside it; its cause (the
            # nested error, if any) stays the cause.
            raise _Fail(str(exc), error, exc.__cause__) from None

    def unstructure(value: T) -> Any:
        return orjson.Fragment(to_bytes(value))

    _ERRORS[cls] = error
    _CLASS_IN[cls] = structure
    _CLASS_OUT[cls] = unstructure
    converter.register_structure_hook(cls, lambda obj, _cls: from_builtins(obj, _cls))
    converter.register_unstructure_hook(cls, unstructure)


# Innermost first, so outer classes bind their field encoders directly.
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

# ToolOutput.content holds Parts, which are registered after it.
_CLASS_OUT[ToolOutput] = _make_class_out(ToolOutput)
_MESSAGE_DICT: Final = _CLASS_OUT[Message]
# Messages nested in requests, responses and lists are written from their cached bytes.
_CLASS_OUT[Message] = _message_out
for _cls in (Request, Output, Response):
    _CLASS_OUT[_cls] = _make_class_out(_cls)
del _cls


# ---------------------------------------------------------------- public API


def decode_error_for(cls: Any) -> type[Exception]:
    """The error class ``from_json(..., cls)`` raises for bad input (for ``list[X]`` and
    ``tuple[X, ...]``, the error of ``X``)."""
    origin = typing.get_origin(cls)
    if (origin is list or origin is tuple) and cls not in _PLAIN:
        return decode_error_for(typing.get_args(cls)[0])
    return _ERRORS.get(cls, InvalidJSONError)


def _plain_in(kind: type | None) -> Structurer:
    """Decode into plain JSON types (dicts, lists, str, int, float, bool, None): a fresh
    tree, numbers as Python numbers; ``kind`` is the JSON type the top must have."""

    def structure(value: Any) -> Any:
        if kind is not None and type(value) is not kind:
            raise _expected("an object" if kind is dict else "an array", value, InvalidJSONError)
        try:
            return parse_plain_unchecked(canonical(value, check_floats=_FROM_BUILTINS.get()))
        except (ValueError, TypeError) as exc:
            raise _Fail(f"invalid JSON value: {exc}", InvalidJSONError) from None

    return structure


#: Targets decoded into plain JSON types, and the JSON type each needs at the top (what
#: ``OutputFormat.schema_as(dict)`` decodes into).
_PLAIN: Final[dict[Any, type | None]] = {
    dict: dict,
    dict[str, Any]: dict,
    list: list,
    list[Any]: list,
    Any: None,
}

_TOP_IN: dict[Any, Structurer] = {}


def _top_in(cls: Any) -> Structurer:
    found = _CLASS_IN.get(cls) or _TOP_IN.get(cls)
    if found is not None:
        return found
    origin = typing.get_origin(cls)
    if cls in _PLAIN:
        found = _plain_in(_PLAIN[cls])
    elif cls is RawJSON or (isinstance(cls, type) and issubclass(cls, Metadata)):
        found = _structurer_for(cls, decode_error_for(cls))
    elif origin is list or origin is tuple:
        item = typing.get_args(cls)[0]
        if item not in _CLASS_IN:
            raise TypeError(f"scope.codec cannot decode {cls!r}")
        found = _structurer_for(cls, decode_error_for(item))
    else:
        raise TypeError(f"scope.codec cannot decode {cls!r}")
    _TOP_IN[cls] = found
    return found


def _raise_as(cls: Any, fail: _Fail) -> typing.NoReturn:
    error = decode_error_for(cls)
    path = ""
    for step in fail.path:
        if isinstance(step, int):
            path += f"[{step}]"
        elif isinstance(step, _Key):
            path += f"[{str(step)!r}]"
        else:
            path += f".{step}" if path else step
    message = f"{path}: {fail.message}" if path else fail.message
    cause = fail.cause
    if cause is None and fail.error is not error:
        cause = fail.error(message)
    raise error(message) from cause


def _structure_with(structure: Structurer, obj: Any, cls: Any) -> Any:
    try:
        return structure(obj)
    except _Fail as fail:
        _raise_as(cls, fail)


def from_json(data: str | bytes | bytearray | memoryview, cls: type[T]) -> T:
    """Decode one JSON document into ``cls`` strictly (see the module docstring).

    ``cls`` is a protocol value class, ``RawJSON``, ``Metadata``, ``Extensions``,
    ``scope.history.Batch``, ``list[X]`` / ``tuple[X, ...]`` of one of those, or a plain
    JSON target: ``dict`` (the document must be an object), ``list`` (an array) or
    ``typing.Any`` (any document), decoded into fresh dicts, lists, str, int, float,
    bool and None. Bad input of any kind, including text that is not JSON or not UTF-8,
    raises ``decode_error_for(cls)`` (``InvalidJSONError`` for the plain targets). Any
    other ``cls`` raises ``TypeError`` naming it.
    """
    structure = _top_in(cls)
    try:
        tree = parse_exact_fast(data)
    except ValueError as exc:
        raise decode_error_for(cls)(f"invalid JSON: {exc}") from None
    except TypeError as exc:
        raise decode_error_for(cls)(str(exc)) from None
    result: T = _structure_with(structure, tree, cls)
    return result


def from_builtins(obj: Any, cls: type[T]) -> T:
    """Build ``cls`` from JSON-like Python objects (dicts, lists, str, int, float, bool,
    None, or a tree from ``scope._json.parse_exact_fast``), as strictly as ``from_json``.
    Non-finite floats are refused (float fields check their range; RawJSON positions
    refuse NaN/Infinity)."""
    structure = _top_in(cls)
    token = _FROM_BUILTINS.set(True)
    try:
        result: T = _structure_with(structure, obj, cls)
    finally:
        _FROM_BUILTINS.reset(token)
    return result


def _encode_default(value: Any) -> Any:
    out = _CLASS_OUT.get(type(value))
    if out is not None:
        return out(value)
    if isinstance(value, RawJSON):
        return orjson.Fragment(value._raw_json_bytes)
    if isinstance(value, Metadata):
        return _metadata_out(value)
    raise TypeError(f"scope.codec cannot encode {type(value).__name__}")


_DUMP_OPTIONS: Final = orjson.OPT_SORT_KEYS


def to_json(value: Any) -> bytes:
    """The canonical JSON bytes of a value, or of a list/tuple of values."""
    if type(value) is Message:
        return _message_bytes(value)
    try:
        return orjson.dumps(value, default=_encode_default, option=_DUMP_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc)) from exc


def to_builtins(value: Any) -> Any:
    """Plain JSON-compatible Python objects (RawJSON positions become decoded values)."""
    return parse_plain_unchecked(to_json(value))


def encode_messages(messages: tuple[Message, ...] | list[Message]) -> bytes:
    """The canonical JSON array of messages (what a history Batch digests)."""
    return to_json(messages)
