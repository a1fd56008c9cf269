"""``in_thread``: a store call's work on a worker thread, run to its end whatever
happens to the task that awaits it (``scope.historystores._driver``; SQLite's calls go
through it). Under asyncio and trio: a cancellation that arrives while the thread works
is raised once the work is done, instead of its result or its error; the thread's
future is never cancelled; a cancellation requested before the call is raised before
the thread starts."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import pytest

from scope.historystores._driver import in_thread

pytestmark = pytest.mark.anyio


class Gate:
    """A worker-thread body that waits until the test lets it finish, and says when
    it started and whether it ran to its end."""

    def __init__(self, outcome: Callable[[], Any] = lambda: "done") -> None:
        self.outcome = outcome
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self) -> Any:
        self.started.set()
        assert self.release.wait(60)  # a bound for a hang only: released within milliseconds
        try:
            return self.outcome()
        finally:
            self.finished.set()


class Watched(ThreadPoolExecutor):
    """An executor that keeps the futures of what it runs."""

    def __init__(self) -> None:
        super().__init__(2)
        self.futures: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


@pytest.fixture
def executor() -> Iterator[Watched]:
    pool = Watched()
    yield pool
    pool.shutdown(wait=True)


async def started(gate: Gate) -> None:
    """Return once the gate's body runs on its thread."""
    assert await anyio.to_thread.run_sync(gate.started.wait, 60)


async def test_the_result_and_the_error_of_the_work(executor: Watched) -> None:
    assert await in_thread(executor, lambda a, b: a + b, 2, 3) == 5

    def fail() -> None:
        raise ValueError("from the thread")

    with pytest.raises(ValueError, match="from the thread"):
        await in_thread(executor, fail)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("outcome", ["result", "error"])
async def test_task_cancel_while_the_thread_works_ends_cancelled_after_it(
    executor: Watched, outcome: str
) -> None:
    def end() -> str:
        if outcome == "error":
            raise ValueError("the work failed")
        return "done"

    gate = Gate(end)
    task = asyncio.ensure_future(in_thread(executor, gate))
    await started(gate)
    task.cancel()
    await asyncio.sleep(0.01)
    task.cancel()  # delivered again while the thread still works: still waits
    await asyncio.sleep(0.01)
    assert not task.done()  # waits for the thread, cancelled twice
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.finished.is_set()
    assert task.cancelled()
    [future] = executor.futures
    assert future.done() and not future.cancelled()  # the work ran to its end


async def test_a_cancel_scope_cancelled_while_the_thread_works_ends_cancelled(
    executor: Watched,
) -> None:
    gate = Gate()
    returned = []

    async def call() -> None:
        returned.append(await in_thread(executor, gate))

    async def release_later() -> None:
        await started(gate)
        scope.cancel()
        with anyio.CancelScope(shield=True):  # this task is in the cancelled scope too
            await anyio.sleep(0.02)
        assert not gate.finished.is_set()
        gate.release.set()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(release_later)
            await call()
    assert scope.cancelled_caught
    assert returned == []  # the result is not returned: the call ended cancelled
    assert gate.finished.is_set()
    assert not executor.futures or not executor.futures[0].cancelled()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancel_scope_cancelled_after_the_thread_ended_ends_cancelled(
    executor: Watched,
) -> None:
    # The scope is cancelled after the thread's end has woken the waiting task and
    # before the task runs again: anyio does not throw into a task whose wait is over,
    # so in_thread looks at its scope before returning the result.
    gate = Gate()
    returned = []
    loop = asyncio.get_running_loop()

    queued = threading.Event()

    def cancel_later(_: object) -> None:
        loop.call_soon_threadsafe(scope.cancel)
        queued.set()

    async def cancel_after_the_thread() -> None:
        await started(gate)
        [future] = executor.futures
        # Runs after in_thread's own done callback (added when it submitted the work),
        # so the loop gets in_thread's wake-up first, then the scope's cancel.
        future.add_done_callback(cancel_later)
        gate.release.set()
        assert queued.wait(60)  # holds the loop until both are queued

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(cancel_after_the_thread)
            returned.append(await in_thread(executor, gate))
    assert scope.cancelled_caught
    assert returned == []
    assert gate.finished.is_set()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancellation_requested_before_the_call_is_raised_before_the_thread(
    executor: Watched,
) -> None:
    ran = threading.Event()

    async def call() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # requested, not delivered: the task has not waited since
        await in_thread(executor, ran.set)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(call())
    assert executor.futures == []
    assert not ran.is_set()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_in_cleanup_after_a_delivered_cancellation_the_call_runs(
    executor: Watched,
) -> None:
    # The task was cancelled and caught it (cancelling() stays above 0): a store call
    # in its cleanup still runs and returns.
    got = []

    async def call() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            got.append(await in_thread(executor, lambda: "cleanup"))
            raise

    task = asyncio.ensure_future(call())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == ["cleanup"]


def test_a_thread_that_ends_after_its_loop_closed_raises_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    executor = Watched()
    gate = Gate()

    tasks = []

    async def main() -> None:
        tasks.append(asyncio.ensure_future(in_thread(executor, gate)))
        assert await asyncio.to_thread(gate.started.wait, 60)

    loop = asyncio.new_event_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    with caplog.at_level("ERROR"):
        gate.release.set()
        executor.shutdown(wait=True)
    tasks.clear()  # the task waited on the thread when its loop closed
    gc.collect()
    assert set(reported) <= {"Task was destroyed but it is pending!"}
    [future] = executor.futures
    assert future.result() == "done"
    assert caplog.records == []  # no "exception calling callback" from the thread
