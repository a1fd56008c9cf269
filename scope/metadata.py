"""``Metadata`` and ``Extensions``: immutable string-keyed maps of ``RawJSON`` values."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, Final, Self

from scope._json import check_str
from scope.errors import InvalidJSONError, InvalidMetadataError
from scope.jsonvalue import RawJSON

__all__ = ["Extensions", "Metadata"]


class Metadata(Mapping[str, RawJSON]):
    """An immutable ``Mapping[str, RawJSON]``.

    Plain values are encoded with ``RawJSON.from_value``; RawJSON values are kept as they
    are (their number spellings included). Keys must be non-empty, valid Unicode. Empty
    metadata is falsy and is omitted on the wire.
    """

    # _json caches the canonical encoding of the map (filled by scope.codec on first use).
    __slots__ = ("_data", "_hash", "_json")
    _data: dict[str, RawJSON]
    _hash: int | None
    _json: bytes | None
    _what: ClassVar[str] = "metadata"

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        if isinstance(data, Mapping):
            items: Iterable[Any] = data.items()
        elif isinstance(data, str | bytes | bytearray) or not isinstance(data, Iterable):
            raise InvalidMetadataError(
                f"{self._what} must be a mapping of str to JSON values, got {type(data).__name__}"
            )
        else:
            items = data
        out: dict[str, RawJSON] = {}
        for item in items:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise InvalidMetadataError(
                    f"{self._what} items must be (key, value) pairs, got {item!r}"
                )
            key, value = item
            self._check_key(key)
            if type(key) is not str:
                # A str subclass (an enum, ConversationID) is stored as the plain str:
                # orjson refuses subclass keys, and keys must not carry extra state.
                key = str.__str__(key)
            if key in out:
                raise InvalidMetadataError(f"{self._what} key {key!r} given twice")
            if isinstance(value, RawJSON):
                out[key] = value
            else:
                try:
                    out[key] = RawJSON.from_value(value)
                except InvalidJSONError as exc:
                    raise InvalidMetadataError(f"{self._what}[{key!r}]: {exc}") from exc
        object.__setattr__(self, "_data", out)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_json", None)

    @classmethod
    def _trusted(cls, data: dict[str, RawJSON]) -> Self:
        self = object.__new__(cls)
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_json", None)
        return self

    @classmethod
    def coerce(cls, value: Any) -> Self:
        """Field converter: an instance stays, a mapping is converted."""
        if type(value) is cls:
            return value
        if isinstance(value, Mapping):
            return cls(value)
        raise InvalidMetadataError(
            f"{cls._what} must be a mapping of str to JSON values, got {type(value).__name__}"
        )

    @classmethod
    def _check_key(cls, key: object) -> None:
        if not isinstance(key, str):
            raise InvalidMetadataError(f"{cls._what} keys must be strings, got {key!r}")
        if not key:
            raise InvalidMetadataError(f"{cls._what} keys must not be empty")
        if not check_str(key):
            raise InvalidMetadataError(f"{cls._what} key {key!r} is not valid Unicode")

    def __getitem__(self, key: str) -> RawJSON:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __bool__(self) -> bool:
        return bool(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Metadata):
            return type(self) is type(other) and self._data == other._data
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        assert self._hash is not None
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v}" for k, v in self._data.items())
        return f"{type(self).__name__}({{{inner}}})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._data,))

    def decode(self, key: str) -> Any:
        """The value under ``key`` as a fresh Python object; ``KeyError`` if absent."""
        return self._data[key].value()

    def values_dict(self) -> dict[str, Any]:
        """Every value decoded, in a new dict."""
        return {key: value.value() for key, value in self._data.items()}

    def merge(self, other: Mapping[str, Any]) -> Self:
        """A new map with ``other``'s entries written over this one's (last write wins)."""
        other_map = type(self).coerce(other)
        if not other_map:
            return self
        if not self._data:
            return other_map
        return type(self)._trusted({**self._data, **other_map._data})

    def validate(self) -> None:
        """Re-check every key (values are RawJSON, valid by construction)."""
        for key in self._data:
            self._check_key(key)


class Extensions(Metadata):
    """Provider-specific settings: like ``Metadata``, keys are ``namespace/name``.

    Each segment is non-empty and made of letters, digits (Unicode ones count), ``.``,
    ``_`` and ``-``; exactly one ``/`` separates them.
    """

    __slots__ = ()
    _what: ClassVar[str] = "extensions"

    @classmethod
    def _check_key(cls, key: object) -> None:
        super()._check_key(key)
        assert isinstance(key, str)
        namespace, sep, name = key.partition("/")
        if not sep or not _valid_segment(namespace) or not _valid_segment(name):
            # A second "/" lands in ``name`` and fails the segment check.
            raise InvalidMetadataError(
                f"extensions key {key!r} must be namespace/name: two non-empty segments of "
                "letters, digits, '.', '_' and '-' joined by one '/'"
            )

    def namespace(self, namespace: str) -> dict[str, RawJSON]:
        """The entries of one namespace, keyed by name."""
        prefix = namespace + "/"
        return {k[len(prefix) :]: v for k, v in self._data.items() if k.startswith(prefix)}


def _valid_segment(segment: str) -> bool:
    # Letters are the Unicode L* categories (str.isalpha); digits are Nd (str.isdecimal),
    # as Go's unicode.IsLetter / unicode.IsDigit. str.isalnum would also let in numerals
    # such as "½" or "²", which are not digits.
    return bool(segment) and all(ch.isalpha() or ch.isdecimal() or ch in "._-" for ch in segment)


#: Shared empty values: the default of every metadata field (immutable, so sharing is safe).
EMPTY_METADATA: Final = Metadata()
EMPTY_EXTENSIONS: Final = Extensions()
