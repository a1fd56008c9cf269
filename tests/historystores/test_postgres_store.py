"""PostgresStore against a real server: conformance (with reopen), dropped connections,
corruption and validation. asyncio only (asyncpg is asyncio-only). The rules every
persistent store keeps are checked on every backend in tests/historystores/test_backends.py.

Needs ``SCOPE_TEST_POSTGRES_DSN`` (see tests/servers.py); skipped without it unless
``SCOPE_REQUIRE_SERVERS=1``. Every test works under its own table prefix and drops it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    StoreError,
)
from scope.history import Batch
from scope.history.storetest import StoreConformance
from scope.historystores.postgres import PostgresStore
from tests.helpers import batch, texts
from tests.servers import (
    StallingProxy,
    drop_tables,
    import_driver,
    postgres_dsn_or_skip,
    unique_table_prefix,
)

asyncpg = import_driver("asyncpg")

pytestmark = [pytest.mark.anyio, pytest.mark.servers]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def dsn() -> str:
    return postgres_dsn_or_skip()


@pytest.fixture
async def prefix(dsn: str) -> AsyncIterator[str]:
    prefix = unique_table_prefix()
    yield prefix
    await drop_tables(dsn, prefix)


class TestPostgresConformance(StoreConformance):
    @pytest.fixture
    async def store(self, dsn: str, prefix: str) -> AsyncIterator[PostgresStore]:
        async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
            self.dsn = dsn
            yield store

    async def reopen(self, store: Any) -> Any:
        return await PostgresStore.open(self.dsn, table_prefix=store.table_prefix)

    @pytest.fixture(autouse=True)
    async def _retention_prefix(self, dsn: str) -> AsyncIterator[None]:
        self._retention_tables = unique_table_prefix()
        self.dsn = dsn
        yield
        await drop_tables(dsn, self._retention_tables)

    async def open_store(self, *, retention: Any = None) -> Any:
        return await PostgresStore.open(
            self.dsn, table_prefix=self._retention_tables, retention=retention
        )


async def admin(dsn: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def terminate(dsn: str, application_name: str) -> int:
    """Kill every server session of ``application_name``; how many were killed."""
    rows = await admin(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        application_name,
    )
    return sum(1 for row in rows if row[0])


async def until_waiting_for_a_lock(dsn: str, application_name: str, then: str = "*") -> None:
    """Poll until a session of ``application_name`` waits for a lock (at most 10 s);
    ``then="pg_cancel_backend(pid)"`` cancels the waiting statements."""
    with anyio.fail_after(10):
        while True:
            await anyio.sleep(0.02)
            rows = await admin(
                dsn,
                f"SELECT count({then}) FROM pg_stat_activity "
                "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                application_name,
            )
            if rows[0][0]:
                return


@pytest.fixture
def app_name() -> str:
    return f"scope-test-{uuid.uuid4().hex[:12]}"


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_size": -1}, "min_size"),
        ({"max_size": 0}, "max_size"),
        ({"min_size": 5, "max_size": 2}, "min_size"),
    ],
)
async def test_invalid_pool_sizes_are_value_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        await PostgresStore.open("postgresql://nowhere.invalid/db", **kwargs)


@pytest.mark.parametrize("kwargs", [{"max_size": True}, {"min_size": "1"}])
async def test_pool_sizes_of_the_wrong_type_are_type_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"(max|min)_size must be an integer"):
        await PostgresStore.open("postgresql://nowhere.invalid/db", **kwargs)


@pytest.mark.parametrize("dsn_value", ["", "postgresql://host:notaport/db"])
async def test_invalid_dsn_is_a_value_error(dsn_value: str) -> None:
    with pytest.raises(ValueError, match=r"invalid PostgreSQL DSN|dsn must be"):
        await PostgresStore.open(dsn_value)


@pytest.mark.parametrize(
    "dsn_value",
    ["postgresql://host:notaport/db", "postgresql://scope@127.0.0.1:1/postgres?sslmode=bogus"],
)
async def test_invalid_dsn_is_a_value_error_with_an_empty_pool(dsn_value: str) -> None:
    # min_size=0: the pool makes its first connection only for the schema; a DSN asyncpg
    # cannot parse is still a ValueError, not a StoreError.
    with pytest.raises(ValueError, match=r"invalid PostgreSQL DSN") as info:
        await PostgresStore.open(dsn_value, min_size=0)
    assert not isinstance(info.value, StoreError)


async def test_schema_creation_is_safe_when_many_open_at_once(dsn: str, prefix: str) -> None:
    stores: list[PostgresStore] = []

    async def open_one() -> None:
        stores.append(await PostgresStore.open(dsn, table_prefix=prefix, max_size=1))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(open_one)
    try:
        for i, store in enumerate(stores):
            await store.append(batch("c", f"a{i}"))
        assert len(await stores[0].read("c")) == 12
    finally:
        for store in stores:
            await store.aclose()


# -- dropped connections -----------------------------------------------------------------


async def test_retry_after_connection_killed_after_commit_lands_once(
    dsn: str, prefix: str, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append commits, then its session is terminated before the client reads the
    reply: the store retries on a fresh connection and the dedupe record answers."""
    original = PostgresStore._with_connection
    killed: list[int] = []

    async def lose_the_reply(
        self: PostgresStore, fn: Callable[[Any], Awaitable[Any]], what: str, **options: Any
    ) -> Any:
        async def commit_then_die(conn: Any) -> Any:
            result = await fn(conn)  # committed
            if what.startswith("append") and not killed:
                killed.append(await terminate(dsn, app_name))
                await conn.fetchval("SELECT 1")  # the dead session: a real driver error
            return result

        return await original(self, commit_then_die, what, **options)

    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        monkeypatch.setattr(PostgresStore, "_with_connection", lose_the_reply)
        b = batch("c", "a1")
        assert await store.append(b) == b.receipt()
        assert killed and killed[0] >= 1
        # The host's own retry of the same batch is answered from the dedupe record too.
        assert await store.append(b) == b.receipt()
        assert texts(await store.read("c")) == ["hello", "hello!"]


