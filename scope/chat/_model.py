"""``Model`` and ``Streamer``, their function adapters, middleware composition, ``collect``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeAlias, final, runtime_checkable

import attrs

from scope.chat._accumulator import ResponseAccumulator
from scope.chat._request import Request
from scope.chat._response import Response

__all__ = [
    "CallMiddleware",
    "Model",
    "ModelFunc",
    "StreamMiddleware",
    "Streamer",
    "StreamerFunc",
    "collect",
    "wrap",
    "wrap_stream",
]


@runtime_checkable
class Model(Protocol):
    """Anything that answers a request with one complete response.

    Contract for implementations: validate the request before any I/O (raise
    ``InvalidRequestError``); do not hold on to the request after returning; let
    cancellation (``asyncio.CancelledError``, trio's ``Cancelled``) propagate untouched;
    release every resource before returning or raising.
    """

    async def call(self, request: Request) -> Response:
        """Answer ``request`` with a complete response."""
        ...


@runtime_checkable
class Streamer(Protocol):
    """Anything that answers a request with a stream of response deltas.

    Contract for implementations (an async generator function meets most of it
    naturally):

    - ``stream(request)`` starts no work: validation and I/O happen when the stream is
      first iterated.
    - Every yielded ``Response`` is a valid ``ResponseAccumulator`` delta; usage in a
      delta is a cumulative snapshot.
    - A failure is raised once and ends the stream.
    - When the consumer stops early (``aclose()``, ``break`` inside
      ``contextlib.aclosing``), every resource is released before ``aclose()`` returns
      and no background task is left behind.
    - Cancellation propagates untouched.

    ``stream`` returns an async generator (what an ``async def ... yield`` function
    returns), so callers can close it: ``contextlib.aclosing(streamer.stream(request))``.
    """

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """A lazy stream of deltas answering ``request``."""
        ...


#: A call middleware takes the next model and returns a model that wraps it.
CallMiddleware: TypeAlias = Callable[[Model], Model]
#: A stream middleware takes the next streamer and returns a streamer that wraps it.
StreamMiddleware: TypeAlias = Callable[[Streamer], Streamer]


@final
@attrs.frozen
class ModelFunc:
    """Adapt a coroutine function ``async def fn(request) -> Response`` into a ``Model``.

    ``call(request)`` is ``await fn(request)``; nothing is added or caught.
    """

    fn: Callable[[Request], Awaitable[Response]]

    async def call(self, request: Request) -> Response:
        """Return ``await fn(request)``."""
        return await self.fn(request)


@final
@attrs.frozen
class StreamerFunc:
    """Adapt an async generator function ``async def fn(request): yield ...`` into a
    ``Streamer``.

    ``stream(request)`` returns ``fn(request)`` itself, so the stream is exactly as lazy
    as ``fn`` (an async generator runs nothing before its first iteration) and
    ``aclose()`` reaches ``fn``'s ``finally`` blocks directly.
    """

    fn: Callable[[Request], AsyncGenerator[Response, None]]

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """Return ``fn(request)``."""
        return self.fn(request)


def wrap(model: Model, *middlewares: CallMiddleware | None) -> Model:
    """Compose call middlewares around ``model``: the first is the outermost.

    ``wrap(m, a, b)`` is ``a(b(m))``: a request passes ``a``, then ``b``, then reaches
    ``m``. ``None`` entries are skipped, so optional middlewares can be listed inline.
    """
    for middleware in reversed(middlewares):
        if middleware is not None:
            model = middleware(model)
    return model


def wrap_stream(streamer: Streamer, *middlewares: StreamMiddleware | None) -> Streamer:
    """Compose stream middlewares around ``streamer``: the first is the outermost.

    ``wrap_stream(s, a, b)`` is ``a(b(s))``. ``None`` entries are skipped.
    """
    for middleware in reversed(middlewares):
        if middleware is not None:
            streamer = middleware(streamer)
    return streamer


async def collect(stream: AsyncIterator[Response]) -> Response:
    """Accumulate a whole stream into one response with a ``ResponseAccumulator``.

    The stream is closed (``aclose()``, when it has one) on every path — normal end, a
    failure raised by the stream, an invalid chunk (``InvalidResponseError`` from the
    accumulator) and cancellation — before ``collect`` returns or raises. A stream that
    yields nothing gives the empty ``Response()``. The result is not checked for
    completeness: call ``Response.validate_complete()`` when a final answer is required.
    """
    accumulator = ResponseAccumulator()
    try:
        async for chunk in stream:
            accumulator.add(chunk)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    response = accumulator.response()
    return Response() if response is None else response
