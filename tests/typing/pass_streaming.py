"""The README's model, streaming and middleware snippets, typed as a user would write
them (mypy --strict: no errors). tests/test_typing.py also runs ``main()``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator

import anyio

from scope.chat import (
    CallMiddleware,
    FinishReason,
    Model,
    ModelFunc,
    Output,
    Request,
    Response,
    ResponseAccumulator,
    Streamer,
    StreamerFunc,
    StreamMiddleware,
    collect,
    wrap,
    wrap_stream,
)
from scope.chat import assistant_message as assistant
from scope.chat import user_message as user
from scope.errors import ProviderServerError, RateLimitError
from scope.testing import Fail, ScriptedModel

log = logging.getLogger("chat")


async def call_a_model(model: Model) -> str:
    request = Request([user("What is the capital of Norway?")])
    response = await model.call(request)
    response.validate_complete()
    return f"{response.text} {response.usage.total_tokens}"


async def stream_with_aclosing(streamer: Streamer, request: Request) -> Response | None:
    accumulator = ResponseAccumulator()
    async with contextlib.aclosing(streamer.stream(request)) as chunks:
        async for chunk in chunks:
            accumulator.add(chunk)
            if chunk.text == "stop":
                break
    return accumulator.response()


async def stream_with_collect(streamer: Streamer, request: Request) -> Response:
    return await collect(streamer.stream(request))


async def close_by_hand(streamer: Streamer, request: Request) -> Response:
    stream = streamer.stream(request)
    try:
        return await anext(stream)
    finally:
        await stream.aclose()


def logging_middleware(next: Model) -> Model:
    async def call(request: Request) -> Response:
        log.info("-> %d messages", len(request.messages))
        response = await next.call(request)
        log.info("<- %d tokens", response.usage.total_tokens)
        return response

    return ModelFunc(call)


def retry(attempts: int) -> CallMiddleware:
    def middleware(next: Model) -> Model:
        async def call(request: Request) -> Response:
            for attempt in range(1, attempts + 1):
                try:
                    return await next.call(request)
                except (ProviderServerError, RateLimitError):
                    if attempt == attempts:
                        raise
            raise AssertionError("unreachable")

        return ModelFunc(call)

    return middleware


def retry_stream(attempts: int) -> StreamMiddleware:
    def middleware(next: Streamer) -> Streamer:
        async def stream(request: Request) -> AsyncGenerator[Response, None]:
            for attempt in range(1, attempts + 1):
                started = False
                try:
                    async with contextlib.aclosing(next.stream(request)) as chunks:
                        async for chunk in chunks:
                            started = True
                            yield chunk
                    return
                except ProviderServerError:
                    if started or attempt == attempts:
                        raise

        return StreamerFunc(stream)

    return middleware


class Echo:
    """A Streamer written as a class: an async generator method meets the protocol."""

    async def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        yield Response(Output(assistant(request.messages[-1].text), FinishReason.STOP))


async def main() -> None:
    def final(text: str) -> Response:
        return Response(Output(assistant(text), FinishReason.STOP))

    request = Request([user("Hi")])
    model = ScriptedModel(final("Oslo"), final("Oslo"), final("stop"), final("Hi"))
    assert (await call_a_model(wrap(model, logging_middleware, retry(3)))).startswith("Oslo")
    assert (await stream_with_collect(model, request)).text == "Oslo"
    assert await stream_with_aclosing(model, request) is not None
    assert (await close_by_hand(model, request)).text == "Hi"

    flaky = ScriptedModel(Fail(ProviderServerError("503")), final("Oslo"))
    streamer = wrap_stream(flaky, retry_stream(3), None)
    assert (await collect(streamer.stream(request))).text == "Oslo"
    assert all(stream_log.closed for stream_log in flaky.streams)

    echo: Streamer = Echo()
    assert (await collect(echo.stream(request))).text == "Hi"


if __name__ == "__main__":
    anyio.run(main)
