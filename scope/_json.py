"""Exact JSON reading and canonical JSON writing, shared by RawJSON and the codec.

Three readers, named for what they guarantee:

- ``parse_exact``: strict (UTF-8, one document, no duplicate member names, no NaN) and
  exact: every number is a ``Num`` token spelled as in the input (``2.50`` stays
  ``2.50``). The stdlib scanner, so it is the slow one.
- ``parse_exact_fast``: the same guarantees, faster: ``orjson.loads`` when re-encoding
  gives back the input byte for byte (nothing was lost), ``parse_exact`` otherwise. Its
  numbers are ints/floats or ``Num`` tokens depending on the input's spelling: the
  codec's internal tree, not plain values.
- ``parse_plain_unchecked``: plain Python values (numbers as exact ints and floats,
  spellings lost) for bytes this library wrote itself (canonical JSON): duplicate member
  names are not refused.

orjson writes every document (``canonical``).
"""

from __future__ import annotations

import enum
import json
import math
import re
from typing import Any, Final

import orjson

from scope.errors import InvalidJSONError

__all__ = [
    "MAX_DEPTH",
    "Num",
    "canonical",
    "check_str",
    "kind",
    "parse_exact",
    "parse_exact_fast",
    "parse_plain_unchecked",
]


def kind(value: object) -> str:
    """What a decoded JSON value is, for error messages: ``"null"``, ``"a boolean"``,
    ``"a number"``, ``"a string"``, ``"an array"``, ``"an object"`` (a value no JSON
    document decodes to: its type's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


#: The deepest nesting RawJSON accepts: ``[[...]]`` 512 levels deep is fine, 513 is not.
MAX_DEPTH: Final = 512


class Num(str):
    """A JSON number token exactly as it was spelled in the source document."""

    __slots__ = ()


class _Duplicate(ValueError):
    pass


class _Constant(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(f"duplicate member name {key!r}")
            seen.add(key)
    return obj


def _constant(name: str) -> Any:
    raise _Constant(f"{name} is not a JSON number")


_decoder: Final = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=Num, parse_int=Num, parse_constant=_constant
)


def parse_exact(data: str | bytes | bytearray | memoryview) -> Any:
    """Parse one JSON document into dicts, lists, strs, bools, None and ``Num`` tokens.

    Raises ``ValueError`` with a readable message for input that is not UTF-8, not JSON,
    has duplicate member names or NaN/Infinity, or nests too deep to parse.
    """
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"input is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from exc
    if text.startswith("\ufeff"):
        raise ValueError("input starts with a byte order mark")
    try:
        return _decoder.decode(text)
    except (_Duplicate, _Constant) as exc:
        raise ValueError(str(exc)) from None
    except json.JSONDecodeError as exc:
        # Callers say it is JSON that failed ("invalid JSON: ..."); the reason alone here.
        raise ValueError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValueError(f"nesting deeper than {MAX_DEPTH} levels") from None


#: A run of 19 digits: an integer token that may not fit in 64 bits (orjson would read
#: it as a lossy float), or a float token with as many digits (harmless to re-read).
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")


def _finite(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise InvalidJSONError(
            f"number {token} is out of float range: it has no Python value (the exact "
            "token is in the document's bytes)"
        )
    return value


def parse_plain_unchecked(data: bytes) -> Any:
    """Decode JSON bytes this library wrote (canonical JSON) into plain Python values;
    integers of any size stay exact. Unchecked: duplicate member names are not refused
    (the last one wins) and number spellings are lost, so never use it on input.

    orjson is used when it is exact: it reads integers beyond 64 bits as floats and
    refuses number tokens out of double range, so those documents take the stdlib reader.
    A number beyond double range (``1e999``) raises ``InvalidJSONError``: it has no
    float, and ``inf`` would be a different value.
    """
    if _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # e.g. 1e999
            pass
    return json.loads(data, parse_float=_finite)


def parse_exact_fast(data: str | bytes | bytearray | memoryview) -> Any:
    """Parse one JSON document exactly, into the tree ``scope.codec.from_builtins``
    reads: ``ValueError`` if the input is not UTF-8, not one JSON document, has duplicate
    member names or NaN.

    The fast path is ``orjson.loads``, accepted only when ``orjson.dumps`` gives back the
    input byte for byte (nothing was lost); any other document goes through
    ``parse_exact``, whose numbers are ``Num`` tokens keeping their spelling. So the
    tree's numbers are ints/floats or ``Num`` depending on the input's spelling: it is
    the codec's internal form, not a plain JSON value (``from_json(data, Any)`` gives
    that)."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            return parse_exact(data)  # reports the lone surrogate
    elif type(data) is bytes:
        raw = data
    elif isinstance(data, bytearray | memoryview):
        raw = bytes(data)
    else:
        raise TypeError(f"JSON input must be str or bytes, got {type(data).__name__}")
    try:
        tree = orjson.loads(raw)
        if orjson.dumps(tree) == raw:
            return tree
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass  # the exact reader gives the precise error (or accepts what orjson cannot)
    return parse_exact(raw)


