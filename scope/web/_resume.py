"""Resumable turns: a per-turn event log and the runner that keeps a turn going.

A turn's encoded stream (``ui_message_stream`` or ``agui_events`` bytes) is pumped
into a ``TurnLog`` by a task that does not belong to any one request, one SSE event per
log entry; each client request reads the log from its last event id on. So a client
that drops its connection can come back for the rest, and by default the turn runs on
and is stored once whatever the clients do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, Final, NoReturn, Protocol, Self, final, runtime_checkable

import anyio
import anyio.abc

from scope._validate import check_seconds
from scope.errors import TurnInProgressError, TurnLogError
from scope.history import ErasureReceipt
from scope.web._core import EncodedStream

__all__ = [
    "SHUTDOWN_GRACE",
    "SHUTDOWN_TEXT",
    "InMemoryTurnLog",
    "RedisTurnLog",
    "ResumableTurns",
    "TurnLog",
]


@runtime_checkable
class TurnLog(Protocol):
    """Where a running turn's encoded events wait for the clients that read them.

    Event ids are opaque strings, increasing within a turn. ``open`` starts a turn's
    log, atomically: when the turn id's log is still running (opened, not ended) it
    raises ``TurnInProgressError`` and changes nothing, so of two openers of one id
    exactly one wins; an ended log of that id is replaced. ``events`` yields
    ``(event_id, data)`` after ``after`` (all of them for None), waits for more while
    the turn runs and stops after ``end``; it raises ``TurnLogError`` for an unknown
    or expired turn, or when events after ``after`` were already dropped.

    A log may also have ``async erase(turn_id)`` (both bundled logs do): delete the
    turn's log at once, whether it runs or ended (DESIGN §6i); ``ResumableTurns.erase``
    needs it.
    """

    async def open(self, turn_id: str) -> None: ...
    async def append(self, turn_id: str, data: bytes) -> str: ...
    async def end(self, turn_id: str) -> None: ...
    def events(
        self, turn_id: str, after: str | None = None
    ) -> AsyncIterator[tuple[str, bytes]]: ...


def _check_limits(max_events: object, keep_seconds: object) -> None:
    if not isinstance(max_events, int) or isinstance(max_events, bool):
        raise TypeError(f"max_events must be an int, got {type(max_events).__name__}")
    if max_events < 1:
        raise ValueError(f"max_events must be at least 1, got {max_events}")
    if not isinstance(keep_seconds, int | float) or isinstance(keep_seconds, bool):
        raise TypeError(f"keep_seconds must be a number, got {type(keep_seconds).__name__}")
    if not keep_seconds > 0:
        raise ValueError(f"keep_seconds must be positive, got {keep_seconds}")


class _Turn:
    __slots__ = ("ended_at", "entries", "first", "waiters")

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.first = 1  # the sequence number of entries[0]
        self.ended_at: float | None = None
        self.waiters: list[anyio.Event] = []


@final
class InMemoryTurnLog:
    """A ``TurnLog`` in this process's memory (one process; any number of readers).

    - ``max_events``: events kept per turn (default 10,000); older ones are dropped,
      and a client that needs them gets ``TurnLogError``.
    - ``keep_seconds``: how long an ended turn stays readable (default 300 s).

    Safe across tasks of one event loop (asyncio or trio); its lock is never held
    across an await.
    """

    def __init__(self, *, max_events: int = 10_000, keep_seconds: float = 300.0) -> None:
        _check_limits(max_events, keep_seconds)
        self._max = max_events
        self._keep = float(keep_seconds)
        self._lock = threading.Lock()
        self._turns: dict[str, _Turn] = {}

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [
            k for k, t in self._turns.items() if t.ended_at and now - t.ended_at > self._keep
        ]:
            del self._turns[key]

    async def open(self, turn_id: str) -> None:
        """Start an empty log for ``turn_id``, replacing an ended one of that id;
        ``TurnInProgressError`` while one of that id runs."""
        with self._lock:
            self._expire()
            turn = self._turns.get(turn_id)
            if turn is not None and turn.ended_at is None:
                raise _running(turn_id)
            self._turns[turn_id] = _Turn()

    async def append(self, turn_id: str, data: bytes) -> str:
        """Add one event; returns its id."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None or turn.ended_at is not None:
                raise TurnLogError(f"turn {turn_id!r} is not open")
            turn.entries.append(data)
            if len(turn.entries) > self._max:
                del turn.entries[0]
                turn.first += 1
            seq = turn.first + len(turn.entries) - 1
            waiters, turn.waiters = turn.waiters, []
        for waiter in waiters:
            waiter.set()
        return str(seq)

    async def end(self, turn_id: str) -> None:
        """Mark the turn ended: readers stop after its last event."""
        with self._lock:
            turn = self._turns.get(turn_id)
            if turn is None or turn.ended_at is not None:
                return
            turn.ended_at = time.monotonic()
            waiters, turn.waiters = turn.waiters, []
        for waiter in waiters:
            waiter.set()

    async def erase(self, turn_id: str) -> None:
        """Delete the turn's log (its events are dropped at once; readers stop, as at
        its end; a later ``events`` raises ``TurnLogError``). Nothing for an unknown
        turn."""
        with self._lock:
            turn = self._turns.pop(turn_id, None)
            if turn is None:
                return
            turn.entries = []
            turn.ended_at = turn.ended_at or time.monotonic()
            waiters, turn.waiters = turn.waiters, []
        for waiter in waiters:
            waiter.set()

    async def events(
        self, turn_id: str, after: str | None = None
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The turn's events after ``after``, waiting for more until it ends."""
        try:
            seq = 0 if after is None else int(after)
        except ValueError:
            raise TurnLogError(f"turn {turn_id!r}: {after!r} is not an event id") from None
        with self._lock:
            self._expire()
            turn = self._turns.get(turn_id)
        if turn is None:
            raise TurnLogError(f"turn {turn_id!r} is unknown or expired")
        # This reader stays on this turn: a later turn of the same id (opened once this
        # one ended) is another log, read by a new request.
        while True:
            with self._lock:
                if seq + 1 < turn.first:
                    raise TurnLogError(
                        f"turn {turn_id!r}: the events after {seq} were dropped "
                        f"(the log keeps {self._max})"
                    )
                batch = turn.entries[seq + 1 - turn.first :]
                ended = turn.ended_at is not None
                waiter = None
                if not batch and not ended:
                    waiter = anyio.Event()
                    turn.waiters.append(waiter)
            for data in batch:
                seq += 1
                yield str(seq), data
            if waiter is not None:
                await waiter.wait()
            elif ended and not batch:
                return


def _running(turn_id: str) -> TurnInProgressError:
    return TurnInProgressError(
        f"turn {turn_id!r} is still running (its log is open): wait for it to end, or "
        "let the Conversation's on_overlap ('wait', 'interrupt') hand over",
        conversation_id=turn_id,
    )


#: ``RedisTurnLog.open`` in one step: refuse while the stream's last entry is not the
#: end mark, else empty the stream and add the open mark. Emptied, not deleted: the
#: stream's ids go on increasing, so a reader still on the ended turn meets the new
#: open mark (and stops) instead of reading the new turn's events as its own.
_OPEN_SCRIPT: Final = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last > 0 then
  local fields = last[1][2]
  local ended = false
  for i = 1, #fields, 2 do
    if fields[i] == 'e' then ended = true end
  end
  if not ended then return 0 end
end
if #last > 0 then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
end
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '0-*', 'o', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, n = value.partition("-")
    return int(ms), int(n or 0)


@final
class RedisTurnLog:
    """A ``TurnLog`` in Redis streams, for services of several processes: any process
    can serve a reconnecting client while another runs the turn.

    - ``client``: a ``redis.asyncio.Redis`` (or cluster) client, bytes responses
      (``decode_responses=False``); the caller owns and closes it.
    - ``prefix``: key prefix (default ``"scope:turn"``); one stream per turn,
      ``{prefix}:{turn_id}`` (the turn id is the hash tag, for Redis Cluster).
    - ``max_events``: events kept per turn (``XADD MAXLEN``, default 10,000); a client
      who missed trimmed events gets ``TurnLogError``.
    - ``keep_seconds``: the stream's expiry after its last write (default 300 s).
    - ``block_ms``: how long one ``XREAD`` waits before it looks again (default 5,000).

    Event ids are the stream ids ``0-1``, ``0-2``, ... (Redis 7's ``XADD key 0-*``:
    consecutive, so a gap left by trimming shows; a later turn of the same id goes on
    from the last id). The first entry marks the turn open and the last one its end;
    readers skip both. ``open`` is one Lua script (check the
    last entry, replace the stream), so two processes opening one turn id at once get
    one winner; the other gets ``TurnInProgressError``. A turn whose process died
    without ``end`` stays running until its stream expires, ``keep_seconds`` after its
    last write.
    """

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "scope:turn",
        max_events: int = 10_000,
        keep_seconds: float = 300.0,
        block_ms: int = 5_000,
    ) -> None:
        _check_limits(max_events, keep_seconds)
        if not isinstance(prefix, str) or not prefix:
            raise TypeError("prefix must be a non-empty str")
        self._client = client
        self._prefix = prefix
        self._max = max_events
        self._keep_ms = max(1, int(keep_seconds * 1000))
        self._block = block_ms
        if not callable(getattr(client, "register_script", None)):
            raise TypeError(
                "client must be a redis.asyncio Redis or RedisCluster client, got "
                f"{type(client).__name__}"
            )
        self._open = client.register_script(_OPEN_SCRIPT)

    def _key(self, turn_id: str) -> str:
        return f"{self._prefix}:{{{turn_id}}}"

    async def _add(self, turn_id: str, fields: dict[str, bytes]) -> str:
        key = self._key(turn_id)
        pipe = self._client.pipeline(transaction=True)
        pipe.xadd(key, fields, id="0-*", maxlen=self._max + 1, approximate=False)
        pipe.pexpire(key, self._keep_ms)
        entry_id, _ = await pipe.execute()
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def open(self, turn_id: str) -> None:
        """Start the turn's stream, replacing an ended one of that id, in one atomic
        step; ``TurnInProgressError`` while one of that id runs."""
        opened = await self._open(keys=[self._key(turn_id)], args=[self._max + 1, self._keep_ms])
        if not opened:
            raise _running(turn_id)

    async def append(self, turn_id: str, data: bytes) -> str:
        """Add one event; returns its stream id."""
        return await self._add(turn_id, {"d": data})

    async def end(self, turn_id: str) -> None:
        """Mark the turn ended."""
        await self._add(turn_id, {"e": b"1"})

    async def erase(self, turn_id: str) -> None:
        """Delete the turn's stream (``DEL {prefix}:{turn_id}``): its events are gone
        at once (from the AOF only at its next rewrite: see docs/retention.md); a
        reader still waiting on it raises ``TurnLogError`` within ``block_ms``."""
        await self._client.delete(self._key(turn_id))

    async def events(
        self, turn_id: str, after: str | None = None
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The turn's events after ``after``, waiting for more until it ends."""
        key = self._key(turn_id)
        first = await self._client.xrange(key, count=1)
        if not first:
            raise TurnLogError(f"turn {turn_id!r} is unknown or expired")
        cursor = "0-0"
        if after is not None:
            try:
                wanted = _stream_id(after)
            except ValueError:
                raise TurnLogError(f"turn {turn_id!r}: {after!r} is not an event id") from None
            first_id = _stream_id(first[0][0].decode())
            if first_id[1] > wanted[1] + 1:  # ids are 0-1, 0-2, ...: no gaps but trimmed ones
                raise TurnLogError(
                    f"turn {turn_id!r}: the events after {after} were dropped "
                    f"(the log keeps {self._max})"
                )
            cursor = after
        elif b"o" not in first[0][1]:
            raise TurnLogError(f"turn {turn_id!r}: its first events were dropped")
        else:
            cursor = first[0][0].decode()  # after this turn's open mark
        while True:
            reply = await self._client.xread({key: cursor}, count=256, block=self._block)
            if not reply:
                if not await self._client.exists(key):
                    raise TurnLogError(f"turn {turn_id!r} expired while it was read")
                continue
            for entry_id, fields in reply[0][1]:
                cursor = entry_id.decode()
                if b"e" in fields:
                    return
                if b"o" in fields:
                    return  # a later turn of this id: the one read here ended
                data = fields.get(b"d")
                if data is not None:
                    yield cursor, data


def _with_id(data: bytes, event_id: str) -> bytes:
    """One SSE event with its ``id:`` line first."""
    return b"id: " + event_id.encode() + b"\n" + data


def _events(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The whole SSE events of ``pending + data`` (each with its ``\n\n``) and what
    is left of an event not yet complete."""
    buffer = pending + data if pending else data
    events: list[bytes] = []
    start = 0
    while (end := buffer.find(b"\n\n", start)) != -1:
        events.append(buffer[start : end + 2])
        start = end + 2
    return events, buffer[start:]


#: Seconds ``ResumableTurns.start`` waits, by default, for a running turn of the same
#: id to end once the new turn has begun answering.
HANDOVER_TIMEOUT: Final = 2.0
#: Seconds ``ResumableTurns.shutdown`` (and leaving ``async with``) lets running turns
#: go on, by default, before it stops them.
SHUTDOWN_GRACE: Final = 10.0
#: The error text a reader of a turn stopped by ``shutdown`` gets in the protocol's
#: error event.
SHUTDOWN_TEXT: Final = "the service is shutting down: the answer was stopped"


@final
class _Running:
    """A turn this ``ResumableTurns`` pumps: its cancel scope, when it started, an
    event set once its log has ended, and whether ``shutdown`` stopped it."""

    __slots__ = ("done", "scope", "started_at", "stopped")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.started_at = time.time()
        self.done = anyio.Event()
        self.stopped = False


@final
class ResumableTurns:
    """Runs turns apart from the requests that read them (``async with`` it for the
    service's lifetime, e.g. in an ASGI lifespan).

    - ``log``: the ``TurnLog`` (default: an ``InMemoryTurnLog``).
    - ``cancel_on_disconnect``: when True, a turn is cancelled as soon as the reader
      that started it goes away before the end (no resume; nothing stored, as for any
      stopped turn). Default False: the turn runs on and is stored once; reconnecting
      clients get the rest.
    - ``handover_timeout``: seconds a new turn waits for a running turn of the same
      id to end once the new turn began answering (default 2; see ``start``).
    - ``shutdown_grace``: seconds running turns may go on once the service shuts down
      before they are stopped (default 10; see ``shutdown``).

    ``await turns.start(turn_id, frames)`` begins pumping an encoded stream (the bytes
    of ``ui_message_stream``/``agui_events``) into the log, one log entry per SSE
    event; ``turns.stream(turn_id, last_event_id)`` reads it back as SSE bytes with an
    ``id:`` line on every event (``last_event_id`` from the request's
    ``Last-Event-ID`` header; None for the whole turn, as the AI SDK's resume request
    wants). Leaving the ``async with`` is ``shutdown()``: running turns get
    ``shutdown_grace`` seconds to end, then they are stopped.
    """

    def __init__(
        self,
        log: TurnLog | None = None,
        *,
        cancel_on_disconnect: bool = False,
        handover_timeout: float = HANDOVER_TIMEOUT,
        shutdown_grace: float = SHUTDOWN_GRACE,
    ) -> None:
        if log is not None and not isinstance(log, TurnLog):
            raise TypeError(f"log must be a TurnLog, got {type(log).__name__}")
        if not isinstance(cancel_on_disconnect, bool):
            raise TypeError("cancel_on_disconnect must be a bool")
        self._handover = check_seconds(handover_timeout, "handover_timeout")
        self._grace = check_seconds(shutdown_grace, "shutdown_grace")
        self._closing = False  # shutdown() began: no turn starts any more
        self.log: TurnLog = log if log is not None else InMemoryTurnLog()
        self._cancel_on_disconnect = cancel_on_disconnect
        self._group: anyio.abc.TaskGroup | None = None
        self._running: dict[str, _Running] = {}

    async def __aenter__(self) -> Self:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._closing = False  # entered again after a drain: it takes turns again
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group = self._group
        assert group is not None
        if exc is None:
            try:
                await self.shutdown()
            except BaseException as error:  # cancelled while draining: stop every turn
                self._group = None
                await group.__aexit__(type(error), error, error.__traceback__)
                raise
        self._group = None
        return await group.__aexit__(exc_type, exc, tb)

    async def shutdown(self, grace: float | None = None) -> None:
        """Drain: stop taking turns, let the running ones go on for at most ``grace``
        seconds (default: ``shutdown_grace``), then stop those still running, and
        return once every turn's log has ended. Call it when the server begins to shut
        down (SIGTERM), before it waits for open responses: a reader's response ends
        when its turn does (the example service's ``serve`` does this under uvicorn).

        From the first call on, ``start`` refuses new turns (``RuntimeError``, their
        frames closed: unread, so no model call, unless the turn had begun answering
        while it waited for a running turn of its id). A turn that ends within the grace period
        ends as usual (stored, its readers get its finish). A turn still running after
        it is cancelled, as any stopped turn: its ``Conversation`` stores nothing, or,
        with ``keep_interrupted=True``, the interrupted turn (the partial answer marked
        ``scope/interrupted`` = ``"cancelled"``, written within that option's own bound);
        its readers get the protocol's error event (the AI SDK's ``error`` part with
        ``SHUTDOWN_TEXT`` then ``[DONE]``, AG-UI's ``RUN_ERROR``) when its frames are an
        ``EncodedStream``, then the stream ends; its log ends, so a client that
        reconnects to a surviving ``RedisTurnLog`` reads the same end.

        Safe to call more than once and from any task of the event loop; a later call
        does not restart the grace period, it stops what still runs after its own
        ``grace``. Leaving ``async with`` calls it (with no error in flight).
        ``TypeError``/``ValueError`` for a ``grace`` that is not a finite number of
        seconds >= 0.
        """
        wait = self._grace if grace is None else check_seconds(grace, "grace")
        self._closing = True
        with anyio.move_on_after(wait):
            while self._running:
                await next(iter(self._running.values())).done.wait()
        while self._running:
            for running in list(self._running.values()):
                running.stopped = True
                running.scope.cancel()
            await next(iter(self._running.values())).done.wait()

    async def start(self, turn_id: str, frames: AsyncIterator[bytes]) -> None:
        """Open ``turn_id``'s log and start pumping ``frames`` into it.

        When no turn of that id runs, this returns at once. When one runs (in this
        process, or in another one sharing a ``RedisTurnLog``), the new turn goes
        first: ``start`` waits for its first frame, so that the ``Conversation``'s
        ``on_overlap`` acts before anything is refused —

        - ``"wait"``: the new turn waited for the running one to be stored;
        - ``"interrupt"``: it stopped the running one (whose readers get its error
          event) and took over;
        - ``"reject"``: it was refused before the model was called: its
          ``TurnInProgressError`` is raised here (the frames must be an
          ``EncodedStream`` for that: what ``ui_message_stream``/``agui_events``
          return);

        then, the new turn answering, it waits up to ``handover_timeout`` seconds for
        the running turn's log to end and takes the log over. A turn still running
        after that (``"fence"``, the ``Conversation`` default, lets both turns run) is
        refused: the new frames are closed (their turn stops, nothing stored) and
        ``TurnInProgressError`` is raised, with ``conversation_id`` the turn id (and
        ``started_at`` when the running turn is this object's). Answer it with a 409;
        with ``on_overlap="reject"`` it comes before any model call.

        ``TypeError`` for a ``turn_id`` that is not a non-empty ``str`` or ``frames``
        that are not an async iterator; ``RuntimeError`` outside ``async with``.
        """
        if self._group is None:
            raise RuntimeError("ResumableTurns.start() needs `async with ResumableTurns(...)`")
        if not isinstance(turn_id, str) or not turn_id:
            raise TypeError(f"turn_id must be a non-empty str, got {turn_id!r}")
        if not callable(getattr(frames, "__anext__", None)):
            raise TypeError(
                "frames must be an async iterator of SSE bytes (ui_message_stream(...), "
                f"agui_events(...)), got {type(frames).__name__}"
            )
        if self._closing:
            await self._refuse(frames)
        first: bytes | None = None
        try:
            await self.log.open(turn_id)
        except TurnInProgressError:
            first = await self._hand_over(turn_id, frames)
        if self._closing:
            try:
                await self._refuse(frames)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.log.end(turn_id)
        running = _Running()
        self._running[turn_id] = running
        self._group.start_soon(self._pump, turn_id, frames, running, first)

    async def _refuse(self, frames: AsyncIterator[bytes]) -> NoReturn:
        """A turn ``start`` takes no more (``shutdown`` began): its frames closed."""
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
        raise RuntimeError(
            "ResumableTurns is shutting down (shutdown() was called): it starts no new "
            "turn; answer the request with a 503"
        )

    async def _hand_over(self, turn_id: str, frames: AsyncIterator[bytes]) -> bytes:
        """Let the new turn begin while ``turn_id`` runs, then open its log once the
        running turn ended (see ``start``); the new turn's first frame."""
        try:
            try:
                first = await anext(frames)
            except StopAsyncIteration:
                first = b""
            error = frames.error if isinstance(frames, EncodedStream) else None
            if isinstance(error, TurnInProgressError):
                raise error
            poll = 0.005
            with anyio.move_on_after(self._handover):
                while True:
                    running = self._running.get(turn_id)
                    if running is not None:
                        await running.done.wait()
                    try:
                        await self.log.open(turn_id)
                    except TurnInProgressError:
                        await anyio.sleep(poll)  # another process's turn: look again
                        poll = min(poll * 2, 0.1)
                        continue
                    return first
            running = self._running.get(turn_id)
            raise TurnInProgressError(
                f"turn {turn_id!r} is still running: the new turn was refused after "
                f"{self._handover} s (handover_timeout) and stopped, nothing stored; with "
                "Conversation(on_overlap='reject') it is refused before the model is "
                "called, with 'wait' or 'interrupt' it runs",
                conversation_id=turn_id,
                started_at=None if running is None else running.started_at,
                waited=self._handover,
            )
        except BaseException:
            aclose = getattr(frames, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
            raise

    async def _pump(
        self,
        turn_id: str,
        frames: AsyncIterator[bytes],
        running: _Running,
        first: bytes | None,
    ) -> None:
        log = self.log
        pending = b""
        try:
            with running.scope:
                aclose = getattr(frames, "aclose", None)
                try:
                    if first is not None:
                        events, pending = _events(pending, first)
                        for event in events:
                            await log.append(turn_id, event)
                    async for data in frames:
                        events, pending = _events(pending, data)
                        for event in events:
                            await log.append(turn_id, event)
                    if pending:  # bytes after the last event: kept as they came
                        await log.append(turn_id, pending)
                finally:
                    if aclose is not None:
                        await aclose()
        finally:
            if self._running.get(turn_id) is running:
                del self._running[turn_id]
            try:
                with anyio.CancelScope(shield=True):
                    if (
                        running.stopped
                        and running.scope.cancelled_caught
                        and isinstance(frames, EncodedStream)
                    ):
                        # The protocol's error event, one log entry per SSE event.
                        for event in _events(b"", frames.stopped(SHUTDOWN_TEXT))[0]:
                            await log.append(turn_id, event)
                    await log.end(turn_id)
            finally:
                running.done.set()

    async def erase(self, turn_id: str) -> None:
        """Erase the turn log of ``turn_id`` (the conversation id, when turns are
        started under it as the examples do), for ``scope.history.erase``: a turn of
        that id this object runs is cancelled first (nothing of it is stored: the
        conversation is being erased) and waited for, then the log's own ``erase``
        deletes every event. ``TypeError`` for a log without ``erase`` or a bad
        ``turn_id``."""
        if not isinstance(turn_id, str) or not turn_id:
            raise TypeError(f"turn_id must be a non-empty str, got {turn_id!r}")
        erase = getattr(self.log, "erase", None)
        if erase is None:
            raise TypeError(f"{type(self.log).__name__} has no erase(turn_id)")
        running = self._running.get(turn_id)
        if running is not None:
            running.scope.cancel()
            await running.done.wait()
        await erase(turn_id)

    async def erased(self, receipts: Iterable[ErasureReceipt]) -> None:
        """Follow the store's erasures (DESIGN §6n): for each receipt an erase returned
        (``scope.history.erase``, ``erase_owner``), ``erase`` the turn of its
        ``conversation_id`` (a running one is cancelled, nothing of it stored, and its
        log deleted), so no copy of an erased chat is served after the store erased it.
        Turns are taken to be started under their conversation's id, as the examples
        do; a service that names turns otherwise calls ``erase(turn_id)`` itself.

        Every receipt is checked first: one read back from JSON (no
        ``conversation_id``: the id is handed over once, in memory) raises
        ``ValueError``, anything but an ``ErasureReceipt`` ``TypeError``, before any
        turn is touched. ``TypeError`` for a log without ``erase``."""
        ids: list[str] = []
        for index, receipt in enumerate(receipts):
            if not isinstance(receipt, ErasureReceipt):
                raise TypeError(
                    f"receipts[{index}] must be an ErasureReceipt, got {type(receipt).__name__}"
                )
            if receipt.conversation_id is None:
                raise ValueError(
                    f"receipts[{index}] names no conversation (a receipt read back from JSON "
                    "keeps the proof, not the id): pass the receipts the erase returned"
                )
            ids.append(str(receipt.conversation_id))
        for turn_id in dict.fromkeys(ids):
            await self.erase(turn_id)

    async def stream(self, turn_id: str, last_event_id: str | None = None) -> AsyncIterator[bytes]:
        """The turn's SSE bytes after ``last_event_id`` (all for None), each event with
        its ``id:``, until the turn ends. ``TurnLogError`` (before anything is sent)
        when the log cannot serve them. With ``cancel_on_disconnect``, closing this
        before the end cancels the turn."""
        finished = False
        running = self._running.get(turn_id)
        events = self.log.events(turn_id, last_event_id)
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event_id, data in events:
                    yield _with_id(data, event_id)
            finished = True
        finally:
            if not finished and self._cancel_on_disconnect and running is not None:
                running.scope.cancel()
