"""Conversation and append ids: validated ``str`` subclasses."""

from __future__ import annotations

import functools
import unicodedata
from typing import ClassVar, Final, Self

from scope.errors import InvalidAppendIDError, InvalidConversationIDError

__all__ = ["MAX_ID_BYTES", "AppendID", "ConversationID"]

#: The longest id, in UTF-8 bytes.
MAX_ID_BYTES: Final = 512


def _check_id(value: object, what: str, error: type[Exception]) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise error(f"{what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} {value!r} is not valid Unicode (lone surrogate)") from None
    if size > MAX_ID_BYTES:
        raise error(f"{what} must be at most {MAX_ID_BYTES} UTF-8 bytes, got {size}")
    if value.strip() != value:
        raise error(f"{what} {value!r} must not have surrounding whitespace")
    if not value.isprintable():
        for ch in value:
            if unicodedata.category(ch) in ("Cc", "Cs"):
                raise error(f"{what} {value!r} must not contain control characters")
    return value


class _ID(str):
    """A validated id: a subclass names what it is and the error it raises."""

    __slots__ = ()
    _what: ClassVar[str]
    _error: ClassVar[type[Exception]]

    def __init_subclass__(cls, *, what: str, error: type[Exception]) -> None:
        super().__init_subclass__()
        cls._what = what
        cls._error = error

    def __new__(cls, value: str) -> Self:
        if type(value) is cls:
            return value
        return super().__new__(cls, _check_id(value, cls._what, cls._error))

    @classmethod
    def bulk(cls, values: list[object]) -> list[Self] | None:
        """Every value as an id when each is a ``str`` that passes a check made on the
        whole list at once (C-level: only printable characters, so no control character
        or lone surrogate; at most 128 characters; no surrounding whitespace; non-empty), else
        None: then validate one by one for the exact error. For listings (a store's
        ``conversations``), where validating each id alone costs as much as fetching
        it."""
        if not values:
            return []
        if set(map(type, values)) != {str}:
            return None
        texts: list[str] = values  # type: ignore[assignment]
        joined = "".join(texts)
        if not all(texts) or not joined.isprintable() or max(map(len, texts)) > 128:
            return None  # 128 characters are at most 512 UTF-8 bytes
        if list(map(str.strip, texts)) != texts:
            return None
        # A lone surrogate is not printable: isprintable() above refused it.
        return list(map(functools.partial(str.__new__, cls), texts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"


class ConversationID(_ID, what="conversation id", error=InvalidConversationIDError):
    """A conversation id: non-empty, at most 512 UTF-8 bytes, no control characters or
    lone surrogates, no surrounding whitespace. Raises ``InvalidConversationIDError``."""

    __slots__ = ()


class AppendID(_ID, what="append id", error=InvalidAppendIDError):
    """An append id (idempotency key of one batch, scoped per conversation): same rules
    as ``ConversationID``. Raises ``InvalidAppendIDError``."""

    __slots__ = ()
