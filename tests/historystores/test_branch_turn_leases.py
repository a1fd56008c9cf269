"""Regenerate and edit under a leasing ``on_overlap`` (DESIGN §6e, §6h; issue 43): the head
move is the new turn's first step, made while the turn holds the conversation's lease,
so no turn is refused at its commit because a rewind moved the head under it.

Each store (in memory, SQLite, PostgreSQL, Redis), each strategy (``wait``, ``reject``,
``interrupt``): two store handles (two "processes") race ``ask``, ``regenerate`` and
``edit`` turns on one conversation with a model that takes a while; every model call
whose turn then fails at its commit with ``HistoryChangedError`` is a wasted call.
Before the move took the lease there were dozens per run; now there are none, and
every failure is one the strategy asked for, decided before the model was called
(``TurnInProgressError``, ``HistoryChangedError`` from the move) or by the strategy
(``TurnInterruptedError``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.chat import Request
from scope.conversation import Conversation
from scope.errors import (
    CommitError,
    HistoryChangedError,
    TurnInProgressError,
    TurnInterruptedError,
    UnknownHeadError,
)
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from tests.servers import BACKEND_LOOPS, fresh_backend, over_backends

STRATEGIES = ("wait", "reject", "interrupt")


class Tally:
    """What the racing turns did: model calls, and how each turn ended."""

    def __init__(self) -> None:
        self.calls = 0
        self.stored = 0
        self.wasted = 0  # model calls whose turn the commit's fence refused
        self.refused_before = 0  # refused before the model was called
        self.interrupted = 0
        self.moved_back = 0


async def _one(conversation: Conversation, op: str, tally: Tally) -> None:
    try:
        if op == "ask":
            await conversation.ask("q")
        elif op == "regenerate":
            await conversation.regenerate()
        else:
            await conversation.edit(1, "edited")
        tally.stored += 1
    except CommitError as err:
        assert isinstance(err.__cause__, HistoryChangedError), repr(err.__cause__)
        tally.wasted += 1
    except (TurnInProgressError, HistoryChangedError, UnknownHeadError):
        tally.refused_before += 1
    except TurnInterruptedError:
        tally.interrupted += 1


@contextlib.asynccontextmanager
async def _handles(kind: str, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    if kind == "memory":
        store = InMemoryStore()
        yield store, store
        return
    async with (
        fresh_backend(kind, tmp_path) as backend,
        await backend.open() as one,
        await backend.open() as two,
    ):
        yield one, two


async def race(kind: str, strategy: str, tmp_path: Path, rounds: int = 12) -> Tally:
    tally = Tally()
    rng = random.Random(f"{kind}-{strategy}")

    async def answer(request: Request) -> str:
        tally.calls += 1
        await anyio.sleep(rng.uniform(0.002, 0.02))
        return "a"

    model = FunctionModel(answer)
    async with _handles(kind, tmp_path) as (one, two):
        options: dict[str, Any] = {"on_overlap": strategy, "overlap_timeout": 30.0}
        conversations = [Conversation(model, store, "c", **options) for store in (one, two)]
        await conversations[0].ask("first")
        for _ in range(rounds):
            async with anyio.create_task_group() as tg:
                for index in range(6):
                    op = ("ask", "regenerate", "edit")[index % 3]
                    tg.start_soon(_one, conversations[rng.randrange(2)], op, tally)
                    await anyio.sleep(rng.uniform(0, 0.004))
    return tally


ROWS = [
    pytest.param("memory", loop, strategy, id=f"memory-{loop}-{strategy}")
    for loop in ("asyncio", "trio")
    for strategy in STRATEGIES
]


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend", "strategy"), ROWS)
async def test_rewinds_waste_no_model_call_in_memory(
    kind: str, strategy: str, tmp_path: Path
) -> None:
    tally = await race(kind, strategy, tmp_path)
    assert tally.wasted == 0, vars(tally)
    assert tally.stored > 0, vars(tally)


@pytest.mark.anyio
@over_backends(**{"strategy": {k: STRATEGIES for k in BACKEND_LOOPS}})
async def test_rewinds_waste_no_model_call(kind: str, strategy: str, tmp_path: Path) -> None:
    tally = await race(kind, strategy, tmp_path)
    assert tally.wasted == 0, vars(tally)
    assert tally.stored > 0, vars(tally)
