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
    {P}:{{H}}:meta      HASH    owner (the first append's), exp (Unix ms), retained ("1")
    {P}:{{T}}:tombstones SET    the erased ids' tombstones of one hash slot (``T``: a
                                short tag in the conversation's slot, naming no id)
    {P}:{{imported}}:tombstones  SET  the tombstones ``restore_erasures`` added (its hash
                                tag is the word ``imported``; see below)
    {P}:secret          STRING  the store secret (the tombstones' HMAC key), SET NX at open
    {{P}:conversations}:expiring   ZSET  id -> expiry (Unix ms): expire() and listings
    {{P}:conversations}:owner:{O}  ZSET  an owner's conversations (``O``: hex of the owner)

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

Retention and erasure (DESIGN §6i). A conversation with an expiry (``meta``'s ``exp``:
the store's ``retention`` after its last append, or ``retain``'s) is closed from that
moment by the server's clock in every script; its data keys (``batches``, ``ids``,
``length``, ``tree``, ``nodes``, ``moves``) carry the same ``PEXPIREAT``, so Redis drops
them itself, and ``expire()`` closes it and cleans what native expiry cannot (the
indexes). ``erase`` deletes every key of the conversation, every branch's included, and
adds its tombstone to its slot's tombstone set in one script; a tombstoned id is closed
for ever.

Restore (DESIGN §6n: ``scope.history.Restorer``, what ``scope history export`` and
``import`` use). There is no index of closed ids or of tombstones, so the listings scan:
``closed_conversations`` ``SCAN``s the whole keyspace (every primary of a Cluster) for the
``:closed`` keys, adds the expiry index's due ids and reads each candidate's closure,
owner and length with one script in its slot; ``tombstones`` ``SCAN``s for the tombstone
sets and reads them whole. Each call costs O(keys in the database) (and O(tombstones)):
tools' work, not a request path. ``restore_closed`` is one script in the conversation's
slot that refuses (nothing written) or writes the closed key, the owner and the length
as ``clear``/``expire()`` leave them; the owner's index (which ``erase_owned`` reads) is
in the same script on one Redis, written after it on a Cluster, on a re-run too.
``restore_erasures`` runs ordered, idempotent steps (a Cluster cannot change several
slots atomically; run again, they finish the job): with another secret, a keyspace
``SCAN`` proves the store holds no conversation, tombstone or index, then the secret is
swapped (compare and set); then the new tombstones go to ``{P}:{{imported}}:tombstones``
in one ``SADD``. A tombstone does not name its id, so not the slot the id's scripts read:
a handle opened on a store that holds imported tombstones (``EXISTS`` at open) checks the
imported set before each step on a conversation and copies a tombstone found there into
the id's slot set (one more round trip the first time a handle meets an id, on such
stores only: the answer is kept, as the imported set never changes once steps run).

One conversation's keys share a hash slot, so its scripts also run on Redis Cluster.
Every step on a conversation (append, clear, each read, ``move_head``, the lease steps,
``retain``, ``erase`` and each conversation ``expire`` removes) is one Lua script, atomic
in Redis, run by its SHA1 (``EVALSHA``; loaded on ``NOSCRIPT``); ``read_tree`` is plain
reads in one pipelined round trip (see ``RedisStore.read_tree``). The listing sorted set is
maintained beside them, before the append script and after the clear script, and
``conversations()`` drops closed and empty ids from it, so the listing never shows a
closed id and shows every acknowledged one (an id stored outside scope that is not a
valid conversation id is skipped and logged, never deleted). Redis' own durability
applies: configure AOF (``appendonly yes``, ``appendfsync everysec`` or ``always``) for a
store that must survive a server restart; ``RedisStore.open`` checks it.
"""

from __future__ import annotations

import binascii
import collections
import contextlib
import datetime as _dt
import functools
import hashlib
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, final

from scope._validate import check_seconds, check_type
from scope.errors import (
    AppendConflictError,
    HistoryChangedError,
    InvalidViewError,
    RestoreConflictError,
    ScopeWarning,
    StoreError,
    UnknownHeadError,
)
from scope.history import (
    Batch,
    ClosedConversation,
    ConversationID,
    HistoryCache,
    HistoryTree,
    HistoryView,
)
from scope.history.storekit import (
    Closure,
    check_erase_limit,
    check_head,
    check_move_id,
    check_owner,
    check_retention,
    check_secret,
    check_tombstone,
    tombstone,
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
#: How many conversations a handle remembers having checked against the imported
#: tombstones (``RedisStore._settle``), least recently used leaving first.
_SETTLED_MAX: Final = 65_536

# The server's clock in Lua, in Unix milliseconds (expiry times are compared with it).
_NOW_MS: Final = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# Whether the conversation is closed: KEYS closed, meta (its owner, expiry and
# retention flag), its slot's tombstone set; ARGV the id's tombstone. Expects _NOW_MS.
# keep(meta, keys): the conversation's expiry (if it has one) on each of ``keys`` (keys
# a script created or SET anew carry it too).
_SHUT: Final = """
local function shut(closed, meta, tombs, mark)
  if redis.call('EXISTS', closed) == 1 then return true end
  local exp = redis.call('HGET', meta, 'exp')
  if exp and tonumber(exp) <= now then return true end
  return redis.call('SISMEMBER', tombs, mark) == 1
end
local function keep(meta, keys)
  local exp = redis.call('HGET', meta, 'exp')
  if exp then
    for _, key in ipairs(keys) do redis.call('PEXPIREAT', key, exp) end
  end
  return exp
