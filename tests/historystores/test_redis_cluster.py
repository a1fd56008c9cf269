"""RedisStore on a real Redis Cluster (three masters on loopback, started by
``.ci/services.sh``): the whole store conformance suite with ``cluster=True``, plus the
cluster's own listing rules. asyncio only (redis-py's client is asyncio-only).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scope.errors import StoreError
from scope.history import Batch
from scope.history.storetest import StoreConformance
from scope.historystores.redis import RedisStore
from tests.helpers import turn
from tests.servers import (
    PrivateCluster,
    drop_keys,
    import_driver,
    redis_cluster_url_or_skip,
    unique_key_prefix,
)

import_driver("redis")
from redis.asyncio.cluster import RedisCluster  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.servers]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def url() -> str:
    return redis_cluster_url_or_skip()


@pytest.fixture
async def admin(url: str) -> AsyncIterator[Any]:
    client = RedisCluster.from_url(url)
    await client.initialize()
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(url: str) -> AsyncIterator[str]:
    prefix = unique_key_prefix()
    yield prefix
    await drop_keys(url, prefix, cluster=True)


async def open_cluster(url: str, prefix: str) -> RedisStore:
    # The test cluster runs without persistence on purpose; the check is tested below.
    return await RedisStore.open(url, prefix=prefix, cluster=True, check_persistence=False)


class TestRedisClusterConformance(StoreConformance):
    @pytest.fixture
    async def store(self, url: str, prefix: str) -> AsyncIterator[RedisStore]:
        async with await open_cluster(url, prefix) as store:
            yield store

    async def reopen(self, store: Any) -> Any:
        return await open_cluster(self.url, store.prefix)

    @pytest.fixture(autouse=True)
    async def _places(self, url: str, prefix: str) -> AsyncIterator[None]:
        self.url, self.prefix = url, prefix
        yield
        await drop_keys(url, f"{prefix}-r", cluster=True)

    async def open_store(self, *, retention: Any = None) -> Any:
        return await RedisStore.open(
            self.url,
            prefix=f"{self.prefix}-r",
            cluster=True,
            check_persistence=False,
            retention=retention,
        )


async def test_conversations_spread_over_every_master(url: str, prefix: str, admin: Any) -> None:
    async with await open_cluster(url, prefix) as store:
        assert store.cluster is True
        ids = [f"conv-{i}" for i in range(30)]
        for cid in ids:
            await store.append(Batch(cid, "a1", turn(cid)))
        slots = {RedisCluster.keyslot(admin, store._keys(cid)[2]) for cid in ids}
        nodes = {admin.get_node_from_key(store._keys(cid)[2]).name for cid in ids}
        assert len(nodes) == 3, "the test conversations should land on every master"
        assert len(slots) > 10
        assert await store.conversations() == sorted(ids)


async def test_a_closed_id_left_in_the_listing_is_dropped(
    url: str, prefix: str, admin: Any
) -> None:
    async with await open_cluster(url, prefix) as store:
        await store.append(Batch("kept", "a1", turn("k")))
        await store.append(Batch("gone", "a1", turn("g")))
        await store.clear("gone")
        # A clear that died between its script and the listing update (another slot).
        await admin.zadd(f"{prefix}:conversations", {"gone": 0})
        assert await store.conversations() == ["kept"]
        assert await admin.zrange(f"{prefix}:conversations", 0, -1) == [b"kept"]


async def test_listing_checks_the_closure_of_cleared_ids_only(
    url: str, prefix: str, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing page comes with one script; the closure of an id is only checked when a
    clear started on it (in the cleared set beside the listing), not per listed id."""
    import scope.historystores.redis as module

    checked: list[list[str]] = []
    real = module._exists_each

    async def counting(client: Any, keys: list[str]) -> list[Any]:
        checked.append(keys)
        return await real(client, keys)

    monkeypatch.setattr(module, "_exists_each", counting)
    async with await open_cluster(url, prefix) as store:
        assert await store.conversations() == []  # the handle's one-time listing check
        for cid in ("a", "b", "c"):
            await store.append(Batch(cid, "a1", turn(cid)))
        await store.clear("b")
        assert await store.conversations() == ["a", "c"]
        assert checked == []  # nothing listed was ever cleared
        # A clear that died before unlisting: its id is in the cleared set, so checked.
        await admin.zadd(f"{prefix}:conversations", {"b": 0})
        assert await store.conversations() == ["a", "c"]
        assert checked == [[store._keys("b")[0]]]


