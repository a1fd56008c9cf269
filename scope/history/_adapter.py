"""``StoreAdapter``: the whole ``Store`` over a simple store, and ``as_store``."""

from __future__ import annotations

import datetime as _dt
import inspect
import threading
import time
from typing import Any, final

from scope._validate import check_lease
from scope.chat import Message
from scope.errors import HistoryChangedError, InvalidViewError, StoreError, UnknownHeadError
from scope.history._batch import Batch, Receipt
from scope.history._erasure import ErasureReceipt, check_owner
from scope.history._ids import ConversationID
from scope.history._meta import ConversationMeta
from scope.history._protocols import Reader, Store, Writer
from scope.history._tree import HistoryTree, check_created, check_head, check_move_id
from scope.history._view import HistoryView

__all__ = ["LeaseTable", "StoreAdapter", "as_store", "records_owners"]


def as_store(store: object) -> Store:
    """``store`` itself when it is a ``Store``, else ``StoreAdapter(store)``."""
    return store if isinstance(store, Store) else StoreAdapter(store)


@final
class LeaseTable:
    """Turn leases in memory: conversation -> ``(holder, time.monotonic() expiry)``, an
    expired entry replaced by the next acquire. Not locked: the caller holds its lock."""

    __slots__ = ("_leases",)

    def __init__(self) -> None:
        self._leases: dict[ConversationID, tuple[str, float]] = {}

    def acquire(self, cid: ConversationID, holder: str, ttl: float) -> bool:
        """``TurnLeaser.acquire_turn`` on checked arguments."""
        now = time.monotonic()
        current = self._leases.get(cid)
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self._leases[cid] = (holder, now + ttl)
        return True

    def release(self, cid: ConversationID, holder: str) -> bool:
        """``TurnLeaser.release_turn`` on checked arguments."""
        current = self._leases.get(cid)
        if current is None or current[0] != holder:
            return False
        del self._leases[cid]
        return current[1] > time.monotonic()

    def drop(self, cid: ConversationID) -> None:
        """Delete the conversation's lease, whoever holds it (erasure, expiry)."""
        self._leases.pop(cid, None)

    def conversations(self) -> list[ConversationID]:
        """The conversations with a lease entry (live or expired)."""
        return list(self._leases)


