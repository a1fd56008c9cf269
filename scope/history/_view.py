"""``HistoryView``: one atomic read of a conversation (DESIGN §6b)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, final

import attrs

from scope.chat import Message
from scope.errors import InvalidViewError

__all__ = ["HistoryView"]

_MAX_LENGTH = 2**63
_MESSAGE_TYPE = frozenset({Message})


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidViewError(
            f"view messages must be a sequence of messages, got {type(value).__name__}"
        )
    messages = tuple(value)
    if not set(map(type, messages)) <= _MESSAGE_TYPE:  # Message is final: C-speed check
        for index, message in enumerate(messages):
            if type(message) is not Message:
                raise InvalidViewError(
                    f"messages[{index}] must be a Message, got {type(message).__name__}"
                )
    return messages


def _check_length(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not int:
        raise InvalidViewError(f"view length must be an int, got {type(value).__name__}")
    if not 0 <= value < _MAX_LENGTH:
        raise InvalidViewError(f"view length must be between 0 and 2**63 - 1, got {value}")


def _check_head(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not str:
        raise InvalidViewError(f"view head must be a str, got {type(value).__name__}")


def _check_closed(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise InvalidViewError(f"view closed must be a bool, got {type(value).__name__}")


@final
@attrs.frozen
class HistoryView:
    """What a ``ViewReader`` returns: a conversation's messages, its length, whether it
    is closed and its head, from one atomic read.

    ``length`` is the number of messages on the conversation's head path (DESIGN §6h:
    the path from the first batch to the head). It grows while turns extend the head
    path; a rewind or switch sets it to the new head path's length. ``head`` is the
    append id of the last batch on the head path, ``""`` when there is none (a new
    conversation, one rewound to its start, a closed one). ``length`` and ``head`` are
    what a fenced batch (``Batch.expected_length``, ``Batch.expected_head``) names.
    ``messages`` are the stored messages (a store's view) or a projection of
    them (``WindowReader``'s window), so ``length`` may exceed ``len(messages)``. A
    closed conversation has ``closed=True``, ``messages == ()`` and its last length or
    0. Invalid fields raise ``InvalidViewError``.
    """

    messages: tuple[Message, ...] = attrs.field(converter=_messages)
    length: int = attrs.field(validator=_check_length)
    closed: bool = attrs.field(default=False, validator=_check_closed)
    head: str = attrs.field(default="", validator=_check_head)

    def __attrs_post_init__(self) -> None:
        if self.closed and self.messages:
            raise InvalidViewError("a closed conversation's view holds no messages")
        if self.closed and self.head:
            raise InvalidViewError("a closed conversation's view has no head")

    @property
    def fence_head(self) -> str | None:
        """The head a batch generated from this view is fenced by
        (``Batch.expected_head``): ``head``, or None when the view carries no head
        information, so the fence names the length only. A view of a non-empty head
        path whose ``head`` is ``""`` is one: a ``ViewReader`` that does not track heads
        (``StoreAdapter`` over a store without ``read_batches``, a reader of one's own)
        builds it. A view of length 0 with head ``""`` is exact either way: the empty
        path."""
        return self.head if self.head or not self.length else None

    def validate(self) -> None:
        """Check the view (construction already did)."""
        _messages(self.messages)
        _check_length(self, None, self.length)
        _check_closed(self, None, self.closed)
        _check_head(self, None, self.head)
        self.__attrs_post_init__()
