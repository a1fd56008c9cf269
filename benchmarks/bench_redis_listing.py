"""``RedisStore.conversations()`` against a raw ``ZRANGE`` of the same listing.

10,000 open conversations (one batch each, written through the store), then 10,000
more that are written and cleared: the listing must cost the same before and after (the
clear takes the id out of the listing in the same script). Best of 5, side by side, one
Redis from SCOPE_TEST_REDIS_URL (``eval "$(bash .ci/services.sh start)"``); with
SCOPE_TEST_REDIS_CLUSTER_URL set, the same on the Redis Cluster (where the listing is
kept beside the scripts and each listed id's closure is checked).

Run: ``python benchmarks/bench_redis_listing.py``
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _listing import best_of, fill

from scope.historystores.redis import RedisStore

OPEN, CLEARED = 10_000, 10_000


async def measure(name: str, url: str, cluster: bool) -> None:
    prefix = f"scope-bench:{uuid.uuid4().hex[:8]}"
    store = await RedisStore.open(url, prefix=prefix, cluster=cluster, check_persistence=False)
    client = store._client
    listing = f"{prefix}:conversations"
    try:
        await fill(store, [f"open-{i:05d}" for i in range(OPEN)], clear=False)
        await store.conversations()  # the one-time listing check

        async def scope_listing() -> None:
            assert len(await store.conversations()) == OPEN

        async def raw_zrange() -> None:
            members = await client.zrange(listing, 0, -1)
            assert len([bytes(m).decode() for m in members]) == OPEN

        raw = await best_of(5, raw_zrange)
        ours = await best_of(5, scope_listing)
        await fill(store, [f"gone-{i:05d}" for i in range(CLEARED)], clear=True)
        after = await best_of(5, scope_listing)
        print(
            f"{name:14} raw ZRANGE {raw * 1e3:7.1f} ms | conversations() {ours * 1e3:7.1f} ms "
            f"({ours / raw:4.2f}x) | after {CLEARED:,} cleared {after * 1e3:7.1f} ms "
            f"({after / raw:4.2f}x)"
        )
    finally:
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            await client.delete(key)
        await store.aclose()


async def main() -> None:
    print(f"{OPEN:,} open conversations, best of 5")
    url = os.environ.get("SCOPE_TEST_REDIS_URL")
    if url:
        await measure("Redis", url, cluster=False)
    else:
        print("Redis          skipped: SCOPE_TEST_REDIS_URL not set")
    cluster_url = os.environ.get("SCOPE_TEST_REDIS_CLUSTER_URL")
    if cluster_url:
        await measure("Redis Cluster", cluster_url, cluster=True)
    else:
        print("Redis Cluster  skipped: SCOPE_TEST_REDIS_CLUSTER_URL not set")


if __name__ == "__main__":
    anyio.run(main)
