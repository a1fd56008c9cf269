"""The restore steps (``scope.history.Restorer``, DESIGN §6n) of SQLiteStore and
PostgresStore, checked on what each store then answers: the listing of closed
conversations and tombstones, ``restore_closed`` (written, held, each refusal with nothing
written), ``restore_erasures`` (validation before any I/O, adoption of a secret into an
empty store, its refusals) and the store secret a handle opened later reads.

PostgreSQL needs ``SCOPE_TEST_POSTGRES_DSN`` (see tests/servers.py) and is skipped
without it unless ``SCOPE_REQUIRE_SERVERS=1``; each store works under its own table
prefix, dropped afterwards.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from scope.chat import assistant_message, user_message
from scope.errors import (
    ConversationClosedError,
    InvalidConversationIDError,
    InvalidReceiptError,
    RestoreConflictError,
    StoreError,
)
from scope.history import Batch, ClosedConversation, ConversationMeta, Restorer
from scope.history.storekit import tombstone
from scope.historystores.sqlite import SQLiteStore
from tests.servers import drop_tables, import_driver, postgres_dsn_or_skip, unique_table_prefix

pytestmark = pytest.mark.anyio

#: Opens a handle on the store named by the argument (a fresh one the first time).
Opener = Callable[[str], Awaitable[Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # asyncpg is asyncio-only; SQLite under trio: tests/historystores


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    handles: list[Any] = []
    prefixes: dict[str, str] = {}
    if request.param == "sqlite":

        async def open_sqlite(name: str) -> Any:
            handle = await SQLiteStore.open(tmp_path / f"{name}.db")
            handles.append(handle)
            return handle

        yield open_sqlite
    else:
        dsn = postgres_dsn_or_skip()
        import_driver("asyncpg")
        from scope.historystores.postgres import PostgresStore

        async def open_postgres(name: str) -> Any:
            prefix = prefixes.setdefault(name, unique_table_prefix())
            handle = await PostgresStore.open(dsn, table_prefix=prefix)
            handles.append(handle)
            return handle

        yield open_postgres
    for handle in handles:
        await handle.aclose()
    for prefix in prefixes.values():
        await drop_tables(dsn, prefix)


def turn(cid: str, aid: str, text: str = "hello") -> Batch:
    return Batch(cid, aid, [user_message(text), assistant_message(f"{text} (answer)")])


def past(hours: int = 1) -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=hours)


async def state(store: Any, cid: str) -> tuple[Any, ...]:
    """Everything the store answers about ``cid`` (for "nothing written")."""
    view = await store.read_view(cid)
    return (
        await store.read_meta(cid),
        (view.closed, view.length, view.head, len(view.messages)),
        await store.closed_conversations(),
        await store.conversations(),
        await store.tombstones(),
    )


async def closed_source(store: Any) -> None:
    """One conversation of each closure (and open and erased ones, never listed)."""
    await store.append(turn("b-cleared", "a1"), owner="alice")
    await store.append(turn("b-cleared", "a2"))
    await store.clear("b-cleared")
    await store.clear("a-never")  # cleared without a batch: owner None, length 0
    await store.append(turn("d-expired", "a1"), owner="bob")
    await store.retain("d-expired", past())
    assert await store.expire() == 1
    await store.append(turn("c-due", "a1"), owner="carol")
    await store.retain("c-due", past())  # due by the clock, not removed
    await store.append(turn("e-open", "a1"), owner="alice")
    await store.append(turn("f-erased", "a1"), owner="alice")
    await store.clear("f-erased")
    await store.erase("f-erased")


# ---------------------------------------------------------------- closed_conversations


async def test_closed_conversations_list_every_closure_in_order(opener: Opener) -> None:
    store = await opener("source")
    assert isinstance(store, Restorer)
    assert await store.closed_conversations() == []
    await closed_source(store)
    listed = await store.closed_conversations()
    assert listed == [
        ClosedConversation("a-never", "cleared", None, 0),
        ClosedConversation("b-cleared", "cleared", "alice", 4),
        ClosedConversation("c-due", "expired", "carol", 2),
        ClosedConversation("d-expired", "expired", "bob", 2),
    ]
    for closed in listed:  # each as read_view and read_meta say it today
        view = await store.read_view(closed.conversation_id)
        meta = await store.read_meta(closed.conversation_id)
        assert view.closed and view.length == closed.length
        assert (meta.closure, meta.owner) == (closed.closure, closed.owner)
    assert await store.closed_conversations(limit=2) == listed[:2]
    assert await store.closed_conversations(after="b-cleared", limit=1) == listed[2:3]
    assert await store.closed_conversations(after="b") == listed[1:]
    assert await store.closed_conversations(after="d-expired") == []


@pytest.mark.parametrize("limit", [0, -1, True, 1.0, "10", None])
async def test_closed_conversations_bad_limit_is_a_value_error(opener: Opener, limit: Any) -> None:
    store = await opener("source")
    with pytest.raises(ValueError, match="limit"):
        await store.closed_conversations(limit=limit)
    with pytest.raises(ValueError, match="limit"):
        await store.tombstones(limit=limit)


async def test_closed_conversations_bad_after_is_invalid_id(opener: Opener) -> None:
    store = await opener("source")
    with pytest.raises(InvalidConversationIDError):
        await store.closed_conversations(after="")
    with pytest.raises(TypeError):
        await store.tombstones(after=b"x")


# ---------------------------------------------------------------- restore_closed


async def test_restore_closed_round_trip_and_the_rules_after(opener: Opener) -> None:
    source, target = await opener("source"), await opener("target")
    await closed_source(source)
    listed = await source.closed_conversations()
    for closed in listed:
        assert await target.restore_closed(closed) is True
    assert await target.closed_conversations() == listed
    for closed in listed:  # an import run again writes nothing
        assert await target.restore_closed(closed) is False
    assert await target.closed_conversations() == listed
    assert await target.conversations() == []
    for closed in listed:
        cid = closed.conversation_id
        assert await target.read_meta(cid) == ConversationMeta(
            closed.owner, None, False, (), closed.closure
        )
        view = await target.read_view(cid)
        assert (view.closed, view.length, view.messages) == (True, closed.length, ())
        tree = await target.read_tree(cid)
        assert tree.closed and tree.batches == ()
        with pytest.raises(ConversationClosedError):
            await target.append(turn(cid, "late"))
        with pytest.raises(ConversationClosedError):
            await target.move_head(cid, "", expected_head="")
        with pytest.raises(ConversationClosedError):
            await target.retain(cid, None)
    # erase_owned finds a restored conversation by its owner and erases it.
    receipts = await target.erase_owned("alice")
    assert [r.conversation_id for r in receipts] == ["b-cleared"]
    assert await target.check_erased(receipts[0]) == []
    assert await target.read_meta("b-cleared") == ConversationMeta(closure="erased")
    assert [c.conversation_id for c in await target.closed_conversations()] == [
        "a-never",
        "c-due",
        "d-expired",
    ]
    assert await target.erase_owned("alice") == []
    with pytest.raises(RestoreConflictError, match="erased"):
        await target.restore_closed(listed[1])


async def test_restore_closed_refusals_write_nothing(opener: Opener) -> None:
    store = await opener("target")
    await store.append(turn("open", "a1"), owner="alice")
    await store.append(turn("due", "a1"), owner="alice")
    await store.retain("due", past())
    await store.append(turn("cleared", "a1"), owner="alice")
    await store.clear("cleared")
    await store.append(turn("expired", "a1"), owner="alice")
    await store.retain("expired", past(2))
    assert await store.expire(limit=1) == 1  # the soonest expiry: "expired", not "due"
    await store.append(turn("erased", "a1"), owner="alice")
    await store.erase("erased")
    refusals = [
        (ClosedConversation("open", "cleared", "alice", 2), "holds batches"),
        (ClosedConversation("due", "expired", "alice", 2), "holds batches"),
        (ClosedConversation("cleared", "expired", "alice", 2), "cleared here"),
        (ClosedConversation("cleared", "cleared", "bob", 2), "owner here is 'alice'"),
        (ClosedConversation("cleared", "cleared", None, 2), "owner here is 'alice'"),
        (ClosedConversation("cleared", "cleared", "alice", 3), "length here is 2"),
        (ClosedConversation("expired", "cleared", "alice", 2), "expired here"),
        (ClosedConversation("expired", "expired", "alice", 0), "length here is 2"),
        (ClosedConversation("erased", "cleared", "alice", 2), "erased"),
        (ClosedConversation("erased", "cleared", None, 0), "erased"),
    ]
    for closed, why in refusals:
        cid = closed.conversation_id
        before = await state(store, cid)
        with pytest.raises(RestoreConflictError, match=why) as caught:
            await store.restore_closed(closed)
        assert repr(str(cid)) in str(caught.value)
        assert "nothing was written" in str(caught.value)
        assert await state(store, cid) == before, closed
    assert await store.conversations() == ["open"]
    assert len(await store.read("open")) == 2
    # The closed ones exactly as stored are held already.
    assert await store.restore_closed(ClosedConversation("cleared", "cleared", "alice", 2)) is False
    assert await store.restore_closed(ClosedConversation("expired", "expired", "alice", 2)) is False


async def test_restore_closed_over_a_row_without_a_batch(opener: Opener) -> None:
    """An id that holds only a retention setting (``retain`` before its first append) is
    not a conversation yet: restoring writes it closed, as expire leaves it."""
    store = await opener("target")
    await store.retain("waiting", _dt.datetime.now(_dt.UTC) + _dt.timedelta(days=1))
    assert (await store.read_meta("waiting")).retained
    closed = ClosedConversation("waiting", "cleared", "dora", 5)
    assert await store.restore_closed(closed) is True
    assert await store.read_meta("waiting") == ConversationMeta("dora", None, False, (), "cleared")
    assert await store.closed_conversations() == [closed]
    # One due without a batch is listed expired; the same record is written over it.
    await store.retain("lapsed", past())
    lapsed = ClosedConversation("lapsed", "expired", None, 0)
    assert await store.closed_conversations() == [lapsed, closed]
    with pytest.raises(RestoreConflictError, match="owner here is None"):
        await store.restore_closed(ClosedConversation("lapsed", "expired", "dora", 0))
    assert await store.restore_closed(lapsed) is True
    assert await store.read_meta("lapsed") == ConversationMeta(None, None, False, (), "expired")
    assert await store.restore_closed(lapsed) is False


async def test_restore_closed_needs_a_closed_conversation(opener: Opener) -> None:
    store = await opener("target")
    with pytest.raises(TypeError, match="ClosedConversation"):
        await store.restore_closed(("x", "cleared", None, 0))


# ---------------------------------------------------------------- tombstones and secret


async def test_tombstones_sorted_and_paged(opener: Opener) -> None:
    store = await opener("source")
    marks = sorted([(await store.erase(f"c{i}")).tombstone for i in range(5)])
    assert await store.tombstones() == marks
    assert await store.tombstones(limit=2) == marks[:2]
    assert await store.tombstones(after=marks[1], limit=2) == marks[2:4]
    assert await store.tombstones(after=marks[-1]) == []
    secret = await store.store_secret()
    assert type(secret) is bytes and len(secret) == 32
    assert marks == sorted(tombstone(secret, f"c{i}") for i in range(5))
    again = await opener("source")
    assert await again.store_secret() == secret
    await again.aclose()
    with pytest.raises(StoreError, match="closed"):
        await again.store_secret()


# ---------------------------------------------------------------- restore_erasures

GOOD = "hmac-sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("secret", "error"),
    [
        (b"x" * 31, ValueError),
        (b"x" * 33, ValueError),
        (b"", ValueError),
        (bytearray(32), TypeError),
        (memoryview(b"x" * 32), TypeError),
        ("x" * 32, TypeError),
        (None, TypeError),
    ],
)
async def test_restore_erasures_bad_secret_is_refused_before_io(
    opener: Opener, secret: Any, error: type[Exception]
) -> None:
    store = await opener("target")
    before = await store.store_secret()
    with pytest.raises(error, match="secret must be") as caught:
        await store.restore_erasures(secret, [GOOD])
    assert type(caught.value) is error
    assert await store.store_secret() == before
    assert await store.tombstones() == []


@pytest.mark.parametrize(
    "bad",
    [
        "hmac-sha256:" + "AB" * 32,
        "hmac-sha256:" + "ab" * 31,
        "hmac-sha256:" + "ab" * 32 + "0",
        "sha256:" + "ab" * 32,
        "hmac-sha256:" + "ab" * 31 + "zz",
        b"hmac-sha256:" + b"ab" * 32,
        None,
    ],
)
async def test_restore_erasures_bad_tombstone_is_invalid_receipt(opener: Opener, bad: Any) -> None:
    store = await opener("target")
    before = await store.store_secret()
    with pytest.raises(InvalidReceiptError, match="tombstone"):
        await store.restore_erasures(b"s" * 32, [GOOD, bad])
    assert await store.store_secret() == before
    assert await store.tombstones() == []


async def test_restore_erasures_adopts_the_secret_and_proves_receipts(opener: Opener) -> None:
    source, target = await opener("source"), await opener("target")
    await source.append(turn("gone", "a1", "secret text"), owner="alice")
    await source.append(turn("kept", "a1"), owner="alice")
    receipts = [await source.erase("gone"), await source.erase("never-written")]
    secret, marks = await source.store_secret(), await source.tombstones()
    assert await target.store_secret() != secret
    assert await target.restore_erasures(secret, marks + marks[:1]) == 2
    assert await target.store_secret() == secret
    assert await target.tombstones() == marks
    for receipt in receipts:
        assert await target.check_erased(receipt) == []
    assert await target.read_meta("gone") == ConversationMeta(closure="erased")
    assert (await target.read_view("gone")).closed
    with pytest.raises(ConversationClosedError):
        await target.append(turn("gone", "a1", "secret text"))
    with pytest.raises(ConversationClosedError):
        await target.retain("never-written", None)
    with pytest.raises(RestoreConflictError, match="erased"):
        await target.restore_closed(ClosedConversation("gone", "cleared", None, 0))
    assert await target.restore_erasures(secret, marks) == 0  # run again: nothing added
    later = await opener("target")  # a handle opened after the adoption reads it
    assert await later.store_secret() == secret
    assert await later.check_erased(receipts[0]) == []
    with pytest.raises(ConversationClosedError):
        await later.append(turn("gone", "a1"))
    # Other ids are untouched: appends land, under the adopted secret's tombstones.
    await target.append(turn("kept", "a1"), owner="alice")
    receipt = await target.erase("kept")
    assert receipt.tombstone == tombstone(secret, "kept")
    assert await target.restore_erasures(secret, []) == 0


async def test_restore_erasures_adds_under_the_same_secret(opener: Opener) -> None:
    store = await opener("target")
    secret = await store.store_secret()
    await store.append(turn("open", "a1"))
    await store.erase("mine")
    mine = tombstone(secret, "mine")
    assert await store.restore_erasures(secret, [GOOD, mine]) == 1
    assert await store.tombstones() == sorted([GOOD, mine])
    assert await store.conversations() == ["open"]


async def test_restore_erasures_refusals_write_nothing(opener: Opener) -> None:
    other = b"o" * 32
    for setup in ("open", "cleared", "tombstone"):
        store = await opener(f"target-{setup}")
        secret = await store.store_secret()
        if setup == "open":
            await store.append(turn("c", "a1"))
        elif setup == "cleared":
            await store.clear("c")
        else:
            await store.erase("c")
        before = await state(store, "c")
        with pytest.raises(RestoreConflictError, match="another secret") as caught:
            await store.restore_erasures(other, [GOOD])
        assert "nothing was written" in str(caught.value)
        assert await store.store_secret() == secret
        assert await state(store, "c") == before
        again = await opener(f"target-{setup}")
        assert await again.store_secret() == secret
    # Under the same secret: a stored conversation whose id hashes to a new tombstone.
    store = await opener("target-open")
    secret = await store.store_secret()
    for cid in ("c", "cleared"):
        if cid == "cleared":
            await store.clear(cid)
        before = await state(store, cid)
        with pytest.raises(RestoreConflictError, match="erase it first"):
            await store.restore_erasures(secret, [GOOD, tombstone(secret, cid)])
        assert await state(store, cid) == before
        assert GOOD not in await store.tombstones()
