"""How the persistent stores drive their drivers: every driver failure mapped to
``StoreError`` (``Driver``), one retry on a fresh connection where that is safe
(``retry_once``), cancellation a driver swallowed delivered anyway
(``cancellation_mark``, ``deliver_cancellation``), and warnings that point at the
caller (``warn_caller``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import warnings
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Final, Protocol, TypeVar, final

import anyio.lowlevel

from scope.errors import StoreError

__all__ = [
    "in_thread",
    "warn_caller",
    "cancellation_mark",
    "deliver_cancellation",
    "require_asyncio",
    "retry_once",
    "store_closed",
    "Driver",
    "Reconnecting",
]

T = TypeVar("T")


def require_asyncio(what: str, driver: str) -> None:
    """Raise ``RuntimeError`` unless an asyncio event loop runs this task."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{what} needs a running asyncio event loop ({driver} is asyncio-only); "
            "under trio use scope.historystores.sqlite.SQLiteStore"
        ) from None


async def cancellation_mark() -> int:
    """Call at the start of a store call, before the driver; pass the result to
    ``deliver_cancellation`` once the driver call returned or failed.

    Under asyncio a driver can swallow a cancellation: Python 3.11's ``asyncio.wait_for``
    (redis-py writes through it) returns the result when the awaited operation finishes
    in the same loop iteration as the ``task.cancel()``, and the task then goes on as if
    never cancelled. ``Task.cancelling()`` still counts the request (only whoever handles
    a cancellation calls ``uncancel()``), so a count that grew across the driver call
    means a cancellation arrived and was not delivered. The mark is that count; it is 0
    outside asyncio (trio delivers cancellation at every later checkpoint anyway).

    A count above 0 here means either a cancellation requested but not yet delivered
    (the driver could swallow it at its first await) or that this call runs in cleanup
    code after a delivered one; one checkpoint tells them apart: it raises
    ``CancelledError`` for the former, before any I/O, and returns for the latter.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio event loop in this thread: trio
        return 0
    if task is None:
        return 0
    if task.cancelling():
        await asyncio.sleep(0)
    return task.cancelling()


async def deliver_cancellation(mark: int, cause: BaseException | None = None) -> None:
    """Raise the cancellation a driver call swallowed (see ``cancellation_mark``), or
    one pending in an enclosing cancelled anyio/trio scope, instead of returning the
    call's result or raising its error (``cause``, chained). Returns when there is none.

    A store call that was cancelled therefore always ends cancelled, whatever the
    driver did; its outcome is unknown, as the store guarantees state (all or nothing,
    a retry of the same batch lands once).
    """
    # First a cancelled anyio/trio scope: its own delivery raises the exception that
    # scope recognises as its own (and so stops at it).
    await anyio.lowlevel.checkpoint_if_cancelled()
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None and task.cancelling() > mark:
        # A native Task.cancel() (or asyncio.timeout) that was swallowed.
        raise asyncio.CancelledError("cancelled during a store call") from cause


async def in_thread(executor: Executor, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a worker thread, run to its end: a cancellation that arrives
    meanwhile is raised once the call is done, instead of its result or error. A store
    call that is cancelled therefore always ends cancelled, whether its work succeeded
    or failed; its outcome is unknown, as the store guarantees state (all or nothing, a
    retry of the same batch lands once).

    Under asyncio the call goes straight to ``executor`` (the store handle's own
    threads), and the thread, when done, wakes the waiting task through one future of
    this call's (``loop.call_soon_threadsafe``): one turn of the event loop, as
    ``asyncio.to_thread`` takes. A cancellation (a native ``Task.cancel()``, or an anyio
    cancel scope, which re-delivers while the task waits) is caught and the wait goes on
    on a new future; the thread's future is never cancelled. A cancellation requested
    before the call and not yet delivered is raised first, before the thread starts (see
    ``cancellation_mark``). anyio's path (``anyio.to_thread.run_sync``) adds a
    checkpoint, its capacity limiter and a cancel scope to every call, and
    ``run_in_executor`` with ``asyncio.shield`` one more turn of the loop: together about
    10 us of a SQLite store call on a 2-core box. Under trio it is
    ``anyio.to_thread.run_sync``, then ``deliver_cancellation``."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no asyncio event loop in this thread: trio
        try:
            result: T = await anyio.to_thread.run_sync(fn, *args)
        except Exception as exc:
            await deliver_cancellation(0, exc)
            raise
        await deliver_cancellation(0)
        return result
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await asyncio.sleep(0)  # raises a cancellation not delivered yet (the mark's rule)
    waiter = _Waiter(loop)
    work = executor.submit(fn, *args)
    work.add_done_callback(waiter.done)
    pending: BaseException | None = None
    while True:
        try:
            await waiter.future
        except asyncio.CancelledError as exc:
            if work.done():
                raise pending or exc from None
            pending = pending or exc
            waiter.future = loop.create_future()  # the cancelled one is spent
            continue
        break
    if pending is not None:
        raise pending
    # An anyio cancel scope cancelled after the thread's end and before this task ran
    # again (anyio does not throw into a task whose wait is over): raised here too.
    await anyio.lowlevel.checkpoint_if_cancelled()
    return work.result()


@final
class _Waiter:
    """The future ``in_thread`` awaits, set by the worker thread's end (through the
    loop: ``done`` runs on the worker thread, ``wake`` on the loop's)."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def done(self, _: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self.wake)

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def store_closed(store: str) -> StoreError:
    """What a call on a store handle after its ``aclose()`` raises (``store``: the class
    name)."""
    return StoreError(f"the {store} is closed")


