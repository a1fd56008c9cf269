"""Where the server-backed store tests find their servers, and what they do without them.

``SCOPE_TEST_POSTGRES_DSN`` and ``SCOPE_TEST_REDIS_URL`` name the servers (``bash
.ci/services.sh start`` starts throwaway ones and prints both). A test that needs a server
that is not configured or does not accept TCP connections is skipped with the reason,
unless ``SCOPE_REQUIRE_SERVERS=1``: then it fails, so CI cannot pass by skipping.

Every test uses its own table or key prefix (``unique_table_prefix``,
``unique_key_prefix``) and removes what it created, so tests never see each other's data
and a shared server stays clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import socket
import uuid
from typing import Any, Self
from urllib.parse import urlsplit

import pytest

__all__ = [
    "POSTGRES_ENV",
    "REDIS_ENV",
    "StallingProxy",
    "import_driver",
    "postgres_dsn_or_skip",
    "redis_cluster_url_or_skip",
    "redis_url_or_skip",
    "unique_key_prefix",
    "unique_table_prefix",
]

POSTGRES_ENV = "SCOPE_TEST_POSTGRES_DSN"
REDIS_ENV = "SCOPE_TEST_REDIS_URL"
REDIS_CLUSTER_ENV = "SCOPE_TEST_REDIS_CLUSTER_URL"
_HOW = 'start local servers with: eval "$(bash .ci/services.sh start)"'


def _required() -> bool:
    return os.environ.get("SCOPE_REQUIRE_SERVERS", "") == "1"


@functools.cache
def _problem(env: str, default_port: int) -> str | None:
    """Why the server named by ``env`` cannot be used, or None when it accepts TCP."""
    url = os.environ.get(env, "")
    if not url:
        return f"{env} is not set; {_HOW}"
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or default_port
    except ValueError as exc:
        return f"{env} has an invalid port: {exc}"
    try:
        with socket.create_connection((host, port), timeout=3):
            pass
    except OSError as exc:
        return f"{env} names {host}:{port}, which does not accept connections ({exc}); {_HOW}"
    return None


def _url_or_skip(env: str, default_port: int) -> str:
    problem = _problem(env, default_port)
    if problem is not None:
        if _required():
            pytest.fail(f"SCOPE_REQUIRE_SERVERS=1 but {problem}", pytrace=False)
        pytest.skip(problem)
    return os.environ[env]


def import_driver(name: str) -> Any:
    """Import a store driver (``asyncpg``, ``redis``); skip without it, or fail when
    ``SCOPE_REQUIRE_SERVERS=1``."""
    if _required():
        return importlib.import_module(name)
    reason = f"{name} is not installed (pip install scope-chat[...])"
    return pytest.importorskip(name, reason=reason)


def postgres_dsn_or_skip() -> str:
    """The test PostgreSQL DSN; skips (or fails under SCOPE_REQUIRE_SERVERS=1) without it."""
    return _url_or_skip(POSTGRES_ENV, 5432)


def redis_url_or_skip() -> str:
    """The test Redis URL; skips (or fails under SCOPE_REQUIRE_SERVERS=1) without it."""
    return _url_or_skip(REDIS_ENV, 6379)


def redis_cluster_url_or_skip() -> str:
    """A node of the test Redis Cluster; skips (or fails under SCOPE_REQUIRE_SERVERS=1)
    without it."""
    return _url_or_skip(REDIS_CLUSTER_ENV, 6379)


def unique_table_prefix() -> str:
    """A fresh, valid table prefix: ``scope_test_<12 hex digits>``."""
    return f"scope_test_{uuid.uuid4().hex[:12]}"


def unique_key_prefix() -> str:
    """A fresh, valid key prefix: ``scope-test:<12 hex digits>``."""
    return f"scope-test:{uuid.uuid4().hex[:12]}"


class StallingProxy:
    """A loopback TCP proxy in front of a real server that can hold the server's replies
    (``hold_replies()``): requests still reach the server and run, the client hears
    nothing, as behind a stalled network. Its own port, so a shared server is never
    paused. asyncio only; use as an async context manager (``port`` is then set)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    def hold_replies(self) -> None:
        self.flowing.clear()

    def release_replies(self) -> None:
        self.flowing.set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers += [writer, up_writer]
        for task in (
            asyncio.ensure_future(self._pump(reader, up_writer, hold=False)),
            asyncio.ensure_future(self._pump(up_reader, writer, hold=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, hold: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if hold:
                    await self.flowing.wait()
                if writer.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        writer.close()
