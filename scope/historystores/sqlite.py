"""``SQLiteStore``: the embedded default history store, on the standard library's sqlite3.

One file holds any number of conversations; several ``SQLiteStore`` handles, in one
process or many, may share it (WAL mode, ``BEGIN IMMEDIATE`` write transactions and a
busy timeout). Every database call runs on a worker thread through
``anyio.to_thread.run_sync``, so the event loop never waits on the database and the store
works the same under asyncio and trio. The records a read fetched are checked and decoded
on the caller's thread once the call is done, as every store does: decoding is Python work
that holds the GIL wherever it runs, and on the worker thread it measured about a fifth
slower (benchmarks/RESULTS.md).

Schema version 5 (``{prefix}`` is ``table_prefix``, default ``scope_history``):

    {prefix}_conversations(id TEXT PRIMARY KEY, closed INTEGER, length INTEGER,
                           head INTEGER, branched INTEGER, owner TEXT,
                           expires_at REAL, retained INTEGER)
        INDEX {prefix}_owners (owner, id), INDEX {prefix}_expiry (expires_at)
    {prefix}_batches(conversation_id, seq, append_id, digest, messages BLOB,
                     parent INTEGER, created REAL, path_length INTEGER)
        PRIMARY KEY (conversation_id, seq), UNIQUE (conversation_id, append_id)
    {prefix}_schema(id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER)
    {prefix}_leases(conversation_id TEXT PRIMARY KEY, holder TEXT, expires REAL)
    {prefix}_moves(conversation_id TEXT, move_id TEXT, head TEXT)
        PRIMARY KEY (conversation_id, move_id)
    {prefix}_secret(id INTEGER PRIMARY KEY CHECK (id = 1), secret BLOB)
    {prefix}_tombstones(tombstone TEXT PRIMARY KEY, erased_at REAL)

A conversation is a tree of batches (DESIGN §6h): each batch row names its ``parent``
(the seq of the batch it follows; NULL for a first batch), when it was stored
(``created``, Unix seconds by the host's clock) and its ``path_length`` (the messages
from the first batch through it). The conversation row holds the ``head`` (the head
batch's seq; NULL: the empty path) and ``length``, the number of messages on the head
path (the ``expected_length`` fence compares with it, the ``expected_head`` fence with
the head's append id). An append inserts a batch whose parent is the head and makes it
the head, reading only the conversation row (no walk of the tree); ``move_head`` sets the
head and its path length from the target's row and records its move id in ``_moves``.
``branched`` is set once the head has moved: until then the head path is every batch in
seq order and reads scan it as before branches; after, they walk parents from the head.
Retention and erasure (DESIGN §6i): the conversation row holds the ``owner`` its first
append recorded, ``expires_at`` (Unix seconds by the host's clock; NULL: never) and
``retained`` (1: its own setting, which appends do not move); an expired conversation is
closed in every step from that moment. ``closed`` is 0 (open), 1 (``clear``) or 2
(``expire`` removed it: ``read_meta``'s ``"expired"``; earlier versions wrote 1 there).
``erase`` deletes every row naming the id (every
branch's batches, its lease, move records and conversation row) and writes its
tombstone, the HMAC-SHA256 of the id under the store secret (``_secret``, 32 random
bytes made with the schema).
Version 4 had neither: ``open(create=True)`` upgrades it in place
(``_upgrade_branches`` then ``_upgrade_erasure``, idempotent steps), keeping its batches
as one branch (each one's parent the batch before it, the head the last one, path
lengths the running sums, ``created`` NULL) and every conversation without an owner or
an expiry.
Version 1 (scope 0.1) had no ``length`` and no ``_schema`` table, and
``open(create=True)`` upgrades it in place, counting each conversation's messages.
Version 2 had no ``_leases`` table (turn leases, ``acquire_turn``/``release_turn``);
the upgrade creates it. Version 4 changed PostgreSQL only (its folded lease
functions): upgrading a version 3 file records the number. A lease's ``expires`` is
Unix time in seconds by the clock of the host running SQLite (``julianday('now')``), so
processes sharing the file agree on it.
Version 5 (retention and erasure, DESIGN §6i, ``_upgrade_erasure``): a conversation's
``owner`` (recorded by the append of its first batch), ``expires_at`` (the same clock;
NULL: never; moved by each append under a store-wide ``retention`` unless ``retained``,
its own ``retain`` setting) and the erased ids' tombstones, keyed by an HMAC of the id
under the store secret made with the schema.

A batch is one row holding its canonical encoded messages; reading checks every row
against its digest, so a record changed outside scope raises ``StoreError``.

Restore (``scope.history.Restorer``, DESIGN §6n), each step one statement or one
``BEGIN IMMEDIATE`` transaction: ``closed_conversations`` lists the closed rows (closed 1
or 2, or due by the clock) over the primary key, ``tombstones`` the tombstones table in
order; ``restore_closed`` writes a conversation row closed (no head, expiry or batch)
unless the id is erased, holds a batch or is closed otherwise; ``restore_erasures``
replaces the ``_secret`` row only in a file holding no conversation row, batch or
tombstone, then inserts the tombstones not stored yet (``erased_at``: the time of the
restore, by the same clock as ``erase``).

Erasure on disk: every connection runs with ``PRAGMA secure_delete = ON``, so what
``erase`` (and ``clear``, ``expire``) deletes is overwritten with zeros in the pages it
frees; the WAL file still holds the frames written when the batches were appended until
it is checkpointed and truncated: ``PRAGMA wal_checkpoint(TRUNCATE)`` finishes the job
(``VACUUM`` also shrinks the file).

Durability: ``synchronous="NORMAL"`` (the default) with WAL loses nothing a killed
process acknowledged; after a power loss or OS crash the last acknowledged transactions
may be rolled back (never torn). ``synchronous="FULL"`` (or ``"EXTRA"``) syncs the WAL on
every commit and survives power loss, at a cost in append throughput.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Generic, Literal, TypeVar, final

import anyio.to_thread

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
    in_thread,
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
    message_count,
    schema_mismatch,
    validate_table_prefix,
)
from scope.historystores._store import (
    fence_refuses,
    releases,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

Synchronous = Literal["NORMAL", "FULL", "EXTRA"]
_SYNCHRONOUS: Final = ("NORMAL", "FULL", "EXTRA")


#: Now, in Unix seconds with fractions, by the clock of the host running SQLite.
_NOW: Final = "(julianday('now') - 2440587.5) * 86400.0"

#: Worker threads per store handle under asyncio: calls beyond it queue (writes queue on
#: the handle's write lock anyway).
_THREADS: Final = 16

#: Every sqlite3 error (the root of all the module raises) becomes a ``StoreError``.
_DRIVER: Final = Driver("SQLite", errors=(sqlite3.Error,))


class _Job(Generic[T]):
    """One body of a group write (``_Pool.group_write``) and its outcome."""

    __slots__ = ("body", "done", "error", "result")

    def __init__(self, body: Callable[[sqlite3.Connection], T]) -> None:
        self.body = body
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def finish(self, result: T) -> None:
        self.result, self.done = result, True

    def run_alone(self, conn: sqlite3.Connection) -> None:
        """Run the body in a transaction of its own; its error is kept for its caller."""
        try:
            self.result = _transaction(conn, lambda: self.body(conn))
        except Exception as exc:
            self.error = exc
        self.done = True

    def outcome(self) -> T:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.result  # type: ignore[return-value]


class _Pool:
    """sqlite3 connections for worker threads. Lives entirely on the thread side.

    A connection is used by one thread at a time; idle ones are kept for reuse (up to
    ``max_idle``). ``write_lock`` serialises this handle's write transactions, so threads
    of one handle queue on a lock instead of on SQLite's sleeping busy handler; other
    handles and processes are kept out by ``BEGIN IMMEDIATE`` and the busy timeout.
    """

    def __init__(
        self, path: str, synchronous: str, busy_timeout: float, max_idle: int, tables: _Tables
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.max_idle = max_idle
        self.tables = tables
        # The store secret (the tombstones' HMAC key), read at open.
        self.secret = b""
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.idle: list[sqlite3.Connection] = []
        # Appends waiting for write_lock, run together by the next holder (group_write).
        self.queued: list[_Job[Any]] = []
        self.closed = False
        # The worker threads of this handle's calls under asyncio (see in_thread); trio
        # calls run on anyio's.
        self.executor = ThreadPoolExecutor(_THREADS, thread_name_prefix="scope-sqlite")

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # autocommit: transactions are explicit BEGIN IMMEDIATE
            check_same_thread=False,  # a pooled connection moves between worker threads
            cached_statements=64,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # Deleted content is overwritten with zeros (whatever the build's default),
            # so an erased conversation leaves nothing in free pages (see erase).
            conn.execute("PRAGMA secure_delete = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def take(self) -> sqlite3.Connection:
        with self.lock:
            if self.closed:
                raise store_closed("SQLiteStore")
            if self.idle:
                return self.idle.pop()
        return self.connect()

    def give(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            # Only reached when a rollback itself failed: the connection is suspect.
            conn.close()
            return
        with self.lock:
            if not self.closed and len(self.idle) < self.max_idle:
                self.idle.append(conn)
                return
        conn.close()

    def run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        try:
            conn = self.take()
        except sqlite3.Error as exc:
            raise _DRIVER.failed(exc, what) from exc
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            raise _DRIVER.failed(exc, what) from exc
        finally:
            self.give(conn)

    def group_write(self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body(conn)`` in a write transaction, sharing it with the appends of this
        handle that are waiting for the write lock meanwhile (group commit).

        Each call queues its body and then takes the write lock; the thread that gets it
        runs every body queued by then, in queue order, in one transaction (one
        ``BEGIN IMMEDIATE``, one ``COMMIT``: one journal sync where each would have had
        its own), and the waiting threads find theirs done. Each body reads what it
        checks inside the transaction, after the bodies before it, so it gets the
        outcome it would get in a transaction of its own, in that order. If the group
        fails anywhere (a statement or the commit), it is rolled back and every body of
        it runs again in a transaction of its own, as without grouping: one body's
        error never becomes another's."""
        job = _Job(body)
        with self.lock:
            self.queued.append(job)
        with self.write_lock:
            if not job.done:
                with self.lock:
                    group, self.queued = self.queued, []
                if job not in group:  # taken by a group that was interrupted before it ran
                    group.insert(0, job)
                if len(group) == 1:
                    job.run_alone(conn)
                else:
                    try:
                        outcomes = _transaction(conn, lambda: [j.body(conn) for j in group])
                    except Exception:
                        for each in group:
                            each.run_alone(conn)
                    else:
                        for each, outcome in zip(group, outcomes, strict=True):
                            each.finish(outcome)
        return job.outcome()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()
        self.executor.shutdown(wait=False)  # a call still running finishes first


