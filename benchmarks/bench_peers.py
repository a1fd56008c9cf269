"""scope's history stores against the OpenAI Agents SDK sessions and LangChain message
histories: the same rows, the same data, the same servers, ratios in one run.

Contenders, per backend (a package or server that is missing is reported as skipped):
- in memory: ``scope.history.inmemory.InMemoryStore``; langchain-core
  ``InMemoryChatMessageHistory``;
- SQLite (a file in a temporary directory): ``SQLiteStore``; the Agents SDK's
  ``SQLiteSession`` and ``SQLAlchemySession`` (``sqlite+aiosqlite``); langchain-community
  ``SQLChatMessageHistory`` (async engine, ``sqlite+aiosqlite``);
- PostgreSQL (``SCOPE_TEST_POSTGRES_DSN``): ``PostgresStore``; the Agents SDK's
  ``SQLAlchemySession`` (``postgresql+asyncpg``); langchain-postgres
  ``PostgresChatMessageHistory`` (one psycopg ``AsyncConnection``);
- Redis (``SCOPE_TEST_REDIS_URL``): ``RedisStore``; the Agents SDK's ``RedisSession``;
  langchain-redis ``RedisChatMessageHistory`` (needs the RediSearch module).

One append is one turn: a user message (~110 characters) and an assistant message
(~200), as one scope ``Batch`` (built inside the timed call: validation, encoding and
digest included), one ``add_items`` of two items, one ``aadd_messages`` of two messages.
Each contender first runs one untimed append and one untimed 16-task round (its
tables created, its pool's connections opened, each server session's first statements
prepared), so no timed row pays for that. Rows
(asyncio):
- append, 1 and 16 tasks, one conversation (every task appends to the same one) and many
  (each append of the 1-task row to a new conversation; each task of the 16-task row on
  its own): p50 latency of one append, and time per append (the inverse of throughput);
  16 tasks also the p90 latency (a p50 alone rewards a store that lets one task run
  ahead while the others wait);
- warm read of 10 and 1,000 messages: the same handle reads a conversation again (what
  a service does on every turn); p50 of the reads;
- cold read of 1,000 messages: scope through a handle with ``cache_bytes=0`` (every read
  decodes, validates and digest-checks every record: a fresh process); the peers read as
  always (they keep nothing between reads).

Every column shows scope/peer (below 1.00x: scope is faster). The peers decode untyped
JSON (dicts, or LangChain's pydantic messages); scope returns validated, digest-checked
``Message`` values. ``--quick`` runs few iterations (a couple of minutes in all).

Run: ``python benchmarks/bench_peers.py [--quick] [memory|sqlite|postgres|redis ...]``
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scope.chat import assistant_message, user_message
from scope.history import Batch

USER = "What is the capital of France, and why is it famous? " * 2
ASSISTANT = "Paris. It is known for art, food, history and the Eiffel Tower. " * 3
QUICK = "--quick" in sys.argv
SEQUENTIAL = 60 if QUICK else 200
TASKS, PER_TASK = 16, (4 if QUICK else 12)
READS = 15 if QUICK else 40
ROUNDS = 2 if QUICK else 3


class Handle:
    """One contender on one backend: ``session(cid)`` gives an object whose ``append()``
    stores one turn and ``read()`` returns the conversation; ``cold(cid)`` one that
    reads without anything kept from earlier reads."""

    def __init__(
        self,
        session: Callable[[str], Any],
        cold: Callable[[str], Any] | None = None,
    ) -> None:
        self.session = session
        self.cold = cold or session


class _Scope:
    def __init__(self, store: Any, cid: str) -> None:
        self.store, self.cid = store, cid
        self.messages = (user_message(USER), assistant_message(ASSISTANT))

    async def append(self) -> None:
        await self.store.append(Batch(self.cid, uuid.uuid4().hex, self.messages))

    async def read(self) -> list[Any]:
        return await self.store.read(self.cid)  # type: ignore[no-any-return]


def scope_handle(store: Any, cold: Any) -> Handle:
    return Handle(lambda cid: _Scope(store, cid), lambda cid: _Scope(cold, cid))


class _Agents:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.items = [
            {"role": "user", "content": USER},
            {"role": "assistant", "content": ASSISTANT},
        ]

    async def append(self) -> None:
        await self.session.add_items(self.items)

    async def read(self) -> list[Any]:
        return await self.session.get_items()  # type: ignore[no-any-return]


class _LangChain:
    def __init__(self, history: Any) -> None:
        from langchain_core.messages import AIMessage, HumanMessage

        self.history = history
        self.messages = [HumanMessage(USER), AIMessage(ASSISTANT)]

    async def append(self) -> None:
        await self.history.aadd_messages(self.messages)

    async def read(self) -> list[Any]:
        return await self.history.aget_messages()  # type: ignore[no-any-return]


Opened = contextlib.AbstractAsyncContextManager[Handle]


# ---------------------------------------------------------------- contenders


@contextlib.asynccontextmanager
async def scope_memory(tmp: Path) -> AsyncIterator[Handle]:
    from scope.history.inmemory import InMemoryStore

    store = InMemoryStore()
    yield scope_handle(store, store)


@contextlib.asynccontextmanager
async def langchain_memory(tmp: Path) -> AsyncIterator[Handle]:
    from langchain_core.chat_history import InMemoryChatMessageHistory

    histories: dict[str, Any] = {}

    def session(cid: str) -> _LangChain:
        return _LangChain(histories.setdefault(cid, InMemoryChatMessageHistory()))

    yield Handle(session)


@contextlib.asynccontextmanager
async def scope_sqlite(tmp: Path) -> AsyncIterator[Handle]:
    from scope.historystores.sqlite import SQLiteStore

    path = tmp / "scope.db"
    async with (
        await SQLiteStore.open(path) as store,
        await SQLiteStore.open(path, cache_bytes=0) as cold,
    ):
        yield scope_handle(store, cold)


@contextlib.asynccontextmanager
async def agents_sqlite(tmp: Path) -> AsyncIterator[Handle]:
    from agents import SQLiteSession

    sessions: dict[str, Any] = {}
    yield Handle(
        lambda cid: _Agents(sessions.setdefault(cid, SQLiteSession(cid, str(tmp / "agents.db"))))
    )
    for session in sessions.values():
        session.close()


@contextlib.asynccontextmanager
async def agents_sqlalchemy(url: str) -> AsyncIterator[Handle]:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url, pool_size=16)
    tag = uuid.uuid4().hex[:8]
    tables = {"sessions_table": f"h36_s_{tag}", "messages_table": f"h36_m_{tag}"}
    sessions: dict[str, Any] = {}

    def session(cid: str) -> _Agents:
        if cid not in sessions:
            sessions[cid] = SQLAlchemySession(cid, engine=engine, create_tables=True, **tables)
        return _Agents(sessions[cid])

    try:
        yield Handle(session)
    finally:
        from sqlalchemy import text

        async with engine.begin() as conn:
            for name in (tables["messages_table"], tables["sessions_table"]):
                await conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
        await engine.dispose()


@contextlib.asynccontextmanager
async def agents_sqlalchemy_sqlite(tmp: Path) -> AsyncIterator[Handle]:
    import aiosqlite  # noqa: F401  (the driver SQLAlchemy needs)

    async with agents_sqlalchemy(f"sqlite+aiosqlite:///{tmp / 'agents_sa.db'}") as handle:
        yield handle


@contextlib.asynccontextmanager
async def langchain_sqlite(tmp: Path) -> AsyncIterator[Handle]:
    import aiosqlite  # noqa: F401
    from langchain_community.chat_message_histories import SQLChatMessageHistory
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp / 'langchain.db'}")
    histories: dict[str, Any] = {}

    def session(cid: str) -> _LangChain:
        if cid not in histories:
            histories[cid] = SQLChatMessageHistory(cid, connection=engine)
        return _LangChain(histories[cid])

    try:
        yield Handle(session)
    finally:
        await engine.dispose()


def _postgres_dsn() -> str:
    dsn = os.environ.get("SCOPE_TEST_POSTGRES_DSN")
    if not dsn:
        raise LookupError("SCOPE_TEST_POSTGRES_DSN is not set")
    return dsn


@contextlib.asynccontextmanager
async def scope_postgres(tmp: Path) -> AsyncIterator[Handle]:
    from scope.historystores.postgres import PostgresStore
    from tests.servers import drop_tables

    dsn, prefix = _postgres_dsn(), f"h36_peers_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(dsn, table_prefix=prefix, max_size=16)
    cold = await PostgresStore.open(dsn, table_prefix=prefix, max_size=4, cache_bytes=0)
    try:
        yield scope_handle(store, cold)
    finally:
        await cold.aclose()
        await store.aclose()
        await drop_tables(dsn, prefix)


@contextlib.asynccontextmanager
async def agents_postgres(tmp: Path) -> AsyncIterator[Handle]:
    # SQLAlchemy's asyncpg dialect passes the URL's query to asyncpg.connect, which
    # takes ssl= and not libpq's sslmode= (the CI DSN names sslmode=disable).
    dsn = _postgres_dsn().replace("postgresql://", "postgresql+asyncpg://", 1)
    dsn = dsn.replace("sslmode=", "ssl=")
    async with agents_sqlalchemy(dsn) as handle:
        yield handle


@contextlib.asynccontextmanager
async def langchain_postgres(tmp: Path) -> AsyncIterator[Handle]:
    import psycopg
    from langchain_postgres import PostgresChatMessageHistory

    table = f"h36_lc_{uuid.uuid4().hex[:8]}"
    conn = await psycopg.AsyncConnection.connect(_postgres_dsn())
    await PostgresChatMessageHistory.acreate_tables(conn, table)
    histories: dict[str, Any] = {}

    def session(cid: str) -> _LangChain:
        if cid not in histories:
            histories[cid] = PostgresChatMessageHistory(table, cid, async_connection=conn)
        return _LangChain(histories[cid])

    try:
        yield Handle(session)
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.commit()
        await conn.close()


def _redis_url() -> str:
    url = os.environ.get("SCOPE_TEST_REDIS_URL")
    if not url:
        raise LookupError("SCOPE_TEST_REDIS_URL is not set")
    return url


@contextlib.asynccontextmanager
async def scope_redis(tmp: Path) -> AsyncIterator[Handle]:
    from scope.historystores.redis import RedisStore
    from tests.servers import drop_keys

    url, prefix = _redis_url(), f"h36:peers:{uuid.uuid4().hex[:8]}"
    store = await RedisStore.open(url, prefix=prefix, check_persistence=False)
    cold = await RedisStore.open(url, prefix=prefix, check_persistence=False, cache_bytes=0)
    try:
        yield scope_handle(store, cold)
    finally:
        await cold.aclose()
        await store.aclose()
        await drop_keys(url, prefix)


@contextlib.asynccontextmanager
async def agents_redis(tmp: Path) -> AsyncIterator[Handle]:
    import redis.asyncio as aioredis
    from agents.extensions.memory.redis_session import RedisSession

    prefix = f"h36:agents:{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(_redis_url())
    sessions: dict[str, Any] = {}

    def session(cid: str) -> _Agents:
        if cid not in sessions:
            sessions[cid] = RedisSession(cid, redis_client=client, key_prefix=prefix)
        return _Agents(sessions[cid])

    try:
        yield Handle(session)
    finally:
        async for key in client.scan_iter(match=f"{prefix}*"):
            await client.delete(key)
        await client.aclose()


@contextlib.asynccontextmanager
async def langchain_redis(tmp: Path) -> AsyncIterator[Handle]:
    from langchain_redis import RedisChatMessageHistory

    prefix = f"h36:lc:{uuid.uuid4().hex[:8]}:"
    index = f"h36_idx_{uuid.uuid4().hex[:8]}"
    histories: dict[str, Any] = {}

    def session(cid: str) -> _LangChain:
        if cid not in histories:
            histories[cid] = RedisChatMessageHistory(
                cid, redis_url=_redis_url(), key_prefix=prefix, index_name=index
            )
        return _LangChain(histories[cid])

    session(uuid.uuid4().hex)  # fails here without RediSearch
    try:
        yield Handle(session)
    finally:
        first = next(iter(histories.values()))
        with contextlib.suppress(Exception):
            first.redis_client.ft(index).dropindex(delete_documents=True)


BACKENDS: dict[str, list[tuple[str, Callable[[Path], Opened]]]] = {
    "memory": [
        ("scope InMemoryStore", scope_memory),
        ("langchain InMemoryChatMessageHistory", langchain_memory),
    ],
    "sqlite": [
        ("scope SQLiteStore", scope_sqlite),
        ("agents SQLiteSession", agents_sqlite),
        ("agents SQLAlchemySession", agents_sqlalchemy_sqlite),
        ("langchain SQLChatMessageHistory", langchain_sqlite),
    ],
    "postgres": [
        ("scope PostgresStore", scope_postgres),
        ("agents SQLAlchemySession", agents_postgres),
        ("langchain PostgresChatMessageHistory", langchain_postgres),
    ],
    "redis": [
        ("scope RedisStore", scope_redis),
        ("agents RedisSession", agents_redis),
        ("langchain RedisChatMessageHistory", langchain_redis),
    ],
}


# ---------------------------------------------------------------- measurements


async def timed(call: Callable[[], Awaitable[Any]], out: list[float]) -> None:
    start = time.perf_counter()
    await call()
    out.append(time.perf_counter() - start)


async def appends(handle: Handle, tasks: int, one: bool) -> tuple[float, float, float]:
    """(p50 seconds of one append, seconds per append over the whole row, p90 seconds of
    one append). The p90 shows what the p50 of 16 tasks hides: a store that lets one
    task append again and again while the others wait has a low p50 and a long tail."""
    shared = uuid.uuid4().hex
    latencies: list[float] = []
    count = SEQUENTIAL if tasks == 1 else PER_TASK

    async def worker() -> None:
        mine = handle.session(shared if one else uuid.uuid4().hex)
        for _ in range(count):
            session = mine if one or tasks > 1 else handle.session(uuid.uuid4().hex)
            await timed(session.append, latencies)

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(tasks):
            group.start_soon(worker)
    total = time.perf_counter() - start
    p90 = statistics.quantiles(latencies, n=10)[-1]
    return statistics.median(latencies), total / len(latencies), p90


async def reads(handle: Handle, size: int, cold: bool) -> float:
    """p50 seconds of reading a conversation of ``size`` messages."""
    cid = uuid.uuid4().hex
    writer = handle.session(cid)
    for _ in range(size // 2):
        await writer.append()
    reader = handle.cold(cid) if cold else handle.session(cid)
    got = await reader.read()
    assert len(got) == size, (len(got), size)
    latencies: list[float] = []
    for _ in range(READS if size <= 10 else max(5, READS // 3)):
        await timed(reader.read, latencies)
    return statistics.median(latencies)


COLUMNS = [
    ("append 1 task, one conv: p50", "a1o", 0),
    ("append 1 task, one conv: per append", "a1o", 1),
    ("append 1 task, many conv: p50", "a1m", 0),
    ("append 1 task, many conv: per append", "a1m", 1),
    ("append 16 tasks, one conv: p50", "a16o", 0),
    ("append 16 tasks, one conv: per append", "a16o", 1),
    ("append 16 tasks, one conv: p90", "a16o", 2),
    ("append 16 tasks, many conv: p50", "a16m", 0),
    ("append 16 tasks, many conv: per append", "a16m", 1),
    ("append 16 tasks, many conv: p90", "a16m", 2),
    ("warm read 10 msgs: p50", "r10", 0),
    ("warm read 1,000 msgs: p50", "r1000", 0),
    ("cold read 1,000 msgs: p50", "c1000", 0),
]


async def measure(handle: Handle) -> dict[str, tuple[float, ...]]:
    out: dict[str, tuple[float, ...]] = {}
    # Untimed: one append (tables a peer creates on first use), then one 16-task round,
    # so that no timed row pays for opening a pool's connections (or a server session's
    # first statements) while another does not.
    await handle.session(uuid.uuid4().hex).append()
    await appends(handle, TASKS, False)
    gc.collect()
    out["a1o"] = await appends(handle, 1, True)
    out["a1m"] = await appends(handle, 1, False)
    out["a16o"] = await appends(handle, TASKS, True)
    out["a16m"] = await appends(handle, TASKS, False)
    out["r10"] = (await reads(handle, 10, False),)
    out["r1000"] = (await reads(handle, 1000, False),)
    out["c1000"] = (await reads(handle, 1000, True),)
    return out


def best(runs: list[dict[str, tuple[float, ...]]]) -> dict[str, tuple[float, ...]]:
    return {
        key: tuple(min(run[key][i] for run in runs) for i in range(len(runs[0][key])))
        for key in runs[0]
    }


async def backend(name: str, contenders: list[tuple[str, Callable[[Path], Opened]]]) -> bool:
    """Measure and print one backend's rows; whether scope is ahead in every row (the
    in-memory rows are shown, not counted: scope's in-memory append builds and digests
    a validated Batch, LangChain's appends to a list)."""
    counted = name != "memory"
    results: dict[str, list[dict[str, tuple[float, ...]]]] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ROUNDS):  # contenders interleaved, so a busy spell hits all alike
            for label, opener in contenders:
                if label in skipped:
                    continue
                where = Path(tmp) / uuid.uuid4().hex[:6]
                where.mkdir()
                try:
                    async with opener(where) as handle:
                        results.setdefault(label, []).append(await measure(handle))
                except Exception as exc:  # a missing package or server: reported, skipped
                    skipped[label] = f"{type(exc).__name__}: {str(exc)[:90]}"
                    results.pop(label, None)
    print(
        f"\n== {name} (best of {ROUNDS} rounds; ratios: scope / peer, below 1.00x scope is faster)"
    )
    for label, reason in skipped.items():
        print(f"   {label}: skipped ({reason})")
    if not results:
        return True
    scope_label = contenders[0][0]
    if scope_label not in results:
        return True
    mine = best(results[scope_label])
    peers = [(label, best(runs)) for label, runs in results.items() if label != scope_label]
    header = f"{'row':40} {scope_label:>22}" + "".join(f" {label:>38}" for label, _ in peers)
    print(header)
    ahead = True
    for title, key, index in COLUMNS:
        ours = mine[key][index]
        line = f"{title:40} {ours * 1e6:19.1f} us"
        for _label, theirs in peers:
            ratio = ours / theirs[key][index]
            # Cold reads: at most 1.0x; every other row: ahead (below 1.0x).
            ok = ratio <= 1.0 if key == "c1000" else ratio < 1.0
            ahead &= ok or not counted
            mark = " " if ok else "!"
            line += f" {theirs[key][index] * 1e6:23.1f} us {ratio:6.2f}x{mark}"
        print(line)
    return ahead


async def main() -> None:
    chosen = [a for a in sys.argv[1:] if not a.startswith("--")] or list(BACKENDS)
    ahead = True
    for name in chosen:
        ahead &= await backend(name, BACKENDS[name])
    print("\n" + ("scope ahead in every row" if ahead else "rows marked ! are behind a peer"))


if __name__ == "__main__":
    anyio.run(main)
