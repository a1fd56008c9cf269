"""Retention and erasure on the persistent stores, checked against what the backend
really holds (DESIGN §6i): after ``erase`` neither the message text nor the conversation
id is anywhere in the SQLite file (WAL checkpointed; VACUUMed too), in any PostgreSQL table
of the store, or in any Redis key or value under the prefix; expiry is native on Redis
(PTTL); ``erase_owner`` over 10,000 SQLite conversations cancelled midway and run again
finishes the job; the schema 4 -> 5 upgrade keeps the data.

The rules every store keeps are StoreConformance's (tests/historystores/test_*_store.py).
"""

from __future__ import annotations

import datetime as _dt
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.chat import assistant_message, user_message
from scope.errors import ConversationClosedError
from scope.history import Batch
from scope.history.storetest._erasure import erase_owner_resumes
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import texts
from tests.servers import (
    drop_keys,
    drop_tables,
    import_driver,
    postgres_dsn_or_skip,
    redis_url_or_skip,
    unique_key_prefix,
    unique_table_prefix,
)

pytestmark = pytest.mark.anyio


def secret_turn(cid: str, aid: str, text: str) -> Batch:
    return Batch(cid, aid, [user_message(text), assistant_message(f"{text} (answer)")])


def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


async def erase_one_of_two(store: Any) -> tuple[str, str]:
    """Two conversations with distinctive ids and texts; the first erased. Returns the
    erased id and text."""
    gone, text = f"gone-{uuid.uuid4().hex}", f"secret-{uuid.uuid4().hex}"
    await store.append(secret_turn(gone, "a1", text), owner="alice")
    await store.append(secret_turn(gone, "a2", text + "-2"))
    assert await store.acquire_turn(gone, "holder", 30) is True
    await store.retain(gone, now() + _dt.timedelta(hours=1))
    await store.append(secret_turn("kept", "a1", "kept text"), owner="alice")
    receipt = await store.erase(gone)
    assert receipt.batches == 2
    assert await store.check_erased(receipt) == []
    with pytest.raises(ConversationClosedError):
        await store.append(secret_turn(gone, "a3", "late"))
    await store.clear(gone)  # a clear of an erased id writes no key or row naming it
    assert (await store.read_view(gone)).closed
    assert await store.check_erased(receipt) == []
    assert await store.conversations(owner="alice") == ["kept"]
    return gone, text


