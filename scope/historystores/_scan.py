"""Reading stored batch records as they are, for checking a store: ``scan_records``.

``read`` and ``read_batches`` refuse a record that is not what scope wrote (a
``StoreError`` for the whole conversation). An operator who wants to know *which*
records are bad needs the raw records instead, each with its problem, and the scan must
go on past a bad one. ``RecordScanning.scan_records`` streams every stored record in
pages (bounded memory on any store size) with read-only statements only (``SELECT``,
``ZRANGE``, ``LRANGE``, ``TYPE``), so a store opened with ``create=False`` by a role that may only
read runs it; ``StoredRecord.problem()`` applies the very checks a read applies
(``decode_record``) and says what failed instead of raising.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Final, final

import attrs

from scope.errors import InvalidAppendIDError
from scope.history import AppendID, ConversationID
from scope.historystores._records import decode_record, shown_id, stored_id

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "RecordScanning",
    "StoredRecord",
    "UnreadableRecords",
    "validate_page_size",
]

#: How many records one round trip of ``scan_records`` fetches by default.
DEFAULT_PAGE_SIZE: Final = 100


class _Problem(Exception):
    """What ``decode_record`` raises for ``StoredRecord.problem``: the problem text."""


class UnreadableRecords(Exception):
    """What a backend's ``_record_page`` raises when a conversation's records cannot be
    read at all (a Redis key of another type where its list belongs), with the problem
    as its text: the scan reports it as one malformed record and goes on with the next
    conversation."""


@final
@attrs.frozen
class StoredRecord:
    """One stored batch record exactly as the store holds it (``scan_records``).

    - ``conversation_id``: the conversation id as stored (``str``; bytes that are not
      UTF-8 shown with backslash escapes); it may be invalid when written outside scope.
    - ``position``: the record's place in its conversation, from 0 (stored order).
    - ``append_id``, ``digest``, ``data``: the append id, the digest and the encoded
      messages as the driver returned them (normally ``str``, ``str``, ``bytes``; a
      damaged record may hold anything).
    - ``malformed``: why the record could not even be taken apart into those fields
      (a Redis list element without its two header lines), or why the conversation's
      records from this position on could not be read at all (a Redis key of another
      type; then ``append_id``, ``digest`` and ``data`` are None), else ``""``.
    """

    conversation_id: str
    position: int
    append_id: Any
    digest: Any
    data: Any = attrs.field(repr=False)
    malformed: str = ""

    @property
    def label(self) -> str:
        """How a report names the record: ``batch 'a1' (#2)`` (``#`` counts from 1), or
        ``batch #2`` when the append id is not text."""
        number = f"#{self.position + 1}"
        if isinstance(self.append_id, str):
            return f"batch {self.append_id!r} ({number})"
        return f"batch {number}"

    def problem(self) -> str | None:
        """What is wrong with the record, or None when it is sound: exactly what
        ``read`` and ``read_batches`` check. The conversation id and the append id are
        valid; the digest is a ``sha256:`` digest of the stored bytes (changed bytes or a
        changed digest fail here); the bytes are a non-empty JSON array of valid,
        complete messages (an undecodable message is named by its index and path) in the
        canonical encoding (bytes rewritten with a matching digest fail here). The first
        failing check is reported; nothing is raised."""
        if self.malformed:
            return self.malformed
        try:
            cid = stored_id(self.conversation_id)
        except ValueError as exc:
            return f"invalid conversation id: {exc}"
        try:
            decode_record(cid, self.append_id, self.digest, self.data, error=_Problem)
        except _Problem as exc:
            return str(exc)
        if not isinstance(self.append_id, str):
            return f"append id is {type(self.append_id).__name__}, not text"
        try:
            AppendID(self.append_id)
        except InvalidAppendIDError as exc:
            return f"invalid append id: {exc}"
        return None


def validate_page_size(value: object) -> int:
    """``page_size``: an int >= 1, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {value!r}")
    return value


class RecordScanning:
    """Mixin of the persistent stores: ``scan_records`` over two read-only primitives
    of the backend, ``_stored_ids`` (every conversation id that holds records, as
    stored, in pages) and ``_record_page`` (one page of a conversation's records)."""

    __slots__ = ()

    def scan_records(
        self,
        conversation_ids: Iterable[str] | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[StoredRecord]:
        """Every stored batch record exactly as stored, conversation by conversation,
        each conversation's records in stored order, including records ``read`` would
        refuse (check each with ``StoredRecord.problem()``).

        - ``conversation_ids``: only these conversations (validated now, before any I/O:
          ``InvalidConversationIDError``), in the order given; None (the default): every
          conversation that holds records, in the store's id order (closed conversations
          hold none).
        - ``page_size``: records (and ids) fetched per round trip, default 100
          (``ValueError`` unless an int >= 1). Memory stays bounded by one page whatever
          the store's size.

        Read-only: only ``SELECT`` (SQLite, PostgreSQL) or ``ZRANGE``/``LRANGE``/``TYPE`` (Redis)
        statements, so a store opened with ``create=False`` by a role that may only read
        scans it. Each page is its own round trip: a conversation appended to during the
        scan may show the new records or not; a record is never shown twice. On Redis
        the conversations are those of the listing (every conversation scope appended
        to). A conversation whose records cannot be read at all (on Redis, its batches
        key holds another type) yields one record whose ``malformed`` says so, and the
        scan goes on with the next conversation. Driver failures raise ``StoreError``.
        """
        size = validate_page_size(page_size)
        ids = None if conversation_ids is None else [ConversationID(c) for c in conversation_ids]
        return self._scan(ids, size)

    async def _scan(
        self, conversation_ids: list[ConversationID] | None, size: int
    ) -> AsyncIterator[StoredRecord]:
        if conversation_ids is not None:
            for cid in conversation_ids:
                async for record in self._scan_one(cid, size):
                    yield record
            return
        after: Any = None
        while True:
            page = await self._stored_ids(after, size)
            for raw in page:
                async for record in self._scan_one(raw, size):
                    yield record
            if len(page) < size:
                return
            after = page[-1]

    async def _scan_one(self, raw_id: Any, size: int) -> AsyncIterator[StoredRecord]:
        shown = shown_id(raw_id)
        position = 0
        after: Any = None
        while True:
            try:
                page = await self._record_page(raw_id, after, size)
            except UnreadableRecords as exc:
                yield StoredRecord(shown, position, None, None, None, str(exc))
                return
            for _, append_id, digest, data, malformed in page:
                yield StoredRecord(shown, position, append_id, digest, data, malformed)
                position += 1
            if len(page) < size:
                return
            after = page[-1][0]

    async def _stored_ids(self, after: Any, limit: int) -> list[Any]:
        """Up to ``limit`` stored conversation ids that hold records, after ``after``
        (from the start when None), in the store's id order, as the driver returns them."""
        raise NotImplementedError

    async def _record_page(
        self, raw_id: Any, after: Any, limit: int
    ) -> list[tuple[Any, Any, Any, Any, str]]:
        """Up to ``limit`` records ``(key, append_id, digest, data, malformed)`` of the
        conversation ``raw_id`` (as ``_stored_ids`` returned it, or a valid id) in stored
        order, after the record whose ``key`` is ``after`` (from the first when None).
        ``UnreadableRecords`` when the conversation's records cannot be read at all."""
        raise NotImplementedError