end
"""

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

# KEYS: batches, length, tree, nodes, meta. A conversation stored before branches
# (batches and no head record) becomes one branch in place: each batch the parent of
# the next, the head its last, each path length counted once (cjson); the head record is
# written last, so an interrupted adoption is redone whole. The keys it writes take the
# conversation's expiry (``keep``, from _SHUT). Answers nil, or 'corrupt:<position>' for
# a record it cannot count (then nothing is written).
_ADOPT_LUA: Final = """
local function adopt(batches, length, tree, nodes, meta)
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
  redis.call('SET', length, string.format('%d', n), 'KEEPTTL')
  redis.call('HSET', tree, 'head', #records - 1)
  keep(meta, {tree, nodes, length})
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

# KEYS: closed, ids, batches, length, tree, nodes, moves, meta, tombstones[, listing,
# expiring[, owner's index]]. ARGV: append id, digest, record, message count, expected
# length ('' for no fence), '1' when fenced by head, expected head, listing member, owner
# ('' none), tombstone, retention in ms ('' none), the stored time of a restored batch
# ("<s>.<us>"; '': TIME now). Checks first (closed, expired or
# erased; dedupe record across every branch; fence by length and head: DESIGN §6b's
# order), then the one-time adoption of a pre-branch conversation (it changes no
# answer), then the writes, so an error (or an out-of-memory refusal of the first write)
# leaves no batch behind. The new batch's parent is the head, and it becomes the head: a
# constant number of commands, linear history or branch. Lengths are compared as decimal
# strings (no float). The first batch records the owner; an inserted batch moves the
# expiry by the retention unless the conversation has its own (meta's retained), and
# every data key of the conversation expires natively then (PEXPIREAT). With the index
# keys (one Redis, not Cluster: they are in another hash slot there) an inserted batch
# lists its conversation (and its expiry, and its owner's index) in the same step.
_APPEND: Final = f"""
{_NOW_MS}
{_SHUT}
{_TREE_LUA}
{_ADOPT_LUA}
if shut(KEYS[1], KEYS[8], KEYS[9], ARGV[10]) then return 'closed' end
local accepted = redis.call('HGET', KEYS[2], ARGV[1])
if accepted then return 'accepted:' .. accepted end
local problem = adopt(KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8])
if problem then return problem end
local head, start, length, aid = head_of(KEYS[5])
if (ARGV[5] ~= '' and ARGV[5] ~= length) or (ARGV[6] == '1' and ARGV[7] ~= aid) then
  return 'changed:' .. length .. ':' .. aid
end
local first = redis.call('HLEN', KEYS[2]) == 0
local index = redis.call('RPUSH', KEYS[3], ARGV[3]) - 1
if head ~= index - 1 then start = index end
local total = string.format('%d', tonumber(length) + tonumber(ARGV[4]))
local created = ARGV[12]
if created == '' then created = clock[1] .. '.' .. string.format('%06d', tonumber(clock[2])) end
redis.call('HSET', KEYS[5], index,
           string.format('%d %d ', head, start) .. total .. ' ' .. created .. ' ' .. ARGV[1],
           'head', index)
redis.call('HSET', KEYS[6], ARGV[1], index)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SET', KEYS[4], total)
local owned = first and ARGV[9] ~= '' and redis.call('HSETNX', KEYS[8], 'owner', ARGV[9]) == 1
if ARGV[11] ~= '' and redis.call('HGET', KEYS[8], 'retained') ~= '1' then
  redis.call('HSET', KEYS[8], 'exp', string.format('%d', now + tonumber(ARGV[11])))
end
local exp = keep(KEYS[8], {{KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}})
if KEYS[10] then
  redis.call('ZADD', KEYS[10], 0, ARGV[8])
  if exp then redis.call('ZADD', KEYS[11], exp, ARGV[8]) end
  if owned and KEYS[12] then redis.call('ZADD', KEYS[12], 0, ARGV[8]) end
end
return 'inserted'
"""

# KEYS: closed, ids, batches, tree, nodes, moves, meta, tombstones, length[, listing,
# expiring]. ARGV: listing member, tombstone. Every branch goes (batches, dedupe
# records, tree, move records). The length key stays (no expiry now): a closed
# conversation's last length; so does the owner (erase_owned finds it). With the
# listing keys the id leaves them in the same atomic step. An erased id is left as it
# is: its tombstone closes it, and no key naming it is written again.
_CLEAR: Final = """
if redis.call('SISMEMBER', KEYS[8], ARGV[2]) == 1 then return 'erased' end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('HDEL', KEYS[7], 'exp', 'retained')
redis.call('PERSIST', KEYS[9])
if KEYS[10] then
  redis.call('ZREM', KEYS[10], ARGV[1])
  redis.call('ZREM', KEYS[11], ARGV[1])
end
return 'cleared'
"""

# KEYS: tree, batches. read and read_batches: {head's append id, head path's records}.
# An expired conversation's keys are gone (native expiry), an erased one's deleted.
_READ: Final = f"""
{_PATH_LUA}
local aid, records = head_path(KEYS[1], KEYS[2])
return {{aid, records}}
"""

# KEYS: closed, length, tree, batches, meta, tombstones. ARGV: tombstone. One atomic
# read for read_view (a script, not MULTI, so it runs the same on Redis Cluster): closed
# flag (closed, expired or erased), length ('' when absent), the head's append id, the
# head path's records.
_VIEW: Final = f"""
{_NOW_MS}
{_SHUT}
{_PATH_LUA}
if shut(KEYS[1], KEYS[5], KEYS[6], ARGV[1]) then
  return {{1, redis.call('GET', KEYS[2]) or '', '', {{}}}}
end
local aid, records = head_path(KEYS[3], KEYS[4])
return {{0, redis.call('GET', KEYS[2]) or '', aid, records}}
"""

# KEYS: closed, batches, length, tree, nodes, moves, meta, tombstones. ARGV: target
# append id ('' before the first batch), expected head, move id ('' for none),
# tombstone. move_head in its order: closed (expired or erased too), move id (the same
# target: 'moved:<its path length>', another: 'conflict:<target>'), fence
# ('changed:<length>:<head>'), unknown target ('unknown'), move ('moved:<length>').
# The new head's path length is its tree record's: no message is read. The length keeps
# its expiry (KEEPTTL) and a new move records hash takes the conversation's.
_MOVE: Final = f"""
{_NOW_MS}
{_SHUT}
{_TREE_LUA}
{_ADOPT_LUA}
if shut(KEYS[1], KEYS[7], KEYS[8], ARGV[4]) then return 'closed' end
local problem = adopt(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7])
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
  redis.call('SET', KEYS[3], target_length, 'KEEPTTL')
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[6], ARGV[3], ARGV[1])
  keep(KEYS[7], {{KEYS[6]}})
end
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
# KEYS: lease, closed, length, tree, batches, meta, tombstones. ARGV: holder, ttl in ms,
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
return view({{KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}}, {{ARGV[3]}})
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
local inner_keys, inner_argv = {{}}, {{}}
for i = 2, #KEYS do inner_keys[i - 1] = KEYS[i] end
for i = 2, #ARGV do inner_argv[i - 1] = ARGV[i] end
local outcome = append(inner_keys, inner_argv)
if outcome == 'inserted' or outcome == 'accepted:' .. ARGV[3] then
  release({{KEYS[1]}}, {{ARGV[1]}})
end
return outcome
"""

# KEYS: meta, moves, closed, tombstones. ARGV: the id's tombstone. read_meta: both
# hashes and the closure in one atomic step (one slot), as {{field, value, ...}, {move
# id, head, ...}, closure}: 'erased' (the tombstone is stored), 'expired' (expire()
# removed it: the closed key holds '2'; or its expiry passed), 'cleared' (the closed key
# holds '1'), '' (open).
_READ_META: Final = f"""
{_NOW_MS}
local closure = ''
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1 then
  closure = 'erased'
else
  local closed = redis.call('GET', KEYS[3])
  local exp = redis.call('HGET', KEYS[1], 'exp')
  if closed == '2' then closure = 'expired'
  elseif closed then closure = 'cleared'
  elseif exp and tonumber(exp) <= now then closure = 'expired' end
end
return {{redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), closure}}
"""

# KEYS: closed, ids, batches, meta, tombstones, length, tree, nodes, moves[, expiring].
# ARGV: the expiry in Unix ms ('' never), listing member, tombstone. retain: 'closed', or
# the setting recorded (and every data key's native expiry set or removed) in one
# atomic step.
_RETAIN: Final = f"""
{_NOW_MS}
{_SHUT}
if shut(KEYS[1], KEYS[4], KEYS[5], ARGV[3]) then return 'closed' end
redis.call('HSET', KEYS[4], 'retained', '1')
local data = {{KEYS[2], KEYS[3], KEYS[6], KEYS[7], KEYS[8], KEYS[9]}}
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[4], 'exp')
  for _, key in ipairs(data) do redis.call('PERSIST', key) end
  if KEYS[10] then redis.call('ZREM', KEYS[10], ARGV[2]) end
else
  redis.call('HSET', KEYS[4], 'exp', ARGV[1])
  for _, key in ipairs(data) do redis.call('PEXPIREAT', key, ARGV[1]) end
  if KEYS[10] then redis.call('ZADD', KEYS[10], ARGV[1], ARGV[2]) end
end
return 'retained'
"""

# KEYS: closed, ids, batches, lease, meta, tree, nodes, moves, length[, listing,
# expiring]. ARGV: now in Unix ms, listing member. expire() of one conversation: {1}
# when it was due and is now closed (every branch's batches, dedupe records, tree and
# move records and the lease deleted; owner and length kept), else {0, its expiry or
# ''} (cleared, or an append or retain moved it: the index is fixed). The closed key
# holds '2' (closed by its expiry: read_meta's "expired"; clear writes '1').
_EXPIRE_ONE: Final = """
local exp = redis.call('HGET', KEYS[5], 'exp')
if redis.call('EXISTS', KEYS[1]) == 1 or not exp or tonumber(exp) > tonumber(ARGV[1]) then
  if KEYS[10] then
    if exp and redis.call('EXISTS', KEYS[1]) == 0 then
      redis.call('ZADD', KEYS[11], exp, ARGV[2])
    else
      redis.call('ZREM', KEYS[11], ARGV[2])
    end
  end
  return {0, exp or ''}
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7], KEYS[8])
redis.call('PERSIST', KEYS[9])
redis.call('SET', KEYS[1], '2')
redis.call('HDEL', KEYS[5], 'exp', 'retained')
if KEYS[10] then
  redis.call('ZREM', KEYS[10], ARGV[2])
  redis.call('ZREM', KEYS[11], ARGV[2])
end
return {1}
"""

# KEYS: closed, ids, batches, length, lease, meta, tree, nodes, moves, tombstones[,
# listing, expiring[, owner's index]]. ARGV: tombstone, listing member, the owner the
# caller read ('' none). erase: every key of the conversation (every branch's batches,
# tree and move records) deleted and the tombstone added, in one atomic step; with the
# index keys (one Redis) the id leaves them in the same step ({'owner', owner} when the
# owner is not the one the caller named its index for: call again). Answers {'erased',
# seconds, microseconds, owner, {digest, bytes, ...}} (every stored batch, in order).
_ERASE: Final = """
local owner = redis.call('HGET', KEYS[6], 'owner') or ''
if KEYS[11] and owner ~= ARGV[3] then return {'owner', owner} end
local out = {}
for _, record in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local first = string.find(record, '\\n', 1, true)
  local second = string.find(record, '\\n', first + 1, true)
  out[#out + 1] = string.sub(record, 1, first - 1)
  out[#out + 1] = #record - second
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
           KEYS[9])
redis.call('SADD', KEYS[10], ARGV[1])
if KEYS[11] then
  redis.call('ZREM', KEYS[11], ARGV[2])
  redis.call('ZREM', KEYS[12], ARGV[2])
  if KEYS[13] then redis.call('ZREM', KEYS[13], ARGV[2]) end
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

# KEYS: closed, meta, tombstones, length. ARGV: the id's tombstone. closed_conversations:
# {closure, owner or nil, length or nil} in one atomic step, the closure as _READ_META
# says it ('erased', 'expired', 'cleared', '' open), the length as _VIEW reads it.
_CLOSED_READ: Final = f"""
{_NOW_MS}
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return {{'erased', false, false}} end
local closed = redis.call('GET', KEYS[1])
local exp = redis.call('HGET', KEYS[2], 'exp')
local closure = ''
if closed == '2' then closure = 'expired'
elseif closed then closure = 'cleared'
elseif exp and tonumber(exp) <= now then closure = 'expired' end
return {{closure, redis.call('HGET', KEYS[2], 'owner'), redis.call('GET', KEYS[4])}}
"""

# KEYS: closed, ids, batches, length, tree, nodes, moves, meta, tombstones, lease[,
# listing, expiring[, owner's index]]. ARGV: tombstone, closure ('1' cleared, '2'
# expired: what clear and expire() leave in the closed key), owner ('' none), length
# (decimal), listing member. restore_closed, in one atomic step: the refusals first
# ('erased'; 'batches': it holds a batch, or its expiry passed and expire() did not
# remove it yet; 'closure:<1|2>', 'owner:<owner>', 'length:<length>': closed another
# way), nothing written then; an id closed exactly so answers 'same'; an unknown one is
# closed as clear / expire() leave it ('restored'): the closed key, the owner in meta
# (no expiry, not retained), the length key (none for 0), no data key. With the index
# keys (one Redis) the id leaves the listing and the expiry index and enters its
# owner's index in the same step, on 'same' too (an interrupted run is finished).
_RESTORE_CLOSED: Final = f"""
{_NOW_MS}
if redis.call('SISMEMBER', KEYS[9], ARGV[1]) == 1 then return 'erased' end
if redis.call('EXISTS', KEYS[3]) == 1 then return 'batches' end
local closed = redis.call('GET', KEYS[1])
local exp = redis.call('HGET', KEYS[8], 'exp')
if not closed and exp and tonumber(exp) <= now then return 'batches' end
local owner = redis.call('HGET', KEYS[8], 'owner') or ''
local outcome = 'restored'
if closed then
  if closed ~= '2' then closed = '1' end
  if closed ~= ARGV[2] then return 'closure:' .. closed end
  if owner ~= ARGV[3] then return 'owner:' .. owner end
  local length = redis.call('GET', KEYS[4]) or '0'
  if length ~= ARGV[4] then return 'length:' .. length end
  outcome = 'same'
else
  if owner ~= '' and owner ~= ARGV[3] then return 'owner:' .. owner end
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('DEL', KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[10])
  redis.call('HDEL', KEYS[8], 'exp', 'retained')
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[8], 'owner', ARGV[3]) end
  if ARGV[4] == '0' then
    redis.call('DEL', KEYS[4])
  else
    redis.call('SET', KEYS[4], ARGV[4])
  end
