"""What the listing benchmarks share: best-of timing and filling a store with
one-batch conversations from many tasks."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from scope.chat import assistant_message, user_message
from scope.history import Batch

TASKS = 32
TURN = [user_message("hello"), assistant_message("hi")]


async def best_of(repeats: int, fn: Callable[[], Awaitable[Any]]) -> float:
    """The fastest of ``repeats`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - start)
    return best


async def fill(store: Any, ids: list[str], clear: bool = False) -> None:
    """Append one two-message batch to each conversation of ``ids`` (and clear it again
    with ``clear``), from ``TASKS`` tasks."""

    async def worker(chunk: list[str]) -> None:
        for cid in chunk:
            await store.append(Batch(cid, "a1", TURN))
            if clear:
                await store.clear(cid)

    async with anyio.create_task_group() as tg:
        for i in range(TASKS):
            tg.start_soon(worker, ids[i::TASKS])
