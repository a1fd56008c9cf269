"""The lease layer of the history Middleware (DESIGN §6e) under cancellation and load,
over every bundled store: a turn cancelled while it takes the lease leaves none behind;
a cancellation while the lease is released after the commit still reports the stored
turn; ``"wait"`` serves the turns of one process in arrival order.

In-memory and SQLite run under asyncio and trio; PostgreSQL and Redis (asyncio-only
drivers) under asyncio, against the real servers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
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
    user_message,
)
from scope.errors import CommitError, StoreError, TurnInProgressError, TurnInterruptedError
from scope.history import (
    Batch,
    HistoryCache,
    IncompleteReason,
    IncompleteTurn,
    Interrupt,
    Middleware,
    Receipt,
    Reject,
    Wait,
    keyword_layers,
)
from scope.history.inmemory import InMemoryStore
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


class Reports(list[IncompleteTurn]):
    def __call__(self, turn: IncompleteTurn) -> None:
        self.append(turn)


class Answer:
    """A model that answers at once and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request: Request) -> Response:
        self.calls += 1
        return Response(Output(assistant_message("ok"), FinishReason.STOP))


async def _free(store: Any, conversation_id: str = "c") -> bool:
    """Whether another holder can take the conversation's lease now (it is given back)."""
    if await store.acquire_turn(conversation_id, "probe", 30):
        return bool(await store.release_turn(conversation_id, "probe"))
    return False