end
if KEYS[11] then
  redis.call('ZREM', KEYS[11], ARGV[5])
  redis.call('ZREM', KEYS[12], ARGV[5])
  if KEYS[13] then redis.call('ZADD', KEYS[13], 0, ARGV[5]) end
end
return outcome
"""

# KEYS: secret. ARGV: the secret read ('' none), the secret adopted. restore_erasures'
# swap of the store secret (compare and set): 1 when it now holds the adopted one, 0
# when it holds neither (another handle changed it meanwhile: nothing written).
_ADOPT_SECRET: Final = """
local held = redis.call('GET', KEYS[1]) or ''
if held == ARGV[2] then return 1 end
if held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""

#: ``_READ_META``'s closure answers.
_CLOSURES: Final[dict[bytes, Closure]] = {
    b"cleared": "cleared",
    b"expired": "expired",
    b"erased": "erased",
}

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


#: A conversation's keys (suffixes after ``{P}:{{H}}:``) and the Redis type scope
#: writes at each (``TYPE``'s answer), the batches first (see the module docstring).
_KEY_TYPES: Final = (
    ("batches", "list"),
    ("ids", "hash"),
    ("tree", "hash"),
    ("nodes", "hash"),
    ("moves", "hash"),
    ("meta", "hash"),
    ("closed", "string"),
    ("length", "string"),
    ("lease", "string"),
)
#: How a report names the types ``TYPE`` answers.
_TYPE_NAMES: Final = {
    "list": "list",
    "hash": "hash",
    "string": "string",
    "set": "set",
    "zset": "sorted set",
    "stream": "stream",
}


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
        answers=_wrong_type_answer,
    )