@final
class _Tables:
    """Quoted table names for one prefix (validated: plain identifiers only), and the
    statements built on them."""

    __slots__ = (
        "append_batch",
        "append_length",
        "append_state",
        "batches",
        "conversations",
        "head_id",
        "leases",
        "moves",
        "prefix",
        "read",
        "read_path",
        "schema",
        "secret",
        "tombstones",
        "tree",
        "view",
        "view_path",
    )

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.conversations = c = f'"{prefix}_conversations"'
        self.batches = b = f'"{prefix}_batches"'
        self.schema = f'"{prefix}_schema"'
        self.leases = f'"{prefix}_leases"'
        self.moves = f'"{prefix}_moves"'
        # Version 5 (retention and erasure): the store secret, the erased ids' tombstones.
        self.secret = f'"{prefix}_secret"'
        self.tombstones = f'"{prefix}_tombstones"'
        # The append's statements (parameters: the conversation id, the append id):
        # closed or expired (NULL for a new conversation), the head path's length, the
        # head's seq (NULL: none), the digest accepted under the append id anywhere in
        # the tree (NULL: none), the last seq (NULL: none); then the conversation row
        # (id, messages added, the new head's seq, the owner of a first batch, the
        # store-wide retention in seconds or NULL: it moves the expiry unless the
        # conversation has its own) and the batch row (id, seq, append id, digest,
        # messages, parent seq, stored time or NULL for now, path length).
        self.append_state = (
            f"SELECT {_closed('c')}, c.length, c.head, "
            f"(SELECT digest FROM {b} WHERE conversation_id = ?1 AND append_id = ?2), "
            f"(SELECT MAX(seq) FROM {b} WHERE conversation_id = ?1) "
            f"FROM (SELECT 1) LEFT JOIN {c} c ON c.id = ?1"
        )
        self.append_length = (
            f"INSERT INTO {c} (id, closed, length, head, owner, expires_at) "
            f"VALUES (?1, 0, ?2, ?3, ?4, {_NOW} + ?5) "
            "ON CONFLICT (id) DO UPDATE SET length = length + excluded.length, "
            "head = excluded.head, owner = COALESCE(owner, excluded.owner), expires_at = CASE "
            "WHEN retained <> 0 OR ?5 IS NULL THEN expires_at ELSE excluded.expires_at END"
        )
        self.append_batch = (
            f"INSERT INTO {b} (conversation_id, seq, append_id, digest, messages, parent, "
            f"created, path_length) VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, {_NOW}), ?)"
        )
        # The head's append id (parameters: the conversation id, the head's seq).
        self.head_id = f"SELECT append_id FROM {b} WHERE conversation_id = ? AND seq = ?"
        # Reads (parameter ?1: the conversation id). A conversation that never branched
        # (its head was never moved) has every batch in seq order as its head path:
        # ``read`` and ``view`` read it as before branches (a scan of its primary key),
        # the branched flag and the closure or expiry checked once, in the key the scan
        # looks up (no cost per batch). One that has branched reads nothing
        # there (``read``: no rows; ``view``: the flag, last column, set), and its
        # reader runs ``read_path`` / ``view_path`` instead: the seqs of the head path,
        # walking parents up from the head (none when closed or expired). The flag
        # never goes back, so the second statement sees a conversation that has
        # branched too (a later snapshot, as consistent on its own). A closed or
        # expired conversation's batches (an expired one keeps them until ``expire``
        # runs) are never read.
        path = (
            "WITH RECURSIVE path(seq) AS ("
            f"SELECT c.head FROM {c} c WHERE c.id = ?1 AND c.head IS NOT NULL "
            f"AND NOT {_closed('c')} "
            f"UNION ALL SELECT p.parent FROM path JOIN {b} p "
            "ON p.conversation_id = ?1 AND p.seq = path.seq WHERE p.parent IS NOT NULL) "
        )
        self.read = (
            f"SELECT append_id, digest, messages FROM {b} WHERE conversation_id = "
            f"(SELECT CASE WHEN c.branched OR {_closed('c')} THEN NULL ELSE c.id END "
            f"FROM {c} c WHERE c.id = ?1) ORDER BY seq"
        )
        self.read_path = (
            f"{path}SELECT b.append_id, b.digest, b.messages FROM path JOIN {b} b "
            "ON b.conversation_id = ?1 AND b.seq = path.seq ORDER BY b.seq"
        )
        self.view = (
            f"SELECT {_closed('c')}, c.length, b.append_id, b.digest, b.messages, c.branched "
            f"FROM {c} c LEFT JOIN {b} b ON b.conversation_id = "
            f"CASE WHEN NOT {_closed('c')} AND NOT c.branched THEN c.id END "
            "WHERE c.id = ?1 ORDER BY b.seq"
        )
        self.view_path = (
            f"{path}SELECT {_closed('c')}, c.length, b.append_id, b.digest, b.messages "
            f"FROM {c} c LEFT JOIN {b} b ON b.conversation_id = "
            f"CASE WHEN NOT {_closed('c')} THEN c.id END "
            "AND b.seq IN (SELECT seq FROM path) WHERE c.id = ?1 ORDER BY b.seq"
        )
        self.tree = (
            f"SELECT {_closed('c')}, c.head, b.seq, b.parent, b.created, b.append_id, "
            f"b.digest, b.messages FROM {c} c LEFT JOIN {b} b ON b.conversation_id = "
            f"CASE WHEN NOT {_closed('c')} THEN c.id END WHERE c.id = ?1 ORDER BY b.seq"
        )


