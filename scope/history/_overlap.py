"""Leased turns (DESIGN §6e): the ``Leases`` layer of the history ``Middleware``, which
gives ``on_overlap="reject"``, ``"wait"`` and ``"interrupt"`` on a store's ``TurnLeaser``.

The layer is the outermost: it takes the conversation's lease before the history is
read (``enter``), renews it while the model runs (one renewal task per lease, below)
and releases it after everything else, the commit and the kept interrupted turn
included (``exit``: shielded from cancellation, bounded by ``RELEASE_TIMEOUT``). The
fence (§6b) stays on.

The leaser is a ``Store`` (``as_store``: a store that is not gets the steps it lacks
from ``StoreAdapter``). When the Middleware's reader is the leaser and has its own
folded steps, the lease is taken and the history read in one step
(``acquire_turn_view``; the view goes on ``Turn.view``); when its writer is, the
commit appends and releases in one step (``append_release_turn`` as ``Turn.append``).
A folded commit that raises leaves the lease held, and ``exit`` releases it with
``release_turn``.

Per store handle and conversation (a ``_Slot``, kept in the handle's own state: its
``history_cache``, see ``HistoryCache.turns``): the lease running through the handle,
the turns waiting for it in arrival order, and the leases this process may have left
behind. A leaser with no ``history_cache`` (a third-party store) has no state of its
own to keep them in; each Middleware over it has slots of its own. Two handles (or two
such Middlewares) are two sets of slots: to each other they are two processes.

- **Arrival order.** Every leased turn joins the slot's queue when it starts; only the
  head contends for the store's lease (polling with backoff, 2 ms doubling to 100 ms,
  while the holder is another process, or a turn here that has not renewed it for a
  whole ttl; woken at once when the holder here releases).
  So within one process the turns of a conversation are served first come, first
  served; ``"reject"`` refuses a turn that finds others queued. Across processes (or
  handles) the store decides: whichever head polls first after a release wins.
- **Cancelled while taking the lease.** The store may take the lease before the
  cancellation reaches the turn, so the lease step runs shielded (bounded by
  ``RELEASE_TIMEOUT``; no answer in that time is a ``StoreError``) and, when the turn
  was cancelled meanwhile (or the step failed), the turn's holder token is released,
  shielded and bounded, before the exception goes on. A release that cannot be
  confirmed (a native asyncio cancellation pierces the shield, and the store's call may
  still be on its way) leaves the token in the slot (``leftovers``, until its ttl
  passes); the next turn of this process that finds the lease held releases those
  tokens first, and a refusal says when the holder is such a leftover.
- **Renewal: one task per lease.** Once the lease is taken one task is started for it
  (outside the caller's task tree, with the turn's context: a trio system task; under
  asyncio a task of the loop, which a timer armed with the lease starts when the first
  renewal falls due, so a turn shorter than ``ttl / 3`` starts none) and it ends at
  the release. While the model is awaited
  (``Lease.run``: a call, or the next chunk of a stream) it renews the lease every
  ``ttl / 3`` seconds; between two awaits (a stream's consumer holding a chunk) it
  waits, so a stream its consumer left unclosed holds the lease no longer than a ttl.
  A task group could not do this: it cannot stay open across a ``yield`` of the
  Middleware's stream. The task never cancels anything it does not own: each await of
  the model runs in a cancel scope of the awaiting frame (entered and left within one
  ``run``, never across a ``yield``), and a stop (``Lease.stop``: the lease lost, the
  interrupt marker held, a newer turn here) sets the turn's flag and cancels that
  scope, so the await ends at once and ``run`` raises ``TurnInterruptedError``; a stop
  between awaits is raised by the next ``run``. A renewal under way finishes (shielded,
  bounded) before ``run`` returns and before the release, so it never takes the lease
  again after it was given back. A cancellation of the turn is never turned into
  anything else.
- **Interrupting.** Within the process a newer ``"interrupt"`` turn stops the turn
  running when it arrives, at once (cancelling its model await:
  ``TurnInterruptedError``), and queues behind the turns already waiting. Across processes
  (or handles) the queue head takes a second lease, the *interrupt marker* (a derived
  conversation id, ``scope-interrupt:<sha256 of the id>``), which the running turn
  checks at each renewal: finding it held, it stops. A turn whose renewal finds its own
  lease taken (it expired, say while the process was paused) stops too.

The slots are touched, and events and cancellation delivered, on the turn's own event
loop (use one store handle per event loop, as every store asks).
"""

