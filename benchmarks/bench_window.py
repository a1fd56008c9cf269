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
from scope.history import Batch, DefaultTokenCounter, WindowReader
from scope.history._turns import projections
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


async def bench_stable(turns: int) -> dict[str, float]:
    store = InMemoryStore()
    cid = f"stable-{turns}"
    for i in range(turns):
        await store.append(Batch(cid, f"t{i}", _turn(i)))
    readers = {
        "stable": WindowReader(store, max_tokens=BUDGET),
        "v0.3": WindowReader(store, max_tokens=BUDGET, low_water=BUDGET),
    }
    out: dict[str, float] = {}
    grown = [turns]  # the turns appended so far, across both readers
    for name, reader in readers.items():
        await reader.read(cid)  # warm

        async def grow(i: int, reader: WindowReader = reader) -> None:
            await store.append(Batch(cid, f"g{grown[0]}", _turn(grown[0])))
            grown[0] += 1
            await reader.read(cid)

        out[f"warm {name}"] = await abest_of(grow, 40)
        assert DefaultTokenCounter().count(await reader.read(cid)) <= BUDGET

    async def floor(i: int) -> None:  # the store's part: append one turn, read it all
        await store.append(Batch(cid, f"g{grown[0]}", _turn(grown[0])))
        grown[0] += 1
        await store.read(cid)

    out["store"] = await abest_of(floor, 40)
    for name, low_water in (("stable", None), ("v0.3", BUDGET)):

        async def cold(i: int, low_water: int | None = low_water) -> None:
            projections.clear()  # a fresh process: nothing remembered
            fresh = WindowReader(
                store, max_tokens=BUDGET, counter=DefaultTokenCounter(), low_water=low_water
            )
            await fresh.read(cid)

        out[f"cold {name}"] = await abest_of(cold, 1)
    return out


def stable_table(sizes: list[int], results: list[dict[str, float]]) -> None:
    print("Stable windows: append one turn + read (warm), first read (cold); asyncio")
    print("(window = warm minus the store's own append + read of the whole history)")
    print(
        f"{'stored turns':>12} {'store':>9} {'warm stable':>12} {'window':>9} {'vs 100':>7}"
        f" {'warm v0.3':>10} {'window':>9} {'cold stable':>12} {'cold v0.3':>10} {'ratio':>6}"
    )
    base = results[0]["warm stable"] - results[0]["store"]
    for turns, row in zip(sizes, results, strict=True):
        st, ws, wv = row["store"], row["warm stable"], row["warm v0.3"]
        cs, cv = row["cold stable"], row["cold v0.3"]
        print(
            f"{turns:>12,} {st * 1e6:7.1f}us {ws * 1e6:10.1f}us {(ws - st) * 1e6:7.1f}us"
            f" {(ws - st) / base:6.2f}x {wv * 1e6:8.1f}us {(wv - st) * 1e6:7.1f}us"
            f" {cs * 1e3:10.1f}ms {cv * 1e3:8.1f}ms {cs / cv:5.2f}x"
        )
    print()


async def main() -> None:
    table([await bench(100), await bench(1000)])
    sizes = [100, 1000, 10_000]
    stable_table(sizes, [await bench_stable(n) for n in sizes])


if __name__ == "__main__":
    anyio.run(main)
