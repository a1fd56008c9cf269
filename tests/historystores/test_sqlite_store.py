"""SQLiteStore: the conformance suite (asyncio and trio, with reopen) and its own rules.

The rules every persistent store keeps (shape, prefixes, closed stores, the error
mapping...) are checked on every backend in tests/historystores/test_backends.py.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.chat import assistant_message, tool_call_delta_part
from scope.codec import encode_messages
from scope.errors import HistoryChangedError, StoreError
from scope.history import Batch
from scope.history.storetest import StoreConformance
from scope.historystores import _records
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import batch, texts


class TestSQLiteConformance(StoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        async with await SQLiteStore.open(tmp_path / "history.db") as store:
            yield store

    async def reopen(self, store: Any) -> Any:
        return await SQLiteStore.open(store.path, table_prefix=store.table_prefix)

    @pytest.fixture(autouse=True)
    def _retention_path(self, tmp_path: Path) -> None:
        self._retention_db = tmp_path / "retention.db"

    async def open_store(self, *, retention: Any = None) -> Any:
        return await SQLiteStore.open(self._retention_db, retention=retention)


class TestSQLiteConformanceFullSync(StoreConformance):
    """The same rules with synchronous=FULL and a non-default table prefix."""

    concurrent_appends = 10
    concurrent_retries = 10
    cancellation_rounds = 4

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        path = tmp_path / "full.db"
        async with await SQLiteStore.open(path, table_prefix="other", synchronous="FULL") as s:
            yield s

    async def reopen(self, store: Any) -> Any:
        return await SQLiteStore.open(store.path, table_prefix="other", synchronous="FULL")

    @pytest.fixture(autouse=True)
    def _retention_path(self, tmp_path: Path) -> None:
        self._retention_db = tmp_path / "retention-full.db"

    async def open_store(self, *, retention: Any = None) -> Any:
        return await SQLiteStore.open(
            self._retention_db, table_prefix="other", synchronous="FULL", retention=retention
        )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with await SQLiteStore.open(tmp_path / "h.db") as store:
        yield store


def raw(store: SQLiteStore) -> sqlite3.Connection:
    """A plain connection on the store's file, for tampering with it."""
    return sqlite3.connect(store.path, isolation_level=None)


# -- configuration -----------------------------------------------------------------


@pytest.mark.anyio
async def test_file_is_in_wal_mode(store: SQLiteStore) -> None:
    with raw(store) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.anyio
@pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("FULL", 2), ("EXTRA", 3)])
async def test_synchronous_setting_is_applied(tmp_path: Path, synchronous: Any, level: int) -> None:
    async with await SQLiteStore.open(tmp_path / "s.db", synchronous=synchronous) as store:
        assert store.synchronous == synchronous
        conn = store._pool.take()
        try:
            assert conn.execute("PRAGMA synchronous").fetchone() == (level,)
        finally:
            store._pool.give(conn)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"synchronous": "OFF"}, "synchronous"),
        ({"synchronous": "normal"}, "synchronous"),
        ({"busy_timeout": -1}, "busy_timeout"),
        ({"busy_timeout": float("nan")}, "busy_timeout"),
        ({"busy_timeout": 10**400}, "busy_timeout"),  # beyond a float: not OverflowError
        ({"max_idle_connections": 0}, "max_idle_connections"),
        ({"cache_bytes": -1}, "cache_bytes"),
    ],
)
async def test_invalid_options_are_value_errors(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await SQLiteStore.open(tmp_path / "o.db", **kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"busy_timeout": True}, "busy_timeout must be a number of seconds, got bool"),
        ({"cache_bytes": 1.5}, "cache_bytes must be an integer, got float"),
        ({"max_idle_connections": "4"}, "max_idle_connections must be an integer, got str"),
        ({"create": 1}, "create must be a bool, got int"),
    ],
)
async def test_options_of_the_wrong_type_are_type_errors(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        await SQLiteStore.open(tmp_path / "o.db", **kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["", ":memory:"])
async def test_path_must_name_a_file(path: str) -> None:
    with pytest.raises(ValueError, match="path"):
        await SQLiteStore.open(path)


# -- failures --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_file_that_is_not_a_database_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not an SQLite database" * 100)
    with pytest.raises(StoreError, match=r"junk\.db") as info:
        await SQLiteStore.open(path)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


@pytest.mark.anyio
async def test_locked_database_raises_store_error_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with await SQLiteStore.open(path, busy_timeout=0.05) as store:
        await store.append(batch("c", "a1"))
        blocker = raw(store)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="append to conversation 'c'") as info:
                await store.append(batch("c", "a2"))
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            with pytest.raises(StoreError, match="clear"):
                await store.clear("c")
            # Reads are not blocked by a writer in WAL mode.
            assert len(await store.read("c")) == 2
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert len(await store.read("c")) == 2
        await store.append(batch("c", "a2"))
        assert len(await store.read("c")) == 4