from __future__ import annotations

# The one use of an event loop's own API here: a task outside the caller's task tree
# (``Lease.start_renewal``), under asyncio and trio alike.
import asyncio  # noqa: TID251
import collections
import contextvars
import hashlib
import logging
import math
import os
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, Final, Literal, TypeVar, final

import anyio
import anyio.lowlevel

from scope.errors import StoreError, TurnInProgressError, TurnInterruptedError
from scope.history._adapter import StoreAdapter, as_store
from scope.history._ids import ConversationID
from scope.history._protocols import Store, TurnLeaser
from scope.history._replay import cache_of
from scope.history._turn import Layer, Turn

__all__ = ["RELEASE_TIMEOUT", "Lease", "Leases", "OnOverlap"]

T = TypeVar("T")

OnOverlap = Literal["fence", "reject", "wait", "interrupt"]

#: Seconds a lease release (and a renewal) may take; it runs shielded from
#: cancellation. One that does not finish in time leaves the lease to expire.
RELEASE_TIMEOUT: Final = 5.0
#: A queue head polls a lease held by another process: first after 2 ms, doubling up
#: to 100 ms.
FIRST_POLL: Final = 0.002
MAX_POLL: Final = 0.1

_log: Final = logging.getLogger("scope.history")
_END: Final = object()
_RENEWAL: Final = "scope turn lease renewal"


def marker_id(conversation_id: ConversationID) -> ConversationID:
    """The interrupt marker's lease id for a conversation (always a valid id)."""
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()
    return ConversationID(f"scope-interrupt:{digest}")


@final
class _Slot:
    """One store handle's conversation in this process (see the module docstring)."""

    __slots__ = ("leftovers", "running", "waiters")

    def __init__(self) -> None:
        self.running: Lease | None = None
        self.waiters: collections.deque[Lease] = collections.deque()
        #: holder token -> time.monotonic() after which its lease has expired anyway
        self.leftovers: dict[str, float] = {}


Slots = dict[str, _Slot]


def slots_of(leaser: object) -> Slots:
    """The lease slots of a store handle: kept in its ``history_cache``; a leaser with
    none (a third-party store) gets slots of its own per Middleware (see the module
    docstring)."""
    cache = cache_of(leaser)
    return {} if cache is None else cache.turns


