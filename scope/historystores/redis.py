"""``RedisStore``: a history store in Redis, on redis-py's asyncio client (``scope-chat[redis]``).

redis-py is imported when a store is opened, not when this module is imported. The
client is asyncio-only, so this store runs under asyncio (not trio; use ``SQLiteStore``).

Keys (``{P}`` is ``prefix``, default ``scope:history``; ``{H}`` is the hex of the
conversation id's UTF-8 bytes, so any id is safe inside the ``{...}`` hash tag):

    {P}:{{H}}:batches   LIST    one element per batch: digest, "\\n", append id, "\\n", messages
    {P}:{{H}}:ids       HASH    append id -> digest (the dedupe record)
    {P}:{{H}}:closed    STRING  closure evidence; never expires
    {P}:{{H}}:length    STRING  how many messages the conversation holds (the fence's count)
    {P}:{{H}}:lease     STRING  the turn lease's holder token, expiring (PX) by the server
    {P}:conversations   ZSET    the open conversations holding a batch, score 0 (lexical order)
    {{P}:conversations}:cleared  SET  Cluster only: every id a clear started on, in the
                                listing's hash slot (the listing checks only these ids' closure)
    {P}:{{H}}:meta      HASH    owner (the first append's), exp (Unix ms), retained ("1")
    {P}:{{T}}:tombstones SET    the erased ids' tombstones of one hash slot (``T``: a
                                short tag in the conversation's slot, naming no id)
    {P}:secret          STRING  the store secret (the tombstones' HMAC key), SET NX at open
    {{P}:conversations}:expiring   ZSET  id -> expiry (Unix ms): expire() and listings
    {{P}:conversations}:owner:{O}  ZSET  an owner's conversations (``O``: hex of the owner)

One conversation's keys share a hash slot, so its scripts also run on Redis Cluster. The
append and clear are each one Lua script (atomic in Redis); ``read_view`` is one
``MULTI``/``EXEC``. A conversation written by scope 0.1 has no ``length`` key: the append
script counts its stored messages once (with ``cjson``) and records it. The listing sorted set is
maintained beside them, before the append script and after the clear script, and
``conversations()`` drops closed and empty ids from it, so the listing never shows a
closed id and shows every acknowledged one (an id stored outside scope that is not a
valid conversation id is skipped and logged, never deleted). Redis' own durability
applies: configure AOF (``appendonly yes``, ``appendfsync everysec`` or ``always``) for a
store that must survive a server restart; ``RedisStore.open`` checks it.
"""

from __future__ import annotations

import binascii
import contextlib
import datetime as _dt
import functools
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, final

from scope._validate import check_seconds, check_type
from scope.errors import ScopeWarning, StoreError
from scope.history import Batch, ConversationID, HistoryCache, HistoryView
from scope.history._erasure import check_retention, tombstone
from scope.historystores._driver import (
    Driver,
    cancellation_mark,
    deliver_cancellation,
    require_asyncio,
    retry_once,
    store_closed,
    warn_caller,
)
from scope.historystores._records import (
    Decoder,
    ListedIDs,
    corrupt,
    decode_records,
    shown_id,
    stored_id,
    view_of,
)
from scope.historystores._scan import UnreadableRecords
from scope.historystores._store import (
    RecordStore,
)

__all__ = ["RedisStore"]

T = TypeVar("T")

_PREFIX: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,100}\Z")

# The server's clock in Lua, in Unix milliseconds (expiry times are compared with it).
_NOW_MS: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# Whether the conversation is closed: KEYS closed, meta (its owner, expiry and
# retention flag), its slot's tombstone set; ARGV the id's tombstone. Expects _NOW_MS.
_SHUT: Final = """
local function shut(closed, meta, tombs, mark)
  if redis.call('EXISTS', closed) == 1 then return true end
  local exp = redis.call('HGET', meta, 'exp')
  if exp and tonumber(exp) <= now then return true end
  return redis.call('SISMEMBER', tombs, mark) == 1
end
"""

# KEYS: closed, ids, batches, length, meta, tombstones[, listing, expiring[, owner's
# index]]. ARGV: append id, digest, record, message count, expected length ('' for no
# fence), listing member, owner ('' none), tombstone, retention in ms ('' none).
# Checks first (closed, expired or erased; dedupe record; fence: DESIGN §6b's order),
# writes last, so an error (or an out-of-memory refusal of the first write) leaves
# nothing behind. Lengths are compared as decimal strings (no float). The first batch
# records the owner; an inserted batch moves the expiry by the retention unless the
# conversation has its own (meta's retained), and the batches and dedupe records
# expire natively then (PEXPIREAT). With the index keys (one Redis, not Cluster: they
# are in another hash slot there) an inserted batch lists its conversation (and its
# expiry, and its owner's index) in the same atomic step.
_APPEND: Final = (
    _NOW_MS
    + _SHUT
    + """
if shut(KEYS[1], KEYS[5], KEYS[6], ARGV[8]) then return 'closed' end
local accepted = redis.call('HGET', KEYS[2], ARGV[1])
if accepted then return 'accepted:' .. accepted end
local length = redis.call('GET', KEYS[4])
if not length then
  local n = 0
  for _, record in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    local first = string.find(record, '\\n', 1, true)
    local second = string.find(record, '\\n', first + 1, true)
    n = n + #cjson.decode(string.sub(record, second + 1))
  end
  length = string.format('%d', n)
end
if ARGV[5] ~= '' and ARGV[5] ~= length then return 'changed:' .. length end
local first = redis.call('HLEN', KEYS[2]) == 0
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SET', KEYS[4], length)
redis.call('INCRBY', KEYS[4], ARGV[4])
local owned = first and ARGV[7] ~= '' and redis.call('HSETNX', KEYS[5], 'owner', ARGV[7]) == 1
local exp = redis.call('HGET', KEYS[5], 'exp')
if ARGV[9] ~= '' and redis.call('HGET', KEYS[5], 'retained') ~= '1' then
  exp = string.format('%d', now + tonumber(ARGV[9]))
  redis.call('HSET', KEYS[5], 'exp', exp)
end
if exp then
  redis.call('PEXPIREAT', KEYS[2], exp)
  redis.call('PEXPIREAT', KEYS[3], exp)
end
if KEYS[7] then
  redis.call('ZADD', KEYS[7], 0, ARGV[6])
  if exp then redis.call('ZADD', KEYS[8], exp, ARGV[6]) end
  if owned and KEYS[9] then redis.call('ZADD', KEYS[9], 0, ARGV[6]) end
end
return 'inserted'
"""
)

# KEYS: closed, ids, batches, meta, tombstones[, listing, expiring]. ARGV: listing member,
# tombstone. The length key stays: a closed conversation's last length; so does the
# owner (erase_owned finds it). With the listing keys the id leaves them in the same
# atomic step. An erased id is left as it is: its tombstone closes it, and no key
# naming it is written again.
_CLEAR: Final = """
if redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then return 'erased' end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HDEL', KEYS[4], 'exp', 'retained')
if KEYS[6] then
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('ZREM', KEYS[7], ARGV[1])
end
return 'cleared'
"""