@pytest.mark.parametrize("move_id", [None, "m1"])
async def test_head_move_retried_after_connection_killed_after_commit(
    dsn: str, prefix: str, app_name: str, monkeypatch: pytest.MonkeyPatch, move_id: str | None
) -> None:
    """A head move commits, then its session is terminated before the client reads the
    reply: the store's retry on a fresh connection answers the move (from its move id,
    or, without one, because the head is already the target), not the fence."""
    original = PostgresStore._with_connection
    killed: list[int] = []

    async def lose_the_reply(
        self: PostgresStore, fn: Callable[[Any], Awaitable[Any]], what: str, **options: Any
    ) -> Any:
        async def commit_then_die(conn: Any) -> Any:
            result = await fn(conn)  # committed
            if what.startswith("head move") and not killed:
                killed.append(await terminate(dsn, app_name))
                await conn.fetchval("SELECT 1")  # the dead session: a real driver error
            return result

        return await original(self, commit_then_die, what, **options)

    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        await store.append(batch("c", "a1"))
        await store.append(batch("c", "a2"))
        monkeypatch.setattr(PostgresStore, "_with_connection", lose_the_reply)
        assert await store.move_head("c", "a1", expected_head="a2", move_id=move_id) == 2
        assert killed and killed[0] >= 1
        assert (await store.read_view("c")).head == "a1"
        # A second move from the old head is refused by the fence, as it must be.
        with pytest.raises(HistoryChangedError):
            await store.move_head("c", "a1", expected_head="a2")


async def test_every_pooled_connection_killed_between_calls(
    dsn: str, prefix: str, app_name: str
) -> None:
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, min_size=3, max_size=3
    ) as store:
        first = batch("c", "a1")
        await store.append(first)
        assert await terminate(dsn, app_name) >= 1
        assert await store.append(first) == first.receipt()
        assert await terminate(dsn, app_name) >= 1
        await store.append(batch("c", "a2", "more"))
        assert await terminate(dsn, app_name) >= 1
        assert texts(await store.read("c")) == ["hello", "hello!", "more", "more!"]
        assert await terminate(dsn, app_name) >= 1
        assert await store.conversations() == ["c"]