@final
class StoreAdapter:
    """A ``Store`` over a simple store: one with ``read``, ``append`` and ``clear``
    (with neither ``read`` nor ``append``: ``TypeError`` at construction; a method the
    store lacks and the adapter cannot derive raises ``TypeError`` when called).

    What the wrapped store has of the rest of ``Store`` is used as it is; the adapter
    supplies what it lacks, and says where that is weaker than a store's own:

    - ``read_view``: from ``read`` (or ``read_batches``, below): ``length`` is the
      number of messages read, and the
      view is never ``closed`` (a closed conversation reads as ``[]``: its append then
      raises ``ConversationClosedError``). Not one atomic read: ``atomic_views`` is
      False, and the history ``Middleware`` does not fence turns read through it
      (DESIGN §6b: a plain ``Reader``).
    - ``acquire_turn``/``release_turn``: a lease table in the adapter (``LeaseTable``):
      turns that use this adapter object exclude each other (one process); other
      processes and handles are not excluded.
    - ``acquire_turn_view``: ``acquire_turn`` then ``read_view``;
      ``append_release_turn``: ``append`` then ``release_turn``. Two steps each, so a
      hand-over is exact only when the wrapped store folds them itself.
    - ``read_batches`` and ``conversations`` cannot be derived from messages: without
      the wrapped store's own they raise ``TypeError`` naming what is missing (the
      Middleware never needs them; listing and ``scope history show`` do).
    - Branches (DESIGN §6h): a simple store keeps one linear history, so the adapter
      offers that history as a tree of one path whose head is its last batch. The
      derived ``read_view`` names that head when the store has ``read_batches`` (the
      view is then read from the batches, still one call; without ``read_batches``
      its head is ``""``, unknown). ``read_tree`` (without the store's own): the
      batches ``read_batches`` returns, each following the one before, the last the
      head, no stored times (``created`` None), never ``closed``. ``move_head``
      (without the store's own) moves nothing: it checks its arguments, then the fence
      (``expected_head`` against the last batch: ``HistoryChangedError``), then the
      target: ``head`` equal to the current head is the one move it can make (a no-op
      returning the length; ``move_id`` is not recorded, so its retry is the same
      no-op), a batch it does not hold raises ``UnknownHeadError``, and any other
      (an earlier batch, or ``""`` on a non-empty history) raises ``StoreError``
      saying the store keeps no branches. So ``rewind``/``switch`` through the adapter
      fail cleanly and change nothing. An append's ``expected_head`` reaches the
      wrapped store as it is: on a history that never branches the head is fixed by
      the length, so the store's ``expected_length`` fence, when it has one, is the
      same fence.
    - Retention and erasure (``retain``, ``expire``, ``erase``, ``erase_owned``,
      ``check_erased``) and ``read_meta`` (owner, expiry, recorded moves) cannot be
      derived either (a ``clear`` keeps the id, an erasure
      must not): without the wrapped store's own they raise ``TypeError``. Owners:
      ``owners`` says whether the wrapped ``append`` takes ``owner=``; an append (or
      ``append_release_turn``) with an owner through an adapter whose store takes none
      raises ``TypeError`` before any I/O (the history ``Middleware`` checks it at
      construction), and so does ``conversations(owner=...)`` through a store whose
      listing takes none. Without an owner the wrapped methods are called without it.
      A restored stored time (``append(..., created=...)``) reaches a wrapped
      ``append`` that takes ``created``; through one that takes none it raises
      ``TypeError`` before any I/O.
      When the adapter supplies the lease steps (its own in-process table), ``erase``
      drops the conversation's lease there too; ``erase_owned`` cannot (its receipts
      name no id), so such a lease lasts until its ttl passes.

    ``folds`` says whether the wrapped store has its own folded lease steps
    (``acquire_turn_view`` and ``append_release_turn``); without them the history
    ``Middleware`` commits with ``append`` and releases the lease in a step of its own,
    so a cancellation during that release still reports the turn as stored.
    """

    __slots__ = ("_leases", "_lock", "atomic_views", "folds", "owners", "store")

    def __init__(self, store: object) -> None:
        if not isinstance(store, (Reader, Writer)):
            raise TypeError(
                f"StoreAdapter needs a store with async read, append and clear; "
                f"{type(store).__name__} has neither read nor append"
            )
        self.store: Any = store
        #: Whether ``read_view`` is the wrapped store's own (one atomic read).
        self.atomic_views: bool = self._own("read_view") is not None
        #: Whether the folded lease steps are the wrapped store's own.
        self.folds: bool = None not in (
            self._own("acquire_turn_view"),
            self._own("append_release_turn"),
        )
        #: Whether the wrapped ``append`` takes ``owner=`` (DESIGN §6i).
        self.owners: bool = _takes(self._own("append"), "owner")
        self._leases = LeaseTable()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StoreAdapter({self.store!r})"

    def records_owners(self, method: str = "append") -> bool:
        """Whether an ``owner=`` given to this adapter's ``method`` (``append`` or
        ``append_release_turn``) reaches the wrapped store: its own method takes
        ``owner=``, or the adapter derives the method from an ``append`` that does."""
        own = self._own(method)
        return self.owners if own is None else _takes(own, "owner")

    def _own(self, name: str) -> Any:
        return getattr(self.store, name, None)

    async def read(self, conversation_id: str) -> list[Message]:
        return list(await self._needed("read")(conversation_id))

    async def read_view(self, conversation_id: str) -> HistoryView:
        own = self._own("read_view")
        if own is not None:
            return await own(conversation_id)  # type: ignore[no-any-return]
        cid = ConversationID(conversation_id)
        head = ""
        if self._own("read_batches") is not None:
            batches = await self._linear(cid)
            messages = tuple(message for batch in batches for message in batch.messages)
            head = str(batches[-1].id) if batches else ""
        else:
            messages = tuple(await self._needed("read")(cid))
        try:
            return HistoryView(messages, len(messages), head=head)
        except InvalidViewError as exc:
            raise StoreError(
                f"{type(self.store).__name__}.read of conversation {str(cid)!r} returned "
                f"something that is not a stored history: {exc}"
            ) from exc

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        return await self._needed("read_batches")(conversation_id)  # type: ignore[no-any-return]

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        own = self._own("read_tree")
        if own is not None:
            return await own(conversation_id)  # type: ignore[no-any-return]
        cid = ConversationID(conversation_id)
        batches = await self._linear(cid)
        return HistoryTree(
            batches, range(-1, len(batches) - 1), (None,) * len(batches), len(batches) - 1
        )

    async def move_head(
        self,
        conversation_id: str,
        head: str,
        *,
        expected_head: str,
        move_id: str | None = None,
    ) -> int:
        own = self._own("move_head")
        if own is not None:
            return await own(  # type: ignore[no-any-return]
                conversation_id, head, expected_head=expected_head, move_id=move_id
            )
        cid = ConversationID(conversation_id)
        target = check_head(head, "head")
        expected = check_head(expected_head, "expected_head")
        check_move_id(move_id)
        batches = await self._linear(cid)
        length = sum(map(len, batches))
        actual = str(batches[-1].id) if batches else ""
        if actual != expected:
            raise HistoryChangedError(
                length, length, cid, expected_head=expected, actual_head=actual
            )
        if target == actual:
            return length
        if target and all(batch.id != target for batch in batches):
            raise UnknownHeadError(
                f"conversation {str(cid)!r} holds no batch {target!r}: the head was not moved"
            )
        raise StoreError(
            f"{type(self.store).__name__} keeps one linear history (no move_head): the head "
            f"of conversation {str(cid)!r} cannot move from {actual!r} to {target!r}"
        )

    async def _linear(self, cid: ConversationID) -> list[Batch]:
        """The wrapped store's batches (``read_batches``), checked to be batches of
        ``cid``."""
        batches = list(await self._needed("read_batches")(cid))
        for index, batch in enumerate(batches):
            if type(batch) is not Batch or batch.conversation_id != cid:
                raise StoreError(
                    f"{type(self.store).__name__}.read_batches of conversation {str(cid)!r} "
                    f"returned something that is not its batches at [{index}]"
                )
        return batches

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None, owner: str | None = None
    ) -> list[ConversationID]:
        listing = self._needed("conversations")
        if owner is None:
            return await listing(after=after, limit=limit)  # type: ignore[no-any-return]
        check_owner(owner)
        if not _takes(listing, "owner"):
            raise TypeError(
                f"{type(self.store).__name__}.conversations takes no owner: the adapter "
                "cannot list by owner"
            )
        return await listing(after=after, limit=limit, owner=owner)  # type: ignore[no-any-return]

    def _needed(self, name: str) -> Any:
        own = self._own(name)
        if own is None:
            raise TypeError(
                f"{type(self.store).__name__} has no {name}: the adapter cannot derive it"
            )
        return own

    async def append(
        self, batch: Batch, *, owner: str | None = None, created: float | None = None
    ) -> Receipt:
        append = self._needed("append")
        extra: dict[str, Any] = {}
        if owner is not None:
            self._check_owner(owner)
            extra["owner"] = owner
        if created is not None:
            extra["created"] = check_created(created)
            if not _takes(append, "created"):
                raise TypeError(
                    f"{type(self.store).__name__}.append takes no created: the adapter "
                    "cannot restore a stored time"
                )
        return await append(batch, **extra)  # type: ignore[no-any-return]

    def _check_owner(self, owner: str) -> None:
        check_owner(owner)
        if not self.owners:
            raise TypeError(
                f"{type(self.store).__name__}.append takes no owner: the adapter cannot record one"
            )

    async def clear(self, conversation_id: str) -> None:
        await self._needed("clear")(conversation_id)

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        own = self._own("acquire_turn")
        if own is not None:
            return bool(await own(conversation_id, holder, ttl))
        cid = ConversationID(conversation_id)
        holder, ttl = check_lease(holder, ttl)
        with self._lock:
            return self._leases.acquire(cid, holder, ttl)

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        own = self._own("release_turn")
        if own is not None:
            return bool(await own(conversation_id, holder))
        cid = ConversationID(conversation_id)
        holder, _ = check_lease(holder, 1.0)
        with self._lock:
            return self._leases.release(cid, holder)

    async def acquire_turn_view(
        self, conversation_id: str, holder: str, ttl: float
    ) -> HistoryView | None:
        own = self._own("acquire_turn_view")
        if own is not None:
            return await own(conversation_id, holder, ttl)  # type: ignore[no-any-return]
        cid = ConversationID(conversation_id)
        check_lease(holder, ttl)
        if not await self.acquire_turn(cid, holder, ttl):
            return None
        return await self.read_view(cid)

    async def append_release_turn(
        self, batch: Batch, holder: str, *, owner: str | None = None
    ) -> Receipt:
        own = self._own("append_release_turn")
        if owner is not None:
            self._check_owner(owner)
        if own is not None:
            if owner is None:
                return await own(batch, holder)  # type: ignore[no-any-return]
            if not _takes(own, "owner"):
                raise TypeError(
                    f"{type(self.store).__name__}.append_release_turn takes no owner: the "
                    "adapter cannot record one"
                )
            return await own(batch, holder, owner=owner)  # type: ignore[no-any-return]
        check_lease(holder, 1.0)
        receipt = await self.append(batch, owner=owner)
        await self.release_turn(batch.conversation_id, holder)
        return receipt

    # Retention and erasure: the wrapped store's own, or TypeError (see the docstring).

    async def retain(self, conversation_id: str, until: _dt.datetime | None) -> None:
        await self._needed("retain")(conversation_id, until)

    async def expire(self, now: _dt.datetime | None = None, *, limit: int = 1000) -> int:
        return await self._needed("expire")(now, limit=limit)  # type: ignore[no-any-return]

    async def erase(self, conversation_id: str) -> ErasureReceipt:
        receipt: ErasureReceipt = await self._needed("erase")(conversation_id)
        if self._own("acquire_turn") is None:  # the leases are this adapter's own
            with self._lock:
                self._leases.drop(ConversationID(conversation_id))
        return receipt

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[ErasureReceipt]:
        return await self._needed("erase_owned")(owner, limit=limit)  # type: ignore[no-any-return]

    async def check_erased(self, receipt: ErasureReceipt) -> list[str]:
        return await self._needed("check_erased")(receipt)  # type: ignore[no-any-return]

    async def read_meta(self, conversation_id: str) -> ConversationMeta:
        return await self._needed("read_meta")(conversation_id)  # type: ignore[no-any-return]


def _takes(method: Any, keyword: str) -> bool:
    """Whether ``method`` takes the keyword argument ``keyword``."""
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == keyword and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


def records_owners(writer: object) -> bool:
    """Whether ``writer``'s ``append`` records an ``owner=``: a ``Store`` says so by the
    protocol; a ``StoreAdapter`` when its wrapped store's append does; anything else
    (a plain ``Writer``) does not."""
    if isinstance(writer, StoreAdapter):
        return writer.records_owners("append")
    return isinstance(writer, Store)