# KEYS: closed, length, batches, meta, tombstones. ARGV: tombstone. One atomic read for
# read_view (a script, not MULTI, so it runs the same on Redis Cluster): closed flag
# (closed, expired or erased), length ('' when absent), records.
_VIEW: Final = (
    _NOW_MS
    + _SHUT
    + """
if shut(KEYS[1], KEYS[4], KEYS[5], ARGV[1]) then
  return {1, redis.call('GET', KEYS[2]) or '', {}}
end
return {0, redis.call('GET', KEYS[2]) or '', redis.call('LRANGE', KEYS[3], 0, -1)}
"""
)

# KEYS: lease. ARGV: holder, ttl in ms. Take the free (or expired: Redis dropped it)
# lease with SET NX PX, or renew the holder's own: compare and set, one atomic step.
_ACQUIRE: Final = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease. ARGV: holder. Compare and delete.
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# The folded lease steps reuse the scripts above as Lua functions
# whose KEYS and ARGV parameters shadow the globals, so each rule stays written once.
# KEYS: lease, closed, length, batches, meta, tombstones. ARGV: holder, ttl in ms,
# tombstone. 0 when another holder's live lease has it, else read_view's answer, in the
# same atomic step.
_ACQUIRE_VIEW: Final = f"""
local function acquire(KEYS, ARGV)
{_ACQUIRE}
end
local function view(KEYS, ARGV)
{_VIEW}
end
if acquire({{KEYS[1]}}, {{ARGV[1], ARGV[2]}}) == 0 then return 0 end
return view({{KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}}, {{ARGV[3]}})
"""

# KEYS: lease, then _APPEND's keys. ARGV: holder, then _APPEND's arguments. The append,
# and when it landed or was a retry of the same batch (its digest is ARGV[3]), the
# release (compare and delete), in one atomic step; a refused append leaves the lease.
_APPEND_RELEASE: Final = f"""
local function append(KEYS, ARGV)
{_APPEND}
end
local function release(KEYS, ARGV)
{_RELEASE}
end
local outcome = append({{KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
                         KEYS[9], KEYS[10]}},
                       {{ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8],
                         ARGV[9], ARGV[10]}})
if outcome == 'inserted' or outcome == 'accepted:' .. ARGV[3] then
  release({{KEYS[1]}}, {{ARGV[1]}})
end
return outcome
"""

# KEYS: closed, ids, batches, meta, tombstones[, expiring]. ARGV: the expiry in Unix
# ms ('' never), listing member, tombstone. retain: 'closed', or the setting recorded
# (and the batches' native expiry set or removed) in one atomic step.
_RETAIN: Final = (
    _NOW_MS
    + _SHUT
    + """
if shut(KEYS[1], KEYS[4], KEYS[5], ARGV[3]) then return 'closed' end
redis.call('HSET', KEYS[4], 'retained', '1')
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[4], 'exp')
  redis.call('PERSIST', KEYS[2])
  redis.call('PERSIST', KEYS[3])
  if KEYS[6] then redis.call('ZREM', KEYS[6], ARGV[2]) end
else
  redis.call('HSET', KEYS[4], 'exp', ARGV[1])
  redis.call('PEXPIREAT', KEYS[2], ARGV[1])
  redis.call('PEXPIREAT', KEYS[3], ARGV[1])
  if KEYS[6] then redis.call('ZADD', KEYS[6], ARGV[1], ARGV[2]) end
end
return 'retained'
"""
)

# KEYS: closed, ids, batches, lease, meta[, listing, expiring]. ARGV: now in Unix ms,
# listing member. expire() of one conversation: {1} when it was due and is now closed
# (batches, dedupe records, lease deleted; owner and length kept), else {0, its
# expiry or ''} (cleared, or an append or retain moved it: the index is fixed).
_EXPIRE_ONE: Final = """
local exp = redis.call('HGET', KEYS[5], 'exp')
if redis.call('EXISTS', KEYS[1]) == 1 or not exp or tonumber(exp) > tonumber(ARGV[1]) then
  if KEYS[6] then
    if exp and redis.call('EXISTS', KEYS[1]) == 0 then
      redis.call('ZADD', KEYS[7], exp, ARGV[2])
    else
      redis.call('ZREM', KEYS[7], ARGV[2])
    end
  end
  return {0, exp or ''}
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('SET', KEYS[1], '1')
redis.call('HDEL', KEYS[5], 'exp', 'retained')
if KEYS[6] then
  redis.call('ZREM', KEYS[6], ARGV[2])
  redis.call('ZREM', KEYS[7], ARGV[2])
end
return {1}
"""

# KEYS: closed, ids, batches, length, lease, meta, tombstones[, listing, expiring,
# owner's index]. ARGV: tombstone, listing member, the owner the caller read ('' none).
# erase: every key of the conversation deleted and the tombstone added, in one atomic
# step; with the index keys (one Redis) the id leaves them in the same step ({'owner',
# owner} when the owner is not the one the caller named its index for: call again).
# Answers {'erased', seconds, microseconds, owner, {digest, bytes, ...}}.
_ERASE: Final = """
local owner = redis.call('HGET', KEYS[6], 'owner') or ''
if KEYS[8] and owner ~= ARGV[3] then return {'owner', owner} end
local out = {}
for _, record in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local first = string.find(record, '\\n', 1, true)
  local second = string.find(record, '\\n', first + 1, true)
  out[#out + 1] = string.sub(record, 1, first - 1)
  out[#out + 1] = #record - second
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('SADD', KEYS[7], ARGV[1])
if KEYS[8] then
  redis.call('ZREM', KEYS[8], ARGV[2])
  redis.call('ZREM', KEYS[9], ARGV[2])
  if KEYS[10] then redis.call('ZREM', KEYS[10], ARGV[2]) end
end
local clock = redis.call('TIME')
return {'erased', clock[1], clock[2], owner, out}
"""

# Cluster: the index entries of an erased (or expired) id, in the listing's slot.
# KEYS: listing, expiring, cleared[, owner's index]. ARGV: member.
_UNINDEX: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if KEYS[4] then redis.call('ZREM', KEYS[4], ARGV[1]) end
return 1
"""

#: How many listed ids one ``conversations()`` round trip fetches.
_PAGE: Final = 1000

#: The listing layout this version keeps: the key ``{prefix}:schema`` holds it. 2: the
#: listing holds exactly the open conversations that hold a batch (scope 0.1 also
#: listed closed and never-written ids and filtered them on every listing). 3: on a
#: Cluster every id a clear started on is in the cleared set beside the listing (see
#: ``RedisStore._list``); the upgrade checks every listed id once more.
_LISTING_VERSION: Final = b"3"

# Listing page. KEYS: listing (or an owner's index), cleared set, expiring (one slot)[,
# the listing, for an owner's index]. ARGV: start (ZRANGEBYLEX syntax), page size.
# Returns {members, flagged, skipped}: the page, the 0-based indices of its ids a clear
# started on (Cluster: then their closure is checked across slots), and those of its ids
# left out (expired by the server's clock, or an owner's id that is not listed: closed).
_LIST_PAGE: Final = (
    _NOW_MS
    + """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, ARGV[2])
