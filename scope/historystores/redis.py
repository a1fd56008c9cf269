"""``RedisStore``: a history store in Redis, on redis-py's asyncio client (``scope-chat[redis]``).

redis-py is imported when a store is opened, not when this module is imported. The
client is asyncio-only, so this store runs under asyncio (not trio; use ``SQLiteStore``).

Keys (``{P}`` is ``prefix``, default ``scope:history``; ``{H}`` is the hex of the
conversation id's UTF-8 bytes, so any id is safe inside the ``{...}`` hash tag):

    {P}:{{H}}:batches   LIST    every batch of every branch, in stored order: digest, "\\n",
                                append id, "\\n", messages
    {P}:{{H}}:ids       HASH    append id -> digest (the dedupe record, across branches)
    {P}:{{H}}:tree      HASH    "head" -> the head batch's position in batches (-1: before
                                the first); "<position>" -> "<parent> <run start> <path
                                length> <created> <append id>" (see below)
    {P}:{{H}}:nodes     HASH    append id -> its position (move_head's target lookup)
    {P}:{{H}}:moves     HASH    move id -> the append id it moved the head to ("": none)
    {P}:{{H}}:closed    STRING  closure evidence; never expires
    {P}:{{H}}:length    STRING  the head path's message count (the fence's count)
    {P}:{{H}}:lease     STRING  the turn lease's holder token, expiring (PX) by the server
    {P}:conversations   ZSET    the open conversations holding a batch, score 0 (lexical order)
    {{P}:conversations}:cleared  SET  Cluster only: every id a clear started on, in the
                                listing's hash slot (the listing checks only these ids' closure)

Branches (DESIGN §6h). A batch's tree record holds its parent's position (-1: it starts
the conversation), the first position of the run of consecutive positions its path ends
with (0 when its path is positions 0 .. itself, as on every linear history), the
messages from the root through it, when it was stored (``TIME`` inside the script, the
server's clock, ``"<s>.<us>"``; ``-`` for batches adopted from before branches) and its
append id. An append reads the head's record and writes the new one: a constant number
of commands on a linear history and on a branch. A head-path read whose head's run starts
at 0 is one ``LRANGE`` (what it was before branches); another path is one ``LRANGE`` per
run, found from the head back, so batches off the path are never fetched. ``move_head``
sets the head and the length from the target's record, reading no message.

Conversations stored before branches have no tree: read as one branch (the head their
last batch), adopted in place as one branch (each batch the parent of the next, path
lengths counted once with ``cjson``) by their first append or head move, inside that
script (lazily: ``scope history migrate`` has nothing to do for Redis). A conversation
written by scope 0.1 has no ``length`` key either; the same adoption records it.

One conversation's keys share a hash slot, so its scripts also run on Redis Cluster.
Every step on a conversation (append, clear, each read, ``read_tree``, ``move_head``,
the lease steps) is one Lua script, atomic in Redis, run by its SHA1 (``EVALSHA``; loaded
on ``NOSCRIPT``). The listing sorted set is
maintained beside them, before the append script and after the clear script, and
``conversations()`` drops closed and empty ids from it, so the listing never shows a
closed id and shows every acknowledged one (an id stored outside scope that is not a
valid conversation id is skipped and logged, never deleted). Redis' own durability
applies: configure AOF (``appendonly yes``, ``appendfsync everysec`` or ``always``) for a
store that must survive a server restart; ``RedisStore.open`` checks it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, final

from scope._validate import check_seconds, check_type
from scope.errors import (
    AppendConflictError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidViewError,
    ScopeWarning,
    StoreError,
    UnknownHeadError,
)
from scope.history import (
    AppendID,
    Batch,
    ConversationID,
    HistoryCache,
    HistoryTree,
    HistoryView,
)
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
    decode_batches,
    decode_records,
    shown_id,
    stored_id,
    view_of,
)
from scope.historystores._scan import UnreadableRecords
from scope.historystores._store import (
    RecordStore,
    closed_error,
)

__all__ = ["RedisStore"]

T = TypeVar("T")

_PREFIX: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,100}\Z")

# KEYS: tree, batches (the helpers below take key names as arguments, so each script
# passes its own). A tree record (the ``tree`` hash, field = the batch's 0-based position
# in ``batches``) is "<parent> <run start> <path length> <created> <append id>": the
# parent's position (-1: none), the first position of the run of consecutive positions
# that ends the path to this batch (0: the path is positions 0 .. this one, as on a linear
# history), the messages from the root through it, its server time ("<s>.<us>" from
# TIME; "-" when adopted from a version before branches) and its append id (last: it may
# hold spaces). The field "head" holds the head's position (-1: before the first batch).
_TREE_LUA: Final = """
local function meta_of(tree, index)
  local meta = redis.call('HGET', tree, index)
  local parent, start, length, created, aid
  if meta then
    parent, start, length, created, aid = string.match(meta, '^(%-?%d+) (%d+) (%d+) (%S+) (.*)$')
  end
  if not parent then
    error('scope: the tree record of batch #' .. tostring(index + 1) .. ' is missing or corrupt')
  end
  return tonumber(parent), tonumber(start), length, aid
