"""The restore steps of the SQL stores (``scope.history.Restorer``, DESIGN §6n): the
argument checks and the values around one backend step each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scope.errors import (
    InvalidConversationIDError,
    InvalidViewError,
    RestoreConflictError,
    StoreError,
)
from scope.history import ClosedConversation, ConversationID
from scope.history.storekit import (
    check_erase_limit,
    check_secret,
    check_tombstone,
    tombstone,
)
from scope.historystores._driver import store_closed
from scope.historystores._store import RecordStore

__all__ = ["HELD", "WRITTEN", "RestoringStore", "closed_row", "same_closure"]

#: ``_restore_closed``'s answers: written, or held already (the same record).
WRITTEN = "written"
HELD = "held"


def closed_row(row: Sequence[Any]) -> ClosedConversation:
    """The ``ClosedConversation`` of a listed row ``(id, closure, owner, length)``; a
    stored value scope does not write raises ``StoreError`` naming the row."""
    try:
        return ClosedConversation(row[0], row[1], row[2], int(row[3]))
    except (InvalidConversationIDError, InvalidViewError) as exc:
        raise StoreError(f"closed conversation {row[0]!r} is corrupt: {exc}") from None


def same_closure(closed: ClosedConversation, closure: str, owner: Any, length: Any) -> str:
    """``HELD`` when a stored closed row (its ``closure``, ``owner`` and ``length``) is
    ``closed``, else why ``restore_closed`` refuses it."""
    if closure != closed.closure:
        return f"it is {closure} here"
    if owner != closed.owner:
        return f"its owner here is {owner!r}"
    if length != closed.length:
        return f"its length here is {length!r}"
    return HELD


class RestoringStore(RecordStore):
    """A ``RecordStore`` that is a ``scope.history.Restorer``: each public step checks
    its arguments before any I/O and runs one atomic backend step (``_closed_page``,
    ``_restore_closed``, ``_tombstone_page``, ``_restore_erasures``)."""

    __slots__ = ()

    async def closed_conversations(
        self, *, after: str | None = None, limit: int = 1000
    ) -> list[ClosedConversation]:
        """The closed conversations (cleared, or expired: removed by ``expire`` or due
        by the store's clock and not removed yet) whose ids sort after ``after`` (None:
        from the first), in code point order, at most ``limit`` (an int >= 1, else
        ``ValueError``; ``InvalidConversationIDError`` for a bad ``after``), read in one
        statement. Each one's length is its closed view's (``read_view``); an id
        ``clear`` closed without a batch is one with owner None and length 0; erased
        ids are not (see ``tombstones``). Scans the conversations table in id order
        (its primary key); a stored value scope does not write raises ``StoreError``."""
        count = check_erase_limit(limit)
        start = None if after is None else ConversationID(after)
        return [closed_row(row) for row in await self._closed_page(start, count)]

    async def restore_closed(self, closed: ClosedConversation) -> bool:
        """Record ``closed`` in one atomic step (see ``scope.history.Restorer``): an id
        the store does not hold (or holds only a retention setting for, without a
        batch) becomes a closed conversation row (closed by ``clear`` or by ``expire``,
        its owner and length, no expiry, not retained). True when written; False when
        the store holds exactly that already. ``RestoreConflictError`` (nothing
        written) when the id holds a batch, is closed another way, with another owner
        or length, or is erased. Anything but a ``ClosedConversation`` raises
        ``TypeError`` before any I/O."""
        if not isinstance(closed, ClosedConversation):
            raise TypeError(
                f"restore_closed needs a ClosedConversation, got {type(closed).__name__}"
            )
        cid = closed.conversation_id
        answer = await self._restore_closed(closed, tombstone(self._secret, cid))
        self._cache.forget(cid)
        if answer == WRITTEN:
            return True
        if answer == HELD:
            return False
        raise RestoreConflictError(
            f"conversation {str(cid)!r} cannot be restored {closed.closure} (owner "
            f"{closed.owner!r}, length {closed.length}): {answer}; nothing was written"
        )

    async def tombstones(self, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """The stored tombstones (``"hmac-sha256:<64 hex>"``) that sort after ``after``
        (a string; None: from the first), in order, at most ``limit`` (an int >= 1,
        else ``ValueError``), read in one statement (the tombstones' primary key). An
        ``after`` that is not a string raises ``TypeError``."""
        count = check_erase_limit(limit)
        if after is not None and not isinstance(after, str):
            raise TypeError(f"after must be a string or None, got {type(after).__name__}")
        return [str(mark) for mark in await self._tombstone_page(after, count)]

    async def store_secret(self) -> bytes:
        """The store secret this handle hashes tombstones with (32 bytes, read at open or
        adopted by ``restore_erasures``). As sensitive as the store: with it and a
        candidate id anyone can test whether the id was erased here. No I/O; a closed
        handle raises ``StoreError``."""
        if self.closed:
            raise store_closed(type(self).__name__)
        return self._secret

    async def restore_erasures(self, secret: bytes, tombstones: Sequence[str]) -> int:
        """Adopt ``secret`` as the store secret and add ``tombstones`` in one atomic step;
        the number added (those stored already are left alone). Every argument is
        checked before any I/O: a secret that is not 32 bytes raises
        ``ValueError`` (``TypeError``: not ``bytes``), a malformed tombstone
        ``InvalidReceiptError``.

        ``RestoreConflictError`` (nothing written) when the secret is not the store's
        and the store holds a conversation row (open or closed) or a tombstone, or when
        a stored conversation's id hashes to a tombstone to add (erase it first: an
        erased id holds nothing). The latter check hashes every stored conversation id,
        and runs only when the step adds a tombstone to a store holding conversations.
        Once adopted, this handle uses the secret (a handle opened later reads it; one
        opened before keeps the one it read)."""
        key = check_secret(secret)
        marks = sorted({check_tombstone(mark) for mark in tombstones})
        answer = await self._restore_erasures(key, marks)
        if isinstance(answer, str):
            raise RestoreConflictError(
                f"the erasures cannot be restored: {answer}; nothing was written"
            )
        return answer

    async def _closed_page(self, after: ConversationID | None, limit: int) -> list[Any]:
        """Up to ``limit`` closed conversations' ``(id, closure, owner, length)`` after
        ``after`` in code point order, one statement."""
        raise NotImplementedError

    async def _restore_closed(self, closed: ClosedConversation, mark: str) -> str:
        """``restore_closed`` in one atomic step (``mark``: the id's tombstone):
        ``WRITTEN``, ``HELD``, or why it is refused (nothing written)."""
        raise NotImplementedError

    async def _tombstone_page(self, after: str | None, limit: int) -> list[Any]:
        """Up to ``limit`` stored tombstones after ``after`` in order, one statement."""
        raise NotImplementedError

    async def _restore_erasures(self, secret: bytes, marks: list[str]) -> int | str:
        """``restore_erasures`` in one atomic step: the number of tombstones added (this
        handle's secret replaced once the step committed), or why it is refused
        (nothing written)."""
        raise NotImplementedError
