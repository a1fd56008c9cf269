"""DESIGN §6b through the history Middleware, over every bundled store: overlapping turns
are fenced (exactly one commits), a closed conversation is refused before the model
call, CommitError says which recovery fits, and cancellation during the append
propagates unchanged with the batch handed to ``on_incomplete``.

In-memory and SQLite run under asyncio and trio; PostgreSQL and Redis (asyncio-only
drivers) under asyncio, against the real servers.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    assistant_message,
    collect,
    system_message,
    user_message,
)
from scope.errors import (
    AppendConflictError,
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    HistoryError,
    InvalidReceiptError,
    StoreError,
    TurnInProgressError,
    TurnInterruptedError,
)
from scope.history import (
    Batch,
    IncompleteReason,
    IncompleteTurn,
    Interrupt,
    KeepInterrupted,
    Middleware,
    Receipt,
    Reject,
    Unfenced,
    Wait,
    WindowReader,
    keyword_layers,
)
from scope.history.inmemory import InMemoryStore
from scope.historystores.sqlite import SQLiteStore
from tests.servers import fresh_backend, fresh_store

pytestmark = pytest.mark.anyio

KINDS = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=KINDS)
async def store(
    request: pytest.FixtureRequest, anyio_backend: str, tmp_path: Path
) -> AsyncIterator[Any]:
    kind = request.param
    if kind == "memory":
        yield InMemoryStore()
    elif kind != "sqlite" and anyio_backend != "asyncio":
        pytest.skip(f"the {kind} store is asyncio-only")
    else:
        async with fresh_store(kind, tmp_path) as store:
            yield store


def fingerprint(messages: tuple[Message, ...] | list[Message]) -> str:
    """What an answer records of the history it was generated from."""
    text = "\x1e".join(f"{m.role}:{m.text}" for m in messages)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Gate:
    """A model that answers with a fingerprint of the history it saw, once ``n`` calls
    have all arrived: every caller of a round has read its history first."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived = 0
        self.open = anyio.Event()

    async def call(self, request: Request) -> Response:
        self.arrived += 1
        if self.arrived == self.n:
            self.open.set()
        await self.open.wait()
        seen = request.messages[:-1]  # everything before the new user message
        text = f"{request.messages[-1].text} saw {len(seen)}:{fingerprint(seen)}"
        return Response(Output(assistant_message(text), FinishReason.STOP))


class Reports(list[IncompleteTurn]):
    def __call__(self, turn: IncompleteTurn) -> None:
        self.append(turn)


# ---------------------------------------------------------------- overlapping turns


async def test_overlapping_turns_exactly_one_commits_per_round(store: Any) -> None:
    rounds, width = 4, 20
    system = system_message("be brief")
    for round_ in range(rounds):
        gate = Gate(width)
        winners: list[str] = []
        losers: list[CommitError] = []

        async def turn(
            i: int,
            gate: Gate = gate,
            round_: int = round_,
            winners: list[str] = winners,
            losers: list[CommitError] = losers,
        ) -> None:
            mw = Middleware(store, store, "c")
            question = f"r{round_}q{i}"
            try:
                await mw.call(gate).call(Request([system, user_message(question)]))
            except CommitError as exc:
                losers.append(exc)
            else:
                winners.append(question)

        async with anyio.create_task_group() as tg:
            for i in range(width):
                tg.start_soon(turn, i)
        assert len(winners) == 1, f"round {round_}: {len(winners)} turns committed"
        assert len(losers) == width - 1
        for err in losers:
            assert isinstance(err.__cause__, HistoryChangedError)
            assert err.retryable is False
            assert err.__cause__.expected == 2 * round_
            assert err.__cause__.actual == 2 * round_ + 2
            assert "run the turn again" in str(err)
            assert "retry `await writer.append" not in str(err)
    # The transcript is coherent: each answer was generated from exactly the history
    # stored before it (the system prefix is replayed, not stored).
    stored = await store.read("c")
    assert len(stored) == 2 * rounds
    for index in range(0, len(stored), 2):
        question, answer = stored[index], stored[index + 1]
        before = [system, *stored[:index]]
        assert answer.text == f"{question.text} saw {len(before)}:{fingerprint(before)}"


async def test_losing_turn_runs_again_on_the_new_history(store: Any) -> None:
    gate = Gate(2)
    outcomes: dict[str, Any] = {}

    async def turn(question: str) -> None:
        try:
            outcomes[question] = (
                await Middleware(store, store, "c")
                .call(gate)
                .call(Request([user_message(question)]))
            )
        except CommitError as exc:
            outcomes[question] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn, "a")
        tg.start_soon(turn, "b")
    (loser,) = [q for q, o in outcomes.items() if isinstance(o, CommitError)]
    # Appending the stale batch again cannot succeed...
    with pytest.raises(HistoryChangedError):
        await store.append(outcomes[loser].batch)
    # ...running the turn again does, on the history that now holds the winner's turn.
    again = Gate(1)
    response = await Middleware(store, store, "c").call(again).call(Request([user_message(loser)]))
    assert response.text.endswith(f"saw 2:{fingerprint((await store.read('c'))[:2])}")
    assert len(await store.read("c")) == 4


