"""scope.testing.ScriptedModel, on asyncio and trio."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from strategies_stream import complete_responses

from scope.chat import (
    FinishReason,
    Message,
    Output,
    OutputMetadata,
    Part,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    Role,
    ToolResult,
    Usage,
    assistant_message,
    collect,
    reasoning_part,
    system_message,
    text_part,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidRequestError, ProviderServerError
from scope.testing import Fail, Hang, ScriptedModel, ScriptExhaustedError, check_request
from tests.helpers import merged, tool_call_deltas

REQUEST = Request([user_message("hi")])


def answer(*parts: Part | str, finish: FinishReason = FinishReason.STOP) -> Response:
    return Response(Output(assistant_message(*parts), finish))


ANSWER = answer("Hello there")


# -- call --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_call_answers_turns_in_order_and_records_requests() -> None:
    other = Request([system_message("be brief"), user_message("again")])
    chunks = [answer("a", finish=FinishReason.LENGTH), Response(metadata=ResponseMetadata("r"))]
    model = ScriptedModel(ANSWER, chunks)
    assert await model.call(REQUEST) == ANSWER
    assert await model.call(other) == Response(
        Output(assistant_message("a"), FinishReason.LENGTH), ResponseMetadata("r")
    )
    assert model.requests == [REQUEST, other]
    assert model.remaining == 0


@pytest.mark.anyio
async def test_call_raises_scripted_errors() -> None:
    first, second = ProviderServerError("first"), ProviderServerError("second")
    model = ScriptedModel(first, Fail(second, after=2))
    with pytest.raises(ProviderServerError) as info:
        await model.call(REQUEST)
    assert info.value is first
    with pytest.raises(ProviderServerError) as info:
        await model.call(REQUEST)
    assert info.value is second
    assert len(model.requests) == 2


@pytest.mark.anyio
async def test_call_with_an_empty_chunk_list_is_the_empty_response() -> None:
    assert await ScriptedModel([]).call(REQUEST) == Response()


@pytest.mark.anyio
async def test_exhausted_script_raises_a_clear_error() -> None:
    model = ScriptedModel(ANSWER)
    await model.call(REQUEST)
    with pytest.raises(ScriptExhaustedError, match="request 2"):
        await model.call(REQUEST)
    with pytest.raises(ScriptExhaustedError, match="no turn left"):
        await collect(model.stream(REQUEST))


@pytest.mark.anyio
async def test_hang_call_waits_until_cancelled() -> None:
    model = ScriptedModel(Hang())
    with anyio.move_on_after(0.02) as scope:
        await model.call(REQUEST)
    assert scope.cancelled_caught
    assert model.requests == [REQUEST]


@pytest.mark.anyio
async def test_call_is_a_cancellation_point() -> None:
    model = ScriptedModel(ANSWER)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await model.call(REQUEST)
    assert scope.cancelled_caught


# -- request checks -----------------------------------------------------------------------


def tampered_request_with_a_delta() -> Request:
    request = Request([user_message("hi")])
    delta = assistant_message(tool_call_delta_part("c1", "f", "{"))
    object.__setattr__(request, "messages", (*request.messages, delta))
    return request


CALLS = assistant_message(tool_call_part("c1", "f", "{}"), tool_call_part("c2", "g", "{}"))
R1 = ToolResult("c1", "f")
R2 = ToolResult("c2", "g")


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        ("not a request", "must be a Request"),
        (tampered_request_with_a_delta(), "tool_call_delta"),
        (Request([user_message("q"), CALLS]), r"messages\[1\]: tool calls 'c1', 'c2' are not"),
        (Request([user_message("q"), CALLS, tool_message(R1)]), r"tool calls 'c2' are not"),
        (
            Request([user_message("q"), CALLS, tool_message(R1), user_message("?")]),
            "'c2' are not answered",
        ),
    ],
)
@pytest.mark.anyio
async def test_invalid_requests_are_refused_before_anything_happens(
    request_: Request, match: str
) -> None:
    model = ScriptedModel(ANSWER, ANSWER)
    with pytest.raises(InvalidRequestError, match=match):
        await model.call(request_)
    with pytest.raises(InvalidRequestError, match=match):
        await collect(model.stream(request_))
    assert model.requests == [] and model.streams == []
    assert model.remaining == 2


def test_answered_tool_calls_pass_the_request_check() -> None:
    check_request(Request([user_message("q"), CALLS, tool_message(R1), tool_message(R2)]))
    check_request(
        Request([user_message("q"), CALLS, tool_message(R2, R1), assistant_message("done")])
    )


# -- streams -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_is_lazy() -> None:
    model = ScriptedModel(ANSWER)
    stream = model.stream(REQUEST)
    await anyio.lowlevel.checkpoint()
    assert model.requests == [] and model.streams == [] and model.remaining == 1
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        await stream.__anext__()
        assert model.requests == [REQUEST] and model.remaining == 0
        assert model.streams[0].outcome == "running"


@pytest.mark.anyio
async def test_stream_of_a_response_turn_yields_its_chunks() -> None:
    model = ScriptedModel(ANSWER, text_size=3)
    chunks = [c async for c in model.stream(REQUEST)]
    assert chunks == ScriptedModel.chunks(ANSWER, text_size=3)
    assert merged(chunks) == ANSWER
    log = model.streams[0]
    assert (log.sent, log.closed, log.outcome) == (len(chunks), True, "completed")


@pytest.mark.anyio
async def test_stream_of_a_chunk_list_yields_it_as_given() -> None:
    chunks = [answer("a"), Response(), Response(metadata=ResponseMetadata(usage=Usage(1, 2)))]
    model = ScriptedModel(chunks)
    assert [c async for c in model.stream(REQUEST)] == chunks


@pytest.mark.anyio
async def test_stream_early_stop_runs_cleanup_before_aclose_returns() -> None:
    model = ScriptedModel(ANSWER)
    async with contextlib.aclosing(model.stream(REQUEST)) as stream:  # type: ignore[type-var]
        async for _ in stream:
            break
        assert model.streams[0].closed is False
    log = model.streams[0]
    assert (log.sent, log.closed, log.outcome) == (1, True, "stopped")


@pytest.mark.anyio
async def test_an_unclosed_stream_is_visible_in_its_log() -> None:
    model = ScriptedModel(ANSWER)
    stream = model.stream(REQUEST)
    await stream.__anext__()
    assert model.streams[0].closed is False  # what a test of leaky code would catch
    await stream.aclose()  # type: ignore[attr-defined]
    assert model.streams[0].closed is True


@pytest.mark.anyio
async def test_exception_turn_fails_the_first_iteration() -> None:
    error = ProviderServerError("down")
    model = ScriptedModel(error)
    stream = model.stream(REQUEST)
    with pytest.raises(ProviderServerError) as info:
        await stream.__anext__()
    assert info.value is error
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert (model.streams[0].sent, model.streams[0].outcome) == (0, "failed")


@pytest.mark.anyio
async def test_fail_after_k_chunks_raises_once_and_ends_the_stream() -> None:
    error = ProviderServerError("mid-stream")
    model = ScriptedModel(Fail(error, after=2, script=ANSWER))
    stream = model.stream(REQUEST)
    got = [await stream.__anext__(), await stream.__anext__()]
    assert got == ScriptedModel.chunks(ANSWER)[:2]
    with pytest.raises(ProviderServerError) as info:
        await stream.__anext__()
    assert info.value is error
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    log = model.streams[0]
    assert (log.sent, log.closed, log.outcome) == (2, True, "failed")


@pytest.mark.anyio
async def test_fail_without_a_script_sends_placeholder_text() -> None:
    model = ScriptedModel(Fail(ProviderServerError("x"), after=3))
    acc = ResponseAccumulator()
    with pytest.raises(ProviderServerError):
        async for chunk in model.stream(REQUEST):
            acc.add(chunk)
    assert acc.text == "chunk 0 chunk 1 chunk 2 "


@pytest.mark.anyio
async def test_hang_stream_is_cancelled_and_cleaned_up() -> None:
    model = ScriptedModel(Hang(after=1, script=[answer("a"), answer("b")]))
    received: list[str] = []
    with anyio.move_on_after(0.02) as scope:
        async for chunk in model.stream(REQUEST):
            received.append(chunk.text)
    assert scope.cancelled_caught
    assert received == ["a"]
    log = model.streams[0]
    assert (log.sent, log.closed, log.outcome) == (1, True, "cancelled")


@pytest.mark.anyio
async def test_stream_checkpoints_before_every_chunk() -> None:
    model = ScriptedModel(ANSWER)
    received: list[Response] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        async for chunk in model.stream(REQUEST):
            received.append(chunk)
    assert scope.cancelled_caught and received == []
    assert model.streams[0].outcome == "cancelled"


@pytest.mark.anyio
async def test_call_and_stream_share_one_script() -> None:
    model = ScriptedModel(answer("one"), answer("two"))
    assert (await collect(model.stream(REQUEST))).text == "one"
    assert (await model.call(REQUEST)).text == "two"


@pytest.mark.anyio
async def test_scripted_model_as_a_middleware_target() -> None:
    async def shout(request: Request) -> AsyncIterator[Response]:
        async with contextlib.aclosing(model.stream(request)) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk

    model = ScriptedModel(ANSWER)
    assert await collect(shout(REQUEST)) == ANSWER


# -- turns -------------------------------------------------------------------------------


def test_turns_are_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="turn 1 must be"):
        ScriptedModel(ANSWER, "not a turn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="chunk 1 must be a Response"):
        ScriptedModel([ANSWER, "x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="text_size"):
        ScriptedModel(text_size=0)


def test_fail_and_hang_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        Fail(ProviderServerError("x"), after=-1)
    with pytest.raises(ValueError, match="only 1 chunks"):
        Hang(after=2, script=[ANSWER])
    with pytest.raises(TypeError, match="exception instance"):
        Fail("boom")  # type: ignore[arg-type]
    assert Fail(ProviderServerError("x"), after=1, script=[ANSWER, ANSWER]).sent == (ANSWER,)


# -- the chunk splitter ------------------------------------------------------------------


def test_chunks_splits_text_and_puts_usage_last() -> None:
    meta = ResponseMetadata("resp", "model-x", Usage(10, 4), {"e": 1})
    response = Response(
        Output(
            Message(Role.ASSISTANT, [text_part("Hello, world")], {"m": 1}),
            FinishReason.STOP,
            OutputMetadata({"o": 1}),
        ),
        meta,
    )
    chunks = ScriptedModel.chunks(response, text_size=5)
    assert [c.text for c in chunks] == ["Hello", ", wor", "ld", ""]
    assert chunks[0].metadata == ResponseMetadata("resp", "model-x", extra={"e": 1})
    assert all(c.metadata is None for c in chunks[1:-1])
    assert chunks[-1] == Response(
        Output(finish_reason=FinishReason.STOP, metadata=OutputMetadata({"o": 1})),
        ResponseMetadata(usage=Usage(10, 4)),
    )
    assert merged(chunks) == response


def test_chunks_interleave_parallel_tool_call_fragments() -> None:
    response = answer(
        "Let me check.",
        tool_call_part("a", "weather", '{"city":"Oslo"}'),
        tool_call_part("b", "time", '{"tz":"CET"}', {"k": 1}),
        finish=FinishReason.TOOL_CALLS,
    )
    chunks = ScriptedModel.chunks(response, text_size=100, args_size=4)
    deltas = tool_call_deltas(chunks)
    assert [(d.id, d.arguments) for d in deltas[:4]] == [
        ("a", '{"ci'),
        ("b", '{"tz'),
        ("a", 'ty":'),
        ("b", '":"C'),
    ]
    assert "".join(d.arguments for d in deltas if d.id == "a") == '{"city":"Oslo"}'
    assert merged(chunks) == response


def test_chunks_put_a_reasoning_signature_in_its_own_last_piece() -> None:
    response = answer(reasoning_part("abcdef", b"sig"), "x")
    chunks = ScriptedModel.chunks(response, text_size=4)
    parts = [c.output.message.parts[0] for c in chunks[:-1]]  # type: ignore[union-attr]
    assert [(p.kind, p.text, p.signature) for p in parts] == [
        (PartKind.REASONING, "abcd", b""),
        (PartKind.REASONING, "ef", b""),
        (PartKind.REASONING, "", b"sig"),
        (PartKind.TEXT, "x", b""),
    ]
    assert merged(chunks) == response


def test_chunks_of_a_response_without_content_is_one_chunk() -> None:
    for response in (
        Response(),
        Response(Output(finish_reason=FinishReason.STOP), ResponseMetadata("r", usage=Usage(1))),
    ):
        assert ScriptedModel.chunks(response) == [response]


def test_chunks_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="args_size"):
        ScriptedModel.chunks(ANSWER, args_size=0)
    with pytest.raises(TypeError, match="must be a Response"):
        ScriptedModel.chunks("x")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(complete_responses())
def test_chunks_accumulate_back_to_the_response(response: Response) -> None:
    for text_size, args_size in ((1, 1), (4, 3)):
        chunks = ScriptedModel.chunks(response, text_size, args_size)
        assert merged(chunks) == response
