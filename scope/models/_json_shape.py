"""Reading provider JSON: the shape checks both wire mappings share.

Each raises ``InvalidResponseError`` naming where the bad value is (``where``) and what
it was instead (``kind``).
"""

from __future__ import annotations

from typing import Any, final

import orjson

from scope._json import kind, parse_exact
from scope.errors import InvalidResponseError
from scope.jsonvalue import RawJSON

__all__ = [
    "Verbatim",
    "bare_mime",
    "count",
    "kind",
    "load",
    "meta_text",
    "nested_count",
    "obj",
]


@final
class Verbatim:
    """The document a body or event was parsed from, for the values kept verbatim.

    ``load`` gives plain values (a number spelled ``2.50`` becomes the float 2.5); a
    provider's own item kept as a native part (DESIGN §6k) must keep its number tokens
    as the provider wrote them. ``at(*path)`` is the value at ``path`` (object keys and
    array indexes) read from the document exactly, as canonical RawJSON; the document
    is read that way once, at the first ``at``, so answers without such items pay
    nothing. A document the exact reader refuses (a duplicate member name) raises
    ``InvalidResponseError``.
    """

    __slots__ = ("_data", "_tree")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._tree: Any = None

    def at(self, *path: str | int) -> RawJSON:
        """The value at ``path``, its number tokens as written."""
        return RawJSON.from_value(self.tree(*path))

    def tree(self, *path: str | int) -> Any:
        """The parsed value at ``path`` as ``RawJSON.from_value`` takes it (numbers as
        tokens spelled as written): to be edited before it becomes RawJSON."""
        tree = self._tree
        if tree is None:
            try:
                tree = self._tree = parse_exact(self._data)
            except ValueError as exc:  # what orjson let through: duplicate members, ...
                raise InvalidResponseError(f"a kept item is not exact JSON: {exc}") from exc
        for step in path:
            tree = tree[step]
        return tree


def obj(value: object, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object."""
    if type(value) is not dict:
        raise InvalidResponseError(f"{where} must be an object, got {kind(value)}")
    return value


def load(data: bytes, what: str) -> dict[str, Any]:
    """A body or event that must be one JSON object."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidResponseError(f"{what} is not valid JSON: {exc}") from exc
    return obj(value, what)


def count(source: dict[str, Any], key: str, where: str) -> int | None:
    """A non-negative integer member (a token count), or None when absent or null."""
    value = source.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise InvalidResponseError(f"{where}.{key} must be a non-negative integer, got {value!r}")
    return value


def meta_text(where: str, value: str) -> str:
    """A response id or model name: no surrounding whitespace."""
    if value != value.strip():
        raise InvalidResponseError(f"{where} must not have surrounding whitespace: {value!r}")
    return value


def bare_mime(mime: str) -> str:
    """A media type without parameters, lowercased."""
    return mime.partition(";")[0].strip().lower()


def nested_count(source: dict[str, Any], parent: str, key: str, where: str) -> int | None:
    """``count`` of ``source[parent][key]`` (a details object's token count), or None
    when either is absent or null."""
    details = source.get(parent)
    if details is None:
        return None
    here = f"{where}.{parent}"
    return count(obj(details, here), key, here)
