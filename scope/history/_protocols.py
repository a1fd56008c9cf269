"""The store contract: one ``Store`` protocol, and the narrower views of it that a
consumer needing less (a ``Reader``, a ``Writer``) names.

Every bundled store implements all of ``Store``; a simple third-party store (``read``,
``append``, ``clear``) gets the rest from ``scope.history.StoreAdapter``.
``StoreConformance`` tests exactly ``Store``.
"""

from __future__ import annotations

import datetime as _dt
from typing import Protocol, runtime_checkable

from scope.chat import Message
from scope.history._batch import Batch, Receipt
from scope.history._erasure import ErasureReceipt
from scope.history._ids import ConversationID
from scope.history._meta import ConversationMeta
from scope.history._tree import HistoryTree
from scope.history._view import HistoryView

__all__ = [
    "Clearer",
    "Lister",
    "ReadWriter",
    "Reader",
    "Store",
    "TurnLeaser",
    "ViewReader",
    "Writer",
]


@runtime_checkable
class Reader(Protocol):
    """Reads a conversation (a view of ``Store``)."""

    async def read(self, conversation_id: str) -> list[Message]:
        """A new list of the messages on the head path (DESIGN §6h: the first batch's
        through the head's), in order; ``[]`` for an unknown or closed conversation, or
        one rewound to its start."""
        ...


@runtime_checkable
class Writer(Protocol):
    """Appends batches (a view of ``Store``)."""

    async def append(self, batch: Batch) -> Receipt:
        """Append ``batch`` atomically (all or nothing) and return its receipt.

        In one atomic boundary, in this order: a closed conversation raises
        ``ConversationClosedError``; a retry of an accepted batch (same id, same digest)
        returns an equal receipt and appends nothing, and the same id with another digest
        raises ``AppendConflictError`` (append ids are unique across every branch); a
        batch whose ``expected_length`` is set and is not the number of messages on the
        head path, or whose ``expected_head`` is set and is not the head, raises
        ``HistoryChangedError``; otherwise the batch is appended after the head (its
        parent) and becomes the head. Nothing is appended when it raises.
        """
        ...


@runtime_checkable
class Clearer(Protocol):
    """Closes conversations (a view of ``Store``)."""

    async def clear(self, conversation_id: str) -> None:
        """Close the conversation for ever (idempotent; an id never written too)."""
        ...


@runtime_checkable
class Lister(Protocol):
    """Lists conversations (a view of ``Store``)."""

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None, owner: str | None = None
    ) -> list[ConversationID]:
        """Unique open conversation ids in lexical order; ``[]`` when none. ``after``:
        only ids after this one (keyset pagination: the last id of the previous page);
        ``limit``: at most this many (an int >= 1; None: all); ``owner``: only the
        conversations this owner's first append recorded (None: every owner's, and
        those without one). Expired conversations are never listed."""
        ...


@runtime_checkable
class ViewReader(Protocol):
    """Reads a conversation, its length and its closure in one atomic read (a view of
    ``Store``; ``WindowReader`` implements it too). The history ``Middleware`` fences
    the turns it commits only with a reader that has it."""

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's ``HistoryView``: ``messages`` are what ``read`` returns,
        ``length`` the number of messages on the head path, ``head`` the append id of
        its last batch (``""``: none), ``closed`` whether it was cleared, all from one
        atomic read. An unknown conversation is ``HistoryView((), 0, False)``; an
        invalid id raises ``InvalidConversationIDError`` before any I/O."""
        ...


@runtime_checkable
class TurnLeaser(Protocol):
    """Leases a conversation to one running turn at a time (DESIGN §6e; a view of
    ``Store``). Each call is one atomic step in the store. A lease is ``(holder,
    expiry)``: it expires by itself ``ttl`` seconds after it was last acquired (a
    holder that crashed blocks the conversation no longer than that), and only its
    holder's token renews or releases it. The history ``Middleware`` needs a leaser
    for ``on_overlap="reject"``, ``"wait"`` and ``"interrupt"``.
    """

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take or renew the conversation's lease for ``ttl`` seconds: True when it is
        now ``holder``'s (it was free, expired, or already ``holder``'s, which renews
        it), False when another holder's live lease has it. An invalid id, an empty
        ``holder`` or a ``ttl`` that is not a finite number > 0 raises (``ValueError``)
        before any I/O."""
        ...

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        """Release ``holder``'s lease: True when ``holder`` held it (live), False
        otherwise (another holder's lease, or none, stays as it is)."""
        ...


