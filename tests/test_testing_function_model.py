"""``scope.testing.FunctionModel`` (answers computed from the request, sync or async,
streamed with a delay, shared by many tasks) and ``offline_summarizer``. asyncio and
trio."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Request,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    collect,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidRequestError, ProviderServerError
from scope.history import Batch, WindowReader, compact
from scope.history.inmemory import InMemoryStore
from scope.testing import Fail, FunctionModel, ScriptedModel, offline_summarizer

pytestmark = pytest.mark.anyio


def echo(request: Request) -> str:
    return f"you said {request.messages[-1].text}"


async def test_a_str_answer_is_a_final_assistant_message() -> None:
    response = await FunctionModel(echo).call(Request([user_message("hi")]))
    assert response == Response(Output(assistant_message("you said hi"), FinishReason.STOP))


async def test_an_async_function_may_await_and_return_a_response() -> None:
    call = tool_call_part("t1", "lookup", '{"q": "x"}')
    wanted = Response(Output(assistant_message("Looking.", call), FinishReason.TOOL_CALLS))

    async def answer(request: Request) -> Response:
        await anyio.lowlevel.checkpoint()
        return wanted

    model = FunctionModel(answer)
    assert await model.call(Request([user_message("q")])) == wanted
    assert await collect(model.stream(Request([user_message("q")]))) == wanted


async def test_a_stream_is_the_answer_in_pieces_delay_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    real_sleep = anyio.sleep

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(anyio, "sleep", sleep)
    model = FunctionModel(echo, chunk_delay=0.25, text_size=3)
    chunks = [chunk async for chunk in model.stream(Request([user_message("hello")]))]
    assert [c.text for c in chunks] == ["you", " sa", "id ", "hel", "lo", ""]
    assert slept == [0.25] * (len(chunks) - 1)  # between chunks, not before the first
    accumulator = ResponseAccumulator()
    for chunk in chunks:
        accumulator.add(chunk)
    assert accumulator.response() == await model.call(Request([user_message("hello")]))
    assert model.chunk_delay == 0.25


async def test_without_a_delay_the_stream_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sleep(delay: float) -> Any:
        raise AssertionError("slept")

    monkeypatch.setattr(anyio, "sleep", no_sleep)
    assert (await collect(FunctionModel(echo).stream(Request([user_message("a")])))).text


async def test_the_stream_is_lazy_and_errors_come_from_its_first_iteration() -> None:
    calls: list[Request] = []

    def fail(request: Request) -> str:
        calls.append(request)
        raise ProviderServerError("down")

    model = FunctionModel(fail)
    stream = model.stream(Request([user_message("a")]))
    assert calls == []
    with pytest.raises(ProviderServerError):
        await anext(stream)
    with pytest.raises(ProviderServerError):
        await model.call(Request([user_message("a")]))
    assert len(calls) == 2


async def test_an_invalid_request_is_refused_before_the_function() -> None:
    called: list[Request] = []
    model = FunctionModel(lambda request: str(called.append(request)))
    unanswered = Request(
        [user_message("q"), assistant_message(tool_call_part("t", "f", "{}")), user_message("x")]
    )
    with pytest.raises(InvalidRequestError, match="not answered"):
        await model.call(unanswered)
    with pytest.raises(InvalidRequestError):
        await anext(model.stream(unanswered))
    with pytest.raises(InvalidRequestError, match="must be a Request"):
        await model.call("hi")  # type: ignore[arg-type]
    assert called == []
    answered = Request(
        [
            user_message("q"),
            assistant_message(tool_call_part("t", "f", "{}")),
            tool_message(ToolResult("t", "f", ToolOutput.of_text("ok"))),
        ]
    )
    assert (await model.call(answered)).text == "None"


@pytest.mark.parametrize("bad", [5, None, b"bytes", [assistant_message("x")]])
async def test_a_function_returning_anything_else_is_a_type_error(bad: Any) -> None:
    model = FunctionModel(lambda request: bad)
    with pytest.raises(TypeError, match="must return a Response or a str, got"):
        await model.call(Request([user_message("q")]))
    with pytest.raises(TypeError, match="must return a Response or a str"):
        await collect(model.stream(Request([user_message("q")])))


async def test_many_tasks_share_one_model_and_each_gets_its_own_answer() -> None:
    model = FunctionModel(echo, chunk_delay=0.001, text_size=2)
    got: dict[int, str] = {}

    async def ask(n: int) -> None:
        if n % 2:
            got[n] = (await collect(model.stream(Request([user_message(f"question {n}")])))).text
        else:
            got[n] = (await model.call(Request([user_message(f"question {n}")]))).text

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for n in range(40):
                group.start_soon(ask, n)
    assert got == {n: f"you said question {n}" for n in range(40)}


async def test_cancellation_propagates_from_a_stream() -> None:
    model = FunctionModel(echo, chunk_delay=10)
    received: list[Response] = []
    with anyio.move_on_after(0.05) as scope:
        async for chunk in model.stream(Request([user_message("a long one")])):
            received.append(chunk)
    assert scope.cancelled_caught and len(received) == 1


#: A big answer: split in 4-character pieces it is over a million chunks.
BIG = 5_000_000
#: What a stream may allocate before its first chunk, the answer's size aside.
FIRST_CHUNK_BUDGET = 64 * 2**20


async def first_chunk_peak(stream: AsyncGenerator[Response, None]) -> tuple[Response, int]:
    """The stream's first chunk and the peak of traced allocations until it came
    (memory, not time: deterministic on a busy machine)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        first = await stream.__anext__()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await stream.aclose()
    return first, peak


