"""Model, Streamer, their adapters, middleware composition and collect, on asyncio and trio."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import trio

from scope.chat import (
    CallMiddleware,
    FinishReason,
    Message,
    Model,
    ModelFunc,
    Output,
    Request,
    Response,
    Role,
    Streamer,
    StreamerFunc,
    StreamMiddleware,
    collect,
    text_part,
    user_message,
    wrap,
    wrap_stream,
)
from scope.errors import InvalidResponseError, ProviderServerError
from scope.testing import Fail, Hang, ScriptedModel
from tests.helpers import collect_until_cancelled

REQUEST = Request([user_message("hi")])


def text_chunk(text: str, finish: FinishReason | None = None) -> Response:
    return Response(Output(Message(Role.ASSISTANT, [text_part(text)]), finish))


ANSWER = text_chunk("ok", FinishReason.STOP)


def running_tasks() -> int:
    """How many tasks the event loop has (the test's own included)."""
    if anyio.get_cancelled_exc_class() is asyncio.CancelledError:
        return len(asyncio.all_tasks())

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    return count(trio.lowlevel.current_root_task())  # type: ignore[arg-type]


class Probe:
    """A hand-written provider stream that records what it did."""

    def __init__(self, *chunks: Response, fail: BaseException | None = None) -> None:
        self.chunks = chunks
        self.fail = fail
        self.events: list[str] = []

    async def stream(self, request: Request) -> AsyncIterator[Response]:
        self.events.append("started")
        try:
            for chunk in self.chunks:
                await anyio.lowlevel.checkpoint()
                yield chunk
            if self.fail is not None:
                raise self.fail
            self.events.append("ended")
        finally:
            # cleanup that awaits, like closing an HTTP response
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
            self.events.append("cleanup")


# -- protocols and adapters --------------------------------------------------------------


async def answer(request: Request) -> Response:
    return ANSWER


async def answer_stream(request: Request) -> AsyncIterator[Response]:
    yield ANSWER


def test_adapters_satisfy_the_protocols() -> None:
    assert isinstance(ModelFunc(answer), Model)
    assert isinstance(StreamerFunc(answer_stream), Streamer)
    assert not isinstance(ModelFunc(answer), Streamer)
    assert not isinstance(StreamerFunc(answer_stream), Model)
    scripted = ScriptedModel()
    assert isinstance(scripted, Model) and isinstance(scripted, Streamer)


def test_public_names_show_the_public_module() -> None:
    assert ModelFunc.__module__ == "scope.chat"
    assert collect.__module__ == "scope.chat"
    assert wrap.__module__ == "scope.chat"


@pytest.mark.anyio
async def test_model_func_calls_the_function() -> None:
    seen: list[Request] = []

    async def fn(request: Request) -> Response:
        seen.append(request)
        return ANSWER

    assert await ModelFunc(fn).call(REQUEST) == ANSWER
    assert seen == [REQUEST]


@pytest.mark.anyio
async def test_streamer_func_is_lazy_and_returns_the_generator() -> None:
    probe = Probe(ANSWER)
    stream = StreamerFunc(probe.stream).stream(REQUEST)
    await anyio.lowlevel.checkpoint()
    assert probe.events == []
    assert [c async for c in stream] == [ANSWER]
    assert probe.events == ["started", "ended", "cleanup"]


# -- composition ------------------------------------------------------------------------


def tagging(tag: str, log: list[str]) -> CallMiddleware:
    def middleware(next: Model) -> Model:
        async def call(request: Request) -> Response:
            log.append(f"{tag}>")
            response = await next.call(request)
            log.append(f"<{tag}")
            return response

        return ModelFunc(call)

    return middleware


def stream_tagging(tag: str, log: list[str]) -> StreamMiddleware:
    def middleware(next: Streamer) -> Streamer:
        async def stream(request: Request) -> AsyncIterator[Response]:
            log.append(f"{tag}>")
            async with contextlib.aclosing(next.stream(request)) as chunks:  # type: ignore[type-var]
                async for chunk in chunks:
                    log.append(f"{tag}:{chunk.text}")
                    yield chunk
            log.append(f"<{tag}")

        return StreamerFunc(stream)

    return middleware


@pytest.mark.anyio
async def test_wrap_first_middleware_is_outermost_and_none_is_skipped() -> None:
    log: list[str] = []

    async def inner(request: Request) -> Response:
        log.append("model")
        return ANSWER

    model = wrap(ModelFunc(inner), tagging("a", log), None, tagging("b", log))
    assert await model.call(REQUEST) == ANSWER
    assert log == ["a>", "b>", "model", "<b", "<a"]


def test_wrap_without_middlewares_is_the_model_itself() -> None:
    model = ModelFunc(answer)
    assert wrap(model) is model
    assert wrap(model, None, None) is model
    streamer = StreamerFunc(answer_stream)
    assert wrap_stream(streamer) is streamer
    assert wrap_stream(streamer, None) is streamer


@pytest.mark.anyio
async def test_wrap_stream_first_middleware_is_outermost_and_none_is_skipped() -> None:
    log: list[str] = []
    probe = Probe(text_chunk("x"), text_chunk("y"))
    streamer = wrap_stream(
        StreamerFunc(probe.stream), None, stream_tagging("a", log), stream_tagging("b", log)
    )
    response = await collect(streamer.stream(REQUEST))
    assert response.text == "xy"
    assert log == ["a>", "b>", "b:x", "a:x", "b:y", "a:y", "<b", "<a"]


# -- collect -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_collect_accumulates_and_closes_the_stream() -> None:
    probe = Probe(text_chunk("Hel"), text_chunk("lo", FinishReason.STOP))
    response = await collect(probe.stream(REQUEST))
    assert response == text_chunk("Hello", FinishReason.STOP)
    assert probe.events == ["started", "ended", "cleanup"]


@pytest.mark.anyio
async def test_collect_of_an_empty_stream_is_the_empty_response() -> None:
    assert await collect(Probe().stream(REQUEST)) == Response()


@pytest.mark.anyio
async def test_collect_closes_the_stream_on_an_invalid_chunk() -> None:
    probe = Probe(text_chunk("a", FinishReason.STOP), text_chunk("late"), text_chunk("never"))
    with pytest.raises(InvalidResponseError, match="after the finish reason"):
        await collect(probe.stream(REQUEST))
    assert probe.events == ["started", "cleanup"]


@pytest.mark.anyio
async def test_collect_propagates_the_stream_error_once() -> None:
    error = ProviderServerError("boom")
    probe = Probe(text_chunk("a"), fail=error)
    with pytest.raises(ProviderServerError) as info:
        await collect(probe.stream(REQUEST))
    assert info.value is error
    assert probe.events == ["started", "cleanup"]


@pytest.mark.anyio
async def test_collect_works_with_an_iterator_without_aclose() -> None:
    class Plain:
        def __init__(self) -> None:
            self.items = [text_chunk("a"), text_chunk("b")]

        def __aiter__(self) -> Plain:
            return self

        async def __anext__(self) -> Response:
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

    assert (await collect(Plain())).text == "ab"


@pytest.mark.anyio
async def test_collect_cancelled_propagates_and_closes_the_stream() -> None:
    model = ScriptedModel(Hang(after=2))
    before = running_tasks()
    await collect_until_cancelled(model.stream(REQUEST))
    assert model.streams[0].closed
    assert model.streams[0].outcome == "cancelled"
    assert running_tasks() == before


# -- stream contracts through a middleware chain ----------------------------------------


@pytest.mark.anyio
async def test_a_stream_starts_no_work_until_iterated() -> None:
    probe = Probe(ANSWER)
    log: list[str] = []
    stream = wrap_stream(StreamerFunc(probe.stream), stream_tagging("a", log)).stream(REQUEST)
    await anyio.lowlevel.checkpoint()
    assert probe.events == [] and log == []
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        await stream.__anext__()
    assert probe.events == ["started", "cleanup"]


@pytest.mark.anyio
async def test_early_stop_runs_the_provider_cleanup_before_aclose_returns() -> None:
    probe = Probe(text_chunk("a"), text_chunk("b"), text_chunk("c"))
    log: list[str] = []
    streamer = wrap_stream(StreamerFunc(probe.stream), stream_tagging("outer", log))
    before = running_tasks()
    async with contextlib.aclosing(streamer.stream(REQUEST)) as chunks:  # type: ignore[type-var]
        async for chunk in chunks:
            assert chunk.text == "a"
            break
        assert probe.events == ["started"]
    assert probe.events == ["started", "cleanup"]
    assert log == ["outer>", "outer:a"]  # the middleware's code after the loop did not run
    assert running_tasks() == before


@pytest.mark.anyio
async def test_one_raised_error_ends_the_stream() -> None:
    error = ProviderServerError("boom")
    probe = Probe(text_chunk("a"), fail=error)
    stream = wrap_stream(StreamerFunc(probe.stream), stream_tagging("m", [])).stream(REQUEST)
    assert (await stream.__anext__()).text == "a"
    with pytest.raises(ProviderServerError) as info:
        await stream.__anext__()
    assert info.value is error
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert probe.events == ["started", "cleanup"]


@pytest.mark.anyio
async def test_cancellation_propagates_untouched_through_middleware() -> None:
    log: list[str] = []
    model = ScriptedModel(Hang(), Hang(after=1))
    caught: list[BaseException] = []
    before = running_tasks()

    async def run(operation: Callable[[], Awaitable[Any]]) -> None:
        with anyio.CancelScope() as scope:

            async def cancel_soon() -> None:
                await anyio.sleep(0.01)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_soon)
                try:
                    await operation()
                except BaseException as exc:  # recorded and re-raised untouched
                    caught.append(exc)
                    raise
        assert scope.cancelled_caught

    called = wrap(model, tagging("m", log))
    await run(lambda: called.call(REQUEST))
    streamed = wrap_stream(model, stream_tagging("s", log))
    await run(lambda: collect(streamed.stream(REQUEST)))
    assert [type(e) for e in caught] == [anyio.get_cancelled_exc_class()] * 2
    assert log == ["m>", "s>", "s:chunk 0 "]
    assert model.streams[0].closed and model.streams[0].outcome == "cancelled"
    assert running_tasks() == before


