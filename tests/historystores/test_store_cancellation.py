"""Cancellation storms: hundreds of store calls cancelled at random points, on every store.

Each storm starts appends, reads and clears in waves of concurrent tasks and cancels each
one after a random wait (0 to a few milliseconds, or 0 to a dozen turns of the event
loop: before, inside and after the driver's work; see ``draw``), until at least
``CANCELLED`` (200) were cancelled while running. It counts:

- every task cancelled while its call was still running ends cancelled (under asyncio
  a native ``Task.cancel()``, the kind redis-py used to swallow; under trio a cancel
  scope), and none goes on as if never cancelled;
- the data rules hold: each batch is stored at most once and contiguous, every
  acknowledged batch is stored, a conversation whose clear was acknowledged stays
  closed (nothing started after the clear lands) and, after retrying every batch, each
  open conversation holds every batch exactly once.

The PostgreSQL storm also asserts asyncpg logs no "Future exception was never
retrieved" on the ``asyncio`` logger.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from scope.errors import ConversationClosedError
from scope.history import Batch, Receipt
from scope.history.inmemory import InMemoryStore
from scope.historystores import PersistentStore
from tests.helpers import numbered_turn, texts
from tests.servers import fresh_store

pytestmark = pytest.mark.anyio

#: Calls cancelled while running, per storm: waves go on until this many were.
CANCELLED = 200
#: The most calls a storm makes (a store too fast for the waits fails the count).
CALLS = 1200
#: Concurrent calls per wave.
WAVE = 24
#: The longest delay before a call is cancelled, in seconds.
MAX_DELAY = 0.004
#: The most event loop turns before a call is cancelled.
MAX_TURNS = 12

OPEN = [f"open {i}" for i in range(3)]
DOOMED = "doomed"


class Tally:
    """What the storm saw."""

    def __init__(self) -> None:
        self.finished_first = 0  # done before the cancel request
        self.cancelled = 0  # ended cancelled, as they must
        self.lost: list[str] = []  # cancelled mid-call but returned normally
        self.attempted: dict[str, set[str]] = {cid: set() for cid in [*OPEN, DOOMED]}
        self.acked: dict[str, set[str]] = {cid: set() for cid in [*OPEN, DOOMED]}
        self.clear_acked = False
        self.after_clear: set[str] = set()  # appends to DOOMED started after a clear acked


def plan(rng: random.Random, index: int) -> tuple[str, str, str]:
    """``(operation, conversation, append id)`` of call ``index``."""
    roll = rng.random()
    if roll < 0.6:
        cid = rng.choice([*OPEN, DOOMED])
        return "append", cid, f"a{index}"
    if roll < 0.85:
        return "read", rng.choice([*OPEN, DOOMED]), ""
    return "clear", DOOMED, ""


def operation(
    store: PersistentStore, tally: Tally, op: str, cid: str, aid: str
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        if op == "append":
            batch = Batch(cid, aid, numbered_turn(cid, aid))
            tally.attempted[cid].add(aid)
            if cid == DOOMED and tally.clear_acked:
                tally.after_clear.add(aid)
            try:
                receipt = await store.append(batch)
            except ConversationClosedError:
                assert cid == DOOMED
                return
            assert receipt == batch.receipt()
            tally.acked[cid].add(aid)
        elif op == "read":
            await store.read(cid)
        else:
            await store.clear(cid)
            tally.clear_acked = True

    return run


def draw(rng: random.Random) -> float:
    """How long a call runs before its cancel: half the time a number of event loop
    turns (an int, 0 to ``MAX_TURNS``: a call waiting on a thread or a socket spans a
    few, however fast the machine), else seconds (0 to ``MAX_DELAY``: a timer fires
    a millisecond late or more, after most of a fast store's calls have ended)."""
    return rng.randrange(MAX_TURNS + 1) if rng.random() < 0.5 else rng.random() * MAX_DELAY


async def pause(wait: float) -> None:
    """Wait what ``draw`` drew: that many loop turns (an int), or seconds."""
    if isinstance(wait, int):
        for _ in range(wait):
            await anyio.lowlevel.checkpoint()
    else:
        await anyio.sleep(wait)


async def asyncio_storm(store: PersistentStore, seed: int) -> Tally:
    """Native ``Task.cancel()`` of each call after a random wait."""
    rng = random.Random(seed)
    tally = Tally()

    async def one(index: int) -> None:
        run = operation(store, tally, *plan(rng, index))
        task = asyncio.ensure_future(run())
        await pause(draw(rng))
        if task.done():
            task.result()
            tally.finished_first += 1
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            assert task.cancelled()
            tally.cancelled += 1
        else:
            tally.lost.append(f"call {index}")

    for start in range(0, CALLS, WAVE):
        await asyncio.gather(*(one(i) for i in range(start, start + WAVE)))
        if tally.cancelled >= CANCELLED:
            break
    return tally


async def scope_storm(store: PersistentStore, seed: int) -> Tally:
    """A cancel scope per call (trio, or anyio on asyncio), cancelled after a random
    wait."""
    rng = random.Random(seed)
    tally = Tally()

    async def one(index: int, run: Callable[[], Awaitable[None]], wait: float) -> None:
        returned = swallowed = False
        with anyio.CancelScope() as scope:

            async def cancel_later() -> None:
                await pause(wait)
                if not returned:
                    scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_later)
                await run()
                returned = True  # no checkpoint between the call's return and this
                swallowed = _delivered_cancellation_pending()
        if not scope.cancel_called:
            tally.finished_first += 1
        elif swallowed or not scope.cancelled_caught:
            # A cancellation thrown into the call that it did not raise, or one that
            # vanished before the scope's end.
            tally.lost.append(f"call {index}")
        elif returned:
            # Cancel scopes are level-triggered: a cancel requested after the call's
            # last wait had already completed (anyio on asyncio then does not throw into
            # the task; trio has already rescheduled it) takes effect at the next
            # checkpoint, which the scope caught above. The call finished first.
            tally.finished_first += 1
        else:
            tally.cancelled += 1

    for start in range(0, CALLS, WAVE):
        async with anyio.create_task_group() as tg:
            for index in range(start, start + WAVE):
                run = operation(store, tally, *plan(rng, index))
                tg.start_soon(one, index, run, draw(rng))
        if tally.cancelled >= CANCELLED:
            break
    return tally


