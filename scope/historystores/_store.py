"""The base of the persistent stores: the append sequence (check, one atomic write,
its outcome, the receipt), ``read`` and ``read_batches`` over one fetch, the async
context manager.
"""

from __future__ import annotations

import datetime as _dt
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from scope._validate import check_lease, check_limit
from scope.chat import Message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidViewError,
    StoreError,
    UnknownHeadError,
)
from scope.history import (
    Batch,
    ConversationID,
    ConversationMeta,
    ErasureReceipt,
    HistoryCache,
    HistoryTree,
    HistoryView,
    Receipt,
)
from scope.history.storekit import (
    Closure,
    check_created,
    check_erase_limit,
    check_head,
    check_move_id,
    check_now,
    check_owner,
    check_until,
    tombstone,
)
from scope.historystores._records import (
    Decoder,
    ListedIDs,
    decode_batches,
    decode_records,
)
from scope.historystores._scan import RecordScanning

__all__ = [
    "changed_error",
    "check_batch",
    "check_move_outcome",
    "check_outcome",
    "closed_error",
    "conflict_error",
    "fence_refuses",
    "releases",
    "RecordStore",
]

T = TypeVar("T")


def check_batch(batch: object) -> Batch:
    """``batch`` itself, or ``InvalidBatchError`` (before any I/O) for anything else."""
    if not isinstance(batch, Batch):
        raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
    return batch


def closed_error(conversation_id: str) -> ConversationClosedError:
    """What an append to a closed conversation raises (every backend says the same)."""
    return ConversationClosedError(f"conversation {str(conversation_id)!r} is closed")


def conflict_error(batch: Batch, accepted_digest: str) -> AppendConflictError:
    """What an append raises when its id was accepted with another digest."""
    return AppendConflictError(
        f"append id {str(batch.id)!r} of conversation {str(batch.conversation_id)!r} was "
        f"accepted with digest {accepted_digest}, this batch has {batch.digest}"
    )


def check_outcome(batch: Batch, answer: object, where: str) -> None:
    """Raise what a server-side append's answer means for ``batch``.

    The PostgreSQL function and the Redis script answer ``inserted``, ``closed``,
    ``accepted:<digest>`` (the dedupe record: the same digest is a retry, another one a
    conflict) or ``changed:<length>:<head>`` (the fence refused it; the head path's
    length and the head's append id, empty before the first batch), as text or UTF-8
    bytes. Anything else is a ``StoreError`` naming ``where`` (the function or
    script)."""
    outcome = answer.decode("utf-8", "replace") if isinstance(answer, bytes) else str(answer)
    if outcome == "inserted":
        return
    if outcome == "closed":
        raise closed_error(batch.conversation_id)
    if outcome.startswith("accepted:"):
        accepted = outcome.removeprefix("accepted:")
        if accepted != batch.digest:
            raise conflict_error(batch, accepted)
        return
    if outcome.startswith("changed:") and (
        batch.expected_length is not None or batch.expected_head is not None
    ):
        actual, _, head = outcome.removeprefix("changed:").partition(":")
        if actual.isdigit():
            raise changed_error(batch, int(actual), head)
    raise StoreError(f"{where} returned {outcome!r}")


def fence_refuses(batch: Batch, length: int, head: str) -> bool:
    """Whether ``batch``'s fences refuse a conversation whose head path holds ``length``
    messages and ends at ``head`` (``""``: no batch)."""
    return (batch.expected_length is not None and batch.expected_length != length) or (
        batch.expected_head is not None and batch.expected_head != head
    )


def changed_error(batch: Batch, length: int, head: str) -> HistoryChangedError:
    """What a fenced append refused at ``length`` messages and ``head`` raises."""
    expected = batch.expected_length
    return HistoryChangedError(
        length if expected is None else expected,
        length,
        batch.conversation_id,
        expected_head=batch.expected_head,
        actual_head=None if batch.expected_head is None else head,
    )


