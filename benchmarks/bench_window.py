"""WindowReader: a token budget against a message limit (DESIGN §6d).

An in-memory store holds 100 or 1,000 turns (user question, assistant answer carrying
stored usage). Each row is one ``read`` through a ``WindowReader`` under asyncio:

- warm: the history is unchanged since the last read (the usual case for a reader that
  serves one conversation while its model answers);
- grown: one new turn landed since the last read (what the history Middleware sees on
  every turn): only the new turn is grouped and counted, plus one count of the window.

The floor of each group is ``WindowReader(store, limit=...)`` choosing the same window
(the same number of messages) as the budgeted reader, so the ratio is the price of the
token budget. Acceptance: warm ratio <= 1.2 at 100 and 1,000 turns.

Run: ``python benchmarks/bench_window.py``
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from scope.chat import Message, Role, assistant_message, user_message
from scope.history import Batch, DefaultTokenCounter, WindowReader
from scope.history.inmemory import InMemoryStore
from scope.metadata import Metadata

REPEATS = 7


async def abest_of(fn: Callable[[int], Awaitable[Any]], inner: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(inner):
            await fn(i)
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def _turn(i: int) -> list[Message]:
    answer = Message(
        Role.ASSISTANT,
        assistant_message(f"answer {i} " + "lorem ipsum " * 20).parts,
        Metadata(
            {
                "scope/provider": "openai",
                "scope/model": "m",
                "scope/usage": {"input_tokens": 100 + 90 * i, "output_tokens": 60},
            }
        ),
    )
    return [user_message(f"question {i} " + "dolor sit amet " * 10), answer]


async def bench(turns: int) -> list[tuple[str, float]]:
    store = InMemoryStore()
    cid = f"bench-{turns}"
    for i in range(turns):
        await store.append(Batch(cid, f"t{i}", _turn(i)))
    budget = 8_000  # about 90 turns of this shape
    tokens = WindowReader(store, max_tokens=budget)
    size = len(await tokens.read(cid))
    limit = WindowReader(store, size)
    assert len(await limit.read(cid)) == size
    assert DefaultTokenCounter().count(await tokens.read(cid)) <= budget

    async def read_limit(i: int) -> None:
        await limit.read(cid)

    async def read_tokens(i: int) -> None:
        await tokens.read(cid)

    rows = [
        (f"{turns} turns, warm: limit={size} messages", await abest_of(read_limit, 500)),
        (f"{turns} turns, warm: max_tokens={budget}", await abest_of(read_tokens, 500)),
    ]
    grown = [turns]

    async def grow_then(reader: WindowReader) -> Callable[[int], Awaitable[None]]:
        async def run(i: int) -> None:
            await store.append(Batch(cid, f"g{grown[0]}", _turn(grown[0])))
            grown[0] += 1
            await reader.read(cid)

        return run

    rows.append(
        (f"{turns} turns, grown: append + limit={size}", await abest_of(await grow_then(limit), 50))
    )
    rows.append(
        (
            f"{turns} turns, grown: append + max_tokens={budget}",
            await abest_of(await grow_then(tokens), 50),
        )
    )
    return rows


def table(groups: list[list[tuple[str, float]]]) -> None:
    print("WindowReader over the in-memory store (asyncio)")
    print(f"{'case':52} {'per read':>12} {'ratio':>8}")
    for rows in groups:
        for floor_at in range(0, len(rows), 2):
            floor = rows[floor_at][1]
            for name, seconds in rows[floor_at : floor_at + 2]:
                print(f"{name:52} {seconds * 1e6:10.2f}us {seconds / floor:7.2f}x")
    print()


async def main() -> None:
    table([await bench(100), await bench(1000)])


if __name__ == "__main__":
    anyio.run(main)