def _closed(alias: str) -> str:
    """SQL: whether the conversations row ``alias`` is closed or expired by the clock
    (NULL when there is no row)."""
    return f"({alias}.closed <> 0 OR COALESCE({alias}.expires_at <= {_NOW}, 0))"


def _tombstoned(conn: sqlite3.Connection, t: _Tables, secret: bytes, cid: str) -> bool:
    """Whether ``cid`` was erased (its tombstone is stored)."""
    sql = f"SELECT 1 FROM {t.tombstones} WHERE tombstone = ?"
    return conn.execute(sql, (tombstone(secret, cid),)).fetchone() is not None


def _transaction(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
    """Run ``body`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any failure.

    The commit is the last statement: either it succeeds and all of ``body`` is
    durable, or the transaction is rolled back and nothing of it is.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
        conn.execute("COMMIT")
    except BaseException:
        # Runs in a worker thread: no await here, so no cancellation is swallowed.
        if conn.in_transaction:
            # If the rollback fails, give() closes the connection still in a transaction.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return result


@final
class SQLiteStore(RestoringStore):
    """A ``scope.history.Store`` (and ``PersistentStore``) in one SQLite file.

    Open with ``await SQLiteStore.open(path)``; use as an async context manager or call
    ``aclose()``.

    Guarantees, beyond the store rules of ``scope.history``:

    - **Atomicity.** ``append`` runs the closed check, the dedupe lookup and the insert in
      one ``BEGIN IMMEDIATE`` transaction; ``clear`` closes the id and deletes its
      batches in one transaction. Appends of this handle that wait for its write lock
      share one transaction (group commit, each checked as if alone and in queue
      order; see ``_Pool.group_write``). Two handles or two processes on one file are
      linearizable: a clear and an append never interleave. ``acquire_turn`` and
      ``release_turn`` are one statement each in a ``BEGIN IMMEDIATE`` transaction, so
      two handles or processes never both hold a conversation's lease; the folded steps
      are one transaction each: ``acquire_turn_view`` the upsert
      and the read, ``append_release_turn`` the append and the expiry of the holder's lease.
    - **Cancellation.** The work of a call runs to completion on its worker thread even if
      the awaiting task is cancelled. A cancelled call always ends cancelled: the
      cancellation (a native asyncio ``Task.cancel()``, an anyio or trio cancel scope) is
      raised as soon as the thread is done, whether the work succeeded or failed, and
      one requested before the call is raised before its work starts (asyncio). A
      cancelled ``append`` therefore
      has either committed entirely or not at all; it *may have committed*, so retry the
      same batch: the retry returns the receipt and appends nothing.
    - **Reads** (``read``, ``read_batches``, ``read_view``, ``read_tree``) are one
      statement each, a consistent snapshot; on a conversation whose head has moved
      (it has branched) the first statement of ``read``/``read_batches``/``read_view``
      finds that and a second one, a consistent snapshot on its own, walks the head
      path;
      every stored batch is checked against its digest, and a corrupt record raises
      ``StoreError`` naming the conversation and append id.
    - **Errors.** Every sqlite3 error (locked past the busy timeout, I/O error, a file
      that is not a database) is raised as ``StoreError`` with the driver error chained.
      Calls on a closed store raise ``StoreError``. A stored conversation id that is not
      valid is skipped by ``conversations()`` (see ``invalid_conversation_ids``).
    """

    __slots__ = (
        "_cache",
        "_listed",
        "_outcome_source",
        "_pool",
        "_retention",
        "_secret",
        "_tables",
        "path",
        "retention",
        "synchronous",
        "table_prefix",
    )

    _store_kind = "sqlite"

    def __init__(
        self,
        pool: _Pool,
        table_prefix: str,
        cache: HistoryCache,
        retention: _dt.timedelta | None = None,
    ) -> None:
        """Internal: use ``await SQLiteStore.open(path)``."""
        self._pool = pool
        self._secret = pool.secret
        self.retention: Final = retention
        self._retention = None if retention is None else retention.total_seconds()
        self._cache = cache
        self._tables = pool.tables
        self.path: Final = pool.path
        self.synchronous: Final = pool.synchronous
        self.table_prefix: Final = table_prefix
        self._listed = ListedIDs(repr(self))
        self._outcome_source = "SQLite append"

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        table_prefix: str = "scope_history",
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        max_idle_connections: int = 16,
        cache_bytes: int = HistoryCache.DEFAULT_MAX_BYTES,
        create: bool = True,
        retention: _dt.timedelta | None = None,
    ) -> SQLiteStore:
        """Open (creating when missing) the database at ``path`` and its tables.

        ``create=True`` creates the tables when missing and upgrades an older schema in
        place; ``create=False`` writes no schema: it only checks that the tables exist at
        the current version (``StoreError`` naming ``scope history migrate`` if not).

        ``table_prefix``: 1-49 of ``a-z``, ``0-9``, ``_`` (not starting with a digit);
        stores with different prefixes share one file independently.
        ``synchronous``: ``"NORMAL"`` survives a killed process, ``"FULL"``/``"EXTRA"``
        also a power loss. ``busy_timeout``: seconds a write waits for another handle's
        transaction before failing with ``StoreError``.
        ``max_idle_connections`` (an int >= 1; default 16, one per worker thread of the
        handle under asyncio): connections kept open between calls. A burst of more
        concurrent calls than this opens connections and closes them after (each new
        one without its prepared statements and page cache: about a quarter more time
        per append at 16 tasks than with one kept per thread; benchmarks/RESULTS.md).
        ``cache_bytes`` (default 32 MiB; 0 keeps nothing) bounds this handle's
        ``history_cache``: the decoded batches (so re-reading a conversation skips
        decoding; every record is still checked against its digest on every read)
        and the replays the history Middleware checked, each counted at twice its
        encoded size, media included (see ``scope.history.HistoryCache``).
        ``retention`` (a ``timedelta`` > 0; None, the default: nothing expires by
        itself): a conversation without its own expiry (``retain``) expires this long
        after its last append through this handle, by the clock of the host running
        SQLite (a handle without it leaves the expiry an append finds).
        Bad arguments raise
        ``ValueError`` (before any I/O); a file that cannot be opened as a database
        raises ``StoreError``.
        """
        prefix = validate_table_prefix(table_prefix)
        kept = check_retention(retention)
        cache = HistoryCache(cache_bytes)
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        check_seconds(busy_timeout, "busy_timeout")
        check_type(max_idle_connections, int, "max_idle_connections", "an integer")
        if max_idle_connections < 1:
            raise ValueError(
                f"max_idle_connections must be an integer >= 1, got {max_idle_connections!r}"
            )
        check_type(create, bool, "create", "a bool")
        check_type(path, (str, os.PathLike), "path", "a str or os.PathLike")
        fspath = os.fspath(path)
        if not isinstance(fspath, str) or not fspath or fspath == ":memory:":
            raise ValueError(f"path must name a database file, got {path!r}")
        if fspath.lower().startswith("sqlite:"):
            raise ValueError(f"path is a URL, not a file: use open_store({fspath!r})")
        pool = _Pool(
            fspath, synchronous, float(busy_timeout), max_idle_connections, _Tables(prefix)
        )
        await anyio.to_thread.run_sync(_open_schema, pool, create)
        return cls(pool, prefix, cache, kept)

    def __repr__(self) -> str:
        return f"SQLiteStore(path={self.path!r}, table_prefix={self.table_prefix!r})"

    async def aclose(self) -> None:
        """Close the store: later calls raise ``StoreError``. Idempotent.

        Idle connections are closed now; a call already running finishes and closes its
        connection when done.
        """
        await anyio.to_thread.run_sync(self._pool.close)

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        return self._pool.closed

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn(connection)`` on a worker thread. The thread's work always runs to
        its end; a cancellation that arrived meanwhile is raised once it is done, instead
        of its result or error (see ``in_thread``)."""
        if self._pool.closed:
            raise store_closed("SQLiteStore")
        return await in_thread(self._pool.executor, self._pool.run, fn, what)

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's head path (messages, length, head) and closure from one
        statement (a consistent snapshot; a conversation that has branched: a second
        one, consistent on its own, walks the head path). A corrupt stored record
        raises ``StoreError``."""
        cid = ConversationID(conversation_id)
        t, secret = self._tables, self._secret
        cache = self._cache

        def read(conn: sqlite3.Connection) -> list[Any]:
            return _view_rows(conn, t, secret, cid)

        rows = await self._run(read, f"read of conversation {str(cid)!r}")
        return _view(cid, rows, cache)

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        """The head path's records in order, decoded with ``decode`` once the worker
        thread fetched them: one statement (a consistent snapshot) reading every batch in
        seq order of a linear conversation; for one that has branched (that statement
        finds nothing), a second one walking parents from its head. A closed or expired
        conversation reads nothing (an expired one's batches, until ``expire()`` runs,
        are not read)."""
        t = self._tables
        cache = self._cache

        def read(conn: sqlite3.Connection) -> list[Any]:
            rows = conn.execute(t.read, (cid,)).fetchall()
            if not rows:  # empty, unknown, or branched: the walk (nothing for the first two)
                rows = conn.execute(t.read_path, (cid,)).fetchall()
            return rows

        rows = await self._run(read, f"read of conversation {str(cid)!r}")
        return decode(cid, rows, cache)

    async def _read_tree(self, cid: ConversationID) -> HistoryTree:
        # One statement: the conversation row and every batch, in seq order (none when
        # closed or expired); no row: unknown, or erased (its tombstone: closed).
        t, secret = self._tables, self._secret
        cache = self._cache

        def read(conn: sqlite3.Connection) -> tuple[list[Any], bool]:
            rows = conn.execute(t.tree, (cid,)).fetchall()
            return rows, not rows and _tombstoned(conn, t, secret, cid)

        rows, erased = await self._run(read, f"tree read of conversation {str(cid)!r}")
        if not rows:
            return HistoryTree((), (), (), -1, True) if erased else HistoryTree((), (), ())
        closed, head = bool(rows[0][0]), rows[0][1]
        batches = [tuple(r[2:]) for r in rows if r[2] is not None]
        return tree_of(cid, closed, head, batches, cache)

    async def _read_meta(
        self, cid: ConversationID
    ) -> tuple[str | None, float | None, bool, list[tuple[str, str]], Closure | None]:
        # One statement (one snapshot): the conversation row's owner, expiry, retention
        # flag and closure (closed: 1 cleared, 2 expired by expire(); an expiry passed:
        # expired) and whether the id's tombstone is stored, beside each recorded move
        # (one row of NULLs when neither).
        t = self._tables
        sql = (
            f"SELECT c.owner, c.expires_at, c.retained, c.closed, "
            f"COALESCE(c.expires_at <= {_NOW}, 0), "
            f"EXISTS (SELECT 1 FROM {t.tombstones} WHERE tombstone = ?2), "
            f"m.move_id, m.head FROM (SELECT 1) "
            f"LEFT JOIN {t.conversations} c ON c.id = ?1 "
            f"LEFT JOIN {t.moves} m ON m.conversation_id = ?1"
        )
        mark = tombstone(self._secret, cid)

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, (cid, mark)).fetchall()

        rows = await self._run(read, f"meta read of conversation {str(cid)!r}")
        owner, expires_at, retained, closed, due, erased = rows[0][:6]
        moves = [(r[6], r[7]) for r in rows if r[6] is not None]
        expiry = None if expires_at is None else float(expires_at)
        closure: Closure | None = None
        if erased:
            closure = "erased"
        elif closed == 2 or (not closed and due):
            closure = "expired"
        elif closed:
            closure = "cleared"
        return owner, expiry, bool(retained), moves, closure

    async def _move_head(
        self, cid: ConversationID, head: str, expected_head: str, move_id: str | None
    ) -> str:
        # One write transaction: closure (cleared, expired or erased), the move record,
        # the fence, the target, the move (the head's seq and its path length, kept on
        # every batch row: no messages are read) and the move record.
        t = self._tables
        pool = self._pool
        secret = self._secret
        state = (
            f"SELECT {_closed('c')}, c.length, c.head FROM (SELECT 1) "
            f"LEFT JOIN {t.conversations} c ON c.id = ?"
        )
        recorded = f"SELECT head FROM {t.moves} WHERE conversation_id = ? AND move_id = ?"
        target = (
            f"SELECT seq, path_length FROM {t.batches} WHERE conversation_id = ? AND append_id = ?"
        )
        move = f"UPDATE {t.conversations} SET head = ?, length = ?, branched = 1 WHERE id = ?"
        record = f"INSERT INTO {t.moves} (conversation_id, move_id, head) VALUES (?, ?, ?)"

        def path_length(conn: sqlite3.Connection, aid: str) -> tuple[Any, int] | None:
            if not aid:
                return None, 0
            row = conn.execute(target, (cid, aid)).fetchone()
            return None if row is None else (row[0], int(row[1]))

        def body(conn: sqlite3.Connection) -> str:
            closed, length, current = conn.execute(state, (cid,)).fetchone()
            if closed or (closed is None and _tombstoned(conn, t, secret, cid)):
                return "closed"
            if move_id is not None:
                row = conn.execute(recorded, (cid, move_id)).fetchone()
                if row is not None:
                    if row[0] != head:
                        return f"recorded:{row[0]}"
                    found = path_length(conn, head)
                    return "unknown" if found is None else f"moved:{found[1]}"
            length = length or 0
            current_id = (
                "" if current is None else conn.execute(t.head_id, (cid, current)).fetchone()[0]
            )
            if current_id != expected_head:
                return f"changed:{length}:{current_id}"
            found = path_length(conn, head)
            if found is None:
                return "unknown"
            seq, new_length = found
            if seq != current:
                conn.execute(move, (seq, new_length, cid))
            if move_id is not None:
                conn.execute(record, (cid, move_id, head))
            return f"moved:{new_length}"

        def run(conn: sqlite3.Connection) -> str:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        return await self._run(run, f"head move of conversation {str(cid)!r}")

    async def _stored_ids(self, after: Any, limit: int) -> list[Any]:
        # Reads the batches table itself (its primary key orders it), so a batch row
        # whose conversation row is missing or wrong is scanned too.
        where = "" if after is None else "WHERE conversation_id > ? "
        sql = (
            f"SELECT DISTINCT conversation_id FROM {self._tables.batches} {where}"
            "ORDER BY conversation_id LIMIT ?"
        )
        args = (limit,) if after is None else (after, limit)

        def ids(conn: sqlite3.Connection) -> list[Any]:
            return [row[0] for row in conn.execute(sql, args)]

        return await self._run(ids, "scan of conversation ids")

    async def _record_page(
        self, raw_id: Any, after: Any, limit: int
    ) -> list[tuple[Any, Any, Any, Any, str]]:
        where = "" if after is None else "AND seq > ? "
        sql = (
            f"SELECT seq, append_id, digest, messages FROM {self._tables.batches} "
            f"WHERE conversation_id = ? {where}ORDER BY seq LIMIT ?"
        )
        args = (raw_id, limit) if after is None else (raw_id, after, limit)

        def page(conn: sqlite3.Connection) -> list[tuple[Any, Any, Any, Any, str]]:
            return [(r[0], r[1], r[2], r[3], "") for r in conn.execute(sql, args)]

        return await self._run(page, f"scan of conversation {raw_id!r}")

    async def _write(
        self, batch: Batch, holder: str | None, owner: str | None, created: float | None
    ) -> str:
        # One write transaction (see the class docstring for cancellation); with a
        # holder (append_release_turn) the release is in the same transaction.
        cid = batch.conversation_id
        aid = batch.id
        digest = batch.digest
        data = batch.encoded_messages
        fenced = batch.expected_length is not None or batch.expected_head is not None
        count = len(batch.messages)
        t = self._tables
        pool = self._pool
        secret, retention = self._secret, self._retention

        def body(conn: sqlite3.Connection) -> str:
            # One statement reads what the checks need (closure or expiry, length, head,
            # the dedupe record across the whole tree, the last seq); the write lock and
            # BEGIN IMMEDIATE keep it current. No row: a new conversation, or an erased
            # one (its tombstone).
            closed, length, head, accepted, last = conn.execute(
                t.append_state, (cid, aid)
            ).fetchone()
            if closed or (closed is None and _tombstoned(conn, t, secret, cid)):
                return "closed"
            if accepted is not None:  # a retry (same digest: nothing to write) or a conflict
                return f"accepted:{accepted}"
            length = length or 0
            if fenced:
                head_id = "" if head is None else conn.execute(t.head_id, (cid, head)).fetchone()[0]
                if fence_refuses(batch, length, head_id):
                    return f"changed:{length}:{head_id}"
            seq = (last or 0) + 1
            first_owner = owner if last is None else None  # the first batch records it
            conn.execute(t.append_length, (cid, count, seq, first_owner, retention))
            conn.execute(
                t.append_batch, (cid, seq, aid, digest, data, head, created, length + count)
            )
            return "inserted"

        # The release of append_release_turn expires the holder's row in place rather
        # than deleting it: an expired row is a free lease to acquire_turn and "not held"
        # to release_turn, and an update that keeps the key writes one page where a
        # delete (and the next turn's insert) touch the table and its key index both.
        release = f"UPDATE {t.leases} SET expires = 0 WHERE conversation_id = ? AND holder = ?"

        def body_and_release(conn: sqlite3.Connection) -> str:
            outcome = body(conn)
            if holder is not None and releases(batch, outcome):
                conn.execute(release, (cid, holder))
            return outcome

        def append(conn: sqlite3.Connection) -> str:
            return pool.group_write(conn, body_and_release)

        return await self._run(append, f"append to conversation {str(cid)!r}")

    async def _clear(self, cid: ConversationID) -> None:
        t = self._tables
        pool = self._pool
        secret = self._secret

        def body(conn: sqlite3.Connection) -> None:
            if _tombstoned(conn, t, secret, cid):
                return  # erased: closed for ever, and its id is kept nowhere
            conn.execute(
                f"INSERT INTO {t.conversations} (id, closed) VALUES (?, 1) "
                "ON CONFLICT (id) DO UPDATE SET closed = 1, expires_at = NULL, retained = 0",
                (cid,),
            )
            conn.execute(f"DELETE FROM {t.batches} WHERE conversation_id = ?", (cid,))
            conn.execute(f"DELETE FROM {t.moves} WHERE conversation_id = ?", (cid,))

        def clear(conn: sqlite3.Connection) -> None:
            with pool.write_lock:
                _transaction(conn, lambda: body(conn))

        await self._run(clear, f"clear of conversation {str(cid)!r}")

    async def _acquire(self, cid: ConversationID, holder: str, ttl: float) -> bool:
        # One upsert in one transaction.
        pool = self._pool
        sql = self._acquire_sql()

        def acquire(conn: sqlite3.Connection) -> bool:
            with pool.write_lock:
                changed = _transaction(conn, lambda: conn.execute(sql, (cid, holder, ttl)).rowcount)
            return changed == 1

        return bool(await self._run(acquire, f"lease of conversation {str(cid)!r}"))

    def _acquire_sql(self) -> str:
        """``acquire_turn``'s upsert (parameters: id, holder, ttl): one row changed when
        the lease is now the holder's."""
        t = self._tables
        return (
            f"INSERT INTO {t.leases} AS l (conversation_id, holder, expires) "
            f"VALUES (?1, ?2, {_NOW} + ?3) "
            "ON CONFLICT (conversation_id) DO UPDATE SET "
            "holder = excluded.holder, expires = excluded.expires "
            f"WHERE l.holder = excluded.holder OR l.expires <= {_NOW}"
        )

    async def _acquire_view(
        self, cid: ConversationID, holder: str, ttl: float
    ) -> HistoryView | None:
        # The upsert and the view's statement in one BEGIN IMMEDIATE transaction.
        pool = self._pool
        acquire, t, secret = self._acquire_sql(), self._tables, self._secret
        cache = self._cache

        def body(conn: sqlite3.Connection) -> list[Any] | None:
            if conn.execute(acquire, (cid, holder, ttl)).rowcount != 1:
                return None
            return _view_rows(conn, t, secret, cid)

        def acquire_view(conn: sqlite3.Connection) -> list[Any] | None:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        rows = await self._run(acquire_view, f"lease and read of conversation {str(cid)!r}")
        return None if rows is None else _view(cid, rows, cache)

    async def _release(self, cid: ConversationID, holder: str) -> bool:
        # One delete in one transaction (the append's transaction expires the lease
        # for append_release_turn).
        t = self._tables
        pool = self._pool
        sql = (
            f"DELETE FROM {t.leases} WHERE conversation_id = ? AND holder = ? "
            f"RETURNING expires > {_NOW}"
        )

        def release(conn: sqlite3.Connection) -> bool:
            with pool.write_lock:
                rows = _transaction(conn, lambda: conn.execute(sql, (cid, holder)).fetchall())
            return bool(rows and rows[0][0])

        return await self._run(release, f"lease release of conversation {str(cid)!r}")

    async def _list(
        self, after: ConversationID | None, limit: int | None, owner: str | None
    ) -> list[Any]:
        t = self._tables.conversations
        # Listed: a conversation holding a batch on any branch (a head, or a head moved:
        # one rewound to its start holds batches); a row without a batch (retained
        # before its first append) is not.
        where = (
            "closed = 0 AND (length > 0 OR head IS NOT NULL OR branched <> 0) "
            f"AND NOT COALESCE(expires_at <= {_NOW}, 0)"
        )
        args: tuple[object, ...] = ()
        if owner is not None:  # the (owner, id) index: a keyset range of one owner
            where, args = f"{where} AND owner = ?", (owner,)
        if after is not None:
            where, args = f"{where} AND id > ?", (*args, after)
        sql = f"SELECT id FROM {t} WHERE {where} ORDER BY id LIMIT ?"
        args = (*args, -1 if limit is None else limit)  # LIMIT -1: no limit

        def conversations(conn: sqlite3.Connection) -> list[Any]:
            return [row[0] for row in conn.execute(sql, args)]

        return await self._run(conversations, "listing of conversations")

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    async def _retain(self, cid: ConversationID, until: float | None) -> bool:
        # One write transaction: the closure (or expiry, or tombstone) check, then the
        # setting, on a new row when the id was never written.
        t = self._tables
        pool = self._pool
        secret = self._secret

        def body(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                f"SELECT {_closed('c')} FROM {t.conversations} c WHERE c.id = ?", (cid,)
            ).fetchone()
            if row is None:
                if _tombstoned(conn, t, secret, cid):
                    return False
            elif row[0]:
                return False
            conn.execute(
                f"INSERT INTO {t.conversations} (id, retained, expires_at) VALUES (?, 1, ?) "
                "ON CONFLICT (id) DO UPDATE SET retained = 1, expires_at = excluded.expires_at",
                (cid, until),
            )
            return True

        def retain(conn: sqlite3.Connection) -> bool:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        return await self._run(retain, f"retention of conversation {str(cid)!r}")

    async def _expire_page(self, now: float | None, limit: int) -> list[ConversationID]:
        # One write transaction: the page of due ids (the expiry index), their batches
        # (every branch), leases and move records deleted, their rows closed (owner and
        # length kept).
        t = self._tables
        pool = self._pool
        due = (
            f"SELECT id FROM {t.conversations} WHERE closed = 0 AND expires_at <= "
            f"COALESCE(?, {_NOW}) ORDER BY expires_at LIMIT ?"
        )

        def body(conn: sqlite3.Connection) -> list[Any]:
            ids = [row[0] for row in conn.execute(due, (now, limit))]
            rows = [(cid,) for cid in ids]
            for table in (t.batches, t.leases, t.moves):
                conn.executemany(f"DELETE FROM {table} WHERE conversation_id = ?", rows)
            conn.executemany(  # closed = 2: closed by its expiry (read_meta's "expired")
                f"UPDATE {t.conversations} SET closed = 2, expires_at = NULL, retained = 0 "
                "WHERE id = ?",
                rows,
            )
            return ids

        def expire(conn: sqlite3.Connection) -> list[Any]:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        return await self._run(expire, "expiry of conversations")

    async def _erase(
        self, cid: ConversationID, mark: str
    ) -> tuple[list[tuple[Any, str, int]], float]:
        # One write transaction: every row holding the id deleted (every branch's
        # batches, the lease, the move records, the conversation row with its head,
        # owner and expiry), the tombstone written.
        t = self._tables
        pool = self._pool

        def body(conn: sqlite3.Connection) -> tuple[list[tuple[Any, str, int]], float]:
            records = conn.execute(
                f"DELETE FROM {t.batches} WHERE conversation_id = ? "
                "RETURNING seq, digest, length(messages)",
                (cid,),
            ).fetchall()
            conn.execute(f"DELETE FROM {t.leases} WHERE conversation_id = ?", (cid,))
            conn.execute(f"DELETE FROM {t.moves} WHERE conversation_id = ?", (cid,))
            conn.execute(f"DELETE FROM {t.conversations} WHERE id = ?", (cid,))
            (now,) = conn.execute(
                f"INSERT INTO {t.tombstones} (tombstone, erased_at) VALUES (?, {_NOW}) "
                "ON CONFLICT (tombstone) DO UPDATE SET erased_at = excluded.erased_at "
                "RETURNING erased_at",
                (mark,),
            ).fetchone()
            return [tuple(r) for r in records], float(now)

        def erase(conn: sqlite3.Connection) -> tuple[list[tuple[Any, str, int]], float]:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        return await self._run(erase, f"erasure of conversation {str(cid)!r}")

    async def _owned(self, owner: str, limit: int) -> list[ConversationID]:
        sql = f"SELECT id FROM {self._tables.conversations} WHERE owner = ? ORDER BY id LIMIT ?"

        def owned(conn: sqlite3.Connection) -> list[Any]:
            return [row[0] for row in conn.execute(sql, (owner, limit))]

        return [ConversationID(cid) for cid in await self._run(owned, "listing by owner")]

    async def _erasure_problems(self, mark: str) -> list[str]:
        # Every id stored in every table that holds one, read in keyset pages (one
        # statement each) and hashed on the worker thread.
        t = self._tables
        secret = self._secret
        places = (
            ("the conversations table", t.conversations, "id"),
            ("the batches table", t.batches, "conversation_id"),
            ("the leases table", t.leases, "conversation_id"),
            ("the moves table", t.moves, "conversation_id"),
        )

        def problems(conn: sqlite3.Connection) -> list[str]:
            found: list[str] = []
            sql = f"SELECT 1 FROM {t.tombstones} WHERE tombstone = ?"
            if conn.execute(sql, (mark,)).fetchone() is None:
                found.append(f"no tombstone {mark} in this store")
            for where, table, column in places:
                last: Any = None
                page = (
                    f"SELECT DISTINCT {column} FROM {table} WHERE ?1 IS NULL OR {column} > ?1 "
                    f"ORDER BY {column} LIMIT 1000"
                )
                while True:
                    ids = [row[0] for row in conn.execute(page, (last,))]
                    if any(tombstone(secret, str(cid)) == mark for cid in ids):
                        found.append(f"a conversation id hashing to the tombstone is in {where}")
                        break
                    if len(ids) < 1000:
                        break
                    last = ids[-1]
            return found

        return await self._run(problems, "check of an erasure")

    # -- restore (DESIGN §6n) ---------------------------------------------------------

    async def _closed_page(self, after: ConversationID | None, limit: int) -> list[Any]:
        # One statement over the primary key: cleared (1), removed by expire (2), or
        # due by the clock and not removed yet (read_meta's closures).
        # A page after an id seeks to it (no OR in the condition, which would scan
        # from the first id).
        sql = (
            f"SELECT id, CASE WHEN closed = 1 THEN 'cleared' ELSE 'expired' END, owner, "
            f"length FROM {self._tables.conversations} c WHERE {_closed('c')} "
            f"{'' if after is None else 'AND id > ?2 '}ORDER BY id LIMIT ?1"
        )
        args = (limit,) if after is None else (limit, after)

        def page(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, args).fetchall()

        return await self._run(page, "listing of closed conversations")

    async def _restore_closed(self, closed: ClosedConversation, mark: str) -> str:
        # One write transaction: the tombstone, the row and whether the id holds a
        # batch read, then (unless refused or held) the row written closed.
        t = self._tables
        pool = self._pool
        cid = closed.conversation_id
        code = 1 if closed.closure == "cleared" else 2
        state = (
            f"SELECT c.closed, {_closed('c')}, c.owner, c.length, "
            f"EXISTS (SELECT 1 FROM {t.batches} WHERE conversation_id = ?1) "
            f"FROM {t.conversations} c WHERE c.id = ?1"
        )
        write = (
            f"INSERT INTO {t.conversations} (id, closed, length, head, branched, owner, "
            "expires_at, retained) VALUES (?1, ?2, ?3, NULL, 0, ?4, NULL, 0) "
            "ON CONFLICT (id) DO UPDATE SET closed = excluded.closed, length = excluded.length, "
            "head = NULL, branched = 0, owner = excluded.owner, expires_at = NULL, retained = 0"
        )

        def body(conn: sqlite3.Connection) -> str:
            found = conn.execute(f"SELECT 1 FROM {t.tombstones} WHERE tombstone = ?", (mark,))
            if found.fetchone() is not None:
                return "it is erased"
            row = conn.execute(state, (cid,)).fetchone()
            if row is not None:
                stored, shut, owner, length, held = row
                if held:
                    return "it holds batches (open, or expired and not removed yet)"
                if stored:
                    closure = "cleared" if stored == 1 else "expired"
                    return same_closure(closed, closure, owner, length)
                if shut and (refused := same_closure(closed, "expired", owner, length)) != HELD:
                    return refused
            # Unknown, or a row without a batch (a retention setting; due: the same
            # closure) written closed as expire leaves it.
            conn.execute(write, (cid, code, closed.length, closed.owner))
            conn.execute(f"DELETE FROM {t.moves} WHERE conversation_id = ?", (cid,))
            return WRITTEN

        def restore(conn: sqlite3.Connection) -> str:
            with pool.write_lock:
                return _transaction(conn, lambda: body(conn))

        return await self._run(restore, f"restore of closed conversation {str(cid)!r}")

    async def _tombstone_page(self, after: str | None, limit: int) -> list[Any]:
        sql = (
            f"SELECT tombstone FROM {self._tables.tombstones} "
            f"{'' if after is None else 'WHERE tombstone > ?2 '}ORDER BY tombstone LIMIT ?1"
        )
        args = (limit,) if after is None else (limit, after)

        def page(conn: sqlite3.Connection) -> list[Any]:
            return [row[0] for row in conn.execute(sql, args)]

        return await self._run(page, "listing of tombstones")

    async def _restore_erasures(self, secret: bytes, marks: list[str]) -> int | str:
        # One write transaction: the stored secret compared (another one is replaced
        # only in a store without conversations or tombstones), the tombstones not
        # stored yet found, the stored ids hashed against them (only when some are new
        # and the store holds conversations), then the new ones written.
        t = self._tables
        pool = self._pool

        def body(conn: sqlite3.Connection) -> int | str:
            (stored,) = conn.execute(f"SELECT secret FROM {t.secret} WHERE id = 1").fetchone()
            if stored != secret:
                used = conn.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {t.conversations}) "
                    f"OR EXISTS (SELECT 1 FROM {t.batches}) "
                    f"OR EXISTS (SELECT 1 FROM {t.tombstones})"
                ).fetchone()[0]
                if used:
                    return (
                        "the store holds conversations or tombstones under another secret "
                        "(restore erasures into an empty store)"
                    )
                conn.execute(f"UPDATE {t.secret} SET secret = ? WHERE id = 1", (secret,))
            held = f"SELECT 1 FROM {t.tombstones} WHERE tombstone = ?"
            new = {m for m in marks if conn.execute(held, (m,)).fetchone() is None}
            if new:
                for (cid,) in conn.execute(f"SELECT id FROM {t.conversations}"):
                    if tombstone(secret, str(cid)) in new:
                        return (
                            f"a stored conversation's id hashes to tombstone "
                            f"{tombstone(secret, str(cid))} (erase it first)"
                        )
            conn.executemany(
                f"INSERT INTO {t.tombstones} (tombstone, erased_at) VALUES (?, {_NOW})",
                [(m,) for m in sorted(new)],
            )
            return len(new)

        def restore(conn: sqlite3.Connection) -> int | str:
            with pool.write_lock:
                answer = _transaction(conn, lambda: body(conn))
            if not isinstance(answer, str):  # committed: this handle hashes with it now
                pool.secret = secret
                self._secret = secret
            return answer

        return await self._run(restore, "restore of erasures")