def _wrong_type_answer(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's ``WRONGTYPE`` answer (a key holds another type than
    the command or script needs, written outside scope): deterministic, so a retry on a
    fresh connection meets it again. Transient answers (``TRYAGAIN``, ``CLUSTERDOWN``,
    ``LOADING``, ``READONLY`` after a failover) stay retryable."""
    import redis.exceptions

    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("WRONGTYPE")


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
      ``read``, ``read_batches`` and ``read_view`` are one script each, ``read_tree``
      one pipelined round trip of plain reads;
      ``clear`` is one script that records the closure and deletes every branch (batches,
      dedupe records, tree and move records); ``erase`` is one script that deletes every
      key of the conversation (every branch's) and writes its tombstone, ``retain`` one
      that sets its expiry on every data key. Both are linearizable across
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
        "_imported",
        "_imports",
        "_listed",
        "_listing",
        "_listing_checked",
        "_outcome_source",
        "_retention",
        "_secret",
        "_settled",
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
        # The tombstones restore_erasures adds (it cannot know their ids, so not their
        # slots), and whether the store holds any (read at open; see _settle).
        self._imports = f"{prefix}:{{imported}}:tombstones"
        self._imported = False
        # The conversations checked against them: True once an imported tombstone was
        # copied into the id's slot set, False when the id has none (see _settle).
        self._settled: collections.OrderedDict[str, bool] = collections.OrderedDict()
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
        after its last append through this handle, by the server's clock; its data keys
        (every branch's) expire natively then (``PEXPIREAT``), ``expire()`` closes it
        and cleans the indexes. The store secret (the tombstones' HMAC key) is the key
        ``{prefix}:secret``, set once (``SET NX``) by the first open; a handle that
        finds it already there only reads it (so a read-only user opens the store).

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
        """Read the store secret, making it first when there is none (``SET NX``: the
        first open's 32 random bytes win). A secret already there is only read, so a
        user without write rights opens the store."""
        from scope.history.storekit import new_secret

        client = self._client
        key = f"{self.prefix}:secret"
        secret = await self._call(lambda: client.get(key), "store secret")
        if secret is None:
            await self._call(lambda: client.set(key, new_secret(), nx=True), "store secret")
            secret = await self._call(lambda: client.get(key), "store secret")
        if not isinstance(secret, bytes) or len(secret) != 32:
            raise StoreError(
                f"Redis key {key!r} does not hold a 32-byte store secret (written outside "
                "scope?): erase needs it; restore it from a backup"
            )
        self._secret = secret
        imports = self._imports
        held = await self._call(lambda: client.exists(imports), "store secret")
        self._imported = bool(held)

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
        """The head path's messages, its length, the head and the closure from one script
        (a consistent snapshot, on Redis Cluster too). A corrupt stored record raises
        ``StoreError``."""
        cid = ConversationID(conversation_id)
        await self._settle(cid)
        closed_key, _, batches_key, length_key, tree_key, *_ = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (closed_key, length_key, tree_key, batches_key, meta, tombs)
        client = self._client

        async def read() -> list[Any]:
            return list(await _run(client, _VIEW, 6, *keys, mark))

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
        if await self._imported_erased(cid):
            return decode(cid, iter(()), self._cache)
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
        (``scope history verify``): one pipelined round trip of the closure reads
        (``EXISTS`` of the closed key, ``SISMEMBER`` of the tombstone, ``HGET`` of the
        expiry), ``LLEN`` of the records, ``HGETALL`` of the tree and ``LRANGE`` of the
        records, in that order. Records are only ever appended, and a record and its
        tree entry are written by one script, so the tree read names a prefix of the
        records read after it: the snapshot is the tree's moment (a conversation stored
        before branches: the ``LLEN``'s). A clear or an expiry between the reads leaves
        fewer records than the tree names, and the read is made again (it then finds
        the conversation closed). A cleared, erased or expired conversation is an
        empty closed tree. Expiry: the data keys expire natively with the conversation,
        so records read mean it was live then; only a conversation with an expiry and
        no record asks the server's clock (``TIME``; a user refused it is answered by
        this machine's clock)."""
        cid = ConversationID(conversation_id)
        if await self._imported_erased(cid):
            return HistoryTree((), (), (), -1, True)
        closed_key, _, batches_key, _, tree_key, *_ = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        client = self._client

        async def read() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.exists(closed_key)
            pipe.sismember(tombs, mark)
            pipe.hget(meta, "exp")
            pipe.llen(batches_key)
            pipe.hgetall(tree_key)
            pipe.lrange(batches_key, 0, -1)
            return list(await pipe.execute())

        for _ in range(3):
            closed, erased, exp, count, fields, items = await self._call(
                read, f"tree read of conversation {str(cid)!r}"
            )
            if not closed and not erased and exp is not None and not count and not fields:
                closed = await self._expired(cid, exp)
            if closed or erased:
                self._cache.forget(cid)  # cleared or erased, maybe through another handle
                return HistoryTree((), (), (), -1, True)
            raw_head = fields.get(b"head")
            if raw_head is not None:  # the tree's own count: every position it names
                count = sum(1 for key in fields if key.isdigit())
            if len(items) < count:
                continue  # cleared or expired between the reads: read again
            return self._tree(cid, items[:count], fields, raw_head)
        raise StoreError(
            f"conversation {str(cid)!r} changed under three tree reads in a row; read again"
        )

    async def _expired(self, cid: ConversationID, exp: Any) -> bool:
        """Whether the expiry ``exp`` (Unix ms, as stored) has passed by the server's
        clock (``TIME``); by this machine's when the server refuses ``TIME`` to this
        user."""
        import time

        import redis.exceptions

        client = self._client
        try:
            seconds, micros = await self._call(
                lambda: client.time(), f"tree read of conversation {str(cid)!r}"
            )
            now = int(seconds) * 1000 + int(micros) // 1000
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
                raise
            now = math.floor(time.time() * 1000)
        try:
            return int(exp) <= now
        except ValueError:
            raise StoreError(
                f"conversation {str(cid)!r} is corrupt: its expiry is {exp!r}"
            ) from None

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
        (``ConversationClosedError``: cleared, expired or erased), a recorded
        ``move_id`` (the same target: its length, nothing moved; another:
        ``AppendConflictError``), the fence (``HistoryChangedError`` with both
        heads), an unknown ``head`` (``UnknownHeadError``), the move (and the
        ``move_id`` recorded in the conversation's own move records, apart from append
        ids). Nothing changes when it raises. Invalid arguments raise
        ``InvalidConversationIDError`` / ``InvalidAppendIDError`` before any I/O."""
        cid = ConversationID(conversation_id)
        target = check_head(head, "head")
        expected = check_head(expected_head, "expected_head")
        mid = check_move_id(move_id) or ""
        await self._settle(cid)
        closed_key, _, batches_key, length_key, tree_key, nodes_key, moves_key = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (closed_key, batches_key, length_key, tree_key, nodes_key, moves_key, meta, tombs)
        client = self._client

        async def move() -> Any:
            return await _run(client, _MOVE, 8, *keys, target, expected, mid, mark)

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
        if after is None:
            wrong = await self._wrong_keys(raw)
            if wrong:
                first = wrong[0][0] == "batches"
                what = "records cannot be read" if first else "keys cannot be used"
                found = "; ".join(text for _, text in wrong)
                raise UnreadableRecords(f"its {what}: {found} (written outside scope)")
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

    async def _wrong_keys(self, raw: bytes) -> list[tuple[str, str]]:
        """Every key of the conversation (UTF-8 bytes ``raw``) that holds another type
        than scope writes there, each as its suffix (``"nodes"``) and ``key '...' holds
        a T, not a U``, the batches key first; ``[]`` when each is scope's type or
        absent. One pipeline of ``TYPE``
        (read-only): a key of the wrong type fails every append or read that meets it,
        and ``verify`` names it instead of passing the conversation."""
        base = f"{self.prefix}:{{{raw.hex()}}}"
        keys = [(f"{base}:{suffix}", wanted) for suffix, wanted in _KEY_TYPES]
        client = self._client

        async def types() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for key, _ in keys:
                pipe.type(key)
            return list(await pipe.execute())

        held = await self._call(types, f"key types of conversation {shown_id(raw)!r}")
        wrong: list[tuple[str, str]] = []
        for (suffix, wanted), (key, _), found in zip(_KEY_TYPES, keys, held, strict=True):
            name = found.decode("utf-8", "replace") if isinstance(found, bytes) else str(found)
            if name not in ("none", wanted):
                shown = f"{_TYPE_NAMES.get(name, name)}, not a {_TYPE_NAMES[wanted]}"
                wrong.append((suffix, f"key {key!r} holds a {shown}"))
        return wrong

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

    async def _write(
        self, batch: Batch, holder: str | None, owner: str | None, created: float | None
    ) -> Any:
        # One script; with a holder (append_release_turn) the folded script, which also
        # releases the holder's lease when the append landed or was a retry.
        cid = batch.conversation_id
        await self._settle(cid)
        aid = str(batch.id).encode("utf-8")
        digest = batch.digest.encode("ascii")
        record = b"".join((digest, b"\n", aid, b"\n", batch.encoded_messages))
        meta, tombs, mark = self._erasure_keys(cid)
        every = (*self._keys(cid), meta, tombs)
        member = cid.encode("utf-8")
        client = self._client
        count = len(batch.messages)
        expected = "" if batch.expected_length is None else str(batch.expected_length)
        fenced, expected_head = (
            (b"0", b"") if batch.expected_head is None else (b"1", batch.expected_head.encode())
        )
        cluster = self.cluster
        indexes: tuple[str, ...] = (self._listing, self._expiring)
        if owner is not None:
            indexes += (self._owner_index(owner),)
        # With a holder: the folded script, the lease key first and the holder first.
        script, lease, token = (
            (_APPEND, (), ())
            if holder is None
            else (_APPEND_RELEASE, (self._lease_key(cid),), (holder,))
        )
        n = len(lease) + len(every)
        arguments = (
            *token, aid, digest, record, count, expected, fenced, expected_head,
            member, owner or "", mark, self._retention,
            "" if created is None else f"{created:.6f}",
        )  # fmt: skip

        async def append() -> Any:
            if not cluster:  # one script: the indexes change in the same atomic step
                return await _run(
                    client, script, n + len(indexes), *lease, *every, *indexes, *arguments
                )
            return await _run(client, script, n, *lease, *every, *arguments)

        outcome = await self._call(append, f"append to conversation {str(cid)!r}")
        _check_adopted(cid, outcome)
        return outcome

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
        await self._settle(cid)
        closed_key, ids, batches, length, tree, nodes, moves = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (closed_key, ids, batches, tree, nodes, moves, meta, tombs, length)
        client = self._client
        indexes = (self._listing, self._expiring)
        member = cid.encode("utf-8")
        cluster = self.cluster

        async def clear() -> None:
            if not cluster:
                await _run(client, _CLEAR, len(keys) + 2, *keys, *indexes, member, mark)
                return
            # Another slot: first marked in the listing's slot, so a listing checks this
            # id's closure until it left the listing (see _list), then closed, then
            # unlisted. An erased id is not marked (no key names it again).
            if await client.sismember(tombs, mark):
                return
            await client.sadd(self._cleared, member)
            await _run(client, _CLEAR, len(keys), *keys, member, mark)
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
        await self._settle(cid)
        closed_key, _, batches_key, length_key, tree_key, *_ = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (self._lease_key(cid), closed_key, length_key, tree_key, batches_key, meta, tombs)
        millis = max(1, math.ceil(ttl * 1000))
        client = self._client

        async def acquire_view() -> Any:
            return await _run(client, _ACQUIRE_VIEW, 7, *keys, holder, millis, mark)

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
            lambda: _run(client, _LIST_PAGE, len(keys), *keys, start, size),
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

    async def _read_meta(
        self, cid: ConversationID
    ) -> tuple[str | None, float | None, bool, list[tuple[str, str]], Closure | None]:
        # One script reading meta, moves and the closure (one slot: atomic, on a
        # Cluster too).
        await self._settle(cid)
        keys = self._keys(cid)
        closed_key, moves_key = keys[0], keys[6]
        meta_key, tombs, mark = self._erasure_keys(cid)
        client = self._client

        async def read() -> Any:
            return await _run(client, _READ_META, 4, meta_key, moves_key, closed_key, tombs, mark)

        fields, pairs, closed = await self._call(read, f"meta read of conversation {str(cid)!r}")
        closure = _CLOSURES.get(bytes(closed))
        meta = {
            _text(cid, fields[i], "meta field"): fields[i + 1] for i in range(0, len(fields), 2)
        }
        owner = None if meta.get("owner") is None else _text(cid, meta["owner"], "owner")
        exp = meta.get("exp")
        expiry = None if exp is None else _number(cid, exp, "expiry") / 1000
        moves = [
            (_text(cid, pairs[i], "move id"), _text(cid, pairs[i + 1], "move record"))
            for i in range(0, len(pairs), 2)
        ]
        return owner, expiry, meta.get("retained") == b"1", moves, closure

    async def _retain(self, cid: ConversationID, until: float | None) -> bool:
        # One script (Cluster: the expiry index, in another slot, after it).
        await self._settle(cid)
        closed_key, ids, batches, length, tree, nodes, moves = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (closed_key, ids, batches, meta, tombs, length, tree, nodes, moves)
        at = "" if until is None else str(math.floor(until * 1000))
        member = cid.encode("utf-8")
        client = self._client
        cluster = self.cluster

        async def retain() -> Any:
            if not cluster:
                return await _run(client, _RETAIN, 10, *keys, self._expiring, at, member, mark)
            answer = await _run(client, _RETAIN, 9, *keys, at, member, mark)
            if _answer(answer) == "retained":
                if until is None:
                    await client.zrem(self._expiring, member)
                else:
                    await client.zadd(self._expiring, {member: int(at)})
            return answer

        answer = await self._call(retain, f"retention of conversation {str(cid)!r}")
        return _answer(answer) == "retained"

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
            closed_key, ids, batches, length, tree, nodes, moves = self._keys(cid)
            meta, lease = self._erasure_keys(cid)[0], self._lease_key(cid)
            keys = (closed_key, ids, batches, lease, meta, tree, nodes, moves, length)
            member = bytes(raw)

            async def one(keys: tuple[str, ...] = keys, member: bytes = member) -> Any:
                if not self.cluster:
                    indexes = (self._listing, self._expiring)
                    return await _run(client, _EXPIRE_ONE, 11, *keys, *indexes, at, member)
                answer = await _run(client, _EXPIRE_ONE, 9, *keys, at, member)
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
        closed_key, ids, batches, length, tree, nodes, moves = self._keys(cid)
        meta, tombs, _ = self._erasure_keys(cid)
        lease = self._lease_key(cid)
        keys = (closed_key, ids, batches, length, lease, meta, tree, nodes, moves, tombs)
        member = cid.encode("utf-8")
        client = self._client
        cluster = self.cluster
        what = f"erasure of conversation {str(cid)!r}"

        async def erase() -> Any:
            if cluster:
                return await _run(client, _ERASE, 10, *keys, mark, member, "")
            owner = await client.hget(meta, "owner")
            for _ in range(3):  # an owner recorded meanwhile: once more with its index
                named = "" if owner is None else owner.decode("utf-8")
                indexes: tuple[str, ...] = (self._listing, self._expiring)
                if owner is not None:
                    indexes += (self._owner_index(named),)
                answer = await _run(
                    client, _ERASE, 10 + len(indexes), *keys, *indexes, mark, member, named
                )
                if _answer(answer[0]) == "erased":
                    return answer
                owner = answer[1] or None
            raise StoreError(f"Redis {what}: its owner kept changing")

        answer = await self._call(erase, what)
        _, seconds, micros, owner, flat = answer
        if cluster:
            await self._unindex(cid, _answer(owner) or None)
        records = [
            (index, _answer(flat[2 * index]), int(flat[2 * index + 1]))
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
            lambda: _run(client, _UNINDEX, len(keys), *keys, member),
            f"erasure of conversation {str(cid)!r}",
        )

    async def erase_owned(self, owner: str, *, limit: int = 100) -> list[Any]:
        """``RecordStore.erase_owned``; on a Cluster an id whose erasure was cut short
        between its two steps (the conversation's script ran, its index entries were
        not removed yet) is only unindexed: it was erased, so it gets no second
        receipt."""
        if not self.cluster:
            return await super().erase_owned(owner, limit=limit)
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
            (
                b":closed",
                b":ids",
                b":batches",
                b":length",
                b":lease",
                b":meta",
                b":tree",
                b":nodes",
                b":moves",
            )
        ):
            tag = key[tag_start + 1 : key.find(b"}", tag_start)]
            with contextlib.suppress(ValueError):
                held(bytes.fromhex(tag.decode("ascii")), f"key {key.decode('utf-8', 'replace')}")
            return
        kind = _answer(await client.type(key))
        where = f"index {key.decode('utf-8', 'replace')}"
        if kind == "zset":
            async for member, _ in client.zscan_iter(key, count=1000):
                held(bytes(member), where)
        elif kind == "set" and not key.endswith(b":tombstones"):
            async for member in client.sscan_iter(key, count=1000):
                held(bytes(member), where)

    # -- restore (DESIGN §6n: scope.history.Restorer) -----------------------------------

    async def _settle(self, cid: ConversationID) -> None:
        """When the store holds imported tombstones (``restore_erasures``): copy
        ``cid``'s tombstone, if it is one of them, into its slot's tombstone set, before
        a step's script runs (which reads only that set: on a Cluster it cannot read
        another slot). One ``SISMEMBER`` the first time this handle meets ``cid`` (and
        again once ``_SETTLED_MAX`` other ids pushed it out), on a store that holds
        imported tombstones only; idempotent.

        The answer is kept: imports happen with no other handle open (see
        ``restore_erasures``; one through this handle drops what it kept), so the
        imported set does not change while a handle keeps answers, and a tombstone
        copied into its slot set stays there: an id checked once needs no second
        check."""
        if not self._imported:
            return
        settled = self._settled
        key = str(cid)
        if key in settled:
            settled.move_to_end(key)
            return
        _, tombs, mark = self._erasure_keys(cid)
        imports = self._imports
        client = self._client

        async def settle() -> bool:
            if await client.sismember(imports, mark):
                await client.sadd(tombs, mark)
                return True
            return False

        found = await self._call(settle, f"erasure check of conversation {str(cid)!r}")
        self._remember(key, found)

    def _remember(self, key: str, erased: bool) -> None:
        settled = self._settled
        settled[key] = erased
        if len(settled) > _SETTLED_MAX:
            settled.popitem(last=False)

    async def _imported_erased(self, cid: ConversationID) -> bool:
        """Whether ``cid``'s tombstone is an imported one (a read, for the plain-read
        steps: ``read``, ``read_batches``, ``read_tree``; kept as ``_settle`` keeps it
        when it finds none: an id found erased is checked again, so that ``_settle``
        still copies its tombstone, which these read-only steps do not)."""
        if not self._imported:
            return False
        key = str(cid)
        known = self._settled.get(key)
        if known is not None:
            self._settled.move_to_end(key)
            return known
        mark = self._erasure_keys(cid)[2]
        imports = self._imports
        client = self._client
        found = bool(
            await self._call(
                lambda: client.sismember(imports, mark),
                f"erasure check of conversation {str(cid)!r}",
            )
        )
        if not found:
            self._remember(key, False)
        return found

    async def closed_conversations(
        self, *, after: str | None = None, limit: int = 1000
    ) -> list[ClosedConversation]:
        """``scope.history.Restorer.closed_conversations``. There is no index of closed
        ids: every call ``SCAN``s the whole keyspace (every primary of a Cluster) for the
        ``:closed`` keys (cleared, or expired and removed by ``expire``) and reads the
        expiry index's due ids (expired by the server's clock, not removed yet), sorts
        the ids after ``after``, then reads each one's closure, owner and length with one
        script in its slot (``_CLOSED_READ``) until ``limit`` are found: O(keys in the
        database) per page, for an export tool, not for a request path. An id stored
        outside scope that is not a valid id is skipped."""
        count = check_erase_limit(limit)
        start = None if after is None else ConversationID(after)
        client = self._client
        prefix = self.prefix

        async def candidates() -> set[ConversationID]:
            found: set[ConversationID] = set()
            head, tail = f"{prefix}:{{".encode(), b"}:closed"
            async for key in client.scan_iter(match=f"{prefix}:{{*}}:closed", count=1000):
                key = bytes(key)
                if not (key.startswith(head) and key.endswith(tail)):
                    continue
                with contextlib.suppress(ValueError):
                    found.add(stored_id(bytes.fromhex(key[len(head) : -len(tail)].decode())))
            seconds, micros = await client.time()
            now = int(seconds) * 1000 + int(micros) // 1000
            for raw in await client.zrangebyscore(self._expiring, "-inf", now):
                with contextlib.suppress(ValueError):
                    found.add(stored_id(bytes(raw)))
            return found

        ids = sorted(
            cid
            for cid in await self._call(candidates, "scan of closed conversations")
            if start is None or cid > start
        )
        out: list[ClosedConversation] = []
        for cid in ids:
            if len(out) == count:
                break
            every_key = self._keys(cid)
            meta, tombs, mark = self._erasure_keys(cid)
            keys = (every_key[0], meta, tombs, every_key[3])

            async def read(keys: tuple[str, ...] = keys, mark: str = mark) -> Any:
                return await _run(client, _CLOSED_READ, 4, *keys, mark)

            closure, owner, length = await self._call(
                read, f"closure read of conversation {str(cid)!r}"
            )
            kind = _answer(closure)
            if kind not in ("cleared", "expired") or await self._imported_erased(cid):
                continue
            try:
                out.append(
                    ClosedConversation(
                        cid,
                        kind,
                        None if owner is None else _text(cid, owner, "owner"),
                        0 if length is None else _length(cid, length),
                    )
                )
            except InvalidViewError as exc:
                raise StoreError(f"conversation {str(cid)!r} is corrupt: {exc}") from None
        return out

    async def restore_closed(self, closed: ClosedConversation) -> bool:
        """``scope.history.Restorer.restore_closed``: one script in the conversation's
        slot (``_RESTORE_CLOSED``) checks and writes it as ``clear`` (``"cleared"``) or
        ``expire`` (``"expired"``) leave a conversation: the closed key, the owner in
        ``meta`` (no expiry), its length. One Redis: the listing, the expiry index and
        the owner's index (which ``erase_owned`` reads) change in the same step. Cluster:
        they are in another slot, changed after the script, on a re-run that finds it
        already restored too (so an import cut short between the two steps is finished
        by running it again; until then ``erase_owned`` does not find it)."""
        if not isinstance(closed, ClosedConversation):
            raise TypeError(
                f"restore_closed needs a ClosedConversation, got {type(closed).__name__}"
            )
        cid = closed.conversation_id
        await self._settle(cid)
        closed_key, ids, batches, length, tree, nodes, moves = self._keys(cid)
        meta, tombs, mark = self._erasure_keys(cid)
        keys = (
            closed_key, ids, batches, length, tree, nodes, moves, meta, tombs,
            self._lease_key(cid),
        )  # fmt: skip
        kind = "1" if closed.closure == "cleared" else "2"
        owner = closed.owner or ""
        member = cid.encode("utf-8")
        arguments = (mark, kind, owner, str(closed.length), member)
        indexes: tuple[str, ...] = (self._listing, self._expiring)
        if closed.owner is not None:
            indexes += (self._owner_index(closed.owner),)
        client = self._client
        cluster = self.cluster

        async def restore() -> str:
            if not cluster:
                answer = await _run(
                    client, _RESTORE_CLOSED, len(keys) + len(indexes), *keys, *indexes, *arguments
                )
                return _answer(answer)
            outcome = _answer(await _run(client, _RESTORE_CLOSED, len(keys), *keys, *arguments))
            if outcome in ("restored", "same"):
                await client.zrem(self._listing, member)
                await client.zrem(self._expiring, member)
                if closed.owner is not None:
                    await client.zadd(self._owner_index(closed.owner), {member: 0})
            return outcome

        outcome = await self._call(restore, f"restore of conversation {str(cid)!r}")
        if outcome == "restored":
            self._cache.forget(cid)
            return True
        if outcome == "same":
            return False
        kind_of = {"1": "cleared", "2": "expired"}
        problem, _, held = outcome.partition(":")
        reasons = {
            "erased": "is erased (its tombstone is stored)",
            "batches": "holds batches (open, or expired and not removed by expire())",
            "closure": f"is {kind_of.get(held, held)}, not {closed.closure}",
            "owner": f"has owner {held or None!r}, not {closed.owner!r}",
            "length": f"was closed at length {held}, not {closed.length}",
        }
        if problem not in reasons:
            raise StoreError(f"Redis restore script returned {outcome!r}")
        raise RestoreConflictError(
            f"cannot restore closed conversation {str(cid)!r}: the store's "
            f"{reasons[problem]}; nothing was written"
        )

    async def _tombstone_sets(self) -> list[bytes]:
        """Every tombstone set of this store (each slot's and the imported one's): one
        ``SCAN`` of the keyspace (every primary of a Cluster)."""
        client = self._client
        pattern = re.compile(re.escape(self.prefix).encode() + rb":\{[^{}]*\}:tombstones\Z")

        async def scan() -> list[bytes]:
            match = f"{self.prefix}:{{*}}:tombstones"
            return [
                bytes(key)
                async for key in client.scan_iter(match=match, count=1000)
                if pattern.match(bytes(key))
            ]

        return await self._call(scan, "scan of tombstone sets")

    async def _every_tombstone(self) -> set[str]:
        """Every tombstone the store holds (O(tombstones), after a keyspace ``SCAN``)."""
        client = self._client
        found: set[str] = set()
        for key in await self._tombstone_sets():

            async def members(key: bytes = key) -> list[bytes]:
                return [bytes(m) async for m in client.sscan_iter(key, count=1000)]

            for raw in await self._call(members, "read of tombstones"):
                found.add(raw.decode("utf-8", "replace"))
        return found

    async def tombstones(self, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """``scope.history.Restorer.tombstones``: the members of every tombstone set (one
        per hash slot that holds an erased id, and the imported ones), read whole and
        sorted on every call: a keyspace ``SCAN`` and O(tombstones) per page, for an
        export tool. ``after`` must be a string (``TypeError``)."""
        count = check_erase_limit(limit)
        if after is not None and not isinstance(after, str):
            raise TypeError(f"after must be a string or None, got {type(after).__name__}")
        every = sorted(
            mark for mark in await self._every_tombstone() if after is None or mark > after
        )
        return every[:count]

    async def store_secret(self) -> bytes:
        """``scope.history.Restorer.store_secret``: the secret this handle read at open
        (or adopted with ``restore_erasures``), the key ``{prefix}:secret``."""
        if self._closed:
            raise store_closed("RedisStore")
        return self._secret

    async def _held_keys(self, limit: int = 3) -> list[str]:
        """Up to ``limit`` keys of this store that hold a conversation (open or closed,
        any of its keys), a tombstone set or an index: a keyspace ``SCAN`` (every primary
        of a Cluster) for ``{P}:*`` and ``{{P}:*``; the secret and the schema marker are
        not counted, nor keys of another prefix that the patterns also match."""
        client = self._client
        prefix = re.escape(self.prefix).encode()
        ours = re.compile(
            rb"(?:" + prefix + rb":\{[^{}]*\}:[a-z]+"
            rb"|" + prefix + rb":conversations"
            rb"|\{" + prefix + rb":conversations\}:.*)\Z",
            re.DOTALL,
        )

        async def scan() -> list[str]:
            held: list[str] = []
            for match in (f"{self.prefix}:*", f"{{{self.prefix}:*"):
                async for key in client.scan_iter(match=match, count=1000):
                    if ours.match(bytes(key)):
                        held.append(bytes(key).decode("utf-8", "replace"))
                        if len(held) == limit:
                            return held
            return held

        return await self._call(scan, "check that the store is empty")

    async def restore_erasures(self, secret: bytes, tombstones: Sequence[str]) -> int:
        """``scope.history.Restorer.restore_erasures``, in ordered idempotent steps (a
        Cluster cannot change keys of several slots atomically; run again, the steps
        finish the job):

        1. Check ``secret`` and every tombstone (before any I/O).
        2. When the stored secret is another one: ``SCAN`` the keyspace (every primary)
           for any key of a conversation, tombstone set or index of this store
           (``RestoreConflictError`` naming them, nothing written), then swap the secret
           (compare and set, one script: ``RestoreConflictError`` when another handle
           changed it meanwhile) and adopt it on this handle. A handle opened before
           keeps the secret it read: restore with no other handle open.
        3. Refuse (``RestoreConflictError``, nothing added) a new tombstone that a listed
           conversation's id hashes to (``_refuse_held``), then add the tombstones not
           held yet (read from every tombstone set: O(tombstones) after a keyspace
           ``SCAN``) with one ``SADD`` to the imported set
           ``{P}:{imported}:tombstones``. A tombstone names no id, so not the id's slot,
           where the scripts look (``{P}:{T}:tombstones``); every handle opened since
           (and this one) knows the store holds imported tombstones, and before each
           step on a conversation copies its tombstone from the imported set into its
           slot's set when it is there (``_settle``), so the step's script finds it
           erased.

        Returns how many were added."""
        key = check_secret(secret)
        marks = list(dict.fromkeys(check_tombstone(mark) for mark in tombstones))
        client = self._client
        secret_key = f"{self.prefix}:secret"
        held = await self._call(lambda: client.get(secret_key), "store secret")
        if held != key:
            found = await self._held_keys()
            if found:
                raise RestoreConflictError(
                    "cannot adopt another store secret: this store holds conversations or "
                    f"tombstones made under its own (keys {', '.join(found)}, ...); nothing "
                    "was written"
                )

            async def adopt() -> Any:
                return await _run(client, _ADOPT_SECRET, 1, secret_key, held or b"", key)

            if not int(await self._call(adopt, "store secret")):
                raise RestoreConflictError(
                    f"the store secret (key {secret_key!r}) changed during the restore (another "
                    "handle?); nothing was written"
                )
        self._secret = key
        present = await self._every_tombstone() if marks else set()
        new = [mark for mark in marks if mark not in present]
        if not new:
            return 0
        await self._refuse_held(key, set(new))
        imports = self._imports
        added = await self._call(lambda: client.sadd(imports, *new), "restore of tombstones")
        self._imported = True
        self._settled.clear()  # checked before these were imported
        return int(added)

    async def _refuse_held(self, secret: bytes, marks: set[str]) -> None:
        """``RestoreConflictError`` when a conversation the store lists (open, or closed
        by ``clear`` or expiry) has an id hashing to one of ``marks``: a tombstone
        closes its id, and an erased id holds nothing (erase it first). Hashes every
        listed id (a keyspace ``SCAN`` for the closed ones)."""
        ids = list(await self.conversations())
        after: str | None = None
        while page := await self.closed_conversations(after=after, limit=1000):
            ids += [entry.conversation_id for entry in page]
            after = page[-1].conversation_id
        if any(tombstone(secret, cid) in marks for cid in ids):
            raise RestoreConflictError(
                "a conversation this store holds has an id hashing to one of the tombstones "
                "(erase it first: an erased id holds nothing); nothing was written"
            )


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


def _answer(value: Any) -> str:
    """A script's answer as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


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


def _length(cid: str, raw: Any) -> int:
    """A closed conversation's stored length (decimal), else ``StoreError``."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise StoreError(f"conversation {str(cid)!r} is corrupt: its length is {raw!r}")
    return int(text)


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
