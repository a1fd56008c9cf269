"""Per-call overhead of the history Middleware over the bare model.

The in-memory store holds 10 stored turns; each measured call replays them and commits
one more turn (on a fresh copy of the store, so the history does not grow). Measured
side by side in one run: the bare model, the model behind the Middleware; for ``call``
and for a 200-chunk stream.

Run: ``python benchmarks/bench_middleware.py``
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

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
    user_message,
)
from scope.history import Batch, Middleware
from scope.history.inmemory import Store

ANSWER = Response(
    Output(assistant_message("the answer " * 20), FinishReason.STOP),
    ResponseMetadata(id="r", model="m", usage=Usage(100, 40)),
)
CHUNKS = [Response(Output(assistant_message(f"tok{i} "))) for i in range(199)] + [
    Response(Output(finish_reason=FinishReason.STOP), ResponseMetadata(usage=Usage(100, 200)))
]


class Bare:
    async def call(self, request: Request) -> Response:
        return ANSWER

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Response]:
        for chunk in CHUNKS:
            yield chunk


async def seeded_store() -> Store:
    store = Store()
    for turn in range(10):
        await store.append(
            Batch(
                "bench",
                f"seed-{turn}",
                [user_message(f"question {turn}"), assistant_message(f"answer {turn} " * 10)],
            )
        )
    return store


async def best_of(fn: Callable[[Store], Awaitable[None]], repeats: int, inner: int) -> float:
    """Best mean seconds per call; each call gets its own freshly seeded store."""
    best = float("inf")
    for _ in range(repeats):
        stores = [await seeded_store() for _ in range(inner)]
        start = time.perf_counter()
        for store in stores:
            await fn(store)
        best = min(best, (time.perf_counter() - start) / inner)
    return best


async def main() -> None:
    bare = Bare()
    request = Request([user_message("what now?")])

    async def bare_call(store: Store) -> None:
        await bare.call(request)

    async def mw_call(store: Store) -> None:
        await Middleware(store, store, "bench").call(bare).call(request)

    async def bare_stream(store: Store) -> None:
        await collect(bare.stream(request))

    async def mw_stream(store: Store) -> None:
        await collect(Middleware(store, store, "bench").stream(bare).stream(request))

    rows = [
        ("call: bare model", await best_of(bare_call, 5, 300)),
        ("call: + history Middleware", await best_of(mw_call, 5, 300)),
        ("stream 200 chunks: bare + collect", await best_of(bare_stream, 5, 100)),
        ("stream 200 chunks: + history Middleware", await best_of(mw_stream, 5, 50)),
    ]
    print(f"{'case':42} {'per call':>12} {'ratio':>8}")
    for index, (name, seconds) in enumerate(rows):
        floor = rows[index - index % 2][1]
        print(f"{name:42} {seconds * 1e6:10.1f}us {seconds / floor:7.2f}x")
    print()
    print(f"middleware overhead per call:   {(rows[1][1] - rows[0][1]) * 1e6:8.1f}us")
    print(f"middleware overhead per stream: {(rows[3][1] - rows[2][1]) * 1e6:8.1f}us")


if __name__ == "__main__":
    anyio.run(main)
