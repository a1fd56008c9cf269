"""``PostgresStore``: a history store in PostgreSQL, on asyncpg (extra ``scope-chat[postgres]``).

asyncpg is imported when a store is opened, not when this module is imported. asyncpg is
asyncio-only, so this store runs under asyncio (not trio; use ``SQLiteStore`` there).

Schema version 5 (``{prefix}`` is ``table_prefix``, default ``scope_history``; created or
upgraded by ``open(create=True)`` under a transaction-level advisory lock so processes
opening at once do not race):

    {prefix}_conversations(id TEXT COLLATE "C" PRIMARY KEY, closed BOOLEAN, length BIGINT,
                           head BIGINT, branched BOOLEAN, owner TEXT,
                           expires_at TIMESTAMPTZ, retained BOOLEAN)
        INDEX {prefix}_owners (owner, id), INDEX {prefix}_expiry (expires_at)
    {prefix}_batches(conversation_id TEXT COLLATE "C", seq BIGINT, append_id TEXT,
                     digest TEXT, messages BYTEA, parent BIGINT, created TIMESTAMPTZ,
                     path_length BIGINT)
        PRIMARY KEY (conversation_id, seq), UNIQUE (conversation_id, append_id)
    {prefix}_schema(id INT PRIMARY KEY CHECK (id = 1), version INT)
    {prefix}_leases(conversation_id TEXT COLLATE "C" PRIMARY KEY, holder TEXT,
                    expires TIMESTAMPTZ)                 -- turn leases, the server's clock
    {prefix}_moves(conversation_id TEXT COLLATE "C", move_id TEXT COLLATE "C", head TEXT)
        PRIMARY KEY (conversation_id, move_id)           -- move_head's move ids
    {prefix}_secret(id INT PRIMARY KEY CHECK (id = 1), secret BYTEA)  -- tombstones' key
    {prefix}_tombstones(tombstone TEXT COLLATE "C" PRIMARY KEY, erased_at TIMESTAMPTZ)
    {prefix}_append(cid, aid, digest, messages, count, expected, expected_head, owner,
                    tombstone, retention) -> text        -- one round trip
    {prefix}_acquire_view(cid, holder, ttl, tombstone) -> rows  -- lease + view
    {prefix}_commit_turn(cid, aid, digest, messages, count, expected, expected_head,
                         owner, tombstone, retention, holder) -> text  -- append + release
    {prefix}_move_head(cid, head, expected_head, move_id, tombstone) -> text

A conversation is a tree of batches (DESIGN §6h): each batch row names its ``parent``
(the seq of the batch it follows; NULL for a first batch), when it was stored
(``created``, the server's clock) and its ``path_length`` (the messages from the first
batch through it). The conversation row holds the ``head`` (the head batch's seq; NULL:
the empty path) and ``length``, the number of messages on the head path (the
``expected_length`` fence compares with it, the ``expected_head`` fence with the head's
append id). An append inserts a batch whose parent is the head and makes it the head,
reading only the conversation row (no walk of the tree); ``_move_head`` sets the head and
its path length from the target's row and records the move id. ``branched`` is set once
the head has moved: until then the head path is every batch in seq order and reads scan
it as before branches; after, they walk parents from the head. Version 1 (scope 0.1) had
no ``length`` and no ``_schema`` table; the upgrade adds the column and counts each
conversation's messages. Version 2 had no ``_leases`` table; the upgrade creates it.
Version 3 had no ``_acquire_view`` and ``_commit_turn`` functions (the folded lease
steps); the upgrade creates them. Version 4 had no branches: the upgrade
(``_upgrade_branches``) adds the columns and the moves table, keeps its batches as one
branch (each one's parent the batch before it, the head the last one, path lengths the
running sums, ``created`` NULL), and had no retention and erasure: the upgrade
(``_upgrade_erasure``) adds the owner and expiry columns, the secret (made then) and the
tombstones table. Both run, in idempotent steps; every earlier argument list of the
functions is dropped and one definition of each is created, taking the head fence and
the owner, tombstone and retention arguments (DESIGN §6h, §6i). An expired conversation
(``expires_at`` passed by the server's clock) is closed in every step; once ``expire``
removed it, its row is ``closed`` with ``expires_at`` ``'infinity'`` (``read_meta``'s
``"expired"``, where a ``clear`` leaves NULL; never due, never listed; rows earlier
versions expired hold NULL). An erased one has no row, and its tombstone closes it.
``open(create=False)`` runs no DDL, so a role with
only row rights on the seven tables and ``EXECUTE`` on the four functions can use the
store (the grants on the docs' Stores page, "Migrations and least privilege", which a
test runs against the server).

Restore (``scope.history.Restorer``, DESIGN §6n), each step one statement or one short
transaction on one connection (no server-side function): ``closed_conversations`` lists
the closed rows (``closed``, or due by the server's clock) over the primary key,
``tombstones`` the tombstones table in order; ``restore_closed`` inserts the row closed
(``expires_at`` ``'infinity'`` for expired, as ``expire`` leaves it), or locks and compares
the one there, the tombstone read after the row lock; ``restore_erasures`` locks the
conversations table (``SHARE ROW EXCLUSIVE``: one restore at a time, writes wait, reads
go on), replaces the secret only in a store holding no conversation row, batch or
tombstone, then inserts the tombstones not stored yet (``erased_at``: the server's clock
at the restore). Replacing the secret needs ``UPDATE`` on the ``_secret`` table, which
the application role of the least-privilege grants lacks: import with the migration
role.

Tables go to the first schema of the connection's ``search_path``. Every store operation
on one conversation locks that conversation's row first, so appends, retries and clears
of one conversation are linearizable across connections, pools and hosts.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, final

from scope._validate import check_seconds, check_type
from scope.errors import StoreError
from scope.history import (
    Batch,
    ClosedConversation,
    ConversationID,
    HistoryCache,
    HistoryTree,
    HistoryView,
)
from scope.history.storekit import Closure, check_retention, new_secret, tombstone
from scope.historystores._driver import (
    Driver,
    require_asyncio,
    retry_once,
    store_closed,
)
from scope.historystores._records import (
    Decoder,
    ListedIDs,
    tree_of,
    view_of,
)
from scope.historystores._restoring import HELD, WRITTEN, RestoringStore, same_closure
from scope.historystores._schema import (
    SCHEMA_VERSION,
    schema_mismatch,
    validate_table_prefix,
)

__all__ = ["PostgresStore"]

T = TypeVar("T")

#: The most appends one group-commit statement carries (``PostgresStore._write``).
_GROUP: Final = 64

#: How many append statements one store handle keeps in flight (``PostgresStore._write``):
#: two, so a group fills while one is sent and the other's round trip and commit run.
_SLOTS: Final = 2

#: How many stored ids one page of ``check_erased`` reads.
_ID_PAGE: Final = 1000

#: The advisory lock key held while the schema is created (any fixed 64-bit number).
_SCHEMA_LOCK: Final = 0x5C09E_4157_0001


def _asyncpg() -> Any:
    """The asyncpg module, imported on first use."""
    try:
        import asyncpg  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(
            "PostgresStore needs asyncpg: install the extra, pip install 'scope-chat[postgres]'"
        ) from exc
    return asyncpg


def _driver_errors(asyncpg: Any) -> tuple[type[BaseException], ...]:
    """Every exception asyncpg raises: server errors, client errors, I/O and timeouts."""
    return (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.InternalClientError,
        OSError,
        TimeoutError,
    )


def _driver(asyncpg: Any) -> Driver:
    """How asyncpg fails (see ``retry_once``). Retryable: the connection or its server
    session is gone or confused, or the server asks for a retry. Deterministic server
    errors (permissions, a dropped table, bad data) are not retried, nor are timeouts:
    the client's own bound, no pool connection within ``acquire_timeout``, or the
    server's ``statement_timeout`` (``QueryCanceledError``)."""
    exc = asyncpg.exceptions
    return Driver(
        "PostgreSQL",
        errors=_driver_errors(asyncpg),
        retryable=(
            OSError,  # refused, reset, broken pipe
            # Client side: the connection was closed or detached under the call, or the
            # protocol was left mid-operation by a session killed while idle.
            asyncpg.InterfaceError,
            exc.InternalClientError,
            exc.PostgresConnectionError,  # SQLSTATE class 08
            exc.OperatorInterventionError,  # class 57: admin/crash shutdown, cannot connect now
            exc.TransactionRollbackError,  # class 40: serialization failure, deadlock
        ),
        timeouts=(_AcquireTimeout, TimeoutError, exc.QueryCanceledError),
        package="asyncpg",
    )


async def _keep_session(conn: Any) -> None:
    """The pool's reset of a released connection: nothing (see ``open``)."""


class _AcquireTimeout(Exception):
    """Internal: no pool connection came free within ``acquire_timeout``."""


def _check_timeout(name: str, value: object) -> float | None:
    """A timeout argument: None (no bound) or a finite number of seconds > 0."""
    if value is None:
        return None
    return check_seconds(value, name, positive=True)


#: How much longer than ``command_timeout`` the client waits for the server's answer
#: (the server's statement_timeout normally answers first; this bounds a dead network).
_CLIENT_GRACE: Final = 1.0


