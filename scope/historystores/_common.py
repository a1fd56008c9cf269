"""What the persistent stores share: argument checks, record decoding, corruption checks,
the async context manager.

Every backend stores a batch as one record: the conversation id, the append id, the
batch digest and the batch's canonical encoded messages (``Batch.encoded_messages``). On
read each record is checked against its digest, decoded strictly and checked to be in
the canonical encoding (``decode_record``: the messages for ``read``;
``decode_batches`` builds the appended ``Batch`` from them for ``read_batches``, one
check for both), so a record that was changed outside scope is reported as a
``StoreError`` naming the conversation and the append id, never returned, skipped or
allowed to crash the reader.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeAlias, TypeVar, final

import anyio.lowlevel
import orjson

from scope._documents import DIGEST_PREFIX, decode_messages, digest_of
from scope._json import parse_exact_fast
from scope._validate import check_type
from scope.chat import Message
from scope.codec import encode_messages
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidBatchError,
    StoreError,
)
from scope.history import AppendID, Batch, ConversationID, HistoryView, Receipt

__all__ = [
    "SCHEMA_VERSION",
    "AsyncClosing",
    "DecodedCache",
    "Decoder",
    "Driver",
    "ListedIDs",
    "Reconnecting",
    "RecordStore",
    "cancellation_mark",
    "check_batch",
    "check_outcome",
    "closed_error",
    "conflict_error",
    "corrupt",
    "decode_batches",
    "decode_records",
    "deliver_cancellation",
    "message_count",
    "require_asyncio",
    "retry_once",
    "shown_id",
    "stored_id",
    "schema_mismatch",
    "store_closed",
    "validate_cache_size",
    "validate_table_prefix",
    "view_of",
]

T = TypeVar("T")

#: Where the stores log what they skip or find odd (one warning per thing per handle).
logger: Final = logging.getLogger("scope.historystores")

#: The schema version the SQL stores write and expect. 1: scope 0.1. 2: a ``length``
#: column on the conversations table (the ``expected_length`` fence) and a ``_schema``
#: table holding this number. 3: a ``_leases`` table (``TurnLeaser``, DESIGN §6e).
SCHEMA_VERSION: Final = 3
_TABLE_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]*\Z")
#: PostgreSQL truncates identifiers at 63 bytes; the longest suffix we add is 14 bytes.
MAX_TABLE_PREFIX: Final = 63 - len("_conversations")


def require_asyncio(what: str, driver: str) -> None:
    """Raise ``RuntimeError`` unless an asyncio event loop runs this task."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} needs a running asyncio event loop ({driver} is asyncio-only); "
            "under trio use scope.historystores.sqlite.SQLiteStore"
        ) from None