async def test_connection_killed_while_append_waits_for_the_row_lock(
    dsn: str, prefix: str, app_name: str
) -> None:
    """The append's session dies mid-transaction: the transaction rolls back on the server,
    the store retries on a fresh connection, and the batch lands exactly once."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        await store.append(batch("c", "a1"))
        locker = await asyncpg.connect(dsn)
        try:
            tr = locker.transaction()
            await tr.start()
            await locker.execute(
                f'SELECT 1 FROM "{prefix}_conversations" WHERE id = $1 FOR UPDATE', "c"
            )
            second = batch("c", "a2", "second")
            receipts: list[Any] = []

            async def append() -> None:
                receipts.append(await store.append(second))

            async with anyio.create_task_group() as tg:
                tg.start_soon(append)
                await until_waiting_for_a_lock(dsn, app_name)
                assert await terminate(dsn, app_name) >= 1
                await tr.rollback()
        finally:
            await locker.close()
        assert receipts == [second.receipt()]
        assert texts(await store.read("c")) == ["hello", "hello!", "second", "second!"]


# -- bounded waits ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["command_timeout", "acquire_timeout"])
@pytest.mark.parametrize(
    "bad", [0, -1, float("nan"), float("inf"), pytest.param(10**400, id="10**400")]
)
async def test_invalid_timeouts_are_value_errors(name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=name):
        await PostgresStore.open("postgresql://nowhere.invalid/db", **{name: bad})


@pytest.mark.parametrize("name", ["command_timeout", "acquire_timeout", "connect_timeout"])
@pytest.mark.parametrize("bad", [True, "1"])
async def test_timeouts_of_the_wrong_type_are_type_errors(name: str, bad: Any) -> None:
    with pytest.raises(TypeError, match=f"{name} must be a number of seconds"):
        await PostgresStore.open("postgresql://nowhere.invalid/db", **{name: bad})


@asynccontextmanager
async def held(dsn: str, *statements: str) -> AsyncIterator[None]:
    """Another session runs ``statements`` in a transaction and holds it open."""
    conn = await asyncpg.connect(dsn)
    try:
        tr = conn.transaction()
        await tr.start()
        for statement in statements:
            await conn.execute(statement)
        try:
            yield
        finally:
            await tr.rollback()
    finally:
        await conn.close()


async def timed(call: Awaitable[Any]) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        await call
    except StoreError as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


async def test_append_behind_a_held_row_lock_times_out_writing_nothing(
    dsn: str, prefix: str
) -> None:
    async with await PostgresStore.open(dsn, table_prefix=prefix, command_timeout=0.3) as store:
        await store.append(batch("c", "a1"))
        second = batch("c", "a2", "second")
        lock = f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
        async with held(dsn, lock):
            error, elapsed = await timed(store.append(second))
            assert error is not None
            message = str(error)
            assert "append to conversation 'c' timed out (command_timeout=0.3 s)" in message
            assert "rolled its transaction back, nothing of it was written" in message
            assert isinstance(error.__cause__, asyncpg.exceptions.QueryCanceledError)
            # One bounded wait, not retried (a retry would wait as long again).
            assert 0.25 <= elapsed < 0.55, elapsed
            assert texts(await store.read("c")) == ["hello", "hello!"]  # reads are not blocked
        # Nothing of the batch was written: the retry lands once.
        assert await store.append(second) == second.receipt()
        assert await store.append(second) == second.receipt()
        assert texts(await store.read("c")) == ["hello", "hello!", "second", "second!"]


async def test_statement_cancelled_by_an_operator_is_reported_not_retried(
    dsn: str, prefix: str, app_name: str
) -> None:
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        await store.append(batch("c", "a1"))
        second = batch("c", "a2", "second")
        lock = f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
        async with held(dsn, lock), anyio.create_task_group() as tg:
            errors: list[StoreError] = []

            async def append() -> None:
                with pytest.raises(StoreError) as info:
                    await store.append(second)
                errors.append(info.value)

            tg.start_soon(append)
            await until_waiting_for_a_lock(dsn, app_name, "pg_cancel_backend(pid)")
        assert "append to conversation 'c' was cancelled" in str(errors[0])
        assert "user request" in str(errors[0])
        assert "retried on a fresh connection" not in str(errors[0])  # one attempt
        assert isinstance(errors[0].__cause__, asyncpg.exceptions.QueryCanceledError)
        assert await store.read_batches("c") == [batch("c", "a1")]
        assert await store.append(second) == second.receipt()


async def test_cancelled_append_returns_once_its_outcome_is_settled(
    dsn: str, prefix: str, app_name: str
) -> None:
    """A cancelled append waits for its statement before it raises: when the cancelled
    call returns, the batch has landed (here: the lock went and it committed), so the
    same task's next read sees it and its next fence counts it."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        await store.append(batch("c", "a1"))
        second = batch("c", "a2", "second")
        lock = f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
        conn = await asyncpg.connect(dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            await conn.execute(lock)
            task = asyncio.ensure_future(store.append(second))
            await until_waiting_for_a_lock(dsn, app_name)
            task.cancel()
            await asyncio.sleep(0.3)
            assert not task.done()  # still settling: the statement waits for the lock
            await tr.rollback()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Settled: committed before the cancellation was delivered.
            assert await store.read_batches("c") == [batch("c", "a1"), second]
        finally:
            await conn.close()


@pytest.mark.parametrize("step", ["acquire_turn", "acquire_turn_view", "release_turn"])
async def test_cancelled_lease_step_returns_once_its_outcome_is_settled(
    dsn: str, prefix: str, app_name: str, step: str
) -> None:
    """A cancelled lease step waits for its statement as an append does: when the
    cancelled call returns, the lease was taken (or released), so a release (or acquire)
    the same task makes next comes after it and is never overtaken by it."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name
    ) as store:
        holder = "h" if step == "release_turn" else "before"
        assert await store.acquire_turn("c", holder, 30 if step == "release_turn" else 0.01)
        await asyncio.sleep(0.05)  # "before" expired: the step takes its lease
        call = (
            store.release_turn("c", "h")
            if step == "release_turn"
            else getattr(store, step)("c", "h", 30)
        )
        lock = f"SELECT 1 FROM \"{prefix}_leases\" WHERE conversation_id = 'c' FOR UPDATE"
        conn = await asyncpg.connect(dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            await conn.execute(lock)
            task = asyncio.ensure_future(call)
            await until_waiting_for_a_lock(dsn, app_name)
            task.cancel()
            await asyncio.sleep(0.3)
            assert not task.done()  # still settling: the statement waits for the lock
            await tr.rollback()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await conn.close()
        # Settled: the step committed before the cancellation was delivered.
        if step == "release_turn":
            assert await store.acquire_turn("c", "other", 30) is True
        else:
            assert await store.acquire_turn("c", "other", 30) is False
            assert await store.release_turn("c", "h") is True


async def test_cancelled_append_that_cannot_land_is_settled_within_the_timeout(
    dsn: str, prefix: str, app_name: str
) -> None:
    """A cancelled append whose statement the server times out returns after about
    ``command_timeout``, and its batch never lands."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, command_timeout=3.0
    ) as store:
        await store.append(batch("c", "a1"))
        lock = f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
        async with held(dsn, lock):
            task = asyncio.ensure_future(store.append(batch("c", "a2", "second")))
            await until_waiting_for_a_lock(dsn, app_name)
            start = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - start < 3.0 + 1.0
        assert await store.read_batches("c") == [batch("c", "a1")]


