"""Stored batch records: decoding and checking them, listed ids.

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

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, TypeAlias, TypeVar

from scope._documents import DIGEST_PREFIX, check_messages, decode_messages, digest_of
from scope._json import parse_exact_fast
from scope.chat import Message, PartKind
from scope.codec import decode_canonical, encode_messages
from scope.errors import InvalidAppendIDError, StoreError
from scope.history import (
    AppendID,
    Batch,
    ConversationID,
    HistoryCache,
    HistoryTree,
    HistoryView,
)

__all__ = [
    "corrupt",
    "decode_batches",
    "decode_record",
    "decode_records",
    "shown_id",
    "stored_id",
    "tree_of",
    "view_of",
    "Decoder",
    "ListedIDs",
]

T = TypeVar("T")


#: Where the stores log what they skip or find odd (one warning per thing per handle).
logger: Final = logging.getLogger("scope.historystores")


def corrupt(conversation_id: str, append_id: object, problem: str) -> StoreError:
    """The error a read raises for a stored record that is not what scope wrote."""
    return StoreError(
        f"conversation {str(conversation_id)!r}: stored batch {append_id!r} is corrupt: {problem}"
    )


def view_of(
    conversation_id: ConversationID,
    closed: bool,
    length: int,
    records: Iterable[tuple[Any, Any, Any]],
    cache: HistoryCache | None = None,
) -> HistoryView:
    """The ``HistoryView`` of one atomic read: the closure flag, the stored length and
    the ``(append_id, digest, encoded_messages)`` records of the head path (ignored when
    closed). The records must hold exactly ``length`` messages, else the store is
    corrupt. The view's ``head`` is the last record's append id (the head path ends at
    the head), ``""`` when there is none."""
    if closed:
        if cache is not None:
            cache.forget(conversation_id)  # cleared, maybe through another handle
        return HistoryView((), int(length), True)
    records = records if isinstance(records, list) else list(records)
    messages = decode_records(conversation_id, records, cache)
    if len(messages) != length:
        raise StoreError(
            f"conversation {str(conversation_id)!r} is corrupt: it holds {len(messages)} "
            f"messages, its length record says {length}"
        )
    head = records[-1][0] if records else ""
    if isinstance(head, bytes | bytearray | memoryview):
        head = bytes(head).decode("utf-8", "replace")
    return HistoryView(tuple(messages), length, head=str(head))


def tree_of(
    conversation_id: ConversationID,
    closed: bool,
    head: Any,
    rows: Iterable[tuple[Any, Any, Any, Any, Any, Any]],
    cache: HistoryCache | None = None,
) -> HistoryTree:
    """The ``HistoryTree`` of one atomic read: the closure flag, the head's key (None:
    the empty path) and the ``(key, parent_key, created, append_id, digest,
    encoded_messages)`` rows of every batch in stored order (a key is whatever names a
    batch in the backend, a parent key None for a first batch; ``created`` Unix seconds
    or None). Each batch is checked as ``read_batches`` checks it; a parent or head that
    names no earlier batch raises ``StoreError`` (the store is corrupt)."""
    if closed:
        if cache is not None:
            cache.forget(conversation_id)
        return HistoryTree((), (), (), -1, True)
    rows = list(rows)
    batches = decode_batches(conversation_id, ((r[3], r[4], r[5]) for r in rows), cache)
    index: dict[Any, int] = {}
    parents: list[int] = []
    created: list[float | None] = []
    for position, (key, parent, when, append_id, _, _) in enumerate(rows):
        if parent is None:
            parents.append(-1)
        elif parent in index:
            parents.append(index[parent])
        else:
            raise corrupt(
                conversation_id, append_id, f"its parent {parent!r} is not stored before it"
            )
        index[key] = position
        created.append(None if when is None else float(when))
    if head is None:
        at = -1
    elif head in index:
        at = index[head]
    else:
        raise StoreError(
            f"conversation {str(conversation_id)!r} is corrupt: its head {head!r} names no "
            "stored batch"
        )
    return HistoryTree(tuple(batches), tuple(parents), tuple(created), at, False)


#: ``decode_records`` or ``decode_batches``: how a read turns a conversation's
#: ``(append_id, digest, encoded_messages)`` records into its result.
Decoder: TypeAlias = Callable[
    [ConversationID, Iterable[tuple[Any, Any, Any]], "HistoryCache | None"], T
]


def decode_record(
    conversation_id: str,
    append_id: Any,
    digest: Any,
    data: Any,
    cache: HistoryCache | None = None,
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
    if type(data) is not bytes:
        if isinstance(data, memoryview | bytearray):
            data = bytes(data)
        elif not isinstance(data, bytes):
            raise _failure(conversation_id, append_id, error)(
                f"messages are {type(data).__name__}, not bytes"
            )
    actual = digest_of(data)
    if type(digest) is not str or digest != actual:  # equal to a digest: a valid one
        if not isinstance(digest, str) or not digest.startswith(DIGEST_PREFIX):
            raise _failure(conversation_id, append_id, error)(f"invalid digest {digest!r}")
        if actual != digest:
            raise _failure(conversation_id, append_id, error)(
                f"its messages digest to {actual}, the record says {digest}"
            )
    if cache is not None:
        cached = cache.messages(conversation_id, digest)
        if cached is not None:
            return cached
    # The bytes scope writes parse with orjson and dump back byte for byte, keys sorted;
    # the decoded values then encode to exactly those bytes when each item holds only
    # what the encoder writes, in its form (scope._codec._canonical): checked on the
    # tree, without encoding the values again. Each message keeps its bytes, so later
    # encodes (a Batch built from these messages, a request) reuse them.
    found = decode_canonical(data)
    if found is not None:
        out, canonical = found
        # Complete: no tool_call_delta parts; check_messages names the first one. Each
        # part's kind read here costs less than searching the bytes for the kind's
        # token (bytes.find parses its arguments and scans every byte, per record).
        for message in out:
            for part in message.parts:
                if part.kind is _DELTA:
                    check_messages(out, _failure(conversation_id, append_id, error))
    else:  # any other spelling (number tokens orjson respells, say): the exact reader
        fail = _failure(conversation_id, append_id, error)
        try:
            tree = parse_exact_fast(data)
        except ValueError as exc:
            raise fail(f"invalid JSON: {exc}") from None
        if type(tree) is not list or not tree:
            raise fail("messages are not a non-empty JSON array")
        out = decode_messages(tree, fail)
        canonical = encode_messages(out) == data
    if not canonical:
        # Valid, digest-matching JSON, but not the bytes scope writes (whitespace, key
        # order, number spelling, a member at its default): a Batch of these messages
        # would have another digest, so the record was not written by scope as it stands.
        raise _failure(conversation_id, append_id, error)(
            "messages are not in the canonical encoding"
        )
    if cache is not None:
        cache.keep_messages(conversation_id, digest, out, len(data))
    return out


#: The part kind a stored message must not carry (see ``decode_record``).
_DELTA: Final = PartKind.TOOL_CALL_DELTA


def _failure(
    conversation_id: str, append_id: Any, error: Callable[[str], Exception] | None
) -> Callable[[str], Exception]:
    """``error``, or ``corrupt`` for the record (built only when a check fails)."""
    return error or functools.partial(corrupt, conversation_id, append_id)


def _decoded(
    conversation_id: str,
    records: Iterable[tuple[Any, Any, Any]],
    cache: HistoryCache | None,
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
    cache: HistoryCache | None = None,
) -> list[Message]:
    """The messages of ``(append_id, digest, encoded_messages)`` records, in order: what
    ``read`` returns (append ids are not looked at: ``read`` does not return them)."""
    out: list[Message] = []
    extend = out.extend
    for append_id, digest, data in records:
        extend(decode_record(conversation_id, append_id, digest, data, cache))
    return out


def decode_batches(
    conversation_id: ConversationID,
    records: Iterable[tuple[Any, Any, Any]],
    cache: HistoryCache | None = None,
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
        out.append(Batch.from_verified(conversation_id, aid, messages, encoded, digest))
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
        raw_ids = list(raw_ids)
        fast = ConversationID.bulk(raw_ids)  # one check for the whole page, when it passes
        if fast is not None:
            return fast
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
