"""Per-call and per-chunk overhead of the history Middleware, and how it grows with the
conversation.

Side by side in one run, best of 9 in three interleaved passes (cyclic GC off while
timing, as ``timeit`` does), in-memory store:

- ``call`` over a no-op model with 10 and with 100 stored turns, against a hand-written
  baseline that does the least a history layer can: read the conversation, build the
  downstream ``Request`` (validated, as any ``Request``), call the model, build the
  ``Batch`` and append it. Each measured call commits one turn on its own store seeded
  with the stored turns (seeding untimed).
  - *warm*: every store is seeded with the same ``Batch`` objects and its cache keeps
    the replay an earlier turn checked (untimed), as a long-lived store handle sees it
    (the in-memory store, or a persistent store's decoded cache);
  - *cold*: freshly decoded message objects on every call and an empty cache: what the
    first turn after a restart costs.
- ``stream``: 200 text chunks, the bare stream drained by ``collect`` against the same
  behind the Middleware; the difference per chunk is the Middleware's.

Run: ``python benchmarks/bench_middleware.py``
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio

from scope.chat import (
    FinishReason,
    Output,
    Request,
    Response,
    ResponseMetadata,
    Usage,
    assistant_message,
    collect,
    system_message,
    user_message,
)
from scope.codec import from_json, to_json
from scope.history import Batch, Middleware
from scope.history.inmemory import InMemoryStore

ANSWER = Response(
    Output(assistant_message("the answer " * 20), FinishReason.STOP),
    ResponseMetadata(id="r", model="m", usage=Usage(100, 40)),
)
CHUNKS = [Response(Output(assistant_message(f"tok{i} "))) for i in range(199)] + [
    Response(Output(finish_reason=FinishReason.STOP), ResponseMetadata(usage=Usage(100, 200)))
]
SYSTEM = system_message("Be brief.")
REQUEST = Request([SYSTEM, user_message("what now?")])


class Bare:
    async def call(self, request: Request) -> Response:
        return ANSWER

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Response]:
        for chunk in CHUNKS:
            yield chunk


def seed_batches(turns: int) -> list[Batch]:
    return [
        Batch(
            "bench",
            f"seed-{turn}",
            [user_message(f"question {turn}"), assistant_message(f"answer {turn} " * 10)],
        )
        for turn in range(turns)
    ]


def decoded_again(batches: list[Batch]) -> list[Batch]:
    """The same batches with freshly decoded message objects (a cold read)."""
    return [
        Batch(b.conversation_id, b.id, [from_json(to_json(m), type(m)) for m in b.messages])
        for b in batches
    ]


async def seeded(batches: list[Batch]) -> InMemoryStore:
    store = InMemoryStore()
    for batch in batches:
        await store.append(batch)
    return store


async def best_of(
    fn: Callable[[InMemoryStore], Awaitable[None]],
    make: Callable[[], Awaitable[InMemoryStore]],
    repeats: int,
    inner: int,
    before_each: Callable[[], None] | None = None,
) -> float:
    """Best mean seconds per call; each call gets its own store from ``make()``."""
    best = float("inf")
    for _ in range(repeats):
        stores = [await make() for _ in range(inner)]
        elapsed = 0.0
        gc.collect()
        gc.disable()  # as timeit does: a collection landing in one case is noise
        try:
            for store in stores:
                if before_each is not None:
                    before_each()
                start = time.perf_counter()
                await fn(store)
                elapsed += time.perf_counter() - start
        finally:
            gc.enable()
        best = min(best, elapsed / inner)
    return best


async def main() -> None:
    bare = Bare()
    counter = iter(range(10**9))

    async def baseline(store: InMemoryStore) -> None:
        stored = await store.read("bench")
        request = Request([SYSTEM, *stored, user_message("what now?")])
        response = await bare.call(request)
        assert response.output is not None and response.output.message is not None
        turn = [request.messages[-1], response.output.message]
        await store.append(Batch("bench", f"b{next(counter)}", turn))

    async def middleware(store: InMemoryStore) -> None:
        await Middleware(store, store, "bench").call(bare).call(REQUEST)

    print(f"{'call over a no-op model':52} {'per call':>10} {'ratio':>22}")
    calls: dict[tuple[str, int], float] = {}
    for turns in (10, 100):
        warm = seed_batches(turns)
        cold_sets = [decoded_again(warm) for _ in range(4)]
        cycle = iter(range(10**9))

        async def warm_store(warm: list[Batch] = warm) -> InMemoryStore:
            # Warm: this handle's cache keeps the replay an earlier turn checked.
            store = await seeded(warm)
            store.history_cache.replay("bench", await store.read("bench"))
            return store

        async def cold_store(
            cold_sets: list[list[Batch]] = cold_sets, cycle: Iterator[int] = cycle
        ) -> InMemoryStore:
            return await seeded(cold_sets[next(cycle) % len(cold_sets)])

        inner = 300 if turns == 10 else 100
        base = hot = cold = float("inf")
        for _ in range(3):  # the three cases interleaved, so a slow phase hits all of them
            base = min(base, await best_of(baseline, warm_store, 3, inner))
            hot = min(hot, await best_of(middleware, warm_store, 3, inner))
            cold = min(cold, await best_of(middleware, cold_store, 3, inner))
        calls[("base", turns)], calls[("warm", turns)], calls[("cold", turns)] = base, hot, cold
        print(
            f"{turns:>3} turns: baseline (read + Request + Batch + append){'':<2}"
            f"{base * 1e6:8.1f}us {'1.00x':>22}"
        )
        print(
            f"{turns:>3} turns: history Middleware, warm{'':<19}{hot * 1e6:8.1f}us "
            f"{hot / base:>10.2f}x of baseline"
        )
        print(
            f"{turns:>3} turns: history Middleware, cold{'':<19}{cold * 1e6:8.1f}us "
            f"{cold / base:>10.2f}x of baseline"
        )
    for kind in ("base", "warm", "cold"):
        print(f"100-turn / 10-turn cost, {kind:5}: {calls[(kind, 100)] / calls[(kind, 10)]:5.2f}x")

    turns10 = seed_batches(10)

    async def store10() -> InMemoryStore:
        return await seeded(turns10)

    async def bare_stream(store: InMemoryStore) -> None:
        await collect(bare.stream(REQUEST))

    async def mw_stream(store: InMemoryStore) -> None:
        await collect(Middleware(store, store, "bench").stream(bare).stream(REQUEST))

    plain = await best_of(bare_stream, store10, 5, 100)
    wrapped = await best_of(mw_stream, store10, 5, 50)
    call10 = calls[("warm", 10)]
    per_chunk = (wrapped - plain - call10) / len(CHUNKS)
    print()
    print(f"stream {len(CHUNKS)} chunks: bare + collect          {plain * 1e6:9.1f}us")
    print(
        f"stream {len(CHUNKS)} chunks: + history Middleware    {wrapped * 1e6:9.1f}us "
        f"({wrapped / plain:.2f}x)"
    )
    print(f"middleware per chunk (less one warm 10-turn call): {per_chunk * 1e6:6.2f}us")


if __name__ == "__main__":
    anyio.run(main)