async def test_every_operation_behind_a_held_table_lock_times_out(dsn: str, prefix: str) -> None:
    async with await PostgresStore.open(dsn, table_prefix=prefix, command_timeout=0.3) as store:
        first = batch("c", "a1")
        await store.append(first)
        second = batch("c", "a2", "second")
        lock = f'LOCK TABLE "{prefix}_batches" IN ACCESS EXCLUSIVE MODE'
        async with held(dsn, lock):
            calls: list[tuple[str, Awaitable[Any]]] = [
                ("append to conversation 'c'", store.append(second)),
                ("read of conversation 'c'", store.read("c")),
                ("read of conversation 'c'", store.read_batches("c")),
                ("clear of conversation 'c'", store.clear("c")),
            ]
            for what, call in calls:
                error, elapsed = await timed(call)
                assert error is not None and what in str(error), (what, error)
                assert 0.25 <= elapsed < 0.55, (what, elapsed)
        # Neither the append nor the clear left anything behind.
        assert await store.read_batches("c") == [first]
        assert await store.append(second) == second.receipt()
        assert await store.read_batches("c") == [first, second]


async def test_exhausted_pool_times_out_waiting_for_a_connection(dsn: str, prefix: str) -> None:
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, min_size=1, max_size=1, acquire_timeout=0.3
    ) as store:
        await store.append(batch("c", "a1"))
        blocked = batch("c", "a2", "blocked")
        lock = f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
        async with anyio.create_task_group() as tg, held(dsn, lock):
            # The pool's only connection waits behind the lock inside this append.
            tg.start_soon(store.append, blocked)
            await anyio.sleep(0.1)
            error, elapsed = await timed(store.read("other"))
            assert error is not None
            assert "read of conversation 'other'" in str(error)
            assert "waiting for a pool connection" in str(error)
            assert "acquire_timeout=0.3" in str(error) and "max_size=1" in str(error)
            assert 0.25 <= elapsed < 0.55, elapsed
            # Leaving the block rolled the lock back; the blocked append then lands.
        assert texts(await store.read("c")) == ["hello", "hello!", "blocked", "blocked!"]