# -- corruption ------------------------------------------------------------------------


async def corrupt_and_read(
    store: SQLiteStore, sql: str, *args: Any, batches_only: bool = False
) -> StoreError:
    """Damage a record of the victim conversation and return the error reading it raises.

    ``read_batches`` reports every damage ``read`` does, with the same message; with
    ``batches_only`` the damage (an append id, a non-canonical encoding) is one only
    ``read_batches`` sees, and ``read`` still returns the messages."""
    await store.append(batch("victim 'x'", "a1"))
    await store.append(batch("victim 'x'", "a2"))
    await store.append(batch("bystander", "a1"))
    with raw(store) as conn:
        conn.execute(sql, args)
    with pytest.raises(StoreError) as batches_info:
        await store.read_batches("victim 'x'")
    if batches_only:
        assert len(await store.read("victim 'x'")) == 4
    else:
        with pytest.raises(StoreError) as info:
            await store.read("victim 'x'")
        assert str(info.value) == str(batches_info.value)
    # Other conversations are unaffected.
    assert len(await store.read("bystander")) == 2
    assert [b.id for b in await store.read_batches("bystander")] == ["a1"]
    return batches_info.value


VICTIM = "AND conversation_id <> 'bystander'"
SET_RECORD = (
    f"UPDATE scope_history_batches SET messages = ?, digest = ? WHERE append_id = 'a1' {VICTIM}"
)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.anyio
async def test_flipped_byte_is_reported_naming_the_conversation(store: SQLiteStore) -> None:
    error = await corrupt_and_read(
        store,
        "UPDATE scope_history_batches SET messages = CAST(replace(CAST(messages AS TEXT), "
        f"'hello', 'jello') AS BLOB) WHERE append_id = 'a2' {VICTIM}",
    )
    assert "conversation \"victim 'x'\"" in str(error)
    assert "'a2'" in str(error) and "corrupt" in str(error) and "digest" in str(error)


@pytest.mark.anyio
async def test_tampered_digest_is_reported(store: SQLiteStore) -> None:
    error = await corrupt_and_read(
        store,
        f"UPDATE scope_history_batches SET digest = 'md5:x' WHERE append_id = 'a1' {VICTIM}",
    )
    assert "victim" in str(error) and "invalid digest" in str(error)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"[not json", "invalid JSON"),
        (b'[{"parts":[],"role":"user"}]', "messages[0]"),
        (b"[]", "array"),
        (b"{}", "array"),
        (b'"x"', "array"),
        (
            encode_messages([assistant_message(tool_call_delta_part("c1", "f", "{"))]),
            "tool_call_delta",
        ),
    ],
    ids=["non-json", "invalid-message", "empty-array", "object", "string", "incomplete-message"],
)
async def test_bad_record_with_matching_digest_is_reported(
    store: SQLiteStore, data: bytes, problem: str
) -> None:
    error = await corrupt_and_read(store, SET_RECORD, data, _digest(data))
    assert "victim" in str(error) and problem in str(error)


@pytest.mark.anyio
async def test_non_canonical_record_with_matching_digest_is_reported(store: SQLiteStore) -> None:
    # The same messages, spelled with other whitespace and key order: valid, but not the
    # bytes scope writes, so a Batch of them would carry another digest.
    canonical = batch("victim 'x'", "a1").encoded_messages
    data = json.dumps(json.loads(canonical), indent=1, sort_keys=False).encode()
    assert data != canonical
    # read() refuses it like read_batches() (one shared check), with the same message.
    error = await corrupt_and_read(store, SET_RECORD, data, _digest(data))
    assert "victim" in str(error) and "'a1'" in str(error) and "canonical" in str(error)


