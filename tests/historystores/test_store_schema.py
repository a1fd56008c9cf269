"""Schema versions: ``open(create=False)`` runs no DDL and only checks the version; data
written by scope 0.1 (schema version 1, no length record) is upgraded by ``create=True``
or ``scope history migrate``, and the ``expected_length`` fence then counts its
messages; a PostgreSQL role with only DML and EXECUTE grants runs the store.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scope.chat import FinishReason, Output, Request, Response, assistant_message, user_message
from scope.cli import main
from scope.errors import ConversationClosedError, HistoryChangedError, StoreError
from scope.history import Batch, ClosedConversation, HistoryView, Middleware, keyword_layers
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
            tuple(m for b in V1_BATCHES[:2] for m in b.messages), 5, False, head="a2"
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


def documented_grants(prefix: str, role: str) -> list[str]:
    """The least-privilege grants of docs/stores.md (the block after its
    ``<!-- postgres-grants -->`` marker), for ``prefix`` and ``role``, one statement each."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "stores.md").read_text("utf-8")
    [block] = re.findall(r"<!-- postgres-grants -->\n```sql\n(.*?)\n```", text, re.S)
    block = re.sub(r"\bscope_history_", f"{prefix}_", block)
    block = re.sub(r"\bscope_app\b", f'"{role}"', block)
    statements = [s.strip() for s in block.split(";") if s.strip()]
    assert statements and all(s.startswith("GRANT ") for s in statements), statements
    return statements


class Answer:
    async def call(self, request: Request) -> Response:
        return Response(Output(assistant_message("a"), FinishReason.STOP))


@pytest.mark.servers
async def test_postgres_least_privilege_role(pg: tuple[Any, str, str]) -> None:
    # A role holding exactly the grants the docs list runs every store step with
    # create=False: appends, reads, listing, clear, a leased turn in separate steps, a
    # folded turn, Middleware turns under every lease strategy, and verify's scan.
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    role = f"scope_app_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.open(dsn, table_prefix=prefix):
        pass  # the migration, as the owner
    # Every function the store defined, as the server names it (one definition each:
    # the head fence and the owner, tombstone and retention arguments in one list).
    names = [f"{prefix}_{name}" for name in ("append", "acquire_view", "commit_turn", "move_head")]
    functions = [
        row[0]
        for row in await conn.fetch(
            "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = ANY($1) ORDER BY 1", names
        )
    ]
    assert len(functions) == len(names), functions
    # As a database that revokes EXECUTE from PUBLIC: only the documented grant runs them.
    await conn.execute(f"REVOKE EXECUTE ON FUNCTION {', '.join(functions)} FROM PUBLIC")
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for statement in documented_grants(prefix, role):
            await conn.execute(statement)
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
        async with await PostgresStore.open(app_dsn, table_prefix=prefix, create=False) as store:
            # A leased turn in separate steps.
            assert await store.acquire_turn("c", "h", 30) is True
            assert (await store.read_view("c")).length == 0
            await store.append(Batch("c", "a1", turn("t"), expected_length=0))
            assert await store.release_turn("c", "h") is True
            # A folded turn.
            view = await store.acquire_turn_view("c", "h", 30)
            assert view is not None and view.length == 2
            receipt = await store.append_release_turn(
                Batch("c", "a2", turn("u"), expected_length=2), "h"
            )
            assert receipt.id == "a2"
            assert await store.acquire_turn_view("c", "other", 30) is not None
            assert await store.release_turn("c", "other") is True
            # Turns through the Middleware.
            for strategy in ("fence", "reject", "wait", "interrupt"):
                model = Middleware(store, store, "c", layers=keyword_layers(strategy)).call(
                    Answer()
                )
                await model.call(Request([user_message(strategy)]))
            assert (await store.read_view("c")).length == 12
            stored = await store.read_batches("c")
            assert len(stored) == 6
            # A rewind and a switch back (the move_head function and the moves table).
            first, last = str(stored[0].id), str(stored[-1].id)
            assert await store.move_head("c", first, expected_head=last, move_id="r") == 2
            assert len((await store.read_tree("c")).batches) == 6
            assert await store.move_head("c", last, expected_head=first) == 12
            assert await store.conversations() == ["c"]
            assert len([r async for r in store.scan_records()]) == 6
            await store.clear("c")
            assert (await store.read_view("c")).closed
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')


