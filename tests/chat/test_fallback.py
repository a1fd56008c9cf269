"""scope.chat.fallback: which errors move on, streams before the first chunk, the chain."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator

import anyio
import pytest

from scope.chat import (
    DEFAULT_FALLBACK_ERRORS,
    Fallback,
    FinishReason,
    Model,
    ModelFunc,
    Output,
    Request,
    Response,
    Streamer,
    StreamerFunc,
    assistant_message,
    collect,
    fallback,
    tool_call_delta_part,
    user_message,
)
from scope.errors import (
    AuthenticationError,
    BadRequestError,
    InvalidRequestError,
    ProviderConnectionError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from scope.testing import Fail, Hang, ScriptedModel

pytestmark = pytest.mark.anyio

REQUEST = Request([user_message("q")])


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


LISTED = {
    "server": lambda: ProviderServerError("503 overloaded", status_code=503),
    "rate limit": lambda: RateLimitError("429 slow down", status_code=429, retry_after=1.0),
    "connection": lambda: ProviderConnectionError("connection refused"),
    "timeout": lambda: ProviderTimeoutError("read timed out"),
}

NOT_LISTED = {
    "bad request": lambda: BadRequestError("400 bad", status_code=400),
    "authentication": lambda: AuthenticationError("401 no", status_code=401),
    "invalid request": lambda: InvalidRequestError("the model refused the request"),
    "a bug": lambda: RuntimeError("boom"),
}


# ---------------------------------------------------------------- construction


def test_the_default_errors_are_the_retryable_provider_errors() -> None:
    assert (
        ProviderServerError,
        RateLimitError,
        ProviderConnectionError,
        ProviderTimeoutError,
    ) == DEFAULT_FALLBACK_ERRORS
    both = fallback(ScriptedModel())
    assert isinstance(both, Fallback)
    assert isinstance(both, Model) and isinstance(both, Streamer)
    assert both.on == DEFAULT_FALLBACK_ERRORS


def test_needs_at_least_one_model() -> None:
    with pytest.raises(TypeError, match="at least one model"):
        fallback()


def test_a_model_that_is_neither_is_a_type_error_naming_its_index() -> None:
    with pytest.raises(TypeError, match=r"fallback model 1 must be a scope\.chat\.Model"):
        fallback(ScriptedModel(), object())  # type: ignore[arg-type]


def test_mixing_call_only_and_stream_only_models_is_refused() -> None:
    async def call(request: Request) -> Response:
        raise AssertionError("not called")  # pragma: no cover

    async def stream(request: Request) -> AsyncGenerator[Response, None]:
        yield answer("x")  # pragma: no cover

    with pytest.raises(TypeError, match="model 0 is only a Model, model 1 is only a Streamer"):
        fallback(ModelFunc(call), StreamerFunc(stream))


@pytest.mark.parametrize(
    ("on", "message"),
    [
        ([ProviderServerError], "must be a tuple of exception classes, got list"),
        (ProviderServerError, "must be a tuple of exception classes, got type"),
        ((ProviderServerError, "RateLimitError"), r"on\[1\] must be a subclass of Exception"),
        ((BaseException,), r"on\[0\] .*never cause a fallback"),
        ((KeyboardInterrupt,), r"on\[0\] .*never cause a fallback"),
    ],
)
def test_on_is_validated(on: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        fallback(ScriptedModel(), on=on)  # type: ignore[arg-type]


def test_an_empty_on_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at least one exception class, got \\(\\)"):
        fallback(ScriptedModel(), on=())


def test_cancellation_classes_cannot_be_listed() -> None:
    import asyncio

    import trio

    for cancelled in (asyncio.CancelledError, trio.Cancelled):
        with pytest.raises(TypeError, match="never cause a fallback"):
            fallback(ScriptedModel(), on=(cancelled,))  # type: ignore[arg-type]


async def test_a_call_only_fallback_cannot_stream_and_says_which_model() -> None:
    async def call(request: Request) -> Response:
        return answer("x")

    only_calls = fallback(ModelFunc(call), ScriptedModel())
    assert (await only_calls.call(REQUEST)).text == "x"
    with pytest.raises(TypeError, match=r"cannot stream: model 0 \(ModelFunc\) has no stream"):
        await collect(only_calls.stream(REQUEST))


async def test_a_stream_only_fallback_cannot_call() -> None:
    async def stream(request: Request) -> AsyncGenerator[Response, None]:
        yield answer("x")

    only_streams = fallback(ScriptedModel(answer("x")), StreamerFunc(stream))
    with pytest.raises(TypeError, match=r"cannot call: model 1 \(StreamerFunc\) has no call"):
        await only_streams.call(REQUEST)
    assert (await collect(only_streams.stream(REQUEST))).text == "x"


# ---------------------------------------------------------------- call


@pytest.mark.parametrize("kind", sorted(LISTED))
async def test_call_moves_on_after_each_listed_error(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = ScriptedModel(LISTED[kind]()), ScriptedModel(answer("from the second"))
    with caplog.at_level(logging.WARNING, logger="scope.chat"):
        response = await fallback(first, second).call(REQUEST)
    assert response.text == "from the second"
    assert first.requests == [REQUEST] and second.requests == [REQUEST]
    assert "model 0 (ScriptedModel) failed" in caplog.text


@pytest.mark.parametrize("kind", sorted(NOT_LISTED))
async def test_call_does_not_move_on_after_other_errors(kind: str) -> None:
    error = NOT_LISTED[kind]()
    second = ScriptedModel(answer("never"))
    with pytest.raises(type(error)) as info:
        await fallback(ScriptedModel(error), second).call(REQUEST)
    assert info.value is error
    assert not hasattr(error, "fallback_errors")  # nothing was given up on before it
    assert second.requests == []


async def test_an_error_after_a_fallback_carries_the_earlier_errors() -> None:
    server = ProviderServerError("503")
    refused = BadRequestError("400 model_not_found")
    third = ScriptedModel(answer("never"))
    with pytest.raises(BadRequestError) as info:
        await fallback(ScriptedModel(server), ScriptedModel(refused), third).call(REQUEST)
    assert info.value is refused
    assert info.value.fallback_errors == (server,)  # type: ignore[attr-defined]
    assert third.requests == []


async def test_when_every_model_fails_the_last_error_is_raised_with_the_earlier_ones() -> None:
    errors = [
        ProviderServerError("503 first"),
        RateLimitError("429 second"),
        ProviderTimeoutError("timeout third"),
    ]
    models = [ScriptedModel(error) for error in errors]
    with pytest.raises(ProviderTimeoutError) as info:
        await fallback(*models).call(REQUEST)
    last = info.value
    assert last is errors[2]
    assert last.fallback_errors == (errors[0], errors[1])  # type: ignore[attr-defined]
    assert not isinstance(last, BaseExceptionGroup)
    (note,) = last.__notes__
    assert "ProviderServerError: 503 first; RateLimitError: 429 second" in note
    assert all(model.requests == [REQUEST] for model in models)


async def test_one_model_failing_raises_its_error_unchanged() -> None:
    error = ProviderServerError("503")
    with pytest.raises(ProviderServerError) as info:
        await fallback(ScriptedModel(error)).call(REQUEST)
    assert info.value is error and not hasattr(error, "fallback_errors")
    assert not hasattr(error, "__notes__")


async def test_custom_on_replaces_the_default() -> None:
    refused = BadRequestError("404 model_not_found", status_code=404)
    second = ScriptedModel(answer("ok"), ProviderServerError("503"))
    only_bad_requests = fallback(ScriptedModel(refused), second, on=(BadRequestError,))
    assert (await only_bad_requests.call(REQUEST)).text == "ok"
    server = ProviderServerError("503")
    third = ScriptedModel(answer("never"))
    with pytest.raises(ProviderServerError):
        await fallback(ScriptedModel(server), third, on=(BadRequestError,)).call(REQUEST)
    assert third.requests == []


def tampered_request_with_a_delta() -> Request:
    request = Request([user_message("hi")])
    delta = assistant_message(tool_call_delta_part("c1", "f", "{"))
    object.__setattr__(request, "messages", (*request.messages, delta))
    return request


class Recorder:
    """A Model and Streamer that records every request, checked or not."""

    def __init__(self) -> None:
        self.requests: list[object] = []

    async def call(self, request: Request) -> Response:
        self.requests.append(request)
        return answer("x")

    async def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        self.requests.append(request)
        yield answer("x")


@pytest.mark.parametrize("request_", ["hello", tampered_request_with_a_delta()])
async def test_an_invalid_request_is_refused_before_any_model_is_tried(request_: object) -> None:
    first, second = Recorder(), Recorder()
    both = fallback(first, second)
    with pytest.raises(InvalidRequestError):
        await both.call(request_)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        await collect(both.stream(request_))  # type: ignore[arg-type]
    assert first.requests == [] and second.requests == []


async def test_cancellation_of_a_call_never_falls_back() -> None:
    first, second = ScriptedModel(Hang()), ScriptedModel(answer("never"))
    with anyio.move_on_after(0.05) as scope:
        await fallback(first, second).call(REQUEST)
    assert scope.cancelled_caught
    assert second.requests == []


# ---------------------------------------------------------------- stream


@pytest.mark.parametrize("kind", sorted(LISTED))
async def test_stream_moves_on_before_the_first_chunk(kind: str) -> None:
    first = ScriptedModel(LISTED[kind]())
    second = ScriptedModel(answer("from the second"))
    response = await collect(fallback(first, second).stream(REQUEST))
    assert response.text == "from the second"
    assert [log.closed for log in first.streams] == [True]
    assert [log.outcome for log in first.streams] == ["failed"]
    assert [log.outcome for log in second.streams] == ["completed"]


@pytest.mark.parametrize("kind", sorted(NOT_LISTED))
async def test_stream_does_not_move_on_after_other_errors(kind: str) -> None:
    error = NOT_LISTED[kind]()
    second = ScriptedModel(answer("never"))
    with pytest.raises(type(error)) as info:
        await collect(fallback(ScriptedModel(error), second).stream(REQUEST))
    assert info.value is error
    assert second.requests == []


async def test_stream_does_not_fall_back_after_the_first_chunk() -> None:
    error = ProviderServerError("503 mid-stream")
    first = ScriptedModel(Fail(error, after=1, script=answer("hello there")))
    second = ScriptedModel(answer("never"))
    seen: list[str] = []
    stream = fallback(first, second).stream(REQUEST)
    with pytest.raises(ProviderServerError) as info:
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                seen.append(chunk.text)
    assert info.value is error
    assert seen == ["hell"]
    assert second.requests == []
    assert first.streams[0].closed


async def test_a_mid_stream_error_after_a_fallback_carries_the_earlier_errors() -> None:
    server = ProviderServerError("503 at start")
    dropped = ProviderConnectionError("dropped mid-stream")
    first = ScriptedModel(server)
    second = ScriptedModel(Fail(dropped, after=2))
    with pytest.raises(ProviderConnectionError) as info:
        await collect(fallback(first, second).stream(REQUEST))
    assert info.value is dropped
    assert info.value.fallback_errors == (server,)  # type: ignore[attr-defined]


async def test_every_stream_failing_raises_the_last_with_the_earlier_ones() -> None:
    errors = [ProviderConnectionError("refused"), RateLimitError("429")]
    models = [ScriptedModel(error) for error in errors]
    with pytest.raises(RateLimitError) as info:
        await collect(fallback(*models).stream(REQUEST))
    assert info.value is errors[1]
    assert info.value.fallback_errors == (errors[0],)  # type: ignore[attr-defined]
    assert all(log.closed for model in models for log in model.streams)


async def test_stream_is_lazy_and_validates_on_first_iteration() -> None:
    first = ScriptedModel(answer("a"))
    stream = fallback(first).stream("not a request")  # type: ignore[arg-type]
    assert first.requests == []
    with pytest.raises(InvalidRequestError, match="expected a Request"):
        await stream.__anext__()


async def test_an_empty_stream_is_an_answer_not_a_failure() -> None:
    first, second = ScriptedModel([]), ScriptedModel(answer("never"))
    assert await collect(fallback(first, second).stream(REQUEST)) == Response()
    assert second.requests == []


async def test_stream_early_stop_closes_the_inner_stream() -> None:
    first = ScriptedModel(ProviderServerError("503"))
    second = ScriptedModel(answer("a long answer"))
    stream = fallback(first, second).stream(REQUEST)
    async with contextlib.aclosing(stream):
        async for _chunk in stream:
            break
    assert [log.outcome for log in second.streams] == ["stopped"]
    assert second.streams[0].closed


@pytest.mark.parametrize("after", [0, 1])
async def test_stream_cancellation_never_falls_back(after: int) -> None:
    first = ScriptedModel(Hang(after=after))
    second = ScriptedModel(answer("never"))
    with anyio.move_on_after(0.05) as scope:
        await collect(fallback(first, second).stream(REQUEST))
    assert scope.cancelled_caught
    assert [log.outcome for log in first.streams] == ["cancelled"]
    assert first.streams[0].closed
    assert second.requests == []


async def test_stream_chunks_pass_through_unchanged() -> None:
    chunks = [
        Response(Output(assistant_message(tool_call_delta_part("c1", "f", '{"a"')))),
        Response(Output(assistant_message(tool_call_delta_part("c1", "f", ": 1}")))),
        Response(Output(finish_reason=FinishReason.TOOL_CALLS)),
    ]
    first = ScriptedModel(ProviderTimeoutError("slow"))
    second = ScriptedModel(chunks)
    stream = fallback(first, second).stream(REQUEST)
    async with contextlib.aclosing(stream):
        assert [chunk async for chunk in stream] == chunks


def test_repr_names_the_models_and_errors() -> None:
    both = fallback(ScriptedModel(), ScriptedModel(), on=(RateLimitError,))
    assert repr(both) == "Fallback(ScriptedModel, ScriptedModel, on=(RateLimitError))"
    assert len(both.models) == 2