@pytest.mark.anyio
async def test_invalid_stored_append_id_is_reported(store: SQLiteStore) -> None:
    error = await corrupt_and_read(
        store,
        f"UPDATE scope_history_batches SET append_id = ' padded' WHERE append_id = 'a1' {VICTIM}",
        batches_only=True,
    )
    assert "victim" in str(error) and "invalid append id" in str(error)


@pytest.mark.anyio
async def test_read_batches_serves_cached_decodes_as_equal_batches(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "c.db") as store:
        # Equal messages under two conversations and append ids: one cache entry.
        one, two = batch("one", "a1", "same"), batch("two", "b1", "same")
        await store.append(one)
        await store.append(two)
        for _ in range(2):
            assert await store.read_batches("one") == [one]
            assert await store.read_batches("two") == [two]
            assert (await store.read_batches("two"))[0].receipt() == two.receipt()
            assert await store.read("two") == list(two.messages)


@pytest.mark.anyio
async def test_non_canonical_record_is_caught_after_cached_reads(tmp_path: Path) -> None:
    # The valid record's messages are cached; the rehashed non-canonical one has another
    # digest, so it misses the cache and both reads refuse it, every time (nothing that
    # failed the check is ever cached).
    async with await SQLiteStore.open(tmp_path / "c.db") as store:
        await store.append(batch("c", "a1"))
        assert len(await store.read("c")) == 2
        data = json.dumps(json.loads(batch("c", "a1").encoded_messages), indent=1).encode()
        with raw(store) as conn:
            conn.execute(
                "UPDATE scope_history_batches SET messages = ?, digest = ?",
                (data, _digest(data)),
            )
        for _ in range(2):
            with pytest.raises(StoreError, match="'a1' is corrupt: messages are not in the"):
                await store.read("c")
            with pytest.raises(StoreError, match="'a1' is corrupt: messages are not in the"):
                await store.read_batches("c")


@pytest.mark.anyio
async def test_text_instead_of_blob_is_reported(store: SQLiteStore) -> None:
    error = await corrupt_and_read(
        store,
        f"UPDATE scope_history_batches SET messages = 'text' WHERE append_id = 'a1' {VICTIM}",
    )
    assert "victim" in str(error) and "not bytes" in str(error)


@pytest.mark.anyio
@pytest.mark.parametrize("cache", [0, 1_000, 32 * 2**20])
async def test_corruption_is_caught_after_cached_reads(tmp_path: Path, cache: int) -> None:
    async with await SQLiteStore.open(tmp_path / "c.db", cache_bytes=cache) as store:
        for i in range(3):
            await store.append(batch("c", f"a{i}", f"m{i}"))
        first = await store.read("c")
        assert await store.read("c") == first  # served from the cache when enabled
        with raw(store) as conn:
            conn.execute(
                "UPDATE scope_history_batches SET messages = CAST(replace("
                "CAST(messages AS TEXT), 'm1', 'x1') AS BLOB) WHERE append_id = 'a1'"
            )
        with pytest.raises(StoreError, match="'a1' is corrupt"):
            await store.read("c")


# -- group commit ------------------------------------------------------------------


def count_begins(store: SQLiteStore) -> list[str]:
    """Record every ``BEGIN IMMEDIATE`` the store's connections run from now on."""
    seen: list[str] = []

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            seen.append(statement)

    pool = store._pool
    for conn in pool.idle:
        conn.set_trace_callback(trace)
    connect = pool.connect

    def traced() -> sqlite3.Connection:
        conn = connect()
        conn.set_trace_callback(trace)
        return conn

    pool.connect = traced  # type: ignore[method-assign]
    return seen


async def outcome_of(store: SQLiteStore, b: Any, into: dict[str, Any], key: str) -> None:
    try:
        into[key] = await store.append(b)
    except Exception as exc:
        into[key] = exc