@final
class Driver:
    """How one backend's driver fails: what ``retry_once`` retries, what it maps.

    ``name`` starts every error text (``"PostgreSQL"``); ``errors`` is everything the
    driver raises (each becomes ``StoreError``); ``retryable`` the failures after which
    the same operation may succeed on a fresh connection (the connection or its session
    dropped); ``timeouts`` the ones that are never retried (see ``retry_once``).

    ``package`` is the driver's top-level package (``"redis"``): any other exception
    raised inside a call into its code (redis-py's cluster client raises
    ``AttributeError`` when a node's connection was torn down under a command: its
    writer is gone) is a failure of the driver's connection state too, so it counts as
    ``retryable``. An exception raised by scope's own code keeps propagating as the bug
    it is. ``answers`` picks the server's own answers to a command (Redis's
    ``WRONGTYPE``: a key holds another type): the same on any connection, so they are
    mapped and never retried, although redis-py raises them from inside its package.
    """

    __slots__ = ("answers", "errors", "name", "package", "retryable", "timeouts")

    def __init__(
        self,
        name: str,
        *,
        errors: tuple[type[BaseException], ...],
        retryable: tuple[type[BaseException], ...] = (),
        timeouts: tuple[type[BaseException], ...] = (),
        package: str | None = None,
        answers: Callable[[BaseException], bool] | None = None,
    ) -> None:
        self.name: Final = name
        self.errors: Final = errors
        self.retryable: Final = retryable
        self.timeouts: Final = timeouts
        self.package: Final = package
        self.answers: Final = answers

    def kind(self, exc: Exception) -> str | None:
        """What ``retry_once`` does with ``exc``: ``"timeout"``, ``"retry"``,
        ``"error"`` (mapped, not retried) or None (not the driver's: let it through)."""
        if isinstance(exc, self.timeouts):  # first: TimeoutError is an OSError
            return "timeout"
        if self.answers is not None and self.answers(exc):
            return "error"  # the server's answer to the command: the same on any connection
        if isinstance(exc, self.retryable) or self._raised_inside(exc):
            return "retry"
        if isinstance(exc, self.errors):
            return "error"
        return None

    def _raised_inside(self, exc: BaseException) -> bool:
        """Whether ``exc`` was raised inside a call into the driver's package: a frame of
        the package comes after scope's last frame (the innermost frame itself may be
        the standard library's, e.g. asyncio's streams under the driver)."""
        if self.package is None:
            return False
        inside = False
        tb = exc.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            if not isinstance(module, str):
                module = ""
            if module == self.package or module.startswith(self.package + "."):
                inside = True
            elif module == "scope" or module.startswith("scope."):
                inside = False
            tb = tb.tb_next
        return inside

    def failed(self, exc: BaseException, what: str) -> StoreError:
        """The ``StoreError`` of a driver failure (callers chain ``exc``)."""
        return StoreError(f"{self.name} {what} failed: {type(exc).__name__}: {exc}")


class Reconnecting(Protocol):
    """What ``retry_once`` needs of a store handle."""

    @property
    def closed(self) -> bool: ...

    def _timed_out(self, exc: BaseException, what: str) -> StoreError:
        """The ``StoreError`` of a timeout (``exc`` is one of ``Driver.timeouts``)."""
        ...

    async def _reconnect(self) -> None:
        """Make the next attempt use a fresh connection (the server may have dropped
        every pooled one: a restart, a killed session)."""
        ...


async def retry_once(
    store: Reconnecting,
    driver: Driver,
    attempt: Callable[[], Awaitable[T]],
    what: str,
    settle: Callable[[BaseException | None], Awaitable[None]] | None = None,
) -> T:
    """``await attempt()``, retried once on a fresh connection when the connection
    dropped; every driver failure becomes a ``StoreError`` naming ``what``, with the
    driver's error chained.

    A ``driver.retryable`` failure of the first attempt reconnects (``store._reconnect``)
    and runs ``attempt`` again, its errors naming ``what (retried on a fresh
    connection)``; the store refuses instead (``store_closed``) when it was closed
    meanwhile. Retrying is always safe: every store operation is idempotent (an
    append's retry is recognised by its append id). A ``driver.timeouts`` failure is
    ``store._timed_out(exc, what)`` and never retried: whatever held the call (a lock,
    a full pool, load, a dead network) most likely still holds it, and a retry would
    double the caller's wait; the caller may repeat the call. Any other
    ``driver.errors`` failure is ``driver.failed(exc, what)``. An exception raised
    inside the driver's package that is none of these counts as retryable (see
    ``Driver``).

    ``settle`` runs after each attempt, before anything else, with its error or None:
    Redis passes ``deliver_cancellation`` there, so a cancellation the driver swallowed
    is raised instead of a retry, an error or the result.
    """
    for retry in (False, True):
        if retry:
            what = f"{what} (retried on a fresh connection)"
        try:
            result = await attempt()
        except Exception as exc:
            kind = driver.kind(exc)
            if kind is None:
                raise  # not a driver failure: scope's own error or a bug
            if settle is not None:
                await settle(exc)
            if kind == "timeout":
                raise store._timed_out(exc, what) from exc
            if kind == "error" or retry:
                raise driver.failed(exc, what) from exc
            if store.closed:
                raise store_closed(type(store).__name__) from None
            await store._reconnect()
            continue
        if settle is not None:
            await settle(None)
        return result
    raise AssertionError("unreachable: the second attempt returns or raises")


#: This package's directory: ``warn_caller`` skips the frames inside it.
_PACKAGE: Final = os.path.dirname(__file__) + os.sep


def warn_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the first frame outside ``scope.historystores``:
    the code that opened the store, through ``open_store`` or a store's ``open``."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