@final
class Leases(Layer):
    """The lease layer of a Middleware: its strategy, checked at construction."""

    __slots__ = (
        "fold_commit",
        "fold_read",
        "leaser",
        "owner",
        "slots",
        "strategy",
        "timeout",
        "ttl",
    )

    def __init__(
        self,
        strategy: str,
        timeout: float,
        ttl: float,
        reader: object,
        writer: object,
        *,
        owner: str | None = None,
    ) -> None:
        self.owner: Final = owner  # passed to the folded commit (DESIGN §6i)
        self.strategy: Final = strategy
        self.timeout: Final = timeout
        self.ttl: Final = ttl
        leaser = next((c for c in (writer, reader) if isinstance(c, TurnLeaser)), None)
        if leaser is not None:
            #: The store handle's slots (see the module docstring).
            self.slots: Final = slots_of(leaser)
            self.leaser: Final[Store] = as_store(leaser)
            # Whether the lease steps fold into the read and into the commit: with the
            # store's own folded steps (the adapter's two-step ones would hold the
            # read, or the commit's receipt, inside the lease step).
            folds = not isinstance(self.leaser, StoreAdapter) or self.leaser.folds
            self.fold_read: Final = folds and leaser is reader
            self.fold_commit: Final = folds and leaser is writer
            adapted = self.leaser if isinstance(self.leaser, StoreAdapter) else None
            folds_owner = adapted is None or adapted.records_owners("append_release_turn")
            if owner is not None and self.fold_commit and not folds_owner:
                raise TypeError(
                    f"owner= needs a store whose append_release_turn takes "
                    f"owner=; {type(leaser).__name__}.append_release_turn does not"
                )
            return
        raise TypeError(
            f"{strategy.capitalize()}() (on_overlap={strategy!r}) needs a store that is a "
            "scope.history.TurnLeaser (acquire_turn/release_turn; every bundled store is) "
            f"as writer or reader, got {type(writer).__name__} and {type(reader).__name__}"
        )

    async def enter(self, turn: Turn) -> None:
        lease = Lease(self, turn.conversation_id)
        await lease.acquire()
        turn.view = lease.view
        turn.lease = lease  # the turn's model awaits and commit go through it
        lease.start_renewal()  # exit releases it from here on, and stops the renewal

    async def exit(self, turn: Turn) -> None:
        lease: Lease | None = turn.lease
        if lease is not None:
            # A folded commit that landed gave the lease back in the same step.
            await lease.release(store=not (self.fold_commit and turn.receipt is not None))