def check_move_outcome(
    conversation_id: ConversationID,
    head: str,
    expected_head: str,
    move_id: str | None,
    answer: object,
    where: str,
) -> int:
    """The new head path's length a backend's head move answered, or the error its
    answer means. The answers (text or UTF-8 bytes), in ``move_head``'s order:
    ``closed``; ``recorded:<head>`` (``move_id`` was recorded for another head: a
    conflict); ``changed:<length>:<head>`` (the fence refused it: the head path's
    length and the current head); ``unknown`` (``head`` names no batch);
    ``moved:<length>`` (moved, or the retry of a recorded move). Anything else is a
    ``StoreError`` naming ``where``."""
    outcome = answer.decode("utf-8", "replace") if isinstance(answer, bytes) else str(answer)
    cid = str(conversation_id)
    if outcome.startswith("moved:") and outcome[6:].isdigit():
        return int(outcome[6:])
    if outcome == "closed":
        raise closed_error(conversation_id)
    if outcome.startswith("recorded:"):
        raise AppendConflictError(
            f"move id {move_id!r} of conversation {cid!r} was recorded for head "
            f"{outcome.removeprefix('recorded:')!r}, this move names {head!r}"
        )
    if outcome.startswith("changed:"):
        length, _, actual = outcome.removeprefix("changed:").partition(":")
        if length.isdigit():
            n = int(length)
            raise HistoryChangedError(
                n, n, conversation_id, expected_head=expected_head, actual_head=actual
            )
    if outcome == "unknown":
        raise UnknownHeadError(
            f"conversation {cid!r} holds no batch {head!r}: the head was not moved"
        )
    raise StoreError(f"{where} returned {outcome!r}")


def releases(batch: Batch, outcome: str) -> bool:
    """Whether ``append_release_turn``'s release goes with this outcome of its append:
    the batch landed, or it is a retry of the same batch (its dedupe record holds this
    digest). Any refusal (closed, a conflict, the fence) leaves the lease."""
    return outcome == "inserted" or outcome == f"accepted:{batch.digest}"


def _owner(owner: object) -> str | None:
    """An append's or listing's ``owner``: None, or checked (``check_owner``)."""
    return None if owner is None else check_owner(owner)