async def cancellation_mark() -> int:
    """Call at the start of a store call, before the driver; pass the result to
    ``deliver_cancellation`` once the driver call returned or failed.

    Under asyncio a driver can swallow a cancellation: Python 3.11's ``asyncio.wait_for``
    (redis-py writes through it) returns the result when the awaited operation finishes
    in the same loop iteration as the ``task.cancel()``, and the task then goes on as if
    never cancelled. ``Task.cancelling()`` still counts the request (only whoever handles
    a cancellation calls ``uncancel()``), so a count that grew across the driver call
    means a cancellation arrived and was not delivered. The mark is that count; it is 0
    outside asyncio (trio delivers cancellation at every later checkpoint anyway).

    A count above 0 here means either a cancellation requested but not yet delivered
    (the driver could swallow it at its first await) or that this call runs in cleanup
    code after a delivered one; one checkpoint tells them apart: it raises
    ``CancelledError`` for the former, before any I/O, and returns for the latter.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio event loop in this thread: trio
        return 0
    if task is None:
        return 0
    if task.cancelling():
        await asyncio.sleep(0)
    return task.cancelling()


async def deliver_cancellation(mark: int, cause: BaseException | None = None) -> None:
    """Raise the cancellation a driver call swallowed (see ``cancellation_mark``), or
    one pending in an enclosing cancelled anyio/trio scope, instead of returning the
    call's result or raising its error (``cause``, chained). Returns when there is none.

    A store call that was cancelled therefore always ends cancelled, whatever the
    driver did; its outcome is unknown, as the store guarantees state (all or nothing,
    a retry of the same batch lands once).
    """
    # First a cancelled anyio/trio scope: its own delivery raises the exception that
    # scope recognises as its own (and so stops at it).
    await anyio.lowlevel.checkpoint_if_cancelled()
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None and task.cancelling() > mark:
        # A native Task.cancel() (or asyncio.timeout) that was swallowed.
        raise asyncio.CancelledError("cancelled during a store call") from cause


def check_batch(batch: object) -> Batch:
    """``batch`` itself, or ``InvalidBatchError`` (before any I/O) for anything else."""
    if not isinstance(batch, Batch):
        raise InvalidBatchError(f"append needs a Batch, got {type(batch).__name__}")
    return batch


def validate_table_prefix(prefix: object) -> str:
    """A table prefix: 1-49 characters of lowercase ASCII letters, digits and ``_``, not
    starting with a digit (so it is the same identifier quoted or not, in SQLite and
    PostgreSQL). Not a string: ``TypeError``; any other string: ``ValueError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"table_prefix must be a string, got {type(prefix).__name__}")
    if not _TABLE_PREFIX.match(prefix) or len(prefix) > MAX_TABLE_PREFIX:
        raise ValueError(
            f"table_prefix must be 1-{MAX_TABLE_PREFIX} characters of a-z, 0-9 and _, "
            f"not starting with a digit, got {prefix!r}"
        )
    return prefix


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
    conflict) or ``changed:<length>`` (the fence refused it), as text or UTF-8 bytes.
    Anything else is a ``StoreError`` naming ``where`` (the function or script)."""
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
    expected = batch.expected_length
    if outcome.startswith("changed:") and expected is not None:
        actual = outcome.removeprefix("changed:")
        if actual.isdigit():
            raise HistoryChangedError(expected, int(actual), batch.conversation_id)
    raise StoreError(f"{where} returned {outcome!r}")


def store_closed(store: str) -> StoreError:
    """What a call on a store handle after its ``aclose()`` raises (``store``: the class
    name)."""
    return StoreError(f"the {store} is closed")


@final
class Driver:
    """How one backend's driver fails: what ``retry_once`` retries, what it maps.

    ``name`` starts every error text (``"PostgreSQL"``); ``errors`` is everything the
    driver raises (each becomes ``StoreError``); ``retryable`` the failures after which
    the same operation may succeed on a fresh connection (the connection or its session
    dropped); ``timeouts`` the ones that are never retried (see ``retry_once``).
    """

    __slots__ = ("errors", "name", "retryable", "timeouts")

    def __init__(
        self,
        name: str,
        *,
        errors: tuple[type[BaseException], ...],
        retryable: tuple[type[BaseException], ...] = (),
        timeouts: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.name: Final = name
        self.errors: Final = errors
        self.retryable: Final = retryable
        self.timeouts: Final = timeouts

    def failed(self, exc: BaseException, what: str) -> StoreError:
        """The ``StoreError`` of a driver failure (callers chain ``exc``)."""
        return StoreError(f"{self.name} {what} failed: {type(exc).__name__}: {exc}")


class Reconnecting(Protocol):
    """What ``retry_once`` needs of a store handle."""

    @property
    def closed(self) -> bool: ...

    def _timed_out(self, exc: BaseException, what: str) -> StoreError:
        """The ``StoreError`` of a timeout (``exc`` is one of ``Driver.timeouts``)."""
        ...

    async def _reconnect(self) -> None:
        """Make the next attempt use a fresh connection (the server may have dropped
        every pooled one: a restart, a killed session)."""
        ...


async def retry_once(
    store: Reconnecting,
    driver: Driver,
    attempt: Callable[[], Awaitable[T]],
    what: str,
    settle: Callable[[BaseException | None], Awaitable[None]] | None = None,
) -> T:
    """``await attempt()``, retried once on a fresh connection when the connection
    dropped; every driver failure becomes a ``StoreError`` naming ``what``, with the
    driver's error chained.

    A ``driver.retryable`` failure of the first attempt reconnects (``store._reconnect``)
    and runs ``attempt`` again, its errors naming ``what (retried on a fresh
    connection)``; the store refuses instead (``store_closed``) when it was closed
    meanwhile. Retrying is always safe: every store operation is idempotent (an
    append's retry is recognised by its append id). A ``driver.timeouts`` failure is
    ``store._timed_out(exc, what)`` and never retried: whatever held the call (a lock,
    a full pool, load, a dead network) most likely still holds it, and a retry would
    double the caller's wait; the caller may repeat the call. Any other
    ``driver.errors`` failure is ``driver.failed(exc, what)``.

    ``settle`` runs after each attempt, before anything else, with its error or None:
    Redis passes ``deliver_cancellation`` there, so a cancellation the driver swallowed
    is raised instead of a retry, an error or the result.
    """
    for retry in (False, True):
        if retry:
            what = f"{what} (retried on a fresh connection)"
        try:
            result = await attempt()
        except driver.timeouts as exc:  # first: TimeoutError is an OSError
            if settle is not None:
                await settle(exc)
            raise store._timed_out(exc, what) from exc
        except driver.retryable as exc:
            if settle is not None:
                await settle(exc)
            if retry:
                raise driver.failed(exc, what) from exc
            if store.closed:
                raise store_closed(type(store).__name__) from None
            await store._reconnect()
            continue
        except driver.errors as exc:
            if settle is not None:
                await settle(exc)
            raise driver.failed(exc, what) from exc
        if settle is not None:
            await settle(None)
        return result
    raise AssertionError("unreachable: the second attempt returns or raises")


def corrupt(conversation_id: str, append_id: object, problem: str) -> StoreError:
    """The error a read raises for a stored record that is not what scope wrote."""
    return StoreError(
        f"conversation {str(conversation_id)!r}: stored batch {append_id!r} is corrupt: {problem}"
    )


def schema_mismatch(where: str, table: str, version: int | None) -> StoreError:
    """The error of a store opened with ``create=False`` on a schema it cannot use."""
    if version is None:
        found = f"has no scope tables (no {table} table)"
    elif version > SCHEMA_VERSION:
        return StoreError(
            f"{where} has schema version {version}, written by a newer scope; this "
            f"version reads schema {SCHEMA_VERSION}: upgrade scope"
        )
    else:
        found = f"has schema version {version}, this scope needs {SCHEMA_VERSION}"
    return StoreError(
        f"{where} {found}: run `scope history migrate --store URL` (or open once with "
        "create=True) as a role allowed to change the schema"
    )


def message_count(data: Any) -> int:
    """How many messages a stored record holds (schema upgrades count them)."""
    tree = orjson.loads(bytes(data))
    if type(tree) is not list:
        raise StoreError("a stored batch record is not a JSON array of messages")
    return len(tree)


def view_of(
    conversation_id: ConversationID,
    closed: bool,
    length: int,
    records: Iterable[tuple[Any, Any, Any]],
    cache: DecodedCache | None = None,
) -> HistoryView:
    """The ``HistoryView`` of one atomic read: the closure flag, the stored length and
    the ``(append_id, digest, encoded_messages)`` records (ignored when closed). The
    records must hold exactly ``length`` messages, else the store is corrupt."""
    if closed:
        return HistoryView((), int(length), True)
    messages = decode_records(conversation_id, records, cache)
    if len(messages) != length:
        raise StoreError(
            f"conversation {str(conversation_id)!r} is corrupt: it holds {len(messages)} "
            f"messages, its length record says {length}"
        )
    return HistoryView(tuple(messages), length)


class DecodedCache:
    """Decoded batches by digest: a bounded LRU shared by one store's reads.

    Decoding (strict, validating) costs far more than fetching, and a conversation is
    read again on every turn. A record's digest is checked against its bytes on every
    read, and equal digests mean equal bytes, so the cached messages (immutable values)
    are exactly what decoding would give. Thread-safe: SQLite reads decode on worker
    threads. ``max_messages=0`` disables it.
    """

    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Message, ...]] = OrderedDict()
        self._size = 0

    def get(self, digest: str) -> tuple[Message, ...] | None:
        with self._lock:
            found = self._entries.get(digest)
            if found is not None:
                self._entries.move_to_end(digest)
            return found

    def remember(self, batch: Batch) -> None:
        """Cache what a store has just appended (or found already appended): the batch's
        own messages under its digest. They are exactly what decoding its
        ``encoded_messages`` gives (the canonical encoding of these very values), so the
        next read of the conversation decodes nothing this handle wrote."""
        self.put(batch.digest, batch.messages)

    def put(self, digest: str, messages: tuple[Message, ...]) -> None:
        if len(messages) > self.max_messages:
            return
        with self._lock:
            if digest in self._entries:
                return
            self._entries[digest] = messages
            self._size += len(messages)
            while self._size > self.max_messages:
                _, evicted = self._entries.popitem(last=False)
                self._size -= len(evicted)


def validate_cache_size(value: object) -> int:
    """``decoded_cache_messages``: an int (else ``TypeError``) >= 0 (else ``ValueError``)."""
    check_type(value, int, "decoded_cache_messages", "an integer")
    assert isinstance(value, int)
    if value < 0:
        raise ValueError(f"decoded_cache_messages must be an integer >= 0, got {value!r}")
    return value


#: ``decode_records`` or ``decode_batches``: how a read turns a conversation's
#: ``(append_id, digest, encoded_messages)`` records into its result.
Decoder: TypeAlias = Callable[
    [ConversationID, Iterable[tuple[Any, Any, Any]], "DecodedCache | None"], T
]


def decode_record(
    conversation_id: str,
    append_id: Any,
    digest: Any,
    data: Any,
    cache: DecodedCache | None = None,
    error: Callable[[str], Exception] | None = None,
) -> tuple[Message, ...]:
    """The messages of one stored batch record, checked as ``read`` and ``read_batches``
    both check it: the digest matches the bytes, which are a non-empty JSON array of
    valid, complete messages in the canonical encoding (the bytes scope writes).

    A cache hit skips decoding and the canonical check: an entry is only stored after
    both passed, keyed by the digest, and the record's bytes were just checked against
    that digest, so they are the bytes that passed.

    A bad record raises ``error(problem)``; by default ``corrupt(conversation_id,
    append_id, problem)``, the ``StoreError`` a read raises (``StoredRecord.problem``
    passes its own, to report the problem and go on)."""
    fail = error or functools.partial(corrupt, conversation_id, append_id)
    if isinstance(data, memoryview | bytearray):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise fail(f"messages are {type(data).__name__}, not bytes")
    if not isinstance(digest, str) or not digest.startswith(DIGEST_PREFIX):
        raise fail(f"invalid digest {digest!r}")
    actual = digest_of(data)
    if actual != digest:
        raise fail(f"its messages digest to {actual}, the record says {digest}")
    if cache is not None:
        cached = cache.get(digest)
        if cached is not None:
            return cached
    try:
        tree = parse_exact_fast(data)
    except ValueError as exc:
        raise fail(f"invalid JSON: {exc}") from None
    if type(tree) is not list or not tree:
        raise fail("messages are not a non-empty JSON array")
    out = decode_messages(tree, fail)
    # Encoding fills each message's cached canonical bytes, so later encodes (a Batch
    # built from these messages, a request) reuse them.
    if encode_messages(out) != data:
        # Valid, digest-matching JSON, but not the bytes scope writes (whitespace, key
        # order, number spelling): a Batch of these messages would have another digest,
        # so the record was not written by scope as it stands.
        raise fail("messages are not in the canonical encoding")
    if cache is not None:
        cache.put(digest, out)
    return out


def _decoded(
    conversation_id: str,
    records: Iterable[tuple[Any, Any, Any]],
    cache: DecodedCache | None,
) -> Iterator[tuple[Any, Any, Any, tuple[Message, ...]]]:
    """Each record with its messages (``decode_record``), in order."""
    for append_id, digest, data in records:
        yield (
            append_id,
            digest,
            data,
            decode_record(conversation_id, append_id, digest, data, cache),
        )


def decode_records(
    conversation_id: str,
    records: Iterable[tuple[Any, Any, Any]],
    cache: DecodedCache | None = None,
) -> list[Message]:
    """The messages of ``(append_id, digest, encoded_messages)`` records, in order: what
    ``read`` returns (append ids are not looked at: ``read`` does not return them)."""
    return [m for *_, messages in _decoded(conversation_id, records, cache) for m in messages]


def decode_batches(
    conversation_id: ConversationID,
    records: Iterable[tuple[Any, Any, Any]],
    cache: DecodedCache | None = None,
) -> list[Batch]:
    """The batches of ``(append_id, digest, encoded_messages)`` records, in order: what
    ``read_batches`` returns.

    Each record's messages are decoded and checked as for ``read`` (``decode_record``:
    digest, strict decoding, canonical bytes); then the append id must be valid, so each
    batch equals the one appended and its ``encoded_messages`` are the stored bytes
    themselves. Anything else raises ``StoreError`` (see ``corrupt``).
    """
    out: list[Batch] = []
    for append_id, digest, data, messages in _decoded(conversation_id, records, cache):
        try:
            aid = AppendID(append_id)
        except InvalidAppendIDError as exc:
            raise corrupt(conversation_id, append_id, f"invalid append id: {exc}") from exc
        encoded = bytes(data)  # decode_record accepted it: bytes, bytearray or memoryview
        out.append(Batch._verified(conversation_id, aid, messages, encoded, digest))
    return out


def stored_id(raw: object) -> ConversationID:
    """A conversation id as a driver returned it (``str``, or UTF-8 ``bytes``,
    ``bytearray`` or ``memoryview``). One that is not a valid ``ConversationID`` (written
    outside scope) raises ``ValueError`` naming the problem."""
    if isinstance(raw, memoryview | bytearray):
        raw = bytes(raw)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"conversation id is not UTF-8: {exc}") from None
    elif not isinstance(raw, str):
        raise ValueError(f"conversation id is stored as {type(raw).__name__}")
    return ConversationID(raw)  # InvalidConversationIDError is a ValueError


def shown_id(raw: object) -> str:
    """How a log line shows a stored id: bytes that are not UTF-8 with backslash escapes."""
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw).decode("utf-8", "backslashreplace")
    return raw if isinstance(raw, str) else repr(raw)


class ListedIDs:
    """Validates the conversation ids a listing fetched, for one store handle.

    A stored id that is not a valid ``ConversationID`` (a newline, surrounding spaces,
    bytes that are not UTF-8: written outside scope) is skipped, so one bad record does
    not hide every other conversation. Each such id is logged once per handle, as a
    warning on the ``scope.historystores`` logger, and kept in ``invalid``: the sorted
    ids this handle's listings have skipped (``str``; bytes that are not UTF-8 are shown
    with backslash escapes). Thread-safe: SQLite lists on worker threads.
    """

    __slots__ = ("_lock", "_seen", "_store")

    def __init__(self, store: str) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    @property
    def invalid(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._seen))

    def valid(self, raw_ids: Iterable[object]) -> list[ConversationID]:
        """The valid ids of ``raw_ids``, in their order; the others are skipped."""
        out: list[ConversationID] = []
        for raw in raw_ids:
            try:
                out.append(stored_id(raw))
            except ValueError as exc:
                self._skip(shown_id(raw), str(exc))
        return out

    def _skip(self, shown: str, problem: str) -> None:
        with self._lock:
            if shown in self._seen:
                return
            self._seen.add(shown)
        logger.warning(
            "%s: listing skips stored conversation id %r: %s (written outside scope; "
            "repair or delete that record)",
            self._store,
            shown,
            problem,
        )


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class AsyncClosing:
    """Mixin: the store is an async context manager; ``async with`` returns the store
    itself and calls its ``aclose()`` on exit, whether the body ended normally, raised or
    was cancelled (the body's exception propagates)."""

    __slots__ = ()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self: _Closable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RecordStore(AsyncClosing):
    """Base of the persistent stores: ``read`` and ``read_batches`` over one fetch of
    the conversation's records (the backend's ``_read``), decoded and checked by
    ``decode_records`` / ``decode_batches``; the listing's skipped ids; the receipt of an
    append that landed.

    A subclass sets ``_cache`` and ``_listed``, implements ``_read`` and ``closed``.
    """

    __slots__ = ()

    _cache: DecodedCache
    _listed: ListedIDs

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        raise NotImplementedError

    @property
    def invalid_conversation_ids(self) -> tuple[str, ...]:
        """The stored conversation ids this handle's ``conversations()`` calls skipped
        because they are not valid ids (written outside scope), sorted; each was also
        logged once as a warning on the ``scope.historystores`` logger."""
        return self._listed.invalid

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

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        """Fetch the conversation's ``(append_id, digest, encoded_messages)`` records
        in stored order, in one round trip, and return ``decode(cid, records, cache)``."""
        raise NotImplementedError

    def _landed(self, batch: Batch) -> Receipt:
        """The receipt of an append that landed now or before (a retry): the batch's
        messages are cached under its digest, so the next read decodes nothing this
        handle wrote."""
        self._cache.remember(batch)
        return batch.receipt()
