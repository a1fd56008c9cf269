"""Replaying stored history at (near) constant cost per turn.

The history Middleware sends ``system prefix + stored non-system messages + open turn``
downstream. Checking that whole sequence on every call (``Request.validate``) costs time
in proportion to the conversation, which grows by one turn per call. What actually
changes from one call to the next is small: the prefix and the open turn come from a
request that was validated when it was built, and the stored history only grows at its
end. So the check is split:

- the prefix and the open turn: already checked (the caller's ``Request``), and the
  Middleware's request-shape check proved the prefix holds only system messages and
  the turn starts with a user message;
- the stored non-system messages (the *replay*): checked here, with ``check_sequence``;
- the seams: prefix -> replay is safe because the replay holds no system message;
  replay -> turn because the turn starts with a user message, which resets
  ``check_sequence``'s state.

The invariant that makes skipping safe: ``check_sequence`` carries state from a message
to the next only across tool messages (every other message resets or replaces it), so a
sequence is valid if and only if its prefix up to the last non-tool message ``r`` is
valid and the piece from ``r`` on is valid. ``Replays`` remembers, per conversation, the
replay it last checked (holding the very message objects) and the index of its last
non-tool message. When the next stored history starts with the *same objects* (stores
hand out the same immutable ``Message`` objects for batches they decoded or appended
before), only the piece from that index on is checked again. Anything else — other
objects, a shorter or different history — is checked in full. Messages are immutable, so
objects checked once stay valid; the cache holds them, so identity cannot be reused.

``tests/history/test_history_replay.py`` checks with hypothesis that this path accepts exactly
what the full ``Request`` check accepts, across growing and changing histories.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, final

from scope._cleared import on_conversation_cleared
from scope.chat import Message, Role
from scope.chat._request import check_sequence
from scope.codec import encode_messages
from scope.errors import InvalidRequestError, StoreError
from scope.history._ids import ConversationID

__all__ = ["Replays", "replays"]


@final
class _Entry:
    __slots__ = ("replay", "restart", "size", "stored")

    def __init__(self, stored: tuple[Message, ...], replay: tuple[Message, ...], size: int) -> None:
        self.stored = stored  # what the reader returned (systems included)
        self.replay = replay  # its non-system messages, checked
        self.size = size  # the canonical encoded bytes of ``stored``
        # The last index of ``replay`` where check_sequence's state resets (a message that
        # is not a tool message), or 0.
        restart = len(replay) - 1
        while restart > 0 and replay[restart].role is Role.TOOL:
            restart -= 1
        self.restart = max(restart, 0)


#: The replay cache's default bounds: conversations, and bytes of memory their messages
#: take (twice their canonical encoding, media included).
DEFAULT_MAX_CONVERSATIONS: Final = 1024
DEFAULT_MAX_BYTES: Final = 128 * 1024 * 1024


@final
class Replays:
    """Checked replays of recently used conversations: an LRU bounded by
    ``max_conversations`` and by ``max_bytes`` of memory the held messages take,
    estimated as twice their canonical encoded size, media included (see ``_size``; a
    history larger than ``max_bytes`` alone is checked, not kept).
    A cleared conversation leaves it (the stores report each clear).

    Thread-safe; the values are immutable tuples, replaced whole."""

    def __init__(
        self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_conversations = max_conversations
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[ConversationID, _Entry] = OrderedDict()
        self._bytes = 0

    @property
    def size(self) -> tuple[int, int]:
        """What the cache holds now: ``(conversations, bytes)``."""
        with self._lock:
            return len(self._entries), self._bytes

    def replay(self, cid: ConversationID, stored: Sequence[object]) -> tuple[Message, ...]:
        """The non-system messages of ``stored``, proven to form a valid request
        sequence (``StoreError`` naming the conversation otherwise)."""
        stored = tuple(stored)
        with self._lock:
            entry = self._entries.get(cid)
            if entry is not None:
                self._entries.move_to_end(cid)
        old = 0 if entry is None else len(entry.stored)
        if (
            entry is not None
            and len(stored) >= old
            and all(map(operator.is_, stored[:old], entry.stored))
        ):
            if len(stored) == old:
                return entry.replay
            fresh = _non_system(cid, stored, old)
            replay = entry.replay + fresh
            _check(cid, replay[entry.restart :], entry.restart)
            size = entry.size + _size(stored[old:])
        else:
            replay = _non_system(cid, stored, 0)
            _check(cid, replay, 0)
            size = _size(stored)
        with self._lock:
            previous = self._entries.pop(cid, None)
            if previous is not None:
                self._bytes -= previous.size
            if stored and size <= self.max_bytes:
                self._entries[cid] = _Entry(stored, replay, size)  # type: ignore[arg-type]
                self._bytes += size
            while len(self._entries) > self.max_conversations or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
        return replay

    def forget(self, conversation_id: str) -> None:
        """Drop the conversation's replay (it was cleared)."""
        with self._lock:
            entry = self._entries.pop(conversation_id, None)  # type: ignore[call-overload]
            if entry is not None:
                self._bytes -= entry.size

    def clear(self) -> None:
        """Forget every checked replay (tests; memory)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _size(messages: Sequence[object]) -> int:
    """What ``messages`` hold in memory, estimated as twice their canonical encoded
    size: the encoding each message keeps for re-encoding, and the decoded values (text,
    media bytes) themselves. Checked Messages have their encoding cached, so this costs
    a join."""
    return 2 * len(encode_messages([m for m in messages if isinstance(m, Message)]))


def _non_system(cid: ConversationID, stored: tuple[object, ...], start: int) -> tuple[Message, ...]:
    out: list[Message] = []
    for index in range(start, len(stored)):
        message = stored[index]
        if not isinstance(message, Message):
            raise StoreError(
                f"stored history of conversation {str(cid)!r}: "
                f"message {index} is a {type(message).__name__}, not a Message"
            )
        if message.role is not Role.SYSTEM:
            out.append(message)
    return tuple(out)


def _check(cid: ConversationID, piece: tuple[Message, ...], offset: int) -> None:
    try:
        check_sequence(piece, InvalidRequestError)
    except InvalidRequestError as exc:
        raise StoreError(
            f"stored history of conversation {str(cid)!r} cannot be replayed "
            f"(replayed messages from {offset}): {exc}"
        ) from exc


#: The process-wide cache every Middleware shares (a service usually builds a Middleware
#: per request, so a per-instance cache would never be warm).
replays: Final = Replays()
on_conversation_cleared(replays.forget)
