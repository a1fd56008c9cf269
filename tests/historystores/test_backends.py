"""The rules every persistent store keeps beyond the conformance suite, checked on each
backend: SQLite (under asyncio and trio), PostgreSQL and Redis (asyncio only: their
drivers are asyncio-only) against the real servers (see tests/servers.py).

Shape and validation, the closed-store refusal, unreachable servers, table and key
prefixes, the mapping of every driver error to ``StoreError``, skipped invalid listed ids
and refused non-canonical records. What only one backend has (WAL mode, dropped
connections, key layout, persistence checks...) is tested in its own module.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scope.errors import StoreError
from scope.history import Lister, Store
from scope.historystores import PersistentStore
from scope.historystores.postgres import PostgresStore
from scope.historystores.redis import RedisStore
from scope.historystores.sqlite import SQLiteStore
from tests.helpers import batch, texts
from tests.servers import Backend, fresh_backend, import_driver, over_backends

pytestmark = pytest.mark.anyio

DRIVERS = {"postgres": "asyncpg", "redis": "redis"}


@pytest.fixture
async def backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    async with fresh_backend(kind, tmp_path) as backend:
        yield backend


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Any]:
    async with await backend.open() as store:
        yield store


# -- shape and validation ---------------------------------------------------------------

MODULES = {
    "sqlite": "scope.historystores.sqlite",
    "postgres": "scope.historystores.postgres",
    "redis": "scope.historystores.redis",
}


@over_backends()
async def test_is_a_store_and_lister_with_public_module(
    kind: str, backend: Backend, store: Any
) -> None:
    assert isinstance(store, Store)
    assert isinstance(store, Lister)
    assert isinstance(store, PersistentStore)
    assert type(store).__module__ == MODULES[kind]
    assert backend.prefix in repr(store)
    assert kind != "sqlite" or "h.db" in repr(store)


BAD_PREFIXES = {
    "sqlite": ["", "1abc", "Upper", "a-b", 'a"b', "a b", "a;b", "é", "x" * 50, 7, None],
    "postgres": ["", "1abc", "Upper", "a-b", 'a"b', "a b", "a;drop", "é", "x" * 50, 7, None],
    "redis": ["", "a{b", "a}b", "{x}", "a*", "a?", "a[b]", "a b", "é", "x" * 101, 5, None],
}


@over_backends(bad=BAD_PREFIXES)
async def test_invalid_prefix_is_a_value_error(kind: str, tmp_path: Path, bad: Any) -> None:
    # Validation comes before any I/O: no server needed, no file created. A prefix that
    # is no string is a TypeError (the argument policy of scope.errors).
    error = ValueError if isinstance(bad, str) else TypeError
    if kind in DRIVERS:
        import_driver(DRIVERS[kind])
    if kind == "sqlite":
        with pytest.raises(error, match="table_prefix"):
            await SQLiteStore.open(tmp_path / "p.db", table_prefix=bad)
        assert not (tmp_path / "p.db").exists()
    elif kind == "postgres":
        with pytest.raises(error, match="table_prefix"):
            await PostgresStore.open("postgresql://nowhere.invalid/db", table_prefix=bad)
    else:
        with pytest.raises(error, match="prefix"):
            await RedisStore.open("redis://nowhere.invalid:1/0", prefix=bad)


LONGEST_PREFIXES = {"sqlite": ["x" * 49], "postgres": ["p" * 49], "redis": ["x" * 100]}


@over_backends(longest=LONGEST_PREFIXES)
async def test_longest_valid_prefix_works(backend: Backend, longest: str) -> None:
    try:
        async with await backend.open(prefix=longest) as store:
            await store.append(batch("c", "a1"))
            assert texts(await store.read("c")) == ["hello", "hello!"]
            assert await store.conversations() == ["c"]
    finally:
        await backend.drop(longest)


@over_backends()
async def test_prefixes_share_one_place_independently(backend: Backend) -> None:
    other = backend.prefix + "_other"
    try:
        async with await backend.open() as one, await backend.open(prefix=other) as two:
            await one.append(batch("c", "a1", "one"))
            await two.append(batch("c", "a1", "two"))
            await one.clear("c")
            assert await one.read("c") == []
            assert texts(await two.read("c")) == ["two", "two!"]
            assert await two.conversations() == ["c"]
    finally:
        await backend.drop(other)


# -- closed stores and unreachable servers ----------------------------------------------


@over_backends()
async def test_closed_store_refuses_every_call(backend: Backend) -> None:
    store = await backend.open()
    await store.append(batch("c", "a1"))
    await store.aclose()
    await store.aclose()  # idempotent
    assert store.closed
    for call in (store.read("c"), store.append(batch("c", "a2")), store.clear("c")):
        with pytest.raises(StoreError, match="closed"):
            await call
    with pytest.raises(StoreError, match="closed"):
        await store.conversations()
    async with await backend.open() as again:
        assert len(await again.read("c")) == 2


@pytest.mark.servers
@over_backends("postgres", "redis")
async def test_unreachable_server_is_a_store_error(kind: str) -> None:
    import_driver(DRIVERS[kind])
    with pytest.raises(StoreError, match="connect") as info:
        if kind == "postgres":
            await PostgresStore.open("postgresql://scope@127.0.0.1:1/postgres", connect_timeout=2)
        else:
            await RedisStore.open("redis://127.0.0.1:1/0", socket_timeout=2)
    if kind == "postgres":
        assert isinstance(info.value.__cause__, OSError)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_trio_is_refused_with_a_clear_error(kind: str) -> None:
    import_driver(DRIVERS[kind])
    with pytest.raises(RuntimeError, match="asyncio"):
        if kind == "postgres":
            await PostgresStore.open("postgresql://nowhere.invalid/db")
        else:
            await RedisStore.open("redis://nowhere.invalid:1/0")


# -- the error mapping ------------------------------------------------------------------


def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


def _module_errors(module: Any, package: str, *, warnings: bool) -> list[type[BaseException]]:
    out: list[type[BaseException]] = []
    for name in dir(module):
        cls = getattr(module, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, Exception)
            and (warnings or not issubclass(cls, Warning))
            and cls.__module__.startswith(package)
        ):
            out.append(cls)
    return out


def driver_errors(kind: str) -> list[type[BaseException]]:
    """Every error class the backend's driver raises (and the OS errors under it)."""
    if kind == "sqlite":
        classes = _subclasses(sqlite3.Error)
        assert sqlite3.OperationalError in classes and sqlite3.IntegrityError in classes
        return classes
    client_errors = [OSError, ConnectionResetError, TimeoutError]
    if kind == "postgres":
        asyncpg = import_driver("asyncpg")
        classes = [*_module_errors(asyncpg.exceptions, "asyncpg", warnings=False), *client_errors]
        assert len(classes) > 200  # every SQLSTATE class asyncpg knows, and its client errors
        return classes
    redis = import_driver("redis")
    classes = [*_module_errors(redis.exceptions, "redis", warnings=True), *client_errors]
    assert redis.exceptions.ResponseError in classes
    return classes


