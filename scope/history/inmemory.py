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
from collections.abc import Callable, Sequence
from typing import Any, final

import attrs

from scope._validate import check_lease, check_limit
from scope.chat import Message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    RestoreConflictError,
    UnknownHeadError,
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
    check_secret,
    check_tombstone,
    check_until,
    new_secret,
    tombstone,
)
from scope.history._ids import AppendID, ConversationID
from scope.history._meta import Closure, ConversationMeta
from scope.history._restore import ClosedConversation
from scope.history._tree import HistoryTree, check_created, check_head, check_move_id
from scope.history._view import HistoryView

__all__ = ["InMemoryStore"]


@final
class _Tree:
    """One open conversation's tree, under the store's lock: every accepted batch in
    stored order, its parent index, stored time and path length (messages from the root
    through it), the dedupe index (append id -> batch index, across every branch), the
    recorded head moves (move id -> target index), the head, and the head path kept
    flat (its batches and messages) so reads are list copies and an append on any
    branch extends it without walking the tree."""

    __slots__ = (
        "batches",
        "created",
        "head",
        "index",
        "lengths",
        "messages",
        "moves",
        "parents",
        "path",
    )

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.parents: list[int] = []
        self.created: list[float] = []
        self.lengths: list[int] = []
        self.index: dict[AppendID, int] = {}
        self.moves: dict[AppendID, int] = {}
        self.head = -1
        self.path: list[Batch] = []
        self.messages: list[Message] = []

    def length(self, index: int) -> int:
        """The number of messages on the path from the root through ``index``."""
        return 0 if index == -1 else self.lengths[index]

    def head_id(self) -> str:
        return "" if self.head == -1 else str(self.batches[self.head].id)

    def add(self, batch: Batch, created: float | None = None) -> None:
        """Store ``batch`` after the head and make it the head; its stored time is
        ``created`` (None: now)."""
        parent = self.head
        self.index[batch.id] = len(self.batches)
        self.batches.append(batch)
        self.parents.append(parent)
        self.created.append(time.time() if created is None else created)
        self.lengths.append(self.length(parent) + len(batch.messages))
        self.head = len(self.batches) - 1
        self.path.append(batch)
        self.messages.extend(batch.messages)

    def move(self, index: int) -> None:
        """Make ``batches[index]`` (-1: before the first batch) the head."""
        path: list[Batch] = []
        at = index
        while at != -1:
            path.append(self.batches[at])
            at = self.parents[at]
        path.reverse()
        self.head = index
        self.path = path
        self.messages = [message for batch in path for message in batch.messages]