# -- the docs' middleware examples (docs/streaming.md) -------------------------------------


def logging_middleware(log: list[str]) -> CallMiddleware:
    def middleware(next: Model) -> Model:
        async def call(request: Request) -> Response:
            log.append(f"-> {len(request.messages)} messages")
            response = await next.call(request)
            log.append(f"<- {response.usage.total_tokens} tokens")
            return response

        return ModelFunc(call)

    return middleware


def retry(attempts: int) -> CallMiddleware:
    def middleware(next: Model) -> Model:
        async def call(request: Request) -> Response:
            for attempt in range(1, attempts + 1):
                try:
                    return await next.call(request)
                except ProviderServerError:
                    if attempt == attempts:
                        raise
            raise AssertionError("unreachable")

        return ModelFunc(call)

    return middleware


def retry_stream(attempts: int) -> StreamMiddleware:
    """Retry a stream that fails before its first chunk; never replay a started one."""

    def middleware(next: Streamer) -> Streamer:
        async def stream(request: Request) -> AsyncIterator[Response]:
            for attempt in range(1, attempts + 1):
                started = False
                try:
                    async with contextlib.aclosing(next.stream(request)) as chunks:  # type: ignore[type-var]
                        async for chunk in chunks:
                            started = True
                            yield chunk
                    return
                except ProviderServerError:
                    if started or attempt == attempts:
                        raise

        return StreamerFunc(stream)

    return middleware