async def test_persistence_is_checked_on_every_master(url: str, prefix: str) -> None:
    from scope.errors import ScopeWarning, StoreError

    with pytest.warns(ScopeWarning, match="Redis Cluster masters .* do not run AOF"):
        store = await RedisStore.open(url, prefix=prefix, cluster=True)
    await store.aclose()
    with pytest.raises(StoreError, match="require_durable"):
        await RedisStore.open(url, prefix=prefix, cluster=True, require_durable=True)


async def test_open_store_takes_a_cluster_url(url: str, prefix: str) -> None:
    import warnings

    from scope.errors import ScopeWarning
    from scope.historystores import open_store

    cluster_url = "redis+cluster://" + url.removeprefix("redis://")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScopeWarning)  # the test cluster is volatile
        store = await open_store(cluster_url, prefix=prefix)
    try:
        assert isinstance(store, RedisStore) and store.cluster is True
        await store.append(Batch("c", "a1", turn("c")))
        assert await store.conversations() == ["c"]
    finally:
        await store.aclose()


async def test_scan_records_reads_every_slot(url: str, prefix: str) -> None:
    """scan_records on a cluster: conversations in many hash slots, paged, each record
    as stored and sound."""
    store = await open_cluster(url, prefix)
    try:
        ids = [f"conv-{n}" for n in range(6)]
        for cid in ids:
            await store.append(Batch(cid, "a1", turn(cid)))
            await store.append(Batch(cid, "a2", turn(cid + "!")))
        records = [r async for r in store.scan_records(page_size=4)]
        assert [(r.conversation_id, r.append_id) for r in records] == [
            (cid, aid) for cid in ids for aid in ("a1", "a2")
        ]
        assert all(r.problem() is None for r in records)
    finally:
        await store.aclose()


async def test_every_failure_while_a_node_is_killed_and_restarted_is_a_store_error(
    tmp_path: Path,
) -> None:
    """Appends from many tasks while a master of a private cluster is killed and
    restarted: each lands or raises ``StoreError``. redis-py's cluster client raised
    ``AttributeError`` ('NoneType' object has no attribute 'writelines') from its
    connection code here, dozens of times a run, before scope mapped it.

    While the topology changes, redis-py drops ``ClusterNode`` objects of its own (nodes
    it asked for the slot map, nodes it replaced) with connections still open; nothing
    outside the client can reach them to close them, and ``RedisStore.aclose()`` closes
    every node the client still holds. Their ``ResourceWarning`` (the node's, its
    connections', their stream writers') is ignored here, and only here: they are
    collected before the test ends so that none is reported by a later test. Elsewhere
    an unclosed client or connection of scope's is still an error."""
    with warnings.catch_warnings():
        # The dropped nodes, and their connections and stream writers.
        warnings.filterwarnings("ignore", category=ResourceWarning)
        await _appends_across_a_restarted_node(tmp_path)
        gc.collect()


async def _appends_across_a_restarted_node(tmp_path: Path) -> None:
    async with PrivateCluster(tmp_path) as cluster:
        store = await RedisStore.open(
            cluster.url, cluster=True, check_persistence=False, socket_timeout=2.0
        )
        failures: list[BaseException] = []
        landed = [0]
        stop = asyncio.Event()

        async def appender(worker: int) -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                try:
                    await store.append(Batch(f"c{worker}-{n % 50}", f"a{n}", turn(str(n))))
                    landed[0] += 1
                except StoreError:
                    await asyncio.sleep(0.01)
                except Exception as exc:  # what this test is for: nothing else escapes
                    failures.append(exc)
                    await asyncio.sleep(0.01)

        async with store:
            tasks = [asyncio.ensure_future(appender(worker)) for worker in range(20)]
            try:
                for _ in range(3):
                    await asyncio.sleep(0.7)
                    cluster.kill(cluster.ports[1])
                    await asyncio.sleep(0.7)
                    cluster.start(cluster.ports[1])
                    await asyncio.sleep(1.0)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
        assert not failures, [f"{type(e).__name__}: {e}" for e in failures[:5]]
        assert landed[0] > 0
