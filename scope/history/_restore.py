"""The restore steps of a whole-store export (DESIGN §6n): closed conversations and
erasure tombstones, listed by the store that holds them and written back, restore-only,
into another (``scope history export`` / ``import``).

An open conversation travels through the ``Store`` protocol (its batches appended under
their own append ids, its head moves replayed). What a closed conversation keeps (its
closure, its owner, the length of its closed view) and the tombstones of erased ones
cannot be written that way: ``clear`` records no owner, and a tombstone is
``HMAC(store secret, id)``, meaningless under another secret. A ``Restorer`` lists them
and writes them back, each step atomic and idempotent, so an import cut short and run
again finishes the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, final, runtime_checkable

import attrs

from scope.errors import InvalidViewError
from scope.history._erasure import check_owner
from scope.history._ids import ConversationID

__all__ = ["ClosedConversation", "Restorer"]


def _closure(value: object) -> Literal["cleared", "expired"]:
    if value == "cleared" and type(value) is str:
        return "cleared"
    if value == "expired" and type(value) is str:
        return "expired"
    raise InvalidViewError(f"closure must be 'cleared' or 'expired', got {value!r}")


def _owner(value: object) -> str | None:
    if value is None:
        return None
    try:
        return check_owner(value)
    except (TypeError, ValueError) as exc:
        raise InvalidViewError(f"owner: {exc}") from None


def _length(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidViewError(f"length must be an integer >= 0, got {value!r}")
    return value


@final
@attrs.frozen
class ClosedConversation:
    """A conversation closed by ``clear`` or by its expiry, as ``Restorer`` lists it.

    - ``conversation_id``: its id (a ``ConversationID``; a plain string is checked).
    - ``closure``: ``"cleared"`` or ``"expired"`` (its expiry passed, whether or not
      ``expire`` removed it since), as ``Store.read_meta`` says.
    - ``owner``: the owner its first append recorded (kept after the closure, so
      ``erase_owned`` finds it; None: none).
    - ``length``: its closed view's length (``Store.read_view(...).length``).

    Invalid fields raise ``InvalidViewError`` (``InvalidConversationIDError`` for the
    id). Erased conversations are never one: only their tombstone is left.
    """

    conversation_id: ConversationID = attrs.field(converter=ConversationID)
    closure: Literal["cleared", "expired"] = attrs.field(converter=_closure)
    owner: str | None = attrs.field(default=None, converter=_owner)
    length: int = attrs.field(default=0, converter=_length)


@runtime_checkable
class Restorer(Protocol):
    """What a store offers to export and import what the ``Store`` protocol cannot
    carry: closed conversations, erasure tombstones and the store secret they are made
    under. Every bundled store (``InMemoryStore``, ``SQLiteStore``, ``PostgresStore``,
    ``RedisStore``) is one; ``scope.history.storetest.StoreConformance`` checks the
    rules below on a store that is.

    Restore into a store no other handle has open: ``restore_erasures`` may replace the
    store secret, and a handle opened before keeps the one it read at open.
    """

    async def closed_conversations(
        self, *, after: str | None = None, limit: int = 1000
    ) -> list[ClosedConversation]:
        """The closed conversations (cleared, or expired: removed by ``expire`` or due and
        not removed yet) whose ids sort after ``after`` (None: from the first), in
        lexical (code point) order, at most ``limit`` (an int >= 1, else ``ValueError``;
        ``InvalidConversationIDError`` for a bad ``after``). An id ``clear`` closed
        without ever holding a batch is one (owner None, length 0); erased ids are not
        (see ``tombstones``). May scan every conversation the store holds."""
        ...

    async def restore_closed(self, closed: ClosedConversation) -> bool:
        """Record ``closed`` in one atomic step: afterwards ``read_meta`` says its closure
        and owner (no expiry, not retained, no moves), ``read_view`` is closed with its
        length, every append, head move or ``retain`` raises ``ConversationClosedError``,
        ``conversations()`` does not list it, ``closed_conversations()`` lists it equal to
        ``closed`` and ``erase_owned(owner)`` erases it. True when written; False when
        the store already holds exactly that (an import run again). Raises
        ``RestoreConflictError`` (nothing written) when the id holds a batch (open, or
        expired and not removed), is closed another way, with another owner or another
        length, or is erased."""
        ...

    async def tombstones(self, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """The tombstones of erased conversations (``"hmac-sha256:<64 hex>"``) that sort
        after ``after`` (None: from the first), in order, at most ``limit`` (an int
        >= 1, else ``ValueError``)."""
        ...

    async def store_secret(self) -> bytes:
        """The store secret (32 bytes), the key of its tombstones. Whoever holds it and a
        candidate id can test whether that id was erased here: an export that carries
        it is as sensitive as the store."""
        ...

    async def restore_erasures(self, secret: bytes, tombstones: Sequence[str]) -> int:
        """Adopt ``secret`` as the store secret and add ``tombstones``, in one atomic step;
        the number of tombstones added (those held already are left alone). When the
        store's secret is another one, the store must hold no conversation (open or
        closed) and no tombstone, else ``RestoreConflictError`` (nothing written): its
        own tombstones would close nothing under another key. A tombstone to add that
        the id of a conversation the store holds (open or closed) hashes to is a
        ``RestoreConflictError`` too (erase it first: an erased id holds nothing).
        Afterwards an append under an id hashing to one of them raises
        ``ConversationClosedError``, ``read_meta`` says ``"erased"`` and ``check_erased``
        proves the source's receipts (those of a store of the same kind: a receipt names
        the kind that issued it). A secret that is not 32 bytes raises ``ValueError``
        (``TypeError``: not ``bytes``), a malformed tombstone ``InvalidReceiptError``,
        both before any I/O (``storekit.check_secret``, ``storekit.check_tombstone``)."""
        ...