async def test_a_server_that_does_not_answer_is_bounded_client_side(dsn: str, prefix: str) -> None:
    """The server's statement_timeout is switched off for one statement: the client's own
    bound (command_timeout + 1 s) ends the wait, and the store stays usable."""
    async with await PostgresStore.open(dsn, table_prefix=prefix, command_timeout=0.3) as store:

        async def silent(conn: Any) -> None:
            await conn.execute("SET statement_timeout = 0")
            await conn.execute("SELECT pg_sleep(5)")

        error, elapsed = await timed(store._with_connection(silent, "test"))
        assert error is not None and "waiting for the server's answer" in str(error)
        assert isinstance(error.__cause__, TimeoutError)
        assert 1.2 <= elapsed < 2.5, elapsed
        await store.append(batch("c", "a1"))
        assert texts(await store.read("c")) == ["hello", "hello!"]


async def test_a_stalled_server_is_bounded_by_command_timeout_plus_one_second(
    dsn: str, prefix: str
) -> None:
    """Behind a proxy that stops passing the server's replies (a stopped server, a dead
    network), an append raises ``StoreError`` after command_timeout + 1 s, the bound the
    docs give, not later."""
    parts = urlsplit(dsn)
    async with StallingProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{proxy.port}"
        proxied = parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
        async with await PostgresStore.open(
            urlunsplit(proxied), table_prefix=prefix, command_timeout=1.0
        ) as store:
            await store.append(batch("c", "a1"))
            proxy.hold_replies()
            error, elapsed = await timed(store.append(batch("c", "a2", "second")))
            assert error is not None and "waiting for the server's answer" in str(error)
            assert 1.9 <= elapsed < 2.7, elapsed  # it was 3 s (and 4 s here) before
            proxy.release_replies()


# -- corruption -------------------------------------------------------------------------


async def test_corrupt_record_is_reported_naming_the_conversation(dsn: str, prefix: str) -> None:
    async with await PostgresStore.open(dsn, table_prefix=prefix) as store:
        await store.append(batch("victim;'%", "a1"))
        await store.append(batch("bystander", "a1"))
        await admin(
            dsn,
            f'UPDATE "{prefix}_batches" SET messages = $1 WHERE conversation_id = $2',
            b'[{"role":"user"}]',
            "victim;'%",
        )
        with pytest.raises(StoreError, match="corrupt") as info:
            await store.read("victim;'%")
        assert 'conversation "victim;\'%"' in str(info.value)
        assert "digest" in str(info.value)
        with pytest.raises(StoreError, match="corrupt") as batches_info:
            await store.read_batches("victim;'%")
        assert str(batches_info.value) == str(info.value)
        assert texts(await store.read("bystander")) == ["hello", "hello!"]
        assert await store.read_batches("bystander") == [batch("bystander", "a1")]


# -- error mapping ----------------------------------------------------------------------


# -- group commit -------------------------------------------------------------------------


async def lock_waiters(dsn: str, application_name: str) -> int:
    """How many sessions of ``application_name`` wait for a lock now."""
    rows = await admin(
        dsn,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = $1 AND wait_event_type = 'Lock'",
        application_name,
    )
    return int(rows[0][0])