async def test_exclusive_turns_false_lets_overlapping_turns_interleave(store: Any) -> None:
    gate = Gate(3)

    async def turn(question: str) -> None:
        mw = Middleware(store, store, "c", layers=(Unfenced(),))
        await mw.call(gate).call(Request([user_message(question)]))

    async with anyio.create_task_group() as tg:
        for question in ("a", "b", "c"):
            tg.start_soon(turn, question)
    stored = await store.read("c")
    assert len(stored) == 6
    # Every answer saw the empty history: none of them saw the others' turns.
    assert all(m.text.endswith(f"saw 0:{fingerprint([])}") for m in stored[1::2])


async def test_window_reader_fences_with_the_whole_conversation_length(store: Any) -> None:
    window = WindowReader(store, 2)
    for i in range(3):
        await Middleware(window, store, "c").call(Gate(1)).call(Request([user_message(f"q{i}")]))
    stored = await store.read("c")
    assert len(stored) == 6
    # Each answer saw only the window (the newest turn), and the fence still held.
    assert stored[5].text == f"q2 saw 2:{fingerprint(stored[2:4])}"
    gate = Gate(2)
    results: list[BaseException | Response] = []

    async def turn(q: str) -> None:
        try:
            results.append(
                await Middleware(window, store, "c").call(gate).call(Request([user_message(q)]))
            )
        except CommitError as exc:
            results.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn, "x")
        tg.start_soon(turn, "y")
    errors = [r for r in results if isinstance(r, CommitError)]
    assert len(errors) == 1 and isinstance(errors[0].__cause__, HistoryChangedError)
    assert len(await store.read("c")) == 8


# ---------------------------------------------------------------- closed conversations


class CountingModel:
    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request: Request) -> Response:
        self.calls += 1
        return Response(Output(assistant_message("paid answer"), FinishReason.STOP))

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Response]:
        self.calls += 1
        yield Response(Output(assistant_message("paid answer"), FinishReason.STOP))


async def test_closed_conversation_is_refused_before_the_model_call(store: Any) -> None:
    await store.append(Batch("c", "a1", [user_message("q"), assistant_message("a")]))
    await store.clear("c")
    model = CountingModel()
    reports = Reports()
    mw = Middleware(store, store, "c", on_incomplete=reports)
    with pytest.raises(ConversationClosedError):
        await mw.call(model).call(Request([user_message("again")]))
    with pytest.raises(ConversationClosedError):
        await collect(mw.stream(model).stream(Request([user_message("again")])))
    assert model.calls == 0
    assert [r.reason for r in reports] == [IncompleteReason.ERROR, IncompleteReason.ERROR]
    assert all(r.batch is None for r in reports)
    # A never-written id that was cleared is refused too.
    await store.clear("fresh")
    with pytest.raises(ConversationClosedError):
        await Middleware(store, store, "fresh").call(model).call(Request([user_message("q")]))
    assert model.calls == 0


async def test_cleared_during_the_turn_is_not_retryable(store: Any) -> None:
    class ClearingModel:
        async def call(self, request: Request) -> Response:
            await store.clear("c")
            return Response(Output(assistant_message("late"), FinishReason.STOP))

    with pytest.raises(CommitError) as caught:
        await Middleware(store, store, "c").call(ClearingModel()).call(Request([user_message("q")]))
    err = caught.value
    assert isinstance(err.__cause__, ConversationClosedError)
    assert err.retryable is False
    assert "nothing to retry" in str(err)
    assert "retry `await writer.append" not in str(err)


# ---------------------------------------------------------------- CommitError.retryable


