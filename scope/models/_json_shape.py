"""Reading provider JSON: the shape checks both wire mappings share.

Each raises ``InvalidResponseError`` naming where the bad value is (``where``) and what
it was instead (``kind``).
"""

from __future__ import annotations

from typing import Any

import orjson

from scope._json import kind
from scope.errors import InvalidResponseError

__all__ = ["bare_mime", "count", "kind", "load", "meta_text", "nested_count", "obj"]


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
