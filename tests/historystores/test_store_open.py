"""``scope.historystores.open_store(url)`` and the lazy driver imports."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scope.chat import user_message
from scope.history import Batch
from scope.historystores import PersistentStore, open_store
from scope.historystores.sqlite import SQLiteStore
from tests.servers import (
    drop_tables,
    postgres_dsn_or_skip,
    redis_url_or_skip,
    unique_key_prefix,
    unique_table_prefix,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.anyio
async def test_sqlite_url_with_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    async with await open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SQLiteStore)
        assert isinstance(store, PersistentStore)
        assert store.path == str(path)
        assert store.synchronous == "NORMAL"
        await store.append(Batch("c", "a1", [user_message("x")]))
    assert path.exists()


@pytest.mark.anyio
async def test_sqlite_url_options(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/with%20space.db?synchronous=full"
    async with await open_store(url, prefix="custom") as store:
        assert isinstance(store, SQLiteStore)
        assert store.synchronous == "FULL"
        assert store.table_prefix == "custom"
        assert store.path.endswith("with space.db")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("", "no scheme"),
        ("history.db", "no scheme"),
        ("mysql://host/db", "unsupported store URL scheme 'mysql'"),
        ("http://host/x", "unsupported"),
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
        ("sqlite://host/x.db", "empty host"),
        ("sqlite:///x.db?synchronous=off", "synchronous"),
        ("sqlite:///x.db?mode=ro", "unknown parameters"),
    ],
)
async def test_bad_urls_are_value_errors_with_one_line_messages(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        await open_store(url)
    assert "\n" not in str(info.value)


@pytest.mark.anyio
async def test_bad_prefix_through_open_store_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="table_prefix"):
        await open_store(f"sqlite:///{tmp_path}/x.db", prefix="no-dashes")


@pytest.mark.anyio
async def test_non_string_url_is_a_value_error() -> None:
    bad: Any = 42
    with pytest.raises(ValueError, match="string"):
        await open_store(bad)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_postgres_urls(scheme: str) -> None:
    from scope.historystores.postgres import PostgresStore

    dsn = postgres_dsn_or_skip()
    url = scheme + dsn[dsn.index("://") :]
    prefix = unique_table_prefix()
    try:
        async with await open_store(url, prefix=prefix) as store:
            assert isinstance(store, PostgresStore)
            assert store.table_prefix == prefix
            assert await store.conversations() == []
    finally:
        await drop_tables(dsn, prefix)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_redis_url() -> None:
    import redis.asyncio

    from scope.errors import ScopeWarning
    from scope.historystores.redis import RedisStore

    url = redis_url_or_skip()
    admin = redis.asyncio.Redis.from_url(url)
    try:
        durable = (await admin.config_get("appendonly"))["appendonly"] == "yes"
    finally:
        await admin.aclose()
    # open_store checks the server's persistence: CI's server has none, on purpose.
    expect = contextlib.nullcontext() if durable else pytest.warns(ScopeWarning, match="restart")
    with expect:
        store = await open_store(url, prefix=unique_key_prefix())
    async with store:
        assert isinstance(store, RedisStore)
        assert await store.conversations() == []


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_scope_and_the_backends_imports_no_driver() -> None:
    code = (
        "import sys, scope, scope.history, scope.historystores\n"
        "import scope.historystores.sqlite, scope.historystores.postgres\n"
        "import scope.historystores.redis\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('asyncpg', 'redis')))"
    )
    assert _run(code) == "[]"


def test_backend_modules_import_without_their_drivers() -> None:
    # A None entry in sys.modules makes `import asyncpg` / `import redis` fail.
    code = (
        "import sys\n"
        "sys.modules['asyncpg'] = None\n"
        "sys.modules['redis'] = None\n"
        "sys.modules['redis.asyncio'] = None\n"
        "import scope.historystores.postgres as p, scope.historystores.redis as r\n"
        "import asyncio\n"
        "for coro in (p.PostgresStore.open('postgresql://h/db'), r.RedisStore.open('redis://h')):\n"
        "    try:\n"
        "        asyncio.run(coro)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    lines = _run(code).splitlines()
    assert lines == [
        "PostgresStore needs asyncpg: install the extra, pip install 'scope-chat[postgres]'",
        "RedisStore needs redis-py: install the extra, pip install 'scope-chat[redis]'",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["sqlite:///h.db", "SQLite:////abs/h.db"])
async def test_sqlite_store_given_a_url_points_to_open_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"path is a URL, not a file: use open_store\("):
        await SQLiteStore.open(url)
    assert os.listdir(tmp_path) == []  # nothing created, not even a "sqlite:" folder