@final
class PostgresStore(RestoringStore):
    """A ``scope.history.Store`` (and ``PersistentStore``) in PostgreSQL tables.

    Open with ``await PostgresStore.open(dsn)``; use as an async context manager or call
    ``aclose()`` (closes the connection pool).

    Guarantees, beyond the store rules of ``scope.history``:

    - **Atomicity.** An append is one call of a server-side function, one transaction:
      it locks the conversation's row (``SELECT ... FOR UPDATE``), checks closure and the
      dedupe record, and inserts the batch as one row. A clear locks the same row, marks
      it closed and deletes the batches in one transaction. So appends, retries and
      clears of one conversation are linearizable, whichever pool or host runs them.
      One handle keeps at most two append statements in flight, one per conversation
      at a time; appends that arrive meanwhile queue and go together as one statement,
      sorted by conversation id, one transaction (group commit, see ``_write`` and
      ``_send_group``), each checked as alone and answered its own outcome.
      ``acquire_turn`` is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement
      and ``release_turn`` one ``DELETE``; a lease expires by the server's clock
      (``clock_timestamp()``), so the hosts' clocks need not agree. The folded steps
      are one server-side function call each, one transaction
      and one round trip: ``acquire_turn_view`` the same upsert and then the view,
      ``append_release_turn`` the append function and then the holder's release.
      ``acquire_turn_view``'s transaction writes only the lease and commits
      asynchronously (``synchronous_commit`` off for it alone, so it does not wait for
      the WAL flush): a server crash within a fraction of a second of it may forget
      that lease, so two turns may then run at once and the fence refuses the later
      commit, as it does whenever a lease is lost. Appends, releases and clears
      commit as the server's ``synchronous_commit`` says.
    - **Reconnects.** When the connection drops (server restart, ``pg_terminate_backend``,
      network), the operation is retried once on a fresh connection; every operation is
      idempotent (an append's retry is recognised by its append id, a head move's by its
      move id or, without one, by the head already being its target), so the batch
      lands exactly once. If the retry fails too, ``StoreError`` is raised with the driver
      error chained; an append that raised ``StoreError`` may still have committed, and
      retrying the same batch resolves it.
    - **Timeouts.** Every statement is bounded by ``command_timeout`` on the server
      (``statement_timeout``: a statement still running or waiting for a lock is
      cancelled and its transaction rolled back) and the wait for a pool connection by
      ``acquire_timeout``. Either raises ``StoreError`` naming the operation and the
      conversation; it is not retried, because whatever held the call (a lock, a full
      pool, load) most likely still does and a retry would double the caller's wait;
      repeating the call is safe. The client stops waiting ``command_timeout`` + 1 s
      after sending a statement even if the server does not answer (a dead network);
      that call may have committed, as a cancelled one may.
    - **Cancellation.** A cancelled read raises ``CancelledError`` at once; a
      cancelled write (an append, a clear, every lease step) raises it once its
      statement has finished, so what the same task does next (a retry, a release of
      the lease it may have taken) comes after it. The statement runs to its end on
      the server (bounded by ``command_timeout``) in a
      background task that then returns the connection to the pool, so a cancellation
      never tears a connection down mid-protocol (asyncpg then opens cancel-request
      connections and logs "Future exception was never retrieved"). The statement or
      transaction commits or rolls back as a unit: a cancelled append may have
      committed, and a retry of the same batch resolves it. An append cancelled while
      it waits in the handle's queue (not yet sent) raises at once and writes
      nothing; one whose group was sent waits for the group's statement, as above.
      ``aclose()`` waits for these background statements and fails the queued appends.
    - **Errors.** Every asyncpg, socket and timeout error becomes ``StoreError``; a
      corrupt stored record makes ``read`` and ``read_batches`` raise ``StoreError`` naming
      the conversation. Calls on a closed store raise ``StoreError``.
    """

    __slots__ = (
        "_acquire_timeout",
        "_busy",
        "_cache",
        "_closed",
        "_command_timeout",
        "_driver",
        "_listed",
        "_max_size",
        "_outcome_source",
        "_pool",
        "_queue",
        "_retention",
        "_running",
        "_secret",
        "_sending",
        "_sql",
        "retention",
        "table_prefix",
    )

    _store_kind = "postgres"

    def __init__(
        self,
        pool: Any,
        table_prefix: str,
        cache: HistoryCache,
        *,
        command_timeout: float | None = None,
        acquire_timeout: float | None = None,
        max_size: int = 10,
        retention: _dt.timedelta | None = None,
    ) -> None:
        """Internal: use ``await PostgresStore.open(dsn)``."""
        self._pool = pool
        self._secret = b""  # read at open (see _read_secret)
        self.retention: Final = retention
        self._retention = None if retention is None else retention.total_seconds()
        self._command_timeout = command_timeout
        self._acquire_timeout = acquire_timeout
        self._max_size = max_size
        self._running: set[asyncio.Task[Any]] = set()
        # Group commit (see _write): the append statements in flight, the conversations
        # they append to, and the appends waiting for a slot or for their conversation.
        self._sending = 0
        self._busy: set[str] = set()
        self._queue: list[_Queued] = []
        self._cache = cache
        self._sql = _Statements(table_prefix)
        self._closed = False
        self._driver = _driver(_asyncpg())
        self.table_prefix: Final = table_prefix
        self._listed = ListedIDs(repr(self))
        self._outcome_source = "PostgreSQL append function"

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        table_prefix: str = "scope_history",
        min_size: int = 1,
        max_size: int = 10,
        application_name: str = "scope",
        connect_timeout: float = 10.0,
        command_timeout: float | None = 10.0,
        acquire_timeout: float | None = 10.0,
        cache_bytes: int = HistoryCache.DEFAULT_MAX_BYTES,
        create: bool = True,
        retention: _dt.timedelta | None = None,
    ) -> PostgresStore:
        """Connect a pool to ``dsn`` (a libpq URI such as
        ``postgresql://user:password@host:5432/db``) and create the tables when missing.

        ``create=True`` creates the schema when missing and upgrades an older one in
        place (needs the rights to create tables and functions only then: on a schema
        already at this version it runs no DDL); ``create=False`` runs
        no DDL and only checks that the schema exists at the current version
        (``StoreError`` naming ``scope history migrate`` if not).

        ``table_prefix``: 1-49 of ``a-z``, ``0-9``, ``_`` (not starting with a digit);
        stores with different prefixes share one database independently.
        ``cache_bytes`` (default 32 MiB; 0 keeps nothing) bounds this handle's
        ``history_cache``: the decoded batches (so re-reading a conversation skips
        decoding; every record is still checked against its digest on every read)
        and the replays the history Middleware checked, each counted at twice its
        encoded size, media included (see ``scope.history.HistoryCache``).
        ``command_timeout`` (seconds, default 10; None: the server's own setting) bounds
        every statement on the server (``statement_timeout``, lock waits included);
        ``acquire_timeout`` (seconds, default 10; None: no bound) bounds the wait for a
        pool connection when all ``max_size`` are busy; ``connect_timeout`` bounds each
        new connection. A timeout raises ``StoreError`` (see the class docstring).
        ``retention`` (a ``timedelta`` > 0; None, the default: nothing expires by
        itself): a conversation without its own expiry (``retain``) expires this long
        after its last append through this handle, by the server's clock (a handle
        without it leaves the expiry an append finds).
        Bad arguments
        (the prefix, pool sizes, timeouts, a DSN asyncpg cannot parse) raise
        ``ValueError`` before any I/O; an unreachable server raises ``StoreError``.
        Needs asyncio.
        """
        prefix = validate_table_prefix(table_prefix)
        kept = check_retention(retention)
        command_timeout = _check_timeout("command_timeout", command_timeout)
        acquire_timeout = _check_timeout("acquire_timeout", acquire_timeout)
        connect_timeout = check_seconds(connect_timeout, "connect_timeout", positive=True)
        cache = HistoryCache(cache_bytes)
        check_type(create, bool, "create", "a bool")
        check_type(dsn, str, "dsn", "a string")
        if not dsn:
            raise ValueError(f"dsn must be a non-empty string, got {dsn!r}")
        for name, value in (("min_size", min_size), ("max_size", max_size)):
            check_type(value, int, name, "an integer")
            if value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if max_size < 1 or min_size > max_size:
            raise ValueError(
                f"need 0 <= min_size <= max_size and max_size >= 1, got "
                f"min_size={min_size}, max_size={max_size}"
            )
        require_asyncio("PostgresStore", "asyncpg")
        asyncpg = _asyncpg()
        server_settings = {
            "application_name": application_name,
            # The locking protocol relies on each statement seeing the latest
            # committed rows once it holds the conversation's row lock.
            "default_transaction_isolation": "read committed",
        }
        if command_timeout is not None:
            # Enforced by the server, which rolls the statement's transaction back, so a
            # timed-out append wrote nothing. A session default: RESET ALL (on release
            # to the pool) keeps it.
            server_settings["statement_timeout"] = str(max(1, round(command_timeout * 1000)))
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=connect_timeout,
                # The client's own bound, for a server that does not answer at all.
                command_timeout=None
                if command_timeout is None
                else command_timeout + _CLIENT_GRACE,
                server_settings=server_settings,
                # Released connections are not reset (RESET ALL, UNLISTEN, ...: one round
                # trip per call): the store's statements change no session state, and an
                # open transaction is still rolled back by the pool.
                reset=_keep_session,
            )
        except ValueError as exc:  # includes asyncpg's ClientConfigurationError
            raise ValueError(f"invalid PostgreSQL DSN: {exc}") from exc
        except _driver_errors(asyncpg) as exc:
            raise _driver(asyncpg).failed(exc, "connect") from exc
        store = cls(
            pool,
            prefix,
            cache,
            command_timeout=command_timeout,
            acquire_timeout=acquire_timeout,
            max_size=max_size,
            retention=kept,
        )
        try:
            if create:
                await store._with_connection(store._create_schema, "schema creation")
            else:
                await store._with_connection(store._check_schema, "schema check")
            await store._with_connection(store._read_secret, "read of the store secret")
        except (ValueError, StoreError) as exc:
            pool.terminate()
            # With min_size=0 the pool parses the DSN only now, on its first connection.
            cause = exc.__cause__ if isinstance(exc, StoreError) else exc
            if isinstance(cause, ValueError):
                raise ValueError(f"invalid PostgreSQL DSN: {cause}") from cause
            raise
        except BaseException:
            pool.terminate()
            raise
        return store

    def __repr__(self) -> str:
        return f"PostgresStore(table_prefix={self.table_prefix!r})"

    async def aclose(self) -> None:
        """Close the pool (waiting for calls in progress to release their connections).
        Later calls raise ``StoreError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._dispatch()  # queued appends fail: their groups would find the store closed
        while self._running:  # statements of cancelled calls and groups, bounded
            await asyncio.wait(set(self._running))
        try:
            await self._pool.close()
        except self._driver.errors:
            self._pool.terminate()

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        return self._closed

    async def _with_connection(
        self, fn: Callable[[Any], Awaitable[T]], what: str, *, settle: bool = False
    ) -> T:
        """Run ``fn(connection)``, retrying once on a fresh connection when the first one
        dropped; map driver errors and timeouts to ``StoreError``.

        The work runs in a task of its own that the caller awaits through
        ``asyncio.shield``: a cancelled caller's statement finishes and the connection
        is released normally (see the class docstring), and asyncio.shield marks that
        task's outcome retrieved. A read's caller gets ``CancelledError`` at once. A
        write's (``settle``) waits for its statement first, so when the cancelled call
        returns its outcome is settled: committed, or never will be. The wait is bounded
        by ``command_timeout`` (the server's bound on the statement) plus the client's
        grace, and by ``acquire_timeout`` for the pool connection."""
        if self._closed:
            raise store_closed("PostgresStore")
        task = asyncio.ensure_future(retry_once(self, self._driver, lambda: self._once(fn), what))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if not settle:
            return await asyncio.shield(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # Not the task's own cancellation: the caller's. Wait for the statement (its
            # own timeouts bound it), then deliver the cancellation.
            await _wait_through_cancellation(task, self._settle_bound())
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the caller gets its cancellation instead
            raise

    def _settle_bound(self) -> float | None:
        """How long a cancelled write waits for its statement: the statement's bounds
        (pool wait, server timeout plus the client's grace) on each of two attempts."""
        if self._command_timeout is None:
            return None
        acquire = self._acquire_timeout or 0.0
        return 2 * (acquire + self._command_timeout + _CLIENT_GRACE)

    async def _once(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        try:
            conn = await self._pool.acquire(timeout=self._acquire_timeout)
        except TimeoutError as exc:
            raise _AcquireTimeout(f"{type(exc).__name__}: {exc}") from exc
        try:
            return await fn(conn)
        except TimeoutError:
            # The client's own bound ran out: the server did not answer. A graceful
            # release would wait for it again (asyncpg resets the connection), so the
            # connection is dropped at once; the pool opens a fresh one when needed.
            conn.terminate()
            raise
        finally:
            await self._pool.release(conn)

    async def _reconnect(self) -> None:
        # The server may have dropped every pooled connection (restart, terminate):
        # make the pool replace them all instead of retrying on another dead one.
        await self._pool.expire_connections()

    def _timed_out(self, exc: BaseException, what: str) -> StoreError:
        """The ``StoreError`` of a timeout (not retried, see ``retry_once``)."""
        if isinstance(exc, _AcquireTimeout):
            cause = str(exc)  # the pool's TimeoutError
            return StoreError(
                f"PostgreSQL {what} timed out waiting for a pool connection "
                f"(acquire_timeout={self._acquire_timeout} s, max_size={self._max_size}: all "
                f"in use, or a new connection took longer than connect_timeout; {cause}); "
                "nothing was sent, repeating it is safe"
            )
        cause = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TimeoutError):
            return StoreError(
                f"PostgreSQL {what} timed out waiting for the server's answer "
                f"(command_timeout={self._command_timeout} s, plus {_CLIENT_GRACE:g} s; "
                f"{cause}); it committed entirely or not at all, repeating it is safe"
            )
        # QueryCanceledError: statement_timeout, or pg_cancel_backend by an operator.
        why = (
            f"timed out (command_timeout={self._command_timeout} s)"
            if "statement timeout" in str(exc)
            else "was cancelled"
        )
        return StoreError(
            f"PostgreSQL {what} {why}: the server cancelled the statement ({cause}) and "
            "rolled its transaction back, nothing of it was written; not retried, "
            "repeating it is safe"
        )

    async def _schema_version(self, conn: Any) -> int | None:
        """The recorded schema version; 1 for scope 0.1's tables; None for no tables."""
        sql = self._sql
        if await conn.fetchval("SELECT to_regclass($1)::text", sql.schema_table) is not None:
            version = await conn.fetchval(sql.version)
            return None if version is None else int(version)
        found = await conn.fetchval("SELECT to_regclass($1)::text", sql.conversations_table)
        return None if found is None else 1

    async def _check_schema(self, conn: Any) -> None:
        version = await self._schema_version(conn)
        if version != SCHEMA_VERSION:
            raise schema_mismatch(
                f"PostgreSQL table prefix {self.table_prefix!r}", self._sql.schema_table, version
            )

    async def _create_schema(self, conn: Any) -> None:
        # A schema already at this version needs no DDL: a role holding only DML rights
        # opens it with the default create=True (CREATE ... IF NOT EXISTS would still
        # need the right to create in the schema).
        if await self._schema_version(conn) == SCHEMA_VERSION:
            return
        async with conn.transaction():
            await conn.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            version = await self._schema_version(conn)
            if version is not None and version > SCHEMA_VERSION:
                raise schema_mismatch(
                    f"PostgreSQL table prefix {self.table_prefix!r}",
                    self._sql.schema_table,
                    version,
                )
            if version == 1:
                for statement in self._sql.upgrade_from_1:
                    await conn.execute(statement)
            for statement in self._sql.schema:
                await conn.execute(statement)
            await self._upgrade_branches(conn)
            await self._upgrade_erasure(conn)
            for statement in self._sql.functions:
                await conn.execute(statement)
            await conn.execute(self._sql.set_version, SCHEMA_VERSION)

    async def _upgrade_branches(self, conn: Any) -> None:
        """Version 5 (branches), in idempotent steps: see ``_Statements.upgrade_branches``."""
        for statement in self._sql.upgrade_branches:
            await conn.execute(statement)

    async def _upgrade_erasure(self, conn: Any) -> None:
        """Schema 5's retention and erasure (DESIGN §6i), idempotent steps (so they
        compose with the branch steps to 5): the conversations table's ``owner``,
        ``expires_at`` (the server's clock; NULL: never) and ``retained`` (the
        conversation's own setting, which appends do not move) columns and their
        indexes; the ``_secret`` table and its one row (32 random bytes made here, the
        tombstones' HMAC key); the ``_tombstones`` table; every earlier argument list
        of the functions dropped (the functions created next take the head fence and
        the owner, the tombstone and the retention, ``_acquire_view`` and
        ``_move_head`` the tombstone)."""
        for statement in self._sql.upgrade_erasure:
            await conn.execute(statement)
        await conn.execute(self._sql.create_secret, new_secret())

    async def _read_secret(self, conn: Any) -> None:
        secret = await conn.fetchval(self._sql.secret)
        if not isinstance(secret, bytes) or len(secret) != 32:
            raise StoreError(
                f"PostgreSQL table prefix {self.table_prefix!r} has no store secret (a row of "
                f"{self._sql.secret_table}, written with the schema, needed by erase): "
                "restore it from a backup"
            )
        self._secret = secret

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's head path (messages, length, head) and closure from one
        statement (a consistent snapshot; a conversation that has branched: a second
        one, consistent on its own, walks the head path). A corrupt stored record
        raises ``StoreError``."""
        cid = ConversationID(conversation_id)
        sql = self._sql
        mark = tombstone(self._secret, cid)

        async def read(conn: Any) -> list[Any] | None:
            rows = list(await conn.fetch(sql.view, cid))
            if rows and rows[0][5]:  # branched (and open): the walk from the head
                rows = list(await conn.fetch(sql.view_path, cid))
            if not rows and await conn.fetchval(sql.erased, mark):
                return None  # erased: closed for ever
            return rows

        rows = await self._with_connection(read, f"read of conversation {str(cid)!r}")
        if rows is None:
            return HistoryView((), 0, True)
        if not rows:
            return HistoryView((), 0)
        records = [(r[2], r[3], r[4]) for r in rows if r[2] is not None]
        return view_of(cid, bool(rows[0][0]), int(rows[0][1]), records, self._cache)

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        sql = self._sql

        async def read(conn: Any) -> list[Any]:
            rows = list(await conn.fetch(sql.read, cid))
            if not rows:  # empty, unknown, or branched: the walk (nothing for the first two)
                rows = list(await conn.fetch(sql.read_path, cid))
            return rows

        rows = await self._with_connection(read, f"read of conversation {str(cid)!r}")
        return decode(cid, ((r[0], r[1], r[2]) for r in rows), self._cache)

    async def _read_tree(self, cid: ConversationID) -> HistoryTree:
        # One statement: the conversation row and every batch, in seq order (nothing of
        # a closed or expired one); an id without a row: its tombstone checked (erased:
        # closed).
        sql = self._sql
        mark = tombstone(self._secret, cid)

        async def read(conn: Any) -> list[Any] | None:
            rows = list(await conn.fetch(sql.tree, cid))
            if not rows and await conn.fetchval(sql.erased, mark):
                return None
            return rows

        rows = await self._with_connection(read, f"tree read of conversation {str(cid)!r}")
        if rows is None:
            return tree_of(cid, True, None, (), self._cache)
        if not rows:
            return HistoryTree((), (), ())
        batches = [tuple(r[2:]) for r in rows if r[2] is not None]
        return tree_of(cid, bool(rows[0][0]), rows[0][1], batches, self._cache)

    async def _read_meta(
        self, cid: ConversationID
    ) -> tuple[str | None, float | None, bool, list[tuple[str, str]], Closure | None]:
        sql = self._sql
        mark = tombstone(self._secret, cid)

        async def read(conn: Any) -> list[Any]:
            return list(await conn.fetch(sql.meta, cid, mark))

        rows = await self._with_connection(read, f"meta read of conversation {str(cid)!r}")
        owner, expires_at, retained, closure = rows[0][0], rows[0][1], rows[0][2], rows[0][3]
        moves = [(r[4], r[5]) for r in rows if r[4] is not None]
        return owner, expires_at, bool(retained), moves, closure

    async def _move_head(
        self, cid: ConversationID, head: str, expected_head: str, move_id: str | None
    ) -> str:
        # One call of the move_head function: one transaction, one round trip. When the
        # connection drops, the call is retried once (see the class docstring): with a
        # move id the record answers the retry; without one, a retry that finds the
        # head already at the target (the first attempt committed before its reply was
        # lost) answers the move instead of the fence's refusal.
        sql = self._sql.move_head
        mark = tombstone(self._secret, cid)
        attempts = 0

        async def move(conn: Any) -> str:
            nonlocal attempts
            attempts += 1
            answer = str(await conn.fetchval(sql, cid, head, expected_head, move_id, mark))
            if attempts > 1 and move_id is None and answer.startswith("changed:"):
                length, _, actual = answer.removeprefix("changed:").partition(":")
                if actual == head:
                    return f"moved:{length}"
            return answer

        return await self._with_connection(
            move, f"head move of conversation {str(cid)!r}", settle=True
        )

    async def _stored_ids(self, after: Any, limit: int) -> list[Any]:
        # The batches table itself (its primary key index orders it), so a batch row
        # whose conversation row is missing or wrong is scanned too.
        sql = self._sql

        async def ids(conn: Any) -> list[Any]:
            if after is None:
                return [row[0] for row in await conn.fetch(sql.scan_ids_first, limit)]
            return [row[0] for row in await conn.fetch(sql.scan_ids, after, limit)]

        return await self._with_connection(ids, "scan of conversation ids")

    async def _record_page(
        self, raw_id: Any, after: Any, limit: int
    ) -> list[tuple[Any, Any, Any, Any, str]]:
        sql = self._sql

        async def page(conn: Any) -> list[Any]:
            if after is None:
                return list(await conn.fetch(sql.scan_records_first, raw_id, limit))
            return list(await conn.fetch(sql.scan_records, raw_id, after, limit))

        rows = await self._with_connection(page, f"scan of conversation {raw_id!r}")
        return [(r[0], r[1], r[2], r[3], "") for r in rows]

    async def _write(
        self, batch: Batch, holder: str | None, owner: str | None, created: float | None
    ) -> str:
        """One append (``holder`` None) or commit_turn (a holder: the commit_turn
        function, which also releases the holder's lease when the append landed or was a
        retry).

        Appends through this handle share at most ``_SLOTS`` statements in flight, one
        per conversation at a time. An append that finds a slot free and its
        conversation idle is sent alone (one call of the append function, one round
        trip). The others queue; when a statement ends, the queued appends of idle
        conversations go together, sorted by conversation id (arrival order within a
        conversation), as one statement (``_send_group``): one transaction, one commit
        for all of them (group commit). Each batch is checked as when it is sent alone
        (closure, dedupe record, fence, counting the batches of its conversation queued
        before it) and gets its own outcome. A restore (``created``) and a commit_turn
        are never queued."""
        cid = str(batch.conversation_id)
        what = f"append to conversation {cid!r}"
        row = (
            cid,
            str(batch.id),
            batch.digest,
            batch.encoded_messages,
            len(batch.messages),
            batch.expected_length,
            batch.expected_head,
            owner,
            tombstone(self._secret, cid),
        )
        if holder is not None:
            sql = self._sql.commit_turn

            async def commit(conn: Any) -> str:
                return str(await conn.fetchval(sql, *row, self._retention, holder))

            return await self._with_connection(commit, what, settle=True)
        if created is not None:  # a restore (scope history import): never grouped
            return await self._write_restored((*row, self._retention), created, what)
        if self._sending >= _SLOTS or cid in self._busy:
            return await self._queued(_Queued(row))
        self._sending += 1
        self._busy.add(cid)
        try:
            return await self._send_alone(row, settle=True)
        finally:
            self._sending -= 1
            self._busy.discard(cid)
            self._dispatch()

    async def _send_alone(self, row: tuple[Any, ...], *, settle: bool) -> str:
        """One call of the append function for ``row`` (its arguments but the
        retention), one statement."""
        sql = self._sql.append
        args = (*row, self._retention)

        async def append(conn: Any) -> str:
            return str(await conn.fetchval(sql, *args))

        return await self._with_connection(
            append, f"append to conversation {row[0]!r}", settle=settle
        )

    async def _queued(self, item: _Queued) -> str:
        """Queue ``item`` and return its outcome once its group answered. A caller
        cancelled while its append is still queued leaves the queue at once: nothing of
        it was sent, nothing is written. One cancelled after its group was sent waits
        for the group's statement first, as a cancelled append sent alone waits for its
        own, then gets its cancellation (the batch may have landed)."""
        self._queue.append(item)
        try:
            return await asyncio.shield(item.waiter)
        except asyncio.CancelledError:
            if not item.sent:
                self._queue.remove(item)
                raise
            if not item.waiter.done():
                bound = self._settle_bound()
                await _wait_through_cancellation(item.waiter, None if bound is None else 2 * bound)
            if item.waiter.done() and not item.waiter.cancelled():
                item.waiter.exception()  # retrieved: the caller gets its cancellation instead
            raise

    def _dispatch(self) -> None:
        """Send the queued appends of idle conversations while a slot is free, up to
        ``_GROUP`` per statement, each group in a task of its own (see ``_write``).
        After ``aclose`` the queue is failed instead."""
        if self._closed:
            queue, self._queue = self._queue, []
            for item in queue:
                item.sent = True
                if not item.waiter.done():
                    item.waiter.set_exception(store_closed("PostgresStore"))
            return
        while self._queue and self._sending < _SLOTS:
            group: list[_Queued] = []
            left: list[_Queued] = []
            for item in self._queue:
                # A conversation's appends in the group are its first queued ones: its
                # later ones wait (it is busy) for a later group.
                if len(group) < _GROUP and item.row[0] not in self._busy:
                    group.append(item)
                else:
                    left.append(item)
            if not group:
                return
            self._queue = left
            for item in group:
                item.sent = True
                self._busy.add(item.row[0])
            self._sending += 1
            group.sort(key=_conversation_of)  # stable: arrival order per conversation
            task = asyncio.ensure_future(self._send_group(group))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _send_group(self, group: list[_Queued]) -> None:
        """Send ``group`` (sorted by conversation) and give each waiter its outcome.

        One batch: the append function's call, as alone. Batches of one conversation:
        one statement calling it once per batch in order (``append_batches``), waiting
        for the row's lock as each would alone. Batches of several conversations: one
        statement (``append_group``) that first locks the rows of the group's
        conversations that no other transaction holds (``SKIP LOCKED``), then calls the
        append function once per batch in order; a batch whose conversation's row
        another transaction holds is answered ``busy`` unsent and then sent alone,
        waiting for that lock as an append alone would, so a lock held on one
        conversation never makes the rest of the group wait or time out (the wait
        holds this group's slot: the handle's later appends queue meanwhile). Conversations
        without a row yet are created in sorted order (two groups never wait on each
        other in a cycle).

        When the group's statement fails (an error of the server, or a connection lost
        twice), its transaction wrote nothing, or its outcome is unknown, so each batch
        is sent alone (in order per conversation, conversations at once): each gets the
        outcome or error it would get alone, and a retry of a batch that landed answers
        its receipt. A timeout is every waiter's error (a retry would double their
        wait), as is a closed store."""
        conversations = {item.row[0] for item in group}
        try:
            if len(group) == 1:
                try:
                    outcome = await self._send_alone(group[0].row, settle=False)
                except Exception as exc:
                    _answer(group[0], exc)
                else:
                    _answer(group[0], outcome)
                return
            try:
                outcomes = await self._send_together(group, len(conversations))
            except StoreError as exc:
                if self._closed or _timed_out(exc, self._driver):
                    for item in group:
                        _answer(item, exc)
                    return
                await self._send_each(group)
                return
            busy: list[_Queued] = []
            for item, answer in zip(group, outcomes, strict=True):
                if answer is None:
                    busy.append(item)
                else:
                    _answer(item, answer)
            if busy:
                await self._send_each(busy)
        finally:
            self._sending -= 1
            self._busy.difference_update(conversations)
            for item in group:  # only when this task itself was cancelled (loop shutdown)
                if not item.waiter.done():
                    item.waiter.set_exception(store_closed("PostgresStore"))
            self._dispatch()

    async def _send_together(self, group: list[_Queued], conversations: int) -> list[str | None]:
        """The group statement's outcome per batch, None for ``busy``. A group of one
        conversation waits for its row's lock, as each of its appends would alone
        (``_Statements.append_batches``: no other conversation to hold up)."""
        columns = [list(column) for column in zip(*(item.row for item in group), strict=True)]
        retention = self._retention
        what = f"append of {len(group)} batches to {conversations} conversations"
        if conversations == 1:
            sql = self._sql.append_batches
            args = [columns[0][0], *columns[1:8], columns[8][0], retention]
        else:
            sql = self._sql.append_group
            args = [*columns, retention]

        async def append(conn: Any) -> list[str | None]:
            rows = await conn.fetch(sql, *args)
            return [None if r[0] is None else str(r[0]) for r in rows]

        outcomes = await self._with_connection(append, what)
        if len(outcomes) != len(group):
            raise StoreError(  # pragma: no cover - one row per batch sent
                f"PostgreSQL {what}: {len(outcomes)} outcomes for {len(group)} batches"
            )
        return outcomes

    async def _send_each(self, items: list[_Queued]) -> None:
        """Send each of ``items`` alone: one conversation's in order, conversations at
        once; each waiter gets its own outcome or error."""
        per_conversation: dict[str, list[_Queued]] = {}
        for item in items:
            per_conversation.setdefault(item.row[0], []).append(item)

        async def send(queue: list[_Queued]) -> None:
            for item in queue:
                try:
                    outcome = await self._send_alone(item.row, settle=False)
                except Exception as exc:
                    _answer(item, exc)
                else:
                    _answer(item, outcome)

        await asyncio.gather(*(send(queue) for queue in per_conversation.values()))

    async def _write_restored(self, args: tuple[Any, ...], created: float, what: str) -> str:
        """The append function's call (``args``) and, when the batch was inserted, its
        stored time set to ``created`` (Unix seconds), in one transaction: a restored
        batch (``append(..., created=...)``) lands with its time or not at all."""
        sql = self._sql

        async def append(conn: Any) -> str:
            async with conn.transaction():
                outcome = str(await conn.fetchval(sql.append, *args))
                if outcome == "inserted":
                    await conn.execute(sql.set_created, args[0], args[1], created)
                return outcome

        return await self._with_connection(append, what, settle=True)

    async def _clear(self, cid: ConversationID) -> None:
        sql = self._sql
        mark = tombstone(self._secret, cid)

        async def clear(conn: Any) -> None:
            async with conn.transaction():
                await conn.execute(sql.close, cid)
                await conn.execute(sql.delete, cid)
                await conn.execute(sql.delete_moves, cid)
                # An erased id keeps no row (its tombstone is its closure); read after the
                # row lock, so an erase that committed meanwhile is seen.
                await conn.execute(sql.forget_erased, cid, mark)

        await self._with_connection(clear, f"clear of conversation {str(cid)!r}", settle=True)

    async def _acquire(self, cid: ConversationID, holder: str, ttl: float) -> bool:
        sql = self._sql.acquire

        async def acquire(conn: Any) -> bool:
            return bool(await conn.fetchval(sql, cid, holder, ttl))

        return await self._with_connection(
            acquire, f"lease of conversation {str(cid)!r}", settle=True
        )

    async def _acquire_view(
        self, cid: ConversationID, holder: str, ttl: float
    ) -> HistoryView | None:
        # One call of the _acquire_view function, one transaction (append_release_turn:
        # the _commit_turn function).
        sql = self._sql.acquire_view
        mark = tombstone(self._secret, cid)

        async def acquire_view(conn: Any) -> list[Any]:
            return list(await conn.fetch(sql, cid, holder, ttl, mark))

        rows = await self._with_connection(
            acquire_view, f"lease and read of conversation {str(cid)!r}", settle=True
        )
        if not rows[0][0]:
            return None
        records = [(r[3], r[4], r[5]) for r in rows if r[3] is not None]
        return view_of(cid, bool(rows[0][1]), int(rows[0][2]), records, self._cache)

    async def _release(self, cid: ConversationID, holder: str) -> bool:
        sql = self._sql.release

        async def release(conn: Any) -> bool:
            return bool(await conn.fetchval(sql, cid, holder))

        return await self._with_connection(
            release, f"lease release of conversation {str(cid)!r}", settle=True
        )

    async def _list(
        self, after: ConversationID | None, limit: int | None, owner: str | None
    ) -> list[Any]:
        sql = self._sql

        async def conversations(conn: Any) -> list[Any]:
            if owner is not None:
                return [row[0] for row in await conn.fetch(sql.owned_open, owner, after, limit)]
            if after is None:
                return [row[0] for row in await conn.fetch(sql.conversations, limit)]
            return [row[0] for row in await conn.fetch(sql.conversations_after, after, limit)]

        return await self._with_connection(conversations, "listing of conversations")

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    async def _retain(self, cid: ConversationID, until: float | None) -> bool:
        # One transaction: the row locked (created for an id never written), the
        # tombstone read after the lock, then the setting.
        sql = self._sql
        mark = tombstone(self._secret, cid)

        async def retain(conn: Any) -> bool:
            async with conn.transaction():
                await conn.execute(sql.ensure_row, cid)
                closed = await conn.fetchval(sql.lock_row, cid)
                if await conn.fetchval(sql.erased, mark):
                    await conn.execute(sql.delete_row, cid)
                    return False
                if closed:
                    return False
                await conn.execute(sql.retain, cid, until)
                return True

        return await self._with_connection(
            retain, f"retention of conversation {str(cid)!r}", settle=True
        )

    async def _expire_page(self, now: float | None, limit: int) -> list[ConversationID]:
        # One transaction: the due rows locked first, then (fresh snapshots, so every
        # committed batch is seen) their batches (every branch), leases and move records
        # deleted, the rows closed.
        sql = self._sql

        async def expire(conn: Any) -> list[Any]:
            async with conn.transaction():
                ids = [row[0] for row in await conn.fetch(sql.due, now, limit)]
                if ids:
                    await conn.execute(sql.expire_batches, ids)
                    await conn.execute(sql.expire_leases, ids)
                    await conn.execute(sql.expire_moves, ids)
                    await conn.execute(sql.expire_rows, ids)
                return ids

        ids = await self._with_connection(expire, "expiry of conversations", settle=True)
        return [ConversationID(cid) for cid in ids]

    async def _erase(
        self, cid: ConversationID, mark: str
    ) -> tuple[list[tuple[Any, str, int]], float]:
        # One transaction. The row is created or locked first (an INSERT waits for an
        # append creating it), so no append lands around the deletes; an append or
        # retain that creates the row after this commits finds the tombstone. Every
        # branch's batches and the move records go with the row.
        sql = self._sql

        async def erase(conn: Any) -> tuple[list[tuple[Any, str, int]], float]:
            async with conn.transaction():
                await conn.execute(sql.ensure_row, cid)
                await conn.fetchval(sql.lock_row, cid)
                records = [tuple(r) for r in await conn.fetch(sql.erase_batches, cid)]
                await conn.execute(sql.erase_leases, cid)
                await conn.execute(sql.delete_moves, cid)
                await conn.execute(sql.delete_row, cid)
                erased_at = await conn.fetchval(sql.write_tombstone, mark)
                return records, float(erased_at)

        return await self._with_connection(
            erase, f"erasure of conversation {str(cid)!r}", settle=True
        )

    async def _owned(self, owner: str, limit: int) -> list[ConversationID]:
        sql = self._sql.owned

        async def owned(conn: Any) -> list[Any]:
            return [row[0] for row in await conn.fetch(sql, owner, limit)]

        ids = await self._with_connection(owned, "listing by owner")
        return [ConversationID(cid) for cid in ids]

    async def _erasure_problems(self, mark: str) -> list[str]:
        # Every id stored in every table holding one, in keyset pages, hashed here.
        sql = self._sql
        secret = self._secret

        async def problems(conn: Any) -> list[str]:
            found: list[str] = []
            if not await conn.fetchval(sql.erased, mark):
                found.append(f"no tombstone {mark} in this store")
            for where, page in sql.id_pages:
                last = None
                while True:
                    ids = [row[0] for row in await conn.fetch(page, last)]
                    if any(tombstone(secret, str(cid)) == mark for cid in ids):
                        found.append(f"a conversation id hashing to the tombstone is in {where}")
                        break
                    if len(ids) < _ID_PAGE:
                        break
                    last = ids[-1]
            return found

        return await self._with_connection(problems, "check of an erasure")

    # -- restore (DESIGN §6n) ---------------------------------------------------------

    async def _closed_page(self, after: ConversationID | None, limit: int) -> list[Any]:
        sql = self._sql

        async def page(conn: Any) -> list[Any]:
            if after is None:
                return list(await conn.fetch(sql.closed_first, limit))
            return list(await conn.fetch(sql.closed_after, limit, after))

        return await self._with_connection(page, "listing of closed conversations")

    async def _restore_closed(self, closed: ClosedConversation, mark: str) -> str:
        # One transaction: the row inserted closed (ON CONFLICT waits for a transaction
        # creating it), else locked and read; the tombstone read after the row lock (an
        # erase that committed meanwhile is seen). A refusal rolls everything back.
        sql = self._sql
        cid = closed.conversation_id
        expired = closed.closure == "expired"
        values = (cid, expired, closed.length, closed.owner)

        async def restore(conn: Any) -> str:
            try:
                async with conn.transaction():
                    return await restore_in(conn)
            except _Refused as exc:
                return str(exc)

        async def restore_in(conn: Any) -> str:
            inserted = await conn.fetchval(sql.restore_insert, *values)
            row = None if inserted else await conn.fetchrow(sql.restore_state, cid)
            if await conn.fetchval(sql.erased, mark):
                raise _Refused("it is erased")
            if inserted:
                return WRITTEN
            if row is None:  # deleted after the insert found it: run the step again
                raise _Refused("it was removed while being restored")
            stored, removed, due, owner, length, held = row
            if held:
                raise _Refused("it holds batches (open, or expired and not removed yet)")
            if stored:
                return same_closure(closed, "expired" if removed else "cleared", owner, length)
            if due and (refused := same_closure(closed, "expired", owner, length)) != HELD:
                return refused
            # A row without a batch (a retention setting; due: the same closure).
            await conn.execute(sql.restore_update, *values)
            await conn.execute(sql.delete_moves, cid)
            return WRITTEN

        return await self._with_connection(
            restore, f"restore of closed conversation {str(cid)!r}", settle=True
        )

    async def _tombstone_page(self, after: str | None, limit: int) -> list[Any]:
        sql = self._sql

        async def page(conn: Any) -> list[Any]:
            if after is None:
                return [row[0] for row in await conn.fetch(sql.tombstones_first, limit)]
            return [row[0] for row in await conn.fetch(sql.tombstones_after, limit, after)]

        return await self._with_connection(page, "listing of tombstones")

    async def _restore_erasures(self, secret: bytes, marks: list[str]) -> int | str:
        # One transaction: the conversations table locked (restores queue there, writes
        # wait, reads go on), the secret
        # compared (another one replaced only in a store without conversations or
        # tombstones), the tombstones not stored yet found, the stored ids hashed against
        # them in keyset pages (only when some are new and the store holds conversations),
        # the new ones written.
        sql = self._sql

        async def restore(conn: Any) -> int | str:
            try:
                async with conn.transaction():
                    return await restore_in(conn)
            except _Refused as exc:
                return str(exc)

        async def restore_in(conn: Any) -> int:
            await conn.execute(sql.lock_conversations)
            stored = await conn.fetchval(sql.secret)
            if stored != secret:
                if await conn.fetchval(sql.store_used):
                    raise _Refused(
                        "the store holds conversations or tombstones under another secret "
                        "(restore erasures into an empty store)"
                    )
                await conn.execute(sql.set_secret, secret)
            new = [row[0] for row in await conn.fetch(sql.new_tombstones, marks)]
            if new:
                wanted = set(new)
                last = None
                while True:
                    ids = [row[0] for row in await conn.fetch(sql.id_pages[0][1], last)]
                    for cid in ids:
                        if (mark := tombstone(secret, str(cid))) in wanted:
                            raise _Refused(
                                f"a stored conversation's id hashes to tombstone {mark} "
                                "(erase it first)"
                            )
                    if len(ids) < _ID_PAGE:
                        break
                    last = ids[-1]
            return int(await conn.fetchval(sql.add_tombstones, new))

        answer = await self._with_connection(restore, "restore of erasures", settle=True)
        if not isinstance(answer, str):  # committed: this handle hashes with it now
            self._secret = secret
        return answer


class _Refused(Exception):
    """Internal: a restore step refused (its transaction rolled back); the reason."""


@final
class _Queued:
    """An append waiting in ``PostgresStore._queue``: the append function's arguments
    but the retention (the conversation id first), the caller's future, and whether its
    group took it (then the caller's cancellation waits for the group's statement)."""

    __slots__ = ("row", "sent", "waiter")

    def __init__(self, row: tuple[Any, ...]) -> None:
        self.row: Final = row
        self.sent = False
        self.waiter: Final[asyncio.Future[str]] = asyncio.get_running_loop().create_future()


def _conversation_of(item: _Queued) -> str:
    """The sort key of a group: the conversation id."""
    return str(item.row[0])


def _answer(item: _Queued, outcome: str | Exception) -> None:
    """Give ``item``'s caller its outcome or error (unless it has one)."""
    if item.waiter.done():
        return
    if isinstance(outcome, Exception):
        item.waiter.set_exception(outcome)
    else:
        item.waiter.set_result(outcome)


