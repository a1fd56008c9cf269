"""Overlapping turns (DESIGN §6e): the ``on_overlap`` strategies of the history
``Middleware``, built on a store's ``TurnLeaser``.

Under ``"reject"``, ``"wait"`` and ``"interrupt"`` a turn takes the conversation's lease
before it reads the history and calls the model (``Overlap.begin``), renews it while
the model runs (``Lease.call`` / ``Lease.chunks``: a renewal task beside each await of
the model, every ``ttl / 3`` seconds) and releases it on every path (``Lease.release``:
shielded from cancellation, bounded by ``RELEASE_TIMEOUT``). The fence (§6b) stays on.

How a turn learns that it must stop (``TurnInterruptedError``):

- **In one process**, a newer ``"interrupt"`` turn finds the running turn in a
  process-wide registry keyed by the leaser object (the store handle) and the
  conversation id, and cancels the running turn's model await at once. The registry
  holds a turn only while it holds its lease; it is guarded by a thread lock, and the
  cancellation is delivered on the running turn's own event loop (use one store handle
  per event loop, as every store asks).
- **Across processes** (or two handles on one database in one process), the newer turn
  takes a second lease, the *interrupt marker* (a derived conversation id,
  ``scope-interrupt:<sha256 of the id>``), and waits for the conversation's lease. The
  running turn checks the marker at each renewal (every ``ttl / 3`` seconds): finding
  it held, it stops and releases. A turn whose renewal finds its own lease taken (it
  expired, say while the process was paused, and another turn took it) stops too.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal, TypeVar, final

import anyio

from scope._validate import check_seconds
from scope.errors import TurnInProgressError, TurnInterruptedError
from scope.history._ids import ConversationID
from scope.history._protocols import TurnLeaser, implements

__all__ = ["RELEASE_TIMEOUT", "STRATEGIES", "Lease", "OnOverlap", "Overlap"]

T = TypeVar("T")

OnOverlap = Literal["fence", "reject", "wait", "interrupt"]
STRATEGIES: Final = ("fence", "reject", "wait", "interrupt")

#: Seconds a lease release may take; it runs shielded from cancellation. A release
#: that does not finish in time leaves the lease to expire after its ttl.
RELEASE_TIMEOUT: Final = 5.0
#: ``"wait"`` and ``"interrupt"`` poll the lease: first after 2 ms, doubling up to 100 ms.
FIRST_POLL: Final = 0.002
MAX_POLL: Final = 0.1

_log: Final = logging.getLogger("scope.history")

# (id(leaser), conversation) -> the Lease running in this process. An entry holds its
# leaser, so the id is not reused while it is there.
_running: dict[tuple[int, ConversationID], Lease] = {}
_running_lock: Final = threading.Lock()


def marker_id(conversation_id: ConversationID) -> ConversationID:
    """The interrupt marker's lease id for a conversation (always a valid id)."""
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()
    return ConversationID(f"scope-interrupt:{digest}")


@final
class Overlap:
    """A Middleware's overlap strategy, checked at construction."""

    __slots__ = ("leaser", "strategy", "timeout", "ttl")

    def __init__(
        self,
        strategy: object,
        timeout: object,
        ttl: object,
        reader: object,
        writer: object,
        exclusive_turns: bool,
    ) -> None:
        if type(strategy) is not str or strategy not in STRATEGIES:
            raise ValueError(
                f"on_overlap must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}"
            )
        self.strategy: Final = strategy
        self.timeout: Final = check_seconds(timeout, "overlap_timeout")
        self.ttl: Final = check_seconds(ttl, "lease_ttl", positive=True)
        self.leaser: TurnLeaser | None = None
        if strategy == "fence":
            return
        if not exclusive_turns:
            raise ValueError(
                f"on_overlap={strategy!r} needs exclusive_turns=True (the fence stays on "
                "as the safety net); exclusive_turns=False allows only on_overlap='fence'"
            )
        for candidate in (writer, reader):
            if implements(candidate, TurnLeaser):
                self.leaser = candidate  # type: ignore[assignment]
                return
        raise TypeError(
            f"on_overlap={strategy!r} needs a writer or reader that is a "
            "scope.history.TurnLeaser (acquire_turn/release_turn), got "
            f"{type(writer).__name__} and {type(reader).__name__}"
        )

    async def begin(self, conversation_id: ConversationID) -> Lease | None:
        """The turn's lease, taken as the strategy says; None under ``"fence"``."""
        if self.leaser is None:
            return None
        lease = Lease(self, self.leaser, conversation_id)
        await lease.acquire()
        return lease