async def test_appends_queued_behind_one_in_flight_go_as_one_group(
    dsn: str, prefix: str, app_name: str
) -> None:
    """While an append of a conversation is in flight, the handle's later appends to it
    queue instead of each waiting on the row lock in the server; then they are sent
    together, and each gets the outcome it would get alone, in arrival order: a retry of
    a batch queued before it is accepted, a fence counts the batches queued before it."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        await store.append(batch("c", "a1"))
        conn = await asyncpg.connect(dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            await conn.execute(
                f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'c' FOR UPDATE"
            )
            first = asyncio.ensure_future(store.append(batch("c", "a2", "two")))
            await until_waiting_for_a_lock(dsn, app_name)
            queued = [
                batch("c", "a3", "three"),
                batch("c", "a3", "three"),  # a retry of the one before it
                Batch("c", "a4", batch("c", "a4", "four").messages, expected_length=6),  # counts a3
                Batch("c", "a5", batch("c", "a5", "five").messages, expected_length=2),  # stale
                batch("c", "a6", "six"),
            ]
            tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
            await asyncio.sleep(0.3)
            assert await lock_waiters(dsn, app_name) == 1  # only the one in flight
            assert not any(t.done() for t in tasks)
            await tr.rollback()
            assert await first == batch("c", "a2", "two").receipt()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await conn.close()
        assert outcomes[:3] == [queued[0].receipt(), queued[0].receipt(), queued[2].receipt()]
        assert isinstance(outcomes[3], HistoryChangedError)
        assert outcomes[4] == queued[4].receipt()
        stored = [str(b.id) for b in await store.read_batches("c")]
        assert stored == ["a1", "a2", "a3", "a4", "a6"]


# -- group commit across conversations -----------------------------------------------------


async def until_lock_waiters(dsn: str, application_name: str, count: int) -> None:
    """Poll until ``count`` sessions of ``application_name`` wait for a lock (at most
    10 s: a guard against a hang, not a timing the test depends on)."""
    with anyio.fail_after(10):
        while True:
            await anyio.sleep(0.02)
            if await lock_waiters(dsn, application_name) == count:
                return


@asynccontextmanager
async def both_slots_held(
    store: PostgresStore, dsn: str, prefix: str, app_name: str
) -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Fill the handle's two append slots: an outside transaction holds the rows of
    conversations ``x1`` and ``x2`` (appended to here first), and an append to each
    waits for its lock in the server. Appends made inside the block queue in the
    handle; on exit the outside transaction rolls back, so the two appends and then the
    queued ones go. Yields the two appends' tasks."""
    for cid in ("x1", "x2"):
        await store.append(batch(cid, "a1"))
    conn = await asyncpg.connect(dsn)
    try:
        tr = conn.transaction()
        await tr.start()
        await conn.execute(
            f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id IN ('x1', 'x2') FOR UPDATE"
        )
        held = [asyncio.ensure_future(store.append(batch(cid, "a2"))) for cid in ("x1", "x2")]
        await until_lock_waiters(dsn, app_name, 2)
        try:
            yield held
        finally:
            await tr.rollback()
    finally:
        await conn.close()
    assert await asyncio.gather(*held) == [batch(c, "a2").receipt() for c in ("x1", "x2")]


async def transactions_of(dsn: str, prefix: str, rows: list[tuple[str, str]]) -> int:
    """How many transactions inserted the batches ``rows`` ((conversation, append id)
    pairs): their rows' distinct ``xmin``."""
    found = await admin(
        dsn,
        f'SELECT conversation_id, append_id, xmin::text FROM "{prefix}_batches" '
        "WHERE (conversation_id, append_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
        [c for c, _ in rows],
        [a for _, a in rows],
    )
    assert len(found) == len(rows)
    return len({r[2] for r in found})


async def settle_queue() -> None:
    """Let every task started so far run to its first wait (an append to its place in
    the queue: nothing before it awaits I/O)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_appends_of_many_conversations_queued_go_as_one_statement(
    dsn: str, prefix: str, app_name: str
) -> None:
    """While the handle's two slots are busy, appends to other conversations queue, then
    go together as one statement, one transaction (their rows share one xmin). Each
    appended alone would be a transaction of its own."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        await store.append(batch("c3", "a0"))  # one conversation with a row already
        queued = [batch(f"c{i}", "a1", f"t{i}") for i in (5, 2, 4, 1, 3)]
        async with both_slots_held(store, dsn, prefix, app_name):
            tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
            await settle_queue()
            assert await lock_waiters(dsn, app_name) == 2  # only the two in flight
            assert not any(t.done() for t in tasks)
        assert await asyncio.gather(*tasks) == [b.receipt() for b in queued]
        rows = [(str(b.conversation_id), "a1") for b in queued]
        assert await transactions_of(dsn, prefix, rows) == 1
        for b in queued:
            assert await store.read_batches(b.conversation_id) == (
                [batch("c3", "a0"), b] if b.conversation_id == "c3" else [b]
            )