async def test_a_5_mb_answer_streams_its_first_chunk_in_bounded_memory() -> None:
    text = "x" * BIG
    first, peak = await first_chunk_peak(
        FunctionModel(lambda request: text).stream(Request([user_message("long")]))
    )
    assert first.output is not None and first.output.message is not None
    assert first.output.message.text == "xxxx"
    assert peak < FIRST_CHUNK_BUDGET, f"{peak / 2**20:.0f} MiB before the first chunk"


async def test_a_scripted_5_mb_answer_streams_its_first_chunk_in_bounded_memory() -> None:
    # Text and two parallel tool calls whose arguments are big: every part is split lazily.
    calls = [tool_call_part(f"t{n}", "save", '"' + "y" * BIG + '"') for n in (1, 2)]
    answer = Response(Output(assistant_message("x" * BIG, *calls), FinishReason.TOOL_CALLS))
    model = ScriptedModel(answer, answer)
    first, peak = await first_chunk_peak(model.stream(Request([user_message("long")])))
    assert first.output is not None and first.output.message is not None
    assert first.output.message.text == "xxxx"
    assert peak < FIRST_CHUNK_BUDGET, f"{peak / 2**20:.0f} MiB before the first chunk"
    # A Fail or Hang scripted with it splits only the chunks it sends.
    tracemalloc.start()
    try:
        fail = Fail(ProviderServerError("boom"), after=3, script=answer)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [
        chunk.output.message.text for chunk in fail.sent if chunk.output and chunk.output.message
    ] == ["xxxx"] * 3
    assert peak < FIRST_CHUNK_BUDGET


def small_answer() -> Response:
    calls = [tool_call_part("t1", "a", '{"k": 12345}'), tool_call_part("t2", "b", "")]
    return Response(
        Output(assistant_message("Checking both.", *calls), FinishReason.TOOL_CALLS),
        ResponseMetadata("r1", "m", usage=Usage(input_tokens=3, output_tokens=5)),
    )


@pytest.mark.parametrize(("text_size", "args_size"), [(1, 1), (4, 3), (100, 100)])
async def test_streams_send_exactly_the_chunks_of_scripted_model_chunks(
    text_size: int, args_size: int
) -> None:
    response = small_answer()
    wanted = ScriptedModel.chunks(response, text_size, args_size)
    request = Request([user_message("q")])
    function_model = FunctionModel(
        lambda request: response, text_size=text_size, args_size=args_size
    )
    scripted = ScriptedModel(response, text_size=text_size, args_size=args_size)
    assert [chunk async for chunk in function_model.stream(request)] == wanted
    assert [chunk async for chunk in scripted.stream(request)] == wanted


@pytest.mark.parametrize(
    ("kwargs", "error", "problem"),
    [
        ({"fn": "echo"}, TypeError, "fn must be callable"),
        ({"chunk_delay": -0.1}, ValueError, "chunk_delay must be a finite number >= 0"),
        ({"chunk_delay": math.inf}, ValueError, "chunk_delay must be a finite"),
        ({"chunk_delay": math.nan}, ValueError, "chunk_delay must be a finite"),
        ({"chunk_delay": "0.1"}, TypeError, "chunk_delay must be a number of seconds, got str"),
        ({"chunk_delay": True}, TypeError, "got bool"),
        ({"text_size": 0}, ValueError, "text_size must be a positive integer"),
        ({"args_size": 1.5}, ValueError, "args_size must be a positive integer"),
    ],
)
def test_construction_checks_its_arguments(
    kwargs: dict[str, Any], error: type[Exception], problem: str
) -> None:
    arguments: dict[str, Any] = {"fn": echo, **kwargs}
    fn = arguments.pop("fn")
    with pytest.raises(error, match=problem):
        FunctionModel(fn, **arguments)


def test_function_model_and_scripted_model_are_both_models() -> None:
    from scope.chat import Model, Streamer

    for model in (FunctionModel(echo), ScriptedModel()):
        assert isinstance(model, Model) and isinstance(model, Streamer)


# ------------------------------------------------------------------ offline summarizer


async def test_offline_summarizer_compacts_without_a_network() -> None:
    store = InMemoryStore()
    for i in range(4):
        await store.append(
            Batch("c", f"t{i}", [user_message(f"question {i}\nmore"), assistant_message(f"a{i}")])
        )
    receipt = await compact(store, "c", offline_summarizer, keep_turns=1)
    assert receipt is not None
    summary = (await WindowReader(store).read("c"))[0].text
    assert summary.startswith("Earlier in this conversation (an extractive summary, made offline)")
    assert "- user: question 0" in summary and "- assistant: a2" in summary
    assert "more" not in summary and "question 3" not in summary  # first lines, covered only


async def test_offline_summarizer_keeps_the_newest_lines_short() -> None:
    transcript = "\n\n".join(f"user:\nline {i} " + "x" * 300 for i in range(50))
    request = Request([user_message(transcript)])
    text = (await offline_summarizer.call(request)).text
    lines = text.splitlines()
    assert lines[0].endswith("10 older lines left out):")
    assert len(lines) == 41 and lines[1].startswith("- user: line 10 ")
    assert max(len(line) for line in lines[1:]) == len("- user: ") + 160