def _fragment(value: Any) -> Any:
    if isinstance(value, Num):
        return orjson.Fragment(value.encode())
    raw = getattr(value, "_raw_json_bytes", None)
    if raw is not None:
        return orjson.Fragment(raw)
    # OPT_PASSTHROUGH_SUBCLASS (needed for Num) sends every other subclass of str, int
    # and float here too: a str subclass (ConversationID, say) is a str, so it encodes
    # as its builtin value. Enums never get here: orjson writes them by value.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    raise TypeError(f"type {type(value).__name__} is not a JSON value")


_OPTS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS


def canonical(tree: Any, *, check_floats: bool = False) -> bytes:
    """Canonical bytes of a parsed tree: sorted keys, no whitespace, one string spelling.

    ``Num`` tokens and RawJSON values are written verbatim, an ``Enum`` member as its
    value (orjson's rule; the writer for what orjson cannot write keeps it), checked as
    that value is. Raises ``ValueError`` for lone surrogates, non-string keys,
    NaN/Infinity (when ``check_floats``), unsupported types and nesting deeper than
    ``MAX_DEPTH``.
    """
    if check_floats:
        _check_tree(tree, 0)
    try:
        return orjson.dumps(tree, default=_fragment, option=_OPTS)
    except orjson.JSONEncodeError as exc:
        message = str(exc)
        if "Recursion limit" in message or "64-bit" in message:
            # orjson stops at 255 levels and at 64-bit integers; the slow path allows more.
            out: list[bytes] = []
            _write(tree, out, 0)
            return b"".join(out)
        if "surrogates" in message:
            raise ValueError("string is not valid Unicode (lone surrogate)") from None
        raise ValueError(message) from None


_PLAIN: Final = frozenset({str, int, bool, type(None)})


def _check_tree(value: Any, depth: int) -> None:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
    elif kind is dict or kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
        items = value.values() if kind is dict else value
        if kind is dict:
            for key in value:
                if type(key) is not str:
                    raise ValueError(f"object keys must be strings, got {type(key).__name__}")
        for item in items:
            _check_tree(item, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
    elif isinstance(value, dict | list | tuple):
        raise ValueError(f"type {kind.__name__} is not a JSON value")
    elif isinstance(value, enum.Enum) and not isinstance(value, str | int):
        _check_tree(value.value, depth)  # orjson writes a member as its value
    elif depth and kind not in _PLAIN:
        # An embedded RawJSON adds its own nesting to the depth it is embedded at.
        raw = getattr(value, "_raw_json_bytes", None)
        if (
            raw is not None
            and kind is not Num
            and depth + raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
            and depth + _raw_depth(raw) > MAX_DEPTH
        ):
            raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")


def _raw_depth(raw: bytes) -> int:
    """The nesting depth of a JSON document (brackets inside strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x5B or byte == 0x7B:  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte == 0x5D or byte == 0x7D:  # ] }
            depth -= 1
    return deepest


def _write(value: Any, out: list[bytes], depth: int) -> None:
    if isinstance(value, Num):
        out.append(value.encode())
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
        out.append(b"{")
        for index, key in enumerate(sorted(value)):
            if type(key) is not str:
                raise ValueError(f"object keys must be strings, got {type(key).__name__}")
            if index:
                out.append(b",")
            out.append(_string(key))
            out.append(b":")
            _write(value[key], out, depth + 1)
        out.append(b"}")
    elif isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            raise ValueError(f"nesting deeper than {MAX_DEPTH} levels")
        out.append(b"[")
        for index, item in enumerate(value):
            if index:
                out.append(b",")
            _write(item, out, depth + 1)
        out.append(b"]")
    elif isinstance(value, str):
        out.append(_string(value))
    elif value is None or isinstance(value, bool):
        out.append(orjson.dumps(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value).encode())
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        out.append(orjson.dumps(float.__float__(value)))  # orjson refuses a subclass
    elif isinstance(value, enum.Enum):
        _write(value.value, out, depth)  # as orjson writes it
    else:
        out.append(_raw(value))


def _raw(value: Any) -> bytes:
    raw = getattr(value, "_raw_json_bytes", None)
    if raw is None:
        raise ValueError(f"type {type(value).__name__} is not a JSON value")
    return bytes(raw)


def _string(value: str) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise ValueError("string is not valid Unicode (lone surrogate)") from None


def check_str(value: str) -> bool:
    """True when ``value`` is valid Unicode (no lone surrogates)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
