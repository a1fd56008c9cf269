"""Persistent history stores, and ``open_store(url)`` to pick one by URL.

============================================  ==========================================
``scope.historystores.sqlite.SQLiteStore``    one file, stdlib sqlite3; the embedded
                                              default; asyncio and trio
``scope.historystores.postgres.PostgresStore``  PostgreSQL via asyncpg (``scope-chat[postgres]``);
                                              asyncio
``scope.historystores.redis.RedisStore``      Redis via redis-py (``scope-chat[redis]``); asyncio
============================================  ==========================================

Each is a ``scope.history.Store`` (and a ``PersistentStore``), passes the store
conformance suite, opens with an async ``open`` classmethod that creates its schema when
missing, is an async context manager and has ``aclose()``. Driver errors surface as
``scope.errors.StoreError`` (the driver error chained); a stored record that was changed
outside scope makes ``read`` and ``read_batches`` raise ``StoreError`` naming the
conversation; a stored conversation id that is not valid is skipped by
``conversations()`` (logged once, listed in ``invalid_conversation_ids``);
``scan_records()`` streams the stored records as they are, read-only, each a
``StoredRecord`` whose ``problem()`` says what a read would refuse in it (``scope
history verify``). Importing
this package or a backend module imports no driver: asyncpg and redis-py are imported
when a store is opened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Generator, Iterable
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, cast, final, runtime_checkable
from urllib.parse import parse_qs, unquote, urlsplit

from scope._validate import publish as _publish
from scope.history import Restorer, Store
from scope.history.storekit import check_retention
from scope.historystores._scan import DEFAULT_PAGE_SIZE, StoredRecord
from scope.historystores._schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from scope.historystores.sqlite import Synchronous

__all__ = [
    "OpeningStore",
    "PersistentStore",
    "SCHEMA_VERSION",
    "StoredRecord",
    "open_store",
]


@runtime_checkable
class PersistentStore(Store, Restorer, Protocol):
    """What ``open_store`` returns: a ``scope.history.Store`` that must be closed, whose
    stored records can be scanned as they are, and a ``scope.history.Restorer`` (what
    ``scope history export``/``import`` carry besides open conversations)."""

    async def aclose(self) -> None:
        """Release the store's connections; later calls raise ``StoreError``."""
        ...

    @property
    def invalid_conversation_ids(self) -> tuple[str, ...]:
        """Stored ids that ``conversations()`` skipped because they are not valid
        conversation ids (written outside scope), sorted; each is logged once as a
        warning on the ``scope.historystores`` logger."""
        ...

    def scan_records(
        self,
        conversation_ids: Iterable[str] | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[StoredRecord]:
        """Every stored batch record, as stored (see ``RecordScanning.scan_records``)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


_USAGE = (
    "use sqlite:///path, postgresql://user@host/db, redis://host:port/db or "
    "redis+cluster://host:port/0"
)


def open_store(
    url: str,
    *,
    prefix: str | None = None,
    create: bool = True,
    require_durable: bool = False,
    retention: timedelta | None = None,
) -> OpeningStore:
    """Open the store a URL names: ``await open_store(url)``, or ``async with
    open_store(url) as store`` (closed when the block ends).

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``; the query may set
      ``synchronous=NORMAL|FULL|EXTRA`` (see ``SQLiteStore.open``).
    - ``postgresql://…`` or ``postgres://…``: a libpq URI, passed to asyncpg as it is.
    - ``redis://…``, ``rediss://…`` (TLS): passed to redis-py as it is;
      ``redis+cluster://host:port/0`` (or ``rediss+cluster://``) names any node of a
      Redis Cluster (``RedisStore.open(..., cluster=True)``).

    ``prefix`` is the table prefix (SQLite, PostgreSQL) or key prefix (Redis); each
    store's default when None. ``create`` is passed to the SQL stores' ``open`` (create or
    upgrade the schema when it is not current; ``False``: only check it); Redis has no
    schema to create. ``require_durable`` (Redis) refuses a server whose persistence
    loses acknowledged writes instead of warning (see ``RedisStore.open``); the SQL
    stores are durable. ``retention`` (a ``timedelta`` > 0, or None: nothing expires by
    itself) is the store-wide retention every store's ``open`` takes (DESIGN §6i): a
    conversation without its own expiry (``retain``) expires that long after its last
    append. A URL of another form raises ``ValueError`` with a one-line
    message (never echoing credentials); an unreachable server ``StoreError``.
    """
    return OpeningStore(_open(url, prefix, create, require_durable, check_retention(retention)))


@final
class OpeningStore:
    """What ``open_store`` returns: await it for the store, or use it as an async
    context manager that closes the store at the end of the block."""

    __slots__ = ("_opening", "_store")

    def __init__(self, opening: Coroutine[Any, Any, PersistentStore]) -> None:
        self._opening = opening
        self._store: PersistentStore | None = None

    def __await__(self) -> Generator[Any, None, PersistentStore]:
        return self._opening.__await__()

    async def __aenter__(self) -> PersistentStore:
        self._store = await self._opening
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            await self._store.aclose()


async def _open(
    url: str, prefix: str | None, create: bool, require_durable: bool, retention: timedelta | None
) -> PersistentStore:
    if not isinstance(url, str):
        raise ValueError(f"store URL must be a string, got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError(f"store URL has no scheme: {_USAGE}")
    if scheme == "sqlite":
        from scope.historystores.sqlite import SQLiteStore

        parts = urlsplit(url)
        if parts.netloc:
            raise ValueError(
                f"sqlite URL must have an empty host (sqlite:///path), got {parts.netloc!r}"
            )
        path = unquote(parts.path)[1:]  # drop the slash that ends the empty authority
        if not path:
            raise ValueError("sqlite URL names no file: use sqlite:///path/to/history.db")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = sorted(set(query) - {"synchronous"})
        if unknown:
            raise ValueError(f"sqlite URL has unknown parameters {unknown}: only synchronous")
        synchronous = query.get("synchronous", ["NORMAL"])[-1].upper()
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be NORMAL, FULL or EXTRA, got {synchronous!r}")
        return await SQLiteStore.open(
            path,
            table_prefix="scope_history" if prefix is None else prefix,
            synchronous=cast("Synchronous", synchronous),
            create=create,
            retention=retention,
        )
    if scheme in ("postgresql", "postgres"):
        from scope.historystores.postgres import PostgresStore

        return await PostgresStore.open(
            url,
            table_prefix="scope_history" if prefix is None else prefix,
            create=create,
            retention=retention,
        )
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        from scope.historystores.redis import RedisStore

        cluster = scheme.endswith("+cluster")
        if cluster:  # any node of a Redis Cluster, reached through the cluster client
            url = scheme.removesuffix("+cluster") + url[len(scheme) :]
        return await RedisStore.open(
            url,
            prefix="scope:history" if prefix is None else prefix,
            cluster=cluster,
            require_durable=require_durable,
            retention=retention,
        )
    raise ValueError(f"unsupported store URL scheme {scheme!r}: {_USAGE}")


_publish(__name__, ["OpeningStore", "StoredRecord"], globals())