@final
class Lease:
    """One turn's hold on its conversation (see the module docstring)."""

    __slots__ = (
        "_ended",
        "_marker_held",
        "_poke",
        "_renewal",
        "_renewed",
        "_scope",
        "_slot",
        "_task",
        "_wake",
        "conversation_id",
        "holder",
        "leases",
        "started_at",
        "stopped",
        "view",
    )

    def __init__(self, leases: Leases, conversation_id: ConversationID) -> None:
        self.leases = leases
        self.conversation_id = conversation_id
        self.holder = os.urandom(16).hex()  # a random token, 128 bits
        self.started_at = time.time()
        self.stopped: str | None = None  # why the turn must stop, once asked
        #: The history read in the same store step as the lease (``fold_read``), else None.
        self.view: Any = None
        self._slot: _Slot | None = None
        #: The cancel scope of the model await under way (``run``), else None.
        self._scope: anyio.CancelScope | None = None
        #: Set (by ``release``) to wake this turn while it waits in the queue.
        self._wake: anyio.Event | None = None
        self._renewed = 0.0
        self._marker_held = False
        # The renewal task: its handle, whether it is to end, the event it waits on
        # (None: it is not waiting), the event a renewal under way sets when done.
        self._task: object = None
        self._ended = False
        self._poke: anyio.Event | None = None
        self._renewal: anyio.Event | None = None

    # -- taking the lease ---------------------------------------------------------

    async def acquire(self) -> None:
        """Take the lease in arrival order, or raise ``TurnInProgressError`` as the
        strategy says."""
        strategy = self.leases.strategy
        slots, cid = self.leases.slots, self.conversation_id
        slot = slots.get(cid)
        if slot is None:
            slot = slots[cid] = _Slot()
        slot.waiters.append(self)
        self._slot = slot
        start = anyio.current_time()
        deadline = start + self.leases.timeout
        delay = FIRST_POLL
        arrival = True
        try:
            while True:
                head = slot.waiters[0] is self
                # While a turn of this process holds it, its release wakes the head;
                # one that has not renewed it for a whole ttl (a stream its consumer
                # left unclosed, say) is contended for like another process's.
                running = slot.running
                now = start if arrival else anyio.current_time()
                held_until = 0.0 if running is None else running._renewed + running.leases.ttl
                contend = head and held_until <= now
                if contend and await self._try(slot):
                    self._renewed = now  # from before the step: renewed early, never late
                    slot.running = self
                    return
                if strategy == "reject":
                    raise self._in_progress(slot, 0.0)
                if strategy == "interrupt":
                    await self._ask_to_stop(slot, arrival, contend)
                arrival = False
                now = anyio.current_time()
                if now >= deadline:
                    raise self._in_progress(slot, now - start)
                wait = deadline - now
                if contend:
                    wait, delay = min(delay, wait), min(delay * 2, MAX_POLL)
                elif head:
                    wait = min(wait, max(held_until - now, 0.0) + FIRST_POLL)
                wake = self._wake = anyio.Event()
                with anyio.move_on_after(wait):
                    await wake.wait()
        finally:
            slot.waiters.remove(self)
            self._wake = None
            if slot.waiters:
                slot.waiters[0]._wake_up()
            if self._marker_held:
                self._marker_held = False
                await self._give_back(marker_id(self.conversation_id))
            if slot.running is not self:
                _prune(slots, cid, slot)

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _try(self, slot: _Slot) -> bool:
        """One attempt at the lease (with ``fold_read`` it reads the view too); when
        it is held and this process left a lease behind, those go first.

        The store step runs shielded (bounded by ``RELEASE_TIMEOUT``), so a
        cancellation of the turn meanwhile finds its outcome settled; it is delivered
        right after, and whatever the step may have taken is given back first (a
        native asyncio cancellation pierces the shield: the give-back then races a
        store call still on its way, and an unconfirmed token is a leftover)."""
        try:
            taken = False
            bound = anyio.CancelScope(deadline=anyio.current_time() + RELEASE_TIMEOUT, shield=True)
            with bound:
                taken = await self._acquire_step()
                if not taken and slot.leftovers and await self._reclaim(slot):
                    taken = await self._acquire_step()
            if bound.cancelled_caught:
                raise StoreError(
                    f"the turn lease of conversation {str(self.conversation_id)!r} was "
                    f"not answered within {RELEASE_TIMEOUT:g} s; nothing was stored"
                )
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            await self._give_back(self.conversation_id, unsure=True)
            raise
        return taken

    async def _acquire_step(self) -> bool:
        leases, cid = self.leases, self.conversation_id
        if not leases.fold_read:
            return bool(await leases.leaser.acquire_turn(cid, self.holder, leases.ttl))
        view = await leases.leaser.acquire_turn_view(cid, self.holder, leases.ttl)
        self.view = view
        return view is not None

    async def _reclaim(self, slot: _Slot) -> bool:
        """Release the leases this process left behind on the conversation: True when
        one of them still held it. A token stays remembered until it is released or
        its ttl has passed (an acquire still on its way may land later)."""
        now, released = time.monotonic(), False
        for holder, expires in list(slot.leftovers.items()):
            try:
                if expires > now and not await self.leases.leaser.release_turn(
                    self.conversation_id, holder
                ):
                    continue
            except Exception:
                _log.warning("releasing a lease left behind failed", exc_info=True)
                continue
            released |= expires > now
            slot.leftovers.pop(holder, None)
        return released

    async def _ask_to_stop(self, slot: _Slot, arrival: bool, contend: bool) -> None:
        """Interrupt the turn that runs when this one arrives: at once when it runs in
        this process; while this turn contends with another process's holder, through
        the interrupt marker that holder checks at each renewal. (Turns queued ahead
        of this one are not interrupted when their turn comes.)"""
        running = slot.running
        if arrival and running is not None:
            running.stop("interrupted by a newer turn")
        elif contend and not self._marker_held:
            marker = marker_id(self.conversation_id)
            self._marker_held = bool(
                await self.leases.leaser.acquire_turn(marker, self.holder, self.leases.ttl)
            )

    def _in_progress(self, slot: _Slot, waited: float) -> TurnInProgressError:
        cid, leases = self.conversation_id, self.leases
        running = slot.running
        started = None if running is None else running.started_at
        ahead = slot.waiters.index(self)
        if running is not None:
            age = max(0.0, time.time() - running.started_at)
            where = f"a turn started {age:.3f} s ago in this process"
        elif ahead:
            where = f"{ahead} earlier turn(s) of this process waiting for it"
        elif slot.leftovers:
            where = (
                "a lease this process left behind (a turn cancelled while it took or gave "
                f"back the lease; it expires within lease_ttl={leases.ttl:g} s)"
            )
        else:
            where = "a turn of another process or store handle"
        how = (
            "refused"
            if leases.strategy == "reject"
            else f"gave up after waiting {waited:.3f} s (overlap_timeout={leases.timeout:g})"
        )
        return TurnInProgressError(
            f"conversation {str(cid)!r} is held by {where}: this turn {how} before calling "
            f"the model (on_overlap={leases.strategy!r}); nothing was stored, send it again "
            "later",
            conversation_id=cid,
            started_at=started,
            waited=waited,
        )

    # -- while the turn runs ------------------------------------------------------

    def stop(self, why: str) -> None:
        """Ask the turn to stop: its current model await is cancelled, and it raises
        ``TurnInterruptedError``. Called on the turn's own event loop (from the
        renewal task, or a newer turn's)."""
        if self.stopped is None:
            self.stopped = why
        if self._scope is not None:
            self._scope.cancel()

    def _check(self) -> None:
        if self.stopped is not None:
            raise TurnInterruptedError(
                f"the turn of conversation {str(self.conversation_id)!r} was stopped "
                f"({self.stopped}, on_overlap={self.leases.strategy!r}); it was not stored",
                conversation_id=self.conversation_id,
            )

    async def run(self, step: Awaitable[T]) -> T:
        """``await step`` (a model call, or the next chunk of a stream) in a cancel
        scope of this frame, while the renewal task renews the lease; a stop request
        cancels it and raises ``TurnInterruptedError``. Errors of ``step`` pass
        unchanged; a cancellation of the turn passes as it is."""
        if self.stopped is not None:
            getattr(step, "close", _nothing)()  # a coroutine that will never run
            self._check()
        error: Exception | None = None
        result: Any = None
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._poke is not None:  # the renewal task waits for an await
                    self._poke.set()
                result = await step
        except Exception as exc:  # re-raised below, after the stop check
            error = exc
        finally:
            self._scope = None
            if self._renewal is not None:
                await self._renewed_in_full()
        self._check()
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]

    async def append_release(self, batch: Any) -> Any:
        """The folded commit: ``append_release_turn`` with this lease's holder (and the
        layer's owner)."""
        leases = self.leases
        if leases.owner is None:
            return await leases.leaser.append_release_turn(batch, self.holder)
        return await leases.leaser.append_release_turn(batch, self.holder, owner=leases.owner)

    async def chunks(self, inner: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """The chunks of ``inner``, each awaited through ``run`` (its cancel scope
        never spans a ``yield``; the renewal task is the lease's, not the chunk's). It
        does not close ``inner``."""
        end: Any = _END
        while True:
            chunk = await self.run(anext(inner, end))
            if chunk is end:
                return
            yield chunk

    def start_renewal(self) -> None:
        """Start the lease's renewal task (once; ``release`` ends it). Under asyncio a
        timer armed now starts it when the first renewal falls due (``ttl / 3`` after
        the lease was taken), so a turn that ends sooner starts none; under trio it
        starts now."""
        if self._task is not None or self._ended:
            return
        trio: Any = sys.modules.get("trio")
        if trio is not None and _in_trio(trio):
            self._task = trio.lowlevel.spawn_system_task(
                self._renew_while_held, name=_RENEWAL, context=contextvars.copy_context()
            )
            return
        loop = asyncio.get_running_loop()

        def start() -> None:  # runs in a copy of this context (the timer's)
            self._task = loop.create_task(self._renew_while_held(), name=_RENEWAL)

        self._task = loop.call_later(self.leases.ttl / 3, start)

    async def _renew_while_held(self) -> None:
        """The renewal task: while a model await is under way (``run``), renew every
        ``ttl / 3`` seconds; otherwise wait for the next await. It ends at the release,
        or once the turn was asked to stop (it will not await the model again)."""
        interval = self.leases.ttl / 3
        try:
            while not self._ended and self.stopped is None:
                due = math.inf
                if self._scope is not None:
                    due = self._renewed + interval - anyio.current_time()
                if due > 0:
                    poke = self._poke = anyio.Event()
                    with anyio.move_on_after(due):
                        await poke.wait()
                    self._poke = None
                    continue
                # Shielded: a renewal under way finishes (an abandoned one could take
                # the lease again after the release); run and release wait for it.
                done = self._renewal = anyio.Event()
                try:
                    with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
                        await self._renew()
                finally:
                    self._renewal = None
                    done.set()
        except Exception:  # never out of a task nobody awaits (a trio system task)
            _log.exception("the renewal task of conversation %r failed", str(self.conversation_id))

    async def _renewed_in_full(self) -> None:
        """Wait for a renewal under way (shielded; it is bounded itself)."""
        renewal = self._renewal
        if renewal is not None:
            with anyio.CancelScope(shield=True):
                await renewal.wait()

    async def _renew(self) -> None:
        """One renewal; a lost lease or a held interrupt marker stops the turn. A store
        failure is logged (the lease may expire; the fence still guards the commit)."""
        leaser, cid, ttl = self.leases.leaser, self.conversation_id, self.leases.ttl
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

    async def release(self, store: bool = True) -> None:
        """End the renewal task, release the lease (``store``: with a store step; not
        after a folded commit that landed), then wake the next turn of this process
        waiting for it."""
        slot = self._slot
        assert slot is not None
        self._ended = True
        if isinstance(self._task, asyncio.TimerHandle):
            self._task.cancel()  # the task never started
        if self._poke is not None:
            self._poke.set()
        try:
            if self._renewal is not None:
                await self._renewed_in_full()
            if store:
                await self._give_back(self.conversation_id)
        finally:
            if slot.running is self:
                slot.running = None
            if slot.waiters:
                slot.waiters[0]._wake_up()
            _prune(self.leases.slots, self.conversation_id, slot)

    async def _give_back(self, conversation_id: ConversationID, unsure: bool = False) -> None:
        """``release_turn``, shielded from cancellation and bounded by
        ``RELEASE_TIMEOUT``. When it fails, times out, or (``unsure``: after an
        acquire that may or may not have landed) finds nothing held, the token is
        remembered as a leftover of this process (see the module docstring)."""
        settled = False
        try:
            with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
                try:
                    released = await self.leases.leaser.release_turn(conversation_id, self.holder)
                except Exception:
                    _log.warning(
                        "releasing the turn lease of conversation %r failed (it expires after "
                        "its ttl)",
                        str(conversation_id),
                        exc_info=True,
                    )
                else:
                    settled = bool(released) or not unsure
        finally:
            # (A native asyncio cancellation pierces the shield: unsettled as well.)
            if not settled and conversation_id == self.conversation_id and self._slot:
                self._slot.leftovers[self.holder] = time.monotonic() + self.leases.ttl
                # Rare: forget every other slot of the handle whose leftovers have all
                # expired, so conversations never used again are not kept for ever.
                slots = self.leases.slots
                for cid, slot in list(slots.items()):
                    if slot is not self._slot:
                        _prune(slots, cid, slot)


def _nothing() -> None:
    pass


def _prune(slots: Slots, conversation_id: str, slot: _Slot) -> None:
    """Forget a slot with nothing in it (no running turn, no waiter, no live leftover)."""
    if slot.leftovers:
        now = time.monotonic()
        for holder, expires in list(slot.leftovers.items()):
            if expires <= now:
                del slot.leftovers[holder]
    empty = slot.running is None and not slot.waiters and not slot.leftovers
    if empty and slots.get(conversation_id) is slot:
        del slots[conversation_id]


def _in_trio(trio: Any) -> bool:
    """Whether this runs in a trio run (``trio``: the module, already imported)."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
