"""History core: Batch construction + digest, and in-memory store throughput.

Batch rows use the standard 8-message turn (``benchmarks/_turn.py``). Their floor is the
least any canonical digest can cost: ``orjson.dumps`` of the same messages as plain,
pre-built dicts (sorted keys) plus sha256 - no validation, no value classes.

Store rows run on a fresh ``scope.history.inmemory.InMemoryStore`` under asyncio; their
floor is the bare work of an in-memory append (a dict lookup and ``list.extend`` under a
``threading.Lock``), so the ratio is the cost of the store contract and the async call.

Run: ``python benchmarks/bench_history.py``
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import orjson
from _turn import standard_turn

from scope.codec import encode_messages, to_builtins
from scope.history import Batch
from scope.history.inmemory import InMemoryStore

REPEATS = 7


def best_of(fn: Callable[[], Any], inner: int) -> float:
    """Seconds per call, best of ``REPEATS`` runs of ``inner`` calls."""
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


async def abest_of(fn: Callable[[int], Awaitable[Any]], inner: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(inner):
            await fn(i)
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def table(title: str, groups: list[list[tuple[str, float]]]) -> None:
    """Each group starts with its floor; ratios are to that floor."""
    print(title)
    print(f"{'case':52} {'per op':>12} {'ops/s':>12} {'ratio':>8}")
    for rows in groups:
        floor = rows[0][1]
        for name, seconds in rows:
            ratio = seconds / floor
            print(f"{name:52} {seconds * 1e6:10.2f}us {1 / seconds:12,.0f} {ratio:7.2f}x")
    print()


def bench_batches() -> None:
    messages = standard_turn()
    plain = [to_builtins(m) for m in messages]
    encoded = encode_messages(messages)
    # The floor writes the same document except number spellings inside RawJSON (plain
    # floats lose them: 21.50 becomes 21.5), so its size is within a few bytes.
    assert abs(len(orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)) - len(encoded)) < 16
    batch = Batch("bench", "a1", messages)
    data = batch.to_json()

    def floor() -> None:
        hashlib.sha256(orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def decode_floor() -> None:
        tree = orjson.loads(data)
        digest = hashlib.sha256(orjson.dumps(tree["messages"], option=orjson.OPT_SORT_KEYS))
        _ = "sha256:" + digest.hexdigest() == tree["digest"]

    inner = 2000
    encode_side = [
        ("floor: orjson(plain dicts, sorted) + sha256", best_of(floor, inner)),
        (
            "encode_messages (canonical array only)",
            best_of(lambda: encode_messages(messages), inner),
        ),
        (
            "Batch(cid, id, messages): validate + digest",
            best_of(lambda: Batch("bench", "a1", messages), inner),
        ),
        ("Batch.to_json", best_of(batch.to_json, inner)),
    ]
    decode_side = [
        ("floor: orjson.loads + orjson.dumps + sha256", best_of(decode_floor, inner)),
        (
            "Batch.from_json: exact decode + re-digest + check",
            best_of(lambda: Batch.from_json(data), 200),
        ),
    ]
    size = len(encoded)
    table(
        f"Batch of the standard turn (8 messages, {size:,} canonical bytes)",
        [encode_side, decode_side],
    )


async def bench_store() -> None:
    messages = standard_turn()
    batches = [Batch("bench", f"a{i}", messages) for i in range(2000)]
    lock = threading.Lock()
    plain_store: dict[str, list[Any]] = {}
    seen: dict[str, str] = {}

    def append_floor() -> None:
        with lock:
            if batches[0].id not in seen:
                seen[batches[0].id] = batches[0].digest
            plain_store.setdefault("bench", []).extend(batches[0].messages)

    append_floor_s = best_of(append_floor, 2000)
    plain_store.clear()
    plain_800 = [m for b in batches[:100] for m in b.messages]
    plain_names = {f"conv-{i:04}": None for i in range(1000)}

    def read_floor() -> None:
        with lock:
            list(plain_800)

    def list_floor() -> None:
        with lock:
            sorted(plain_names)

    stores: list[InMemoryStore] = []

    async def append_new(i: int) -> None:
        if i == 0:
            stores.append(InMemoryStore())
        await stores[-1].append(batches[i])

    retry_store = InMemoryStore()
    await retry_store.append(batches[0])

    async def append_retry(i: int) -> None:
        await retry_store.append(batches[0])

    read_store = InMemoryStore()
    for b in batches[:100]:
        await read_store.append(b)

    async def read_800(i: int) -> None:
        await read_store.read("bench")

    many = InMemoryStore()
    for i in range(1000):
        await many.append(Batch(f"conv-{i:04}", "a1", messages[:2]))

    async def list_1000(i: int) -> None:
        await many.conversations()

    groups = [
        [
            ("floor: lock + dict check + list.extend", append_floor_s),
            ("append a new 8-message batch (store grows)", await abest_of(append_new, 2000)),
            ("append a retry of an accepted batch (dedupe)", await abest_of(append_retry, 2000)),
        ],
        [
            ("floor: lock + copy a list of 800", best_of(read_floor, 2000)),
            ("read 800 messages (100 batches)", await abest_of(read_800, 2000)),
        ],
        [
            ("floor: lock + sorted() of 1000 names", best_of(list_floor, 200)),
            ("conversations() over 1000 conversations", await abest_of(list_1000, 200)),
        ],
    ]
    table("In-memory store (asyncio)", groups)


def main() -> None:
    bench_batches()
    anyio.run(bench_store)


if __name__ == "__main__":
    main()