@pytest.mark.servers
async def test_postgres_least_privilege_role_restores(pg: tuple[Any, str, str]) -> None:
    # The documented grants run every restore step (DESIGN §6n) but the adoption of
    # another secret, which needs UPDATE on the secret table: refused with the server's
    # reason, nothing written.
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    role = f"scope_app_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.open(dsn, table_prefix=prefix):
        pass
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for statement in documented_grants(prefix, role):
            await conn.execute(statement)
        app_dsn = dsn.replace("://scope@", f"://{role}@", 1)
        async with await PostgresStore.open(app_dsn, table_prefix=prefix, create=False) as store:
            secret = await store.store_secret()
            with pytest.raises(StoreError, match="permission denied"):
                await store.restore_erasures(b"o" * 32, [])
            assert await store.store_secret() == secret
            closed = ClosedConversation("c", "expired", "alice", 3)
            assert await store.restore_closed(closed) is True
            assert await store.restore_closed(closed) is False
            assert await store.closed_conversations() == [closed]
            mark = "hmac-sha256:" + "ab" * 32
            assert await store.restore_erasures(secret, [mark]) == 1
            assert await store.tombstones() == [mark]
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')


@pytest.mark.servers
async def test_postgres_role_without_the_lease_grant_fails_leased_turns(
    pg: tuple[Any, str, str],
) -> None:
    # What the docs' grants are for: a role granted the other rights but not the lease
    # table's is refused on every lease step, with the server's reason.
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    role = f"scope_app_{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.open(dsn, table_prefix=prefix):
        pass
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for statement in documented_grants(prefix, role):
            if f"{prefix}_leases" not in statement:
                await conn.execute(statement)
        app_dsn = dsn.replace("://scope@", f"://{role}@", 1)
        async with await PostgresStore.open(app_dsn, table_prefix=prefix, create=False) as store:
            await store.append(Batch("c", "a1", turn("t")))
            denied = f"permission denied for table {prefix}_leases"
            with pytest.raises(StoreError, match=denied):
                await store.acquire_turn("c", "h", 30)
            with pytest.raises(StoreError, match=denied):
                await store.acquire_turn_view("c", "h", 30)
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
        with pytest.raises(
            StoreError, match=f"schema version 2, this scope needs {SCHEMA_VERSION}"
        ):
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
    assert conn.execute('SELECT version FROM "scope_history_schema"').fetchall() == [
        (SCHEMA_VERSION,)
    ]
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
    with pytest.raises(StoreError, match=f"schema version 2, this scope needs {SCHEMA_VERSION}"):
        await PostgresStore.open(dsn, table_prefix=prefix, create=False)
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        assert await store.acquire_turn("c", "h", 30) is True
    async with await PostgresStore.open(dsn, table_prefix=prefix, create=False) as store:
        assert await store.acquire_turn("c", "h", 30) is True  # the same holder renews
        assert len(await store.read("c")) == 2


# ---------------------------------------------------------------- version 3 -> 4 (folded leases)


def test_sqlite_version_3_is_upgraded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SQLite's tables did not change in version 4 (PostgreSQL gained two functions):
    # the upgrade to the current version (through 5: branches, retention and erasure)
    # keeps the data and a lease taken before it.
    path = tmp_path / "h.db"

    async def write() -> None:
        async with await SQLiteStore.open(path) as store:
            await store.append(Batch("c", "a1", turn("t")))
            assert await store.acquire_turn("c", "h", 30) is True

    async def refused() -> None:
        with pytest.raises(
            StoreError, match=f"schema version 3, this scope needs {SCHEMA_VERSION}"
        ):
            await SQLiteStore.open(path, create=False)

    async def use() -> None:
        async with await SQLiteStore.open(path, create=False) as store:
            assert await store.acquire_turn_view("c", "other", 30) is None
            view = await store.acquire_turn_view("c", "h", 30)
            assert view is not None and view.length == 2
            await store.append_release_turn(Batch("c", "a2", turn("u"), expected_length=2), "h")
            assert await store.acquire_turn("c", "other", 30) is True

    asyncio.run(write())
    conn = sqlite3.connect(path)
    conn.execute('UPDATE "scope_history_schema" SET version = 3')
    conn.commit()
    asyncio.run(refused())
    assert main(["history", "migrate", "--store", f"sqlite:///{path}"]) == 0
    assert f"is at version {SCHEMA_VERSION}" in capsys.readouterr().out
    assert conn.execute('SELECT version FROM "scope_history_schema"').fetchall() == [
        (SCHEMA_VERSION,)
    ]
    conn.close()
    asyncio.run(use())