class FlakyWriter:
    """Fails the first append with a store error, then delegates."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.failures = 1

    async def append(self, batch: Batch) -> Receipt:
        if self.failures:
            self.failures -= 1
            raise StoreError("connection reset (injected)")
        return await self.store.append(batch)  # type: ignore[no-any-return]


async def test_store_failure_is_retryable_and_the_retry_lands_once(store: Any) -> None:
    writer = FlakyWriter(store)
    with pytest.raises(CommitError) as caught:
        await Middleware(store, writer, "c").call(Gate(1)).call(Request([user_message("q")]))
    err = caught.value
    assert err.retryable is True
    assert "retry `await writer.append(err.batch)`" in str(err)
    assert await writer.append(err.batch) == err.batch.receipt()
    assert await writer.append(err.batch) == err.batch.receipt()
    assert (await store.read("c"))[0].text == "q"
    assert len(await store.read("c")) == 2


async def test_mismatched_receipt_is_retryable(store: Any) -> None:
    class WrongReceipt:
        async def append(self, batch: Batch) -> Receipt:
            await store.append(batch)
            return Receipt(batch.conversation_id, batch.id, "sha256:" + "0" * 64)

    with pytest.raises(CommitError) as caught:
        await (
            Middleware(store, WrongReceipt(), "c").call(Gate(1)).call(Request([user_message("q")]))
        )
    assert caught.value.retryable is True
    assert caught.value.receipt is None
    assert await store.append(caught.value.batch) == caught.value.batch.receipt()


@pytest.mark.parametrize("answer", [None, "sha256:ok", {"receipt": 1}], ids=repr)
async def test_a_writer_that_returns_no_receipt_is_broken_not_retryable(
    store: Any, answer: object
) -> None:
    class NoReceipt:
        async def append(self, batch: Batch) -> Any:
            await store.append(batch)
            return answer

    with pytest.raises(CommitError) as caught:
        await Middleware(store, NoReceipt(), "c").call(Gate(1)).call(Request([user_message("q")]))
    err = caught.value
    assert err.retryable is False
    assert err.receipt is None
    assert isinstance(err.__cause__, InvalidReceiptError)
    assert f"the writer is broken: NoReceipt.append returned {type(answer).__name__}" in str(err)
    assert "appending this batch again cannot succeed" in str(err)


async def test_append_conflict_is_not_retryable(store: Any) -> None:
    await store.append(Batch("c", "fixed", [user_message("other"), assistant_message("x")]))
    mw = Middleware(store, store, "c", new_append_id=lambda: "fixed")
    with pytest.raises(CommitError) as caught:
        await mw.call(Gate(1)).call(Request([user_message("q")]))
    assert isinstance(caught.value.__cause__, AppendConflictError)
    assert caught.value.retryable is False
    assert "fresh append id" in str(caught.value)


# ---------------------------------------------------------------- cancellation


class SlowWriter:
    """Appends to the store, sleeping ``delay`` before (``where="before"``) or after;
    ``on_sleep()`` runs as the sleep starts (a test sets its deadline there, so the
    cancellation lands inside the append however slow the machine is)."""

    def __init__(self, store: Any, where: str, delay: float = 10.0) -> None:
        self.store = store
        self.where = where
        self.delay = delay
        self.landed = False
        self.on_sleep: Callable[[], None] = lambda: None

    async def _sleep(self) -> None:
        self.on_sleep()
        await anyio.sleep(self.delay)

    async def append(self, batch: Batch) -> Receipt:
        if self.where == "before":
            await self._sleep()
        receipt = await self.store.append(batch)
        self.landed = True
        if self.where == "after":
            await self._sleep()
        return receipt  # type: ignore[no-any-return]


@pytest.mark.parametrize("where", ["before", "after"])
async def test_cancellation_during_the_append_propagates_with_the_batch(
    store: Any, where: str, anyio_backend: str
) -> None:
    writer = SlowWriter(store, where)
    reports = Reports()
    mw = Middleware(store, writer, "c", on_incomplete=reports)
    request = Request([user_message("q")])
    # The host's deadline is set to expire once the append is under way.
    if anyio_backend == "asyncio":
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(None) as timeout:
                loop = asyncio.get_running_loop()
                writer.on_sleep = lambda: timeout.reschedule(loop.time() + 0.05)
                await mw.call(Gate(1)).call(request)
    else:
        import trio

        returned = False
        with trio.CancelScope() as scope:

            def expire_soon() -> None:
                scope.deadline = trio.current_time() + 0.05

            writer.on_sleep = expire_soon
            await mw.call(Gate(1)).call(request)
            returned = True  # pragma: no cover - the append sleeps past the deadline
        assert scope.cancelled_caught and not returned
    assert writer.landed is (where == "after")
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    batch = reports[0].batch
    assert batch is not None and batch.messages[0].text == "q"
    assert batch.expected_length == 0
    # The retry the docs recommend (docs/history.md): lands once, or returns the equal receipt.
    assert await store.append(batch) == batch.receipt()
    assert await store.append(batch) == batch.receipt()
    assert len(await store.read("c")) == 2


async def test_cancellation_of_a_stream_during_the_append_propagates(
    store: Any, anyio_backend: str
) -> None:
    writer = SlowWriter(store, "before")
    reports = Reports()
    mw = Middleware(store, writer, "c", on_incomplete=reports)
    model = CountingModel()
    with anyio.CancelScope() as scope:
        writer.on_sleep = lambda: setattr(scope, "deadline", anyio.current_time() + 0.05)
        await collect(mw.stream(model).stream(Request([user_message("q")])))
    assert scope.cancelled_caught
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert reports[0].batch is not None
    assert await store.append(reports[0].batch) == reports[0].batch.receipt()


async def test_cancellation_before_the_append_reports_no_batch(store: Any) -> None:
    class Hang:
        async def call(self, request: Request) -> Response:
            await anyio.sleep(10)
            raise AssertionError("not reached")

    reports = Reports()
    with anyio.move_on_after(0.05):
        await (
            Middleware(store, store, "c", on_incomplete=reports)
            .call(Hang())
            .call(Request([user_message("q")]))
        )
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert reports[0].batch is None
    assert await store.read("c") == []


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("reader", "writer", "missing"),
    [
        (None, None, "Reader"),
        (object(), InMemoryStore(), "Reader"),
        (InMemoryStore(), None, "Writer"),
        (InMemoryStore(), object(), "Writer"),
    ],
)
def test_middleware_checks_reader_and_writer_at_construction(
    reader: Any, writer: Any, missing: str
) -> None:
    with pytest.raises(TypeError, match=f"scope.history.{missing}"):
        Middleware(reader, writer, "c")


def test_middleware_checks_its_other_arguments() -> None:
    store = InMemoryStore()
    with pytest.raises(TypeError, match="exclusive_turns"):
        keyword_layers(exclusive_turns="x")
    with pytest.raises(TypeError, match="new_append_id"):
        Middleware(store, store, "c", new_append_id="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_incomplete"):
        Middleware(store, store, "c", on_incomplete="x")  # type: ignore[arg-type]
    assert Middleware(store, store, "c").fenced is True
    with pytest.warns(DeprecationWarning, match="use Middleware.fenced"):
        assert Middleware(store, store, "c").exclusive_turns is True


async def test_plain_reader_means_no_fence() -> None:
    store = InMemoryStore()

    class PlainReader:
        async def read(self, conversation_id: str) -> list[Message]:
            return await store.read(conversation_id)

    seen: list[Batch] = []

    class Recording:
        async def append(self, batch: Batch) -> Receipt:
            seen.append(batch)
            return await store.append(batch)

    await (
        Middleware(PlainReader(), Recording(), "c", layers=(Unfenced(),))
        .call(Gate(1))
        .call(Request([user_message("q")]))
    )
    await Middleware(store, Recording(), "c").call(Gate(1)).call(Request([user_message("r")]))
    await (
        Middleware(store, Recording(), "c", layers=(Unfenced(),))
        .call(Gate(1))
        .call(Request([user_message("s")]))
    )
    assert [b.expected_length for b in seen] == [None, 2, None]


async def test_a_view_reader_returning_a_non_view_is_a_store_error() -> None:
    store = InMemoryStore()

    class Broken:
        async def read(self, conversation_id: str) -> list[Message]:
            return []

        async def read_view(self, conversation_id: str) -> Any:
            return []

    with pytest.raises(StoreError, match="not a HistoryView"):
        await Middleware(Broken(), store, "c").call(Gate(1)).call(Request([user_message("q")]))


# ---------------------------------------------------------------- overlap strategies (§6e)

HANDLE_KINDS = ["memory", "sqlite-two-handles", "postgres", "redis"]


@pytest.fixture(params=HANDLE_KINDS)
async def handles(
    request: pytest.FixtureRequest, anyio_backend: str, tmp_path: Path
) -> AsyncIterator[list[Any]]:
    """Handles on one store: turn ``i`` uses ``handles[i % len(handles)]``. SQLite gets
    two handles on one file, so its leases must exclude across handles."""
    kind = request.param
    if kind == "memory":
        yield [InMemoryStore()]
    elif kind != "sqlite-two-handles" and anyio_backend != "asyncio":
        pytest.skip(f"the {kind} store is asyncio-only")
    elif kind == "sqlite-two-handles":
        async with (
            fresh_backend("sqlite", tmp_path) as backend,
            await backend.open() as one,
            await backend.open() as two,
        ):
            yield [one, two]
    else:
        async with fresh_store(kind, tmp_path) as store:
            yield [store]


def check_transcript(stored: list[Message], system: Message) -> None:
    """Each answer was generated from exactly the history stored before it."""
    for index in range(0, len(stored), 2):
        question, answer = stored[index], stored[index + 1]
        before = [system, *stored[:index]]
        assert answer.text == f"{question.text} saw {len(before)}:{fingerprint(before)}"


class HeldModel:
    """Answers with a fingerprint of what it saw once ``release`` is set; counts calls
    and the most calls running at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.running = 0
        self.most = 0
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def call(self, request: Request) -> Response:
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.set()
        try:
            await self.release.wait()
            await anyio.lowlevel.checkpoint()
            seen = request.messages[:-1]
            text = f"{request.messages[-1].text} saw {len(seen)}:{fingerprint(seen)}"
            return Response(Output(assistant_message(text), FinishReason.STOP))
        finally:
            self.running -= 1

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncIterator[Response]:
        self.calls += 1
        yield Response(Output(assistant_message("partial ")))
        self.started.set()  # the consumer has the first chunk
        await self.release.wait()
        yield Response(Output(assistant_message("end"), FinishReason.STOP))


