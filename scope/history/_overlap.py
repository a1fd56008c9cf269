"""Overlapping turns (DESIGN §6e): the ``on_overlap`` strategies of the history
``Middleware``, built on a store's ``TurnLeaser``.

Under ``"reject"``, ``"wait"`` and ``"interrupt"`` a turn takes the conversation's lease
before it reads the history and calls the model (``Overlap.begin``), renews it while
the model runs (``Lease.call`` / ``Lease.chunks``: a renewal task beside each await of
the model, every ``ttl / 3`` seconds) and releases it on every path (``Lease.release``:
shielded from cancellation, bounded by ``RELEASE_TIMEOUT``). The fence (§6b) stays on.

Folded steps (``FoldedTurnLeaser``): when the Middleware's reader is the leaser and
folds, the lease is taken and the history read in one store step
(``acquire_turn_view``; the view travels on the ``Lease``); when its writer is the
leaser and folds, the commit appends and releases in one store step
(``append_release_turn``; ``Lease.release`` then has no store step left, only the
registry entry). A folded commit that raises leaves the lease held, and
``Lease.release`` releases it with ``release_turn`` as before. So a turn makes as many
store steps under ``"reject"`` as under ``"fence"`` (two), and a turn that takes the
lease sees every batch its predecessor committed.

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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator
from typing import Any, Final, Literal, TypeVar, final

import anyio

from scope._validate import check_seconds
from scope.errors import TurnInProgressError, TurnInterruptedError
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import FoldedTurnLeaser, TurnLeaser, implements
from scope.history._view import HistoryView

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

    __slots__ = ("fold_commit", "fold_read", "leaser", "strategy", "timeout", "ttl")

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
        # Whether the lease steps fold into the read (reader is the leaser) and into the
        # commit (writer is the leaser): see the module docstring.
        self.fold_read = False
        self.fold_commit = False
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
                folds = implements(candidate, FoldedTurnLeaser)
                self.fold_read = folds and candidate is reader
                self.fold_commit = folds and candidate is writer
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
        "_released",
        "_renewed",
        "_renewing",
        "_scope",
        "conversation_id",
        "holder",
        "leaser",
        "overlap",
        "started_at",
        "stopped",
        "view",
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
        self._renewing = False
        self._marker_held = False
        self._released = False  # a folded commit gave the lease back already
        #: The history read in the same store step as the lease (``fold_read``), else None.
        self.view: HistoryView | None = None

    # -- taking the lease ---------------------------------------------------------

    async def acquire(self) -> None:
        """Take the lease, or raise ``TurnInProgressError`` as the strategy says."""
        overlap, cid = self.overlap, self.conversation_id
        start = anyio.current_time()
        if await self._try_acquire():
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
                if await self._try_acquire():
                    self._took(start)
                    return
        finally:
            if self._marker_held:
                self._marker_held = False
                await self._release(marker_id(cid))

    async def _try_acquire(self) -> bool:
        """One attempt at the lease; with ``fold_read`` it reads the view too."""
        overlap = self.overlap
        if not overlap.fold_read:
            return bool(
                await self.leaser.acquire_turn(self.conversation_id, self.holder, overlap.ttl)
            )
        folded: FoldedTurnLeaser = self.leaser  # type: ignore[assignment]
        view = await folded.acquire_turn_view(self.conversation_id, self.holder, overlap.ttl)
        if view is None:
            return False
        self.view = view
        return True

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
        and raises ``TurnInterruptedError``. Errors of ``fn`` pass unchanged.

        The renewal task starts only when ``fn`` suspends: its first step runs here
        (inside the task group, so every cancel scope it enters nests in the group's),
        and an await that finishes without suspending (a model answering from memory,
        a stream chunk already buffered) never gave the event loop, or a renewal, a
        chance to run. An await that suspends goes on from that suspension
        (``_Resumed``) beside the renewal task."""
        self.check()
        error: Exception | None = None
        result: Any = None
        done: anyio.Event | None = None
        async with anyio.create_task_group() as group:
            self._scope = group.cancel_scope
            resumed: _Resumed | None = None
            try:
                steps = fn(arg).__await__()
                try:
                    first = steps.send(None)
                except StopIteration as finished:
                    result = finished.value
                else:
                    resumed = _Resumed(steps, first)
                    done = anyio.Event()
                    group.start_soon(self._renew_while_running, done)
                    result = await resumed
            except Exception as exc:  # re-raised below, outside the task group
                error = exc
            finally:
                if resumed is not None:
                    resumed.close()
                self._scope = None
                # Waking the renewal task costs less than cancelling it (one scheduling
                # round instead of a cancellation); a renewal under way is cancelled.
                if done is not None:
                    done.set()
                if self._renewing:
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

    async def _renew_while_running(self, done: anyio.Event) -> None:
        interval = self.overlap.ttl / 3
        while not done.is_set():  # a model that answered before this task began: done
            with anyio.move_on_after(max(0.0, self._renewed + interval - anyio.current_time())):
                await done.wait()
                return
            self._renewing = True
            try:
                await self._renew()
            finally:
                self._renewing = False

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

    @property
    def folds_commit(self) -> bool:
        """Whether the commit appends through ``append_and_release``."""
        return self.overlap.fold_commit

    async def append_and_release(self, batch: Batch) -> Receipt:
        """Append the turn's batch and release the lease in one store step
        (``append_release_turn``; only when ``folds_commit``). When it raises, the lease
        is still held and ``release`` gives it back."""
        folded: FoldedTurnLeaser = self.leaser  # type: ignore[assignment]
        receipt = await folded.append_release_turn(batch, self.holder)
        self._released = True
        return receipt

    async def release(self) -> None:
        """Release the lease: shielded from cancellation, bounded by
        ``RELEASE_TIMEOUT``; a failure is logged and the lease expires by itself. No
        store step after a folded commit returned (it released the lease)."""
        with _running_lock:
            if _running.get(self._key) is self:
                del _running[self._key]
        if not self._released:
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


@final
class _Resumed:
    """An await that already made its first step (``first``: what it yielded to the
    event loop) and goes on from there: ``await _Resumed(steps, first)`` is the rest of
    ``yield from steps`` (PEP 380), whatever the event loop (asyncio futures, trio
    traps): each value goes up to the loop unchanged, each answer or thrown exception
    (a cancellation) comes back down unchanged. ``close()`` closes ``steps`` if it did
    not finish (an await abandoned before it was resumed)."""

    __slots__ = ("_first", "_steps")

    def __init__(self, steps: Generator[Any, Any, Any], first: Any) -> None:
        self._steps = steps
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        steps, value = self._steps, self._first
        while True:
            try:
                answer = yield value
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # a cancellation, thrown back down unchanged
                try:
                    value = steps.throw(exc)
                except StopIteration as finished:
                    return finished.value
            else:
                try:
                    value = steps.send(answer)
                except StopIteration as finished:
                    return finished.value

    def close(self) -> None:
        self._steps.close()


async def _next_or(args: tuple[AsyncIterator[T], Any]) -> Any:
    inner, end = args
    return await anext(inner, end)