@pytest.mark.servers
async def test_postgres_version_3_gains_the_folded_lease_functions(
    pg: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scope.cli import _stores
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    functions = (f"{prefix}_acquire_view", f"{prefix}_commit_turn")
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        await store.append(Batch("c", "a1", turn("t")))
        assert await store.acquire_turn("c", "h", 30) is True  # held across the upgrade
    # Version 3: the tables of today, not the two functions.
    await conn.execute(f'DROP FUNCTION "{functions[0]}", "{functions[1]}"')
    await conn.execute(f'UPDATE "{prefix}_schema" SET version = 3')
    with pytest.raises(StoreError, match=f"schema version 3, this scope needs {SCHEMA_VERSION}"):
        await PostgresStore.open(dsn, table_prefix=prefix, create=False)

    async def open_here(url: str, *, create: bool = True) -> Any:
        return await PostgresStore.open(dsn, table_prefix=prefix, create=create)

    monkeypatch.setattr(_stores, "open_cli_store", open_here)
    # `scope history migrate` (its own event loop, so on a thread of its own here).
    assert await asyncio.to_thread(main, ["history", "migrate", "--store", dsn]) == 0
    assert f"is at version {SCHEMA_VERSION}" in capsys.readouterr().out
    found = await conn.fetch("SELECT proname FROM pg_proc WHERE proname = ANY($1)", functions)
    assert sorted(row[0] for row in found) == sorted(functions)
    assert await conn.fetchval(f'SELECT version FROM "{prefix}_schema"') == SCHEMA_VERSION
    async with await PostgresStore.open(dsn, table_prefix=prefix, create=False) as store:
        assert await store.acquire_turn_view("c", "other", 30) is None  # still h's
        view = await store.acquire_turn_view("c", "h", 30)
        assert view is not None and view.length == 2
        batch = Batch("c", "a2", turn("u"), expected_length=2)
        assert await store.append_release_turn(batch, "h") == batch.receipt()
        assert await store.acquire_turn("c", "other", 30) is True
        assert (await store.read_view("c")).length == 4


@pytest.mark.servers
async def test_postgres_longest_table_prefix_keeps_every_name_apart(
    pg: tuple[Any, str, str],
) -> None:
    # PostgreSQL cuts identifiers at 63 bytes: the longest prefix leaves every table and
    # function its own full name.
    from scope.historystores._schema import MAX_TABLE_PREFIX
    from scope.historystores.postgres import PostgresStore

    conn, dsn, _ = pg
    prefix = ("scope_long_" + uuid.uuid4().hex)[:MAX_TABLE_PREFIX].ljust(MAX_TABLE_PREFIX, "x")
    try:
        async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
            view = await store.acquire_turn_view("c", "h", 30)
            assert view == HistoryView((), 0)
            await store.append_release_turn(Batch("c", "a1", turn("t"), expected_length=0), "h")
            assert (await store.read_view("c")).length == 2
        names = await conn.fetch(
            "SELECT proname FROM pg_proc WHERE starts_with(proname, $1) UNION ALL "
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, $1)",
            prefix,
        )
        suffixes = sorted(row[0].removeprefix(prefix) for row in names)
        assert suffixes == [
            "_acquire_view",
            "_append",
            "_batches",
            "_commit_turn",
            "_conversations",
            "_leases",
            "_move_head",
            "_moves",
            "_schema",
            "_secret",
            "_tombstones",
        ]
    finally:
        await drop_tables(dsn, prefix)


# ---------------------------------------------------------------- version 4 -> 5 (branches)

#: What a schema-4 store held: "c" three batches, "d" one, "gone" cleared.
V4_BATCHES = [
    Batch("c", "a1", turn("one", 4)),
    Batch("d", "a1", turn("d")),
    Batch("c", "a2", turn("two")),
    Batch("c", "a3", turn("three")),
]


def v4_rows() -> list[tuple[str, int, Batch]]:
    """``(conversation id, seq, batch)`` as version 4 numbered them (seq per conversation)."""
    seqs: dict[str, int] = {}
    rows = []
    for batch in V4_BATCHES:
        seqs[batch.conversation_id] = seqs.get(batch.conversation_id, 0) + 1
        rows.append((batch.conversation_id, seqs[batch.conversation_id], batch))
    return rows