async def test_reject_calls_the_model_once_per_round(handles: list[Any]) -> None:
    rounds, width = 3, 20
    system = system_message("be brief")
    for round_ in range(rounds):
        model = HeldModel()
        refused: list[TurnInProgressError] = []
        reports = Reports()

        async def turn(
            i: int,
            model: HeldModel = model,
            refused: list[Any] = refused,
            reports: Reports = reports,
            round_: int = round_,
        ) -> None:
            store = handles[i % len(handles)]
            mw = Middleware(store, store, "c", on_incomplete=reports, layers=(Reject(),))
            try:
                await mw.call(model).call(Request([system, user_message(f"r{round_}q{i}")]))
            except TurnInProgressError as exc:
                refused.append(exc)
                if len(refused) == width - 1:
                    model.release.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(width):
                    tg.start_soon(turn, i)
        assert model.calls == 1, f"round {round_}: {model.calls} model calls"
        assert len(refused) == width - 1
        assert all(e.conversation_id == "c" and e.waited == 0.0 for e in refused)
        assert all("on_overlap='reject'" in str(e) for e in refused)
        assert [r.reason for r in reports] == [IncompleteReason.ERROR] * (width - 1)
    stored = await handles[0].read("c")
    assert len(stored) == 2 * rounds
    check_transcript(stored, system)
    assert await handles[-1].acquire_turn("c", "probe", 30) is True  # every lease released