async def test_one_group_mixes_outcomes_each_as_alone(dsn: str, prefix: str, app_name: str) -> None:
    """One group holding a closed conversation, a conflict, a retry, a stale fence and
    a fence counting the batch queued before it: each append gets what it would get
    alone, and the ones that land share the group's transaction."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        await store.clear("shut")
        await store.append(batch("d", "a1"))
        await store.append(batch("e", "a1"))
        queued = [
            batch("shut", "a1"),
            batch("d", "a1", "other"),  # a conflict with the stored a1
            batch("d", "a1"),  # a retry of the stored a1
            Batch("e", "a2", batch("e", "a2").messages, expected_length=5),  # stale
            batch("f", "a1"),
            Batch("f", "a2", batch("f", "a2", "two").messages, expected_length=2),
            batch("g", "a1"),
        ]
        async with both_slots_held(store, dsn, prefix, app_name):
            tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
            await settle_queue()
            assert not any(t.done() for t in tasks)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(outcomes[0], ConversationClosedError)
        assert isinstance(outcomes[1], AppendConflictError)
        assert outcomes[2] == queued[2].receipt()
        assert isinstance(outcomes[3], HistoryChangedError)
        assert (outcomes[3].expected, outcomes[3].actual) == (5, 2)
        assert outcomes[4:] == [b.receipt() for b in queued[4:]]
        assert await store.read_batches("shut") == []
        assert await store.read_batches("d") == [batch("d", "a1")]
        assert await store.read_batches("e") == [batch("e", "a1")]
        assert await store.read_batches("f") == [queued[4], queued[5]]
        assert await transactions_of(dsn, prefix, [("f", "a1"), ("f", "a2"), ("g", "a1")]) == 1


async def test_a_server_error_of_one_grouped_append_fails_only_that_one(
    dsn: str, prefix: str, app_name: str
) -> None:
    """A batch the server refuses with an error (here a trigger) rolls its group's
    statement back; each batch is then sent alone: that one raises ``StoreError``, the
    others land."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        refuse = f'"{prefix}_refuse"'
        await admin(
            dsn,
            f"CREATE FUNCTION {refuse}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.append_id = 'boom' THEN RAISE EXCEPTION 'refused by the test'; END IF; "
            "RETURN NEW; END $$",
        )
        try:
            await admin(
                dsn,
                f'CREATE TRIGGER refuse BEFORE INSERT ON "{prefix}_batches" '
                f"FOR EACH ROW EXECUTE FUNCTION {refuse}()",
            )
            queued = [batch("a", "a1"), batch("b", "boom"), batch("b", "a2"), batch("c", "a1")]
            async with both_slots_held(store, dsn, prefix, app_name):
                tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
                await settle_queue()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await admin(dsn, f'DROP TRIGGER IF EXISTS refuse ON "{prefix}_batches"')
            await admin(dsn, f"DROP FUNCTION IF EXISTS {refuse}()")
        assert isinstance(outcomes[1], StoreError)
        assert "refused by the test" in str(outcomes[1])
        assert [outcomes[0], *outcomes[2:]] == [b.receipt() for b in (queued[0], *queued[2:])]
        assert await store.read_batches("a") == [queued[0]]
        assert await store.read_batches("b") == [queued[2]]
        assert await store.read_batches("c") == [queued[3]]


async def test_a_queued_append_cancelled_before_it_is_sent_leaves_nothing(
    dsn: str, prefix: str, app_name: str
) -> None:
    """A caller cancelled while its append waits in the queue gets its cancellation at
    once (the slots are still held) and nothing of its batch is written; the appends
    queued beside it still land."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        async with both_slots_held(store, dsn, prefix, app_name):
            cancelled = asyncio.ensure_future(store.append(batch("c1", "a1")))
            kept = asyncio.ensure_future(store.append(batch("c2", "a1")))
            await settle_queue()
            cancelled.cancel()
            # At once, the slots still held (a hang guard, not a timing).
            with anyio.fail_after(10), pytest.raises(asyncio.CancelledError):
                await cancelled
            assert not kept.done()
            assert await lock_waiters(dsn, app_name) == 2
        assert await kept == batch("c2", "a1").receipt()
        assert await store.read_batches("c1") == []
        assert await store.conversations() == ["c2", "x1", "x2"]
        # Nothing of it is stored: the same id with another batch is no conflict.
        assert (
            await store.append(batch("c1", "a1", "other")) == batch("c1", "a1", "other").receipt()
        )


async def test_group_retried_after_its_connection_killed_after_commit(
    dsn: str, prefix: str, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's statement commits, then its session is terminated before the client
    reads the reply: the store retries the statement on a fresh connection, the dedupe
    records answer, and every caller gets its receipt; each batch is stored once."""
    original = PostgresStore._with_connection
    killed: list[int] = []

    async def lose_the_reply(
        self: PostgresStore, fn: Callable[[Any], Awaitable[Any]], what: str, **options: Any
    ) -> Any:
        async def commit_then_die(conn: Any) -> Any:
            result = await fn(conn)  # committed
            if what.startswith("append of") and not killed:
                killed.append(await terminate(dsn, app_name))
                await conn.fetchval("SELECT 1")  # the dead session: a real driver error
            return result

        return await original(self, commit_then_die, what, **options)

    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        queued = [batch("c1", "a1"), batch("c2", "a1"), batch("c2", "a2", "more")]
        monkeypatch.setattr(PostgresStore, "_with_connection", lose_the_reply)
        async with both_slots_held(store, dsn, prefix, app_name):
            tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
            await settle_queue()
        assert await asyncio.gather(*tasks) == [b.receipt() for b in queued]
        assert killed and killed[0] >= 1
        assert await store.read_batches("c1") == [queued[0]]
        assert await store.read_batches("c2") == queued[1:]
        assert await transactions_of(dsn, prefix, [("c1", "a1"), ("c2", "a1"), ("c2", "a2")]) == 1


