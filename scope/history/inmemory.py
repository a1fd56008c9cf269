"""The reference history store: everything in memory, nothing survives the process.

``InMemoryStore`` (a ``scope.history.Store``) is what every other backend is measured
against: it passes
``scope.history.storetest.StoreConformance`` and is the model the persistent stores copy.
It is safe to share between tasks and threads, and it runs unchanged under asyncio and
trio: its only synchronisation is a ``threading.Lock`` that is never held across an
``await`` (no method awaits at all).
"""

from __future__ import annotations

import bisect
import datetime as _dt
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, final

import attrs

from scope._validate import check_lease, check_limit
from scope.chat import Message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
)
from scope.history._adapter import LeaseTable
from scope.history._batch import Batch, Receipt
from scope.history._cache import DEFAULT_CACHE_BYTES, HistoryCache
from scope.history._cache import cache_bytes as _cache_bytes
from scope.history._erasure import (
    ErasureReceipt,
    check_erase_limit,
    check_now,
    check_owner,
    check_retention,
    check_until,
    new_secret,
    tombstone,
)
from scope.history._ids import AppendID, ConversationID
from scope.history._view import HistoryView

__all__ = ["InMemoryStore"]

T = TypeVar("T")


@final
@attrs.define(eq=False)
class InMemoryStore:
    """An in-memory ``scope.history.Store``.

    Guarantees, beyond the store rules every backend keeps (see ``scope.history``):

    - **Atomicity.** Each method runs to completion under one lock and never suspends, so
      it cannot be interrupted half-way: the closed check, the dedupe record, the
      ``expected_length`` fence and the message insert of an ``append`` happen together
      or not at all, and a ``read_view`` sees one state. A lease step
      (``acquire_turn``/``release_turn``) is one locked step too, and so are the folded
      ones (``acquire_turn_view``: the lease and the view; ``append_release_turn``: the
      append and the release); leases expire by ``time.monotonic()``.
    - **Cancellation.** No method has a checkpoint: a call that starts finishes. A task
      cancelled before the call starts leaves the store untouched.
    - **Sharing.** Batches and messages are immutable values, so reads hand out the stored
      objects (the appended ``Batch`` itself) in a new list; callers may change the list
      freely.
    - **Memory.** A cleared conversation keeps only its id (the closure evidence) and its
      last length; its batches, messages and dedupe records are dropped. Nothing is ever
      evicted otherwise.
    - **Cache.** ``InMemoryStore(cache_bytes=...)`` bounds this handle's
      ``history_cache`` (default 32 MiB; 0 keeps nothing): the replays the history
      Middleware checked, so a turn checks only what is new (the messages themselves
      are the stored objects; nothing is decoded). A clear drops the conversation's
      entries.
    - **Retention and erasure** (see ``scope.history.Store``).
      ``InMemoryStore(retention=timedelta(...))`` is the store-wide retention;
      ``clock`` is the store's clock (a callable returning Unix seconds,
      ``time.time`` by default; a test may pass its own to move time). The store
      secret of the tombstones is 32 random bytes made with each instance (so it lives
      and dies with the data). An owner is kept after a clear or an expiry (so
      ``erase_owned`` finds the conversation) until ``erase``.
    """

    retention: _dt.timedelta | None = attrs.field(
        default=None, kw_only=True, converter=check_retention, repr=False
    )
    clock: Callable[[], float] = attrs.field(default=time.time, kw_only=True, repr=False)

    cache_bytes: int = attrs.field(
        default=DEFAULT_CACHE_BYTES, kw_only=True, converter=_cache_bytes, repr=False
    )
    _cache: HistoryCache = attrs.field(init=False, repr=False)

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    # The accepted batches of each open conversation, in append order, and the same
    # messages flattened (so read() is a list copy). Both change together, under the lock.
    _batches: dict[ConversationID, list[Batch]] = attrs.field(factory=dict, init=False, repr=False)
    _messages: dict[ConversationID, list[Message]] = attrs.field(
        factory=dict, init=False, repr=False
    )
    # Dedupe evidence: append id -> digest of the accepted batch, per conversation, so a
    # retry is recognised for as long as the conversation is open.
    _accepted: dict[ConversationID, dict[AppendID, str]] = attrs.field(
        factory=dict, init=False, repr=False
    )
    # Closure evidence: never expires.
    _closed: set[ConversationID] = attrs.field(factory=set, init=False, repr=False)
    # How many messages each conversation holds (kept after a clear: its last length).
    _lengths: dict[ConversationID, int] = attrs.field(factory=dict, init=False, repr=False)
    # Turn leases, by time.monotonic().
    _leases: LeaseTable = attrs.field(factory=LeaseTable, init=False, repr=False)
    # Retention and erasure: owners (recorded by the first append, kept until erase),
    # expiry times by self.clock (removed when expire() removes the conversation), the
    # conversations with their own setting (retain), the store secret, the tombstones.
    _owners: dict[ConversationID, str] = attrs.field(factory=dict, init=False, repr=False)
    _expires: dict[ConversationID, float] = attrs.field(factory=dict, init=False, repr=False)
    _retained: set[ConversationID] = attrs.field(factory=set, init=False, repr=False)
    _secret: bytes = attrs.field(factory=new_secret, init=False, repr=False)
    _tombstones: set[str] = attrs.field(factory=set, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._cache = HistoryCache(self.cache_bytes)

    @property
    def history_cache(self) -> HistoryCache:
        """This handle's cache (see the class docstring)."""
        return self._cache

    async def read(self, conversation_id: str) -> list[Message]:
        """A new list of the conversation's messages in stored order.

        ``[]`` for an unknown or closed conversation. An invalid id raises
        ``InvalidConversationIDError``.
        """
        return self._copy(conversation_id, self._messages)

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's messages, length and closure, under one lock.

        A closed conversation keeps its last length. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            return self._view_locked(cid)

    def _view_locked(self, cid: ConversationID) -> HistoryView:
        length = self._lengths.get(cid, 0)
        if cid in self._closed or self._gone_locked(cid):
            return HistoryView((), length, True)
        return HistoryView(tuple(self._messages.get(cid, ())), length)

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        """A new list of the conversation's accepted batches in append order: the
        ``Batch`` objects that were appended (a retry's batch is not added again).

        ``[]`` for an unknown or closed conversation. An invalid id raises
        ``InvalidConversationIDError``.
        """
        return self._copy(conversation_id, self._batches)

    def _copy(self, conversation_id: str, table: dict[ConversationID, list[T]]) -> list[T]:
        """A new list of ``table``'s entry for the conversation; ``[]`` when unknown or
        closed."""
        cid = ConversationID(conversation_id)
        with self._lock:
            if cid in self._closed or self._gone_locked(cid):
                return []
            return list(table.get(cid, ()))

    async def append(self, batch: Batch, *, owner: str | None = None) -> Receipt:
        """Append every message of ``batch``, contiguously and in order, and return its
        receipt.

        A retry of an accepted batch (same conversation, id and digest) returns an equal
        receipt and appends nothing, whatever its ``expected_length``. The same id with
        another digest raises ``AppendConflictError``; a closed conversation raises
        ``ConversationClosedError`` (retries of accepted batches included); a fenced batch
        whose ``expected_length`` is not the conversation's length raises
        ``HistoryChangedError``; in each case nothing is appended. Anything but a
        ``Batch`` raises ``InvalidBatchError``. ``owner``: see ``scope.history.Store``.
        """
        if not isinstance(batch, Batch):
            raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
        owner = None if owner is None else check_owner(owner)
        with self._lock:
            self._owned_append_locked(batch, owner)
        return batch.receipt()

    def _append_locked(self, batch: Batch) -> None:
        """``append``'s checks and writes; the caller holds the lock."""
        cid = batch.conversation_id
        if cid in self._closed:
            raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
        accepted = self._accepted.get(cid)
        digest = None if accepted is None else accepted.get(batch.id)
        if digest is not None:
            if digest != batch.digest:
                raise AppendConflictError(
                    f"append id {str(batch.id)!r} of conversation {str(cid)!r} was "
                    f"accepted with digest {digest}, this batch has {batch.digest}"
                )
            return  # a retry of an accepted batch: nothing to write
        length = self._lengths.get(cid, 0)
        expected = batch.expected_length
        if expected is not None and expected != length:
            raise HistoryChangedError(expected, length, cid)
        self._accepted.setdefault(cid, {})[batch.id] = batch.digest
        self._batches.setdefault(cid, []).append(batch)
        self._messages.setdefault(cid, []).extend(batch.messages)
        self._lengths[cid] = length + len(batch.messages)

    async def clear(self, conversation_id: str) -> None:
        """Close the conversation for ever: its batches are dropped, it reads as ``[]``,
        leaves the listing, and every later append raises ``ConversationClosedError``.

        Idempotent; an id never written is closed too. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            self._closed.add(cid)
            self._batches.pop(cid, None)
            self._messages.pop(cid, None)
            self._accepted.pop(cid, None)
        self._cache.forget(cid)

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take or renew the conversation's turn lease for ``ttl`` seconds (see
        ``scope.history.TurnLeaser``): True when it is now ``holder``'s."""
        cid = ConversationID(conversation_id)
        holder, ttl = check_lease(holder, ttl)
        with self._lock:
            return self._leases.acquire(cid, holder, ttl)

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        """Release ``holder``'s live lease: True when it held it."""
        cid = ConversationID(conversation_id)
        holder, _ = check_lease(holder, 1.0)
        with self._lock:
            return self._leases.release(cid, holder)

    async def acquire_turn_view(
        self, conversation_id: str, holder: str, ttl: float
    ) -> HistoryView | None:
        """``acquire_turn`` and ``read_view`` under one lock (see
        ``scope.history.Store``): the view when the lease is now ``holder``'s,
        None when another holder's live lease has it."""
        cid = ConversationID(conversation_id)
        holder, ttl = check_lease(holder, ttl)
        with self._lock:
            if not self._leases.acquire(cid, holder, ttl):
                return None
            return self._view_locked(cid)

    async def append_release_turn(
        self, batch: Batch, holder: str, *, owner: str | None = None
    ) -> Receipt:
        """``append`` and, when it returns, ``release_turn`` under one lock (see
        ``scope.history.Store``); when the append raises, the lease stays."""
        if not isinstance(batch, Batch):
            raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
        holder, _ = check_lease(holder, 1.0)
        owner = None if owner is None else check_owner(owner)
        with self._lock:
            self._owned_append_locked(batch, owner)
            self._leases.release(batch.conversation_id, holder)
        return batch.receipt()

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None, owner: str | None = None
    ) -> list[ConversationID]:
        """The open conversations holding at least one message: unique, in lexical
        (code point) order; ``[]`` when none. ``after``: only ids after this one (keyset
        pagination); ``limit``: at most this many (an int >= 1; None: all); ``owner``:
        only this owner's. Expired conversations are left out. Bad arguments raise
        ``ValueError`` (``InvalidConversationIDError`` for ``after``)."""
        count = check_limit(limit)
        start = None if after is None else ConversationID(after)
        owner = None if owner is None else check_owner(owner)
        with self._lock:
            now = self.clock()
            expires, owners = self._expires, self._owners
            ids = sorted(
                cid
                for cid in self._batches
                if (owner is None or owners.get(cid) == owner)
                and not (cid in expires and expires[cid] <= now)
            )
        first = 0 if start is None else bisect.bisect_right(ids, start)
        return ids[first:] if count is None else ids[first : first + count]

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    def _gone_locked(self, cid: ConversationID) -> bool:
        """Whether ``cid`` is expired (by the clock) or erased; the caller holds the
        lock. (``_closed`` holds the cleared ones and those ``expire`` removed.)"""
        expires = self._expires.get(cid)
        if expires is not None and expires <= self.clock():
            return True
        return bool(self._tombstones) and tombstone(self._secret, cid) in self._tombstones

    def _owned_append_locked(self, batch: Batch, owner: str | None) -> None:
        """``_append_locked`` with expiry and erasure closing the conversation, and the
        owner and the store-wide expiry recorded when the batch lands."""
        cid = batch.conversation_id
        if cid not in self._closed and self._gone_locked(cid):
            raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
        accepted = self._accepted.get(cid)
        before = 0 if accepted is None else len(accepted)
        self._append_locked(batch)
        if len(self._accepted[cid]) == before:
            return  # a retry of an accepted batch: nothing landed
        if before == 0 and owner is not None:
            self._owners.setdefault(cid, owner)
        if self.retention is not None and cid not in self._retained:
            self._expires[cid] = self.clock() + self.retention.total_seconds()

    async def retain(self, conversation_id: str, until: _dt.datetime | None) -> None:
        """Set the conversation's own expiry (``until``; None: never), see
        ``scope.history.Store``."""
        cid = ConversationID(conversation_id)
        when = check_until(until)
        with self._lock:
            if cid in self._closed or self._gone_locked(cid):
                raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
            self._retained.add(cid)
            if when is None:
                self._expires.pop(cid, None)
            else:
                self._expires[cid] = when.timestamp()

    def _drop_locked(self, cid: ConversationID) -> list[Batch]:
        """Delete what ``cid`` holds (batches, messages, dedupe records, lease) and
        return its batches in stored order; the caller holds the lock."""
        batches = self._batches.pop(cid, [])
        self._messages.pop(cid, None)
        self._accepted.pop(cid, None)
        self._leases.drop(cid)
        return batches

    async def expire(self, now: _dt.datetime | None = None, *, limit: int = 1000) -> int:
        """Remove up to ``limit`` conversations expired at ``now`` (default: the
        clock), soonest expiry first; each stays closed. See ``scope.history.Store``."""
        when = check_now(now)
        count = check_erase_limit(limit)
        removed: list[ConversationID] = []
        with self._lock:
            at = self.clock() if when is None else when.timestamp()
            due = sorted((t, cid) for cid, t in self._expires.items() if t <= at)
            for _, cid in due:
                del self._expires[cid]
                self._retained.discard(cid)
                if cid in self._closed:
                    continue  # cleared before it expired: nothing left to remove
                self._drop_locked(cid)
                self._closed.add(cid)
                removed.append(cid)
                if len(removed) == count:
                    break
        for cid in removed:
            self._cache.forget(cid)
        return len(removed)

    def _erase_locked(self, cid: ConversationID) -> ErasureReceipt:
        batches = self._drop_locked(cid)
        for table in (self._lengths, self._owners, self._expires):
            table.pop(cid, None)
        self._closed.discard(cid)
        self._retained.discard(cid)
        mark = tombstone(self._secret, cid)
        self._tombstones.add(mark)
        return ErasureReceipt.of(
            tombstone=mark,
            digests=[batch.digest for batch in batches],
            bytes=sum(len(batch.encoded_messages) for batch in batches),
            erased_at=_dt.datetime.fromtimestamp(self.clock(), _dt.UTC),
            store="memory",
        )

    async def erase(self, conversation_id: str) -> ErasureReceipt:
        """Erase the conversation under one lock and return the receipt (see
        ``scope.history.Store``)."""
        cid = ConversationID(conversation_id)
        with self._lock:
            receipt = self._erase_locked(cid)
        self._cache.forget(cid)
        return receipt

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[ErasureReceipt]:
        """Erase up to ``limit`` of ``owner``'s conversations (lexical order of their
        ids), see ``scope.history.Store``."""
        owner = check_owner(owner)
        count = check_erase_limit(limit)
        with self._lock:
            owned = sorted(cid for cid, who in self._owners.items() if who == owner)[:count]
            receipts = [self._erase_locked(cid) for cid in owned]
        for cid in owned:
            self._cache.forget(cid)
        return receipts

    async def check_erased(self, receipt: ErasureReceipt) -> list[str]:
        """What contradicts ``receipt`` here (``[]``: proven), see
        ``scope.history.Store``."""
        if not isinstance(receipt, ErasureReceipt):
            raise TypeError(f"check_erased needs an ErasureReceipt, got {type(receipt).__name__}")
        problems: list[str] = []
        if receipt.store != "memory":
            problems.append(f"the receipt was issued by a {receipt.store} store, not a memory one")
        with self._lock:
            if receipt.tombstone not in self._tombstones:
                problems.append(f"no tombstone {receipt.tombstone} in this store")
            tables: dict[str, Any] = {
                "batches": self._batches,
                "messages": self._messages,
                "dedupe records": self._accepted,
                "closed conversations": self._closed,
                "lengths": self._lengths,
                "owners": self._owners,
                "expiry times": self._expires,
                "retention settings": self._retained,
                "leases": self._leases.conversations(),
            }
            for where, ids in tables.items():
                if any(tombstone(self._secret, cid) == receipt.tombstone for cid in ids):
                    problems.append(
                        f"a conversation id hashing to the tombstone is held in {where}"
                    )
        return problems


def __getattr__(name: str) -> Any:
    """``Store``: the old name of ``InMemoryStore``, kept for one release (deprecated:
    ``scope.history.Store`` is the store protocol, a different thing)."""
    if name == "Store":
        warnings.warn(
            "scope.history.inmemory.Store is deprecated: use InMemoryStore (the name "
            "Store is the protocol scope.history.Store)",
            DeprecationWarning,
            stacklevel=2,
        )
        return InMemoryStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