def _view_rows(
    conn: sqlite3.Connection, t: _Tables, secret: bytes, cid: ConversationID
) -> list[Any]:
    """``read_view``'s rows (closed or expired, length, then one record per row; none
    for an unknown conversation): the linear statement, or the walk when it has
    branched. An erased conversation (no row, its tombstone stored) is one closed row
    of length 0: closed for ever."""
    rows = conn.execute(t.view, (cid,)).fetchall()
    if not rows:
        return [(1, 0, None, None, None)] if _tombstoned(conn, t, secret, cid) else rows
    if rows[0][5]:
        rows = conn.execute(t.view_path, (cid,)).fetchall()
    return rows


def _view(cid: ConversationID, rows: list[Any], cache: HistoryCache) -> HistoryView:
    """The ``HistoryView`` of ``read_view``'s rows (closed, length, then one record per
    row; none for an unknown conversation)."""
    if not rows:
        return HistoryView((), 0)
    closed, length = bool(rows[0][0]), rows[0][1]
    records = [(r[2], r[3], r[4]) for r in rows if r[2] is not None]
    return view_of(cid, closed, length, records, cache)


def _open_schema(pool: _Pool, create: bool) -> None:
    """Create or upgrade the schema (``create``), or only check its version."""
    t = pool.tables
    try:
        conn = pool.connect()
    except sqlite3.Error as exc:
        raise _DRIVER.failed(exc, f"open of {pool.path!r}") from exc
    try:
        if create:
            _create_when_needed(conn, pool)
        else:
            version = _schema_version(conn, t)
            if version != SCHEMA_VERSION:
                raise schema_mismatch(f"SQLite database {pool.path!r}", t.schema, version)
        row = conn.execute(f"SELECT secret FROM {t.secret} WHERE id = 1").fetchone()
        if row is None or not isinstance(row[0], bytes) or len(row[0]) != 32:
            raise StoreError(
                f"SQLite database {pool.path!r} has no store secret in {t.secret} (a row "
                "written with the schema, needed by erase): restore it from a backup"
            )
        pool.secret = row[0]
    except sqlite3.Error as exc:
        conn.close()
        raise _DRIVER.failed(exc, f"open of {pool.path!r}") from exc
    except BaseException:
        conn.close()
        raise
    pool.give(conn)