def _timed_out(exc: StoreError, driver: Driver) -> bool:
    """Whether ``exc`` is a timeout of the driver (``retry_once`` chains it)."""
    cause = exc.__cause__
    return isinstance(cause, Exception) and driver.kind(cause) == "timeout"


async def _wait_through_cancellation(task: asyncio.Future[Any], bound: float | None) -> None:
    """Wait until ``task`` is done or ``bound`` seconds passed (None: no bound), through
    the caller's cancellation: an anyio cancel scope cancels the waiting task again at
    every await until the scope is left, and a wait it cut short would return while the
    statement may still commit, leaving the caller's outcome unsettled. The cancellation
    the caller got is re-raised by the caller afterwards."""
    loop = asyncio.get_running_loop()
    deadline = None if bound is None else loop.time() + bound
    while not task.done():
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            return
        try:
            await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError:
            continue


@final
class _Statements:
    """The SQL of one table prefix (validated, so plain identifiers)."""

    __slots__ = (
        "acquire",
        "acquire_view",
        "add_tombstones",
        "append",
        "append_batches",
        "append_group",
        "close",
        "closed_after",
        "closed_first",
        "commit_turn",
        "conversations",
        "conversations_after",
        "conversations_table",
        "create_secret",
        "delete",
        "delete_moves",
        "delete_row",
        "due",
        "ensure_row",
        "erase_batches",
        "erase_leases",
        "erased",
        "expire_batches",
        "expire_leases",
        "expire_moves",
        "expire_rows",
        "forget_erased",
        "functions",
        "id_pages",
        "lock_conversations",
        "lock_row",
        "meta",
        "move_head",
        "new_tombstones",
        "owned",
        "owned_open",
        "read",
        "read_path",
        "release",
        "restore_insert",
        "restore_state",
        "restore_update",
        "retain",
        "scan_ids",
        "scan_ids_first",
        "scan_records",
        "scan_records_first",
        "schema",
        "schema_table",
        "secret",
        "secret_table",
        "set_created",
        "set_secret",
        "set_version",
        "store_used",
        "tombstones_after",
        "tombstones_first",
        "tree",
        "upgrade_branches",
        "upgrade_erasure",
        "upgrade_from_1",
        "version",
        "view",
        "view_path",
        "write_tombstone",
    )

    def __init__(self, prefix: str) -> None:
        conv = f'"{prefix}_conversations"'
        batches = f'"{prefix}_batches"'
        schema = f'"{prefix}_schema"'
        fn = f'"{prefix}_append"'
        leases = f'"{prefix}_leases"'
        acquire_view = f'"{prefix}_acquire_view"'
        commit_turn = f'"{prefix}_commit_turn"'
        moves = f'"{prefix}_moves"'
        move_head = f'"{prefix}_move_head"'
        secret = f'"{prefix}_secret"'
        tombstones = f'"{prefix}_tombstones"'

        def expired(alias: str) -> str:
            """Whether the conversation row ``alias`` has expired by the server's clock."""
            return f"COALESCE({alias}.expires_at <= clock_timestamp(), FALSE)"

        # Closed, or expired by the server's clock (DESIGN §6i: expiry is closure).
        shut = f"(c.closed OR {expired('c')})"
        self.secret_table = secret
        # A lease is the holder's when it was free, expired, or already the holder's
        # (a renewal); the upsert locks the row, so two acquires never both win.
        take_lease = (
            f"INSERT INTO {leases} AS l (conversation_id, holder, expires) "
            "VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second') "
            "ON CONFLICT (conversation_id) DO UPDATE SET "
            "holder = EXCLUDED.holder, expires = EXCLUDED.expires "
            "WHERE l.holder = EXCLUDED.holder OR l.expires <= clock_timestamp()"
        )
        self.conversations_table = conv
        self.schema_table = schema
        self.schema = (
            f"CREATE TABLE IF NOT EXISTS {conv} ("
            'id TEXT COLLATE "C" PRIMARY KEY, '
            "closed BOOLEAN NOT NULL DEFAULT FALSE, "
            "length BIGINT NOT NULL DEFAULT 0)",
            f"CREATE TABLE IF NOT EXISTS {batches} ("
            'conversation_id TEXT COLLATE "C" NOT NULL, '
            "seq BIGINT NOT NULL, "
            'append_id TEXT COLLATE "C" NOT NULL, '
            "digest TEXT NOT NULL, "
            "messages BYTEA NOT NULL, "
            "PRIMARY KEY (conversation_id, seq), "
            "UNIQUE (conversation_id, append_id))",
            f"CREATE TABLE IF NOT EXISTS {schema} ("
            "id INT PRIMARY KEY CHECK (id = 1), version INT NOT NULL)",
            # Version 3: turn leases (creating this table is the upgrade from 2).
            f"CREATE TABLE IF NOT EXISTS {leases} ("
            'conversation_id TEXT COLLATE "C" PRIMARY KEY, '
            "holder TEXT NOT NULL, "
            "expires TIMESTAMPTZ NOT NULL)",
        )
        # Version 5: branches (DESIGN §6h), in idempotent steps (each adds what is
        # missing and fills what is unfilled): the conversation's head (the head
        # batch's seq; NULL: the empty path) and ``branched`` (false while the head path
        # is every batch in seq order: the head was never moved); each batch's parent
        # (seq; NULL for a first batch), stored time (NULL for batches stored before)
        # and path length (messages from the first batch through it); the move ids.
        # Batches stored before are one branch: each one's parent is the batch before
        # it in seq order, the head the last one, path lengths running sums. The append
        # functions of version 4 (no head fence) are dropped: a process still running
        # the old version then fails its appends instead of writing rows without a
        # parent.
        v4_append = "TEXT, TEXT, TEXT, BYTEA, BIGINT, BIGINT"
        self.upgrade_branches = (
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS head BIGINT",
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS branched BOOLEAN NOT NULL DEFAULT FALSE",
            f"ALTER TABLE {batches} ADD COLUMN IF NOT EXISTS parent BIGINT",
            f"ALTER TABLE {batches} ADD COLUMN IF NOT EXISTS created TIMESTAMPTZ",
            f"ALTER TABLE {batches} ADD COLUMN IF NOT EXISTS path_length BIGINT",
            f"CREATE TABLE IF NOT EXISTS {moves} ("
            'conversation_id TEXT COLLATE "C" NOT NULL, '
            'move_id TEXT COLLATE "C" NOT NULL, '
            "head TEXT NOT NULL, "
            "PRIMARY KEY (conversation_id, move_id))",
            f"UPDATE {conv} c SET head = (SELECT MAX(b.seq) FROM {batches} b "
            "WHERE b.conversation_id = c.id) WHERE c.head IS NULL AND NOT c.branched",
            # json (not jsonb): it accepts every string JSON allows, \u0000 included.
            f"UPDATE {batches} b SET parent = s.parent, path_length = s.path_length FROM ("
            "SELECT conversation_id, seq, LAG(seq) OVER w AS parent, "
            "SUM(json_array_length(convert_from(messages, 'UTF8')::json)) OVER w AS path_length "
            f"FROM {batches} WHERE conversation_id IN (SELECT conversation_id FROM {batches} "
            "WHERE path_length IS NULL) "
            "WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)) s "
            "WHERE b.conversation_id = s.conversation_id AND b.seq = s.seq "
            "AND b.path_length IS NULL",
            f"DROP FUNCTION IF EXISTS {fn}({v4_append})",
            f"DROP FUNCTION IF EXISTS {commit_turn}({v4_append}, TEXT)",
        )

        # Reads. A conversation that never branched (its head was never moved) has every
        # batch in seq order as its head path, read as before branches (a scan of its
        # primary key), the branched flag checked once, in the key the scan looks up (no
        # cost per batch); one that has branched
        # reads nothing there (``read``: no rows; ``view``: its last column set) and
        # its reader runs ``read_path`` / ``view_path`` instead: the seqs of the head
        # path, walking parents up from the head (``cid``: the conversation id's
        # parameter). The flag never goes back, so the second statement sees a
        # conversation that has branched too (a later snapshot, as consistent). A
        # closed or expired conversation reads no batch (expired: until expire()
        # deletes them).
        def path(cid: str) -> str:
            return (
                "WITH RECURSIVE path(seq) AS ("
                f"SELECT h.head FROM {conv} h WHERE h.id = {cid} AND h.head IS NOT NULL "
                f"AND NOT h.closed AND NOT {expired('h')} "
                f"UNION ALL SELECT p.parent FROM path JOIN {batches} p "
                f"ON p.conversation_id = {cid} AND p.seq = path.seq WHERE p.parent IS NOT NULL) "
            )

        def view(cid: str, held: str, flag: str) -> str:
            return (
                f"SELECT {held}{shut}, c.length, b.append_id, b.digest, b.messages{flag} "
                f"FROM {conv} c LEFT JOIN {batches} b ON b.conversation_id = "
                f"CASE WHEN NOT {shut} AND NOT c.branched THEN c.id END "
                f"WHERE c.id = {cid} ORDER BY b.seq"
            )

        def view_path(cid: str, held: str) -> str:
            return (
                f"{path(cid)}SELECT {held}{shut}, c.length, b.append_id, b.digest, "
                f"b.messages FROM {conv} c LEFT JOIN {batches} b "
                f"ON b.conversation_id = c.id AND NOT {shut} "
                "AND b.seq IN (SELECT path.seq FROM path) "
                f"WHERE c.id = {cid} ORDER BY b.seq"
            )

        # The conversation row of p_cid locked (created when missing: an id created so
        # is checked for its tombstone, read after the row lock so an erase that
        # committed meanwhile is seen, and removed again when erased). v_closed: closed
        # or expired.
        lock_conversation = (
            f"  SELECT {shut}, c.length, c.head INTO v_closed, v_length, v_head FROM {conv} c\n"
            "    WHERE c.id = p_cid FOR UPDATE;\n"
            "  IF NOT FOUND THEN\n"
            f"    INSERT INTO {conv} (id) VALUES (p_cid) ON CONFLICT (id) DO NOTHING;\n"
            f"    SELECT {shut}, c.length, c.head INTO v_closed, v_length, v_head FROM {conv} c\n"
            "      WHERE c.id = p_cid FOR UPDATE;\n"
            f"    IF EXISTS (SELECT 1 FROM {tombstones} t WHERE t.tombstone = p_tombstone) THEN\n"
            f"      DELETE FROM {conv} WHERE id = p_cid;\n"
            "      RETURN 'closed';\n"
            "    END IF;\n"
            "  END IF;\n"
            "  IF v_closed THEN RETURN 'closed'; END IF;\n"
        )
        # One definition of each function (the upgrade drops every earlier argument
        # list, see upgrade_erasure).
        self.functions = (
            # Runs as one statement, so one transaction; plpgsql takes a fresh snapshot per
            # statement, so the reads after the row lock see every committed batch. The
            # order of the checks is DESIGN §6b's: closed (cleared, expired or erased),
            # dedupe record (across every branch), fence (the head path's length and the
            # head); the batch's parent is the head, its path length the head path's plus
            # its own. The first batch of the conversation records p_owner; an inserted
            # batch moves the expiry by p_retention seconds (NULL: none) unless the
            # conversation has its own (retained).
            f"CREATE OR REPLACE FUNCTION {fn}("
            "p_cid TEXT, p_aid TEXT, p_digest TEXT, p_messages BYTEA, p_count BIGINT, "
            "p_expected BIGINT, p_expected_head TEXT, p_owner TEXT, p_tombstone TEXT, "
            "p_retention FLOAT8) "
            "RETURNS TEXT LANGUAGE plpgsql AS $fn$\n"
            "DECLARE v_closed BOOLEAN; v_length BIGINT; v_head BIGINT; v_digest TEXT;\n"
            "  v_head_id TEXT := ''; v_seq BIGINT;\n"
            "BEGIN\n"
            f"{lock_conversation}"
            f"  SELECT b.digest INTO v_digest FROM {batches} b\n"
            "    WHERE b.conversation_id = p_cid AND b.append_id = p_aid;\n"
            "  IF FOUND THEN RETURN 'accepted:' || v_digest; END IF;\n"
            "  IF p_expected_head IS NOT NULL AND v_head IS NOT NULL THEN\n"
            f"    SELECT COALESCE(b.append_id, '') INTO v_head_id FROM {batches} b\n"
            "      WHERE b.conversation_id = p_cid AND b.seq = v_head;\n"
            "  END IF;\n"
            "  IF (p_expected IS NOT NULL AND p_expected <> v_length)\n"
            "      OR (p_expected_head IS NOT NULL AND p_expected_head <> v_head_id) THEN\n"
            "    RETURN 'changed:' || v_length || ':' || v_head_id;\n"
            "  END IF;\n"
            f"  SELECT COALESCE(MAX(b.seq), 0) + 1 INTO v_seq FROM {batches} b\n"
            "    WHERE b.conversation_id = p_cid;\n"
            f"  INSERT INTO {batches} (conversation_id, seq, append_id, digest, messages,\n"
            "      parent, created, path_length)\n"
            "    VALUES (p_cid, v_seq, p_aid, p_digest, p_messages, v_head, clock_timestamp(),\n"
            "      v_length + p_count);\n"
            f"  UPDATE {conv} SET length = v_length + p_count, head = v_seq,\n"
            "    owner = CASE WHEN v_seq = 1 THEN COALESCE(owner, p_owner) ELSE owner END,\n"
            "    expires_at = CASE WHEN retained OR p_retention IS NULL THEN expires_at\n"
            "      ELSE clock_timestamp() + p_retention * interval '1 second' END\n"
            "    WHERE id = p_cid;\n"
            "  RETURN 'inserted';\n"
            "END\n"
            "$fn$",
            # Version 4: the folded lease steps, one round trip each.
            # acquire_view: the lease upsert, then (when it is the holder's) the view of
            # the head path, in one transaction. The view's statement takes its snapshot
            # after the upsert holds the lease row, and a previous holder's commit_turn
            # appended and released in one transaction, so the view holds every batch it
            # appended. The first column says whether the lease is the holder's (one row
            # of NULLs when not); an unknown conversation is one row (held, open, 0).
            # Its transaction writes only the lease, and commits without waiting for
            # the WAL flush (synchronous_commit off, for this transaction only): a
            # lease is not history, and the flush was most of the step's cost.
            # Version 5: the head path (a walk from the head once the conversation has
            # branched); expired is closed, and an unknown id closed when its tombstone
            # (p_tombstone) is stored.
            f"CREATE OR REPLACE FUNCTION {acquire_view}("
            "p_cid TEXT, p_holder TEXT, p_ttl FLOAT8, p_tombstone TEXT) "
            "RETURNS TABLE (r_held BOOLEAN, r_closed BOOLEAN, r_length BIGINT, "
            "r_append_id TEXT, r_digest TEXT, r_messages BYTEA) "
            "LANGUAGE plpgsql AS $fn$\n"
            "BEGIN\n"
            "  PERFORM set_config('synchronous_commit', 'off', true);\n"
            "  "
            + take_lease.replace("$1", "p_cid").replace("$2", "p_holder").replace("$3", "p_ttl")
            + ";\n"
            "  IF NOT FOUND THEN\n"
            "    RETURN QUERY SELECT FALSE, NULL::BOOLEAN, NULL::BIGINT, NULL::TEXT, NULL::TEXT,\n"
            "      NULL::BYTEA;\n"
            "    RETURN;\n"
            "  END IF;\n"
            f"  IF (SELECT c.branched AND NOT {shut} FROM {conv} c WHERE c.id = p_cid) THEN\n"
            f"    RETURN QUERY {view_path('p_cid', 'TRUE, ')};\n"
            "  ELSE\n"
            f"    RETURN QUERY {view('p_cid', 'TRUE, ', '')};\n"
            "  END IF;\n"
            "  IF NOT FOUND THEN\n"
            "    RETURN QUERY SELECT TRUE,\n"
            f"      EXISTS (SELECT 1 FROM {tombstones} t WHERE t.tombstone = p_tombstone),\n"
            "      0::BIGINT, NULL::TEXT, NULL::TEXT, NULL::BYTEA;\n"
            "  END IF;\n"
            "END\n"
            "$fn$",
            # commit_turn: the append function and, when the batch landed or is a retry
            # of the same batch, the holder's lease expired, in one transaction (a
            # refused append leaves the lease). Expired in place rather than deleted:
            # an expired row is a free lease to acquire and "not held" to release, and
            # an update of the unindexed expiry is a heap-only update.
            f"CREATE OR REPLACE FUNCTION {commit_turn}("
            "p_cid TEXT, p_aid TEXT, p_digest TEXT, p_messages BYTEA, p_count BIGINT, "
            "p_expected BIGINT, p_expected_head TEXT, p_owner TEXT, p_tombstone TEXT, "
            "p_retention FLOAT8, p_holder TEXT) "
            "RETURNS TEXT LANGUAGE plpgsql AS $fn$\n"
            "DECLARE v_outcome TEXT;\n"
            "BEGIN\n"
            f"  v_outcome := {fn}(p_cid, p_aid, p_digest, p_messages, p_count, p_expected,\n"
            "    p_expected_head, p_owner, p_tombstone, p_retention);\n"
            "  IF v_outcome = 'inserted' OR v_outcome = 'accepted:' || p_digest THEN\n"
            f"    UPDATE {leases} SET expires = '-infinity'\n"
            "      WHERE conversation_id = p_cid AND holder = p_holder;\n"
            "  END IF;\n"
            "  RETURN v_outcome;\n"
            "END\n"
            "$fn$",
            # Version 5: move_head, one transaction: the row lock, closure (cleared,
            # expired, or erased: p_tombstone), the move record, the fence, the target,
            # the move (the target's seq and its stored path length: no messages read),
            # the move record. A move does not change the expiry (not an append).
            f"CREATE OR REPLACE FUNCTION {move_head}("
            "p_cid TEXT, p_head TEXT, p_expected TEXT, p_move TEXT, p_tombstone TEXT) "
            "RETURNS TEXT LANGUAGE plpgsql AS $fn$\n"
            "DECLARE v_closed BOOLEAN; v_length BIGINT; v_head BIGINT; v_current TEXT := '';\n"
            "  v_recorded TEXT; v_seq BIGINT; v_new BIGINT := 0;\n"
            "BEGIN\n"
            f"{lock_conversation}"
            "  IF p_move IS NOT NULL THEN\n"
            f"    SELECT m.head INTO v_recorded FROM {moves} m\n"
            "      WHERE m.conversation_id = p_cid AND m.move_id = p_move;\n"
            "    IF FOUND THEN\n"
            "      IF v_recorded <> p_head THEN RETURN 'recorded:' || v_recorded; END IF;\n"
            "      IF p_head = '' THEN RETURN 'moved:0'; END IF;\n"
            f"      SELECT b.path_length INTO v_new FROM {batches} b\n"
            "        WHERE b.conversation_id = p_cid AND b.append_id = p_head;\n"
            "      IF NOT FOUND THEN RETURN 'unknown'; END IF;\n"
            "      RETURN 'moved:' || v_new;\n"
            "    END IF;\n"
            "  END IF;\n"
            "  IF v_head IS NOT NULL THEN\n"
            f"    SELECT COALESCE(b.append_id, '') INTO v_current FROM {batches} b\n"
            "      WHERE b.conversation_id = p_cid AND b.seq = v_head;\n"
            "  END IF;\n"
            "  IF v_current <> p_expected THEN\n"
            "    RETURN 'changed:' || v_length || ':' || v_current;\n"
            "  END IF;\n"
            "  IF p_head <> '' THEN\n"
            f"    SELECT b.seq, b.path_length INTO v_seq, v_new FROM {batches} b\n"
            "      WHERE b.conversation_id = p_cid AND b.append_id = p_head;\n"
            "    IF NOT FOUND THEN RETURN 'unknown'; END IF;\n"
            "  END IF;\n"
            "  IF v_seq IS DISTINCT FROM v_head THEN\n"
            f"    UPDATE {conv} SET head = v_seq, length = v_new, branched = TRUE\n"
            "      WHERE id = p_cid;\n"
            "  END IF;\n"
            "  IF p_move IS NOT NULL THEN\n"
            f"    INSERT INTO {moves} (conversation_id, move_id, head)\n"
            "      VALUES (p_cid, p_move, p_head);\n"
            "  END IF;\n"
            "  RETURN 'moved:' || v_new;\n"
            "END\n"
            "$fn$",
        )
        # scope 0.1 (version 1): no length column, a four-argument append function.
        self.upgrade_from_1 = (
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS length BIGINT NOT NULL DEFAULT 0",
            # json (not jsonb): it accepts every string JSON allows, \u0000 included.
            f"UPDATE {conv} c SET length = s.n FROM ("
            "SELECT conversation_id, "
            "SUM(json_array_length(convert_from(messages, 'UTF8')::json))::BIGINT AS n "
            f"FROM {batches} GROUP BY conversation_id) s WHERE c.id = s.conversation_id",
            f"DROP FUNCTION IF EXISTS {fn}(TEXT, TEXT, TEXT, BYTEA)",
        )
        self.version = f"SELECT version FROM {schema} WHERE id = 1"
        self.set_version = (
            f"INSERT INTO {schema} (id, version) VALUES (1, $1) "
            "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version"
        )
        self.append = f"SELECT {fn}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        # Group commit (PostgresStore._send_group), one statement, the arrays sorted by
        # conversation id: first the rows of the group's conversations that no other
        # transaction holds are locked (SKIP LOCKED: never a wait; the materialized
        # CTEs run before the select list), then the append function runs once per
        # batch, in the arrays' order (a function scan returns its rows in order and the
        # select list runs once per row, each call seeing the ones before it). A batch
        # whose conversation's row exists but was not locked (another transaction holds
        # it) is answered NULL (busy) and not appended; a conversation without a row
        # yet is created by the function (its tombstone checked), in sorted order.
        self.append_group = (
            "WITH l AS MATERIALIZED (SELECT c.id FROM "
            f"{conv} c WHERE c.id = ANY($1::text[]) ORDER BY c.id FOR UPDATE SKIP LOCKED), "
            "k AS MATERIALIZED (SELECT ARRAY(SELECT l.id FROM l) AS locked, "
            f"ARRAY(SELECT c.id FROM {conv} c WHERE c.id = ANY($1::text[])) AS known) "
            "SELECT CASE WHEN a.cid = ANY(k.locked) OR NOT a.cid = ANY(k.known) THEN "
            f"{fn}(a.cid, a.aid, a.digest, a.messages, a.count, a.expected, a.head, "
            "a.owner, a.tombstone, $10) END FROM k CROSS JOIN "
            "unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[], "
            "$6::bigint[], $7::text[], $8::text[], $9::text[]) "
            "AS a(cid, aid, digest, messages, count, expected, head, owner, tombstone)"
        )
        # A group of one conversation ($1; $9 its tombstone): the append function once
        # per batch, in the arrays' order, one statement.
        self.append_batches = (
            f"SELECT {fn}($1, a.aid, a.digest, a.messages, a.count, a.expected, a.head, "
            "a.owner, $9, $10) FROM "
            "unnest($2::text[], $3::text[], $4::bytea[], $5::bigint[], $6::bigint[], "
            "$7::text[], $8::text[]) AS a(aid, digest, messages, count, expected, head, owner)"
        )
        self.commit_turn = f"SELECT {commit_turn}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        # A restored batch's stored time (parameters: the conversation id, the append
        # id, Unix seconds), in the transaction of the append that inserted it.
        self.set_created = (
            f"UPDATE {batches} SET created = to_timestamp($3::float8) "
            "WHERE conversation_id = $1 AND append_id = $2"
        )
        self.move_head = f"SELECT {move_head}($1, $2, $3, $4, $5)"
        self.acquire_view = f"SELECT * FROM {acquire_view}($1, $2, $3, $4)"
        # Nothing of an expired conversation (until expire()) is read.
        self.read = (
            f"SELECT append_id, digest, messages FROM {batches} WHERE conversation_id = "
            f"(SELECT CASE WHEN h.branched OR {expired('h')} THEN NULL ELSE h.id END "
            f"FROM {conv} h WHERE h.id = $1) ORDER BY seq"
        )
        self.read_path = (
            f"{path('$1')}SELECT b.append_id, b.digest, b.messages FROM path JOIN {batches} b "
            "ON b.conversation_id = $1 AND b.seq = path.seq ORDER BY b.seq"
        )
        self.tree = (
            f"SELECT {shut}, c.head, b.seq, b.parent, "
            "extract(epoch FROM b.created)::float8, b.append_id, b.digest, b.messages "
            f"FROM {conv} c LEFT JOIN {batches} b ON b.conversation_id = c.id AND NOT {shut} "
            "WHERE c.id = $1 ORDER BY b.seq"
        )
        # scan_records: keyset pages over the primary key (conversation_id, seq).
        self.scan_ids_first = (
            f"SELECT DISTINCT conversation_id FROM {batches} ORDER BY conversation_id LIMIT $1"
        )
        self.scan_ids = (
            f"SELECT DISTINCT conversation_id FROM {batches} WHERE conversation_id > $1 "
            "ORDER BY conversation_id LIMIT $2"
        )
        self.scan_records_first = (
            f"SELECT seq, append_id, digest, messages FROM {batches} "
            "WHERE conversation_id = $1 ORDER BY seq LIMIT $2"
        )
        self.scan_records = (
            f"SELECT seq, append_id, digest, messages FROM {batches} "
            "WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        )
        # The last column: the head path is a walk (branched, and open).
        self.view = view("$1", "", f", c.branched AND NOT {shut}")
        self.view_path = view_path("$1", "")
        self.close = (
            f"INSERT INTO {conv} (id, closed) VALUES ($1, TRUE) "
            "ON CONFLICT (id) DO UPDATE SET closed = TRUE, expires_at = NULL, retained = FALSE"
        )
        self.delete = f"DELETE FROM {batches} WHERE conversation_id = $1"
        self.delete_moves = f"DELETE FROM {moves} WHERE conversation_id = $1"
        # One statement each.
        self.acquire = f"{take_lease} RETURNING TRUE"
        self.release = (
            f"WITH gone AS (DELETE FROM {leases} WHERE conversation_id = $1 AND holder = $2 "
            "RETURNING expires) SELECT COALESCE(bool_or(expires > clock_timestamp()), FALSE) "
            "FROM gone"
        )
        # Listed: open, unexpired, holding a batch. A row whose fenced append was
        # refused holds no batch (length 0, never branched): not listed; one rewound to
        # its start (length 0) still holds its batches (it has branched): listed.
        # Keyset pages: $1 the last id of the previous page (NULL: from the first), $2
        # the page size (NULL: no limit).
        listed = (
            "NOT closed AND (length > 0 OR branched) "
            "AND NOT COALESCE(expires_at <= clock_timestamp(), FALSE)"
        )
        self.conversations = f"SELECT id FROM {conv} WHERE {listed} ORDER BY id LIMIT $1::bigint"
        self.conversations_after = (
            f"SELECT id FROM {conv} WHERE {listed} AND id > $1 ORDER BY id LIMIT $2::bigint"
        )
        # -- version 5: retention and erasure (DESIGN §6i) ------------------------------
        # Every argument list the functions had before this one (version 4's, and the
        # version 5 lists of the branch-only and erasure-only development lines: a
        # function with one name has one definition, so GRANT EXECUTE names one).
        earlier = (
            f"{fn}({v4_append})",
            f"{fn}({v4_append}, TEXT)",
            f"{fn}({v4_append}, TEXT, TEXT, FLOAT8)",
            f"{commit_turn}({v4_append}, TEXT)",
            f"{commit_turn}({v4_append}, TEXT, TEXT)",
            f"{commit_turn}({v4_append}, TEXT, TEXT, FLOAT8, TEXT)",
            f"{acquire_view}(TEXT, TEXT, FLOAT8)",
            f"{move_head}(TEXT, TEXT, TEXT, TEXT)",
        )
        self.upgrade_erasure = (
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS owner TEXT",
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ",
            f"ALTER TABLE {conv} ADD COLUMN IF NOT EXISTS retained BOOLEAN NOT NULL DEFAULT FALSE",
            f'CREATE INDEX IF NOT EXISTS "{prefix}_owners" ON {conv} (owner, id) '
            "WHERE owner IS NOT NULL",
            f'CREATE INDEX IF NOT EXISTS "{prefix}_expiry" ON {conv} (expires_at) '
            "WHERE expires_at IS NOT NULL",
            f"CREATE TABLE IF NOT EXISTS {secret} ("
            "id INT PRIMARY KEY CHECK (id = 1), secret BYTEA NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {tombstones} ("
            'tombstone TEXT COLLATE "C" PRIMARY KEY, erased_at TIMESTAMPTZ NOT NULL)',
            *(f"DROP FUNCTION IF EXISTS {signature}" for signature in earlier),
        )
        self.create_secret = (
            f"INSERT INTO {secret} (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING"
        )
        self.secret = f"SELECT secret FROM {secret} WHERE id = 1"
        # read_meta: the row's owner, expiry and retention flag beside each recorded move
        # (one row of NULLs when neither), one statement.
        # read_meta (parameters: the id, its tombstone): the owner, the expiry (NULL
        # once closed), the retention flag, the closure ('erased': the tombstone;
        # 'expired': expire() removed it, or its expiry passed; 'cleared'), beside each
        # recorded move, one statement.
        self.meta = (
            "SELECT c.owner, CASE WHEN c.closed THEN NULL "
            "ELSE extract(epoch FROM c.expires_at)::float8 END, c.retained, "
            f"CASE WHEN EXISTS (SELECT 1 FROM {tombstones} WHERE tombstone = $2) "
            "THEN 'erased' WHEN c.closed AND c.expires_at = 'infinity' THEN 'expired' "
            "WHEN c.closed THEN 'cleared' "
            "WHEN c.expires_at <= clock_timestamp() THEN 'expired' END, "
            f"m.move_id, m.head FROM (SELECT 1) AS one LEFT JOIN {conv} c ON c.id = $1 "
            f"LEFT JOIN {moves} m ON m.conversation_id = $1"
        )
        self.erased = f"SELECT EXISTS (SELECT 1 FROM {tombstones} WHERE tombstone = $1)"
        self.forget_erased = (
            f"DELETE FROM {conv} WHERE id = $1 AND "
            f"EXISTS (SELECT 1 FROM {tombstones} WHERE tombstone = $2)"
        )
        self.owned_open = (
            f"SELECT id FROM {conv} WHERE {listed} AND owner = $1 "
            "AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3::bigint"
        )
        self.owned = f"SELECT id FROM {conv} WHERE owner = $1 ORDER BY id LIMIT $2::bigint"
        self.ensure_row = f"INSERT INTO {conv} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING"
        self.lock_row = f"SELECT {shut} FROM {conv} c WHERE c.id = $1 FOR UPDATE"
        self.delete_row = f"DELETE FROM {conv} WHERE id = $1"
        self.retain = (
            f"UPDATE {conv} SET retained = TRUE, expires_at = to_timestamp($2::float8) "
            "WHERE id = $1"
        )
        self.due = (
            f"SELECT id FROM {conv} WHERE NOT closed AND expires_at <= "
            "COALESCE(to_timestamp($1::float8), clock_timestamp()) "
            "ORDER BY expires_at LIMIT $2::bigint FOR UPDATE"
        )
        self.expire_batches = f"DELETE FROM {batches} WHERE conversation_id = ANY($1::text[])"
        self.expire_leases = f"DELETE FROM {leases} WHERE conversation_id = ANY($1::text[])"
        self.expire_moves = f"DELETE FROM {moves} WHERE conversation_id = ANY($1::text[])"
        self.expire_rows = (  # 'infinity': closed by expire() (read_meta's "expired")
            f"UPDATE {conv} SET closed = TRUE, expires_at = 'infinity', retained = FALSE "
            "WHERE id = ANY($1::text[])"
        )
        self.erase_batches = (
            f"DELETE FROM {batches} WHERE conversation_id = $1 "
            "RETURNING seq, digest, octet_length(messages)"
        )
        self.erase_leases = f"DELETE FROM {leases} WHERE conversation_id = $1"
        self.write_tombstone = (
            f"INSERT INTO {tombstones} (tombstone, erased_at) VALUES ($1, clock_timestamp()) "
            "ON CONFLICT (tombstone) DO UPDATE SET erased_at = EXCLUDED.erased_at "
            "RETURNING extract(epoch FROM erased_at)::float8"
        )
        # -- restore (DESIGN §6n) ------------------------------------------------------
        # Closed: cleared (closed), removed by expire() (closed, 'infinity'), or due by
        # the server's clock. Keyset pages ($1 the page size, $2 the last id), the first
        # one apart so a page after an id seeks to it in the primary key.
        closed_page = (
            "SELECT id, CASE WHEN closed AND expires_at = 'infinity' THEN 'expired' "
            "WHEN closed THEN 'cleared' ELSE 'expired' END, owner, length "
            f"FROM {conv} c WHERE {shut}"
        )
        self.closed_first = f"{closed_page} ORDER BY id LIMIT $1::bigint"
        self.closed_after = f"{closed_page} AND id > $2 ORDER BY id LIMIT $1::bigint"
        # A restored closed conversation ($2: expired, else cleared) as clear or expire()
        # leaves it: no head, no expiry, not retained. The insert answers TRUE when it
        # wrote the row; the update rewrites a row without a batch.
        self.restore_insert = (
            f"INSERT INTO {conv} (id, closed, length, owner, expires_at, retained) "
            "VALUES ($1, TRUE, $3, $4, CASE WHEN $2::boolean THEN 'infinity'::timestamptz "
            "END, FALSE) ON CONFLICT (id) DO NOTHING RETURNING TRUE"
        )
        self.restore_update = (
            f"UPDATE {conv} SET closed = TRUE, length = $3, owner = $4, "
            "expires_at = CASE WHEN $2::boolean THEN 'infinity'::timestamptz END, "
            "retained = FALSE, head = NULL, branched = FALSE WHERE id = $1"
        )
        self.restore_state = (
            f"SELECT c.closed, c.closed AND c.expires_at = 'infinity', {expired('c')}, "
            f"c.owner, c.length, EXISTS (SELECT 1 FROM {batches} b WHERE b.conversation_id "
            f"= c.id) FROM {conv} c WHERE c.id = $1 FOR UPDATE"
        )
        self.tombstones_first = (
            f"SELECT tombstone FROM {tombstones} ORDER BY tombstone LIMIT $1::bigint"
        )
        self.tombstones_after = (
            f"SELECT tombstone FROM {tombstones} WHERE tombstone > $2 "
            "ORDER BY tombstone LIMIT $1::bigint"
        )
        # SHARE ROW EXCLUSIVE: one restore at a time, no write to the table meanwhile,
        # reads go on (needs UPDATE on the table, as appends do; FOR UPDATE on the secret
        # row would need UPDATE on the secret table, which the application role lacks).
        self.lock_conversations = f"LOCK TABLE {conv} IN SHARE ROW EXCLUSIVE MODE"
        self.store_used = (
            f"SELECT EXISTS (SELECT 1 FROM {conv}) OR EXISTS (SELECT 1 FROM {batches}) "
            f"OR EXISTS (SELECT 1 FROM {tombstones})"
        )
        self.set_secret = f"UPDATE {secret} SET secret = $1 WHERE id = 1"
        self.new_tombstones = (
            "SELECT m FROM unnest($1::text[]) AS m WHERE NOT EXISTS "
            f"(SELECT 1 FROM {tombstones} t WHERE t.tombstone = m) ORDER BY m"
        )
        self.add_tombstones = (
            f"WITH added AS (INSERT INTO {tombstones} (tombstone, erased_at) "
            "SELECT m, clock_timestamp() FROM unnest($1::text[]) AS m "
            "ON CONFLICT (tombstone) DO NOTHING RETURNING 1) SELECT count(*) FROM added"
        )
        self.id_pages = tuple(
            (
                where,
                f"SELECT DISTINCT {column} FROM {table} WHERE $1::text IS NULL OR {column} > $1 "
                f"ORDER BY {column} LIMIT {_ID_PAGE}",
            )
            for where, table, column in (
                ("the conversations table", conv, "id"),
                ("the batches table", batches, "conversation_id"),
                ("the leases table", leases, "conversation_id"),
                ("the moves table", moves, "conversation_id"),
            )
        )
