"""``scope history verify --against URL``: prove two stores hold the same conversations
(an export and its import, DESIGN §6n), read-only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Final, TextIO

from scope.cli._export import paged
from scope.cli._render import Progress, safe
from scope.cli._stores import CLIStore, opened_store, redact_url
from scope.errors import StoreError
from scope.history import ClosedConversation, ConversationID, ConversationMeta, HistoryTree

__all__ = ["compare_stores", "differences"]

#: How many ids one listing round trip asks for.
_PAGE: Final = 1000
#: Two stored times closer than this are the same time (PostgreSQL and Redis keep
#: microseconds; a float of today's Unix seconds is finer than a quarter of one).
_MICROSECOND: Final = 1e-6


def _listed(store: CLIStore) -> AsyncIterator[ConversationID]:
    """Every conversation the store lists, in lexical order, a page at a time."""
    return paged(lambda after: store.conversations(after=after, limit=_PAGE), str)


async def _union(a: CLIStore, b: CLIStore) -> AsyncIterator[ConversationID]:
    """The ids either store lists, each once, in lexical order (a merge of two pagings:
    bounded memory on any store size)."""
    left, right = _listed(a), _listed(b)
    x = await anext(left, None)
    y = await anext(right, None)
    while x is not None or y is not None:
        if x is not None and (y is None or x <= y):
            if x == y:
                y = await anext(right, None)
            yield x
            x = await anext(left, None)
        elif y is not None:
            yield y
            y = await anext(right, None)


def _shape(tree: HistoryTree) -> list[tuple[str, str, str, str]]:
    """Each batch as (append id, digest, parent's append id, chain digest of its path)."""
    ids = [str(batch.id) for batch in tree.batches]
    return [
        (ids[i], batch.digest, "" if parent == -1 else ids[parent], tree.chain(i))
        for i, (batch, parent) in enumerate(zip(tree.batches, tree.parents, strict=True))
    ]


def _head(tree: HistoryTree) -> str:
    return "" if tree.head == -1 else str(tree.batches[tree.head].id)


def differences(
    mine: tuple[HistoryTree, ConversationMeta], theirs: tuple[HistoryTree, ConversationMeta]
) -> list[str]:
    """What differs between one conversation's tree and meta in two stores (``[]``:
    equal). Stored times are compared to the microsecond (what PostgreSQL and Redis
    keep) where both stores hold one (a batch stored before branches has none, and
    its import the time of the import); expiry times to the millisecond (what Redis
    keeps); the closure as ``read_meta`` reads it (``"cleared here, open there"``)."""
    (tree, meta), (other, other_meta) = mine, theirs
    found: list[str] = []
    if meta.closure != other_meta.closure:  # None: open
        found.append(f"{meta.closure or 'open'} here, {other_meta.closure or 'open'} there")
    elif tree.closed != other.closed:
        found.append(f"closed here {tree.closed}, there {other.closed}")
    a, b = _shape(tree), _shape(other)
    if a != b:
        only_here = sorted({row[0] for row in a} - {row[0] for row in b})
        only_there = sorted({row[0] for row in b} - {row[0] for row in a})
        if only_here:
            found.append(f"batches only here: {', '.join(map(repr, only_here))}")
        if only_there:
            found.append(f"batches only there: {', '.join(map(repr, only_there))}")
        if not only_here and not only_there:
            found.append("the same batches with other digests, parents or order")
    if a == b:
        moved = [
            str(batch.id)
            for batch, here, there in zip(tree.batches, tree.created, other.created, strict=True)
            if here is not None and there is not None and abs(here - there) >= _MICROSECOND
        ]
        if moved:
            found.append(f"other stored times: {', '.join(map(repr, moved))}")
    if _head(tree) != _head(other):
        found.append(f"head here {_head(tree)!r}, there {_head(other)!r}")
    if meta.owner != other_meta.owner:
        found.append(f"owner here {meta.owner!r}, there {other_meta.owner!r}")
    if meta.moves != other_meta.moves:
        found.append("other recorded moves")
    here, there = meta.expires_at, other_meta.expires_at
    if (here is None) != (there is None) or (
        here is not None and there is not None and abs(here - there) >= 0.001
    ):
        found.append(f"expires here at {here!r}, there at {there!r}")
    return found


async def _read(store: CLIStore, cid: ConversationID) -> tuple[HistoryTree, ConversationMeta]:
    return await store.read_tree(cid), await store.read_meta(cid)


async def compare_stores(
    url: str,
    other: str,
    conversation_ids: Sequence[str],
    *,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """Compare every conversation either store lists (or those named): the same batches
    (append id, digest, parent, so the same chain digest on every path), the same head,
    owner, recorded moves and expiry (``differences``); without named ones also the closed
    conversations (closure, owner, length), the tombstones and, where either store holds
    a tombstone, the store secret (``_closed_differences``). One ``scope: error:`` line
    per conversation that differs or cannot be read, a summary on stdout; exit status 1
    when anything differs. Both stores are opened without creating anything and only
    read."""
    compared = 0
    differ: list[str] = []
    async with opened_store(url, create=False) as mine, opened_store(other, create=False) as theirs:
        progress = Progress(stderr, "compared conversations")
        ids = _union(mine, theirs) if not conversation_ids else _named(conversation_ids)
        async for cid in ids:
            compared += 1
            progress.step()
            try:
                found = differences(await _read(mine, cid), await _read(theirs, cid))
            except StoreError as exc:
                found = [f"cannot be read: {exc}"]
            if found:
                progress.done()
                differ.append(cid)
                stderr.write(
                    safe(f"scope: error: conversation {str(cid)!r}: {'; '.join(found)}") + "\n"
                )
        if not conversation_ids:
            for problem in await _closed_differences(mine, theirs):
                differ.append(problem)
                stderr.write(safe(f"scope: error: {problem}") + "\n")
        progress.done()
    where = redact_url(other)
    plural = "conversation" if compared == 1 else "conversations"
    if differ:
        stdout.write(f"compared {compared} {plural} with {where}: {len(differ)} differ\n")
    else:
        stdout.write(f"compared {compared} {plural} with {where}: all equal\n")
    stdout.flush()
    return 1 if differ else 0


def _closed(store: CLIStore) -> AsyncIterator[ClosedConversation]:
    return paged(
        lambda after: store.closed_conversations(after=after, limit=_PAGE),
        lambda entry: entry.conversation_id,
    )


def _tombstones(store: CLIStore) -> AsyncIterator[str]:
    return paged(lambda after: store.tombstones(after=after, limit=_PAGE), str)


async def _closed_differences(mine: CLIStore, theirs: CLIStore) -> list[str]:
    """What the two stores' closed conversations and tombstones disagree on (one
    store's listings held in memory, the other's paged against them): one line per
    closed conversation that differs, a count of the tombstones held on one side only,
    and whether the store secrets differ while either holds a tombstone."""
    found: list[str] = []
    here = {e.conversation_id: e async for e in _closed(mine)}
    async for entry in _closed(theirs):
        held = here.pop(entry.conversation_id, None)
        if held != entry:
            what = "open or unknown" if held is None else f"{held.closure} ({held.owner!r})"
            found.append(
                f"closed conversation {str(entry.conversation_id)!r}: {what} here, "
                f"{entry.closure} ({entry.owner!r}) there"
            )
    for cid, held in here.items():
        found.append(
            f"closed conversation {str(cid)!r}: {held.closure} ({held.owner!r}) here, "
            "open or unknown there"
        )
    marks = {m async for m in _tombstones(mine)}
    theirs_only = 0
    async for mark in _tombstones(theirs):
        if mark in marks:
            marks.discard(mark)
        else:
            theirs_only += 1
    if marks or theirs_only:
        found.append(f"tombstones only here: {len(marks)}, only there: {theirs_only}")
    any_marks = await mine.tombstones(limit=1) or await theirs.tombstones(limit=1)
    if any_marks and await mine.store_secret() != await theirs.store_secret():
        found.append("other store secrets (a tombstone here closes no id there)")
    return found


async def _named(conversation_ids: Sequence[str]) -> AsyncIterator[ConversationID]:
    for cid in dict.fromkeys(conversation_ids):
        yield ConversationID(cid)