def _create_when_needed(conn: sqlite3.Connection, pool: _Pool) -> None:
    """Set WAL mode and create or upgrade the schema unless it is current.

    Two processes opening a new file at once race here: switching a file to WAL needs it
    to itself, and SQLite answers "database is locked" at once (no busy wait) while the
    other process holds its schema transaction. So a locked attempt looks again, after a
    short pause, until the schema is current (the other process created it) or the busy
    timeout has passed.
    """
    t = pool.tables
    deadline = time.monotonic() + pool.busy_timeout
    pause = 0.005
    while _schema_version(conn, t) != SCHEMA_VERSION:
        try:
            # WAL is a property of the file: set once, kept by every later connection.
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise StoreError(
                    f"SQLite database {pool.path!r} cannot use WAL mode (got {mode!r})"
                )
            _transaction(conn, lambda: _create_schema(conn, t))
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)  # a worker thread: the event loop is not blocked
        pause = min(pause * 2, 0.1)


def _schema_version(conn: sqlite3.Connection, t: _Tables) -> int | None:
    """The recorded schema version; 1 for scope 0.1's tables; None for no tables."""
    exists = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
        (t.schema.strip('"'), t.conversations.strip('"')),
    ).fetchall()
    names = {name for (name,) in exists}
    if t.schema.strip('"') in names:
        row = conn.execute(f"SELECT version FROM {t.schema} WHERE id = 1").fetchone()
        return None if row is None else int(row[0])
    return 1 if t.conversations.strip('"') in names else None