@pytest.mark.anyio
async def test_readme_retry_and_logging_middlewares() -> None:
    log: list[str] = []
    scripted = ScriptedModel(ProviderServerError("503"), ANSWER)
    model = wrap(scripted, logging_middleware(log), retry(3))
    assert await model.call(REQUEST) == ANSWER
    assert scripted.requests == [REQUEST, REQUEST]
    assert log == ["-> 1 messages", "<- 0 tokens"]

    failing = wrap(ScriptedModel(*[ProviderServerError("503")] * 3), retry(3))
    with pytest.raises(ProviderServerError):
        await failing.call(REQUEST)


@pytest.mark.anyio
async def test_readme_stream_retry_replays_only_unstarted_streams() -> None:
    scripted = ScriptedModel(Fail(ProviderServerError("503")), ANSWER)
    streamer = wrap_stream(scripted, retry_stream(3))
    assert await collect(streamer.stream(REQUEST)) == ANSWER
    assert [s.outcome for s in scripted.streams] == ["failed", "completed"]

    scripted = ScriptedModel(Fail(ProviderServerError("503"), after=1), ANSWER)
    with pytest.raises(ProviderServerError):
        await collect(wrap_stream(scripted, retry_stream(3)).stream(REQUEST))
    assert scripted.remaining == 1