def stored_batches(stored: list[str], cid: str) -> list[str]:
    """The append ids of ``stored``, checking each batch is whole and contiguous."""
    assert len(stored) % 2 == 0, f"{cid}: a torn batch: {stored}"
    aids = []
    for i in range(0, len(stored), 2):
        aid = stored[i].split("|")[1]
        assert stored[i : i + 2] == [f"{cid}|{aid}|0", f"{cid}|{aid}|1"], stored[i : i + 2]
        aids.append(aid)
    return aids


async def check_rules(store: PersistentStore, tally: Tally) -> None:
    assert tally.lost == [], f"cancellations lost: {tally.lost}"
    assert tally.cancelled >= CANCELLED, f"only {tally.cancelled} calls cancelled while running"
    for cid in OPEN:
        aids = stored_batches(texts(await store.read(cid)), cid)
        assert len(aids) == len(set(aids)), f"{cid}: a batch stored twice: {aids}"
        assert tally.acked[cid] <= set(aids) <= tally.attempted[cid]
        # Every batch, cancelled or not, lands exactly once when retried.
        for aid in sorted(tally.attempted[cid]):
            batch = Batch(cid, aid, numbered_turn(cid, aid))
            assert await store.append(batch) == batch.receipt()
        aids = stored_batches(texts(await store.read(cid)), cid)
        assert sorted(aids) == sorted(tally.attempted[cid])
    doomed = stored_batches(texts(await store.read(DOOMED)), DOOMED)
    assert set(doomed) <= tally.attempted[DOOMED] and len(doomed) == len(set(doomed))
    assert not (tally.after_clear & tally.acked[DOOMED]), "an append landed after the clear"
    if tally.clear_acked:
        assert doomed == []
        for aid in sorted(tally.attempted[DOOMED])[:5]:
            with pytest.raises(ConversationClosedError):
                await store.append(Batch(DOOMED, aid, numbered_turn(DOOMED, aid)))
    assert set(await store.conversations()) >= {cid for cid in OPEN if tally.attempted[cid]}