async def test_wait_stores_every_turn_one_at_a_time(handles: list[Any]) -> None:
    width = 20
    system = system_message("be brief")
    model = HeldModel()
    model.release.set()

    async def turn(i: int) -> None:
        store = handles[i % len(handles)]
        mw = Middleware(store, store, "c", layers=(Wait(timeout=30),))
        await mw.call(model).call(Request([system, user_message(f"q{i}")]))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(width):
                tg.start_soon(turn, i)
    assert model.calls == width and model.most == 1
    stored = await handles[0].read("c")
    assert len(stored) == 2 * width
    assert sorted(m.text for m in stored[::2]) == sorted(f"q{i}" for i in range(width))
    check_transcript(stored, system)


async def test_wait_gives_up_after_overlap_timeout(handles: list[Any]) -> None:
    store = handles[-1]
    assert await store.acquire_turn("c", "someone else", 30) is True
    model = HeldModel()
    mw = Middleware(store, store, "c", layers=(Wait(timeout=0.05),))
    with pytest.raises(TurnInProgressError, match="gave up after waiting") as caught:
        await mw.call(model).call(Request([user_message("q")]))
    assert caught.value.waited >= 0.05
    assert caught.value.started_at is None  # the holder is not a turn of this process
    assert model.calls == 0
    assert await store.read("c") == []


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_interrupt_stops_the_running_turn_at_once(
    handles: list[Any], streaming: bool
) -> None:
    store = handles[0]  # one handle: the same process-wide registry entry
    running, newer = HeldModel(), HeldModel()
    newer.release.set()
    reports = Reports()
    outcome: list[BaseException] = []

    async def first() -> None:
        mw = Middleware(store, store, "c", on_incomplete=reports, layers=(Interrupt(),))
        request = Request([user_message("first")])
        try:
            if streaming:
                await collect(mw.stream(running).stream(request))
            else:
                await mw.call(running).call(request)
        except TurnInterruptedError as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await running.started.wait()
            mw = Middleware(store, store, "c", layers=(Interrupt(),))
            await mw.call(newer).call(Request([user_message("second")]))
    assert len(outcome) == 1 and outcome[0].conversation_id == "c"
    assert [r.reason for r in reports] == [IncompleteReason.INTERRUPTED]
    if streaming:
        assert reports[0].partial is not None and reports[0].partial.text == "partial "
    stored = await store.read("c")
    assert [m.text for m in stored] == ["second", f"second saw 0:{fingerprint([])}"]


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_an_interrupted_turn_is_kept_before_the_newer_one(
    handles: list[Any], streaming: bool
) -> None:
    # keep_interrupted + "interrupt" (DESIGN §6c/§6e): the running turn is stored with
    # what it had, marked "interrupted", while it still holds the lease; the newer turn
    # then runs on that history.
    store = handles[0]
    running, newer = HeldModel(), HeldModel()
    newer.release.set()
    outcome: list[BaseException] = []

    async def first() -> None:
        mw = Middleware(store, store, "c", layers=(Interrupt(), KeepInterrupted()))
        request = Request([user_message("first")])
        try:
            if streaming:
                await collect(mw.stream(running).stream(request))
            else:
                await mw.call(running).call(request)
        except TurnInterruptedError as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await running.started.wait()
            mw = Middleware(store, store, "c", layers=(Interrupt(),))
            await mw.call(newer).call(Request([user_message("second")]))
    assert len(outcome) == 1
    stored = await store.read("c")
    kept = ["first", "partial "] if streaming else ["first"]
    assert [m.text for m in stored[: len(kept)]] == kept
    assert stored[len(kept) - 1].metadata.decode("scope/interrupted") == "interrupted"
    assert stored[len(kept)].text == "second"


async def test_interrupt_across_handles_lands_at_the_next_renewal(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Two handles on one file are two leasers: the running turn learns of the newer one
    # through the interrupt marker at its next renewal (ttl / 3), as across processes.
    ttl = 0.3
    async with (
        fresh_backend("sqlite", tmp_path) as backend,
        await backend.open() as one,
        await backend.open() as two,
    ):
        running, newer = HeldModel(), HeldModel()
        newer.release.set()
        outcome: list[BaseException] = []

        async def first() -> None:
            mw = Middleware(one, one, "c", layers=(Interrupt(lease_ttl=ttl),))
            try:
                await mw.call(running).call(Request([user_message("first")]))
            except TurnInterruptedError as exc:
                outcome.append(exc)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await running.started.wait()
                mw = Middleware(two, two, "c", layers=(Interrupt(timeout=5),))
                await mw.call(newer).call(Request([user_message("second")]))
        assert len(outcome) == 1
        assert (await two.read("c"))[0].text == "second"


async def test_renewal_keeps_a_long_turn_exclusive(handles: list[Any]) -> None:
    store = handles[0]
    ttl = 0.2
    model = HeldModel()
    mw = Middleware(store, store, "c", layers=(Reject(lease_ttl=ttl),))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mw.call(model).call, Request([user_message("long")]))
            await model.started.wait()
            await anyio.sleep(ttl * 3)  # three lease lifetimes: only renewal keeps it
            other = handles[-1]
            assert await other.acquire_turn("c", "intruder", 30) is False
            model.release.set()
    assert await other.acquire_turn("c", "intruder", 30) is True


