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

from collections.abc import Callable
from typing import Any, Final, TypeVar

import cattrs
import orjson

from scope._codec import _canonical, _structure, _unstructure
from scope._codec._errors import VALUE_ERRORS, Fail, decode_error_for, raise_as
from scope._codec._generated import NAMESPACE
from scope._json import parse_exact_fast, parse_plain_unchecked
from scope.chat import Message

__all__ = [
    "converter",
    "decode_canonical",
    "decode_error_for",
    "encode_messages",
    "from_builtins",
    "from_json",
    "register_own",
    "to_builtins",
    "to_json",
]

T = TypeVar("T")

#: The shared cattrs converter, with scope's strict hooks for every protocol value.
converter: Final = cattrs.Converter()

#: The protocol value classes, each with a generated structurer and encoder. Any order:
#: the generated functions refer to each other by name when they run.
_VALUE_CLASSES: Final = tuple(VALUE_ERRORS)


def _hook_converter(cls: type, unstructure: Callable[[Any], Any]) -> None:
    converter.register_structure_hook(cls, lambda obj, _cls: from_builtins(obj, _cls))
    converter.register_unstructure_hook(cls, unstructure)


def _register(cls: type) -> None:
    """Generate and register the hooks of a protocol value class (its error type must be
    in ``scope._codec._errors.VALUE_ERRORS``)."""
    _structure.register(cls)
    _unstructure.register(cls)
    _canonical.register(cls)
    _hook_converter(cls, _unstructure.CLASS_OUT[cls])


def register_own(
    cls: type[T],
    error: type[Exception],
    from_tree: Callable[[Any], T],
    to_bytes: Callable[[T], bytes],
) -> None:
    """Register a class that encodes and decodes itself with ``from_json``/``to_json``
    and the converter (``scope.history``'s ``Batch``, whose JSON form carries a digest
    the generated hooks know nothing of; the CLI's export lines).

    ``from_tree`` builds the value from a parsed tree and raises ``error`` for bad
    input; ``to_bytes`` gives the value's canonical JSON. Registered by the class's own
    module, so this module never imports ``scope.history``.
    """
    _structure.register_own(cls, error, from_tree)
    _hook_converter(cls, _unstructure.register_own(cls, to_bytes))


for _cls in _VALUE_CLASSES:
    _register(_cls)
del _cls


def _structure_with(structure: _structure.Structurer, obj: Any, cls: Any) -> Any:
    try:
        return structure(obj)
    except Fail as fail:
        raise_as(cls, fail)


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
    structure = _structure.top_in(cls)
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
    structure = _structure.top_in(cls)
    token = _structure.FROM_BUILTINS.set(True)
    try:
        result: T = _structure_with(structure, obj, cls)
    finally:
        _structure.FROM_BUILTINS.reset(token)
    return result


def to_json(value: Any) -> bytes:
    """The canonical JSON bytes of a value, or of a list/tuple of values."""
    if type(value) is Message:
        return _unstructure.message_bytes(value)
    try:
        return orjson.dumps(value, default=_unstructure.encode_default, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc)) from exc


def to_builtins(value: Any) -> Any:
    """Plain JSON-compatible Python objects (RawJSON positions become decoded values)."""
    return parse_plain_unchecked(to_json(value))


def encode_messages(messages: tuple[Message, ...] | list[Message]) -> bytes:
    """The canonical JSON array of messages (what a history Batch digests)."""
    return to_json(messages)


_strict_messages: Final = _structure.strict_in(Message)
_strict_layouts: Final[dict[Any, Any]] = NAMESPACE["_structure_Message_strict"]
_set_json: Final = Message.__dict__["_json"].__set__  # the slot's own setter (frozen class)


def decode_canonical(data: bytes) -> tuple[tuple[Message, ...], bool] | None:
    """For stores checking a record: the messages of ``data``, a JSON array of
    messages, and whether ``data`` is exactly their canonical encoding
    (``encode_messages``), found without encoding them.

    One pass over the bytes: ``orjson.loads``, then ``orjson.dumps`` of each item (keys
    sorted), which must give ``data`` back byte for byte. That proves the parse lost
    nothing (no duplicate member dropped, no number respelled), as in
    ``parse_exact_fast``, and gives each message its canonical bytes. Each item is then
    read by the strict structurers (``scope._codec._structure.strict_in``): the checks
    and construction of ``from_json``, with the canonical rule of each member checked
    where it is read (``scope._codec._canonical``): the values encode to exactly those
    bytes when each item holds only members the encoder writes, in its form.

    A tree the strict structurers refuse as not canonical is read again by the plain
    ones: its values, and False. None for any other input, or one that does not
    decode: the caller takes the exact reader, which reports the problem with its path."""
    try:
        items = orjson.loads(data)
        if type(items) is not list or not items:
            return None
        parts = [orjson.dumps(item, option=orjson.OPT_SORT_KEYS) for item in items]
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    if b"[" + b",".join(parts) + b"]" != data:
        return None
    layouts, strict, set_json = _strict_layouts, _strict_messages, _set_json
    messages: list[Message] = []
    append = messages.append
    try:
        at = 0  # parts[at] is items[at]'s bytes; a counter is cheaper than zip or enumerate
        for item in items:
            message = (
                (layouts.get(tuple(item)) or strict)(item) if type(item) is dict else strict(item)
            )
            set_json(message, parts[at])  # a fresh value: no bytes kept yet
            append(message)
            at += 1  # noqa: SIM113
    except Fail as fail:
        if fail.error is not _structure.NotCanonical:
            return None  # the strict structurers fail where the plain ones do
        structure = _structure.CLASS_IN[Message]
        try:  # decodable, yet not the bytes scope writes: the values, flagged
            return tuple([structure(item) for item in items]), False
        except Fail:
            return None
    return tuple(messages), True
