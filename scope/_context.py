"""What the history and the tracing layers share: the current conversation and the
cancellation check.

A neutral private module below ``scope.history`` and ``scope.otel`` (and below every
other package), so neither reaches into the other's private modules for them.

- ``conversation(conversation_id)``: a context manager that makes the id current;
  ``current_conversation()`` reads it (None outside any block). The history
  ``Middleware`` holds it around ``await next.call(...)`` and around the synchronous
  ``next.stream(...)`` call; ``scope.otel`` reads it when it starts a chat span.
- ``is_cancellation(exc)``: the one answer to "was this a cancellation?", and
  ``is_stop(exc)`` to "did the consumer stop the stream early?".
"""

from __future__ import annotations

import contextvars
from typing import Final, final

__all__ = ["conversation", "current_conversation", "is_cancellation", "is_stop"]

_conversation: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "scope_conversation", default=None
)

#: BaseExceptions that are not a cancellation: the interpreter's own.
_NOT_CANCELLATION: Final = (Exception, GeneratorExit, KeyboardInterrupt, SystemExit)


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation: asyncio's ``CancelledError``, trio's
    ``Cancelled``, or an exception group (nested groups included) made of them only.

    Both cancellation classes are ``BaseException`` but not ``Exception``; the other
    such built-ins (``GeneratorExit``, ``KeyboardInterrupt``, ``SystemExit``) are not
    cancellations. A group holding a cancellation beside any other error is not a
    cancellation (the error would be lost if it were treated as one); an empty group
    cannot exist.
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(inner) for inner in exc.exceptions)
    return not isinstance(exc, _NOT_CANCELLATION)


def is_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is how a generator learns that its consumer stopped it early
    (``aclose()``, or leaving ``aclosing`` before the end): ``GeneratorExit``."""
    return isinstance(exc, GeneratorExit)


def current_conversation() -> str | None:
    """The conversation id set by an enclosing ``conversation()`` block, or None."""
    return _conversation.get()


@final
class _Conversation:
    __slots__ = ("_id", "_token")

    def __init__(self, conversation_id: str) -> None:
        self._id = str(conversation_id)
        self._token: contextvars.Token[str | None] | None = None

    def __enter__(self) -> None:
        self._token = _conversation.set(self._id)

    def __exit__(self, *exc: object) -> None:
        token = self._token
        if token is not None:
            self._token = None
            _conversation.reset(token)


def conversation(conversation_id: str) -> _Conversation:
    """Make ``conversation_id`` current for code run inside the block.

    ``scope.otel`` reads it when it starts a span and sets ``gen_ai.conversation.id``.
    Costs a context-variable set and reset. Attaches on entry and resets on exit: hold
    it only around awaits, never across a ``yield`` of an async generator.
    """
    return _Conversation(conversation_id)
