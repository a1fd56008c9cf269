"""RedisStore against a real server: conformance (with reopen), killed clients, key
layout, listing repair, corruption, validation and persistence checks. asyncio only
(redis-py's client is asyncio-only). The rules every persistent store keeps are checked
on every backend in tests/historystores/test_backends.py.

Needs ``SCOPE_TEST_REDIS_URL`` (see tests/servers.py); skipped without it unless
``SCOPE_REQUIRE_SERVERS=1``. Every test works under its own key prefix and deletes it.

Stores open with ``check_persistence=False``: the test server may run without
persistence (CI's does, on purpose), which is not what these tests are about; the
persistence check has its own tests (``test_persistence_*``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from scope.errors import HistoryChangedError, ScopeWarning, StoreError
from scope.history import Batch
from scope.history.storetest import StoreConformance
from scope.historystores.redis import RedisStore
from tests.helpers import batch, texts
from tests.servers import (
    StallingProxy,
    drop_keys,
    import_driver,
    redis_url_or_skip,
    unique_key_prefix,
)

redis = import_driver("redis")
aioredis = import_driver("redis.asyncio")

pytestmark = [pytest.mark.anyio, pytest.mark.servers]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def url() -> str:
    return redis_url_or_skip()


@pytest.fixture
async def prefix(url: str) -> AsyncIterator[str]:
    prefix = unique_key_prefix()
    yield prefix
    await drop_keys(url, prefix)


@pytest.fixture
async def admin(url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(url)
    yield client
    await client.aclose()


class TestRedisConformance(StoreConformance):
    @pytest.fixture
    async def store(self, url: str, prefix: str) -> AsyncIterator[RedisStore]:
        async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
            yield store

    async def reopen(self, store: Any) -> Any:
        return await RedisStore.open(self.url, prefix=store.prefix, check_persistence=False)

    @pytest.fixture(autouse=True)
    async def _places(self, url: str, prefix: str) -> AsyncIterator[None]:
        self.url, self.prefix = url, prefix
        yield
        await drop_keys(url, f"{prefix}-r")

    async def open_store(self, *, retention: Any = None) -> Any:
        return await RedisStore.open(
            self.url, prefix=f"{self.prefix}-r", check_persistence=False, retention=retention
        )


async def kill_clients(admin: Any, name: str) -> int:
    """``CLIENT KILL`` every connection named ``name``; how many were killed."""
    killed = 0
    for client in await admin.client_list():
        if client.get("name") == name:
            killed += int(await admin.execute_command("CLIENT", "KILL", "ID", client["id"]))
    return killed


@pytest.fixture
def client_name() -> str:
    return f"scope-test-{uuid.uuid4().hex[:12]}"


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "http://host", "localhost:6379"])
async def test_invalid_url_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="url"):
        await RedisStore.open(bad)


async def test_a_url_that_is_no_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="url must be a string, got int"):
        await RedisStore.open(42)  # type: ignore[arg-type]


# -- key layout ---------------------------------------------------------------------------


def hash_tag(key: bytes) -> bytes:
    """The part of a key Redis Cluster hashes: the first ``{...}`` with content."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


async def test_keys_of_a_conversation_share_one_hash_tag(url: str, prefix: str, admin: Any) -> None:
    hostile = ["{braces}", "}{", "a}b{c", "{", "}", "*", "日本語", "x" * 512]
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        for cid in hostile:
            await store.append(batch(cid, "a1"))
        await store.clear("{braces}")
        keys = [key async for key in admin.scan_iter(match=f"{prefix}:*")]
        tags: dict[bytes, set[bytes]] = {}
        for key in keys:
            if key in (
                f"{prefix}:{name}".encode() for name in ("conversations", "schema", "secret")
            ):
                continue
            tags.setdefault(hash_tag(key), set()).add(key)
        # One tag per conversation: the hex of its UTF-8 bytes.
        assert set(tags) == {cid.encode().hex().encode() for cid in hostile}
        # Open conversations have their batches, dedupe record, length and tree (records
        # and append id -> position) under that tag; the cleared one its closure
        # evidence and last length.
        for tag, group in tags.items():
            suffixes = {key.rsplit(b":", 1)[1] for key in group}
            if tag == b"{braces}".hex().encode():
                assert suffixes == {b"closed", b"length"}
            else:
                assert suffixes == {b"batches", b"ids", b"length", b"tree", b"nodes"}


