"""``scope history export`` / ``import`` of a whole store (DESIGN §6n): the export format
(version 3) and the restore of a store through the ``Store`` and ``Restorer`` protocols.

An export file is JSON Lines. Its first line is the header
``{"format":"scope-history-export","version":3}``; every other line is an object with
sorted keys, one of:

- ``{"secret"}``: the source store's secret (64 hex digits), the key of its tombstones;
  written once, before the tombstones, when the store holds any (so the file is as
  sensitive as the store).
- ``{"tombstone"}``: one erased conversation's tombstone (``"hmac-sha256:<64 hex>"``);
  the erased id itself is in no file.
- ``{"closure", "conversation_id", "length", "owner"}``: a closed conversation
  (``scope.history.ClosedConversation``): ``"cleared"`` or ``"expired"``, the owner
  (``null``: none) and its closed view's length. Its batches are gone (or due to go).
- a conversation line, the whole tree of an open conversation:

- ``conversation_id``: the id.
- ``batches``: every batch of every branch in stored order, each
  ``{"created", "digest", "id", "messages", "parent"}``: the stored time (Unix seconds
  by the source store's clock, ``null`` where it kept none), the batch digest, the
  append id, the messages (canonical encoding, so the digest is recomputed from them and
  checked), and the append id of the batch it follows (``""``: it starts the
  conversation). A parent always comes before its children.
- ``head``: the append id of the head batch (``""``: rewound to its start).
- ``moves``: the head moves recorded under a move id, ``[move id, head]`` pairs sorted
  by move id (their retries on the imported store return what they returned).
- ``owner`` (``null``: none), ``expires_at`` (Unix seconds, ``null``: never) and
  ``retained`` (whether ``retain`` set the expiry).

A version 2 file (scope 0.5 before closed conversations were carried) holds only
conversation lines; ``import`` still reads it. A file without the header is the old
format (scope 0.1 to 0.4): one ``{"conversation_id", "messages"}`` line per conversation
(``_history.ConversationLine``); ``import`` still reads it too.
"""

from __future__ import annotations

import binascii
import datetime as _dt
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import IO, Any, Final, TextIO, TypeVar, final

import attrs
import orjson

from scope._documents import decode_messages
from scope._json import Num, parse_exact_fast
from scope.cli._errors import CLIError
from scope.cli._render import Progress
from scope.cli._stores import CLIStore, closed_as, opened_store
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    InvalidBatchError,
    InvalidConversationIDError,
    InvalidReceiptError,
    InvalidViewError,
    RestoreConflictError,
    StoreError,
)
from scope.history import (
    Batch,
    ClosedConversation,
    ConversationID,
    ConversationMeta,
    HistoryTree,
)
from scope.history.storekit import check_secret, check_tombstone

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "HEADER",
    "ConversationRecord",
    "ExportContents",
    "RestoreConflict",
    "export_store",
    "export_version",
    "paged",
    "parse_export",
    "parse_export_line",
    "restore_conversation",
]

#: The ``format`` of an export file's header line.
EXPORT_FORMAT: Final = "scope-history-export"
#: The version of the export format this scope writes.
EXPORT_VERSION: Final = 3
#: The versions with a header this scope reads.
READ_VERSIONS: Final = (2, 3)
#: The header line, without the newline.
HEADER: Final = orjson.dumps(
    {"format": EXPORT_FORMAT, "version": EXPORT_VERSION}, option=orjson.OPT_SORT_KEYS
)

_KEYS: Final = frozenset(
    {"batches", "conversation_id", "expires_at", "head", "moves", "owner", "retained"}
)
_BATCH_KEYS: Final = frozenset({"created", "digest", "id", "messages", "parent"})
_CLOSED_KEYS: Final = frozenset({"closure", "conversation_id", "length", "owner"})
_T = TypeVar("_T")


def _seconds(value: Any, where: str) -> float | None:
    """A time in Unix seconds (a finite JSON number) or None, else ``InvalidBatchError``."""
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int | float | Num):
        raise InvalidBatchError(f"{where}: expected a number of seconds or null")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise InvalidBatchError(f"{where}: expected a finite number of seconds")
    return seconds