async def fail_inside(store: Any, cls: type[BaseException]) -> None:
    """Run a store call that raises ``cls("injected")`` where the driver's work runs."""
    if isinstance(store, SQLiteStore):

        def fail_sync(conn: sqlite3.Connection) -> None:
            raise cls("injected")

        await store._run(fail_sync, "test")
    elif isinstance(store, PostgresStore):

        async def fail_conn(conn: Any) -> None:
            raise cls("injected")

        await store._with_connection(fail_conn, "test")
    else:
        # Some classes parse their message (MovedError: "slot host:port"); bypass that.
        error: BaseException = cls.__new__(cls)
        Exception.__init__(error, "injected")

        async def fail() -> None:
            raise error

        await store._call(fail, "test")


@over_backends()
async def test_every_driver_error_becomes_store_error(kind: str, store: Any) -> None:
    for cls in driver_errors(kind):
        with pytest.raises(StoreError, match="injected") as info:
            await fail_inside(store, cls)
        assert type(info.value.__cause__) is cls, cls
    # Still usable afterwards.
    await store.append(batch("c", "a1"))
    assert len(await store.read("c")) == 2


# -- what others wrote into the store -----------------------------------------------------


async def plant_listed_ids(backend: Backend, ids: list[str | bytes]) -> None:
    """List ``ids`` as conversations, as a writer other than scope could."""
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.url, isolation_level=None) as conn:
            conn.executemany(
                f"INSERT INTO {backend.prefix}_conversations (id, closed, length) VALUES (?, 0, 2)",
                [(i,) for i in ids],  # bytes: a blob, no text affinity
            )
    elif backend.kind == "postgres":
        conn = await import_driver("asyncpg").connect(backend.url)
        try:
            await conn.executemany(
                f'INSERT INTO "{backend.prefix}_conversations" (id, length) VALUES ($1, 2)',
                [(i,) for i in ids],
            )
        finally:
            await conn.close()
    else:
        client = import_driver("redis.asyncio").Redis.from_url(backend.url)
        try:
            await client.zadd(f"{backend.prefix}:conversations", dict.fromkeys(ids, 0))
        finally:
            await client.aclose()