async def test_fenced_appends_racing_on_many_conversations_one_wins_each(
    dsn: str, prefix: str, app_name: str
) -> None:
    """Eight tasks per conversation, four conversations, all at once, two rounds: each
    round every task appends with the head it read as ``expected_head`` (and the
    length as ``expected_length``); exactly one per conversation wins each round, the
    others raise ``HistoryChangedError``, and the stored chain is the winners'."""
    conversations = [f"c{i}" for i in range(4)]
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        winners: dict[str, list[str]] = {cid: [] for cid in conversations}
        for r in range(2):
            views = {cid: await store.read_view(cid) for cid in conversations}

            async def append(
                cid: str, t: int, r: int = r, views: dict[str, Any] = views
            ) -> str | None:
                view = views[cid]
                b = Batch(
                    cid,
                    f"r{r}t{t}",
                    batch(cid, "x", f"{cid} r{r} t{t}").messages,
                    expected_length=view.length,
                    expected_head=view.head,
                )
                try:
                    assert await store.append(b) == b.receipt()
                except HistoryChangedError:
                    return None
                return str(b.id)

            results = await asyncio.gather(
                *(append(cid, t) for cid in conversations for t in range(8))
            )
            for i, cid in enumerate(conversations):
                won = [aid for aid in results[i * 8 : (i + 1) * 8] if aid is not None]
                assert len(won) == 1, (cid, won)
                winners[cid] += won
        for cid in conversations:
            assert [str(b.id) for b in await store.read_batches(cid)] == winners[cid]
            assert (await store.read_view(cid)).length == 4


async def test_a_row_held_elsewhere_never_holds_up_the_rest_of_its_group(
    dsn: str, prefix: str, app_name: str
) -> None:
    """Another transaction holds conversation ``y``'s row when its group is sent: the
    group's other appends land at once (the group skips ``y``'s row instead of waiting
    for it), and ``y``'s append is sent alone, waiting for that lock as it would alone,
    and lands once the lock is released."""
    async with await PostgresStore.open(
        dsn, table_prefix=prefix, application_name=app_name, max_size=8
    ) as store:
        await store.append(batch("y", "a1"))
        other = await asyncpg.connect(dsn)
        try:
            tr = other.transaction()
            await tr.start()
            await other.execute(
                f"SELECT 1 FROM \"{prefix}_conversations\" WHERE id = 'y' FOR UPDATE"
            )
            queued = [batch("w", "a1"), batch("y", "a2", "two"), batch("z", "a1")]
            async with both_slots_held(store, dsn, prefix, app_name):
                tasks = [asyncio.ensure_future(store.append(b)) for b in queued]
                await settle_queue()
            with anyio.fail_after(10):  # a hang guard: they must not wait for y's lock
                assert await tasks[0] == queued[0].receipt()
                assert await tasks[2] == queued[2].receipt()
            await until_lock_waiters(dsn, app_name, 1)  # y's append, sent alone
            assert not tasks[1].done()
            await tr.rollback()
            assert await tasks[1] == queued[1].receipt()
        finally:
            await other.close()
        assert [str(b.id) for b in await store.read_batches("y")] == ["a1", "a2"]
        assert await transactions_of(dsn, prefix, [("w", "a1"), ("z", "a1")]) == 1
