"""WindowReader: a token budget against a message limit (DESIGN §6d), and the cost of a
stable window's start as the history grows (§6g).

Part 1. An in-memory store holds 100 or 1,000 turns (user question, assistant answer
carrying stored usage). Each row is one ``read`` through a v0.3 ``WindowReader``
(``low_water`` at its bound: the tightest sliding window) under asyncio:

- warm: the history is unchanged since the last read (the usual case for a reader that
  serves one conversation while its model answers);
- grown: one new turn landed since the last read (what the history Middleware sees on
  every turn): only the new turn is grouped and counted, plus one count of the window.

The floor of each group is ``WindowReader(store, limit=...)`` choosing the same window
(the same number of messages) as the budgeted reader, so the ratio is the price of the
token budget. Acceptance: warm ratio <= 1.2 at 100 and 1,000 turns.

Part 2. The same turns, 100, 1,000 and 10,000 of them, through
``WindowReader(store, max_tokens=8_000)`` (the stable window, default ``low_water``)
and, side by side, v0.3's window (``low_water=8_000``):

- warm, per turn: one turn appended, then one read by a reader that has read the
  history before (what the history Middleware does on every turn): the stable window
  replays the new turn's two messages; a move now and then counts the turns it
  passes. Acceptance: flat from 100 to 10,000 turns;
- cold: the first read of the whole history by a fresh process (the projections and
  the counter's estimates forgotten): the stable start is replayed from the first
  message (with the default counter, the window's count is folded on a message at a
  time: linear in the history).

Run: ``python benchmarks/bench_window.py``
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from scope.chat import Message, Role, assistant_message, user_message
from scope.history import Batch, ConversationID, DefaultTokenCounter, WindowReader
from scope.history._turns import project
from scope.history._window import select
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
    tokens = WindowReader(store, max_tokens=budget, low_water=budget)
    size = len(await tokens.read(cid))
    limit = WindowReader(store, size, low_water=size)
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


BUDGET = 8_000
STEPS = 200  # turns appended per case, each followed by a read


async def bench_stable(turns: int) -> dict[str, float]:
    """Per turn: the store's append and read, the projection (the prefix check and the
    grouping of the new messages) and the window's selection (the stable start's
    replay, or v0.3's search, and the output list); then the cold first read."""
    store = InMemoryStore()
    cid = ConversationID(f"stable-{turns}")
    for i in range(turns):
        await store.append(Batch(cid, f"t{i}", _turn(i)))
    out: dict[str, float] = {}
    grown = turns
    cache = store.history_cache  # where a WindowReader over the store keeps projections
    for name, low_water in (("stable", None), ("v0.3", BUDGET)):
        counter = DefaultTokenCounter()
        select(project(cache, cid, await store.read(cid)), None, BUDGET, counter, low_water)
        spent = {"append": 0.0, "read": 0.0, "project": 0.0, "select": 0.0}
        for _ in range(STEPS):
            t0 = time.perf_counter()
            await store.append(Batch(cid, f"g{grown}", _turn(grown)))
            t1 = time.perf_counter()
            stored = await store.read(cid)
            t2 = time.perf_counter()
            projection = project(cache, cid, stored)
            t3 = time.perf_counter()
            window = select(projection, None, BUDGET, counter, low_water)
            t4 = time.perf_counter()
            spent["append"] += t1 - t0
            spent["read"] += t2 - t1
            spent["project"] += t3 - t2
            spent["select"] += t4 - t3
            grown += 1
        assert DefaultTokenCounter().count(window) <= BUDGET
        for part, seconds in spent.items():
            out[f"{name} {part}"] = seconds / STEPS

        async def cold(i: int, low_water: int | None = low_water) -> None:
            cache.clear()  # a fresh process: nothing remembered
            fresh = WindowReader(
                store, max_tokens=BUDGET, counter=DefaultTokenCounter(), low_water=low_water
            )
            await fresh.read(cid)

        out[f"{name} cold"] = await abest_of(cold, 1)
    return out


def stable_table(sizes: list[int], results: list[dict[str, float]]) -> None:
    print(f"Stable windows (max_tokens={BUDGET:,}), per turn: append + read, asyncio")
    print(
        f"{'stored turns':>12} {'append':>8} {'read':>8} {'project':>8}"
        f" {'select':>8} {'vs 100':>7} {'v0.3 sel':>9} {'ratio':>6}"
        f" {'cold':>9} {'v0.3 cold':>10} {'ratio':>6}"
    )
    base = results[0]["stable select"]
    for turns, row in zip(sizes, results, strict=True):
        sel, old = row["stable select"], row["v0.3 select"]
        cold, old_cold = row["stable cold"], row["v0.3 cold"]
        print(
            f"{turns:>12,} {row['stable append'] * 1e6:6.1f}us {row['stable read'] * 1e6:6.1f}us"
            f" {row['stable project'] * 1e6:6.1f}us {sel * 1e6:6.1f}us {sel / base:6.2f}x"
            f" {old * 1e6:7.1f}us {sel / old:5.2f}x"
            f" {cold * 1e3:7.1f}ms {old_cold * 1e3:8.1f}ms {cold / old_cold:5.2f}x"
        )
    print()


async def main() -> None:
    table([await bench(100), await bench(1000)])
    sizes = [100, 1000, 10_000]
    stable_table(sizes, [await bench_stable(n) for n in sizes])


if __name__ == "__main__":
    anyio.run(main)