class FailingModel:
    async def call(self, request: Request) -> Response:
        raise RuntimeError("model down")

    def stream(self, request: Request) -> AsyncIterator[Response]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Response]:
        yield Response(Output(assistant_message("a")))
        raise RuntimeError("model down")


@pytest.mark.parametrize("strategy", ["reject", "wait", "interrupt"])
async def test_the_lease_is_released_on_every_path(handles: list[Any], strategy: str) -> None:
    store = handles[0]

    def mw() -> Middleware:
        return Middleware(store, store, "c", layers=keyword_layers(strategy))  # type: ignore[arg-type]

    async def free() -> bool:
        if await store.acquire_turn("c", "probe", 30):
            return bool(await store.release_turn("c", "probe"))
        return False

    request = Request([user_message("q")])
    # error, in a call and in a stream
    with pytest.raises(RuntimeError):
        await mw().call(FailingModel()).call(request)
    assert await free()
    with pytest.raises(RuntimeError):
        await collect(mw().stream(FailingModel()).stream(request))
    assert await free()
    # cancellation while the model runs
    held = HeldModel()
    with anyio.move_on_after(0.05):
        await mw().call(held).call(request)
    assert await free()
    # early stop of a stream
    stream = mw().stream(HeldModel()).stream(request)
    assert (await anext(stream)).text == "partial "
    await stream.aclose()  # type: ignore[attr-defined]
    assert await free()
    # commit
    held = HeldModel()
    held.release.set()
    await mw().call(held).call(request)
    assert await free()
    assert len(await store.read("c")) == 2


class PlainStore:
    """A Reader and Writer without leases."""

    async def read(self, conversation_id: str) -> list[Message]:
        return []

    async def append(self, batch: Batch) -> Receipt:
        return batch.receipt()


def test_strategies_are_checked_at_construction() -> None:
    store = InMemoryStore()
    plain = PlainStore()
    for strategy in ("reject", "wait", "interrupt"):
        with pytest.raises(TypeError, match="TurnLeaser"):
            Middleware(plain, plain, "c", layers=keyword_layers(strategy))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="needs exclusive_turns=True"):
            Middleware(store, store, "c", layers=keyword_layers(strategy, exclusive_turns=False))  # type: ignore[arg-type]
        # A leasing reader is enough.
        assert Middleware(store, plain, "c", layers=keyword_layers(strategy)).on_overlap == strategy  # type: ignore[arg-type]
    assert Middleware(plain, plain, "c", layers=(Unfenced(),)).on_overlap == "fence"
    assert Middleware(store, store, "c", layers=(Unfenced(),)).on_overlap == "fence"
    with pytest.raises(
        TypeError, match=r"Fence\(\) fences each commit .* PlainStore has no atomic"
    ):
        Middleware(plain, plain, "c")
    for bad in ("", "Reject", "lock", None, 1):
        with pytest.raises(ValueError, match="on_overlap must be one of"):
            Middleware(store, store, "c", layers=keyword_layers(bad))  # type: ignore[arg-type]
    for bad_timeout in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            Middleware(store, store, "c", layers=(Wait(timeout=bad_timeout),))
        with pytest.raises(ValueError, match="overlap_timeout must be a finite number"):
            keyword_layers("wait", overlap_timeout=bad_timeout)
    for bad_ttl in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lease_ttl must be a finite number"):
            Middleware(store, store, "c", layers=(Reject(lease_ttl=bad_ttl),))
    for wrong_type in ("1", True, None):  # the argument policy: a wrong type is TypeError
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            Middleware(store, store, "c", layers=(Interrupt(timeout=wrong_type),))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="overlap_timeout must be a number of seconds"):
            keyword_layers("wait", overlap_timeout=wrong_type)
        with pytest.raises(TypeError, match="lease_ttl must be a number of seconds"):
            Middleware(store, store, "c", layers=(Reject(lease_ttl=wrong_type),))  # type: ignore[arg-type]


def test_overlap_errors_are_history_errors_and_pickle() -> None:
    in_progress = TurnInProgressError("busy", conversation_id="c", started_at=1.5, waited=0.2)
    interrupted = TurnInterruptedError("stopped", conversation_id="c")
    for err in (in_progress, interrupted):
        assert isinstance(err, HistoryError)
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
        assert again.conversation_id == "c"
    assert pickle.loads(pickle.dumps(in_progress)).started_at == 1.5


