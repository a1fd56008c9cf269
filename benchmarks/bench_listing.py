"""``conversations()`` on every store against the raw listing query written by hand
with the same driver, and paging a large store in bounded memory.

- 10,000 open conversations (one batch each, written through the store): the raw query
  (``SELECT id ... ORDER BY id`` for SQLite and PostgreSQL, ``ZRANGE`` of the listing
  for Redis, decoded to ``str``) against ``conversations()`` (which also validates each
  id) and against paging with ``limit=1000``. Best of 5. Target: at most 2x the raw
  query.
- Paging a large store: ``N`` conversations (default 1,000,000 on SQLite; set
  ``BENCH_LISTING_LARGE``) listed 1,000 at a time with ``after=``; the peak traced
  Python memory while paging is reported against a full ``conversations()``.

Servers from SCOPE_TEST_POSTGRES_DSN, SCOPE_TEST_REDIS_URL and
SCOPE_TEST_REDIS_CLUSTER_URL (``eval "$(bash .ci/services.sh start)"``); a store whose
server is missing is skipped. Run: ``python benchmarks/bench_listing.py``
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _listing import best_of, fill

from scope.historystores._schema import SCHEMA_VERSION
from tests.servers import drop_keys, drop_tables

COUNT, PAGE = 10_000, 1000


async def paged(store: Any) -> int:
    count, after = 0, None
    while page := await store.conversations(after=after, limit=PAGE):
        count += len(page)
        after = page[-1]
    return count


async def compare(name: str, store: Any, raw: Callable[[], Awaitable[list[str]]]) -> None:
    await fill(store, [f"conversation-{i:06d}" for i in range(COUNT)])
    await store.conversations()  # warm: connections, statements, a listing check

    async def hand() -> None:
        assert len(await raw()) == COUNT

    async def ours() -> None:
        assert len(await store.conversations()) == COUNT

    async def pages() -> None:
        assert await paged(store) == COUNT

    t_raw = await best_of(5, hand)
    t_ours = await best_of(5, ours)
    t_pages = await best_of(5, pages)
    print(
        f"{name:14} raw {t_raw * 1e3:7.1f} ms | conversations() {t_ours * 1e3:7.1f} ms "
        f"({t_ours / t_raw:4.2f}x) | pages of {PAGE} {t_pages * 1e3:7.1f} ms "
        f"({t_pages / t_raw:4.2f}x)"
    )


async def sqlite_rows(tmp: str) -> None:
    from scope.historystores.sqlite import SQLiteStore

    path = os.path.join(tmp, "listing.db")
    async with await SQLiteStore.open(path, cache_bytes=0) as store:
        conn = sqlite3.connect(path, check_same_thread=False)
        sql = "SELECT id FROM scope_history_conversations WHERE closed = 0 ORDER BY id"

        async def raw() -> list[str]:
            return await anyio.to_thread.run_sync(lambda: [row[0] for row in conn.execute(sql)])

        try:
            await compare("SQLite", store, raw)
        finally:
            conn.close()


async def postgres_rows(dsn: str) -> None:
    import asyncpg  # type: ignore[import-untyped,import-not-found,unused-ignore]

    from scope.historystores.postgres import PostgresStore

    prefix = f"scope_bench_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(dsn, table_prefix=prefix, cache_bytes=0)
    conn = await asyncpg.connect(dsn)
    sql = f'SELECT id FROM "{prefix}_conversations" WHERE NOT closed AND length > 0 ORDER BY id'
    try:

        async def raw() -> list[str]:
            return [row[0] for row in await conn.fetch(sql)]

        await compare("PostgreSQL", store, raw)
    finally:
        await conn.close()
        await store.aclose()
        await drop_tables(dsn, prefix)


async def redis_rows(name: str, url: str, cluster: bool) -> None:
    from scope.historystores.redis import RedisStore

    prefix = f"scope-bench:{uuid.uuid4().hex[:8]}"
    store = await RedisStore.open(url, prefix=prefix, cluster=cluster, check_persistence=False)
    client = store._client
    try:

        async def raw() -> list[str]:
            members = await client.zrange(f"{prefix}:conversations", 0, -1)
            return [bytes(m).decode() for m in members]

        await compare(name, store, raw)
    finally:
        await store.aclose()
        await drop_keys(url, prefix, cluster=cluster)


async def large_sqlite(tmp: str, count: int) -> None:
    """``count`` conversations written straight into the tables (as many appends would
    leave them), then listed in pages and whole; peak traced memory of each."""
    from scope.historystores.sqlite import SQLiteStore

    path = os.path.join(tmp, "large.db")
    async with await SQLiteStore.open(path):
        pass
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO scope_history_conversations (id, closed, length) VALUES (?, 0, 2)",
            ((f"conversation-{i:08d}",) for i in range(count)),
        )
    conn.close()
    assert SCHEMA_VERSION == 4
    async with await SQLiteStore.open(path) as store:
        tracemalloc.start()
        start = time.perf_counter()
        assert await paged(store) == count
        t_pages = time.perf_counter() - start
        _, peak_pages = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        start = time.perf_counter()
        assert len(await store.conversations()) == count
        t_whole = time.perf_counter() - start
        _, peak_whole = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(
        f"SQLite, {count:,} conversations: pages of {PAGE} {t_pages:5.1f} s, peak "
        f"{peak_pages / 2**20:6.1f} MiB | whole list {t_whole:5.1f} s, peak "
        f"{peak_whole / 2**20:6.1f} MiB"
    )


async def main() -> None:
    print(f"{COUNT:,} open conversations, best of 5")
    with tempfile.TemporaryDirectory() as tmp:
        await sqlite_rows(tmp)
        dsn = os.environ.get("SCOPE_TEST_POSTGRES_DSN")
        if dsn:
            await postgres_rows(dsn)
        else:
            print("PostgreSQL     skipped: SCOPE_TEST_POSTGRES_DSN not set")
        for name, env, cluster in (
            ("Redis", "SCOPE_TEST_REDIS_URL", False),
            ("Redis Cluster", "SCOPE_TEST_REDIS_CLUSTER_URL", True),
        ):
            url = os.environ.get(env)
            if url:
                await redis_rows(name, url, cluster)
            else:
                print(f"{name:14} skipped: {env} not set")
        await large_sqlite(tmp, int(os.environ.get("BENCH_LISTING_LARGE", "1000000")))


if __name__ == "__main__":
    anyio.run(main)