# ---------------------------------------------------------------- SQLite


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sqlite_file_holds_nothing_of_an_erased_conversation(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    async with await SQLiteStore.open(path) as store:
        gone, text = await erase_one_of_two(store)
    needles = (text.encode(), gone.encode(), gone.encode().hex().encode())
    wal = tmp_path / "h.db-wal"
    # Before VACUUM: the store's secure_delete zeroed what it freed, so a checkpoint (by
    # a connection of a build that does not) leaves nothing in free pages either.
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA secure_delete = OFF")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    assert b"kept text" in data  # the check can see text at all
    for needle in needles:
        assert needle not in data, needle
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    for needle in needles:
        assert needle not in data, needle
    async with await SQLiteStore.open(path, create=False) as store:
        assert (await store.read_view(gone)).closed
        with pytest.raises(ConversationClosedError):
            await store.append(secret_turn(gone, "a1", text))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sqlite_erase_owner_of_10000_cancelled_and_run_again(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "h.db") as store:
        await erase_owner_resumes(store, 10_000)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_sqlite_expiry_is_closure_at_the_moment_and_expire_pages(tmp_path: Path) -> None:
    """Expiry closes at the moment on the store's clock (a short retention, a few
    conversations, so a loaded box cannot expire one before the count); ``expire``
    deletes in pages, soonest first, up to its limit (250 conversations, expired by
    passing ``now`` an hour ahead, so no clock race)."""
    async with await SQLiteStore.open(
        tmp_path / "short.db", retention=_dt.timedelta(seconds=0.6)
    ) as store:
        for i in range(3):
            await store.append(secret_turn(f"c{i:03d}", "a1", "t"))
        await store.append(secret_turn("kept", "a1", "t"))
        await store.retain("kept", None)
        assert len(await store.conversations()) == 4
        await anyio.sleep(0.7)
        assert await store.conversations() == ["kept"]
        assert await store.read("c000") == []
        assert await store.expire() == 3
    async with await SQLiteStore.open(
        tmp_path / "h.db", retention=_dt.timedelta(minutes=1)
    ) as store:
        for i in range(250):
            await store.append(secret_turn(f"c{i:03d}", "a1", "t"))
        await store.append(secret_turn("kept", "a1", "t"))
        await store.retain("kept", None)
        assert len(await store.conversations()) == 251
        later = _dt.datetime.now(_dt.UTC) + _dt.timedelta(hours=1)
        # Pages of EXPIRE_PAGE (100) conversations, one transaction each, to the limit.
        assert await store.expire(later, limit=120) == 120
        assert await store.expire(later) == 130
        assert await store.expire(later) == 0
    with sqlite3.connect(tmp_path / "h.db") as conn:
        assert conn.execute("SELECT count(*) FROM scope_history_batches").fetchone() == (1,)
        # closed = 2: closed by expire() (read_meta's "expired"; clear writes 1).
        closed = conn.execute("SELECT count(*) FROM scope_history_conversations WHERE closed = 2")
        assert closed.fetchone() == (250,)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sqlite_schema_4_upgrade_keeps_data_and_adds_erasure(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    async with await SQLiteStore.open(path) as store:
        await store.append(secret_turn("c", "a1", "old"))
    # Back to version 4's layout: no retention columns, secret or tombstones.
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute('DROP INDEX "scope_history_owners"')
        conn.execute('DROP INDEX "scope_history_expiry"')
        for column in ("owner", "expires_at", "retained"):
            conn.execute(f"ALTER TABLE scope_history_conversations DROP COLUMN {column}")
        conn.execute("DROP TABLE scope_history_secret")
        conn.execute("DROP TABLE scope_history_tombstones")
        conn.execute("UPDATE scope_history_schema SET version = 4")
    async with await SQLiteStore.open(path) as store:
        assert texts(await store.read("c")) == ["old", "old (answer)"]
        await store.append(secret_turn("c", "a2", "new"), owner="bob")  # not the first
        assert await store.conversations(owner="bob") == []
        receipt = await store.erase("c")
        assert receipt.batches == 2
        assert await store.check_erased(receipt) == []
    async with await SQLiteStore.open(path) as store:  # again: every step idempotent
        assert (await store.read_view("c")).closed


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture
async def pg() -> AsyncIterator[tuple[Any, str, str]]:
    dsn = postgres_dsn_or_skip()
    asyncpg = import_driver("asyncpg")
    prefix = unique_table_prefix()
    conn = await asyncpg.connect(dsn)
    try:
        yield conn, dsn, prefix
    finally:
        await conn.close()
        await drop_tables(dsn, prefix)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_postgres_tables_hold_nothing_of_an_erased_conversation(
    pg: tuple[Any, str, str],
) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        gone, text = await erase_one_of_two(store)
    tables = [
        row[0]
        for row in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, $1)",
            prefix,
        )
    ]
    assert len(tables) == 7  # the moves table (branches) included
    rows: list[str] = []
    for table in tables:  # every row of every table, every column, as text
        rows += [r[0] for r in await conn.fetch(f'SELECT t::text FROM "{table}" t')]
    blob = "\n".join(rows)
    assert "kept" in blob
    # BYTEA renders as hex: look for the text's UTF-8 hex too.
    for needle in (text, gone, text.encode().hex(), gone.encode().hex()):
        assert needle not in blob, needle


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_postgres_schema_4_upgrade_keeps_data(pg: tuple[Any, str, str]) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        await store.append(secret_turn("c", "a1", "old"))
    await conn.execute(
        f'ALTER TABLE "{prefix}_conversations" DROP COLUMN owner, DROP COLUMN expires_at, '
        f'DROP COLUMN retained; DROP TABLE "{prefix}_secret", "{prefix}_tombstones"; '
        f'UPDATE "{prefix}_schema" SET version = 4'
    )
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        assert texts(await store.read("c")) == ["old", "old (answer)"]
        await store.append(secret_turn("c", "a2", "new"), owner="bob")
        assert await store.conversations(owner="bob") == []
        receipt = await store.erase("c")
        assert receipt.batches == 2
        assert await store.check_erased(receipt) == []
    assert await conn.fetchval(f'SELECT version FROM "{prefix}_schema"') == 5
    for name in ("append", "commit_turn", "acquire_view"):  # one argument list each
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname = $1", f"{prefix}_{name}"
        )
        assert count == 1, name


# ---------------------------------------------------------------- Redis


