"""``WindowReader``: a bounded, read-only view of a conversation for a model's context."""

from __future__ import annotations

from typing import Any, final

import attrs

from scope._validate import check_type
from scope.chat import Message, Part, Role, text_part
from scope.errors import InvalidWindowError, WindowTooSmallError
from scope.history._ids import ConversationID
from scope.history._protocols import Reader, ViewReader, implements
from scope.history._view import HistoryView
from scope.metadata import Metadata

__all__ = ["WindowReader"]

_SEPARATOR = text_part("\n\n")


def _check_reader(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Reader):
        raise TypeError(
            f"window reader must be a Reader (an object with async read), got "
            f"{type(value).__name__}"
        )


def _check_limit(instance: Any, attribute: Any, value: Any) -> None:
    check_type(value, int, "window limit", "an integer")
    if value < 1:
        raise InvalidWindowError(f"window limit must be at least 1, got {value}")


@final
@attrs.frozen
class WindowReader:
    """A ``Reader`` that returns at most ``limit`` messages of what ``reader`` holds.

    The window is:

    1. one system message merging every stored system message, wherever it was stored:
       their parts in stored order with a ``"\\n\\n"`` text part between messages, and
       their metadata merged (later messages win per key); present only when the
       conversation holds a system message, and counted in ``limit``;
    2. then the longest suffix of whole turns that fits the rest of ``limit``. A turn
       starts at a user message and keeps every assistant and tool message after it, so
       a tool call is never separated from its result and no turn is ever cut.

    Non-system messages stored before the first user message (a greeting, say) belong to
    the first turn: they are kept with it, and dropped only together with it. When the
    whole history fits ``limit``, the window is the whole history (with its system
    messages merged into one).

    ``read_view`` returns the window as ``messages`` with the whole conversation's
    ``length`` and ``closed`` (from the wrapped reader's ``read_view`` when it is a
    ``ViewReader``; otherwise ``length`` is the number of messages ``read`` returned and
    ``closed`` is False), so the history ``Middleware`` fences its turns correctly
    through a window.

    ``read`` raises ``WindowTooSmallError`` when the newest turn alone (plus the merged
    system message) does not fit. It is read-only: it has no ``append`` or ``clear``, so it
    is a ``Reader`` but neither a ``Writer`` nor a ``Clearer``. It holds no state beyond
    its two fields and is as safe to share as the reader it wraps. ``limit`` must be an
    ``int`` (not a ``bool``; ``TypeError`` otherwise) of at least 1
    (``InvalidWindowError`` otherwise), and ``reader`` a ``Reader`` (``TypeError``).
    """

    reader: Reader = attrs.field(validator=_check_reader)
    limit: int = attrs.field(validator=_check_limit)

    def validate(self) -> None:
        """Check the fields (construction already did)."""
        _check_reader(self, None, self.reader)
        _check_limit(self, None, self.limit)

    async def read(self, conversation_id: str) -> list[Message]:
        """The window over the conversation, as a new list (``[]`` when it is empty).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``). Cancellation propagates from the underlying read
        untouched; nothing is cached.
        """
        cid = ConversationID(conversation_id)
        return window(await self.reader.read(cid), self.limit)

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The window over one atomic read of the conversation, with the whole
        conversation's ``length`` and ``closed`` (see the class docstring).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``); ``WindowTooSmallError`` as for ``read``.
        """
        cid = ConversationID(conversation_id)
        reader = self.reader
        if implements(reader, ViewReader):
            view: HistoryView = await reader.read_view(cid)  # type: ignore[attr-defined]
            if view.closed:
                return view
            return HistoryView(window(list(view.messages), self.limit), view.length)
        messages = await reader.read(cid)
        return HistoryView(window(messages, self.limit), len(messages))


def window(messages: list[Message], limit: int) -> list[Message]:
    """The window rule of ``WindowReader`` applied to a list of stored messages."""
    systems = [m for m in messages if m.role is Role.SYSTEM]
    turns: list[list[Message]] = []
    # Non-system messages before the first user message start the first turn, and the
    # first user message joins them instead of starting a turn of its own.
    leading = False
    for message in messages:
        if message.role is Role.SYSTEM:
            continue
        if message.role is Role.USER and not leading:
            turns.append([message])
        elif turns:
            turns[-1].append(message)
            leading = leading and message.role is not Role.USER
        else:
            turns.append([message])
            leading = True
    out: list[Message] = []
    room = limit
    if systems:
        out.append(_merge_systems(systems))
        room -= 1
    if not turns:
        return out
    newest = len(turns[-1])
    if newest > room:
        raise WindowTooSmallError(
            f"the newest turn has {newest} messages"
            + (" plus the merged system message" if systems else "")
            + f"; the window limit is {limit}"
        )
    start = len(turns)
    while start > 0 and len(turns[start - 1]) <= room:
        start -= 1
        room -= len(turns[start])
    for turn in turns[start:]:
        out.extend(turn)
    return out


def _merge_systems(systems: list[Message]) -> Message:
    if len(systems) == 1:
        return systems[0]
    parts: list[Part] = []
    metadata = Metadata()
    for index, message in enumerate(systems):
        if index:
            parts.append(_SEPARATOR)
        parts.extend(message.parts)
        metadata = metadata.merge(message.metadata)
    return Message(Role.SYSTEM, parts, metadata)
