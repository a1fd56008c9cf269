"""A Redis store that received tombstones by import against one that did not.

``restore_erasures`` (an export with erasures imported into the store) puts tombstones
in a set of their own: a tombstone does not name its conversation, so not the hash slot
its scripts read, and a handle checks that set for a conversation before the step's
script. This measures what that costs per step: a plain store and one holding one
imported tombstone, alternated over rounds of 30 appends and 30 ``read_view``s on a new
conversation each; medians of each round, then the median over rounds of each side and
of the ratio imported / plain. Redis from SCOPE_TEST_REDIS_URL
(``eval "$(bash .ci/services.sh start)"``); with SCOPE_TEST_REDIS_CLUSTER_URL set, the
same on the Redis Cluster.

Run: ``python benchmarks/bench_redis_imported.py [--rounds N]``
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scope.chat import assistant_message, user_message
from scope.history import Batch
from scope.historystores.redis import RedisStore

USER = "What is the capital of France, and why is it famous? " * 2
ASSISTANT = "Paris. It is known for art, food, history and the Eiffel Tower. " * 3
MESSAGES = (user_message(USER), assistant_message(ASSISTANT))
STEPS = 30
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20


async def measure(name: str, url: str, cluster: bool) -> None:
    prefixes = [f"scope-bench:{uuid.uuid4().hex[:8]}" for _ in range(3)]
    opened: list[RedisStore] = []

    async def open_store(prefix: str) -> RedisStore:
        store = await RedisStore.open(url, prefix=prefix, cluster=cluster, check_persistence=False)
        opened.append(store)
        return store

    try:
        source = await open_store(prefixes[0])
        await source.append(Batch("gone", "a1", MESSAGES))
        await source.erase("gone")
        target = await open_store(prefixes[2])
        await target.restore_erasures(await source.store_secret(), await source.tombstones())
        stores = {
            "plain": await open_store(prefixes[1]),
            "imported": await open_store(prefixes[2]),  # opened after the import
        }
        medians: dict[tuple[str, str], list[float]] = {}
        for round_ in range(ROUNDS):
            for side, store in stores.items():
                cid = f"c{round_}"
                appends, views = [], []
                for step in range(STEPS):
                    batch = Batch(cid, uuid.uuid4().hex, MESSAGES, expected_length=2 * step)
                    start = time.perf_counter()
                    await store.append(batch)
                    appends.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    await store.read_view(cid)
                    views.append(time.perf_counter() - start)
                medians.setdefault((side, "append"), []).append(statistics.median(appends))
                medians.setdefault((side, "read_view"), []).append(statistics.median(views))
        print(f"== {name} ({ROUNDS} rounds x {STEPS} steps each)")
        for step in ("append", "read_view"):
            plain, imported = medians[("plain", step)], medians[("imported", step)]
            ratio = statistics.median(b / a for a, b in zip(plain, imported, strict=True))
            print(
                f"{step:10} plain {statistics.median(plain) * 1e6:7.1f} us   imported "
                f"{statistics.median(imported) * 1e6:7.1f} us   imported/plain {ratio:.2f}x"
            )
    finally:
        if opened:
            client = opened[0]._client
            for prefix in prefixes:
                async for key in client.scan_iter(match=f"{prefix}*", count=1000):
                    await client.delete(key)
        for store in opened:
            await store.aclose()


async def main() -> None:
    url = os.environ.get("SCOPE_TEST_REDIS_URL")
    if not url:
        sys.exit('set SCOPE_TEST_REDIS_URL (eval "$(bash .ci/services.sh start)")')
    await measure("Redis", url, cluster=False)
    cluster_url = os.environ.get("SCOPE_TEST_REDIS_CLUSTER_URL")
    if cluster_url:
        await measure("Redis Cluster", cluster_url, cluster=True)


if __name__ == "__main__":
    anyio.run(main)