class RecordStore(RecordScanning):
    """Base of the persistent stores: the append sequence, ``clear``, the listing and
    the lease steps around one backend primitive each; the async context manager and
    ``scan_records``; ``read`` and ``read_batches`` over one fetch of the
    conversation's records (the backend's ``_read``), decoded and checked by
    ``decode_records`` / ``decode_batches``; the listing's skipped ids.

    The append sequence, the same on every backend: the batch is checked before any I/O
    (``check_batch``), written by one atomic backend step (``_write``) that answers an
    outcome, the outcome raised as its error (``check_outcome``), the backend's
    follow-up run (``_after_append``), and the receipt returned with the batch's
    messages cached (the next read decodes nothing this handle wrote). A store that
    runs the same sequence for ``append_release_turn`` (``_append`` with the holder),
    its ``_write`` releasing the lease in the same step. The lease steps check their
    arguments here and run one backend step each (``_acquire``, ``_acquire_view``,
    ``_release``).

    A subclass sets ``_cache``, ``_listed`` and ``_outcome_source``, implements
    ``_write``, ``_clear``, ``_list``, ``_read``, ``_read_tree``, ``_move_head``, the
    lease steps, ``read_view`` and ``closed``.
    """

    __slots__ = ()

    _cache: HistoryCache
    _listed: ListedIDs
    #: What answers ``_write``'s outcome, for the error of an unknown one.
    _outcome_source: str

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release the store's connections; later calls raise ``StoreError``."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        """The store itself; ``aclose()`` runs on exit, whether the body ended normally,
        raised or was cancelled (the body's exception propagates)."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def history_cache(self) -> HistoryCache:
        """This handle's cache of decoded batches and checked replays, bounded by the
        ``cache_bytes`` the store was opened with (see ``scope.history.HistoryCache``)."""
        return self._cache

    @property
    def invalid_conversation_ids(self) -> tuple[str, ...]:
        """The stored conversation ids this handle's ``conversations()`` calls skipped
        because they are not valid ids (written outside scope), sorted; each was also
        logged once as a warning on the ``scope.historystores`` logger."""
        return self._listed.invalid

    async def append(
        self, batch: Batch, *, owner: str | None = None, created: float | None = None
    ) -> Receipt:
        """Append ``batch`` atomically and return its receipt. Raises
        ``ConversationClosedError`` (closed, expired or erased), ``AppendConflictError``,
        ``HistoryChangedError`` (a fenced batch at another length), ``InvalidBatchError``
        (not a Batch, before any I/O) or ``StoreError``. ``owner``: the append that lands
        the conversation's first batch records it, in the same atomic step (see
        ``scope.history.Store``); a bad owner raises ``ValueError`` before any I/O.
        ``created``: the stored time of a restored batch (``scope history import``; see
        ``scope.history.Store``), None for the server's clock."""
        batch = check_batch(batch)
        owner = _owner(owner)
        return await self._append(batch, None, owner, check_created(created))

    async def _append(
        self, batch: Batch, holder: str | None, owner: str | None, created: float | None = None
    ) -> Receipt:
        """The append sequence for a checked ``batch``. With a ``holder``
        (``append_release_turn``) ``_write`` also releases that
        holder's lease in its one atomic step when the batch landed or was a retry of
        the same batch (``releases``); a refused append leaves the lease."""
        outcome = await self._write(batch, holder, owner, created)
        check_outcome(batch, outcome, self._outcome_source)
        await self._after_append(batch, owner)
        self._cache.remember(batch)
        return batch.receipt()

    async def append_release_turn(
        self, batch: Batch, holder: str, *, owner: str | None = None
    ) -> Receipt:
        """``append`` and ``release_turn`` in one atomic step (see
        ``scope.history.Store``): the lease is released with the append when the batch
        landed or was a retry of the same batch; a refused append (it raises) wrote
        nothing and leaves the lease. ``owner`` as for ``append``."""
        batch = check_batch(batch)
        holder, _ = check_lease(holder, 1.0)
        return await self._append(batch, holder, _owner(owner))

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take or renew the conversation's turn lease for ``ttl`` seconds in one atomic
        step (see ``scope.history.TurnLeaser``): True when it is now ``holder``'s. It
        expires by the server's clock."""
        cid = ConversationID(conversation_id)
        holder, ttl = check_lease(holder, ttl)
        return await self._acquire(cid, holder, ttl)

    async def acquire_turn_view(
        self, conversation_id: str, holder: str, ttl: float
    ) -> HistoryView | None:
        """``acquire_turn`` and ``read_view`` in one atomic step (see
        ``scope.history.Store``): the view when the lease is now ``holder``'s, None
        (nothing read) when another holder's live lease has it. A corrupt stored record
        raises ``StoreError`` (the lease is then the holder's: release it)."""
        cid = ConversationID(conversation_id)
        holder, ttl = check_lease(holder, ttl)
        return await self._acquire_view(cid, holder, ttl)

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        """Release ``holder``'s live lease (compare and delete, one atomic step): True
        when it held it."""
        cid = ConversationID(conversation_id)
        holder, _ = check_lease(holder, 1.0)
        return await self._release(cid, holder)

    async def clear(self, conversation_id: str) -> None:
        """Close the conversation for ever and delete its batches (one atomic step);
        it leaves the listing and this handle's cache (another handle's cache drops it
        when its ``read_view`` finds it closed, and serves nothing without reading).
        Idempotent; an id never written is closed too."""
        cid = ConversationID(conversation_id)
        await self._clear(cid)
        self._cache.forget(cid)

    async def conversations(
        self, *, after: str | None = None, limit: int | None = None, owner: str | None = None
    ) -> list[ConversationID]:
        """Open conversations holding at least one batch, in code point order; an
        expired one is left out from the moment it expires (by the store's clock).

        - ``after``: only ids after this one (keyset pagination: pass the last id of
          the previous page); None (the default): from the first.
        - ``limit``: at most this many ids (an int >= 1); None (the default): all.
        - ``owner``: only the conversations this owner's first append recorded (None:
          every conversation).

        Paging through a store (``after`` = the last id returned, until a page is
        shorter than ``limit``) lists each open conversation once in bounded memory. A
        stored id that is not valid is skipped (see ``invalid_conversation_ids``); a
        page may then be shorter than ``limit`` before the end, so stop on an empty
        page. Bad arguments raise ``ValueError`` (``InvalidConversationIDError`` for
        ``after``) before any I/O."""
        count = check_limit(limit)
        start = None if after is None else ConversationID(after)
        who = _owner(owner)
        return self._listed.valid(await self._list(start, count, who))

    async def read(self, conversation_id: str) -> list[Message]:
        """The conversation's messages in stored order (``[]`` when unknown or closed).

        One round trip: a consistent snapshot. A corrupt stored record raises
        ``StoreError`` naming the conversation."""
        return await self._read(ConversationID(conversation_id), decode_records)

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        """The conversation's batches in stored order, each equal to the batch appended
        (``[]`` when unknown or closed); their messages are what ``read`` returns.

        One round trip: a consistent snapshot. A corrupt stored record raises
        ``StoreError`` naming the conversation."""
        return await self._read(ConversationID(conversation_id), decode_batches)

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        """Every batch of every branch, each batch's parent and stored time, and the
        head, in one atomic read (see ``scope.history.Store.read_tree``). An unknown
        conversation is an empty tree, a closed one an empty tree with ``closed=True``.
        A corrupt stored record raises ``StoreError``."""
        return await self._read_tree(ConversationID(conversation_id))

    async def read_meta(self, conversation_id: str) -> ConversationMeta:
        """The conversation's owner, expiry, retention setting, recorded head moves and
        closure, in one atomic read (see ``scope.history.Store.read_meta``). An unknown
        conversation is ``ConversationMeta()``, an erased one
        ``ConversationMeta(closure="erased")``; a stored value that is not what scope
        writes raises ``StoreError`` naming the conversation."""
        cid = ConversationID(conversation_id)
        owner, expires_at, retained, moves, closure = await self._read_meta(cid)
        if closure == "erased":
            return ConversationMeta(closure="erased")
        try:
            return ConversationMeta(owner, expires_at, retained, moves, closure)
        except InvalidViewError as exc:
            raise StoreError(
                f"conversation {str(cid)!r} is corrupt: its records beside the batches: {exc}"
            ) from None

    async def move_head(
        self,
        conversation_id: str,
        head: str,
        *,
        expected_head: str,
        move_id: str | None = None,
    ) -> int:
        """Make ``head`` (an append id of this conversation on any branch; ``""``:
        before the first batch) the head in one atomic step and return the new head
        path's length (see ``scope.history.Store.move_head`` for the order of the
        checks). Move ids are recorded apart from append ids. Raises
        ``ConversationClosedError``, ``AppendConflictError`` (``move_id`` recorded for
        another head), ``HistoryChangedError`` (the head is not ``expected_head``),
        ``UnknownHeadError`` or ``StoreError``; invalid ids raise
        ``InvalidConversationIDError`` / ``InvalidAppendIDError`` before any I/O."""
        cid = ConversationID(conversation_id)
        target = check_head(head, "head")
        expected = check_head(expected_head, "expected_head")
        mid = check_move_id(move_id)
        answer = await self._move_head(cid, target, expected, mid)
        return check_move_outcome(cid, target, expected, mid, answer, self._outcome_source)

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    async def retain(self, conversation_id: str, until: _dt.datetime | None) -> None:
        """Set the conversation's own expiry, in one atomic step: ``until`` (an aware
        datetime) or never (None); the store-wide ``retention`` no longer applies to it
        and later appends do not move it. An id never written may be retained (the
        setting waits for its first append). A closed (cleared, expired or erased)
        conversation raises ``ConversationClosedError``; a naive ``until``
        ``ValueError``, a non-datetime ``TypeError``, both before any I/O."""
        cid = ConversationID(conversation_id)
        when = check_until(until)
        if not await self._retain(cid, None if when is None else when.timestamp()):
            raise closed_error(cid)

    async def expire(self, now: _dt.datetime | None = None, *, limit: int = 1000) -> int:
        """Remove up to ``limit`` conversations expired at ``now`` (an aware datetime;
        None: the store's clock), soonest expiry first, in pages of at most
        ``EXPIRE_PAGE`` conversations (one atomic step each), and return how many:
        their batches, dedupe records and leases are deleted; each stays closed, as
        after ``clear``, keeping its owner (so ``erase_owned`` still finds it). Call it
        until it returns less than ``limit``. A bad ``limit`` or a naive ``now`` raises
        ``ValueError`` before any I/O."""
        when = check_now(now)
        count = check_erase_limit(limit)
        at = None if when is None else when.timestamp()
        removed = 0
        while removed < count:
            page = min(self.EXPIRE_PAGE, count - removed)
            gone = await self._expire_page(at, page)
            for cid in gone:
                self._cache.forget(cid)
            removed += len(gone)
            if len(gone) < page:
                break
        return removed

    async def erase(self, conversation_id: str) -> ErasureReceipt:
        """Erase the conversation in one atomic step and return the receipt (see
        ``scope.history.Store``): its batches, its record (closure, length, owner,
        expiry), dedupe records and lease are deleted and its tombstone written; it
        stays closed for ever. The handle's ``history_cache`` forgets it. An invalid id
        raises ``InvalidConversationIDError`` before any I/O."""
        cid = ConversationID(conversation_id)
        mark = tombstone(self._secret, cid)
        records, erased_at = await self._erase(cid, mark)
        self._cache.forget(cid)
        records.sort()
        return ErasureReceipt.of(
            tombstone=mark,
            digests=[str(digest) for _, digest, _ in records],
            bytes=sum(int(size) for _, _, size in records),
            erased_at=_dt.datetime.fromtimestamp(erased_at, _dt.UTC),
            store=self._store_kind,
            conversation_id=cid,
        )

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[ErasureReceipt]:
        """Erase up to ``limit`` of ``owner``'s conversations not yet erased (open,
        cleared or expired; lexical order of their ids), each in its own atomic
        ``erase``, and return their receipts (``[]`` when none is left). An erased
        conversation keeps no owner, so a later call never finds it again. A bad
        ``owner`` or ``limit`` raises ``ValueError`` before any I/O."""
        who = check_owner(owner)
        count = check_erase_limit(limit)
        return [await self.erase(cid) for cid in await self._owned(who, count)]

    async def check_erased(self, receipt: ErasureReceipt) -> list[str]:
        """What contradicts ``receipt`` in this store, one line each (``[]``: proven):
        a receipt of another kind of store, no tombstone, or a stored conversation id
        (in any table or key, open or closed) hashing to the tombstone. It reads every
        stored id (in pages). Anything but an ``ErasureReceipt`` raises ``TypeError``."""
        if not isinstance(receipt, ErasureReceipt):
            raise TypeError(f"check_erased needs an ErasureReceipt, got {type(receipt).__name__}")
        problems: list[str] = []
        if receipt.store != self._store_kind:
            problems.append(
                f"the receipt was issued by a {receipt.store} store, not a {self._store_kind} one"
            )
        problems += await self._erasure_problems(receipt.tombstone)
        return problems

    #: The most conversations one atomic step of ``expire`` removes.
    EXPIRE_PAGE: ClassVar[int] = 100

    #: ``ErasureReceipt.store`` of this backend.
    _store_kind: ClassVar[str]
    #: The store secret (read at open): the key of the tombstones' HMAC.
    _secret: bytes

    async def _retain(self, cid: ConversationID, until: float | None) -> bool:
        """Set ``cid``'s own expiry (Unix seconds; None: never) in one atomic step;
        False (nothing written) when it is closed, expired or erased."""
        raise NotImplementedError

    async def _expire_page(self, now: float | None, limit: int) -> list[ConversationID]:
        """Remove up to ``limit`` conversations expired at ``now`` (Unix seconds; None:
        the server's clock) in one atomic step; the ids removed."""
        raise NotImplementedError

    async def _erase(
        self, cid: ConversationID, mark: str
    ) -> tuple[list[tuple[Any, str, int]], float]:
        """Erase ``cid`` in one atomic step, writing the tombstone ``mark``: the
        ``(stored order key, digest, encoded bytes)`` of each batch deleted, and the
        time by the server's clock (Unix seconds)."""
        raise NotImplementedError

    async def _owned(self, owner: str, limit: int) -> list[ConversationID]:
        """Up to ``limit`` ids whose recorded owner is ``owner`` (any state), in code
        point order."""
        raise NotImplementedError

    async def _erasure_problems(self, mark: str) -> list[str]:
        """Whether the tombstone ``mark`` is stored, and every place a stored id hashing
        to it is held, as ``check_erased`` reports them."""
        raise NotImplementedError

    async def _write(
        self, batch: Batch, holder: str | None, owner: str | None, created: float | None
    ) -> object:
        """Append ``batch`` in one atomic step: the closed check, the dedupe record and
        the fence (DESIGN §6b's order), then the insert. Answers the outcome
        ``check_outcome`` reads (``inserted``, ``closed``, ``accepted:<digest>``,
        ``changed:<length>:<head>``). The batch's parent is the head, and it becomes
        the head. With a ``holder`` (``append_release_turn``), the same
        step releases ``holder``'s lease when ``releases(batch, outcome)``. An expired
        or erased conversation is ``closed``; an inserted first batch records ``owner``
        and every inserted batch moves the store-wide expiry (unless ``retain`` set the
        conversation's own), in the same step. An inserted batch's stored time is
        ``created`` (checked Unix seconds; None: the server's clock now)."""
        raise NotImplementedError

    async def _read_tree(self, cid: ConversationID) -> HistoryTree:
        """``read_tree`` on a checked id: one atomic read."""
        raise NotImplementedError

    async def _read_meta(
        self, cid: ConversationID
    ) -> tuple[str | None, float | None, bool, list[tuple[str, str]], Closure | None]:
        """``read_meta`` on a checked id, one atomic read: the owner (None: none), the
        expiry in Unix seconds (None: never), whether ``retain`` set it, the recorded
        ``(move id, head append id)`` pairs, and the closure (``"erased"`` when the
        id's tombstone is stored, whatever else is; None: open)."""
        raise NotImplementedError

    async def _move_head(
        self, cid: ConversationID, head: str, expected_head: str, move_id: str | None
    ) -> object:
        """``move_head`` on checked arguments, one atomic step answering what
        ``check_move_outcome`` reads."""
        raise NotImplementedError

    async def _acquire(self, cid: ConversationID, holder: str, ttl: float) -> bool:
        """``acquire_turn`` on checked arguments."""
        raise NotImplementedError

    async def _acquire_view(
        self, cid: ConversationID, holder: str, ttl: float
    ) -> HistoryView | None:
        """``acquire_turn_view`` on checked arguments."""
        raise NotImplementedError

    async def _release(self, cid: ConversationID, holder: str) -> bool:
        """``release_turn`` on checked arguments."""
        raise NotImplementedError

    async def _after_append(self, batch: Batch, owner: str | None) -> None:
        """What must follow a batch that landed, before its receipt (nothing here)."""

    async def _clear(self, cid: ConversationID) -> None:
        """Close ``cid`` and delete its batches (every branch) and move records in one
        atomic step; drop it from the listing."""
        raise NotImplementedError

    async def _list(
        self, after: ConversationID | None, limit: int | None, owner: str | None
    ) -> list[Any]:
        """Up to ``limit`` (all when None) listed ids after ``after`` (from the first
        when None), as the driver returns them, in code point order: the open,
        unexpired conversations that hold a batch (``owner``'s only, when given)."""
        raise NotImplementedError

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        """Fetch the ``(append_id, digest, encoded_messages)`` records of the
        conversation's head path in order, in one round trip, and return
        ``decode(cid, records, cache)``."""
        raise NotImplementedError