def _create_schema(conn: sqlite3.Connection, t: _Tables) -> None:
    version = _schema_version(conn, t)
    if version is not None and version > SCHEMA_VERSION:
        raise schema_mismatch(f"SQLite table prefix {t.schema}", t.schema, version)
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.conversations} ("
        "id TEXT PRIMARY KEY NOT NULL, "
        "closed INTEGER NOT NULL DEFAULT 0, "
        "length INTEGER NOT NULL DEFAULT 0"
        ") WITHOUT ROWID"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.batches} ("
        "conversation_id TEXT NOT NULL, "
        "seq INTEGER NOT NULL, "
        "append_id TEXT NOT NULL, "
        "digest TEXT NOT NULL, "
        "messages BLOB NOT NULL, "
        "PRIMARY KEY (conversation_id, seq), "
        "UNIQUE (conversation_id, append_id))"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.schema} ("
        "id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)"
    )
    # Version 3: turn leases (version 2 lacks this table; creating it is the upgrade).
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.leases} ("
        "conversation_id TEXT PRIMARY KEY NOT NULL, "
        "holder TEXT NOT NULL, "
        "expires REAL NOT NULL"
        ") WITHOUT ROWID"
    )
    if version == 1:
        # scope 0.1: add the length column and count every conversation's messages.
        conn.execute(f"ALTER TABLE {t.conversations} ADD COLUMN length INTEGER NOT NULL DEFAULT 0")
        lengths: dict[str, int] = {}
        for cid, data in conn.execute(f"SELECT conversation_id, messages FROM {t.batches}"):
            lengths[cid] = lengths.get(cid, 0) + message_count(data)
        conn.executemany(
            f"UPDATE {t.conversations} SET length = ? WHERE id = ?",
            [(n, cid) for cid, n in lengths.items()],
        )
    # Version 5: branches and retention/erasure, each in idempotent steps.
    _upgrade_branches(conn, t)
    _upgrade_erasure(conn, t)
    conn.execute(
        f"INSERT INTO {t.schema} (id, version) VALUES (1, ?) "
        "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
        (SCHEMA_VERSION,),
    )


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The column names of ``table`` (quoted)."""
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _upgrade_branches(conn: sqlite3.Connection, t: _Tables) -> None:
    """Version 5 (branches, DESIGN §6h), in idempotent steps (each adds what is missing
    and fills what is unfilled, so running it again changes nothing): the
    conversation's ``head`` (the head batch's seq; NULL: the empty path) and
    ``branched`` (0 while the head path is every batch in seq order: the head was
    never moved), each batch's ``parent`` (seq; NULL for a first batch), ``created``
    (Unix seconds; NULL for batches stored before) and ``path_length`` (messages from
    the first batch through it), and the ``_moves`` table (``move_head``'s move ids).
    Batches stored before are kept as one branch: each one's parent is the batch
    before it in seq order, the head is the last one, path lengths are running sums."""
    have = _columns(conn, t.conversations)
    if "head" not in have:
        conn.execute(f"ALTER TABLE {t.conversations} ADD COLUMN head INTEGER")
    if "branched" not in have:
        conn.execute(
            f"ALTER TABLE {t.conversations} ADD COLUMN branched INTEGER NOT NULL DEFAULT 0"
        )
    have = _columns(conn, t.batches)
    for column, kind in (("parent", "INTEGER"), ("created", "REAL"), ("path_length", "INTEGER")):
        if column not in have:
            conn.execute(f"ALTER TABLE {t.batches} ADD COLUMN {column} {kind}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.moves} ("
        "conversation_id TEXT NOT NULL, "
        "move_id TEXT NOT NULL, "
        "head TEXT NOT NULL, "
        "PRIMARY KEY (conversation_id, move_id)"
        ") WITHOUT ROWID"
    )
    # A conversation that never branched has its last batch as its head.
    conn.execute(
        f"UPDATE {t.conversations} SET head = (SELECT MAX(seq) FROM {t.batches} b "
        f"WHERE b.conversation_id = {t.conversations}.id) WHERE head IS NULL AND NOT branched"
    )
    # Batches without a path length were stored before version 5: one branch in seq order.
    rows = conn.execute(
        f"SELECT conversation_id, seq, path_length, messages FROM {t.batches} "
        f"WHERE conversation_id IN (SELECT conversation_id FROM {t.batches} "
        "WHERE path_length IS NULL) ORDER BY conversation_id, seq"
    ).fetchall()
    updates: list[tuple[Any, int, Any, int]] = []
    previous: tuple[Any, Any] = (None, None)  # (conversation id, seq) of the row before
    total = 0
    for cid, seq, path_length, data in rows:
        parent = previous[1] if previous[0] == cid else None
        if parent is None:
            total = 0
        if path_length is None:
            total += message_count(data)
            updates.append((parent, total, cid, seq))
        else:
            total = int(path_length)
        previous = (cid, seq)
    conn.executemany(
        f"UPDATE {t.batches} SET parent = ?, path_length = ? WHERE conversation_id = ? AND seq = ?",
        updates,
    )


def _upgrade_erasure(conn: sqlite3.Connection, t: _Tables) -> None:
    """Schema 5's retention and erasure (DESIGN §6i), in idempotent steps (each one a
    no-op when already done, so it composes with the other steps to 5): the
    conversations table's ``owner`` (the first append's principal, NULL: none),
    ``expires_at`` (Unix seconds by the clock of the host running SQLite, NULL: never)
    and ``retained`` (1: the conversation's own setting, which appends do not move)
    columns and their indexes; the ``_secret`` table and its one row, 32 random bytes
    made here (the tombstones' HMAC key); the ``_tombstones`` table (one row per erased
    id: its keyed hash, and when)."""
    columns = _columns(conn, t.conversations)
    for name, declaration in (
        ("owner", "TEXT"),
        ("expires_at", "REAL"),
        ("retained", "INTEGER NOT NULL DEFAULT 0"),
    ):
        if name not in columns:
            conn.execute(f"ALTER TABLE {t.conversations} ADD COLUMN {name} {declaration}")
    conn.execute(
        f'CREATE INDEX IF NOT EXISTS "{t.prefix}_owners" '
        f"ON {t.conversations} (owner, id) WHERE owner IS NOT NULL"
    )
    conn.execute(
        f'CREATE INDEX IF NOT EXISTS "{t.prefix}_expiry" '
        f"ON {t.conversations} (expires_at) WHERE expires_at IS NOT NULL"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.secret} ("
        "id INTEGER PRIMARY KEY CHECK (id = 1), secret BLOB NOT NULL)"
    )
    conn.execute(
        f"INSERT INTO {t.secret} (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
        (new_secret(),),
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {t.tombstones} ("
        "tombstone TEXT PRIMARY KEY NOT NULL, erased_at REAL NOT NULL) WITHOUT ROWID"
    )