async def test_listing_holds_exactly_the_open_conversations(
    url: str, prefix: str, admin: Any
) -> None:
    """The append and clear scripts keep the listing (one Redis): a clear takes the id
    out in the same step, a refused append never lists it, and listing is one ZRANGE."""
    listing = f"{prefix}:conversations"
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        await store.append(batch("kept", "a1"))
        await store.append(batch("closed", "a1"))
        await store.clear("closed")
        await store.clear("never written")
        with pytest.raises(HistoryChangedError):
            await store.append(Batch("fenced", "a1", batch("x", "y").messages, 3))
        assert await admin.zrange(listing, 0, -1) == [b"kept"]
        assert await store.conversations() == ["kept"]


async def test_listing_written_by_0_1_is_cleaned_once(url: str, prefix: str, admin: Any) -> None:
    listing = f"{prefix}:conversations"
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        await store.append(batch("kept", "a1"))
        await store.append(batch("closed", "a1"))
        await store.clear("closed")
    # scope 0.1 listed an id before its append ran and forgot closed ids only lazily.
    await admin.zadd(listing, {"closed": 0, "never appended": 0})
    await admin.delete(f"{prefix}:schema")
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        assert await store.conversations() == ["kept"]
        assert await admin.zrange(listing, 0, -1) == [b"kept"]
        assert await admin.get(f"{prefix}:schema") == b"3"
        await store.append(batch("never appended", "a1"))
        assert await store.conversations() == ["kept", "never appended"]


async def test_listing_pages_through_many_conversations(url: str, prefix: str, admin: Any) -> None:
    import scope.historystores.redis as module

    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        ids = [f"c{i:04d}" for i in range(25)]
        for cid in ids:
            await store.append(batch(cid, "a1"))
        await store.clear("c0003")
        original = module._PAGE
        module._PAGE = 4  # type: ignore[misc]
        try:
            assert await store.conversations() == [c for c in ids if c != "c0003"]
        finally:
            module._PAGE = original  # type: ignore[misc]


# -- killed clients -----------------------------------------------------------------------


