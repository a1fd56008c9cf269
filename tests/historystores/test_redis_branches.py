"""RedisStore's branches (DESIGN §6h) against real servers: the tree records and head in
the conversation's hash slot, head-path reads, ``read_tree``, ``move_head`` with move
records, clears dropping every branch, conversations written before branches (adopted
as one branch at their first write, read as one before it), what each step costs on the
server (commands seen by ``MONITOR``), races and cancellation. On one Redis and on a
Redis Cluster where the rule is not about one server's commands. asyncio only.

Needs ``SCOPE_TEST_REDIS_URL`` / ``SCOPE_TEST_REDIS_CLUSTER_URL`` (see tests/servers.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidConversationIDError,
    StoreError,
    UnknownHeadError,
)
from scope.history import Batch, HistoryTree, HistoryView
from scope.historystores.redis import RedisStore
from tests.helpers import nested, texts, turn
from tests.servers import (
    _free_ports,
    drop_keys,
    import_driver,
    redis_cluster_url_or_skip,
    redis_url_or_skip,
    unique_key_prefix,
)

redis = import_driver("redis")
aioredis = import_driver("redis.asyncio")
from redis.asyncio.cluster import RedisCluster  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.servers]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=[False, True], ids=["redis", "cluster"])
def cluster(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def url(cluster: bool) -> str:
    return redis_cluster_url_or_skip() if cluster else redis_url_or_skip()


@pytest.fixture
async def prefix(url: str, cluster: bool) -> AsyncIterator[str]:
    prefix = unique_key_prefix()
    yield prefix
    await drop_keys(url, prefix, cluster=cluster)


@pytest.fixture
async def admin(url: str, cluster: bool) -> AsyncIterator[Any]:
    client: Any
    if cluster:
        client = RedisCluster.from_url(url)
        await client.initialize()
    else:
        client = aioredis.Redis.from_url(url)
    yield client
    await client.aclose()


@pytest.fixture
async def store(url: str, prefix: str, cluster: bool) -> AsyncIterator[RedisStore]:
    async with await RedisStore.open(
        url, prefix=prefix, cluster=cluster, check_persistence=False
    ) as store:
        yield store


def base(prefix: str, cid: str) -> str:
    return f"{prefix}:{{{cid.encode().hex()}}}"


def record(batch: Batch) -> bytes:
    """A batch's element of the ``batches`` list, as every version wrote it."""
    return b"\n".join((batch.digest.encode(), batch.id.encode(), batch.encoded_messages))


async def write_the_old_way(
    admin: Any, prefix: str, cid: str, batches: list[Batch], *, length_key: bool = True
) -> None:
    """The keys scope 0.2-0.4 wrote before branches (its append script's writes): the
    batches list, the dedupe hash, the length and the listing; scope 0.1 had no length
    key (``length_key=False``)."""
    key = base(prefix, cid)
    for batch in batches:
        await admin.rpush(f"{key}:batches", record(batch))
        await admin.hset(f"{key}:ids", batch.id, batch.digest)
    if length_key:
        await admin.set(f"{key}:length", sum(len(b) for b in batches))
    await admin.zadd(f"{prefix}:conversations", {cid: 0})


def three(cid: str = "c") -> list[Batch]:
    return [Batch(cid, f"a{i}", turn(f"t{i}")) for i in (1, 2, 3)]


async def branched(store: RedisStore, cid: str = "c") -> None:
    """a1 - a2 - a3, rewound to a1, then b2 - b3: the head path a1, b2, b3."""
    for batch in three(cid):
        await store.append(batch)
    assert await store.move_head(cid, "a1", expected_head="a3") == 2
    await store.append(Batch(cid, "b2", turn("u2"), expected_length=2, expected_head="a1"))
    await store.append(Batch(cid, "b3", turn("u3")))


# -- layout -------------------------------------------------------------------------------


def hash_tag(key: bytes) -> bytes:
    start = key.find(b"{")
    end = key.find(b"}", start + 1)
    return key[start + 1 : end]