local flagged, skipped = {}, {}
for index, member in ipairs(members) do
  local exp = redis.call('ZSCORE', KEYS[3], member)
  if (KEYS[4] and not redis.call('ZSCORE', KEYS[4], member))
     or (exp and tonumber(exp) <= now) then
    skipped[#skipped + 1] = index - 1
  elseif redis.call('SISMEMBER', KEYS[2], member) == 1 then
    flagged[#flagged + 1] = index - 1
  end
end
return {members, flagged, skipped}
"""
)


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """For each of Redis Cluster's 16,384 hash slots, a short hash tag in it (the
    smallest decimal number whose CRC16 lands there): the tombstone set of a slot is
    named with it, so a conversation's scripts reach its slot's tombstones (with no key
    naming an erased id). Computed once per process (about 110,000 CRCs)."""
    tags: dict[int, str] = {}
    n = 0
    while len(tags) < 16384:
        tag = str(n)
        tags.setdefault(binascii.crc_hqx(tag.encode("ascii"), 0) % 16384, tag)
        n += 1
    return tuple(tags[slot] for slot in range(16384))


def _redis() -> Any:
    """The redis.asyncio module, imported on first use."""
    try:
        import redis.asyncio
    except ImportError as exc:
        raise ImportError(
            "RedisStore needs redis-py: install the extra, pip install 'scope-chat[redis]'"
        ) from exc
    return redis.asyncio


def _driver() -> Driver:
    """How redis-py fails (see ``retry_once``): every exception it raises, plus socket
    errors and timeouts. Retryable: the connection dropped, or the server asks for a
    retry. Not timeouts (``socket_timeout`` ran out connecting, sending or waiting for
    the reply): the server or the network held the call for the whole
    ``socket_timeout`` already, and whatever held it most likely still does."""
    import redis.exceptions

    # Not every redis-py error derives from RedisError; the odd ones (present in some
    # versions only) are listed by name.
    odd = ("RedisClusterException", "ChildDeadlockedError", "IncorrectPolicyType")
    return Driver(
        "Redis",
        errors=(
            redis.exceptions.RedisError,
            *(getattr(redis.exceptions, name) for name in odd if hasattr(redis.exceptions, name)),
            OSError,
            TimeoutError,
        ),
        retryable=(
            redis.exceptions.ConnectionError,  # includes BusyLoadingError
            redis.exceptions.TryAgainError,
            OSError,
        ),
        timeouts=(redis.exceptions.TimeoutError, TimeoutError),
        package="redis",
    )


def validate_prefix(prefix: object) -> str:
    """A key prefix: 1-100 of ASCII letters, digits, ``_``, ``.``, ``:`` and ``-``.

    Braces are refused because a ``{`` in the prefix would become the hash tag of every
    key; glob characters because the prefix must be usable in ``SCAN MATCH``. Anything
    else raises ``ValueError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, got {type(prefix).__name__}")
    if not _PREFIX.match(prefix):
        raise ValueError(
            "prefix must be 1-100 characters of ASCII letters, digits, '_', '.', ':' "
            f"and '-', got {prefix!r}"
        )
    return prefix


@final
class RedisStore(RecordStore):
    """A ``scope.history.Store`` (and ``PersistentStore``) in Redis.

    Open with ``await RedisStore.open(url)``; use as an async context manager or call
    ``aclose()`` (closes the client and its connections).

    Guarantees, beyond the store rules of ``scope.history``:

    - **Atomicity.** ``append`` is one Lua script: closed check, dedupe record and push of
      the batch (one list element) run as a unit; ``clear`` is one script that records the
      closure and deletes the batches and dedupe records. Both are linearizable across
      clients and hosts. The turn lease (``acquire_turn``/``release_turn``) is one script
      per step, and so are the folded steps: ``acquire_turn_view``
      takes the lease and reads the view, ``append_release_turn`` runs the append script
      and then the compare-and-delete of the lease, in the conversation's hash slot.
    - **Reconnects.** When a connection drops (``CLIENT KILL``, restart, network) the
      operation is retried once on a fresh connection; every operation is idempotent, so a
      batch lands exactly once. If the retry fails too, ``StoreError`` is raised with the
      driver error chained; an append that raised ``StoreError`` may have been applied,
      and retrying the same batch resolves it.
    - **Timeouts.** ``socket_timeout`` (default 10 s) bounds connecting and each round
      trip; a timeout raises ``StoreError`` naming the operation and is not retried (a
      retry would double the caller's wait). The script ran entirely or not at all;
      repeating the call is safe.
    - **Cancellation.** A cancelled call leaves all or nothing: a script runs entirely or
      not at all (a cancelled append may have been applied; a retry resolves it). The
      call always ends cancelled: a cancellation redis-py swallowed (Python 3.11's
      ``asyncio.wait_for``) is raised when the driver call returns.
    - **Persistence.** ``open`` checks the server's ``appendonly``/``save`` and warns
      (``ScopeWarning``) or refuses (``require_durable=True``) when a restart would lose
      acknowledged writes.
    - **Errors.** Every redis-py, socket and timeout error becomes ``StoreError``; a
      corrupt stored record makes ``read`` and ``read_batches`` raise ``StoreError`` naming
      the conversation. Calls on a closed store raise ``StoreError``.
    """

    __slots__ = (
        "_cache",
        "_cleared",
        "_client",
        "_closed",
        "_driver",
        "_expiring",
        "_listed",
        "_listing",
        "_listing_checked",
        "_outcome_source",
        "_retention",
        "_secret",
        "_socket_timeout",
        "cluster",
        "prefix",
        "retention",
    )

    _store_kind = "redis"

    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis, or RedisCluster with cluster=True
        prefix: str,
        cache: HistoryCache,
        socket_timeout: float | None = None,
        cluster: bool = False,
        retention: _dt.timedelta | None = None,
    ) -> None:
        """Internal: use ``await RedisStore.open(url)``."""
        self._secret = b""  # read (or made) at open: the key {prefix}:secret
        self.retention: Final = retention
        self._retention = (
            "" if retention is None else str(max(1, math.ceil(retention.total_seconds() * 1000)))
        )
        self._client: Any = client
        self._socket_timeout = socket_timeout
        self._cache = cache
        self._closed = False
        self._driver = _driver()
        self._listing = f"{prefix}:conversations"
        # Cluster: the ids a clear started on, in the listing's hash slot (the hash tag
        # is the listing's whole name, which is what the listing key hashes by).
        self._cleared = f"{{{self._listing}}}:cleared"
        # The expiry index (id -> expiry in Unix ms) and the owners' indexes, in the
        # listing's slot too.
        self._expiring = f"{{{self._listing}}}:expiring"
        self._listing_checked = False
        self.prefix: Final = prefix
        self.cluster: Final = cluster
        self._listed = ListedIDs(repr(self))
        self._outcome_source = "Redis append script"

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        prefix: str = "scope:history",
        max_connections: int | None = None,
        client_name: str | None = None,
        socket_timeout: float | None = 10.0,
        cache_bytes: int = HistoryCache.DEFAULT_MAX_BYTES,
        check_persistence: bool = True,
        require_durable: bool = False,
        cluster: bool = False,
        retention: _dt.timedelta | None = None,
    ) -> RedisStore:
        """Connect to ``url`` (``redis://[[user]:password@]host:port/db`` or ``rediss://``
        for TLS) and check the server answers.

        ``prefix`` names every key (see ``validate_prefix``); stores with different
        prefixes share one database independently.
        ``cache_bytes`` (default 32 MiB; 0 keeps nothing) bounds this handle's
        ``history_cache``: the decoded batches (so re-reading a conversation skips
        decoding; every record is still checked against its digest on every read)
        and the replays the history Middleware checked, each counted at twice its
        encoded size, media included (see ``scope.history.HistoryCache``).
        ``socket_timeout`` (seconds, default 10; None: no bound) bounds connecting and
        each command's round trip; a timeout raises ``StoreError`` and is not retried.

        Persistence: with ``check_persistence`` (the default) the server's ``appendonly``
        and ``save`` settings are read (``CONFIG GET``). Unless ``appendonly`` is ``yes``
        (AOF), acknowledged writes do not survive a restart: every batch (or those since
        the last RDB snapshot) is lost and cleared conversations become open again. Then
        ``require_durable=True`` refuses with ``StoreError``; otherwise a
        ``scope.errors.ScopeWarning`` states the consequence (Python shows it once per
        process by default). A server that refuses ``CONFIG`` (ACL, renamed command)
        counts as unknown: warned about, refused with ``require_durable=True``.
        ``check_persistence=False`` skips the check (one fewer round trip, no warning;
        for servers whose durability is known, or deliberately volatile ones).

        ``cluster=True``: ``url`` names one node of a Redis Cluster, reached through
        redis-py's cluster client. Every script touches one conversation's keys, which
        share a hash slot; the listing set lives in its own slot, so there it is kept
        beside the scripts instead of inside them, and ``conversations()`` checks each
        listed id's closure (see the class docstring). The persistence check asks every
        master.

        ``retention`` (a ``timedelta`` > 0; None, the default: nothing expires by
        itself): a conversation without its own expiry (``retain``) expires this long
        after its last append through this handle, by the server's clock; its batches
        and dedupe records expire natively then (``PEXPIREAT``), ``expire()`` closes it
        and cleans the indexes. The store secret (the tombstones' HMAC key) is the key
        ``{prefix}:secret``, set once (``SET NX``) by the first open.

        A bad prefix, URL, cache size or option combination raises ``ValueError``
        before any I/O; an unreachable server raises ``StoreError``. Needs asyncio.
        """
        kept = check_retention(retention)
        if require_durable and not check_persistence:
            raise ValueError("require_durable=True needs check_persistence=True")
        check_type(cluster, bool, "cluster", "a bool")
        if socket_timeout is not None:
            socket_timeout = check_seconds(socket_timeout, "socket_timeout", positive=True)
        if max_connections is not None:
            check_type(max_connections, int, "max_connections", "an integer or None")
            if max_connections < 1:
                raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        prefix = validate_prefix(prefix)
        cache = HistoryCache(cache_bytes)
        check_type(url, str, "url", "a string")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        require_asyncio("RedisStore", "redis-py")
        aioredis = _redis()
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        options: dict[str, Any] = {
            "client_name": client_name,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            # The store retries once itself, knowing which operations are safe to.
            "retry": Retry(NoBackoff(), 0),
        }
        if max_connections is not None:
            options["max_connections"] = max_connections
        try:
            if cluster:
                from redis.asyncio.cluster import RedisCluster

                client = RedisCluster.from_url(url, **options)
            else:
                client = aioredis.Redis.from_url(url, **options)
        except ValueError as exc:
            raise ValueError(f"invalid Redis URL: {exc}") from exc
        store = cls(client, prefix, cache, socket_timeout, cluster, kept)
        try:
            await store._call(lambda: client.ping(), "connect")
            await store._read_secret()
            if check_persistence:
                problem = await store._persistence_problem()
                if problem is not None:
                    if require_durable:
                        raise StoreError(f"{problem}; refused (require_durable=True)")
                    warn_caller(
                        f"{problem}. Configure appendonly yes (appendfsync everysec or "
                        "always), or pass require_durable=True to refuse such a server",
                        ScopeWarning,
                    )
        except BaseException:
            await client.aclose()
            raise
        return store

    async def _read_secret(self) -> None:
        """Make the store secret (``SET NX``: the first open's 32 random bytes win) and
        read it."""
        from scope.history._erasure import new_secret

        client = self._client
        key = f"{self.prefix}:secret"
        await self._call(lambda: client.set(key, new_secret(), nx=True), "store secret")
        secret = await self._call(lambda: client.get(key), "store secret")
        if not isinstance(secret, bytes) or len(secret) != 32:
            raise StoreError(
                f"Redis key {key!r} does not hold a 32-byte store secret (written outside "
                "scope?): erase needs it; restore it from a backup"
            )
        self._secret = secret

    async def _persistence_problem(self) -> str | None:
        """What a server restart would lose, or None when AOF is on."""
        import redis.exceptions

        client = self._client
        if self.cluster:
            return await self._cluster_persistence_problem()
        kwargs = client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        where = f"Redis at {where}/{kwargs.get('db', 0)}"
        try:
            appendonly = await self._call(
                lambda: client.config_get("appendonly"), "persistence check"
            )
            save = await self._call(lambda: client.config_get("save"), "persistence check")
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
                raise
            return (
                f"{where}: cannot check persistence, CONFIG GET is not permitted "
                f"({type(exc.__cause__).__name__}: {exc.__cause__}); unless appendonly is "
                "yes, a restart loses "
                "acknowledged batches and makes cleared conversations open again"
            )
        aof = str(appendonly.get("appendonly", "")).lower()
        snapshots = str(save.get("save", ""))
        if aof == "yes":
            return None
        if snapshots.strip():
            return (
                f'{where} persists only RDB snapshots (appendonly {aof}, save "{snapshots}"): '
                "a restart loses the batches acknowledged, and makes open again the "
                "conversations cleared, since the last snapshot"
            )
        return (
            f'{where} does not persist data (appendonly {aof}, save ""): a restart loses '
            "every acknowledged batch and makes cleared conversations open again (they "
            "accept appends)"
        )

    async def _cluster_persistence_problem(self) -> str | None:
        """``_persistence_problem`` for a cluster: every master must run AOF."""
        import redis.exceptions
        from redis.asyncio.cluster import RedisCluster

        client: Any = self._client
        try:
            answers = await self._call(
                lambda: client.config_get("appendonly", target_nodes=RedisCluster.PRIMARIES),
                "persistence check",
            )
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
                raise
            return (
                "Redis Cluster: cannot check persistence, CONFIG GET is not permitted; "
                "unless appendonly is yes on every master, a restart loses acknowledged "
                "batches and makes cleared conversations open again"
            )
        volatile = sorted(
            node
            for node, answer in dict(answers).items()
            if str(dict(answer).get("appendonly", "")).lower() != "yes"
        )
        if not volatile:
            return None
        return (
            f"Redis Cluster masters {', '.join(volatile)} do not run AOF (appendonly is not "
            "yes): restarting one loses the batches it acknowledged and makes conversations "
            "cleared there open again"
        )

    async def _listing_page(self, after: bytes | None, what: str, size: int = _PAGE) -> list[bytes]:
        """Up to ``size`` listed ids after ``after`` (from the start when None), in
        byte order: one round trip."""
        client = self._client
        start = b"-" if after is None else b"(" + after

        async def page() -> list[bytes]:
            found = await client.zrange(self._listing, start, b"+", bylex=True, offset=0, num=size)
            return [bytes(member) for member in found]

        return await self._call(page, what)

    async def _upgrade_listing(self) -> None:
        """Bring a listing written by scope 0.1 to this version's rule (every listed id
        is open and holds a batch): drop the others, once, then record the version.
        Runs on a handle's first ``conversations()`` (one ``GET`` once it is done)."""
        client = self._client
        marker = f"{self.prefix}:schema"
        version = await self._call(lambda: client.get(marker), "listing check")
        if version == _LISTING_VERSION:
            self._listing_checked = True
            return
        after: bytes | None = None
        while page := await self._listing_page(after, "listing upgrade"):
            keys: list[str] = []
            members: list[bytes] = []
            for raw in page:
                try:
                    cid = stored_id(raw)
                except ValueError:
                    continue  # left for conversations() to report, never deleted
                closed, _, batches, _ = self._keys(cid)
                keys += (closed, batches)
                members.append(raw)
            flags = await self._call(
                functools.partial(_exists_each, client, keys), "listing upgrade"
            )
            stale = [
                raw
                for index, raw in enumerate(members)
                if flags[2 * index] or not flags[2 * index + 1]
            ]
            if stale:
                await self._call(
                    functools.partial(client.zrem, self._listing, *stale), "listing upgrade"
                )
            after = page[-1]
        await self._call(lambda: client.set(marker, _LISTING_VERSION), "listing upgrade")
        self._listing_checked = True

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r})"

    async def aclose(self) -> None:
        """Close the client and its connection pool. Later calls raise ``StoreError``.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._client.aclose()
        except self._driver.errors as exc:
            raise self._driver.failed(exc, "close") from exc

    @property
    def closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        return self._closed

    def _keys(self, cid: str) -> tuple[str, str, str, str]:
        """closed, ids, batches, length: one hash slot."""
        tag = cid.encode("utf-8").hex()
        base = f"{self.prefix}:{{{tag}}}"
        return f"{base}:closed", f"{base}:ids", f"{base}:batches", f"{base}:length"

    def _erasure_keys(self, cid: str) -> tuple[str, str, str]:
        """meta (owner, expiry, retained), the slot's tombstone set, the tombstone."""
        raw = cid.encode("utf-8")
        slot = binascii.crc_hqx(raw.hex().encode("ascii"), 0) % 16384
        return (
            f"{self.prefix}:{{{raw.hex()}}}:meta",
            f"{self.prefix}:{{{_slot_tags()[slot]}}}:tombstones",
            tombstone(self._secret, cid),
        )

    def _owner_index(self, owner: str) -> str:
        """The owner's index (its conversations, open or closed until erased), in the
        listing's slot."""
        return f"{{{self._listing}}}:owner:{owner.encode('utf-8').hex()}"

    async def _call(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        """Run ``fn()``, retrying once on a fresh connection when the connection dropped;
        map driver errors to ``StoreError`` (``retry_once``); re-raise a cancellation
        redis-py swallowed (see ``deliver_cancellation``)."""
        if self._closed:
            raise store_closed("RedisStore")
        mark = await cancellation_mark()
        settle = functools.partial(deliver_cancellation, mark)
        return await retry_once(self, self._driver, fn, what, settle)

    async def _reconnect(self) -> None:
        # The server may have dropped every pooled connection (restart, CLIENT KILL)
        # before this client noticed: reconnect the idle ones rather than retry on one.
        pool = getattr(self._client, "connection_pool", None)  # a cluster has none
        if pool is not None:
            with contextlib.suppress(*self._driver.errors):
                await pool.disconnect(inuse_connections=False)

    def _timed_out(self, exc: BaseException, what: str) -> StoreError:
        limit = self._socket_timeout
        after = "" if limit is None else f" after {limit:g} s (socket_timeout)"
        return StoreError(
            f"Redis {what} timed out{after}: {type(exc).__name__}: {exc}; not retried. It "
            "ran entirely or not at all; repeating it is safe (a batch lands once)"
        )

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The conversation's messages, length and closure from one script (a consistent
        snapshot, on Redis Cluster too). A corrupt stored record raises ``StoreError``."""
        cid = ConversationID(conversation_id)
        closed_key, _, batches_key, length_key = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        client = self._client

        async def read() -> list[Any]:
            return list(
                await client.eval(_VIEW, 5, closed_key, length_key, batches_key, meta, tombs, mark)
            )

        answer = await self._call(read, f"read of conversation {str(cid)!r}")
        return self._view(cid, answer)

    def _view(self, cid: ConversationID, answer: list[Any]) -> HistoryView:
        """The ``HistoryView`` of the view script's answer (closed flag, length or '',
        records)."""
        closed, raw_length, items = answer
        records = [_split(cid, item) for item in items]
        if not raw_length:
            if closed:
                return view_of(cid, True, 0, (), self._cache)
            # Written by scope 0.1 (no length key yet): the stored messages are the count.
            messages = tuple(decode_records(cid, records, self._cache))
            return HistoryView(messages, len(messages))
        try:
            length = int(raw_length)
        except ValueError:
            raise StoreError(
                f"conversation {str(cid)!r} is corrupt: its length is {raw_length!r}"
            ) from None
        return view_of(cid, bool(closed), length, records, self._cache)

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        key = self._keys(cid)[2]
        client = self._client
        items: list[Any] = await self._call(
            lambda: client.lrange(key, 0, -1), f"read of conversation {str(cid)!r}"
        )
        return decode(cid, (_split(cid, item) for item in items), self._cache)

    async def _stored_ids(self, after: Any, limit: int) -> list[Any]:
        # The listing: every conversation scope appended to (ZRANGE only, never the
        # listing upgrade or cleanup that conversations() may write).
        client = self._client
        start = b"-" if after is None else b"(" + after

        async def page() -> list[bytes]:
            found = await client.zrange(self._listing, start, b"+", bylex=True, offset=0, num=limit)
            return [bytes(member) for member in found]

        try:
            return await self._call(page, "scan of conversation ids")
        except StoreError as exc:
            held = await self._wrong_type(exc, self._listing)
            if held is None:
                raise
            raise StoreError(
                f"Redis scan of conversation ids: the listing key {self._listing!r} holds a "
                f"{held}, not a sorted set (written outside scope), so the conversations "
                "cannot be listed; name them to scan them"
            ) from exc

    async def _record_page(
        self, raw_id: Any, after: Any, limit: int
    ) -> list[tuple[Any, Any, Any, Any, str]]:
        raw = raw_id if isinstance(raw_id, bytes) else str(raw_id).encode("utf-8")
        key = f"{self.prefix}:{{{raw.hex()}}}:batches"
        start = 0 if after is None else after + 1
        client = self._client
        try:
            items: list[Any] = await self._call(
                lambda: client.lrange(key, start, start + limit - 1),
                f"scan of conversation {shown_id(raw)!r}",
            )
        except StoreError as exc:
            held = await self._wrong_type(exc, key)
            if held is None:
                raise
            raise UnreadableRecords(
                f"its records cannot be read: key {key!r} holds a {held}, not a list "
                "(written outside scope)"
            ) from exc
        return [(start + offset, *_fields(item)) for offset, item in enumerate(items)]

    async def _wrong_type(self, exc: StoreError, key: str) -> str | None:
        """When ``exc`` is Redis's ``WRONGTYPE`` answer for ``key``: the type the key
        holds (``TYPE``, read-only), else None."""
        import redis.exceptions

        cause = exc.__cause__
        if not isinstance(cause, redis.exceptions.ResponseError):
            return None
        if not str(cause).startswith("WRONGTYPE"):
            return None
        client = self._client
        held = await self._call(lambda: client.type(key), f"type of key {key!r}")
        return held.decode("utf-8", "replace") if isinstance(held, bytes) else str(held)

    async def _write(self, batch: Batch, holder: str | None, owner: str | None) -> Any:
        # One script; with a holder (append_release_turn) the folded script, which also
        # releases the holder's lease when the append landed or was a retry.
        cid = batch.conversation_id
        aid = str(batch.id).encode("utf-8")
        digest = batch.digest.encode("ascii")
        record = b"".join((digest, b"\n", aid, b"\n", batch.encoded_messages))
        keys = self._keys(cid)
        member = cid.encode("utf-8")
        client = self._client
        listing = self._listing
        count = len(batch.messages)
        expected = "" if batch.expected_length is None else str(batch.expected_length)
        cluster = self.cluster
        meta, tombs, mark = self._erasure_keys(cid)
        every = (*keys, meta, tombs)
        indexes = (listing, self._expiring) + (() if owner is None else (self._owner_index(owner),))
        extra = (member, owner or "", mark, self._retention)
        # With a holder: the folded script, the lease key first and the holder first.
        script, lease, token = (
            (_APPEND, (), ())
            if holder is None
            else (_APPEND_RELEASE, (self._lease_key(cid),), (holder,))
        )
        n = len(lease)

        async def append() -> Any:
            if not cluster:  # one script: the listing changes in the same atomic step
                return await client.eval(
                    script, n + 6 + len(indexes), *lease, *every, *indexes,
                    *token, aid, digest, record, count, expected, *extra,
                )  # fmt: skip
            return await client.eval(
                script, n + 6, *lease, *every, *token, aid, digest, record, count, expected, *extra
            )

        return await self._call(append, f"append to conversation {str(cid)!r}")

    async def _after_append(self, batch: Batch, owner: str | None) -> None:
        if not self.cluster:
            return
        # The listing is in another hash slot: listed after the batch landed (and again
        # on a retry), before the receipt, so every acknowledged id is listed. So are
        # its expiry and owner (read from the conversation's meta) when it has them.
        cid = batch.conversation_id
        client = self._client
        member = cid.encode("utf-8")
        await self._call(
            lambda: client.zadd(self._listing, {member: 0}), f"listing of {str(cid)!r}"
        )
        if owner is None and not self._retention:
            return
        meta = self._erasure_keys(cid)[0]
        recorded, exp = await self._call(
            lambda: client.hmget(meta, "owner", "exp"), f"listing of {str(cid)!r}"
        )
        if exp is not None:
            await self._call(
                lambda: client.zadd(self._expiring, {member: int(exp)}), f"listing of {cid!r}"
            )
        if recorded is not None and owner is not None:
            index = self._owner_index(recorded.decode("utf-8"))
            await self._call(lambda: client.zadd(index, {member: 0}), f"listing of {cid!r}")

    async def _clear(self, cid: ConversationID) -> None:
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (*self._keys(cid)[:3], meta, tombs)
        client = self._client
        indexes = (self._listing, self._expiring)
        member = cid.encode("utf-8")
        cluster = self.cluster

        async def clear() -> None:
            if not cluster:
                await client.eval(_CLEAR, 7, *keys, *indexes, member, mark)
                return
            # Another slot: first marked in the listing's slot, so a listing checks this
            # id's closure until it left the listing (see _list), then closed, then
            # unlisted. An erased id is not marked (no key names it again).
            if await client.sismember(tombs, mark):
                return
            await client.sadd(self._cleared, member)
            await client.eval(_CLEAR, 5, *keys, member, mark)
            await client.zrem(self._listing, member)
            await client.zrem(self._expiring, member)

        await self._call(clear, f"clear of conversation {str(cid)!r}")

    def _lease_key(self, cid: str) -> str:
        """The conversation's lease key, in its hash slot."""
        return f"{self.prefix}:{{{cid.encode('utf-8').hex()}}}:lease"

    async def _acquire(self, cid: ConversationID, holder: str, ttl: float) -> bool:
        # One script; the lease expires by the server's clock (PX, at least 1 ms).
        key = self._lease_key(cid)
        millis = max(1, math.ceil(ttl * 1000))
        client = self._client

        async def acquire() -> Any:
            return await client.eval(_ACQUIRE, 1, key, holder, millis)

        return bool(await self._call(acquire, f"lease of conversation {str(cid)!r}"))

    async def _release(self, cid: ConversationID, holder: str) -> bool:
        key = self._lease_key(cid)
        client = self._client

        async def release() -> Any:
            return await client.eval(_RELEASE, 1, key, holder)

        return bool(await self._call(release, f"lease release of conversation {str(cid)!r}"))

    async def _acquire_view(
        self, cid: ConversationID, holder: str, ttl: float
    ) -> HistoryView | None:
        # One script (append_release_turn: one script too; on a Cluster the listing is
        # updated after it, as for append).
        closed_key, _, batches_key, length_key = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (self._lease_key(cid), closed_key, length_key, batches_key, meta, tombs)
        millis = max(1, math.ceil(ttl * 1000))
        client = self._client

        async def acquire_view() -> Any:
            return await client.eval(_ACQUIRE_VIEW, 6, *keys, holder, millis, mark)

        answer = await self._call(acquire_view, f"lease and read of conversation {str(cid)!r}")
        if answer == 0:
            return None
        return self._view(cid, list(answer))

    async def _list(
        self, after: ConversationID | None, limit: int | None, owner: str | None
    ) -> list[Any]:
        """One round trip per 1,000 listed ids (``limit`` or all), in code point order
        (the sorted set orders members by their UTF-8 bytes).

        On one Redis the listing holds exactly the open conversations that hold a batch
        (the append and clear scripts keep it). On a Cluster it is kept beside the
        scripts (another hash slot): a clear first adds the id to a cleared set in the
        listing's slot, then closes the conversation, then unlists it; an append lists
        its id after its script. So a listed id can only be closed when it is in the
        cleared set (a clear that died before unlisting it, or an append's listing that
        came after a clear): each page comes with those flags from one script, and only
        the flagged ids' closure is checked (normally none); a closed one is unlisted.
        Every page leaves out the ids expired by the server's clock (the expiry index,
        in the listing's slot); an owner's listing pages through the owner's index and
        keeps the ids that are listed."""
        if not self._listing_checked:
            await self._upgrade_listing()
        out: list[bytes] = []
        cursor = None if after is None else after.encode("utf-8")
        while limit is None or len(out) < limit:
            want = _PAGE if limit is None else min(_PAGE, limit - len(out))
            page, listed = await self._cluster_page(cursor, want, owner)
            if not page:
                break
            cursor = page[-1]
            out += listed
            if len(page) < want:
                break
        return out

    async def _cluster_page(
        self, after: bytes | None, size: int, owner: str | None = None
    ) -> tuple[list[bytes], list[bytes]]:
        """One listing page (``_LIST_PAGE``): the ids fetched, and those of them listed:
        not expired (nor, for an owner, unlisted) and not found closed (Cluster: the
        closed ones are unlisted)."""
        client = self._client
        start = b"-" if after is None else b"(" + after
        keys: tuple[str, ...] = (self._listing, self._cleared, self._expiring)
        if owner is not None:
            keys = (self._owner_index(owner), self._cleared, self._expiring, self._listing)
        members, flagged, skipped = await self._call(
            lambda: client.eval(_LIST_PAGE, len(keys), *keys, start, size),
            "listing of conversations",
        )
        every = [bytes(member) for member in members]
        left_out = {int(index) for index in skipped}
        page = [raw if index not in left_out else b"" for index, raw in enumerate(every)]
        if left_out:
            listed, _ = await self._closure_checked(page, flagged)
            return every, [raw for raw in listed if raw]
        return await self._closure_checked(every, flagged)

    async def _closure_checked(
        self, page: list[bytes], flagged: list[Any]
    ) -> tuple[list[bytes], list[bytes]]:
        """``page`` and its ids not found closed among the ``flagged`` ones (a closed one
        is unlisted)."""
        client = self._client
        suspects: list[int] = []
        closed_keys: list[str] = []
        for index in flagged:
            try:
                closed_keys.append(self._keys(stored_id(page[index]))[0])
            except ValueError:
                continue  # left for the listing to report, never deleted
            suspects.append(index)
        if not closed_keys:
            return page, page
        flags = await self._call(
            lambda: _exists_each(client, closed_keys), "listing of conversations"
        )
        gone = {page[index] for index, flag in zip(suspects, flags, strict=True) if flag}
        if gone:  # closed for ever: forget them
            await self._call(lambda: client.zrem(self._listing, *gone), "listing cleanup")
        return page, [raw for raw in page if raw not in gone]

    # -- retention and erasure (DESIGN §6i) -------------------------------------------

    async def _retain(self, cid: ConversationID, until: float | None) -> bool:
        # One script (Cluster: the expiry index, in another slot, after it).
        closed_key, ids, batches, _ = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (closed_key, ids, batches, meta, tombs)
        at = "" if until is None else str(math.floor(until * 1000))
        member = cid.encode("utf-8")
        client = self._client
        cluster = self.cluster

        async def retain() -> Any:
            if not cluster:
                return await client.eval(_RETAIN, 6, *keys, self._expiring, at, member, mark)
            answer = await client.eval(_RETAIN, 5, *keys, at, member, mark)
            if _text(answer) == "retained":
                if until is None:
                    await client.zrem(self._expiring, member)
                else:
                    await client.zadd(self._expiring, {member: int(at)})
            return answer

        answer = await self._call(retain, f"retention of conversation {str(cid)!r}")
        return _text(answer) == "retained"

    async def _expire_page(self, now: float | None, limit: int) -> list[ConversationID]:
        # The due ids from the expiry index (by the server's clock unless given), then
        # one script each (one Redis: the indexes in it; Cluster: after it).
        client = self._client
        if now is None:
            seconds, micros = await self._call(lambda: client.time(), "expiry of conversations")
            at = int(seconds) * 1000 + int(micros) // 1000
        else:
            at = math.floor(now * 1000)
        due = await self._call(
            lambda: client.zrangebyscore(self._expiring, "-inf", at, start=0, num=limit),
            "expiry of conversations",
        )
        gone: list[ConversationID] = []
        for raw in due:
            try:
                cid = stored_id(bytes(raw))
            except ValueError:
                continue  # not scope's: left alone
            closed_key, ids, batches, _ = self._keys(cid)
            keys = (closed_key, ids, batches, self._lease_key(cid), self._erasure_keys(cid)[0])
            member = bytes(raw)

            async def one(keys: tuple[str, ...] = keys, member: bytes = member) -> Any:
                if not self.cluster:
                    indexes = (self._listing, self._expiring)
                    return await client.eval(_EXPIRE_ONE, 7, *keys, *indexes, at, member)
                answer = await client.eval(_EXPIRE_ONE, 5, *keys, at, member)
                if int(answer[0]) == 1:
                    await client.zrem(self._listing, member)
                    await client.zrem(self._expiring, member)
                elif answer[1]:
                    await client.zadd(self._expiring, {member: int(answer[1])})
                else:
                    await client.zrem(self._expiring, member)
                return answer

            answer = await self._call(one, f"expiry of conversation {str(cid)!r}")
            if int(answer[0]) == 1:
                gone.append(cid)
        return gone

    async def _erase(
        self, cid: ConversationID, mark: str
    ) -> tuple[list[tuple[Any, str, int]], float]:
        # One script in the conversation's slot. One Redis: the indexes in it too (the
        # owner's index named from the owner read first; the script checks it). Cluster:
        # the index entries (another slot) are removed after it, by _unindex.
        closed_key, ids, batches, length = self._keys(cid)
        meta, tombs, _ = self._erasure_keys(cid)
        keys = (closed_key, ids, batches, length, self._lease_key(cid), meta, tombs)
        member = cid.encode("utf-8")
        client = self._client
        cluster = self.cluster
        what = f"erasure of conversation {str(cid)!r}"

        async def erase() -> Any:
            if cluster:
                return await client.eval(_ERASE, 7, *keys, mark, member, "")
            owner = await client.hget(meta, "owner")
            for _ in range(3):  # an owner recorded meanwhile: once more with its index
                named = "" if owner is None else owner.decode("utf-8")
                indexes: tuple[str, ...] = (self._listing, self._expiring)
                if owner is not None:
                    indexes += (self._owner_index(named),)
                answer = await client.eval(
                    _ERASE, 7 + len(indexes), *keys, *indexes, mark, member, named
                )
                if _text(answer[0]) == "erased":
                    return answer
                owner = answer[1] or None
            raise StoreError(f"Redis {what}: its owner kept changing")

        answer = await self._call(erase, what)
        _, seconds, micros, owner, flat = answer
        if cluster:
            await self._unindex(cid, _text(owner) or None)
        records = [
            (index, _text(flat[2 * index]), int(flat[2 * index + 1]))
            for index in range(len(flat) // 2)
        ]
        return records, int(seconds) + int(micros) / 1e6

    async def _unindex(self, cid: ConversationID, owner: str | None) -> None:
        """Cluster: remove an erased id from the indexes in the listing's slot."""
        keys = [self._listing, self._expiring, self._cleared]
        if owner is not None:
            keys.append(self._owner_index(owner))
        client = self._client
        member = cid.encode("utf-8")
        await self._call(
            lambda: client.eval(_UNINDEX, len(keys), *keys, member),
            f"erasure of conversation {str(cid)!r}",
        )

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[Any]:
        """``RecordStore.erase_owned``; on a Cluster an id whose erasure was cut short
        between its two steps (the conversation's script ran, its index entries were
        not removed yet) is only unindexed: it was erased, so it gets no second
        receipt."""
        if not self.cluster:
            return await super().erase_owned(owner, limit=limit)
        from scope.history._erasure import check_erase_limit, check_owner

        who = check_owner(owner)
        count = check_erase_limit(limit)
        client = self._client
        receipts = []
        for cid in await self._owned(who, count):
            _, tombs, mark = self._erasure_keys(cid)
            check = functools.partial(client.sismember, tombs, mark)
            erased = await self._call(check, "erasure check")
            if erased:
                await self._unindex(cid, who)
                continue
            receipts.append(await self.erase(cid))
        return receipts

    async def _owned(self, owner: str, limit: int) -> list[ConversationID]:
        client = self._client
        index = self._owner_index(owner)
        found = await self._call(
            lambda: client.zrange(index, b"-", b"+", bylex=True, offset=0, num=limit),
            "listing by owner",
        )
        owned: list[ConversationID] = []
        for raw in found:
            try:
                owned.append(stored_id(bytes(raw)))
            except ValueError:
                continue
        return owned

    async def _erasure_problems(self, mark: str) -> list[str]:
        # SCAN every key under the prefix: the tombstone sets, the conversations' keys
        # (the id is the hex in their hash tag) and the indexes' members.
        client = self._client
        secret = self._secret
        prefix = self.prefix.encode("utf-8")
        found: list[str] = []
        places: set[str] = set()
        stored = False

        def held(raw: bytes, where: str) -> None:
            try:
                cid = raw.decode("utf-8")
            except UnicodeDecodeError:
                return
            if tombstone(secret, cid) == mark:
                places.add(where)

        async def scan() -> None:
            nonlocal stored
            async for key in client.scan_iter(match=f"{self.prefix}:*", count=1000):
                key = bytes(key)
                await self._scan_key(key, prefix, mark, held)
                if key.endswith(b":tombstones") and await client.sismember(key, mark):
                    stored = True
            async for key in client.scan_iter(match=f"{{{self.prefix}:*", count=1000):
                await self._scan_key(bytes(key), prefix, mark, held)

        await self._call(scan, "check of an erasure")
        if not stored:
            found.append(f"no tombstone {mark} in this store")
        found += [f"a conversation id hashing to the tombstone is in {p}" for p in sorted(places)]
        return found

    async def _scan_key(self, key: bytes, prefix: bytes, mark: str, held: Any) -> None:
        """The ids one key holds: in its name (a conversation's key) or as members (an
        index)."""
        client = self._client
        tag_start = key.find(b"{")
        if key.startswith(prefix + b":{") and key.endswith(
            (b":closed", b":ids", b":batches", b":length", b":lease", b":meta")
        ):
            tag = key[tag_start + 1 : key.find(b"}", tag_start)]
            with contextlib.suppress(ValueError):
                held(bytes.fromhex(tag.decode("ascii")), f"key {key.decode('utf-8', 'replace')}")
            return
        kind = _text(await client.type(key))
        where = f"index {key.decode('utf-8', 'replace')}"
        if kind == "zset":
            async for member, _ in client.zscan_iter(key, count=1000):
                held(bytes(member), where)
        elif kind == "set" and not key.endswith(b":tombstones"):
            async for member in client.sscan_iter(key, count=1000):
                held(bytes(member), where)


def _text(value: Any) -> str:
    """A script's answer as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def _exists_each(client: Any, keys: list[str]) -> list[Any]:
    """``EXISTS`` of each key, pipelined (one round trip per node)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.exists(key)
    return list(await pipe.execute())


def _fields(item: Any) -> tuple[Any, Any, Any, str]:
    """``(append_id, digest, messages, malformed)`` of one stored list element;
    ``malformed`` says why the element is not ``digest\\nappend id\\nmessages`` (then
    the other fields are None), else it is ``""``."""
    if not isinstance(item, bytes):
        return None, None, None, f"record is {type(item).__name__}, not bytes"
    parts = item.split(b"\n", 2)
    if len(parts) != 3:
        return None, None, None, "record is not 'digest\\nappend id\\nmessages'"
    digest, aid, data = parts
    try:
        return aid.decode("utf-8"), digest.decode("ascii"), data, ""
    except UnicodeDecodeError as exc:
        return None, None, None, f"record header is not text: {exc}"


def _split(cid: str, item: Any) -> tuple[Any, Any, Any]:
    """``(append_id, digest, messages)`` of one stored list element (``StoreError``
    naming the conversation when it is malformed)."""
    aid, digest, data, malformed = _fields(item)
    if malformed:
        raise corrupt(cid, None, malformed)
    return aid, digest, data