async def storm(store: PersistentStore, seed: int = 17) -> Tally:
    if _on_asyncio():
        tally = await asyncio_storm(store, seed)
    else:
        tally = await scope_storm(store, seed)
    await check_rules(store, tally)
    return tally


def _delivered_cancellation_pending() -> bool:
    """Whether a cancellation was thrown into the current asyncio task and not raised.

    anyio's cancel scopes on asyncio deliver with ``Task.cancel()`` and take it back with
    ``Task.uncancel()`` when the scope exits, so inside the scope a positive count means
    the call swallowed a ``CancelledError``. trio has no such count; there a cancel scope
    re-raises at every checkpoint, so a swallowed cancellation cannot outlive the scope
    (``cancelled_caught`` is checked for that).
    """
    if not _on_asyncio():
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# -- the stores ----------------------------------------------------------------------------


async def test_sqlite_cancellation_storm(tmp_path: Path) -> None:
    async with fresh_store("sqlite", tmp_path) as store:
        await storm(store)


#: Store options of the storms: PostgreSQL's pool is made big enough for a wave.
OPTIONS: dict[str, dict[str, Any]] = {"sqlite": {}, "postgres": {"max_size": 8}, "redis": {}}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("kind", "seed"),
    [
        ("sqlite", 5),
        pytest.param("postgres", 11, marks=pytest.mark.servers),
        pytest.param("redis", 9, marks=pytest.mark.servers),
    ],
)
async def test_cancellation_storm_with_anyio_scopes_on_asyncio(
    kind: str, seed: int, tmp_path: Path
) -> None:
    async with fresh_store(kind, tmp_path, **OPTIONS[kind]) as store:
        tally = await scope_storm(store, seed)
        await check_rules(store, tally)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_postgres_cancellation_storm_without_unretrieved_futures(tmp_path: Path) -> None:
    handler = _Records()
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.addHandler(handler)
    loop = asyncio.get_running_loop()
    # The test runner installs its own handler; asyncio's default logs to "asyncio".
    runner_handler = loop.get_exception_handler()
    loop.set_exception_handler(None)
    try:
        async with fresh_store("postgres", tmp_path, **OPTIONS["postgres"]) as store:
            await storm(store)
        gc.collect()  # an unretrieved future is reported when it is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(runner_handler)
        asyncio_logger.removeHandler(handler)
    noise = [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING]
    assert noise == []


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_redis_cancellation_storm(tmp_path: Path) -> None:
    async with fresh_store("redis", tmp_path) as store:
        await storm(store)


# -- the storms catch a store that swallows cancellation ------------------------------------


class _SwallowingStore(InMemoryStore):
    """An in-memory store whose append waits, and goes on if that wait is cancelled: the
    fault redis-py had."""

    async def append(self, batch: Batch) -> Receipt:
        with suppress(asyncio.CancelledError):
            await asyncio.sleep(0.002)
        return await super().append(batch)

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("run_storm", [asyncio_storm, scope_storm])
async def test_storms_report_a_store_that_swallows_cancellation(
    run_storm: Callable[[PersistentStore, int], Awaitable[Tally]],
) -> None:
    tally = await run_storm(cast(PersistentStore, _SwallowingStore()), 3)
    assert tally.lost, "the storm missed swallowed cancellations"
    with pytest.raises(AssertionError, match="cancellations lost"):
        await check_rules(cast(PersistentStore, _SwallowingStore()), tally)
