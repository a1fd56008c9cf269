"""``RawJSON``: one complete JSON document held as canonical UTF-8 bytes."""

from __future__ import annotations

from typing import Any, TypeAlias, final

from scope._json import canonical, parse_exact, parse_plain_unchecked
from scope.errors import InvalidJSONError

__all__ = ["JSONDocument", "RawJSON", "coerce_raw_json"]


@final
class RawJSON:
    """One complete JSON document as canonical UTF-8 bytes.

    Canonical means: object keys sorted by code point, no insignificant whitespace, every
    string in one spelling, and every number token exactly as it was written (``1``,
    ``1.0`` and ``1e0`` stay distinct, ``2.50`` stays ``2.50``). Duplicate member names,
    NaN/Infinity, lone surrogates and nesting deeper than 512 levels are refused with
    ``InvalidJSONError``. Values are immutable, hashable and equal when their bytes are.
    """

    __slots__ = ("_raw_json_bytes",)
    _raw_json_bytes: bytes

    def __init__(self, text: str | bytes | bytearray | memoryview) -> None:
        object.__setattr__(self, "_raw_json_bytes", _canonical_text(text))

    @classmethod
    def parse(cls, text: str | bytes | bytearray | memoryview) -> RawJSON:
        """Parse and canonicalise one JSON document."""
        return cls(text)

    @classmethod
    def from_value(cls, value: Any) -> RawJSON:
        """Encode a dict (str keys), list, tuple, str, int, finite float, bool or None.

        RawJSON values may appear inside ``value`` and are embedded verbatim; an ``Enum``
        member is encoded as its value, checked as that value is (a NaN value is refused).
        """
        if isinstance(value, RawJSON):
            return value
        try:
            data = canonical(value, check_floats=True)
        except (ValueError, TypeError) as exc:
            raise InvalidJSONError(f"cannot encode as JSON: {exc}") from None
        return cls.from_canonical(data)

    @classmethod
    def from_canonical(cls, data: bytes) -> RawJSON:
        """Wrap bytes the caller knows are canonical JSON (as ``canonical`` writes them),
        without checking them: for a decoder that produced them itself. Anyone else
        uses ``parse`` or ``from_value``."""
        self = object.__new__(cls)
        object.__setattr__(self, "_raw_json_bytes", data)
        return self

    @property
    def bytes(self) -> bytes:
        """The canonical UTF-8 encoding."""
        return self._raw_json_bytes

    def value(self) -> Any:
        """A fresh decoded Python object (numbers become int or float; integers of any
        size stay exact)."""
        return parse_plain_unchecked(self._raw_json_bytes)

    def __str__(self) -> str:
        return self._raw_json_bytes.decode("utf-8")

    def __repr__(self) -> str:
        text = str(self)
        if len(text) > 80:
            text = text[:77] + "..."
        return f"RawJSON({text!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RawJSON):
            return self._raw_json_bytes == other._raw_json_bytes
        return NotImplemented

    def __hash__(self) -> int:
        return hash((RawJSON, self._raw_json_bytes))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RawJSON is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("RawJSON is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RawJSON.from_canonical, (self._raw_json_bytes,))


def _canonical_text(text: str | bytes | bytearray | memoryview) -> bytes:
    if not isinstance(text, str | bytes | bytearray | memoryview):
        raise InvalidJSONError(f"RawJSON needs str or bytes, got {type(text).__name__}")
    try:
        return canonical(parse_exact(text))
    except ValueError as exc:
        raise InvalidJSONError(f"invalid JSON: {exc}") from None


#: What a field holding a JSON document accepts: RawJSON, or a dict, list or tuple that
#: ``RawJSON.from_value`` encodes.
JSONDocument: TypeAlias = "RawJSON | dict[str, Any] | list[Any] | tuple[Any, ...]"


def coerce_raw_json(value: JSONDocument) -> RawJSON:
    """A ``JSONDocument`` as ``RawJSON`` (the field converter of the chat values):
    RawJSON stays, dicts, lists and tuples are encoded with ``RawJSON.from_value``;
    anything else is an ``InvalidJSONError``."""
    if isinstance(value, RawJSON):
        return value
    if isinstance(value, dict | list | tuple):
        return RawJSON.from_value(value)
    raise InvalidJSONError(f"expected RawJSON, dict or list, got {type(value).__name__}")