@pytest.fixture
async def redis_place() -> AsyncIterator[tuple[Any, str, str]]:
    url = redis_url_or_skip()
    admin = import_driver("redis.asyncio").Redis.from_url(url)
    prefix = unique_key_prefix()
    try:
        yield admin, url, prefix
    finally:
        await admin.aclose()
        await drop_keys(url, prefix)


async def every_key_and_value(admin: Any, prefix: str) -> bytes:
    """Every key under the prefix (and the indexes' ``{prefix:...}`` keys), each with
    its whole value, as one byte string."""
    out: list[bytes] = []
    for match in (f"{prefix}:*", f"{{{prefix}:*"):
        async for key in admin.scan_iter(match=match, count=1000):
            out.append(key)
            kind = (await admin.type(key)).decode()
            if kind == "string":
                out.append(await admin.get(key))
            elif kind == "list":
                out += await admin.lrange(key, 0, -1)
            elif kind == "hash":
                for field, value in (await admin.hgetall(key)).items():
                    out += [field, value]
            elif kind == "set":
                out += list(await admin.smembers(key))
            elif kind == "zset":
                out += [member for member, _ in await admin.zrange(key, 0, -1, withscores=True)]
            else:
                raise AssertionError(f"unexpected {kind} key {key!r}")
    return b"\n".join(out)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_redis_keys_hold_nothing_of_an_erased_conversation(
    redis_place: tuple[Any, str, str],
) -> None:
    from scope.historystores.redis import RedisStore

    admin, url, prefix = redis_place
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        gone, text = await erase_one_of_two(store)
        await store.conversations()  # the listing's own upkeep writes nothing naming it
    everything = await every_key_and_value(admin, prefix)
    assert b"kept text" in everything
    for needle in (text.encode(), gone.encode(), gone.encode().hex().encode()):
        assert needle not in everything, needle


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_redis_expiry_is_native(redis_place: tuple[Any, str, str]) -> None:
    from scope.historystores.redis import RedisStore

    admin, url, prefix = redis_place
    retention = _dt.timedelta(seconds=0.8)
    async with await RedisStore.open(
        url, prefix=prefix, check_persistence=False, retention=retention
    ) as store:
        await store.append(secret_turn("c", "a1", "t"), owner="alice")
        await store.append(secret_turn("kept", "a1", "t"))
        await store.retain("kept", None)
        base = f"{prefix}:{{{b'c'.hex()}}}"
        for suffix in ("batches", "ids"):
            ttl = await admin.pttl(f"{base}:{suffix}")
            assert 0 < ttl <= 800, (suffix, ttl)
        kept = f"{prefix}:{{{b'kept'.hex()}}}"
        assert await admin.pttl(f"{kept}:batches") == -1  # retained: no expiry
        await anyio.sleep(0.9)
        # Redis removed the data by itself; the conversation reads closed, is unlisted.
        assert await admin.exists(f"{base}:batches", f"{base}:ids") == 0
        assert (await store.read_view("c")).closed
        assert await store.conversations() == ["kept"]
        assert await store.conversations(owner="alice") == []
        with pytest.raises(ConversationClosedError):
            await store.append(secret_turn("c", "a2", "t"))
        # expire() closes it and cleans the indexes; the owner stays for erase_owned.
        assert await store.expire() == 1
        assert await store.expire() == 0
        assert await admin.exists(f"{base}:closed") == 1
        assert await admin.zscore(f"{{{prefix}:conversations}}:expiring", "c") is None
        assert [r.batches for r in await store.erase_owned("alice")] == [0]


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_redis_cluster_keys_hold_nothing_of_an_erased_conversation() -> None:
    import_driver("redis")
    from redis.asyncio.cluster import RedisCluster

    from scope.historystores.redis import RedisStore
    from tests.servers import redis_cluster_url_or_skip

    url = redis_cluster_url_or_skip()
    prefix = unique_key_prefix()
    admin: Any = RedisCluster.from_url(url)
    await admin.initialize()
    try:
        async with await RedisStore.open(
            url, prefix=prefix, cluster=True, check_persistence=False
        ) as store:
            gone, text = await erase_one_of_two(store)
            await store.conversations()
        everything = await every_key_and_value(admin, prefix)  # SCAN on every master
        assert b"kept text" in everything
        for needle in (text.encode(), gone.encode(), gone.encode().hex().encode()):
            assert needle not in everything, needle
    finally:
        await admin.aclose()
        await drop_keys(url, prefix, cluster=True)