async def test_retry_after_client_killed_after_commit_lands_once(
    url: str,
    prefix: str,
    admin: Any,
    client_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The append script runs, then the connection is killed before the reply is read:
    the store retries on a fresh connection and the dedupe record answers."""
    original = RedisStore._call
    killed: list[int] = []

    async def lose_the_reply(self: RedisStore, fn: Callable[[], Awaitable[Any]], what: str) -> Any:
        async def commit_then_die() -> Any:
            result = await fn()  # applied
            if what.startswith("append") and not killed:
                killed.append(await kill_clients(admin, client_name))
                raise redis.exceptions.ConnectionError("Connection closed by server.")
            return result

        return await original(self, commit_then_die, what)

    async with await RedisStore.open(
        url, prefix=prefix, check_persistence=False, client_name=client_name
    ) as store:
        monkeypatch.setattr(RedisStore, "_call", lose_the_reply)
        b = batch("c", "a1")
        assert await store.append(b) == b.receipt()
        assert killed and killed[0] >= 1
        assert await store.append(b) == b.receipt()
        assert texts(await store.read("c")) == ["hello", "hello!"]


async def test_every_connection_killed_between_calls(
    url: str, prefix: str, admin: Any, client_name: str
) -> None:
    async with await RedisStore.open(
        url, prefix=prefix, check_persistence=False, client_name=client_name
    ) as store:
        first = batch("c", "a1")
        await store.append(first)
        assert await kill_clients(admin, client_name) >= 1
        assert await store.append(first) == first.receipt()
        assert await kill_clients(admin, client_name) >= 1
        await store.append(batch("c", "a2", "more"))
        assert await kill_clients(admin, client_name) >= 1
        assert texts(await store.read("c")) == ["hello", "hello!", "more", "more!"]
        assert await kill_clients(admin, client_name) >= 1
        await store.clear("other")
        assert await store.conversations() == ["c"]


# -- corruption -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        b"garbage without newlines",
        b"sha256:00\na1\n[]",
        b"\xff\xfe\n\xff\n[]",
    ],
    ids=["unframed", "bad-digest", "not-text"],
)
async def test_corrupt_record_is_reported_naming_the_conversation(
    url: str, prefix: str, admin: Any, record: bytes
) -> None:
    cid = "victim {x}*"
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        await store.append(batch(cid, "a1"))
        await store.append(batch("bystander", "a1"))
        key = f"{prefix}:{{{cid.encode().hex()}}}:batches"
        await admin.lset(key, 0, record)
        with pytest.raises(StoreError, match="corrupt") as info:
            await store.read(cid)
        assert f"conversation {cid!r}" in str(info.value)
        with pytest.raises(StoreError, match="corrupt") as batches_info:
            await store.read_batches(cid)
        assert str(batches_info.value) == str(info.value)
        assert texts(await store.read("bystander")) == ["hello", "hello!"]
        assert await store.read_batches("bystander") == [batch("bystander", "a1")]


async def test_flipped_byte_is_reported(url: str, prefix: str, admin: Any) -> None:
    async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as store:
        await store.append(batch("c", "a1"))
        key = f"{prefix}:{{{b'c'.hex()}}}:batches"
        stored = await admin.lindex(key, 0)
        await admin.lset(key, 0, stored.replace(b"hello", b"jello"))
        with pytest.raises(StoreError, match="digest"):
            await store.read("c")


# -- persistence and bounded waits --------------------------------------------------------


class FakeRedis:
    """A loopback server speaking just enough RESP: PING, CLIENT ..., and CONFIG GET
    answered from ``config`` (or refused with ``config_error``); every other command is
    never answered (a stalled server or network)."""

    def __init__(self, config: dict[str, str] | None, config_error: str = "") -> None:
        self.config = config or {}
        self.config_error = config_error
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.url = ""
        #: The commands never answered, in the order they came.
        self.stalled: list[list[str]] = []

    async def __aenter__(self) -> FakeRedis:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}/0"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while True:
                header = await reader.readline()
                if not header:
                    return
                assert header.startswith(b"*"), header
                args = []
                for _ in range(int(header[1:])):
                    size = int((await reader.readline())[1:])
                    args.append((await reader.readexactly(size + 2))[:-2].decode("latin-1"))
                reply = self._reply([a.upper() if i == 0 else a for i, a in enumerate(args)])
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    def _reply(self, args: list[str]) -> bytes | None:
        if args[0] == "HELLO":  # RESP3, redis-py's default protocol
            return b"%1\r\n$5\r\nproto\r\n:3\r\n"
        if args[0] == "PING":
            return b"+PONG\r\n"
        if args[0] in ("CLIENT", "SET"):  # SET NX of the store secret at open
            return b"+OK\r\n"
        if args[0] == "GET" and args[1].endswith(":secret"):
            return b"$32\r\n" + b"s" * 32 + b"\r\n"
        if args[0] == "EXISTS" and args[1].endswith(":{imported}:tombstones"):
            return b":0\r\n"  # no imported tombstones (read at open)
        if args[0] == "CONFIG":
            if self.config_error:
                return f"-{self.config_error}\r\n".encode()
            value = self.config.get(args[2], "").encode()
            name = args[2].encode()
            return b"%%1\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                len(name),
                name,
                len(value),
                value,
            )
        self.stalled.append(args)
        return None  # stalled


async def test_socket_timeout_raises_store_error_once_not_retried() -> None:
    async with (
        FakeRedis({"appendonly": "yes"}) as fake,
        await RedisStore.open(fake.url, socket_timeout=0.3) as store,
    ):
        start = time.monotonic()
        with pytest.raises(StoreError) as info:
            await store.append(batch("c", "a1"))
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert "append to conversation 'c' timed out after 0.3 s (socket_timeout)" in message
        assert isinstance(info.value.__cause__, redis.exceptions.TimeoutError)
        assert elapsed >= 0.25, elapsed  # it waited for the timeout
        # One command sent and never answered: a timeout is not retried (counted, not
        # timed: a busy machine may take longer than one timeout to get there).
        assert len(fake.stalled) == 1, fake.stalled
        with pytest.raises(StoreError, match="read of conversation 'c' timed out"):
            await store.read("c")


async def test_timeout_with_the_reply_lost_then_the_retry_lands_once(url: str, prefix: str) -> None:
    """The append script runs on the real server but its reply is held back: the client
    times out after socket_timeout (once, not retried); the retry of the same batch is
    answered from the dedupe record and the batch is stored once."""
    parts = urlsplit(url)
    async with StallingProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
        proxied = f"redis://127.0.0.1:{proxy.port}{parts.path}"
        async with await RedisStore.open(
            proxied, prefix=prefix, check_persistence=False, socket_timeout=0.3
        ) as store:
            await store.append(batch("c", "a1"))
            second = batch("c", "a2", "second")
            proxy.hold_replies()
            start = time.monotonic()
            with pytest.raises(StoreError, match="append to conversation 'c' timed out"):
                await store.append(second)
            elapsed = time.monotonic() - start
            assert 0.25 <= elapsed < 0.55, elapsed
            proxy.release_replies()
            # It ran: the script's reply was lost, not the script.
            assert texts(await store.read("c")) == ["hello", "hello!", "second", "second!"]
            assert await store.append(second) == second.receipt()
            assert texts(await store.read("c")) == ["hello", "hello!", "second", "second!"]


@pytest.mark.parametrize(
    ("config", "consequence"),
    [
        ({"appendonly": "no", "save": ""}, "does not persist data"),
        ({"appendonly": "no", "save": "3600 1 300 100"}, "persists only RDB snapshots"),
    ],
)
async def test_persistence_warning_and_refusal(config: dict[str, str], consequence: str) -> None:
    async with FakeRedis(config) as fake:
        with pytest.warns(ScopeWarning, match=consequence) as caught:
            store = await RedisStore.open(fake.url)
        await store.aclose()
        message = str(caught[0].message)
        assert "a restart loses" in message and "appendonly yes" in message
        assert "require_durable=True" in message
        assert caught[0].filename == __file__  # points at the caller of open()
        with pytest.raises(StoreError, match=f"{consequence}.*refused \\(require_durable=True\\)"):
            await RedisStore.open(fake.url, require_durable=True)


async def test_open_store_warns_at_its_caller_and_passes_require_durable() -> None:
    from scope.historystores import open_store

    async with FakeRedis({"appendonly": "no", "save": ""}) as fake:
        with pytest.warns(ScopeWarning, match="does not persist data") as caught:
            store = await open_store(fake.url)
        await store.aclose()
        assert caught[0].filename == __file__  # not scope/historystores/__init__.py
        with pytest.warns(ScopeWarning, match="does not persist data") as caught:
            async with open_store(fake.url) as store:
                assert not store.closed
        assert caught[0].filename == __file__
        assert store.closed  # the block closed it
        with pytest.raises(StoreError, match="refused \\(require_durable=True\\)"):
            await open_store(fake.url, require_durable=True)


async def test_persistence_unknown_when_config_is_not_permitted() -> None:
    error = "NOPERM this user has no permissions to run the 'config|get' command"
    async with FakeRedis(None, config_error=error) as fake:
        with pytest.warns(ScopeWarning, match="cannot check persistence.*NoPermissionError"):
            store = await RedisStore.open(fake.url)
        await store.aclose()
        with pytest.raises(StoreError, match=r"cannot check persistence.*require_durable"):
            await RedisStore.open(fake.url, require_durable=True)


async def test_durable_server_opens_without_a_warning() -> None:
    # Warnings are errors in this suite: a warning here would fail the test.
    async with (
        FakeRedis({"appendonly": "yes", "save": ""}) as fake,
        await RedisStore.open(fake.url, require_durable=True) as store,
    ):
        assert not store.closed


async def test_persistence_skipped_on_request_and_contradiction_refused() -> None:
    async with (
        FakeRedis({"appendonly": "no", "save": ""}) as fake,
        await RedisStore.open(fake.url, check_persistence=False) as store,
    ):
        assert not store.closed
    with pytest.raises(ValueError, match="require_durable=True needs check_persistence"):
        await RedisStore.open(
            "redis://nowhere.invalid:1/0", check_persistence=False, require_durable=True
        )


async def test_persistence_check_against_the_real_server(url: str, admin: Any) -> None:
    aof = (await admin.config_get("appendonly"))["appendonly"]
    if aof == "yes":
        async with await RedisStore.open(url, require_durable=True):
            pass
    else:  # CI's server: --save "" --appendonly no
        with pytest.warns(ScopeWarning, match=f"appendonly {aof}") as caught:
            store = await RedisStore.open(url)
        await store.aclose()
        assert "a restart loses" in str(caught[0].message)
        with pytest.raises(StoreError, match="refused"):
            await RedisStore.open(url, require_durable=True)


# -- error mapping ----------------------------------------------------------------------


async def test_timeout_without_socket_timeout_is_still_a_store_error(url: str, prefix: str) -> None:
    async with await RedisStore.open(
        url, prefix=prefix, check_persistence=False, socket_timeout=None
    ) as store:

        async def fail() -> None:
            raise redis.exceptions.TimeoutError("injected")

        with pytest.raises(StoreError, match=r"^Redis test timed out: TimeoutError: injected"):
            await store._call(fail, "test")