end
local function head_of(tree)
  local raw = redis.call('HGET', tree, 'head')
  if not raw or raw == '-1' then return -1, 0, '0', '' end
  local index = tonumber(raw)
  if not index then error('scope: the head record is corrupt: ' .. raw) end
  local _, start, length, aid = meta_of(tree, index)
  return index, start, length, aid
end
"""

# KEYS: batches, length, tree, nodes. A conversation stored before branches (batches and
# no head record) becomes one branch in place: each batch the parent of the next, the
# head its last, each path length counted once (cjson); the head record is written last,
# so an interrupted adoption is redone whole. Answers nil, or 'corrupt:<position>' for a
# record it cannot count (then nothing is written).
_ADOPT_LUA: Final = """
local function adopt(batches, length, tree, nodes)
  if redis.call('HEXISTS', tree, 'head') == 1 then return nil end
  local records = redis.call('LRANGE', batches, 0, -1)
  if #records == 0 then return nil end
  local metas, aids, n = {}, {}, 0
  for i, record in ipairs(records) do
    local first = string.find(record, '\\n', 1, true)
    local second = first and string.find(record, '\\n', first + 1, true)
    if not second then return 'corrupt:' .. (i - 1) end
    local ok, messages = pcall(cjson.decode, string.sub(record, second + 1))
    if not ok or type(messages) ~= 'table' then return 'corrupt:' .. (i - 1) end
    n = n + #messages
    aids[i] = string.sub(record, first + 1, second - 1)
    metas[i] = string.format('%d 0 %d - ', i - 2, n) .. aids[i]
  end
  for i = 1, #records do
    redis.call('HSET', tree, i - 1, metas[i])
    redis.call('HSET', nodes, aids[i], i - 1)
  end
  redis.call('SET', length, string.format('%d', n))
  redis.call('HSET', tree, 'head', #records - 1)
  return nil
end
"""

# The head path's records and the head's append id. Without a head record (stored before
# branches, or nothing stored) the history is linear: every record, the head its last. A
# head whose run starts at 0 (every linear history): one LRANGE. Otherwise one LRANGE per
# run of consecutive positions on the path, found from the head back, two HGETs a run.
_PATH_LUA: Final = f"""
{_TREE_LUA}
local function head_path(tree, batches)
  local raw = redis.call('HGET', tree, 'head')
  if not raw then
    local records = redis.call('LRANGE', batches, 0, -1)
    local last, aid = records[#records], ''
    if last then
      local first = string.find(last, '\\n', 1, true)
      local second = first and string.find(last, '\\n', first + 1, true)
      if second then aid = string.sub(last, first + 1, second - 1) end
    end
    return aid, records
  end
  local index, start, _, aid = head_of(tree)
  if index < 0 then return '', {{}} end
  if start == 0 then return aid, redis.call('LRANGE', batches, 0, index) end
  local runs = {{}}
  while true do
    runs[#runs + 1] = {{start, index}}
    if start == 0 then break end
    local parent = meta_of(tree, start)
    if parent < 0 then break end
    index = parent
    _, start = meta_of(tree, index)
  end
  local records = {{}}
  for r = #runs, 1, -1 do
    for _, record in ipairs(redis.call('LRANGE', batches, runs[r][1], runs[r][2])) do
      records[#records + 1] = record
    end
  end
  return aid, records
end
"""

# KEYS: closed, ids, batches, length, tree, nodes[, listing]. ARGV: append id, digest,
# record, message count, expected length ('' for no fence), '1' when fenced by head,
# expected head[, listing member]. Checks first (closed, dedupe record, fence: DESIGN
# §6b's order), then the one-time adoption of a pre-branch conversation (it changes no
# answer), then the writes, so an error (or an out-of-memory refusal of the first write)
# leaves no batch behind. The new batch's parent is the head, and it becomes the head: a
# constant number of commands, linear history or branch. Lengths are compared as decimal
# strings (no float). With a seventh key (one Redis, not Cluster: the listing is in
# another hash slot there) an inserted batch lists its conversation in the same step.
_APPEND: Final = f"""
{_TREE_LUA}
{_ADOPT_LUA}
if redis.call('EXISTS', KEYS[1]) == 1 then return 'closed' end
local accepted = redis.call('HGET', KEYS[2], ARGV[1])
if accepted then return 'accepted:' .. accepted end
local problem = adopt(KEYS[3], KEYS[4], KEYS[5], KEYS[6])
if problem then return problem end
local head, start, length, aid = head_of(KEYS[5])
if (ARGV[5] ~= '' and ARGV[5] ~= length) or (ARGV[6] == '1' and ARGV[7] ~= aid) then
  return 'changed:' .. length .. ':' .. aid
end
local now = redis.call('TIME')
local index = redis.call('RPUSH', KEYS[3], ARGV[3]) - 1
if head ~= index - 1 then start = index end
local total = string.format('%d', tonumber(length) + tonumber(ARGV[4]))
local created = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
redis.call('HSET', KEYS[5], index,
           string.format('%d %d ', head, start) .. total .. ' ' .. created .. ' ' .. ARGV[1],
           'head', index)
redis.call('HSET', KEYS[6], ARGV[1], index)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SET', KEYS[4], total)
if KEYS[7] then redis.call('ZADD', KEYS[7], 0, ARGV[8]) end
return 'inserted'
"""

# KEYS: closed, ids, batches, tree, nodes, moves[, listing]. ARGV: [listing member]. Every
# branch goes (batches, dedupe records, tree, move records). The length key stays: a
# closed conversation's last length. With the listing key the id leaves the listing in
# the same atomic step.
_CLEAR: Final = """
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
if KEYS[7] then redis.call('ZREM', KEYS[7], ARGV[1]) end
return 'cleared'
"""

# KEYS: tree, batches. read and read_batches: {head's append id, head path's records}.
_READ: Final = f"""
{_PATH_LUA}
local aid, records = head_path(KEYS[1], KEYS[2])
return {{aid, records}}
"""

# KEYS: closed, length, tree, batches. One atomic read for read_view (a script, not
# MULTI, so it runs the same on Redis Cluster): closed flag, length ('' when absent), the
# head's append id, the head path's records.
_VIEW: Final = f"""
{_PATH_LUA}
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {{1, redis.call('GET', KEYS[2]) or '', '', {{}}}}
end
local aid, records = head_path(KEYS[3], KEYS[4])
return {{0, redis.call('GET', KEYS[2]) or '', aid, records}}
"""

# KEYS: closed, batches, length, tree, nodes, moves. ARGV: target append id ('' before the
# first batch), expected head, move id ('' for none). move_head in its order: closed,
# move id (the same target: 'moved:<its path length>', another: 'conflict:<target>'),
# fence ('changed:<length>:<head>'), unknown target ('unknown'), move ('moved:<length>').
# The new head's path length is its tree record's: no message is read.
_MOVE: Final = f"""
{_TREE_LUA}
{_ADOPT_LUA}
if redis.call('EXISTS', KEYS[1]) == 1 then return 'closed' end
local problem = adopt(KEYS[2], KEYS[3], KEYS[4], KEYS[5])
if problem then return problem end
local function length_at(target)
  if target == '' then return -1, '0' end
  local index = redis.call('HGET', KEYS[5], target)
  if not index then return nil, nil end
  local _, _, length = meta_of(KEYS[4], tonumber(index))
  return tonumber(index), length
end
if ARGV[3] ~= '' then
  local recorded = redis.call('HGET', KEYS[6], ARGV[3])
  if recorded then
    if recorded ~= ARGV[1] then return 'conflict:' .. recorded end
    local _, length = length_at(recorded)
    return 'moved:' .. length
  end
end
local head, _, length, aid = head_of(KEYS[4])
if ARGV[2] ~= aid then return 'changed:' .. length .. ':' .. aid end
local index, target_length = length_at(ARGV[1])
if not index then return 'unknown' end
-- A conversation holding no batch, moved to '': nothing moves, nothing is recorded.
if index < 0 and redis.call('EXISTS', KEYS[2]) == 0 then return 'moved:0' end
if index ~= head then
  redis.call('HSET', KEYS[4], 'head', index)
  redis.call('SET', KEYS[3], target_length)
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[6], ARGV[3], ARGV[1]) end
return 'moved:' .. target_length
"""

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
# KEYS: lease, closed, length, tree, batches. ARGV: holder, ttl in ms. 0 when another
# holder's live lease has it, else read_view's answer, in the same atomic step.
_ACQUIRE_VIEW: Final = f"""
local function acquire(KEYS, ARGV)
{_ACQUIRE}
end
local function view(KEYS, ARGV)
{_VIEW}
end
if acquire({{KEYS[1]}}, {{ARGV[1], ARGV[2]}}) == 0 then return 0 end
return view({{KEYS[2], KEYS[3], KEYS[4], KEYS[5]}}, {{}})
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
local outcome = append({{KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]}},
                       {{ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]}})
if outcome == 'inserted' or outcome == 'accepted:' .. ARGV[3] then
  release({{KEYS[1]}}, {{ARGV[1]}})
end
return outcome
"""

#: How many listed ids one ``conversations()`` round trip fetches.
_PAGE: Final = 1000

#: The listing layout this version keeps: the key ``{prefix}:schema`` holds it. 2: the
#: listing holds exactly the open conversations that hold a batch (scope 0.1 also
#: listed closed and never-written ids and filtered them on every listing). 3: on a
#: Cluster every id a clear started on is in the cleared set beside the listing (see
#: ``RedisStore._list``); the upgrade checks every listed id once more.
_LISTING_VERSION: Final = b"3"

# Cluster listing page. KEYS: listing, cleared set (one slot). ARGV: start (ZRANGEBYLEX
# syntax), page size. Returns {members, flagged}: the page, and the 0-based indices of
# its ids a clear started on (then their closure is checked across slots).
_LIST_PAGE: Final = """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, ARGV[2])
local flagged = {}
for index, member in ipairs(members) do
  if redis.call('SISMEMBER', KEYS[2], member) == 1 then flagged[#flagged + 1] = index - 1 end
end
return {members, flagged}
"""


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

    - **Atomicity.** ``append`` is one Lua script: closed check, dedupe record (across
      every branch), fence (length and head) and push of the batch (one list element,
      its tree record naming the head as its parent, the head moved to it) run as a
      unit; ``move_head`` is one script (closed, move id, fence, target, move);
      ``read``, ``read_batches``, ``read_view`` and ``read_tree`` are one script each;
      ``clear`` is one script that records the closure and deletes every branch (batches,
      dedupe records, tree and move records). Both are linearizable across
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
        "_listed",
        "_listing",
        "_listing_checked",
        "_outcome_source",
        "_socket_timeout",
        "cluster",
        "prefix",
    )

    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis, or RedisCluster with cluster=True
        prefix: str,
        cache: HistoryCache,
        socket_timeout: float | None = None,
        cluster: bool = False,
    ) -> None:
        """Internal: use ``await RedisStore.open(url)``."""
        self._client: Any = client
        self._socket_timeout = socket_timeout
        self._cache = cache
        self._closed = False
        self._driver = _driver()
        self._listing = f"{prefix}:conversations"
        # Cluster: the ids a clear started on, in the listing's hash slot (the hash tag
        # is the listing's whole name, which is what the listing key hashes by).
        self._cleared = f"{{{self._listing}}}:cleared"
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

        A bad prefix, URL, cache size or option combination raises ``ValueError``
        before any I/O; an unreachable server raises ``StoreError``. Needs asyncio.
        """
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
        store = cls(client, prefix, cache, socket_timeout, cluster)
        try:
            await store._call(lambda: client.ping(), "connect")
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
                closed, _, batches, *_ = self._keys(cid)
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

    def _keys(self, cid: str) -> tuple[str, str, str, str, str, str, str]:
        """closed, ids, batches, length, tree, nodes, moves: one hash slot."""
        tag = cid.encode("utf-8").hex()
        base = f"{self.prefix}:{{{tag}}}"
        return (
            f"{base}:closed",
            f"{base}:ids",
            f"{base}:batches",
            f"{base}:length",
            f"{base}:tree",
            f"{base}:nodes",
            f"{base}:moves",
        )

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
        """The head path's messages, its length, the head and the closure from one script
        (a consistent snapshot, on Redis Cluster too). A corrupt stored record raises
        ``StoreError``."""
        cid = ConversationID(conversation_id)
        closed_key, _, batches_key, length_key, tree_key, *_ = self._keys(cid)
        client = self._client

        async def read() -> list[Any]:
            return list(await _run(client, _VIEW, 4, closed_key, length_key, tree_key, batches_key))

        answer = await self._call(read, f"read of conversation {str(cid)!r}")
        return self._view(cid, answer)

    def _view(self, cid: ConversationID, answer: list[Any]) -> HistoryView:
        """The ``HistoryView`` of the view script's answer (closed flag, length or '',
        head, the head path's records)."""
        closed, raw_length, raw_head, items = answer
        records = [_split(cid, item) for item in items]
        head = _text(cid, raw_head, "head")
        if not raw_length:
            if closed:
                return view_of(cid, True, 0, (), self._cache)
            # Written by scope 0.1 (no length key yet): the stored messages are the count.
            messages = tuple(decode_records(cid, records, self._cache))
            return HistoryView(messages, len(messages), head=head)
        try:
            length = int(raw_length)
        except ValueError:
            raise StoreError(
                f"conversation {str(cid)!r} is corrupt: its length is {raw_length!r}"
            ) from None
        view = view_of(cid, bool(closed), length, records, self._cache)
        return view if view.closed else HistoryView(view.messages, view.length, head=head)

    async def _read(self, cid: ConversationID, decode: Decoder[T]) -> T:
        keys = self._keys(cid)
        client = self._client

        async def read() -> list[Any]:
            return list(await _run(client, _READ, 2, keys[4], keys[2]))

        _, items = await self._call(read, f"read of conversation {str(cid)!r}")
        return decode(cid, (_split(cid, item) for item in items), self._cache)

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        """Every batch of every branch in stored order, each one's parent and stored time
        (the server's clock; None for batches stored before branches), the head and the
        closure, from one snapshot (see ``scope.history.HistoryTree``). A corrupt stored
        record raises ``StoreError`` naming the conversation.

        Plain reads, no script, so a user limited to ``+@read`` reads trees too
        (``scope history verify``): one pipelined round trip of ``LLEN`` of the
        records, ``HGETALL`` of the tree and ``LRANGE`` of the records, in that order.
        Records are only ever appended, and a record and its tree entry are written by
        one script, so the tree read names a prefix of the records read after it: the
        snapshot is the tree's moment (a conversation stored before branches: the
        ``LLEN``'s). A clear between the reads leaves fewer records than the tree names,
        and the read is made again (it then finds the conversation closed)."""
        cid = ConversationID(conversation_id)
        closed_key, _, batches_key, _, tree_key, *_ = self._keys(cid)
        client = self._client

        async def read() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.exists(closed_key)
            pipe.llen(batches_key)
            pipe.hgetall(tree_key)
            pipe.lrange(batches_key, 0, -1)
            return list(await pipe.execute())

        for _ in range(3):
            closed, count, fields, items = await self._call(
                read, f"tree read of conversation {str(cid)!r}"
            )
            if closed:
                self._cache.forget(cid)  # cleared, maybe through another handle
                return HistoryTree((), (), (), -1, True)
            raw_head = fields.get(b"head")
            if raw_head is not None:  # the tree's own count: every position it names
                count = sum(1 for key in fields if key.isdigit())
            if len(items) < count:
                continue  # cleared between the reads: read again
            return self._tree(cid, items[:count], fields, raw_head)
        raise StoreError(
            f"conversation {str(cid)!r} changed under three tree reads in a row; read again"
        )

    def _tree(
        self, cid: ConversationID, items: list[Any], fields: dict[bytes, Any], raw_head: Any
    ) -> HistoryTree:
        batches = decode_batches(cid, (_split(cid, item) for item in items), self._cache)
        count = len(batches)
        if raw_head is None:  # stored before branches: one branch, its last batch the head
            return HistoryTree(batches, range(-1, count - 1), (None,) * count, count - 1)
        parents: list[int] = []
        created: list[float | None] = []
        for index, stored in enumerate(batches):
            parent, _, _, when, aid = _meta(cid, index, fields.get(str(index).encode()))
            if aid != stored.id:
                raise _corrupt_tree(cid, f"batch #{index + 1}'s tree record names {aid!r}")
            parents.append(parent)
            created.append(when)
        head = _number(cid, raw_head, "the head record")
        try:
            return HistoryTree(batches, parents, created, head)
        except InvalidViewError as exc:
            raise _corrupt_tree(cid, str(exc)) from None

    async def move_head(
        self,
        conversation_id: str,
        head: str,
        *,
        expected_head: str,
        move_id: str | None = None,
    ) -> int:
        """Make ``head`` (an append id of this conversation, on any branch; ``""``: before
        the first batch) the head in one script, and return the new head path's length
        (its tree record's: no message is read). In the script, in this order: closed
        (``ConversationClosedError``), a recorded ``move_id`` (the same target: its
        length, nothing moved; another: ``AppendConflictError``), the fence
        (``HistoryChangedError`` with both heads), an unknown ``head``
        (``UnknownHeadError``), the move (and the ``move_id`` recorded in the
        conversation's own move records, apart from append ids). Nothing changes when it
        raises. Invalid arguments raise ``InvalidConversationIDError`` /
        ``InvalidAppendIDError`` before any I/O."""
        cid = ConversationID(conversation_id)
        target = _head_id(head, "head")
        expected = _head_id(expected_head, "expected_head")
        mid = "" if move_id is None else _move_id(move_id)
        closed_key, _, batches_key, length_key, tree_key, nodes_key, moves_key = self._keys(cid)
        keys = (closed_key, batches_key, length_key, tree_key, nodes_key, moves_key)
        client = self._client

        async def move() -> Any:
            return await _run(client, _MOVE, 6, *keys, target, expected, mid)

        answer = await self._call(move, f"head move of conversation {str(cid)!r}")
        _check_adopted(cid, answer)
        outcome = _text(cid, answer, "head move outcome")
        kind, _, rest = outcome.partition(":")
        if kind == "moved" and rest.isdigit():
            return int(rest)
        if outcome == "closed":
            raise closed_error(cid)
        if kind == "conflict":
            raise AppendConflictError(
                f"move id {str(mid)!r} of conversation {str(cid)!r} was recorded moving the "
                f"head to {rest!r}, this move names {str(target)!r}"
            )
        if kind == "changed":
            length, _, actual = rest.partition(":")
            if length.isdigit():
                raise HistoryChangedError(
                    int(length),
                    int(length),
                    cid,
                    expected_head=expected,
                    actual_head=actual,
                )
        if outcome == "unknown":
            raise UnknownHeadError(
                f"conversation {str(cid)!r} holds no batch {str(target)!r} to move its head to"
            )
        raise StoreError(f"Redis head move script returned {outcome!r}")

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

    async def _write(self, batch: Batch, holder: str | None) -> Any:
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
        fenced, expected_head = (
            (b"0", b"") if batch.expected_head is None else (b"1", batch.expected_head.encode())
        )
        cluster = self.cluster
        # With a holder: the folded script, the lease key first and the holder first.
        script, lease, token = (
            (_APPEND, (), ())
            if holder is None
            else (_APPEND_RELEASE, (self._lease_key(cid),), (holder,))
        )
        n = len(lease)

        arguments = (*token, aid, digest, record, count, expected, fenced, expected_head)

        async def append() -> Any:
            if not cluster:  # one script: the listing changes in the same atomic step
                return await _run(
                    client, script, n + 7, *lease, *keys[:6], listing, *arguments, member
                )
            return await _run(client, script, n + 6, *lease, *keys[:6], *arguments)

        outcome = await self._call(append, f"append to conversation {str(cid)!r}")
        _check_adopted(cid, outcome)
        return outcome

    async def _after_append(self, batch: Batch) -> None:
        if not self.cluster:
            return
        # The listing is in another hash slot: listed after the batch landed (and again
        # on a retry), before the receipt, so every acknowledged id is listed.
        cid = batch.conversation_id
        client = self._client
        member = cid.encode("utf-8")
        await self._call(
            lambda: client.zadd(self._listing, {member: 0}), f"listing of {str(cid)!r}"
        )

    async def _clear(self, cid: ConversationID) -> None:
        keys = self._keys(cid)
        client = self._client
        listing = self._listing
        member = cid.encode("utf-8")
        cluster = self.cluster

        async def clear() -> None:
            if not cluster:
                await _run(client, _CLEAR, 7, *keys[:3], *keys[4:], listing, member)
                return
            # Another slot: first marked in the listing's slot, so a listing checks this
            # id's closure until it left the listing (see _list), then closed, then
            # unlisted.
            await client.sadd(self._cleared, member)
            await _run(client, _CLEAR, 6, *keys[:3], *keys[4:])
            await client.zrem(listing, member)

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
            return await _run(client, _ACQUIRE, 1, key, holder, millis)

        return bool(await self._call(acquire, f"lease of conversation {str(cid)!r}"))

    async def _release(self, cid: ConversationID, holder: str) -> bool:
        key = self._lease_key(cid)
        client = self._client

        async def release() -> Any:
            return await _run(client, _RELEASE, 1, key, holder)

        return bool(await self._call(release, f"lease release of conversation {str(cid)!r}"))

    async def _acquire_view(
        self, cid: ConversationID, holder: str, ttl: float
    ) -> HistoryView | None:
        # One script (append_release_turn: one script too; on a Cluster the listing is
        # updated after it, as for append).
        closed_key, _, batches_key, length_key, tree_key, *_ = self._keys(cid)
        keys = (self._lease_key(cid), closed_key, length_key, tree_key, batches_key)
        millis = max(1, math.ceil(ttl * 1000))
        client = self._client

        async def acquire_view() -> Any:
            return await _run(client, _ACQUIRE_VIEW, 5, *keys, holder, millis)

        answer = await self._call(acquire_view, f"lease and read of conversation {str(cid)!r}")
        if answer == 0:
            return None
        return self._view(cid, list(answer))

    async def _list(self, after: ConversationID | None, limit: int | None) -> list[Any]:
        """One round trip per 1,000 listed ids (``limit`` or all), in code point order
        (the sorted set orders members by their UTF-8 bytes).

        On one Redis the listing holds exactly the open conversations that hold a batch
        (the append and clear scripts keep it). On a Cluster it is kept beside the
        scripts (another hash slot): a clear first adds the id to a cleared set in the
        listing's slot, then closes the conversation, then unlists it; an append lists
        its id after its script. So a listed id can only be closed when it is in the
        cleared set (a clear that died before unlisting it, or an append's listing that
        came after a clear): each page comes with those flags from one script, and only
        the flagged ids' closure is checked (normally none); a closed one is unlisted."""
        if not self._listing_checked:
            await self._upgrade_listing()
        out: list[bytes] = []
        cursor = None if after is None else after.encode("utf-8")
        while limit is None or len(out) < limit:
            want = _PAGE if limit is None else min(_PAGE, limit - len(out))
            if self.cluster:
                page, listed = await self._cluster_page(cursor, want)
            else:
                page = listed = await self._listing_page(cursor, "listing of conversations", want)
            if not page:
                break
            cursor = page[-1]
            out += listed
            if len(page) < want:
                break
        return out

    async def _cluster_page(
        self, after: bytes | None, size: int
    ) -> tuple[list[bytes], list[bytes]]:
        """One Cluster listing page (``_LIST_PAGE``): the ids fetched, and those of them
        not found closed (the closed ones are unlisted)."""
        client = self._client
        start = b"-" if after is None else b"(" + after
        keys = (self._listing, self._cleared)
        members, flagged = await self._call(
            lambda: _run(client, _LIST_PAGE, 2, *keys, start, size), "listing of conversations"
        )
        page = [bytes(member) for member in members]
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


#: Each script's SHA1 (hex), computed once: scripts run with ``EVALSHA``.
_SHAS: dict[str, str] = {}


async def _run(client: Any, script: str, numkeys: int, *args: Any) -> Any:
    """Run ``script`` by its SHA1 (``EVALSHA``: the request carries 40 bytes, not the
    script); a server that does not hold it yet (``NOSCRIPT``: a new or restarted
    server, ``SCRIPT FLUSH``) gets it with ``SCRIPT LOAD`` (every master of a Cluster)
    and runs it then. Either way the script runs once, as a whole."""
    import redis.exceptions

    sha = _SHAS.get(script)
    if sha is None:
        sha = _SHAS[script] = hashlib.sha1(script.encode("utf-8")).hexdigest()
    try:
        return await client.evalsha(sha, numkeys, *args)
    except redis.exceptions.NoScriptError:
        await client.script_load(script)
        return await client.evalsha(sha, numkeys, *args)


async def _exists_each(client: Any, keys: list[str]) -> list[Any]:
    """``EXISTS`` of each key, pipelined (one round trip per node)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.exists(key)
    return list(await pipe.execute())


def _text(cid: str, raw: Any, what: str) -> str:
    """A script's text answer (UTF-8 bytes) as ``str``."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    elif isinstance(raw, str):
        return raw
    raise StoreError(f"conversation {str(cid)!r} is corrupt: its {what} is {raw!r}")


def _corrupt_tree(cid: str, problem: str) -> StoreError:
    """The error of a tree record that is not what scope wrote."""
    return StoreError(f"conversation {str(cid)!r} is corrupt: its tree {problem}")


def _number(cid: str, raw: Any, what: str) -> int:
    """A decimal integer record (``-1`` allowed)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    if not re.fullmatch(r"-?[0-9]{1,18}", text):
        raise _corrupt_tree(cid, f"{what} is {raw!r}")
    return int(text)


#: A tree record: parent, run start, path length, created ("-": unknown), append id.
_META: Final = re.compile(rb"(-?[0-9]{1,18}) ([0-9]{1,18}) ([0-9]{1,18}) (\S+) (.+)", re.DOTALL)


def _meta(cid: str, index: int, raw: Any) -> tuple[int, int, int, float | None, str]:
    """``(parent, run start, path length, created, append id)`` of batch ``index``'s tree
    record (``StoreError`` when it is missing or malformed)."""
    found = _META.fullmatch(raw) if isinstance(raw, bytes) else None
    if found is None:
        raise _corrupt_tree(cid, f"record of batch #{index + 1} is {raw!r}")
    parent, start, length, when, aid = found.groups()
    created: float | None = None
    if when != b"-":
        try:
            created = float(when)
        except ValueError:
            raise _corrupt_tree(cid, f"record of batch #{index + 1} is {raw!r}") from None
    try:
        text = aid.decode("utf-8")
    except UnicodeDecodeError:
        raise _corrupt_tree(cid, f"record of batch #{index + 1} is {raw!r}") from None
    return int(parent), int(start), int(length), created, text


def _check_adopted(cid: str, outcome: Any) -> None:
    """Raise for the ``corrupt:<position>`` answer of a script that adopts a conversation
    stored before branches: a record it could not take apart or count."""
    text = outcome.decode("utf-8", "replace") if isinstance(outcome, bytes) else str(outcome)
    if text.startswith("corrupt:"):
        position = text.removeprefix("corrupt:")
        number = int(position) + 1 if position.isdigit() else position
        raise StoreError(
            f"conversation {str(cid)!r} is corrupt: stored batch #{number} is not "
            "'digest\\nappend id\\nmessages' with a JSON array of messages, so the "
            "conversation (stored before branches) cannot become one branch; nothing was "
            "written"
        )


def _head_id(value: object, what: str) -> str:
    """A head as ``move_head`` takes it: ``""`` (before the first batch) or an append id
    (``InvalidAppendIDError`` naming ``what`` otherwise)."""
    if value == "" and isinstance(value, str):
        return ""
    try:
        return AppendID(value)  # type: ignore[arg-type]
    except InvalidAppendIDError as exc:
        raise InvalidAppendIDError(f"{what} must be '' or an append id: {exc}") from None


def _move_id(value: object) -> str:
    """A move id: an append id's rules (``InvalidAppendIDError`` otherwise)."""
    try:
        return AppendID(value)  # type: ignore[arg-type]
    except InvalidAppendIDError as exc:
        raise InvalidAppendIDError(f"move_id must be None or an id: {exc}") from None


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