@final
@attrs.define(eq=False)
class InMemoryStore:
    """An in-memory ``scope.history.Store``.

    Guarantees, beyond the store rules every backend keeps (see ``scope.history``):

    - **Atomicity.** Each method runs to completion under one lock and never suspends, so
      it cannot be interrupted half-way: the closed check, the dedupe record (across
      every branch), the ``expected_length``/``expected_head`` fence and the insert of
      an ``append`` happen together or not at all, and a ``read_view`` or ``read_tree``
      sees one state; ``move_head`` checks and moves in one step too. A lease step
      (``acquire_turn``/``release_turn``) is one locked step too, and so are the folded
      ones (``acquire_turn_view``: the lease and the view; ``append_release_turn``: the
      append and the release); leases expire by ``time.monotonic()``.
    - **Branches.** Each conversation is a tree of batches (DESIGN §6h): each batch
      keeps its parent, its stored time (``time.time()``) and its path length, and the
      head path is kept flat, so an append on any branch costs what it costs on a
      linear history and a read is a list copy; ``move_head`` rebuilds the flat head
      path from the tree (in memory, no message is copied).
    - **Cancellation.** No method has a checkpoint: a call that starts finishes. A task
      cancelled before the call starts leaves the store untouched.
    - **Sharing.** Batches and messages are immutable values, so reads hand out the stored
      objects (the appended ``Batch`` itself) in a new list; callers may change the list
      freely.
    - **Memory.** A cleared conversation keeps only its id (the closure evidence) and its
      last length; every branch's batches, its dedupe and move records are dropped.
      Nothing is ever evicted otherwise (branching deletes nothing).
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

    cache_bytes: int = attrs.field(
        default=DEFAULT_CACHE_BYTES, kw_only=True, converter=_cache_bytes, repr=False
    )
    retention: _dt.timedelta | None = attrs.field(
        default=None, kw_only=True, converter=check_retention, repr=False
    )
    clock: Callable[[], float] = attrs.field(default=time.time, kw_only=True, repr=False)
    _cache: HistoryCache = attrs.field(init=False, repr=False)

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    # The tree of each open conversation (see _Tree); changed only under the lock.
    _trees: dict[ConversationID, _Tree] = attrs.field(factory=dict, init=False, repr=False)
    # Closure evidence: never expires.
    _closed: set[ConversationID] = attrs.field(factory=set, init=False, repr=False)
    # The closed ids expire() removed (a subset of _closed): read_meta's "expired".
    _expired: set[ConversationID] = attrs.field(factory=set, init=False, repr=False)
    # The last head path length of each cleared conversation (its closed view's length).
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
        """A new list of the messages on the conversation's head path, in order.

        ``[]`` for an unknown or closed conversation. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            tree = None if self._gone_locked(cid) else self._trees.get(cid)
            return [] if tree is None else list(tree.messages)

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The head path's messages, its length, the head and the closure, under one
        lock.

        A closed conversation keeps its last length. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            return self._view_locked(cid)

    def _view_locked(self, cid: ConversationID) -> HistoryView:
        if cid in self._closed or self._gone_locked(cid):
            return HistoryView((), self._lengths.get(cid, 0), True)
        tree = self._trees.get(cid)
        if tree is None:
            return HistoryView((), 0)
        return HistoryView(tuple(tree.messages), tree.length(tree.head), head=tree.head_id())

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        """A new list of the batches on the head path, in order: the ``Batch`` objects
        that were appended (a retry's batch is not added again).

        ``[]`` for an unknown or closed conversation. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            tree = None if self._gone_locked(cid) else self._trees.get(cid)
            return [] if tree is None else list(tree.path)

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        """Every batch of every branch in stored order, their parents and stored times
        (``time.time()``), and the head, under one lock (see ``scope.history.Store``).
        An unknown conversation is an empty tree, a closed one an empty tree with
        ``closed=True``. An invalid id raises ``InvalidConversationIDError``."""
        cid = ConversationID(conversation_id)
        with self._lock:
            if cid in self._closed or self._gone_locked(cid):
                return HistoryTree((), (), (), -1, True)
            tree = self._trees.get(cid)
            if tree is None:
                return HistoryTree((), (), ())
            batches, parents, created = (
                tuple(tree.batches),
                tuple(tree.parents),
                tuple(tree.created),
            )
            head = tree.head
        return HistoryTree(batches, parents, created, head)

    async def read_meta(self, conversation_id: str) -> ConversationMeta:
        """The owner, expiry, retention setting, recorded moves and closure under one
        lock (see ``scope.history.Store.read_meta``); ``ConversationMeta()`` for an
        unknown conversation, ``ConversationMeta(closure="erased")`` for an erased one.
        An invalid id raises ``InvalidConversationIDError``."""
        cid = ConversationID(conversation_id)
        with self._lock:
            if self._tombstones and tombstone(self._secret, cid) in self._tombstones:
                return ConversationMeta(closure="erased")
            expires = self._expires.get(cid)
            closure = self._closed_as_locked(cid, self.clock())
            tree = self._trees.get(cid)
            moves = (
                ()
                if tree is None
                else tuple(
                    (str(mid), "" if at == -1 else str(tree.batches[at].id))
                    for mid, at in tree.moves.items()
                )
            )
            return ConversationMeta(
                self._owners.get(cid),
                None if expires is None else float(expires),
                cid in self._retained,
                moves,
                closure,
            )

    async def move_head(
        self,
        conversation_id: str,
        head: str,
        *,
        expected_head: str,
        move_id: str | None = None,
    ) -> int:
        """Make ``head`` (an append id of any branch; ``""``: before the first batch) the
        head under one lock, and return the new head path's length, with every rule of
        ``scope.history.Store.move_head`` (closed, the move id's retry or conflict, the
        ``expected_head`` fence, an unknown head; nothing changes when it raises)."""
        cid = ConversationID(conversation_id)
        target_id = check_head(head, "head")
        expected = check_head(expected_head, "expected_head")
        mid = check_move_id(move_id)
        with self._lock:
            if cid in self._closed or self._gone_locked(cid):
                raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
            tree = self._trees.get(cid)
            if mid is not None and tree is not None and mid in tree.moves:
                recorded = tree.moves[mid]
                recorded_id = "" if recorded == -1 else str(tree.batches[recorded].id)
                if recorded_id != target_id:
                    raise AppendConflictError(
                        f"move id {str(mid)!r} of conversation {str(cid)!r} moved the head "
                        f"to {recorded_id!r}, this move names {target_id!r}"
                    )
                return tree.length(recorded)
            actual = "" if tree is None else tree.head_id()
            if actual != expected:
                length = 0 if tree is None else tree.length(tree.head)
                raise HistoryChangedError(
                    length, length, cid, expected_head=expected, actual_head=actual
                )
            if target_id == "":
                target = -1
            else:
                found = None if tree is None else tree.index.get(AppendID(target_id))
                if found is None:
                    raise UnknownHeadError(
                        f"conversation {str(cid)!r} holds no batch {target_id!r}: the head "
                        "was not moved"
                    )
                target = found
            if tree is None:  # an unknown conversation moved to "": nothing to record
                return 0
            tree.move(target)
            if mid is not None:
                tree.moves[mid] = target
            return tree.length(target)

    async def append(
        self, batch: Batch, *, owner: str | None = None, created: float | None = None
    ) -> Receipt:
        """Append every message of ``batch`` after the head, contiguously and in order;
        the batch becomes the head. Returns its receipt.

        A retry of an accepted batch (same conversation, id and digest, on any branch)
        returns an equal receipt and appends nothing (the head does not move), whatever
        its fences. The same id with another digest raises ``AppendConflictError``; a
        closed conversation raises ``ConversationClosedError`` (retries of accepted
        batches included); a fenced batch whose ``expected_length`` is not the head
        path's length, or whose ``expected_head`` is not the head, raises
        ``HistoryChangedError``; in each case nothing is appended. Anything but a
        ``Batch`` raises ``InvalidBatchError``. ``owner`` and ``created`` (a restored
        stored time): see ``scope.history.Store``.
        """
        if not isinstance(batch, Batch):
            raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
        owner = None if owner is None else check_owner(owner)
        stamp = check_created(created)
        with self._lock:
            self._owned_append_locked(batch, owner, stamp)
        return batch.receipt()

    def _append_locked(self, batch: Batch, created: float | None = None) -> None:
        """``append``'s checks and writes (``created``: the stored time, None: now); the
        caller holds the lock."""
        cid = batch.conversation_id
        if cid in self._closed:
            raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
        tree = self._trees.get(cid)
        found = None if tree is None else tree.index.get(batch.id)
        if tree is not None and found is not None:
            digest = tree.batches[found].digest
            if digest != batch.digest:
                raise AppendConflictError(
                    f"append id {str(batch.id)!r} of conversation {str(cid)!r} was "
                    f"accepted with digest {digest}, this batch has {batch.digest}"
                )
            return  # a retry of an accepted batch: nothing to write
        length = 0 if tree is None else tree.length(tree.head)
        head = "" if tree is None else tree.head_id()
        expected = batch.expected_length
        expected_head = batch.expected_head
        if (expected is not None and expected != length) or (
            expected_head is not None and expected_head != head
        ):
            raise HistoryChangedError(
                length if expected is None else expected,
                length,
                cid,
                expected_head=expected_head,
                actual_head=None if expected_head is None else head,
            )
        if tree is None:
            tree = self._trees[cid] = _Tree()
        tree.add(batch, created)

    async def clear(self, conversation_id: str) -> None:
        """Close the conversation for ever: every branch is dropped, it reads as ``[]``,
        leaves the listing, and every later append or head move raises
        ``ConversationClosedError``.

        Idempotent; an id never written is closed too. An invalid id raises
        ``InvalidConversationIDError``.
        """
        cid = ConversationID(conversation_id)
        with self._lock:
            tree = self._trees.pop(cid, None)
            if cid not in self._closed:
                self._lengths[cid] = 0 if tree is None else tree.length(tree.head)
            self._closed.add(cid)
            self._expired.discard(cid)  # a clear is what closed it for good
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
        """The open conversations holding at least one batch (on any branch): unique, in lexical
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
                for cid in self._trees
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

    def _owned_append_locked(
        self, batch: Batch, owner: str | None, created: float | None = None
    ) -> None:
        """``_append_locked`` with expiry and erasure closing the conversation, and the
        owner and the store-wide expiry recorded when the batch lands."""
        cid = batch.conversation_id
        if cid not in self._closed and self._gone_locked(cid):
            raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
        tree = self._trees.get(cid)
        before = 0 if tree is None else len(tree.batches)
        self._append_locked(batch, created)
        if len(self._trees[cid].batches) == before:
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
        """Delete what ``cid`` holds (its tree: every branch's batches, the dedupe and
        move records; its lease) and return its batches in stored order; the caller
        holds the lock."""
        tree = self._trees.pop(cid, None)
        self._leases.drop(cid)
        return [] if tree is None else tree.batches

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
                self._expired.add(cid)
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
        self._expired.discard(cid)
        self._retained.discard(cid)
        mark = tombstone(self._secret, cid)
        self._tombstones.add(mark)
        return ErasureReceipt.of(
            tombstone=mark,
            digests=[batch.digest for batch in batches],
            bytes=sum(len(batch.encoded_messages) for batch in batches),
            erased_at=_dt.datetime.fromtimestamp(self.clock(), _dt.UTC),
            store="memory",
            conversation_id=cid,
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
                "trees": self._trees,
                "closed conversations": self._closed,
                "expired conversations": self._expired,
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

    # -- restore (DESIGN §6n: scope.history.Restorer) ---------------------------------

    def _closed_as_locked(self, cid: ConversationID, now: float) -> Closure | None:
        """``"cleared"`` or ``"expired"`` (its expiry passed by ``now``, removed or not),
        None when neither (erasure is not looked at); the caller holds the lock."""
        if cid in self._expired:
            return "expired"
        if cid in self._closed:
            return "cleared"
        expires = self._expires.get(cid)
        return "expired" if expires is not None and expires <= now else None

    def _closure_locked(self, cid: ConversationID, now: float) -> ClosedConversation | None:
        """How ``cid`` is closed (as ``read_meta`` says it), None when it is open,
        unknown or erased; the caller holds the lock."""
        closure = self._closed_as_locked(cid, now)
        if closure is None:
            return None
        if self._tombstones and tombstone(self._secret, cid) in self._tombstones:
            return None
        return ClosedConversation(
            cid, closure, self._owners.get(cid), self._view_locked(cid).length
        )

    async def closed_conversations(
        self, *, after: str | None = None, limit: int = 1000
    ) -> list[ClosedConversation]:
        """The cleared and expired conversations after ``after``, in lexical order, at
        most ``limit`` (see ``scope.history.Restorer``)."""
        count = check_erase_limit(limit)
        start = None if after is None else ConversationID(after)
        with self._lock:
            now = self.clock()
            due = (cid for cid, when in self._expires.items() if when <= now)
            ids = sorted(self._closed.union(due))
            first = 0 if start is None else bisect.bisect_right(ids, start)
            closed: list[ClosedConversation] = []
            for cid in ids[first:]:
                entry = self._closure_locked(cid, now)
                if entry is not None:
                    closed.append(entry)
                    if len(closed) == count:
                        break
            return closed

    async def restore_closed(self, closed: ClosedConversation) -> bool:
        """Record ``closed`` under one lock (see ``scope.history.Restorer``)."""
        if not isinstance(closed, ClosedConversation):
            raise TypeError(f"restore_closed needs a ClosedConversation, got {closed!r}")
        cid = closed.conversation_id
        with self._lock:
            held = self._closure_locked(cid, self.clock())
            if self._tombstones and tombstone(self._secret, cid) in self._tombstones:
                raise RestoreConflictError(f"conversation {str(cid)!r} is erased here")
            if cid in self._trees:
                raise RestoreConflictError(f"conversation {str(cid)!r} holds batches here")
            if held is not None:
                if held != closed:
                    raise RestoreConflictError(
                        f"conversation {str(cid)!r} is closed otherwise here ({held})"
                    )
                return False
            # An id with only a retain() setting (no batch yet) is not a conversation.
            self._expires.pop(cid, None)
            self._retained.discard(cid)
            self._closed.add(cid)
            if closed.closure == "expired":
                self._expired.add(cid)
            self._lengths[cid] = closed.length
            if closed.owner is not None:
                self._owners[cid] = closed.owner
        self._cache.forget(cid)
        return True

    async def tombstones(self, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """The erased ids' tombstones after ``after``, in order, at most ``limit`` (see
        ``scope.history.Restorer``)."""
        count = check_erase_limit(limit)
        with self._lock:
            marks = sorted(self._tombstones)
        first = 0 if after is None else bisect.bisect_right(marks, after)
        return marks[first : first + count]

    async def store_secret(self) -> bytes:
        """This store's secret (see ``scope.history.Restorer``)."""
        return self._secret

    async def restore_erasures(self, secret: bytes, tombstones: Sequence[str]) -> int:
        """Adopt ``secret`` (in a store holding nothing) and add ``tombstones`` under one
        lock (see ``scope.history.Restorer``)."""
        secret = check_secret(secret)
        marks = {check_tombstone(mark) for mark in tombstones}
        with self._lock:
            if secret != self._secret:
                if self._trees or self._closed or self._owners or self._expires:
                    raise RestoreConflictError(
                        "this store holds conversations under another store secret"
                    )
                if self._tombstones:
                    raise RestoreConflictError(
                        "this store holds tombstones under another store secret"
                    )
                self._secret = secret
            added = marks - self._tombstones
            if added:
                held = (
                    self._trees.keys() | self._closed | self._owners.keys() | self._expires.keys()
                )
                if any(tombstone(secret, cid) in added for cid in held):
                    raise RestoreConflictError(
                        "a conversation this store holds has an id hashing to one of the "
                        "tombstones (erase it first: an erased id holds nothing)"
                    )
            self._tombstones |= added
        return len(added)


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
