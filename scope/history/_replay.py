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
valid and the piece from ``r`` on is valid. The reader's store handle keeps, in its
``HistoryCache``, per conversation, the replay last checked (holding the very message
objects) and the index of its last non-tool message. When the next stored history
starts with the *same objects* (stores hand out the same immutable ``Message`` objects
for batches they decoded or appended before), only the piece from that index on is
checked again. Anything else — other objects, a shorter or different history — is
checked in full. Messages are immutable, so objects checked once stay valid; the cache
holds them, so identity cannot be reused. A reader with no ``history_cache`` (a
third-party store) is checked in full on every call.

``tests/history/test_history_replay.py`` checks with hypothesis that this path accepts exactly
what the full ``Request`` check accepts, across growing and changing histories.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import final

from scope.chat import Message, Role, check_sequence
from scope.codec import encode_messages
from scope.errors import InvalidRequestError, StoreError
from scope.history._cache import HistoryCache

__all__ = ["cache_of", "checked_replay", "replay"]


@final
class _Entry:
    __slots__ = ("replay", "restart", "size", "stored")

    def __init__(self, stored: tuple[Message, ...], replay: tuple[Message, ...], size: int) -> None:
        self.stored = stored  # what the reader returned (systems included)
        self.replay = replay  # its non-system messages, checked
        self.size = size  # twice the canonical encoded bytes of ``stored`` (see HistoryCache)
        # The last index of ``replay`` where check_sequence's state resets (a message that
        # is not a tool message), or 0.
        restart = len(replay) - 1
        while restart > 0 and replay[restart].role is Role.TOOL:
            restart -= 1
        self.restart = max(restart, 0)


def cache_of(reader: object) -> HistoryCache | None:
    """The ``HistoryCache`` of a reader's store handle (its ``history_cache``), or None."""
    cache = getattr(reader, "history_cache", None)
    return cache if type(cache) is HistoryCache else None


def replay(reader: object, cid: str, stored: Sequence[object]) -> tuple[Message, ...]:
    """``checked_replay`` with the cache of ``reader``'s store handle (None: none)."""
    return checked_replay(cache_of(reader), cid, stored)


def checked_replay(
    cache: HistoryCache | None, cid: str, stored: Sequence[object]
) -> tuple[Message, ...]:
    """The non-system messages of ``stored``, proven to form a valid request sequence
    (``StoreError`` naming the conversation otherwise); only the piece after the replay
    ``cache`` keeps for ``cid`` is checked when ``stored`` starts with its very objects.
    The result is kept in ``cache`` (within its bound)."""
    stored = tuple(stored)
    key = (cid,)
    entry: _Entry | None = None if cache is None else cache._get(key)
    old = 0 if entry is None else len(entry.stored)
    if (
        entry is not None
        and len(stored) >= old
        and all(map(operator.is_, stored[:old], entry.stored))
    ):
        if len(stored) == old:
            return entry.replay
        fresh = _non_system(cid, stored, old)
        result = entry.replay + fresh
        _check(cid, result[entry.restart :], entry.restart)
        size = entry.size + _size(stored[old:])
    else:
        result = _non_system(cid, stored, 0)
        _check(cid, result, 0)
        size = _size(stored) if cache is not None and cache.max_bytes else 0
    if cache is not None and stored and cache.max_bytes:
        cache._put(key, _Entry(stored, result, size), size, replace=True)  # type: ignore[arg-type]
    return result


def _size(messages: Sequence[object]) -> int:
    """What ``messages`` hold in memory, estimated as twice their canonical encoded
    size: the encoding each message keeps for re-encoding, and the decoded values (text,
    media bytes) themselves. Checked Messages have their encoding cached, so this costs
    a join."""
    return 2 * len(encode_messages([m for m in messages if isinstance(m, Message)]))


def _non_system(cid: str, stored: tuple[object, ...], start: int) -> tuple[Message, ...]:
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


def _check(cid: str, piece: tuple[Message, ...], offset: int) -> None:
    try:
        check_sequence(piece, InvalidRequestError)
    except InvalidRequestError as exc:
        raise StoreError(
            f"stored history of conversation {str(cid)!r} cannot be replayed "
            f"(replayed messages from {offset}): {exc}"
        ) from exc