async def test_every_key_of_a_branched_conversation_shares_its_hash_slot(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    cid = "x}{y"
    await branched(store, cid)
    await store.move_head(cid, "a2", expected_head="b3", move_id="m1")
    keys = [key async for key in admin.scan_iter(match=f"{prefix}:{{*")]
    assert {hash_tag(key) for key in keys} == {cid.encode().hex().encode()}
    suffixes = {key.rsplit(b":", 1)[1] for key in keys}
    assert suffixes == {b"batches", b"ids", b"length", b"tree", b"nodes", b"moves"}
    tree = await admin.hgetall(f"{base(prefix, cid)}:tree")
    assert tree[b"head"] == b"1"
    # parent, run start, path length, created, append id
    parent, start, length, created, aid = tree[b"4"].split(b" ", 4)
    assert (parent, start, length, aid) == (b"3", b"3", b"6", b"b3")
    assert float(created) > 0
    assert await admin.hgetall(f"{base(prefix, cid)}:nodes") == {
        b"a1": b"0",
        b"a2": b"1",
        b"a3": b"2",
        b"b2": b"3",
        b"b3": b"4",
    }
    assert await admin.hgetall(f"{base(prefix, cid)}:moves") == {b"m1": b"a2"}


# -- head path ------------------------------------------------------------------------------


async def test_reads_see_the_head_path_only(store: RedisStore) -> None:
    await branched(store)
    expected = ["t1 q", "t1 a", "u2 q", "u2 a", "u3 q", "u3 a"]
    assert texts(await store.read("c")) == expected
    assert [b.id for b in await store.read_batches("c")] == ["a1", "b2", "b3"]
    view = await store.read_view("c")
    assert (texts(view.messages), view.length, view.head, view.closed) == (
        expected,
        6,
        "b3",
        False,
    )
    leased = await store.acquire_turn_view("c", "h", 30)
    assert leased == view
    # A head in the middle of a branch: its path only (a1, a2).
    await store.move_head("c", "a2", expected_head="b3")
    assert [b.id for b in await store.read_batches("c")] == ["a1", "a2"]
    assert (await store.read_view("c")).head == "a2"
    # Before the first batch: nothing, head "".
    assert await store.move_head("c", "", expected_head="a2") == 0
    assert await store.read("c") == []
    assert await store.read_view("c") == HistoryView((), 0, False, "")
    assert await store.conversations() == ["c"]  # it still holds batches


async def test_a_deep_tree_reads_each_path_whole(store: RedisStore) -> None:
    """Branches off branches, heads anywhere: every path read equals the path the tree
    says (runs of consecutive positions stitched in order)."""
    rng = random.Random(7)
    ids: list[str] = []
    for n in range(40):
        if ids and rng.random() < 0.3:
            target = rng.choice(["", *ids])
            await store.move_head("c", target, expected_head=(await store.read_view("c")).head)
        aid = f"n{n}"
        await store.append(Batch("c", aid, turn(aid, 1 + n % 3)))
        ids.append(aid)
    tree = await store.read_tree("c")
    for target in ["", *ids]:
        view = await store.read_view("c")
        length = await store.move_head("c", target, expected_head=view.head)
        index = -1 if target == "" else ids.index(target)
        path = [tree.batches[i] for i in tree.path(index)]
        assert await store.read_batches("c") == path
        assert length == sum(len(b) for b in path)
        assert (await store.read_view("c")).length == length


async def test_the_fence_names_the_head(store: RedisStore) -> None:
    await branched(store)
    # Same length (6) on the other branch: only the head tells them apart.
    await store.move_head("c", "a3", expected_head="b3")
    late = Batch("c", "late", turn("l"), expected_length=6, expected_head="b3")
    with pytest.raises(HistoryChangedError) as caught:
        await store.append(late)
    error = caught.value
    assert (error.expected, error.actual, error.expected_head, error.actual_head) == (
        6,
        6,
        "b3",
        "a3",
    )
    # Length-only fences still work, and say nothing of heads.
    with pytest.raises(HistoryChangedError) as length_only:
        await store.append(Batch("c", "late", turn("l"), expected_length=2))
    assert (length_only.value.actual, length_only.value.actual_head) == (6, None)
    # Before the first batch the head is "".
    await store.move_head("c", "", expected_head="a3")
    with pytest.raises(HistoryChangedError) as empty:
        await store.append(Batch("c", "late", turn("l"), expected_head="a1"))
    assert empty.value.actual_head == ""
    await store.append(Batch("c", "root2", turn("r"), expected_length=0, expected_head=""))
    assert [b.id for b in await store.read_batches("c")] == ["root2"]
    tree = await store.read_tree("c")
    assert tree.parents[-1] == -1


async def test_a_retry_lands_nowhere_whatever_the_head(store: RedisStore) -> None:
    await branched(store)
    # a2 is on the other branch: its retry is the equal receipt, the head stays b3.
    a2 = three()[1]
    assert await store.append(a2) == a2.receipt()
    assert (await store.read_view("c")).head == "b3"
    with pytest.raises(AppendConflictError):
        await store.append(Batch("c", "a2", turn("other")))
    assert len((await store.read_tree("c")).batches) == 5


# -- read_tree --------------------------------------------------------------------------------


async def test_read_tree_holds_every_branch_with_server_times(
    store: RedisStore, admin: Any, cluster: bool
) -> None:
    before = time.time()
    await branched(store)
    after = time.time()
    tree = await store.read_tree("c")
    assert [b.id for b in tree.batches] == ["a1", "a2", "a3", "b2", "b3"]
    assert tree.parents == (-1, 0, 1, 0, 3)
    assert tree.head == 4
    assert tree.closed is False
    assert tree.batches[1] == three()[1]
    created = [c for c in tree.created if c is not None]
    assert len(created) == 5 and created == sorted(created)
    # The server's clock (TIME), not this process's: the same machine here.
    assert before - 5 < created[0] <= created[-1] < after + 5
    assert await store.read_tree("unknown") == HistoryTree((), (), (), -1, False)
    await store.clear("c")
    assert await store.read_tree("c") == HistoryTree((), (), (), -1, True)


async def test_a_corrupt_tree_record_is_a_store_error(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    await branched(store)
    await admin.hset(f"{base(prefix, 'c')}:tree", "3", "nonsense")
    with pytest.raises(
        StoreError, match="conversation 'c' is corrupt: its tree record of batch #4"
    ):
        await store.read_tree("c")
    # The head path reads it too (the run a1 | b2 b3 starts at b2): a StoreError.
    with pytest.raises(StoreError, match="tree record of batch #4 is missing or corrupt"):
        await store.read("c")


# -- move_head ---------------------------------------------------------------------------------


async def test_move_head_order_and_move_records(store: RedisStore, prefix: str, admin: Any) -> None:
    await branched(store)
    # Fence first (after a recorded move id): the head is b3.
    with pytest.raises(HistoryChangedError) as caught:
        await store.move_head("c", "a2", expected_head="a3")
    error = caught.value
    assert (error.expected, error.actual, error.expected_head, error.actual_head) == (
        6,
        6,
        "a3",
        "b3",
    )
    with pytest.raises(UnknownHeadError, match="holds no batch 'nope'"):
        await store.move_head("c", "nope", expected_head="b3")
    # A stale fence beats an unknown target.
    with pytest.raises(HistoryChangedError):
        await store.move_head("c", "nope", expected_head="a1")
    assert await store.move_head("c", "a2", expected_head="b3", move_id="r1") == 4
    # The retry: the recorded move's length, whatever the head or fence is now.
    await store.append(Batch("c", "c3", turn("v3")))
    assert await store.move_head("c", "a2", expected_head="stale", move_id="r1") == 4
    assert (await store.read_view("c")).head == "c3"
    with pytest.raises(AppendConflictError, match=r"move id 'r1'.*'a2'.*'a1'"):
        await store.move_head("c", "a1", expected_head="c3", move_id="r1")
    # Move ids are not append ids: "a1" as a move id is new.
    assert await store.move_head("c", "a1", expected_head="c3", move_id="a1") == 2
    assert await admin.hget(f"{base(prefix, 'c')}:moves", "a1") == b"a1"
    # Refused moves wrote nothing.
    assert await admin.hgetall(f"{base(prefix, 'c')}:moves") == {b"r1": b"a2", b"a1": b"a1"}
    # Closed first of all, move id or not.
    await store.clear("c")
    for move_id in (None, "r1"):
        with pytest.raises(ConversationClosedError):
            await store.move_head("c", "a1", expected_head="a1", move_id=move_id)


async def test_a_move_on_an_empty_conversation_writes_no_tree(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    assert await store.move_head("new", "", expected_head="") == 0
    # As in the in-memory store: nothing to move, so not even a move id is recorded.
    assert await store.move_head("new", "", expected_head="", move_id="m") == 0
    keys = [key async for key in admin.scan_iter(match=f"{prefix}:*")]
    assert [k for k in keys if not k.endswith(b":secret")] == []  # the store secret only
    with pytest.raises(UnknownHeadError):
        await store.move_head("new", "a1", expected_head="")
    assert await store.conversations() == []


@pytest.mark.parametrize(
    ("arguments", "error", "text"),
    [
        (("c", 3, ""), InvalidAppendIDError, r"head must be a str \(an append id or ''\), got int"),
        (("c", " a", ""), InvalidAppendIDError, "^head: "),
        (("c", "a", None), InvalidAppendIDError, "expected_head must be a str .*got NoneType"),
        (("c", "a", "a\n"), InvalidAppendIDError, "^expected_head: "),
        (("", "a", "a"), InvalidConversationIDError, "conversation id"),
    ],
)
async def test_move_head_arguments_are_checked_before_any_io(
    url: str,
    prefix: str,
    cluster: bool,
    arguments: tuple[Any, Any, Any],
    error: type[Exception],
    text: str,
) -> None:
    store = await RedisStore.open(url, prefix=prefix, cluster=cluster, check_persistence=False)
    await store.aclose()  # any I/O would raise StoreError
    cid, head, expected = arguments
    with pytest.raises(error, match=text):
        await store.move_head(cid, head, expected_head=expected)
    with pytest.raises(InvalidAppendIDError, match=r"^move_id: "):
        await store.move_head("c", "a", expected_head="a", move_id="")
    with pytest.raises(InvalidConversationIDError):
        await store.read_tree(" c")


async def test_clear_drops_every_branch(store: RedisStore, prefix: str, admin: Any) -> None:
    await branched(store)
    await store.move_head("c", "a3", expected_head="b3", move_id="m")
    await store.clear("c")
    keys = {key.rsplit(b":", 1)[1] async for key in admin.scan_iter(match=f"{prefix}:{{*")}
    assert keys == {b"closed", b"length"}
    assert await store.read_view("c") == HistoryView((), 6, True)
    with pytest.raises(ConversationClosedError):
        await store.append(three()[0])


# -- written before branches ------------------------------------------------------------------


@pytest.mark.parametrize("length_key", [True, False], ids=["0.2-0.4", "0.1"])
async def test_a_conversation_written_before_branches_reads_appends_and_rewinds(
    store: RedisStore, prefix: str, admin: Any, length_key: bool
) -> None:
    old = three()
    await write_the_old_way(admin, prefix, "c", old, length_key=length_key)
    key = base(prefix, "c")
    # Read as one branch, without a write.
    assert await store.read_batches("c") == old
    view = await store.read_view("c")
    assert (view.length, view.head) == (6, "a3")
    tree = await store.read_tree("c")
    assert (tree.parents, tree.created, tree.head) == ((-1, 0, 1), (None, None, None), 2)
    assert not await admin.exists(f"{key}:tree")
    # The retry of an old batch is still a retry; a fence on the old head holds.
    assert await store.append(old[2]) == old[2].receipt()
    with pytest.raises(HistoryChangedError) as caught:
        await store.append(Batch("c", "a4", turn("t4"), expected_length=6, expected_head="a2"))
    assert caught.value.actual_head == "a3"
    # The first write adopts it as one branch (created unknown), then appends.
    await store.append(Batch("c", "a4", turn("t4"), expected_length=6, expected_head="a3"))
    tree = await store.read_tree("c")
    assert tree.parents == (-1, 0, 1, 2)
    assert tree.created[:3] == (None, None, None) and tree.created[3] is not None
    assert await admin.hget(f"{key}:tree", "1") == b"0 0 4 - a2"
    assert await admin.get(f"{key}:length") == b"8"
    # Rewind to turn 2, then a new turn: the old turns stay on their branch.
    assert await store.move_head("c", "a2", expected_head="a4") == 4
    await store.append(Batch("c", "e3", turn("edit"), expected_length=4, expected_head="a2"))
    assert [b.id for b in await store.read_batches("c")] == ["a1", "a2", "e3"]
    assert (await store.read_tree("c")).parents == (-1, 0, 1, 2, 1)


async def test_a_conversation_written_before_branches_can_be_rewound_first(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    await write_the_old_way(admin, prefix, "c", three())
    assert await store.move_head("c", "a1", expected_head="a3", move_id="r") == 2
    assert [b.id for b in await store.read_batches("c")] == ["a1"]
    assert (await store.read_view("c")).length == 2
    assert await store.move_head("c", "a3", expected_head="a1") == 6
    assert await store.read_batches("c") == three()


async def test_an_old_record_that_cannot_be_counted_is_reported_and_nothing_written(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    await write_the_old_way(admin, prefix, "c", three())
    key = base(prefix, "c")
    await admin.lset(f"{key}:batches", 1, b"no header at all")
    with pytest.raises(StoreError, match=r"conversation 'c' is corrupt: stored batch #2"):
        await store.append(Batch("c", "a4", turn("t4")))
    with pytest.raises(StoreError, match=r"stored batch #2"):
        await store.move_head("c", "a1", expected_head="a3")
    assert await admin.llen(f"{key}:batches") == 3
    assert not await admin.exists(f"{key}:tree", f"{key}:nodes")


async def test_an_interrupted_adoption_is_redone(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    """The adoption writes the head record last: tree records without it (a script cut
    short) read as the old linear history and are written again at the next write."""
    await write_the_old_way(admin, prefix, "c", three())
    key = base(prefix, "c")
    await admin.hset(f"{key}:tree", "0", "garbage")
    assert (await store.read_view("c")).head == "a3"
    await store.append(Batch("c", "a4", turn("t4")))
    assert (await store.read_tree("c")).parents == (-1, 0, 1, 2)


# -- costs (one server's commands, seen by MONITOR) -------------------------------------------


def start_server(port: int, where: Path) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``port`` without persistence."""
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
    command += ["--save", "", "--appendonly", "no", "--dir", str(where)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


@pytest.fixture
async def private_url(tmp_path: Path) -> AsyncIterator[str]:
    """A Redis server of this test's own (no persistence), so MONITOR sees this test's
    commands only (the shared server's other traffic can hold lines longer than the
    client's reader takes)."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH")
    [port] = _free_ports(1)
    process = start_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = aioredis.Redis.from_url(url)
        try:
            for _ in range(100):
                try:
                    await client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()
        yield url
    finally:
        process.kill()
        process.wait()


@pytest.fixture
async def private(private_url: str) -> AsyncIterator[RedisStore]:
    async with await RedisStore.open(private_url, check_persistence=False) as store:
        yield store


async def commands_of(
    store: RedisStore, url: str, cid: str, step: Callable[[], Awaitable[Any]]
) -> list[list[str]]:
    """The commands (name and arguments) scripts run on ``cid``'s keys while ``step``
    runs, as MONITOR reports them."""
    keys = base(store.prefix, cid)
    client = aioredis.Redis.from_url(url)
    sentinel = f"end-{uuid.uuid4().hex}"
    seen: list[list[str]] = []
    try:
        async with client.monitor() as monitor:
            await step()
            await client.echo(sentinel)
            while True:
                command = await asyncio.wait_for(monitor.next_command(), 10)
                text = command["command"]
                if sentinel in text:
                    break
                if keys in text and command.get("client_type") == "lua":
                    seen.append(text.split(" "))
    finally:
        await client.aclose()
    return seen


def names(commands: list[list[str]]) -> list[str]:
    return [command[0].upper() for command in commands]


async def test_a_linear_history_reads_with_one_range(
    private: RedisStore, private_url: str, cluster: bool
) -> None:
    if cluster:
        pytest.skip("one server's MONITOR (run once)")
    store, url = private, private_url
    for n in range(6):
        await store.append(Batch("c", f"a{n}", turn(f"t{n}")))
    for read in (store.read, store.read_batches, store.read_view):
        seen = await commands_of(store, url, "c", lambda read=read: read("c"))  # type: ignore[misc]
        ranges = [c for c in seen if c[0].upper() == "LRANGE"]
        assert [c[2:] for c in ranges] == [["0", "5"]], seen
        assert "LINDEX" not in names(seen)
    # After a rewind on a linear history the head path is still a prefix: one range.
    await store.move_head("c", "a2", expected_head="a5")
    seen = await commands_of(store, url, "c", lambda: store.read("c"))
    assert [c[2:] for c in seen if c[0].upper() == "LRANGE"] == [["0", "2"]]


async def test_a_branched_path_reads_its_runs_only(
    private: RedisStore, private_url: str, cluster: bool
) -> None:
    if cluster:
        pytest.skip("one server's MONITOR (run once)")
    store, url = private, private_url
    await branched(store)  # positions 0 (a1), 3 (b2), 4 (b3) on the path; 1, 2 off it
    seen = await commands_of(store, url, "c", lambda: store.read_view("c"))
    assert [c[2:] for c in seen if c[0].upper() == "LRANGE"] == [["0", "0"], ["3", "4"]]


async def test_an_append_costs_the_same_on_a_branch(
    private: RedisStore, private_url: str, cluster: bool
) -> None:
    if cluster:
        pytest.skip("one server's MONITOR (run once)")
    store, url = private, private_url
    for n in range(8):
        await store.append(Batch("linear", f"a{n}", turn(f"t{n}")))
        await store.append(Batch("branched", f"a{n}", turn(f"t{n}")))
    await store.move_head("branched", "a1", expected_head="a7")
    await store.append(Batch("branched", "b2", turn("u")))

    async def cost(cid: str, aid: str) -> list[str]:
        head = (await store.read_view(cid)).head
        batch = Batch(cid, aid, turn("x"), expected_head=head)
        return names(await commands_of(store, url, cid, lambda: store.append(batch)))

    linear = await cost("linear", "z")
    assert linear == await cost("branched", "z")
    assert "LRANGE" not in linear and "HGETALL" not in linear
    # A move reads no message either: the path length is in the target's record.
    seen = await commands_of(
        store, url, "branched", lambda: store.move_head("branched", "a5", expected_head="z")
    )
    assert "LRANGE" not in names(seen) and "LINDEX" not in names(seen)


# -- races and cancellation ------------------------------------------------------------------


async def test_a_rewind_racing_a_turn_exactly_one_wins(
    url: str, prefix: str, cluster: bool
) -> None:
    stores = [
        await RedisStore.open(url, prefix=prefix, cluster=cluster, check_persistence=False)
        for _ in range(2)
    ]
    try:
        for round_ in range(20):
            cid = f"race{round_}"
            for batch in three(cid):
                await stores[0].append(batch)
            turn_batch = Batch(cid, "next", turn("n"), expected_length=6, expected_head="a3")
            results = await asyncio.gather(
                stores[0].append(turn_batch),
                stores[1].move_head(cid, "a1", expected_head="a3", move_id="rw"),
                return_exceptions=True,
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            assert len(failures) == 1 and isinstance(failures[0], HistoryChangedError), results
            view = await stores[0].read_view(cid)
            assert view.head == ("a1" if failures[0] is results[0] else "next")
    finally:
        for store in stores:
            await store.aclose()


async def test_concurrent_retries_of_one_move_move_once(store: RedisStore) -> None:
    await branched(store)
    lengths = await asyncio.gather(
        *(store.move_head("c", "a3", expected_head="b3", move_id="once") for _ in range(20))
    )
    assert lengths == [6] * 20
    assert (await store.read_view("c")).head == "a3"


async def test_a_cancelled_move_is_all_or_nothing_and_its_retry_resolves_it(
    store: RedisStore,
) -> None:
    rng = random.Random(3)
    await branched(store)
    targets = ["a1", "a2", "a3", "b2", "b3", ""]
    cancelled = n = 0
    while cancelled < 20:  # cancelled while running, not before or after
        n += 1
        assert n < 2000, "too few moves were cancelled while running"
        view = await store.read_view("c")
        target = rng.choice(targets)
        move_id = f"m{n}"
        task = asyncio.ensure_future(
            store.move_head("c", target, expected_head=view.head, move_id=move_id)
        )
        await asyncio.sleep(rng.random() * 0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        # Moved or not, never half: the head and length agree, and the retry settles it.
        now = await store.read_view("c")
        assert now.head in (view.head, target)
        assert now.length == sum(len(b) for b in await store.read_batches("c"))
        assert await store.move_head("c", target, expected_head=view.head, move_id=move_id) == sum(
            len(b) for b in await store.read_batches("c")
        )
        assert (await store.read_view("c")).head == target


# -- scripts by SHA1 -------------------------------------------------------------------------


async def test_a_script_the_server_does_not_hold_is_loaded_and_run_once(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    """Scripts run with EVALSHA; on NOSCRIPT (a new, restarted or flushed server) the
    script is loaded and run then, once."""
    from scope.historystores.redis import _run

    key = f"{prefix}:{{t}}:n"
    script = f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', KEYS[1])"
    sha = hashlib.sha1(script.encode()).hexdigest()
    assert await admin.script_exists(sha) == [False]
    assert await _run(store._client, script, 1, key) == 1
    assert await _run(store._client, script, 1, key) == 2
    assert await admin.get(key) == b"2"


async def test_the_adoption_counts_the_deepest_messages_scope_writes(
    store: RedisStore, prefix: str, admin: Any
) -> None:
    """cjson (inside the adoption script) decodes the deepest JSON a message may hold:
    metadata nested 512 levels (RawJSON's limit), inside the message's own levels."""
    from scope.chat import Message, Part, Role

    deep = Part("text", text="deep", metadata={"k": nested(512)})
    old = [Batch("c", "a1", [Message(Role.USER, [deep]), *turn("t")[1:]]), three()[1]]
    await write_the_old_way(admin, prefix, "c", old)
    assert await store.move_head("c", "a1", expected_head="a2") == 2
    assert await store.read_batches("c") == old[:1]


# -- scope.history's branch functions on Redis --------------------------------------------------


async def test_rewind_branches_switch_and_fork_on_redis(store: RedisStore) -> None:
    from scope.history import branches, fork, rewind, switch

    for batch in three():
        await store.append(batch)
    assert await rewind(store, "c", to=1, rewind_id="r1") == 2
    assert await rewind(store, "c", to=1, rewind_id="r1") == 2  # the retry
    await store.append(Batch("c", "b2", turn("u2"), expected_length=2, expected_head="a1"))
    listed = await branches(store, "c")
    assert [(b.head and b.head.id, b.turns, b.current, b.diverges_at) for b in listed] == [
        ("a3", 3, False, 2),
        ("b2", 2, True, None),
    ]
    assert all(b.created is not None for b in listed)
    assert await switch(store, "c", listed[0].head) == 6  # type: ignore[arg-type]
    receipts = await fork(store, "c", at=2, new_id="copy")
    assert [r.id for r in receipts] == ["a1", "a2"]
    assert await store.read_batches("copy") == three("copy")[:2]
    await store.clear("copy")
    assert [b.id for b in await store.read_batches("c")] == ["a1", "a2", "a3"]