_HOLDER_PROCESS = """
import sys, anyio
from scope.chat import Request, user_message
from scope.history import Middleware, Reject
from scope.historystores.sqlite import SQLiteStore

class Forever:
    async def call(self, request):
        print("holding", flush=True)
        await anyio.sleep_forever()

async def main():
    store = await SQLiteStore.open(sys.argv[1])
    mw = Middleware(store, store, "c", layers=(Reject(lease_ttl=float(sys.argv[2])),))
    await mw.call(Forever()).call(Request([user_message("never stored")]))

anyio.run(main)
"""


def test_a_killed_holder_blocks_no_longer_than_the_lease_ttl(tmp_path: Path) -> None:
    """A process killed with SIGKILL while its turn holds the lease: the conversation is
    refused while the lease lives and free once its ttl has passed (a waiting turn
    bounded by ttl + 2 s gets it)."""
    import subprocess
    import sys

    path, ttl = tmp_path / "h.db", 1.0
    asyncio.run(_open_and_close(path))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER_PROCESS, str(path), str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    finally:
        holder.kill()  # SIGKILL: no release, no cleanup
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()

    async def after_the_kill() -> None:
        async with await SQLiteStore.open(path) as store:
            model = Gate(1)
            rejecting = Middleware(store, store, "c", layers=(Reject(),))
            with pytest.raises(TurnInProgressError, match="another process or store handle"):
                await rejecting.call(model).call(Request([user_message("too soon")]))
            waiting = Middleware(store, store, "c", layers=(Wait(timeout=ttl + 2),))
            await waiting.call(model).call(Request([user_message("after the ttl")]))
            assert (await store.read("c"))[0].text == "after the ttl"

    asyncio.run(after_the_kill())


async def _open_and_close(path: Path) -> None:
    async with await SQLiteStore.open(path):
        pass


# ---------------------------------------------------------------- folded lease steps


