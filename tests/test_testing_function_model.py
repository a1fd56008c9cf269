"""``scope.testing.FunctionModel`` (answers computed from the request, sync or async,
streamed with a delay, shared by many tasks) and ``offline_summarizer``. asyncio and
trio."""

from __future__ import annotations

import math
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
    ToolOutput,
    ToolResult,
    assistant_message,
    collect,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidRequestError, ProviderServerError
from scope.history import Batch, WindowReader, compact
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel, ScriptedModel, offline_summarizer

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