class Cached:
    """A third-party store handle that keeps a ``HistoryCache`` of its own, so the
    lease layer's slots (arrival order, interrupts within the process) live there."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.history_cache = HistoryCache()


class Unfolded:
    """A store's separate lease steps only (no folded ones), with hooks: the
    acquire may answer late once the store took the lease, the release signals its
    start."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.hang_after_acquire = False
        self.releasing = anyio.Event()

    async def read(self, conversation_id: str) -> list[Message]:
        return list(await self.store.read(conversation_id))

    async def read_view(self, conversation_id: str) -> Any:
        return await self.store.read_view(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        return await self.store.append(batch)  # type: ignore[no-any-return]

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        taken = bool(await self.store.acquire_turn(conversation_id, holder, ttl))
        if self.hang_after_acquire:
            await anyio.sleep(0.3)  # the cancellation lands with the lease taken
        return taken

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        self.releasing.set()
        released = bool(await self.store.release_turn(conversation_id, holder))
        await anyio.lowlevel.checkpoint()  # a store that did not suspend: here, then
        return released


class Folded(Unfolded):
    async def acquire_turn_view(self, conversation_id: str, holder: str, ttl: float) -> Any:
        view = await self.store.acquire_turn_view(conversation_id, holder, ttl)
        if self.hang_after_acquire:
            await anyio.sleep(0.3)
        return view

    async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
        return await self.store.append_release_turn(batch, holder)  # type: ignore[no-any-return]


def _wrapped(store: Any) -> Unfolded:
    return Folded(store) if hasattr(store, "acquire_turn_view") else Unfolded(store)


# ------------------------------------------------- a turn cancelled while it takes the lease


@pytest.mark.parametrize("native", [False, True], ids=["scope", "native"])
@pytest.mark.parametrize("strategy", ["reject", "wait", "interrupt"])
async def test_a_turn_cancelled_after_the_store_took_its_lease_gives_it_back(
    store: Any, strategy: str, native: bool, anyio_backend: str
) -> None:
    # A cancel scope waits for the (shielded) lease step, then gives the lease back; a
    # native asyncio cancellation pierces the shield and gives it back at once.
    if native and anyio_backend != "asyncio":
        pytest.skip("a native cancellation is asyncio's")
    leaser = _wrapped(store)
    leaser.hang_after_acquire = True
    reports = Reports()
    model = Answer()
    mw = Middleware(leaser, leaser, "c", on_incomplete=reports, layers=keyword_layers(strategy))  # type: ignore[arg-type]
    request = Request([user_message("q")])
    if native:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await mw.call(model).call(request)
    else:
        with anyio.move_on_after(0.1) as scope:
            await mw.call(model).call(request)
        assert scope.cancelled_caught
    assert model.calls == 0
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert await _free(store)  # not locked for lease_ttl
    leaser.hang_after_acquire = False
    await mw.call(model).call(Request([user_message("again")]))  # not refused
    assert [m.text for m in await store.read("c")] == ["again", "ok"]


async def test_turns_cancelled_at_random_points_leave_no_lease_behind(store: Any) -> None:
    # Cancelled before, during and after the acquire (the store's own steps, no hooks):
    # the next turn of the same process is never refused, and the lease ends up free.
    rng = random.Random(32)
    model = Answer()
    mw = Middleware(store, store, "c", layers=(Reject(),))
    refused: list[str] = []
    for i in range(40):
        with anyio.move_on_after(rng.uniform(0, 0.004)):
            await mw.call(model).call(Request([user_message(f"cancelled {i}")]))
        try:
            await mw.call(model).call(Request([user_message(f"next {i}")]))
        except TurnInProgressError as exc:
            refused.append(str(exc))
    assert refused == []
    assert await _free(store)


async def test_a_lease_left_behind_is_not_blamed_on_another_process() -> None:
    class NoRelease(Unfolded):
        """Takes the lease, then answers late; its releases fail."""

        async def release_turn(self, conversation_id: str, holder: str) -> bool:
            raise OSError("store down")

    store = InMemoryStore()
    leaser = NoRelease(store)
    leaser.hang_after_acquire = True
    mw = Middleware(leaser, leaser, "c", layers=(Reject(lease_ttl=30),))
    with anyio.move_on_after(0.1):
        await mw.call(Answer()).call(Request([user_message("q")]))
    leaser.hang_after_acquire = False
    with pytest.raises(TurnInProgressError) as caught:
        await mw.call(Answer()).call(Request([user_message("again")]))
    message = str(caught.value)
    assert "a lease this process left behind" in message
    assert "another process" not in message
    assert caught.value.started_at is None


# ------------------------------------------ a cancellation while the lease is released


async def test_a_cancellation_during_the_release_after_the_commit_reports_the_stored_turn(
    store: Any, anyio_backend: str
) -> None:
    # A store without folded steps releases the lease in a step after the commit (as
    # PostgreSQL does); a cancellation landing there must not read as "not stored".
    leaser = Unfolded(store)
    reports = Reports()
    mw = Middleware(leaser, leaser, "c", on_incomplete=reports, layers=(Reject(),))
    request = Request([user_message("q")])
    if anyio_backend == "asyncio":
        # A native cancellation (asyncio.timeout, Task.cancel) pierces every shield:
        # it propagates, and the report says the turn is stored.
        task = asyncio.ensure_future(mw.call(Answer()).call(request))
        await leaser.releasing.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
        stored = reports[0]
        assert stored.batch is not None and stored.receipt is not None
        stored.receipt.validate_for(stored.batch)
        assert await store.append(stored.batch) == stored.receipt  # a retry appends nothing
        assert [m.text for m in await store.read("c")] == ["q", "ok"]
        reports.clear()
    # A cancel scope waits for the shielded release: the turn returns as stored.
    leaser = Unfolded(store)
    mw = Middleware(leaser, leaser, "c2", on_incomplete=reports, layers=(Reject(),))
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def cancel_when_releasing() -> None:
                await leaser.releasing.wait()
                scope.cancel()

            group.start_soon(cancel_when_releasing)
            answer = await mw.call(Answer()).call(Request([user_message("q2")]))
    assert answer.text == "ok" and reports == []
    assert [m.text for m in await store.read("c2")] == ["q2", "ok"]
    assert await _free(store, "c2")


# --------------------------------------------------------------- waiters in arrival order


class Ordered:
    """Records the order in which turns reach the model; the first call waits for
    ``release``."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def call(self, request: Request) -> Response:
        self.seen.append(request.messages[-1].text)
        self.started.set()
        await self.release.wait()
        return Response(Output(assistant_message("ok"), FinishReason.STOP))


@pytest.mark.parametrize("strategy", ["wait", "interrupt"])
async def test_waiters_are_served_in_arrival_order(store: Any, strategy: str) -> None:
    model = Ordered()
    early, late = [f"early {i}" for i in range(6)], [f"late {i}" for i in range(4)]

    interrupted: list[str] = []

    async def turn(text: str, how: str = "wait") -> None:
        mw = Middleware(store, store, "c", layers=keyword_layers(how, overlap_timeout=30))  # type: ignore[arg-type]
        try:
            await mw.call(model).call(Request([user_message(text)]))
        except TurnInterruptedError:
            interrupted.append(text)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(turn, "running")
            await model.started.wait()
            for text in early:
                group.start_soon(turn, text)
                await anyio.wait_all_tasks_blocked()  # queued before the next arrives
            # While turns of this process wait, "reject" is refused without contending.
            with pytest.raises(TurnInProgressError, match="in this process"):
                await (
                    Middleware(store, store, "c", layers=(Reject(),))
                    .call(model)
                    .call(Request([user_message("rejected")]))
                )
            if strategy == "interrupt":
                group.start_soon(turn, "newest", "interrupt")
                await anyio.wait_all_tasks_blocked()
            model.release.set()
            for text in late:  # arrive while the queue drains
                group.start_soon(turn, text)
                await anyio.wait_all_tasks_blocked()
    # The interrupting turn stopped the turn running when it arrived, and queued
    # behind the turns already waiting.
    newest = ["newest"] if strategy == "interrupt" else []
    assert model.seen == ["running", *early, *newest, *late]
    assert interrupted == (["running"] if strategy == "interrupt" else [])
    stored = [m.text for m in await store.read("c")][::2]
    assert stored == (model.seen[1:] if strategy == "interrupt" else model.seen)


class TwoChunks:
    async def stream(self, request: Request) -> AsyncIterator[Response]:
        yield Response(Output(assistant_message("first ")))
        yield Response(Output(assistant_message("second"), FinishReason.STOP))


async def test_a_stream_left_unclosed_blocks_the_next_turn_no_longer_than_the_ttl() -> None:
    # The lease is renewed while the model is awaited; a stream whose consumer holds a
    # chunk and goes away holds it no longer than lease_ttl, for this process too.
    store = InMemoryStore()
    ttl = 0.3
    left = Middleware(store, store, "c", layers=(Wait(lease_ttl=ttl),))
    stream = left.stream(TwoChunks()).stream(Request([user_message("left open")]))
    assert (await anext(stream)).text == "first "
    waiting = Middleware(store, store, "c", layers=(Wait(timeout=10),))
    with anyio.fail_after(5):
        start = anyio.current_time()
        await waiting.call(Answer()).call(Request([user_message("next")]))
    assert anyio.current_time() - start >= ttl * 0.9
    assert (await anext(stream)).text == "second"
    with pytest.raises(CommitError):  # the fence refuses the stale turn's commit
        await anext(stream)
    assert [m.text for m in await store.read("c")] == ["next", "ok"]
    assert await _free(store)


async def test_a_lease_step_that_never_answers_is_a_store_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The acquire runs shielded so that a cancellation finds it settled; a store that
    # never answers is bounded instead, like the release.
    from scope.history import _overlap

    class Hung(Unfolded):
        async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    monkeypatch.setattr(_overlap, "RELEASE_TIMEOUT", 0.05)
    store = InMemoryStore()
    leaser = Hung(store)
    reports = Reports()
    model = Answer()
    mw = Middleware(leaser, leaser, "c", on_incomplete=reports, layers=(Reject(),))
    with anyio.fail_after(5), pytest.raises(StoreError, match=r"not answered within 0\.05 s"):
        await mw.call(model).call(Request([user_message("q")]))
    assert model.calls == 0 and leaser.releasing.is_set()  # given back, just in case
    assert [r.reason for r in reports] == [IncompleteReason.ERROR]


async def test_the_process_keeps_nothing_of_a_conversation_it_is_done_with() -> None:
    # The handle's queue of a conversation and its leftover tokens are dropped once
    # empty (a leftover once its ttl has passed).
    from scope.history import _overlap

    class NoRelease(Unfolded):
        history_cache = HistoryCache()  # its slots, where the test can see them

        async def release_turn(self, conversation_id: str, holder: str) -> bool:
            raise OSError("store down")

    store = InMemoryStore()
    mw = Middleware(store, store, "done", layers=(Wait(),))
    await mw.call(Answer()).call(Request([user_message("q")]))
    with pytest.raises(TurnInProgressError):
        assert await store.acquire_turn("done", "someone", 30)
        await (
            Middleware(store, store, "done", layers=(Reject(),))
            .call(Answer())
            .call(Request([user_message("refused")]))
        )
    assert store.history_cache.turns == {}  # kept in the handle's own state
    assert _overlap.slots_of(store) is store.history_cache.turns
    leaser = NoRelease(store)
    leaser.hang_after_acquire = True
    for cid in ("first", "second"):
        with anyio.move_on_after(0.05):
            await (
                Middleware(leaser, leaser, cid, layers=(Reject(lease_ttl=0.1),))
                .call(Answer())
                .call(Request([user_message("q")]))
            )
        await anyio.sleep(0.15)  # the first leftover expires before the second is left
    assert list(leaser.history_cache.turns) == ["second"]
    assert store.history_cache.turns == {}


async def test_a_turn_interrupted_before_its_model_call_never_calls_it() -> None:
    class SlowRead(Unfolded):
        history_cache = HistoryCache()  # one set of slots for both Middlewares
        reading = anyio.Event()
        proceed = anyio.Event()

        async def read_view(self, conversation_id: str) -> Any:
            self.reading.set()
            await self.proceed.wait()  # the newer turn arrives meanwhile
            return await self.store.read_view(conversation_id)

    store = InMemoryStore()
    leaser = SlowRead(store)
    first, second = Answer(), Answer()
    outcome: list[BaseException] = []

    async def older() -> None:
        mw = Middleware(leaser, leaser, "c", layers=(Interrupt(),))
        try:
            await mw.call(first).call(Request([user_message("older")]))
        except TurnInterruptedError as exc:
            outcome.append(exc)

    async def newer() -> None:
        mw = Middleware(leaser, leaser, "c", layers=(Interrupt(),))
        await mw.call(second).call(Request([user_message("newer")]))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(older)
            await leaser.reading.wait()  # the older turn holds the lease, reading
            group.start_soon(newer)
            await anyio.wait_all_tasks_blocked()  # it stopped the older one, and waits
            leaser.proceed.set()
    assert len(outcome) == 1 and first.calls == 0 and second.calls == 1
    assert [m.text for m in await store.read("c")] == ["newer", "ok"]


# ------------------------------------------------------ one renewal task per lease


class Renewals(Folded):
    """Records which task renews the lease (an ``acquire_turn`` of the conversation
    itself, after the folded acquire); ``lose``: a renewal finds the lease taken."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.tasks: list[object] = []  # the task objects themselves (ids are reused)
        self.lose = False

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        if conversation_id == "c":
            self.tasks.append(_current_task())
            if self.lose:
                return False
        return await super().acquire_turn(conversation_id, holder, ttl)


def _current_task() -> object:
    """The running task object (under trio, trio's; else asyncio's)."""
    import trio

    try:
        return trio.lowlevel.current_task()
    except RuntimeError:  # not in a trio run
        return asyncio.current_task()


class LongStream:
    """``chunks`` chunks, each after ``pause`` seconds; then, with ``hang``, a chunk
    that never comes."""

    def __init__(self, chunks: int, pause: float, hang: bool = False) -> None:
        self.chunks, self.pause, self.hang = chunks, pause, hang
        self.started = anyio.Event()

    async def stream(self, request: Request) -> AsyncIterator[Response]:
        for i in range(self.chunks):
            await anyio.sleep(self.pause)
            self.started.set()
            last = i == self.chunks - 1 and not self.hang
            yield Response(Output(assistant_message(f"{i} "), FinishReason.STOP if last else None))
        if self.hang:
            await anyio.sleep_forever()

    async def call(self, request: Request) -> Response:
        self.started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_long_stream_is_renewed_by_one_task_per_lease() -> None:
    # The renewal task is the lease's: started with it, ended at its release; not one
    # per awaited chunk (nor the consumer's own task).
    store = InMemoryStore()
    leaser = Renewals(store)
    ttl = 0.15
    mw = Middleware(leaser, leaser, "c", layers=(Wait(lease_ttl=ttl),))
    per_turn: list[list[object]] = []
    with anyio.fail_after(10):
        for text in ("first", "second"):
            leaser.tasks.clear()
            chunks = [
                c.text
                async for c in mw.stream(LongStream(12, ttl / 5)).stream(
                    Request([user_message(text)])
                )
            ]
            assert len(chunks) == 12
            per_turn.append(list(leaser.tasks))
        renewed = len(leaser.tasks)
        await anyio.sleep(ttl)  # ended at the release: nothing renews any more
        assert len(leaser.tasks) == renewed
    consumer = _current_task()
    for tasks in per_turn:
        assert len(tasks) >= 2  # 12 chunks of ttl / 5: renewed every ttl / 3
        assert len({id(task) for task in tasks}) == 1 and tasks[0] is not consumer
    assert per_turn[0][0] is not per_turn[1][0]  # each lease has its own
    assert await _free(store)


@pytest.mark.parametrize("how", ["lost", "marker"])
@pytest.mark.parametrize("kind", ["call", "stream"])
async def test_a_lost_lease_or_an_interrupt_marker_stops_the_model_await(
    how: str, kind: str
) -> None:
    # The renewal task stops the turn from outside its await: the await under way (a
    # call, or a stream's next chunk) is cancelled at once and the turn raises
    # TurnInterruptedError; nothing is stored and the lease is given back.
    from scope.history._overlap import marker_id

    store = InMemoryStore()
    leaser = Renewals(store)
    ttl = 0.15
    reports = Reports()
    mw = Middleware(leaser, leaser, "c", on_incomplete=reports, layers=(Reject(lease_ttl=ttl),))
    model = LongStream(1, 0, hang=True)
    request = Request([user_message("q")])
    seen: list[str] = []

    async def turn() -> None:
        if kind == "call":
            await mw.call(model).call(request)
        else:
            async for chunk in mw.stream(model).stream(request):
                seen.append(chunk.text)

    async def intrude() -> None:
        await model.started.wait()
        if how == "lost":
            leaser.lose = True  # the next renewal finds another holder's lease
        else:
            assert await store.acquire_turn(marker_id("c"), "newer", 30)  # another process

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(intrude)
            with pytest.raises(TurnInterruptedError) as caught:
                await turn()
    reason = "taken over" if how == "lost" else "interrupted by a newer turn"
    assert reason in str(caught.value)
    assert seen == (["0 "] if kind == "stream" else [])
    assert [r.reason for r in reports] == [IncompleteReason.INTERRUPTED]
    assert await store.read("c") == []
    assert await _free(store)


class Gated:
    """A model whose call waits for ``go``, then answers."""

    def __init__(self) -> None:
        self.started, self.go = anyio.Event(), anyio.Event()

    async def call(self, request: Request) -> Response:
        self.started.set()
        await self.go.wait()
        return Response(Output(assistant_message("ok"), FinishReason.STOP))


class FailingRenewal(Renewals):
    """Every renewal of the conversation's lease fails with a store error."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.failed = anyio.Event()

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        if conversation_id == "c":
            self.failed.set()
            raise StoreError("the store is unreachable")
        return await super().acquire_turn(conversation_id, holder, ttl)


async def test_a_renewal_that_fails_is_logged_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A store failure while renewing stops nothing: it is logged (the lease may expire
    # meanwhile), and the turn commits, guarded by the fence; the lease is given back.
    store = InMemoryStore()
    leaser = FailingRenewal(store)
    mw = Middleware(leaser, leaser, "c", layers=(Reject(lease_ttl=0.15),))
    model = Gated()
    with anyio.fail_after(5), caplog.at_level("WARNING", logger="scope.history"):
        async with anyio.create_task_group() as group:

            async def release_after_a_failed_renewal() -> None:
                await leaser.failed.wait()
                model.go.set()

            group.start_soon(release_after_a_failed_renewal)
            response = await mw.call(model).call(Request([user_message("q")]))
    assert response.message.text == "ok"
    assert [m.text for m in await store.read("c")] == ["q", "ok"]
    warnings = [r for r in caplog.records if "renewing the turn lease" in r.getMessage()]
    assert warnings and "conversation 'c'" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None  # the store error, with its traceback
    assert await _free(store)


class HeldRenewal(Renewals):
    """A renewal of the conversation's lease waits for ``resume`` once it is under way
    (``holding``); it then renews as usual."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.holding, self.resume = anyio.Event(), anyio.Event()

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        if conversation_id == "c" and not self.holding.is_set():
            self.holding.set()
            await self.resume.wait()
        return await super().acquire_turn(conversation_id, holder, ttl)


async def test_a_turn_waits_for_a_renewal_under_way_before_it_commits() -> None:
    # A renewal under way when the model answers is finished first (shielded): its
    # outcome (a lost lease stops the turn) is known before the commit, and it cannot
    # take the lease again after the release.
    store = InMemoryStore()
    leaser = HeldRenewal(store)
    mw = Middleware(leaser, leaser, "c", layers=(Reject(lease_ttl=0.15),))
    model = Gated()
    done = anyio.Event()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def turn() -> None:
                await mw.call(model).call(Request([user_message("q")]))
                done.set()

            group.start_soon(turn)
            await leaser.holding.wait()  # a renewal is under way ...
            model.go.set()  # ... as the model answers
            await anyio.wait_all_tasks_blocked()
            assert await store.read("c") == []  # the turn waits for the renewal
            assert not done.is_set()
            assert not await _free(store)  # the lease is still the turn's
            leaser.resume.set()
        assert done.is_set()
    assert [m.text for m in await store.read("c")] == ["q", "ok"]
    assert await _free(store)  # given back after the renewal, and not taken again


async def test_a_cancellation_of_a_leased_stream_stays_a_cancellation() -> None:
    # The await's own cancel scope only absorbs a stop: the caller's cancellation goes
    # on as it is (reported as cancelled, not interrupted), and the lease is given back.
    store = InMemoryStore()
    leaser = Renewals(store)
    reports = Reports()
    mw = Middleware(leaser, leaser, "c", on_incomplete=reports, layers=(Reject(lease_ttl=0.15),))
    model = LongStream(1, 0, hang=True)
    with anyio.fail_after(5):
        with anyio.move_on_after(0.2) as scope:
            async for _ in mw.stream(model).stream(Request([user_message("q")])):
                pass
    assert scope.cancelled_caught
    assert len(leaser.tasks) >= 1  # renewed meanwhile
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]
    assert await _free(store)


# ------------------------------------------------- the slots belong to the store handle


async def test_the_slots_are_the_store_handles(tmp_path: Path, anyio_backend: str) -> None:
    from scope.history import _overlap

    store = InMemoryStore()
    assert _overlap.slots_of(store) is store.history_cache.turns
    async with (  # two handles on one file: to each other, two processes
        fresh_backend("sqlite", tmp_path) as backend,
        await backend.open() as one,
        await backend.open() as two,
    ):
        assert _overlap.slots_of(one) is one.history_cache.turns
        assert _overlap.slots_of(one) is not _overlap.slots_of(two)
    # A leaser with no history_cache: the slots are each Middleware's own (no state
    # kept anywhere else); one with a history_cache of its own keeps them there.
    leaser = Unfolded(store)
    assert _overlap.slots_of(leaser) is not _overlap.slots_of(leaser)
    cached = Cached(store)
    assert _overlap.slots_of(cached) is cached.history_cache.turns
