"""Schema versions: ``open(create=False)`` runs no DDL and only checks the version; data
written by scope 0.1 (schema version 1, no length record) is upgraded by ``create=True``
or ``scope history migrate``, and the ``expected_length`` fence then counts its
messages; a PostgreSQL role with only DML and EXECUTE grants runs the store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scope.cli import main
from scope.errors import HistoryChangedError, StoreError
from scope.history import Batch, HistoryView
from scope.historystores._schema import SCHEMA_VERSION
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import turn
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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


V1_BATCHES = [
    Batch("c", "a1", turn("one", 3)),
    Batch("c", "a2", turn("two")),
    Batch("d", "a1", turn("d")),
]


# ---------------------------------------------------------------- SQLite


def write_sqlite_v1(path: Path) -> None:
    """The tables scope 0.1 created, holding V1_BATCHES, and a closed conversation."""
    conn = sqlite3.connect(path)
    conn.execute(
        'CREATE TABLE "scope_history_conversations" (id TEXT PRIMARY KEY NOT NULL, '
        "closed INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID"
    )
    conn.execute(
        'CREATE TABLE "scope_history_batches" (conversation_id TEXT NOT NULL, '
        "seq INTEGER NOT NULL, append_id TEXT NOT NULL, digest TEXT NOT NULL, "
        "messages BLOB NOT NULL, PRIMARY KEY (conversation_id, seq), "
        "UNIQUE (conversation_id, append_id))"
    )
    for seq, batch in enumerate(V1_BATCHES, 1):
        conn.execute(
            'INSERT OR IGNORE INTO "scope_history_conversations" (id, closed) VALUES (?, 0)',
            (batch.conversation_id,),
        )
        conn.execute(
            'INSERT INTO "scope_history_batches" VALUES (?, ?, ?, ?, ?)',
            (batch.conversation_id, seq, batch.id, batch.digest, batch.encoded_messages),
        )
    conn.execute("INSERT INTO \"scope_history_conversations\" (id, closed) VALUES ('gone', 1)")
    conn.commit()
    conn.close()


async def test_sqlite_create_false_needs_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    with pytest.raises(StoreError, match="scope history migrate"):
        await SQLiteStore.open(path, create=False)
    async with await SQLiteStore.open(path):
        pass
    async with await SQLiteStore.open(path, create=False) as store:
        await store.append(Batch("c", "a1", turn("t")))
        assert len(await store.read("c")) == 2
    with pytest.raises(TypeError, match="create must be a bool"):
        await SQLiteStore.open(path, create="no")  # type: ignore[arg-type]


async def test_sqlite_version_1_is_upgraded_and_fenced(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    write_sqlite_v1(path)
    with pytest.raises(StoreError, match=f"schema version 1, this scope needs {SCHEMA_VERSION}"):
        await SQLiteStore.open(path, create=False)
    async with await SQLiteStore.open(path) as store:
        assert await store.read_view("c") == HistoryView(
            tuple(m for b in V1_BATCHES[:2] for m in b.messages), 5, False
        )
        assert (await store.read_view("gone")).closed
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("c", "a3", turn("late"), expected_length=3))
        assert caught.value.actual == 5
        await store.append(Batch("c", "a3", turn("three"), expected_length=5))
        await store.append(Batch("d", "a2", turn("d2"), expected_length=2))
        assert await store.read_batches("c") == [*V1_BATCHES[:2], Batch("c", "a3", turn("three"))]
    # Upgraded once: a second open (create=False, no DDL) accepts it as it is.
    async with await SQLiteStore.open(path, create=False) as store:
        assert (await store.read_view("c")).length == 7


async def test_sqlite_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    async with await SQLiteStore.open(path):
        pass
    conn = sqlite3.connect(path)
    conn.execute('UPDATE "scope_history_schema" SET version = ?', (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    for create in (True, False):
        with pytest.raises(StoreError, match="newer scope"):
            await SQLiteStore.open(path, create=create)


def test_history_migrate_upgrades_a_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.db"
    write_sqlite_v1(path)
    assert main(["history", "migrate", "--store", f"sqlite:///{path}"]) == 0
    assert f"is at version {SCHEMA_VERSION}" in capsys.readouterr().out
    conn = sqlite3.connect(path)
    assert conn.execute('SELECT version FROM "scope_history_schema"').fetchall() == [
        (SCHEMA_VERSION,)
    ]
    assert conn.execute(
        'SELECT id, length FROM "scope_history_conversations" ORDER BY id'
    ).fetchall() == [("c", 5), ("d", 2), ("gone", 0)]


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture
async def pg() -> AsyncIterator[tuple[Any, str, str]]:
    asyncpg = import_driver("asyncpg")

    dsn = postgres_dsn_or_skip()
    prefix = unique_table_prefix()
    conn = await asyncpg.connect(dsn)
    try:
        yield conn, dsn, prefix
    finally:
        await conn.close()
        await drop_tables(dsn, prefix)


async def write_postgres_v1(conn: Any, prefix: str) -> None:
    """The schema scope 0.1 created (tables and the four-argument function)."""
    conv, batches, fn = f'"{prefix}_conversations"', f'"{prefix}_batches"', f'"{prefix}_append"'
    await conn.execute(
        f'CREATE TABLE {conv} (id TEXT COLLATE "C" PRIMARY KEY, '
        "closed BOOLEAN NOT NULL DEFAULT FALSE)"
    )
    await conn.execute(
        f'CREATE TABLE {batches} (conversation_id TEXT COLLATE "C" NOT NULL, '
        'seq BIGINT NOT NULL, append_id TEXT COLLATE "C" NOT NULL, digest TEXT NOT NULL, '
        "messages BYTEA NOT NULL, PRIMARY KEY (conversation_id, seq), "
        "UNIQUE (conversation_id, append_id))"
    )
    await conn.execute(
        f"CREATE FUNCTION {fn}(p_cid TEXT, p_aid TEXT, p_digest TEXT, p_messages BYTEA) "
        "RETURNS TEXT LANGUAGE sql AS $$ SELECT 'v1' $$"
    )
    for seq, batch in enumerate(V1_BATCHES, 1):
        await conn.execute(
            f"INSERT INTO {conv} (id) VALUES ($1) ON CONFLICT DO NOTHING", batch.conversation_id
        )
        await conn.execute(
            f"INSERT INTO {batches} VALUES ($1, $2, $3, $4, $5)",
            batch.conversation_id,
            seq,
            batch.id,
            batch.digest,
            batch.encoded_messages,
        )


@pytest.mark.servers
async def test_postgres_version_1_is_upgraded_and_fenced(pg: tuple[Any, str, str]) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    await write_postgres_v1(conn, prefix)
    with pytest.raises(StoreError, match="schema version 1"):
        await PostgresStore.open(dsn, table_prefix=prefix, create=False)
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        assert (await store.read_view("c")).length == 5
        with pytest.raises(HistoryChangedError):
            await store.append(Batch("c", "a3", turn("late"), expected_length=2))
        await store.append(Batch("c", "a3", turn("three"), expected_length=5))
    # The four-argument function of version 1 is gone.
    assert (
        await conn.fetchval("SELECT count(*) FROM pg_proc WHERE proname = $1", f"{prefix}_append")
        == 1
    )
    async with await PostgresStore.open(dsn, table_prefix=prefix, create=False) as store:
        assert (await store.read_view("c")).length == 7
        assert await store.conversations() == ["c", "d"]


@pytest.mark.servers
async def test_postgres_least_privilege_role(pg: tuple[Any, str, str]) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    role = f"scope_app_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.open(dsn, table_prefix=prefix):
        pass  # the migration, as the owner
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        tables = ", ".join(
            f'"{prefix}_{t}"' for t in ("conversations", "batches", "schema", "leases")
        )
        await conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO "{role}"')
        await conn.execute(
            f'GRANT EXECUTE ON FUNCTION "{prefix}_append"'
            f'(TEXT, TEXT, TEXT, BYTEA, BIGINT, BIGINT) TO "{role}"'
        )
        app_dsn = dsn.replace("://scope@", f"://{role}@", 1)
        assert app_dsn != dsn
        # The runtime role cannot create a schema...
        with pytest.raises(StoreError, match="permission denied"):
            await PostgresStore.open(app_dsn, table_prefix=f"{prefix}_new")
        # ...and needs not: the default create=True runs no DDL on a current schema.
        async with await PostgresStore.open(app_dsn, table_prefix=prefix) as store:
            await store.append(Batch("b", "a1", turn("t"), expected_length=0))
            assert await store.conversations() == ["b"]
            await store.clear("b")
        # Nor does create=False.
        async with await PostgresStore.open(app_dsn, table_prefix=prefix, create=False) as store:
            await store.append(Batch("c", "a1", turn("t"), expected_length=0))
            assert (await store.read_view("c")).length == 2
            assert await store.conversations() == ["c"]
            assert await store.acquire_turn("c", "h", 30) is True
            assert await store.release_turn("c", "h") is True
            await store.clear("c")
            assert (await store.read_view("c")).closed
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')


# ---------------------------------------------------------------- Redis


@pytest.mark.servers
async def test_redis_conversation_written_by_0_1_is_counted() -> None:
    aioredis = import_driver("redis.asyncio")
    from scope.historystores.redis import RedisStore

    url = redis_url_or_skip()
    prefix = unique_key_prefix()
    admin = aioredis.Redis.from_url(url)
    try:
        base = f"{prefix}:{{{b'c'.hex()}}}"
        for batch in V1_BATCHES[:2]:  # scope 0.1's keys: no length key
            record = b"\n".join((batch.digest.encode(), batch.id.encode(), batch.encoded_messages))
            await admin.rpush(f"{base}:batches", record)
            await admin.hset(f"{base}:ids", batch.id, batch.digest)
        await admin.zadd(f"{prefix}:conversations", {"c": 0})
        async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
            assert (await store.read_view("c")).length == 5
            with pytest.raises(HistoryChangedError) as caught:
                await store.append(Batch("c", "a3", turn("late"), expected_length=3))
            assert caught.value.actual == 5
            await store.append(Batch("c", "a3", turn("three"), expected_length=5))
            assert await admin.get(f"{base}:length") == b"7"
            assert (await store.read_view("c")).length == 7
    finally:
        await admin.aclose()
        await drop_keys(url, prefix)


async def test_open_flags_must_be_bools_before_any_io() -> None:
    from scope.historystores.postgres import PostgresStore
    from scope.historystores.redis import RedisStore

    with pytest.raises(TypeError, match="create must be a bool"):
        await PostgresStore.open("postgresql://nobody@127.0.0.1:1/none", create=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cluster must be a bool"):
        await RedisStore.open("redis://127.0.0.1:1/0", cluster="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- version 2 -> 3 (leases)


def test_sqlite_version_2_gains_the_lease_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.db"

    async def write() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.append(Batch("c", "a1", turn("t")))

    async def refused() -> None:
        with pytest.raises(StoreError, match="schema version 2, this scope needs 3"):
            await SQLiteStore.open(path, create=False)

    async def use() -> None:
        async with await SQLiteStore.open(path, create=False) as store:
            assert await store.acquire_turn("c", "h", 30) is True
            assert len(await store.read("c")) == 2

    asyncio.run(write())
    conn = sqlite3.connect(path)
    conn.execute('DROP TABLE "scope_history_leases"')
    conn.execute('UPDATE "scope_history_schema" SET version = 2')
    conn.commit()
    asyncio.run(refused())
    assert main(["history", "migrate", "--store", f"sqlite:///{path}"]) == 0
    assert f"is at version {SCHEMA_VERSION}" in capsys.readouterr().out
    assert conn.execute('SELECT version FROM "scope_history_schema"').fetchall() == [(3,)]
    conn.close()
    asyncio.run(use())


@pytest.mark.servers
async def test_postgres_version_2_gains_the_lease_table(pg: tuple[Any, str, str]) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        await store.append(Batch("c", "a1", turn("t")))
    await conn.execute(f'DROP TABLE "{prefix}_leases"')
    await conn.execute(f'UPDATE "{prefix}_schema" SET version = 2')
    with pytest.raises(StoreError, match="schema version 2, this scope needs 3"):
        await PostgresStore.open(dsn, table_prefix=prefix, create=False)
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        assert await store.acquire_turn("c", "h", 30) is True
    async with await PostgresStore.open(dsn, table_prefix=prefix, create=False) as store:
        assert await store.acquire_turn("c", "h", 30) is True  # the same holder renews
        assert len(await store.read("c")) == 2