def _placed(where: str) -> Callable[[str], InvalidBatchError]:
    """The error ``decode_messages`` raises for a problem inside ``where``."""

    def error(problem: str) -> InvalidBatchError:
        return InvalidBatchError(f"{where}.{problem}")

    return error


def _string(value: Any, where: str) -> str:
    if type(value) is not str:
        raise InvalidBatchError(f"{where}: expected a string")
    return value


def _keys(tree: Any, expected: frozenset[str], where: str) -> None:
    if type(tree) is not dict:
        raise InvalidBatchError(f"{where}expected a JSON object")
    if set(tree) != expected:
        missing = sorted(expected - set(tree))
        unknown = sorted(set(tree) - expected)
        raise InvalidBatchError(
            f"{where}expected the keys {', '.join(sorted(expected))} "
            f"(missing {missing or 'none'}, unknown {unknown or 'none'})"
        )


@final
@attrs.frozen
class ConversationRecord:
    """One conversation line of an export file: the conversation's whole tree (as
    ``Store.read_tree`` reads it) and its ``ConversationMeta`` (``Store.read_meta``)."""

    conversation_id: ConversationID
    tree: HistoryTree
    meta: ConversationMeta

    def __attrs_post_init__(self) -> None:
        if self.tree.closed or not self.tree.batches:
            raise InvalidBatchError("an exported conversation holds at least one batch")
        for batch in self.tree.batches:
            if batch.conversation_id != self.conversation_id:
                raise InvalidBatchError(
                    f"batch {str(batch.id)!r} belongs to {str(batch.conversation_id)!r}"
                )
        ids = {str(batch.id) for batch in self.tree.batches}
        if len(ids) != len(self.tree.batches):
            raise InvalidBatchError("an append id is given to two batches")
        for move, head in self.meta.moves:
            if head and head not in ids:
                raise InvalidBatchError(f"move {move!r} names no batch of this conversation")

    def head_id(self) -> str:
        """The head's append id (``""``: before the first batch)."""
        head = self.tree.head
        return "" if head == -1 else str(self.tree.batches[head].id)

    def parent_id(self, index: int) -> str:
        """The append id of the batch ``batches[index]`` follows (``""``: none)."""
        parent = self.tree.parents[index]
        return "" if parent == -1 else str(self.tree.batches[parent].id)

    def to_json(self) -> bytes:
        """The canonical line, without the newline (keys sorted, messages in the codec's
        canonical encoding, byte for byte what each batch digests)."""
        tree, meta = self.tree, self.meta
        batches = [
            {
                "created": tree.created[index],
                "digest": batch.digest,
                "id": str(batch.id),
                "messages": orjson.Fragment(batch.encoded_messages),
                "parent": self.parent_id(index),
            }
            for index, batch in enumerate(tree.batches)
        ]
        return orjson.dumps(
            {
                "batches": batches,
                "conversation_id": str(self.conversation_id),
                "expires_at": meta.expires_at,
                "head": self.head_id(),
                "moves": [list(pair) for pair in meta.moves],
                "owner": meta.owner,
                "retained": meta.retained,
            },
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def from_json(cls, line: bytes) -> ConversationRecord:
        """Decode one line strictly; anything but a line ``to_json`` could have written
        (bad JSON, keys, ids, a digest that is not the messages', a parent or head naming
        no earlier batch) raises ``InvalidBatchError`` naming the place."""
        try:
            tree = parse_exact_fast(line)
        except (ValueError, TypeError) as exc:
            raise InvalidBatchError(f"invalid JSON: {exc}") from None
        _keys(tree, _KEYS, "")
        try:
            cid = ConversationID(_string(tree["conversation_id"], "conversation_id"))
        except InvalidConversationIDError as exc:
            raise InvalidBatchError(f"conversation_id: {exc}") from None
        if type(tree["batches"]) is not list:
            raise InvalidBatchError("batches: expected an array")
        batches: list[Batch] = []
        parents: list[int] = []
        created: list[float | None] = []
        index: dict[str, int] = {}
        for at, item in enumerate(tree["batches"]):
            where = f"batches[{at}]"
            _keys(item, _BATCH_KEYS, f"{where}: ")
            aid = _string(item["id"], f"{where}.id")
            messages = decode_messages(item["messages"], _placed(where))
            batch = Batch(cid, aid, messages)
            if _string(item["digest"], f"{where}.digest") != batch.digest:
                raise InvalidBatchError(
                    f"{where}.digest: {item['digest']!r} is not the digest of its messages "
                    f"({batch.digest})"
                )
            parent = _string(item["parent"], f"{where}.parent")
            if parent and parent not in index:
                raise InvalidBatchError(f"{where}.parent: {parent!r} is no earlier batch")
            if aid in index:
                raise InvalidBatchError(f"{where}.id: {aid!r} is given to an earlier batch")
            index[aid] = at
            batches.append(batch)
            parents.append(index[parent] if parent else -1)
            created.append(_seconds(item["created"], f"{where}.created"))
        head = _string(tree["head"], "head")
        if head and head not in index:
            raise InvalidBatchError(f"head: {head!r} is no batch of this conversation")
        if type(tree["moves"]) is not list or not all(
            type(pair) is list and len(pair) == 2 for pair in tree["moves"]
        ):
            raise InvalidBatchError("moves: expected an array of [move id, head] pairs")
        owner = tree["owner"]
        if owner is not None:
            _string(owner, "owner")
        try:
            meta = ConversationMeta(
                owner,
                _seconds(tree["expires_at"], "expires_at"),
                tree["retained"],
                [tuple(pair) for pair in tree["moves"]],
            )
            history = HistoryTree(batches, parents, created, index[head] if head else -1)
        except InvalidViewError as exc:
            raise InvalidBatchError(str(exc)) from None
        return cls(cid, history, meta)


def export_version(line: bytes) -> int | None:
    """The version of an export header line (None: ``line`` is no header, so the file
    is of the old headerless format); ``CLIError`` for a header of a version this scope
    does not read."""
    try:
        tree = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(tree) is not dict or "format" not in tree:
        return None
    version = tree.get("version")
    if tree != {"format": EXPORT_FORMAT, "version": version} or version not in READ_VERSIONS:
        raise CLIError(
            f"not an export file this scope reads: its header is {line.decode(errors='replace')}"
            f" (this scope reads versions 2 and {EXPORT_VERSION} and headerless version 1 "
            "files)"
        )
    return int(version)


def closed_line(closed: ClosedConversation) -> bytes:
    """The export line of a closed conversation, without the newline."""
    return orjson.dumps(
        {
            "closure": closed.closure,
            "conversation_id": str(closed.conversation_id),
            "length": closed.length,
            "owner": closed.owner,
        },
        option=orjson.OPT_SORT_KEYS,
    )


def parse_export_line(line: bytes) -> ConversationRecord | ClosedConversation | str | bytes:
    """One line after the header, by its keys: a ``ConversationRecord``, a
    ``ClosedConversation``, a tombstone (``str``) or the store secret (``bytes``);
    ``InvalidBatchError`` naming the place for anything else."""
    try:
        tree = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InvalidBatchError(f"invalid JSON: {exc}") from None
    keys = set(tree) if type(tree) is dict else set()
    try:
        if keys == {"secret"}:
            secret = _string(tree["secret"], "secret")
            try:
                return check_secret(binascii.unhexlify(secret))
            except (binascii.Error, ValueError) as exc:
                raise InvalidBatchError(f"secret: expected 64 hex digits ({exc})") from None
        if keys == {"tombstone"}:
            return check_tombstone(tree["tombstone"])
        if keys == _CLOSED_KEYS:
            return ClosedConversation(
                _string(tree["conversation_id"], "conversation_id"),
                tree["closure"],
                tree["owner"],
                tree["length"],
            )
    except (InvalidReceiptError, InvalidViewError, InvalidConversationIDError) as exc:
        raise InvalidBatchError(str(exc)) from None
    return ConversationRecord.from_json(line)


@final
@attrs.frozen
class ExportContents:
    """A validated export file: the secret and tombstones (if the store held any), the
    closed conversations and the conversation records, each with its line number."""

    secret: bytes | None
    tombstones: tuple[str, ...]
    closed: tuple[tuple[int, ClosedConversation], ...]
    records: tuple[tuple[int, ConversationRecord], ...]


def parse_export(lines: Iterable[tuple[int, bytes]], source: str, version: int) -> ExportContents:
    """Validate every line (numbered) after the header of a version 2 or 3 file;
    ``CLIError`` naming ``source:line`` for the first bad one, a conversation given
    twice, a tombstone before the secret or a secret given twice, or a line of version
    3 in a version 2 file (nothing imported by anyone before this returns)."""
    secret: bytes | None = None
    tombstones: list[str] = []
    closed: list[tuple[int, ClosedConversation]] = []
    records: list[tuple[int, ConversationRecord]] = []
    seen: dict[str, int] = {}
    for number, line in lines:
        try:
            item = parse_export_line(line)
            if version < 3 and not isinstance(item, ConversationRecord):
                raise InvalidBatchError(f"a version 3 line in a version {version} file")
            if isinstance(item, bytes):
                if secret is not None:
                    raise InvalidBatchError("a second store secret")
                secret = item
                continue
            if isinstance(item, str):
                if secret is None:
                    raise InvalidBatchError("a tombstone before the store secret")
                tombstones.append(item)
                continue
        except InvalidBatchError as exc:
            raise CLIError(f"{source}:{number}: {exc}; nothing was imported") from None
        first = seen.setdefault(item.conversation_id, number)
        if first != number:
            raise CLIError(
                f"{source}:{number}: conversation {str(item.conversation_id)!r} already "
                f"appears on line {first}; nothing was imported"
            )
        if isinstance(item, ClosedConversation):
            closed.append((number, item))
        else:
            records.append((number, item))
    return ExportContents(secret, tuple(tombstones), tuple(closed), tuple(records))


# -- export --------------------------------------------------------------------------

#: How many ids one listing round trip of the export asks for.
EXPORT_PAGE: Final = 1000


async def paged(
    fetch: Callable[[Any], Awaitable[list[_T]]], key: Callable[[_T], Any]
) -> AsyncIterator[_T]:
    """Every item of a keyset-paged listing (``fetch(after)``), a page at a time."""
    after = None
    while page := await fetch(after):
        for item in page:
            yield item
        after = key(page[-1])


async def export_store(
    store: CLIStore, sink: IO[bytes], stderr: TextIO
) -> tuple[int, int, list[str]]:
    """Write the header, the store secret and tombstones (when it holds any), every
    closed conversation and every conversation the store lists (one rewound to its start
    included), paging through each listing; the number of conversations written, the
    number of tombstones, and one error line for each conversation not written (a
    corrupt record, or closed since it was listed)."""
    sink.write(HEADER + b"\n")
    failed: list[str] = []
    count = marks = 0
    progress = Progress(stderr, "exported")
    tombstones = paged(lambda after: store.tombstones(after=after, limit=EXPORT_PAGE), str)
    async for mark in tombstones:
        if not marks:
            secret = binascii.hexlify(await store.store_secret())
            sink.write(orjson.dumps({"secret": secret.decode()}) + b"\n")
        sink.write(orjson.dumps({"tombstone": mark}) + b"\n")
        marks += 1
    closed = paged(
        lambda after: store.closed_conversations(after=after, limit=EXPORT_PAGE),
        lambda entry: entry.conversation_id,
    )
    async for entry in closed:
        progress.step()
        sink.write(closed_line(entry) + b"\n")
        count += 1
    async for cid in paged(lambda after: store.conversations(after=after, limit=EXPORT_PAGE), str):
        progress.step()
        try:
            # The meta first: batches are never deleted but by a closure, so every
            # move it records names a batch of the tree read after it.
            meta = await store.read_meta(cid)
            tree = await store.read_tree(cid)
        except StoreError as exc:  # a corrupt record: export the others
            failed.append(f"scope: error: conversation {str(cid)!r} not exported: {exc}\n")
            continue
        if tree.closed or not tree.batches:
            failed.append(
                f"scope: error: conversation {str(cid)!r} not exported: it was closed "
                "(cleared, expired or erased) after it was listed\n"
            )
            continue
        try:
            line = ConversationRecord(cid, tree, meta).to_json()
        except InvalidBatchError as exc:  # a store that broke its own rules
            failed.append(f"scope: error: conversation {str(cid)!r} not exported: {exc}\n")
            continue
        sink.write(line + b"\n")
        count += 1
    progress.done()
    return count, marks, failed


# -- import --------------------------------------------------------------------------


@final
class RestoreConflict(Exception):
    """The target store holds something of the conversation the record contradicts."""


async def restore_conversation(store: CLIStore, record: ConversationRecord) -> bool:
    """Make the store's copy of the conversation what ``record`` says, through the
    ``Store`` protocol, and return whether anything was written.

    Each batch missing from the store is appended after its parent (the head moved there
    first, fenced by ``expected_head``) under its own append id, so its digest and its
    receipt are the original's; the first carries the owner. Then the recorded moves
    are replayed under their move ids, the head is moved to the record's, and the
    expiry is set with ``retain`` when the record has one (or was retained to never).
    Every step is idempotent (append ids, move ids), so a run cut short (a crash, a
    SIGKILL) and run again finishes the job. Each batch keeps its stored time
    (``created``, restored through ``Store.append(..., created=...)``); one the export
    has none for (``null``: stored before branches) gets the time of this import.

    A conversation that holds every batch and move of the record and more (batches or
    moves made here since it was imported) went on since: nothing is written (its head
    stays where it is). Raises ``RestoreConflict`` (nothing written) when the store
    holds a batch of the record with other messages or another parent, another owner, a
    move id recorded for another head, or batches or moves of its own while some of the
    record's are missing; ``ConversationClosedError`` when it is closed there."""
    cid = record.conversation_id
    have = await store.read_tree(cid)
    if have.closed:
        raise ConversationClosedError(f"conversation {str(cid)!r} is closed in this store")
    wanted = {str(batch.id): index for index, batch in enumerate(record.tree.batches)}
    held: set[str] = set()
    for index, batch in enumerate(have.batches):
        aid = str(batch.id)
        at = wanted.get(aid)
        if at is None:
            continue  # appended here after the export's batches, or a conflict (below)
        have_parent = "" if have.parents[index] == -1 else str(have.batches[have.parents[index]].id)
        if record.tree.batches[at].digest != batch.digest:
            raise RestoreConflict(f"batch {aid!r} has other messages here")
        if record.parent_id(at) != have_parent:
            raise RestoreConflict(f"batch {aid!r} follows another batch here")
        held.add(aid)
    meta = await store.read_meta(cid)
    if have.batches and meta.owner != record.meta.owner:
        raise RestoreConflict(
            f"its owner here is {meta.owner!r}, the export's {record.meta.owner!r}"
        )
    recorded = dict(meta.moves)
    exported = dict(record.meta.moves)
    for move, head in record.meta.moves:
        if move in recorded and recorded[move] != head:
            raise RestoreConflict(f"move id {move!r} moved the head here to {recorded[move]!r}")
    went_on = len(held) < len(have.batches) or any(m not in exported for m in recorded)
    if went_on:
        missing = len(held) < len(record.tree.batches) or any(m not in recorded for m in exported)
        if missing:
            raise RestoreConflict("this store holds batches or moves the export does not")
        return False  # imported before, and the conversation went on here since
    wrote = False
    head = "" if have.head == -1 else str(have.batches[have.head].id)
    owner = record.meta.owner
    for index, batch in enumerate(record.tree.batches):
        if str(batch.id) in held:
            continue
        parent = record.parent_id(index)
        if head != parent:
            await store.move_head(cid, parent, expected_head=head)
        created = record.tree.created[index]  # None: unknown, the store's clock stamps it
        await store.append(Batch(cid, batch.id, batch.messages), owner=owner, created=created)
        head, wrote = str(batch.id), True
    for move, target in record.meta.moves:
        if move not in recorded:
            await store.move_head(cid, target, expected_head=head, move_id=move)
            head, wrote = target, True
    if head != record.head_id():
        await store.move_head(cid, record.head_id(), expected_head=head)
        wrote = True
    want = record.meta
    if want.expires_at is not None:  # within a millisecond (Redis keeps milliseconds)
        due = meta.expires_at is None or abs(meta.expires_at - want.expires_at) >= 0.001
    else:  # kept for ever by its own setting, or left to this store's retention
        due = want.retained and not (meta.retained and meta.expires_at is None)
    if due:
        until = (
            None
            if want.expires_at is None
            else _dt.datetime.fromtimestamp(want.expires_at, _dt.UTC)
        )
        await store.retain(cid, until)
        wrote = True
    return wrote


#: How many tombstones one ``restore_erasures`` round trip carries.
IMPORT_TOMBSTONES: Final = 1000


async def _restore_erasures(store: CLIStore, contents: ExportContents) -> int:
    """Adopt the export's store secret and add its tombstones, a page per round trip
    (the first adopts the secret); the number added. ``CLIError`` (nothing written)
    when the store holds conversations or tombstones under another secret."""
    marks, added = contents.tombstones, 0
    if contents.secret is None or not marks:
        return 0
    for start in range(0, len(marks), IMPORT_TOMBSTONES):
        try:
            chunk = marks[start : start + IMPORT_TOMBSTONES]
            added += await store.restore_erasures(contents.secret, chunk)
        except RestoreConflictError as exc:
            raise CLIError(
                f"cannot import the export's tombstones ({exc}): import a file holding "
                "erased conversations into an empty store; nothing was imported"
            ) from None
    return added


async def import_records(
    url: str,
    contents: ExportContents,
    source: str,
    *,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Restore the tombstones (with the store secret), then each closed conversation
    (``Restorer.restore_closed``), then each conversation record
    (``restore_conversation``); a conflict or a closed conversation is one error line
    and the import goes on (exit status 1). Tombstones under another secret than the
    store's refuse the whole import (``CLIError``)."""
    imported = unchanged = failed = 0
    total = len(contents.closed) + len(contents.records)
    async with opened_store(url) as store:
        added = await _restore_erasures(store, contents)
        progress = Progress(stderr, "imported", total)

        def report(number: int, cid: str, problem: str) -> None:
            nonlocal failed
            failed += 1
            progress.done()
            stderr.write(f"scope: error: {source}:{number}: conversation {cid!r} {problem}\n")

        for number, closed in contents.closed:
            try:
                wrote = await store.restore_closed(closed)
            except RestoreConflictError as exc:
                report(number, closed.conversation_id, f"conflicts with this store ({exc})")
            else:
                imported, unchanged = imported + wrote, unchanged + (not wrote)
            progress.step()
        for number, record in contents.records:
            cid = str(record.conversation_id)
            try:
                wrote = await restore_conversation(store, record)
            except (RestoreConflict, AppendConflictError) as exc:
                report(
                    number, cid, f"conflicts with this store ({exc}); nothing more imported for it"
                )
            except ConversationClosedError:
                state = await closed_as(store, cid)
                report(number, cid, f"is {state} in this store; nothing imported")
            else:
                imported, unchanged = imported + wrote, unchanged + (not wrote)
            progress.step()
        progress.done()
    marks = len(contents.tombstones)
    stdout.write(
        f"imported {imported}, already present {unchanged}, failed {failed} "
        f"(of {total} conversation{'s' if total != 1 else ''})"
        + (f"; tombstones added {added} (of {marks})" if marks else "")
        + "\n"
    )
    stdout.flush()
    return 1 if failed else 0
