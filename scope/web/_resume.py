"""Resumable turns: a per-turn event log and the runner that keeps a turn going.

A turn's encoded stream (``ui_message_stream`` or ``agui_events`` bytes) is pumped
into a ``TurnLog`` by a task that does not belong to any one request; each client
request reads the log from its last event id on. So a client that drops its
connection can come back for the rest, and by default the turn runs on and is stored
once whatever the clients do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Protocol, Self, final, runtime_checkable

import anyio
import anyio.abc

from scope.errors import TurnLogError

__all__ = ["InMemoryTurnLog", "RedisTurnLog", "ResumableTurns", "TurnLog"]


@runtime_checkable
class TurnLog(Protocol):
    """Where a running turn's encoded events wait for the clients that read them.

    Event ids are opaque strings, increasing within a turn. ``events`` yields
    ``(event_id, data)`` after ``after`` (all of them for None), waits for more while
    the turn runs and stops after ``end``; it raises ``TurnLogError`` for an unknown
    or expired turn, or when events after ``after`` were already dropped.
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
        """Start an empty log for ``turn_id``, replacing an ended one of that id."""
        with self._lock:
            self._expire()
            turn = self._turns.get(turn_id)
            if turn is not None and turn.ended_at is None:
                raise ValueError(f"turn {turn_id!r} is still running")
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

    async def events(
        self, turn_id: str, after: str | None = None
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The turn's events after ``after``, waiting for more until it ends."""
        try:
            seq = 0 if after is None else int(after)
        except ValueError:
            raise TurnLogError(f"turn {turn_id!r}: {after!r} is not an event id") from None
        while True:
            with self._lock:
                self._expire()
                turn = self._turns.get(turn_id)
                if turn is None:
                    raise TurnLogError(f"turn {turn_id!r} is unknown or expired")
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
    consecutive, so a gap left by trimming shows). The first entry marks the turn open
    and the last one its end; readers skip both.
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
        """Start the turn's stream, replacing an ended one of that id."""
        key = self._key(turn_id)
        last = await self._client.xrevrange(key, count=1)
        if last and b"e" not in last[0][1]:
            raise ValueError(f"turn {turn_id!r} is still running")
        await self._client.delete(key)
        await self._add(turn_id, {"o": b"1"})

    async def append(self, turn_id: str, data: bytes) -> str:
        """Add one event; returns its stream id."""
        return await self._add(turn_id, {"d": data})

    async def end(self, turn_id: str) -> None:
        """Mark the turn ended."""
        await self._add(turn_id, {"e": b"1"})

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
                data = fields.get(b"d")
                if data is not None:
                    yield cursor, data


def _with_id(data: bytes, event_id: str) -> bytes:
    """``data`` (one or more SSE events) with ``id:`` on its last event, so a client's
    last event id moves only once the whole entry arrived."""
    start = data.rfind(b"\n\n", 0, len(data) - 2) + 2 if data.count(b"\n\n") > 1 else 0
    return data[:start] + b"id: " + event_id.encode() + b"\n" + data[start:]


@final
class ResumableTurns:
    """Runs turns apart from the requests that read them (``async with`` it for the
    service's lifetime, e.g. in an ASGI lifespan).

    - ``log``: the ``TurnLog`` (default: an ``InMemoryTurnLog``).
    - ``cancel_on_disconnect``: when True, a turn is cancelled as soon as the reader
      that started it goes away before the end (no resume; nothing stored, as for any
      stopped turn). Default False: the turn runs on and is stored once; reconnecting
      clients get the rest.

    ``await turns.start(turn_id, frames)`` begins pumping an encoded stream (the bytes
    of ``ui_message_stream``/``agui_events``) into the log; ``turns.stream(turn_id,
    last_event_id)`` reads it back as SSE bytes with ``id:`` lines (``last_event_id``
    from the request's ``Last-Event-ID`` header; None for the whole turn, as the AI
    SDK's resume request wants). Leaving the ``async with`` waits for running turns.
    """

    def __init__(self, log: TurnLog | None = None, *, cancel_on_disconnect: bool = False) -> None:
        if log is not None and not isinstance(log, TurnLog):
            raise TypeError(f"log must be a TurnLog, got {type(log).__name__}")
        if not isinstance(cancel_on_disconnect, bool):
            raise TypeError("cancel_on_disconnect must be a bool")
        self.log: TurnLog = log if log is not None else InMemoryTurnLog()
        self._cancel_on_disconnect = cancel_on_disconnect
        self._group: anyio.abc.TaskGroup | None = None
        self._scopes: dict[str, anyio.CancelScope] = {}

    async def __aenter__(self) -> Self:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._group, None
        assert group is not None
        return await group.__aexit__(exc_type, exc, tb)

    async def start(self, turn_id: str, frames: AsyncIterator[bytes]) -> None:
        """Open ``turn_id``'s log and start pumping ``frames`` into it; returns at once.

        ``ValueError`` when a turn of that id is still running; ``RuntimeError``
        outside ``async with``.
        """
        if self._group is None:
            raise RuntimeError("ResumableTurns.start() needs `async with ResumableTurns(...)`")
        await self.log.open(turn_id)
        scope = anyio.CancelScope()
        self._scopes[turn_id] = scope
        self._group.start_soon(self._pump, turn_id, frames, scope)

    async def _pump(
        self, turn_id: str, frames: AsyncIterator[bytes], scope: anyio.CancelScope
    ) -> None:
        try:
            with scope:
                aclose = getattr(frames, "aclose", None)
                try:
                    async for data in frames:
                        await self.log.append(turn_id, data)
                finally:
                    if aclose is not None:
                        await aclose()
        finally:
            self._scopes.pop(turn_id, None)
            with anyio.CancelScope(shield=True):
                await self.log.end(turn_id)

    async def stream(self, turn_id: str, last_event_id: str | None = None) -> AsyncIterator[bytes]:
        """The turn's SSE bytes after ``last_event_id`` (all for None), each entry with
        its ``id:``, until the turn ends. ``TurnLogError`` (before anything is sent)
        when the log cannot serve them. With ``cancel_on_disconnect``, closing this
        before the end cancels the turn."""
        finished = False
        events = self.log.events(turn_id, last_event_id)
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event_id, data in events:
                    yield _with_id(data, event_id)
            finished = True
        finally:
            if not finished and self._cancel_on_disconnect:
                scope = self._scopes.get(turn_id)
                if scope is not None:
                    scope.cancel()