@pytest.mark.anyio
async def test_appends_waiting_for_the_write_lock_commit_as_one_transaction(
    store: SQLiteStore,
) -> None:
    """Appends that queue while another holds the handle's write lock run together in
    one transaction, each with the outcome it would get alone, in queue order: a retry
    of a batch queued before it is accepted, a fence counts the batches before it."""
    begins = count_begins(store)
    outcomes: dict[str, Any] = {}
    later = {
        "a2": batch("c", "a2", "two"),
        "a2 again": batch("c", "a2", "two"),
        "fenced": Batch("c", "a3", batch("c", "a3", "three").messages, expected_length=4),
        "stale": Batch("c", "a4", batch("c", "a4", "four").messages, expected_length=0),
    }
    with raw(store) as blocker:
        blocker.execute("BEGIN IMMEDIATE")  # the first append waits for it, holding the lock
        async with anyio.create_task_group() as tg:
            tg.start_soon(outcome_of, store, batch("c", "a1"), outcomes, "a1")
            await anyio.sleep(0.2)
            for key, b in later.items():
                tg.start_soon(outcome_of, store, b, outcomes, key)
                await anyio.sleep(0.05)  # queue order: the order they are started in
            await anyio.sleep(0.2)
            blocker.execute("COMMIT")
    assert outcomes["a1"] == batch("c", "a1").receipt()
    assert outcomes["a2"] == outcomes["a2 again"] == later["a2"].receipt()
    assert outcomes["fenced"] == later["fenced"].receipt()
    assert isinstance(outcomes["stale"], HistoryChangedError)
    assert [str(b.id) for b in await store.read_batches("c")] == ["a1", "a2", "a3"]
    assert len(begins) == 2  # the first append alone, then the four queued behind it


@pytest.mark.anyio
async def test_a_failing_append_in_a_group_fails_alone(store: SQLiteStore) -> None:
    """When one body of a group fails, the group is rolled back and each body runs in
    a transaction of its own: the others land, the failing one gets its own error."""
    with raw(store) as conn:
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON {store._tables.batches} "
            "WHEN NEW.append_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused here'); END"
        )
    outcomes: dict[str, Any] = {}
    with raw(store) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        async with anyio.create_task_group() as tg:
            tg.start_soon(outcome_of, store, batch("c", "a1"), outcomes, "a1")
            await anyio.sleep(0.2)
            for aid in ("a2", "bad", "a3"):
                tg.start_soon(outcome_of, store, batch("c", aid), outcomes, aid)
                await anyio.sleep(0.05)
            await anyio.sleep(0.2)
            blocker.execute("COMMIT")
    assert isinstance(outcomes["bad"], StoreError)
    assert "refused here" in str(outcomes["bad"])
    assert [outcomes[k] for k in ("a1", "a2", "a3")] == [
        batch("c", k).receipt() for k in ("a1", "a2", "a3")
    ]
    assert [str(b.id) for b in await store.read_batches("c")] == ["a1", "a2", "a3"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_concurrent_calls_reuse_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a handle keeps one connection per worker thread: bursts of concurrent
    appends and reads open at most that many connections, never one per burst (a
    connection closed after a burst and opened again loses its prepared statements and
    page cache). With fewer kept than threads, every burst would close and reopen."""
    opened: list[str] = []
    connect = sqlite3.connect

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(str(args[0]))
        return connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    async with await SQLiteStore.open(tmp_path / "burst.db") as store:
        length = 0
        for round_ in range(25):
            async with anyio.create_task_group() as group:
                for index in range(16):
                    group.start_soon(store.append, batch("c", f"a{round_}-{index}"))
                    group.start_soon(store.read, "c")
            length += 32
        assert len(await store.read("c")) == length
    assert 1 <= len(opened) <= 16, f"{len(opened)} connections opened"


@pytest.mark.anyio
async def test_reads_decode_on_the_callers_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker thread fetches a read's rows; their records are checked and decoded on
    the caller's thread once it is done (on the worker thread the same decoding measured
    about a fifth slower: benchmarks/RESULTS.md), for every read and the leased view."""
    await store.append(batch("c", "a1"))
    await store.append(batch("c", "a2", "again"))
    threads: list[int] = []
    decode = _records.decode_record

    def watched(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return decode(*args, **kwargs)

    monkeypatch.setattr(_records, "decode_record", watched)
    reads = {
        "read": lambda: store.read("c"),
        "read_view": lambda: store.read_view("c"),
        "read_batches": lambda: store.read_batches("c"),
        "read_tree": lambda: store.read_tree("c"),
        "acquire_turn_view": lambda: store.acquire_turn_view("c", "holder", 30.0),
    }
    for name, read in reads.items():
        threads.clear()
        got = await read()
        assert got is not None, name
        assert threads == [threading.get_ident()] * 2, name
    assert texts(await store.read("c")) == ["hello", "hello!", "again", "again!"]