def write_sqlite_v4(path: Path) -> None:
    """The tables scope's schema 4 created (statements as version 4 ran them), holding
    V4_BATCHES, a cleared conversation and a lease."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(
        'CREATE TABLE "scope_history_conversations" (id TEXT PRIMARY KEY NOT NULL, '
        "closed INTEGER NOT NULL DEFAULT 0, length INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID"
    )
    conn.execute(
        'CREATE TABLE "scope_history_batches" (conversation_id TEXT NOT NULL, '
        "seq INTEGER NOT NULL, append_id TEXT NOT NULL, digest TEXT NOT NULL, "
        "messages BLOB NOT NULL, PRIMARY KEY (conversation_id, seq), "
        "UNIQUE (conversation_id, append_id))"
    )
    conn.execute(
        'CREATE TABLE "scope_history_schema" (id INTEGER PRIMARY KEY CHECK (id = 1), '
        "version INTEGER NOT NULL)"
    )
    conn.execute(
        'CREATE TABLE "scope_history_leases" (conversation_id TEXT PRIMARY KEY NOT NULL, '
        "holder TEXT NOT NULL, expires REAL NOT NULL) WITHOUT ROWID"
    )
    for cid, seq, batch in v4_rows():
        conn.execute(
            'INSERT INTO "scope_history_conversations" (id, closed, length) VALUES (?, 0, ?) '
            "ON CONFLICT (id) DO UPDATE SET length = length + excluded.length",
            (cid, len(batch)),
        )
        conn.execute(
            'INSERT INTO "scope_history_batches" VALUES (?, ?, ?, ?, ?)',
            (cid, seq, batch.id, batch.digest, batch.encoded_messages),
        )
    conn.execute(
        "INSERT INTO \"scope_history_conversations\" (id, closed, length) VALUES ('gone', 1, 2)"
    )
    conn.execute(
        "INSERT INTO \"scope_history_leases\" VALUES ('c', 'h', "
        "(julianday('now') - 2440587.5) * 86400.0 + 3600)"
    )
    conn.execute('INSERT INTO "scope_history_schema" VALUES (1, 4)')
    conn.commit()
    conn.close()


async def use_upgraded_v4(store: Any) -> None:
    """What a store upgraded from schema 4 must do with V4_BATCHES: read them as one
    branch (head the last batch, parents in seq order, no stored times, path lengths
    the running sums), append, rewind, branch, dedupe across branches; the migrated
    conversations have no owner and no expiry, and an erase removes every branch."""
    c = [b for b in V4_BATCHES if b.conversation_id == "c"]
    view = await store.read_view("c")
    assert view == HistoryView(tuple(m for b in c for m in b.messages), 8, False, head="a3")
    tree = await store.read_tree("c")
    assert tree.batches == tuple(c)
    assert tree.parents == (-1, 0, 1)
    assert tree.created == (None, None, None)
    assert tree.head == 2 and tree.closed is False
    assert await store.read_batches("d") == [V4_BATCHES[1]]
    assert (await store.read_view("gone")).closed
    assert await store.conversations() == ["c", "d"]
    assert await store.acquire_turn_view("c", "other", 30) is None  # the lease stays h's
    # The fence by head and length, on the migrated head.
    with pytest.raises(HistoryChangedError) as caught:
        await store.append(Batch("c", "x", turn("x"), expected_head="a2"))
    assert (caught.value.actual, caught.value.actual_head) == (8, "a3")
    a4 = Batch("c", "a4", turn("four"), expected_length=8, expected_head="a3")
    await store.append(a4)
    tree = await store.read_tree("c")
    assert tree.parents == (-1, 0, 1, 2) and tree.head == 3
    assert tree.created[3] is not None and tree.created[:3] == (None, None, None)
    # Rewinds onto migrated batches use their path lengths: 4 through a1, 6 through a2.
    assert await store.move_head("c", "a2", expected_head="a4", move_id="m1") == 6
    assert await store.read_batches("c") == c[:2]
    assert await store.move_head("c", "a1", expected_head="a2") == 4
    b1 = Batch("c", "b1", turn("b1"), expected_length=4, expected_head="a1")
    await store.append(b1)
    assert await store.read_batches("c") == [c[0], b1]
    # A retry of a batch on another branch: its receipt, the head not moved.
    assert await store.append(c[2]) == c[2].receipt()
    assert (await store.read_view("c")).head == "b1"
    assert await store.move_head("c", "a2", expected_head="nobody", move_id="m1") == 6
    # Retention and erasure on the migrated data: no owner was recorded (a later append
    # does not record one), nothing expires by itself; erase takes every branch.
    await store.append(Batch("d", "d2", turn("d2")), owner="alice")
    assert await store.conversations(owner="alice") == []
    assert await store.erase_owned("alice") == []
    assert await store.expire() == 0
    receipt = await store.erase("c")
    assert receipt.batches == 5  # a1, a2, a3 (migrated), a4 and b1 (on two branches)
    assert await store.check_erased(receipt) == []
    tree = await store.read_tree("c")
    assert tree.closed is True and tree.batches == ()
    with pytest.raises(ConversationClosedError):
        await store.move_head("c", "", expected_head="")
    assert await store.conversations() == ["d"]


async def test_sqlite_version_4_is_upgraded_to_branches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scope.historystores.sqlite import _Tables, _upgrade_branches, _upgrade_erasure

    path = tmp_path / "h.db"
    write_sqlite_v4(path)
    with pytest.raises(StoreError, match=f"schema version 4, this scope needs {SCHEMA_VERSION}"):
        await SQLiteStore.open(path, create=False)
    assert (
        await asyncio.to_thread(main, ["history", "migrate", "--store", f"sqlite:///{path}"]) == 0
    )
    assert f"is at version {SCHEMA_VERSION}" in capsys.readouterr().out
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(
            "SELECT conversation_id, seq, parent, created, path_length "
            'FROM "scope_history_batches" ORDER BY conversation_id, seq'
        ).fetchall() == [
            ("c", 1, None, None, 4),
            ("c", 2, 1, None, 6),
            ("c", 3, 2, None, 8),
            ("d", 1, None, None, 2),
        ]
        assert conn.execute(
            "SELECT id, head, branched, length, owner, expires_at, retained "
            'FROM "scope_history_conversations" ORDER BY id'
        ).fetchall() == [
            ("c", 3, 0, 8, None, None, 0),
            ("d", 1, 0, 2, None, None, 0),
            ("gone", None, 0, 2, None, None, 0),
        ]
        [(secret,)] = conn.execute('SELECT secret FROM "scope_history_secret"').fetchall()
        assert isinstance(secret, bytes) and len(secret) == 32
        assert conn.execute('SELECT count(*) FROM "scope_history_tombstones"').fetchone() == (0,)
    finally:
        conn.close()
    async with await SQLiteStore.open(path, create=False) as store:
        await use_upgraded_v4(store)
    # Every step is idempotent: running both upgrades again on the upgraded (and since
    # branched and erased) data changes nothing, the store secret included.
    tables = [
        f'"scope_history_{name}"'
        for name in ("conversations", "batches", "moves", "secret", "tombstones")
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        snapshot = [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in tables
        ]
        assert snapshot[4] != []  # the tombstone of "c"
        conn.execute("BEGIN IMMEDIATE")
        _upgrade_branches(conn, _Tables("scope_history"))
        _upgrade_erasure(conn, _Tables("scope_history"))
        conn.execute("COMMIT")
        assert snapshot == [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in tables
        ]
    finally:
        conn.close()


async def write_postgres_v4(conn: Any, prefix: str) -> None:
    """The tables scope's schema 4 created (statements as version 4 ran them) holding
    V4_BATCHES, a cleared conversation and a lease, and its three functions' signatures
    (bodies elided: the upgrade replaces them)."""
    conv, batches = f'"{prefix}_conversations"', f'"{prefix}_batches"'
    await conn.execute(
        f'CREATE TABLE {conv} (id TEXT COLLATE "C" PRIMARY KEY, '
        "closed BOOLEAN NOT NULL DEFAULT FALSE, length BIGINT NOT NULL DEFAULT 0)"
    )
    await conn.execute(
        f'CREATE TABLE {batches} (conversation_id TEXT COLLATE "C" NOT NULL, '
        'seq BIGINT NOT NULL, append_id TEXT COLLATE "C" NOT NULL, digest TEXT NOT NULL, '
        "messages BYTEA NOT NULL, PRIMARY KEY (conversation_id, seq), "
        "UNIQUE (conversation_id, append_id))"
    )
    await conn.execute(
        f'CREATE TABLE "{prefix}_schema" (id INT PRIMARY KEY CHECK (id = 1), version INT NOT NULL)'
    )
    await conn.execute(
        f'CREATE TABLE "{prefix}_leases" (conversation_id TEXT COLLATE "C" PRIMARY KEY, '
        "holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)"
    )
    for name, args in (
        ("append", "TEXT, TEXT, TEXT, BYTEA, BIGINT, BIGINT"),
        ("commit_turn", "TEXT, TEXT, TEXT, BYTEA, BIGINT, BIGINT, TEXT"),
    ):
        await conn.execute(
            f'CREATE FUNCTION "{prefix}_{name}"({args}) RETURNS TEXT LANGUAGE sql '
            "AS $$ SELECT 'v4' $$"
        )
    await conn.execute(
        f'CREATE FUNCTION "{prefix}_acquire_view"(TEXT, TEXT, FLOAT8) RETURNS TABLE '
        "(r_held BOOLEAN, r_closed BOOLEAN, r_length BIGINT, r_append_id TEXT, r_digest TEXT, "
        "r_messages BYTEA) LANGUAGE sql AS $$ SELECT FALSE, NULL::BOOLEAN, NULL::BIGINT, "
        "NULL::TEXT, NULL::TEXT, NULL::BYTEA $$"
    )
    for cid, seq, batch in v4_rows():
        await conn.execute(
            f"INSERT INTO {conv} (id, length) VALUES ($1, $2) "
            "ON CONFLICT (id) DO UPDATE SET length = {conv}.length + EXCLUDED.length".replace(
                "{conv}", conv
            ),
            cid,
            len(batch),
        )
        await conn.execute(
            f"INSERT INTO {batches} VALUES ($1, $2, $3, $4, $5)",
            cid,
            seq,
            batch.id,
            batch.digest,
            batch.encoded_messages,
        )
    await conn.execute(f"INSERT INTO {conv} (id, closed, length) VALUES ('gone', TRUE, 2)")
    await conn.execute(
        f"INSERT INTO \"{prefix}_leases\" VALUES ('c', 'h', clock_timestamp() + interval '1 hour')"
    )
    await conn.execute(f'INSERT INTO "{prefix}_schema" VALUES (1, 4)')


@pytest.mark.servers
async def test_postgres_version_4_is_upgraded_to_branches(pg: tuple[Any, str, str]) -> None:
    from scope.historystores.postgres import PostgresStore

    conn, dsn, prefix = pg
    await write_postgres_v4(conn, prefix)
    with pytest.raises(StoreError, match=f"schema version 4, this scope needs {SCHEMA_VERSION}"):
        await PostgresStore.open(dsn, table_prefix=prefix, create=False)
    async with await PostgresStore.open(dsn, table_prefix=prefix):
        pass  # the upgrade, as the owner
    rows = await conn.fetch(
        f'SELECT conversation_id, seq, parent, created, path_length FROM "{prefix}_batches" '
        "ORDER BY conversation_id, seq"
    )
    assert [tuple(r) for r in rows] == [
        ("c", 1, None, None, 4),
        ("c", 2, 1, None, 6),
        ("c", 3, 2, None, 8),
        ("d", 1, None, None, 2),
    ]
    rows = await conn.fetch(
        f'SELECT id, head, branched, length FROM "{prefix}_conversations" ORDER BY id'
    )
    assert [tuple(r) for r in rows] == [
        ("c", 3, False, 8),
        ("d", 1, False, 2),
        ("gone", None, False, 2),
    ]
    # Version 4's functions (no head fence, owner, tombstone or retention) are gone;
    # one of each name is left.
    names = [f"{prefix}_{name}" for name in ("append", "acquire_view", "commit_turn", "move_head")]
    found = await conn.fetch(
        "SELECT proname, oidvectortypes(proargtypes) FROM pg_proc WHERE proname = ANY($1) "
        "ORDER BY 1",
        names,
    )
    assert sorted(r[0] for r in found) == sorted(names)
    v4 = {
        f"{prefix}_append": "text, text, text, bytea, bigint, bigint",
        f"{prefix}_commit_turn": "text, text, text, bytea, bigint, bigint, text",
        f"{prefix}_acquire_view": "text, text, double precision",
    }
    assert not [r for r in found if v4.get(r[0]) == r[1]], found
    async with await PostgresStore.open(dsn, table_prefix=prefix, create=False) as store:
        await use_upgraded_v4(store)
        # Every step is idempotent: running the upgrade again changes nothing.
        queries = [
            f'SELECT * FROM "{prefix}_conversations" ORDER BY 1',
            f'SELECT * FROM "{prefix}_batches" ORDER BY 1, 2',
        ]
        snapshot = [[tuple(r) for r in await conn.fetch(q)] for q in queries]
        async with conn.transaction():
            await store._upgrade_branches(conn)
        assert snapshot == [[tuple(r) for r in await conn.fetch(q)] for q in queries]