@runtime_checkable
class ReadWriter(Reader, Writer, Protocol):
    """Reader and Writer."""


@runtime_checkable
class Store(Reader, ViewReader, Writer, Clearer, Lister, TurnLeaser, Protocol):
    """The one store contract (DESIGN §6j): what a backend implements, what
    ``StoreConformance`` tests, what the history ``Middleware``, ``compact`` and the
    CLI use.

    - Reading: ``read``, ``read_view`` (messages, length and closure in one atomic
      read) and ``read_batches`` (the batches as appended, for receipts and
      verification).
    - Writing: ``append`` against an expected head (the batch's ``expected_length``
      and ``expected_head`` fences), or ``append_release_turn`` under a lease (the
      append and the lease's release in one step).
    - ``clear`` (closure for ever) and ``conversations`` (listing, keyset paged).
    - Leases: ``acquire_turn``/``release_turn``, and ``acquire_turn_view``: the lease
      and the view in one step. A turn under a lease takes two store steps, as a
      fenced one does, and a hand-over is exact: a turn that takes the lease from
      ``acquire_turn_view`` sees every batch its previous holder appended with
      ``append_release_turn``.

    - Branches (DESIGN §6h): a conversation is a tree of batches with one head. Every
      read above sees the head path; an append extends the head (its parent is the
      head, and it becomes the head); ``read_tree`` reads the whole tree and
      ``move_head`` moves the head (``scope.history.rewind``/``switch`` build on it);
      ``read_meta`` reads the moves recorded, the owner and the expiry.
      Append ids are idempotency keys across the whole tree.

    - Retention and erasure (DESIGN §6i): ``retain``, ``expire``, ``erase``,
      ``erase_owned`` and ``check_erased`` below, and owners (``append``'s ``owner``,
      ``conversations(owner=...)``).

    **Retention.** Every store takes a store-wide ``retention`` (a ``datetime.timedelta``
    > 0, or None: nothing expires by itself) as an open option or constructor keyword
    (``InMemoryStore(retention=...)``, ``SQLiteStore.open(path, retention=...)`` ...): a
    conversation without its own setting (``retain``) expires ``retention`` after its
    last append. A conversation expires when the store's clock reaches its expiry:
    from that moment it reads as ``[]`` (a closed view, a closed tree), leaves every
    listing, and ``append``, ``append_release_turn``, ``move_head`` and ``retain``
    raise ``ConversationClosedError`` (expiry is closure); ``expire`` then removes what
    it held. The store clock is the store's own (the database server's for a server
    store).

    **Erasure.** ``erase`` deletes a conversation (every branch, dedupe records,
    leases, moves, owner, expiry) and keeps only a tombstone, ``"hmac-sha256:" +
    hex(HMAC-SHA256(store secret, id))``; the conversation stays closed for ever. The
    store secret is 32 random bytes created with the store and kept in it: anyone with
    the store (so the secret) and a candidate id can test whether that id was erased,
    but the id itself is gone.
    """

    async def append(
        self, batch: Batch, *, owner: str | None = None, created: float | None = None
    ) -> Receipt:
        """``Writer.append``, and ``owner`` (DESIGN §6i; a principal string): the append
        that lands a conversation's first batch records it as the conversation's owner
        (None: no owner); every later append's owner is ignored, so an owner never
        changes. It is not part of the batch or its digest. An invalid owner raises
        ``ValueError`` (``TypeError`` for a non-string) before any I/O.

        ``created`` is for restoring a batch stored elsewhere (``scope history import``,
        DESIGN §6n), never for a turn: when the batch lands, its stored time
        (``read_tree``'s ``created``) is ``created`` (Unix seconds) instead of the store
        clock's now, kept to the microsecond at least. None (the default): the store's
        clock. It is not part of the batch or its digest; a retry of an accepted batch
        changes nothing (its first stored time stays), and the expiry an inserted batch
        moves (the store-wide ``retention``) still counts from the store's clock. A bad
        ``created`` (see ``scope.history.storekit.check_created``) raises ``TypeError`` or
        ``ValueError`` before any I/O."""
        ...

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        """A new list of the batches on the head path, in order, each equal to the batch
        that was appended (conversation id, append id, messages and digest), so
        ``batch.receipt()`` equals the receipt its append returned; ``[]`` for an unknown
        or closed conversation (``read_tree`` reads every branch). The messages of the
        batches, concatenated, are what ``read`` returns. An invalid id raises
        ``InvalidConversationIDError`` before any I/O."""
        ...

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        """Every batch of every branch, each batch's parent and stored time, and the head,
        in one atomic read (see ``HistoryTree``). An unknown conversation is an empty
        tree, a closed one an empty tree with ``closed=True``. An invalid id raises
        ``InvalidConversationIDError`` before any I/O."""
        ...

    async def read_meta(self, conversation_id: str) -> ConversationMeta:
        """The conversation's records that are not batches (see ``ConversationMeta``):
        its owner, expiry, whether ``retain`` set it, the head moves recorded under a
        move id, and its closure, in one atomic read, as stored (an expired
        conversation's too, until ``expire`` removes it; a cleared or expired one keeps
        its owner until ``erase``). An unknown conversation is ``ConversationMeta()``.

        ``closure`` says what closed it: ``"cleared"`` after ``clear`` (a clear after it
        expired too: the clear is what closed it for good), ``"expired"`` once its expiry
        has passed by the store's clock (before and after ``expire`` removed it),
        ``"erased"`` after ``erase`` (whatever came before: the store holds the id's
        tombstone and nothing else of it, so the meta is
        ``ConversationMeta(closure="erased")``), None while it is open. ``read_tree``
        and ``read_meta`` are what ``scope history export`` writes. An invalid id raises
        ``InvalidConversationIDError`` before any I/O; a corrupt record
        ``StoreError``."""
        ...

    async def move_head(
        self,
        conversation_id: str,
        head: str,
        *,
        expected_head: str,
        move_id: str | None = None,
    ) -> int:
        """Make ``head`` (the append id of a batch of this conversation, on any branch;
        ``""``: before the first batch) the conversation's head, in one atomic step, and
        return the number of messages on the new head path.

        In one atomic boundary, in this order: a closed conversation raises
        ``ConversationClosedError``; a ``move_id`` this conversation already recorded
        moves nothing and returns the length of the path to the head it recorded, or
        raises ``AppendConflictError`` when it recorded another ``head`` (the retry of a
        move is idempotent, like an append); a head other than ``expected_head`` raises
        ``HistoryChangedError`` (with ``expected_head`` and ``actual_head``; its lengths
        are the current head path's length); a ``head`` the conversation does not hold
        raises ``UnknownHeadError``; otherwise the head moves (and ``move_id``, when
        given, is recorded). Nothing changes when it raises. Leases do not gate it (the
        fence does, as for appends). Invalid ids raise ``InvalidConversationIDError`` /
        ``InvalidAppendIDError`` before any I/O."""
        ...

    async def acquire_turn_view(
        self, conversation_id: str, holder: str, ttl: float
    ) -> HistoryView | None:
        """``acquire_turn`` and, when the lease is now ``holder``'s, ``read_view``, in one
        atomic step (no append, clear or lease step lands between them): the view, or
        None when another holder's live lease has the conversation (nothing read, that
        lease untouched). A closed conversation is no exception: the lease is taken and
        its closed view returned. Invalid arguments raise before any I/O, as
        ``acquire_turn`` and ``read_view`` say."""
        ...

    async def append_release_turn(
        self, batch: Batch, holder: str, *, owner: str | None = None
    ) -> Receipt:
        """``append(batch)`` and, when it returns a receipt (the batch landed, or it is a
        retry of an accepted batch), ``release_turn(batch.conversation_id, holder)``, in
        one atomic step. The append keeps every rule of ``Writer.append`` (the lease
        does not gate it: the ``expected_length`` fence does); the release is the same
        compare-and-delete (another holder's lease stays). When the append raises
        (``ConversationClosedError``, ``AppendConflictError``, ``HistoryChangedError``, a
        store error, a cancellation), the lease is left as it was, so the caller still
        releases it with ``release_turn``. ``owner`` as for ``append``. Invalid arguments
        (``InvalidBatchError``, a bad holder or owner: ``ValueError``) raise before any
        I/O."""
        ...

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    async def retain(self, conversation_id: str, until: _dt.datetime | None) -> None:
        """Set the conversation's own expiry: it expires at ``until`` (an aware
        ``datetime``; a time already past expires it at once), or never when ``until``
        is None (the store-wide ``retention`` no longer applies to it). It replaces any
        earlier setting and later appends do not move it. An id never written may be
        retained (the setting waits for its first append). A closed (cleared, expired or
        erased) conversation raises ``ConversationClosedError``. A naive ``until``
        raises ``ValueError``, a non-datetime ``TypeError``, an invalid id
        ``InvalidConversationIDError``, before any I/O."""
        ...

    async def expire(self, now: _dt.datetime | None = None, *, limit: int = 1000) -> int:
        """Remove up to ``limit`` conversations expired at ``now`` (an aware datetime;
        None: the store's clock) and return how many: their batches, dedupe records,
        leases and moves are deleted; each stays closed, as after ``clear`` (its owner
        is kept, so ``erase_owned`` still finds it). Call it until it returns less than
        ``limit`` to remove them all. Expired conversations read as closed whether or
        not it ran. A bad ``limit`` (not an int >= 1) or a naive ``now`` raises
        ``ValueError`` before any I/O."""
        ...

    async def erase(self, conversation_id: str) -> ErasureReceipt:
        """Erase the conversation in one atomic step and return the receipt: every batch
        of every branch, the conversation's record, dedupe records, leases, move records,
        expiry and owner are deleted, and its tombstone written (see ``Store``). It stays
        closed for ever (``append``, ``retain``, ``move_head`` raise
        ``ConversationClosedError``; reads are empty); the handle's ``history_cache``
        forgets it. An unknown, cleared or already erased id gives a receipt with
        ``batches=0`` and ``bytes=0`` (the tombstone is written all the same). An invalid
        id raises ``InvalidConversationIDError`` before any I/O."""
        ...

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[ErasureReceipt]:
        """Erase up to ``limit`` of ``owner``'s conversations not yet erased (open,
        cleared or expired), each in its own atomic ``erase``, and return their receipts
        (``[]`` when none is left). A conversation is erased once: a later call never
        returns a receipt for it again. A bad owner or ``limit`` raises ``ValueError``
        before any I/O."""
        ...

    async def check_erased(self, receipt: ErasureReceipt) -> list[str]:
        """What contradicts ``receipt`` in this store, one line each; ``[]`` proves the
        erasure: the store holds the receipt's tombstone, and no conversation id it
        stores anywhere (open or closed, in any table or key) hashes to it. Anything but
        an ``ErasureReceipt`` raises ``TypeError``."""
        ...