class Steps:
    """A ``TurnLeaser`` (and ``ViewReader``/``Writer``) over an ``InMemoryStore`` that
    records the store steps it is asked for; ``FoldedSteps`` adds the folded ones."""

    def __init__(self, store: InMemoryStore | None = None) -> None:
        self.store = store or InMemoryStore()
        self.steps: list[str] = []

    async def read(self, conversation_id: str) -> list[Message]:
        self.steps.append("read")
        return await self.store.read(conversation_id)

    async def read_view(self, conversation_id: str) -> Any:
        self.steps.append("read_view")
        return await self.store.read_view(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        self.steps.append("append")
        return await self.store.append(batch)

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        self.steps.append("acquire_turn")
        return await self.store.acquire_turn(conversation_id, holder, ttl)

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        self.steps.append("release_turn")
        return await self.store.release_turn(conversation_id, holder)


class FoldedSteps(Steps):
    async def acquire_turn_view(self, conversation_id: str, holder: str, ttl: float) -> Any:
        self.steps.append("acquire_turn_view")
        return await self.store.acquire_turn_view(conversation_id, holder, ttl)

    async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
        self.steps.append("append_release_turn")
        return await self.store.append_release_turn(batch, holder)


async def _one_turn(mw: Middleware, streaming: bool, model: Any = None) -> None:
    model = model or Gate(1)
    request = Request([user_message("q")])
    if streaming:
        await collect(mw.stream(_Streaming(model)).stream(request))
    else:
        await mw.call(model).call(request)


class _Streaming:
    """A one-chunk Streamer over a Model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def stream(self, request: Request) -> AsyncIterator[Response]:
        yield await self.model.call(request)


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_a_reject_turn_makes_as_many_store_steps_as_a_fence_turn(streaming: bool) -> None:
    folded = FoldedSteps()
    await _one_turn(Middleware(folded, folded, "c"), streaming)
    assert folded.steps == ["read_view", "append"]
    folded.steps.clear()
    await _one_turn(Middleware(folded, folded, "c", layers=(Reject(),)), streaming)
    assert folded.steps == ["acquire_turn_view", "append_release_turn"]
    assert await folded.store.acquire_turn("c", "probe", 30) is True  # released
    assert len(await folded.store.read("c")) == 4


@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_a_store_without_folded_steps_takes_the_separate_steps(streaming: bool) -> None:
    plain = Steps()
    await _one_turn(Middleware(plain, plain, "c", layers=(Reject(),)), streaming)
    assert plain.steps == ["acquire_turn", "read_view", "append", "release_turn"]
    # A reader that is not the leaser (a WindowReader) reads on its own; the writer
    # still folds the release into the commit.
    folded = FoldedSteps()
    window = WindowReader(folded, 10)
    await _one_turn(Middleware(window, folded, "c", layers=(Reject(),)), streaming)
    assert folded.steps == ["acquire_turn", "read_view", "append_release_turn"]
    # A writer that leases without folding is the leaser (the writer comes first): no
    # step folds, whatever the reader can do.
    folded, writer = FoldedSteps(), Steps()
    writer.store = folded.store
    await _one_turn(Middleware(folded, writer, "c", layers=(Reject(),)), streaming)
    assert folded.steps == ["read_view"]
    assert writer.steps == ["acquire_turn", "append", "release_turn"]
    assert await folded.store.acquire_turn("c", "probe", 30) is True


async def test_a_refused_folded_commit_releases_the_lease_separately() -> None:
    folded = FoldedSteps()

    class Intruder:
        """A model during whose call another writer lands a batch: the fence refuses."""

        async def call(self, request: Request) -> Response:
            await folded.store.append(Batch("c", "intruder", [user_message("x")]))
            return Response(Output(assistant_message("late"), FinishReason.STOP))

    with pytest.raises(CommitError) as caught:
        await (
            Middleware(folded, folded, "c", layers=(Reject(),))
            .call(Intruder())
            .call(Request([user_message("q")]))
        )
    assert isinstance(caught.value.__cause__, HistoryChangedError)
    assert caught.value.retryable is False
    assert folded.steps == ["acquire_turn_view", "append_release_turn", "release_turn"]
    assert await folded.store.acquire_turn("c", "probe", 30) is True


async def test_a_cancelled_folded_commit_releases_the_lease_and_reports_the_batch() -> None:
    class Hanging(FoldedSteps):
        async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
            self.steps.append("append_release_turn")
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    hanging = Hanging()
    reports = Reports()
    mw = Middleware(hanging, hanging, "c", on_incomplete=reports, layers=(Reject(),))
    with anyio.move_on_after(0.05) as scope:
        await mw.call(Gate(1)).call(Request([user_message("q")]))
    assert scope.cancelled_caught
    assert hanging.steps == ["acquire_turn_view", "append_release_turn", "release_turn"]
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert reports[0].batch is not None
    assert await hanging.store.acquire_turn("c", "probe", 30) is True


async def test_a_folded_acquire_that_returns_no_history_view_is_a_store_error() -> None:
    class Broken(FoldedSteps):
        async def acquire_turn_view(self, conversation_id: str, holder: str, ttl: float) -> Any:
            await self.store.acquire_turn(conversation_id, holder, ttl)
            return ["not", "a", "view"]

    broken = Broken()
    model = CountingModel()
    with pytest.raises(StoreError, match="not a HistoryView"):
        await (
            Middleware(broken, broken, "c", layers=(Reject(),))
            .call(model)
            .call(Request([user_message("q")]))
        )
    assert model.calls == 0
    assert await broken.store.acquire_turn("c", "probe", 30) is True  # released


class Instant:
    """A model that answers (or fails) without ever suspending, and a stream whose
    chunks are all there at once."""

    def __init__(self, fail: bool = False, suspend: bool = False) -> None:
        self.fail = fail
        self.suspend = suspend

    async def call(self, request: Request) -> Response:
        if self.suspend:
            # A cancel scope entered before the first suspension (as httpx's timeouts
            # do) must nest inside the Middleware's own scopes.
            with anyio.fail_after(5):
                await anyio.sleep(0.001)
        if self.fail:
            raise RuntimeError("model down")
        return Response(Output(assistant_message("at once"), FinishReason.STOP))

    async def stream(self, request: Request) -> AsyncIterator[Response]:
        yield Response(Output(assistant_message("at ")))
        if self.suspend:
            with anyio.fail_after(5):
                await anyio.sleep(0.001)
        if self.fail:
            raise RuntimeError("model down")
        yield Response(Output(assistant_message("once"), FinishReason.STOP))


@pytest.mark.parametrize("suspend", [False, True], ids=["at-once", "suspending"])
@pytest.mark.parametrize("streaming", [False, True], ids=["call", "stream"])
async def test_a_leased_turn_whether_or_not_the_model_suspends(
    streaming: bool, suspend: bool
) -> None:
    # Lease.call starts its renewal task only when the model suspends; either way the
    # answer, the error and the release are the same.
    store = InMemoryStore()
    mw = Middleware(store, store, "c", layers=(Reject(),))
    request = Request([user_message("q")])

    async def turn(model: Instant) -> Response:
        if streaming:
            return await collect(mw.stream(model).stream(request))
        return await mw.call(model).call(request)

    assert (await turn(Instant(suspend=suspend))).text == "at once"
    with pytest.raises(RuntimeError, match="model down"):
        await turn(Instant(fail=True, suspend=suspend))
    assert [m.text for m in await store.read("c")] == ["q", "at once"]
    assert await store.acquire_turn("c", "probe", 30) is True


async def test_a_suspended_model_is_cancelled_through_the_resumed_await() -> None:
    # The cancellation reaches the model's own await (it sees it and cleans up) and
    # propagates unchanged; the lease is released.
    store = InMemoryStore()
    seen: list[str] = []

    class Slow:
        async def call(self, request: Request) -> Response:
            try:
                await anyio.sleep_forever()
            except BaseException as exc:
                seen.append(type(exc).__name__)
                raise
            raise AssertionError("unreachable")

    mw = Middleware(store, store, "c", layers=(Reject(),))
    with anyio.move_on_after(0.05) as scope:
        await mw.call(Slow()).call(Request([user_message("q")]))
    assert scope.cancelled_caught
    assert seen == [anyio.get_cancelled_exc_class().__name__]
    assert await store.acquire_turn("c", "probe", 30) is True