#: Invalid ids each backend can hold: PostgreSQL's text cannot hold bytes that are not
#: UTF-8.
BAD_IDS: dict[str, list[str | bytes]] = {
    "sqlite": [" padded", "bad\nid", b"\xff\xfe"],
    "postgres": ["bad\nid", " padded"],
    "redis": [b"bad\nid", b" padded", b"\xff\xfe"],
}


@over_backends()
async def test_invalid_listed_ids_are_skipped_and_logged_once(
    kind: str, backend: Backend, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await store.append(batch("a", "a1"))
    await store.append(batch("z", "a1"))
    await plant_listed_ids(backend, BAD_IDS[kind])
    assert store.invalid_conversation_ids == ()
    with caplog.at_level("WARNING", logger="scope.historystores"):
        assert await store.conversations() == ["a", "z"]
        assert await store.conversations() == ["a", "z"]
    shown = [
        i.decode("utf-8", "backslashreplace") if isinstance(i, bytes) else i for i in BAD_IDS[kind]
    ]
    assert store.invalid_conversation_ids == tuple(sorted(shown))
    records = [r for r in caplog.records if r.name == "scope.historystores"]
    assert len(records) == len(shown)  # once per id and handle, not once per listing
    assert all(r.levelname == "WARNING" and repr(store) in r.getMessage() for r in records)
    assert any("'bad\\nid'" in r.getMessage() for r in records)
    # Skipped, never deleted: the repair is the operator's.
    await assert_still_listed(backend, BAD_IDS[kind])
    # Reads of the valid conversations are unaffected.
    assert len(await store.read("z")) == 2


async def assert_still_listed(backend: Backend, ids: list[str | bytes]) -> None:
    """Every planted id is still listed in the store's own records."""
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.url, isolation_level=None) as conn:
            listed = {
                row[0] for row in conn.execute(f"SELECT id FROM {backend.prefix}_conversations")
            }
    elif backend.kind == "postgres":
        conn = await import_driver("asyncpg").connect(backend.url)
        try:
            rows = await conn.fetch(f'SELECT id FROM "{backend.prefix}_conversations"')
        finally:
            await conn.close()
        listed = {row[0] for row in rows}
    else:
        client = import_driver("redis.asyncio").Redis.from_url(backend.url)
        try:
            listed = set(await client.zrange(f"{backend.prefix}:conversations", 0, -1))
        finally:
            await client.aclose()
    assert set(ids) <= listed


async def overwrite_record(backend: Backend, cid: str, aid: str, data: bytes) -> None:
    """Replace the stored messages of batch ``aid`` of ``cid`` by ``data``, with the
    digest recomputed, as a writer other than scope could."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    await backend.rewrite_record(cid, aid, data=data, digest=digest)


@over_backends()
async def test_rehashed_non_canonical_record_is_refused_by_both_reads(
    backend: Backend, store: Any
) -> None:
    """A record rewritten outside scope as valid but non-canonical JSON, its digest
    recomputed: ``read`` refuses it exactly as ``read_batches`` does."""
    original = batch("victim", "a1")
    await store.append(original)
    await store.append(batch("bystander", "a1"))
    assert len(await store.read("victim")) == 2  # cached while valid
    data = json.dumps(json.loads(original.encoded_messages), indent=1).encode()
    await overwrite_record(backend, "victim", "a1", data)
    with pytest.raises(StoreError, match="canonical") as info:
        await store.read("victim")
    assert "conversation 'victim'" in str(info.value) and "'a1'" in str(info.value)
    with pytest.raises(StoreError, match="canonical") as batches_info:
        await store.read_batches("victim")
    assert str(batches_info.value) == str(info.value)
    assert texts(await store.read("bystander")) == ["hello", "hello!"]
