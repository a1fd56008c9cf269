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
import threading
import warnings
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
    """

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
        if cid in self._closed:
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
            return [] if cid in self._closed else list(table.get(cid, ()))

    async def append(self, batch: Batch) -> Receipt:
        """Append every message of ``batch``, contiguously and in order, and return its
        receipt.

        A retry of an accepted batch (same conversation, id and digest) returns an equal
        receipt and appends nothing, whatever its ``expected_length``. The same id with
        another digest raises ``AppendConflictError``; a closed conversation raises
        ``ConversationClosedError`` (retries of accepted batches included); a fenced batch
        whose ``expected_length`` is not the conversation's length raises
        ``HistoryChangedError``; in each case nothing is appended. Anything but a
        ``Batch`` raises ``InvalidBatchError``.
        """
        if not isinstance(batch, Batch):
            raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
        with self._lock:
            self._append_locked(batch)
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

    async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
        """``append`` and, when it returns, ``release_turn`` under one lock (see
        ``scope.history.Store``); when the append raises, the lease stays."""
        if not isinstance(batch, Batch):
            raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
        holder, _ = check_lease(holder, 1.0)
        with self._lock:
            self._append_locked(batch)
            self._leases.release(batch.conversation_id, holder)
        return batch.receipt()

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None
    ) -> list[ConversationID]:
        """The open conversations holding at least one message: unique, in lexical
        (code point) order; ``[]`` when none. ``after``: only ids after this one (keyset
        pagination); ``limit``: at most this many (an int >= 1; None: all). Bad arguments
        raise ``ValueError`` (``InvalidConversationIDError`` for ``after``)."""
        count = check_limit(limit)
        start = None if after is None else ConversationID(after)
        with self._lock:
            ids = sorted(self._batches)
        first = 0 if start is None else bisect.bisect_right(ids, start)
        return ids[first:] if count is None else ids[first : first + count]


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
