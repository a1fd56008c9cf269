"""Where the server-backed store tests find their servers, and what they do without them.

``SCOPE_TEST_POSTGRES_DSN``, ``SCOPE_TEST_REDIS_URL`` and ``SCOPE_TEST_REDIS_CLUSTER_URL``
name the servers (``bash
.ci/services.sh start`` starts throwaway ones and prints both). A test that needs a server
that is not configured or does not accept TCP connections is skipped with the reason,
unless ``SCOPE_REQUIRE_SERVERS=1``: then it fails, so CI cannot pass by skipping.

Every test uses its own table or key prefix (``unique_table_prefix``,
``unique_key_prefix``) and removes what it created (``drop_tables``, ``drop_keys``), so
tests never see each other's data and a shared server stays clean. ``Backend`` is such a
fresh place in any of the three persistent backends, ``fresh_store`` one store handle on
one: the store tests that run over every backend open their stores through them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import shutil
import socket
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import pytest

__all__ = [
    "BACKENDS",
    "BACKEND_LOOPS",
    "POSTGRES_ENV",
    "REDIS_ENV",
    "Backend",
    "PrivateCluster",
    "StallingProxy",
    "drop_keys",
    "drop_tables",
    "fresh_backend",
    "fresh_store",
    "import_driver",
    "over_backends",
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


async def drop_tables(dsn: str, prefix: str) -> None:
    """Remove everything a PostgresStore with ``table_prefix=prefix`` created."""
    asyncpg = import_driver("asyncpg")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f'DROP TABLE IF EXISTS "{prefix}_batches", "{prefix}_conversations", '
            f'"{prefix}_schema", '
            f'"{prefix}_leases", "{prefix}_moves", "{prefix}_secret", "{prefix}_tombstones";'
        )
        # Every overload of the store's functions (an older schema's signatures too).
        for name in ("append", "acquire_view", "commit_turn", "move_head"):
            for (signature,) in await conn.fetch(
                "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = $1",
                f"{prefix}_{name}",
            ):
                await conn.execute(f"DROP FUNCTION IF EXISTS {signature}")
    finally:
        await conn.close()


async def drop_keys(url: str, prefix: str, *, cluster: bool = False) -> None:
    """Delete every key under ``prefix`` (SCAN, never KEYS); on a cluster one by one, as
    the keys live in many slots."""
    if cluster:
        import_driver("redis")
        from redis.asyncio.cluster import RedisCluster

        client: Any = RedisCluster.from_url(url)
        await client.initialize()
    else:
        client = import_driver("redis.asyncio").Redis.from_url(url)
    try:
        keys = [
            key
            for match in (f"{prefix}:*", f"{{{prefix}:*")  # the indexes' keys: {prefix:...}
            async for key in client.scan_iter(match=match, count=1000)
        ]
        if cluster:
            for key in keys:
                await client.delete(key)
        elif keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


#: The persistent backends, as ``Backend`` kinds.
BACKENDS = ("sqlite", "postgres", "redis")


class Backend:
    """A fresh, empty place in one persistent store backend, and how to open handles on
    it: ``kind`` ``"sqlite"`` (a file under ``tmp_path``), ``"postgres"`` (a table prefix)
    or ``"redis"`` (a key prefix, opened with ``check_persistence=False``: the test
    servers run without persistence on purpose).

    ``url`` is the file's path or the server's URL, ``prefix`` the table or key prefix;
    ``await open(**options)`` opens another handle on the same place; ``drop()`` removes
    what any handle created there (``fresh_backend`` calls it). Creating one for a server
    kind needs its driver and server (``import_driver``, ``*_or_skip``)."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.url = str(tmp_path / "h.db")
            self.prefix = "scope_history"
        elif kind == "postgres":
            import_driver("asyncpg")
            self.url = postgres_dsn_or_skip()
            self.prefix = unique_table_prefix()
        elif kind == "redis":
            import_driver("redis")
            self.url = redis_url_or_skip()
            self.prefix = unique_key_prefix()
        else:
            raise ValueError(f"unknown backend kind {kind!r}")

    async def open(self, **options: Any) -> Any:
        """A new handle on this place (``prefix=`` opens one on another prefix)."""
        prefix = options.pop("prefix", self.prefix)
        if self.kind == "sqlite":
            from scope.historystores.sqlite import SQLiteStore

            return await SQLiteStore.open(self.url, table_prefix=prefix, **options)
        if self.kind == "postgres":
            from scope.historystores.postgres import PostgresStore

            return await PostgresStore.open(self.url, table_prefix=prefix, **options)
        from scope.historystores.redis import RedisStore

        options.setdefault("check_persistence", False)
        return await RedisStore.open(self.url, prefix=prefix, **options)

    async def rewrite_record(
        self, cid: str, aid: str, *, data: bytes | None = None, digest: str | None = None
    ) -> None:
        """Change the stored messages (``data``) and/or the digest of batch ``aid`` of
        ``cid`` in place, bypassing scope, as a writer other than scope could (the
        other field is left as stored)."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.url, isolation_level=None) as conn:
                for column, value in (("messages", data), ("digest", digest)):
                    if value is not None:
                        conn.execute(
                            f"UPDATE {self.prefix}_batches SET {column} = ? "
                            "WHERE conversation_id = ? AND append_id = ?",
                            (value, cid, aid),
                        )
        elif self.kind == "postgres":
            conn = await import_driver("asyncpg").connect(self.url)
            try:
                for column, value in (("messages", data), ("digest", digest)):
                    if value is not None:
                        await conn.execute(
                            f'UPDATE "{self.prefix}_batches" SET {column} = $1 '
                            "WHERE conversation_id = $2 AND append_id = $3",
                            value,
                            cid,
                            aid,
                        )
            finally:
                await conn.close()
        else:
            client = import_driver("redis.asyncio").Redis.from_url(self.url)
            key = f"{self.prefix}:{{{cid.encode().hex()}}}:batches"
            try:
                records = await client.lrange(key, 0, -1)
                [index] = [i for i, r in enumerate(records) if r.split(b"\n")[1] == aid.encode()]
                old_digest, _, old_data = records[index].split(b"\n", 2)
                record = b"\n".join(
                    (
                        old_digest if digest is None else digest.encode(),
                        aid.encode(),
                        old_data if data is None else data,
                    )
                )
                await client.lset(key, index, record)
            finally:
                await client.aclose()

    async def drop(self, prefix: str | None = None) -> None:
        """Remove what the stores under ``prefix`` (default: this one's) created on the
        server; a SQLite file goes with ``tmp_path``."""
        if self.kind == "postgres":
            await drop_tables(self.url, prefix or self.prefix)
        elif self.kind == "redis":
            await drop_keys(self.url, prefix or self.prefix)


#: The event loops each backend runs under.
BACKEND_LOOPS = {"sqlite": ["asyncio", "trio"], "postgres": ["asyncio"], "redis": ["asyncio"]}
_SERVER_MARKS = {"sqlite": (), "postgres": (pytest.mark.servers,), "redis": (pytest.mark.servers,)}


def over_backends(*kinds: str, **each: Mapping[str, Iterable[Any]]) -> pytest.MarkDecorator:
    """Parametrise an anyio test over the backends ``kinds`` (default: ``BACKENDS``) and
    the event loops each runs under (``BACKEND_LOOPS``): the test takes ``kind`` (and
    opens its store with ``fresh_backend`` or ``fresh_store``); the server kinds' rows
    are marked ``servers``. ``name={kind: values}`` adds a parameter ``name`` with one row
    per value of that kind."""
    [(name, values)] = each.items() if each else [("", {})]
    rows = [
        pytest.param(
            kind,
            loop,
            *((value,) if name else ()),
            id="-".join([kind, loop, *([_id(value)] if name else [])]),
            marks=_SERVER_MARKS[kind],
        )
        for kind in kinds or BACKENDS
        for loop in BACKEND_LOOPS[kind]
        for value in (values[kind] if name else [None])
    ]
    return pytest.mark.parametrize(("kind", "anyio_backend", *([name] if name else [])), rows)


def _id(value: Any) -> str:
    return value if isinstance(value, str) and value.isprintable() and value else repr(value)


@contextlib.asynccontextmanager
async def fresh_backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    """A ``Backend`` of ``kind``, dropped on the way out."""
    backend = Backend(kind, tmp_path)
    try:
        yield backend
    finally:
        await backend.drop()


@contextlib.asynccontextmanager
async def fresh_store(kind: str, tmp_path: Path, **options: Any) -> AsyncIterator[Any]:
    """One open store of ``kind`` in a fresh place, closed and dropped on the way out."""
    async with fresh_backend(kind, tmp_path) as backend, await backend.open(**options) as store:
        yield store


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


class PrivateCluster:
    """A three-master Redis Cluster of this test's own (``redis-server`` processes on
    free loopback ports below 32768, no persistence), so a test may kill and restart a
    node without disturbing the shared cluster. Skips when ``redis-server`` or
    ``redis-cli`` is missing. Use as an async context manager; ``url`` names a node."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    async def __aenter__(self) -> PrivateCluster:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            pytest.skip("needs redis-server and redis-cli on PATH")
        self.ports = _free_ports(3)
        for port in self.ports:
            self.start(port)
        await asyncio.sleep(0.3)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        create = ["redis-cli", "--cluster", "create", *nodes, "--cluster-yes"]
        await asyncio.to_thread(subprocess.run, create, check=True, capture_output=True)
        await self._until_ok()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()

    def start(self, port: int) -> None:
        """Start (or restart, keeping its cluster config) the node on ``port``."""
        where = self.dir / str(port)
        where.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-require-full-coverage",
                "no",
                "--dir",
                str(where),
            ],
            stdout=subprocess.DEVNULL,
        )

    def kill(self, port: int) -> None:
        """Kill the node on ``port`` (SIGKILL: no goodbye to its clients)."""
        self.processes[port].kill()
        self.processes[port].wait()

    async def _until_ok(self) -> None:
        check = ["redis-cli", "-p", str(self.ports[0]), "cluster", "info"]
        for _ in range(100):
            out = await asyncio.to_thread(subprocess.run, check, capture_output=True)
            if b"cluster_state:ok" in out.stdout:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the private Redis Cluster did not come up")


def _free_ports(count: int) -> list[int]:
    """``count`` free loopback ports below 32768 whose cluster bus ports (+10000) are
    free too."""
    ports: list[int] = []
    for port in range(12000 + os.getpid() % 5000, 22768):
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError("no free loopback ports below 32768")