@final
class Lease:
    """One turn's hold on its conversation (see the module docstring)."""

    __slots__ = (
        "_key",
        "_marker_held",
        "_renewed",
        "_scope",
        "conversation_id",
        "holder",
        "leaser",
        "overlap",
        "started_at",
        "stopped",
    )

    def __init__(
        self, overlap: Overlap, leaser: TurnLeaser, conversation_id: ConversationID
    ) -> None:
        self.overlap = overlap
        self.leaser = leaser
        self.conversation_id = conversation_id
        self.holder = uuid.uuid4().hex
        self.started_at = time.time()
        self.stopped: str | None = None  # why the turn must stop, once asked
        self._key = (id(leaser), conversation_id)
        self._scope: anyio.CancelScope | None = None
        self._renewed = 0.0
        self._marker_held = False

    # -- taking the lease ---------------------------------------------------------

    async def acquire(self) -> None:
        """Take the lease, or raise ``TurnInProgressError`` as the strategy says."""
        overlap, leaser, cid = self.overlap, self.leaser, self.conversation_id
        start = anyio.current_time()
        if await leaser.acquire_turn(cid, self.holder, overlap.ttl):
            self._took(start)
            return
        if overlap.strategy == "reject":
            raise self._in_progress(0.0)
        deadline = start + overlap.timeout
        delay = FIRST_POLL
        try:
            while True:
                if overlap.strategy == "interrupt":
                    await self._ask_to_stop()
                now = anyio.current_time()
                if now >= deadline:
                    raise self._in_progress(now - start)
                await anyio.sleep(min(delay, deadline - now))
                delay = min(delay * 2, MAX_POLL)
                if await leaser.acquire_turn(cid, self.holder, overlap.ttl):
                    self._took(start)
                    return
        finally:
            if self._marker_held:
                self._marker_held = False
                await self._release(marker_id(cid))

    def _took(self, start: float) -> None:
        self._renewed = anyio.current_time()
        with _running_lock:
            _running[self._key] = self
        if self.overlap.strategy != "reject":
            _log.debug(
                "turn lease of conversation %r taken after %.3f s",
                str(self.conversation_id),
                self._renewed - start,
            )

    async def _ask_to_stop(self) -> None:
        """Interrupt the running turn: at once when it runs in this process (the
        registry), else through the interrupt marker it checks at each renewal."""
        with _running_lock:
            running = _running.get(self._key)
        if running is not None:
            running.stop("interrupted by a newer turn")
            return
        if not self._marker_held:
            marker = marker_id(self.conversation_id)
            self._marker_held = await self.leaser.acquire_turn(
                marker, self.holder, self.overlap.ttl
            )

    def _in_progress(self, waited: float) -> TurnInProgressError:
        cid = self.conversation_id
        with _running_lock:
            running = _running.get(self._key)
        started = None if running is None else running.started_at
        where = (
            "a turn of another process or store handle"
            if started is None
            else f"a turn started {max(0.0, time.time() - started):.3f} s ago in this process"
        )
        strategy = self.overlap.strategy
        how = (
            "refused"
            if strategy == "reject"
            else f"gave up after waiting {waited:.3f} s (overlap_timeout={self.overlap.timeout:g})"
        )
        return TurnInProgressError(
            f"conversation {str(cid)!r} is held by {where}: this turn {how} before calling "
            f"the model (on_overlap={strategy!r}); nothing was stored, send it again later",
            conversation_id=cid,
            started_at=started,
            waited=waited,
        )

    # -- while the turn runs ------------------------------------------------------

    def stop(self, why: str) -> None:
        """Ask the turn to stop: its current model await is cancelled, and it raises
        ``TurnInterruptedError``. Called on the turn's own event loop."""
        if self.stopped is None:
            self.stopped = why
        if self._scope is not None:
            self._scope.cancel()

    def check(self) -> None:
        """Raise ``TurnInterruptedError`` when the turn was asked to stop."""
        if self.stopped is not None:
            raise TurnInterruptedError(
                f"the turn of conversation {str(self.conversation_id)!r} was stopped "
                f"({self.stopped}, on_overlap={self.overlap.strategy!r}); it was not "
                "stored",
                conversation_id=self.conversation_id,
            )

    async def call(self, fn: Callable[[T], Awaitable[Any]], arg: T) -> Any:
        """``await fn(arg)``, renewing the lease meanwhile; a stop request cancels it
        and raises ``TurnInterruptedError``. Errors of ``fn`` pass unchanged."""
        self.check()
        error: Exception | None = None
        result: Any = None
        async with anyio.create_task_group() as group:
            self._scope = group.cancel_scope
            group.start_soon(self._renew_while_running)
            try:
                result = await fn(arg)
            except Exception as exc:  # re-raised below, outside the task group
                error = exc
            finally:
                self._scope = None
                group.cancel_scope.cancel()
        self.check()
        if error is not None:
            raise error
        return result

    async def chunks(self, inner: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """The chunks of ``inner``, each awaited through ``call`` (the renewal task and
        the cancel scope never span a ``yield``). It does not close ``inner``."""
        end: Any = _END
        while True:
            chunk = await self.call(_next_or, (inner, end))
            if chunk is end:
                return
            yield chunk

    async def _renew_while_running(self) -> None:
        interval = self.overlap.ttl / 3
        while True:
            await anyio.sleep(max(0.0, self._renewed + interval - anyio.current_time()))
            await self._renew()

    async def _renew(self) -> None:
        """One renewal; a lost lease or a held interrupt marker stops the turn. A store
        failure is logged (the lease may expire; the fence still guards the commit)."""
        leaser, cid, ttl = self.leaser, self.conversation_id, self.overlap.ttl
        self._renewed = anyio.current_time()
        try:
            if not await leaser.acquire_turn(cid, self.holder, ttl):
                self.stop("its lease was taken over by another turn")
                return
            marker = marker_id(cid)
            if not await leaser.acquire_turn(marker, self.holder, min(ttl, 1.0)):
                self.stop("interrupted by a newer turn")
                return
            await leaser.release_turn(marker, self.holder)
        except Exception:
            _log.warning(
                "renewing the turn lease of conversation %r failed", str(cid), exc_info=True
            )

    # -- giving it back -----------------------------------------------------------

    async def release(self) -> None:
        """Release the lease: shielded from cancellation, bounded by
        ``RELEASE_TIMEOUT``; a failure is logged and the lease expires by itself."""
        with _running_lock:
            if _running.get(self._key) is self:
                del _running[self._key]
        await self._release(self.conversation_id)

    async def _release(self, conversation_id: ConversationID) -> None:
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
            try:
                await self.leaser.release_turn(conversation_id, self.holder)
            except Exception:
                _log.warning(
                    "releasing the turn lease of conversation %r failed (it expires after its ttl)",
                    str(conversation_id),
                    exc_info=True,
                )


_END: Final = object()


async def _next_or(args: tuple[AsyncIterator[T], Any]) -> Any:
    inner, end = args
    return await anext(inner, end)
