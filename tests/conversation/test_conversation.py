"""scope.conversation: the turn loop (DESIGN §6f) over ScriptedModel and real stores'
in-memory reference: what is stored, tool errors the model corrects, max_steps, append
retries that never call the model again, cancellation, streamed events, structured
answers, the history Middleware's options, tracing. Every test runs under asyncio and
trio.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import attrs
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scope import otel
from scope.chat import (
    FinishReason,
    Message,
    ModelFunc,
    Options,
    Output,
    OutputFormatType,
    Request,
    Response,
    Role,
    StreamerFunc,
    assistant_message,
    tool_call_part,
    user_message,
)
from scope.conversation import Conversation, TurnEvent, TurnEventKind, TurnResult
from scope.errors import (
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidRequestError,
    InvalidResponseError,
    MaxStepsError,
    ScopeError,
    StoreError,
    TurnInProgressError,
)
from scope.history import Batch, IncompleteReason, IncompleteTurn, Receipt
from scope.history.inmemory import InMemoryStore
from scope.testing import Hang, ScriptedModel
from scope.tools import tool

pytestmark = pytest.mark.anyio


def calls(*parts: tuple[str, str, str]) -> Response:
    """An answer asking for tools: ``(id, name, arguments)`` each."""
    message = assistant_message(*(tool_call_part(i, n, a) for i, n, a in parts))
    return Response(Output(message, FinishReason.TOOL_CALLS))


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


@tool
async def get_weather(city: str) -> str:
    """The weather in a city.

    :param city: the city's name
    """
    return f"21 °C in {city}"


class CountingStore(InMemoryStore):
    """The in-memory store, counting appends and failing the first ``fail`` of them."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.appends = 0
        self.fail = fail

    async def append(self, batch: Batch) -> Receipt:
        self.appends += 1
        if self.fail:
            self.fail -= 1
            raise StoreError("the store is down")
        return await super().append(batch)


def roles(messages: list[Message]) -> list[Role]:
    return [message.role for message in messages]


# ------------------------------------------------------------------ the loop


async def test_a_tool_call_turn_is_stored_once_as_one_batch() -> None:
    store = CountingStore()
    model = ScriptedModel(calls(("c1", "get_weather", '{"city": "Lisbon"}')), answer("Sunny."))
    conversation = Conversation(model, store, "conv", tools=[get_weather])
    result = await conversation.ask("Weather in Lisbon?")
    assert result.output == "Sunny."
    assert result.steps == 2
    stored = await store.read("conv")
    assert roles(stored) == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert stored[2].tool_results[0].output.text() == "21 °C in Lisbon"
    assert store.appends == 1
    assert list(result.messages) == stored
    # Each request carried the tool and only the open turn (the Middleware replays).
    assert [t.name for t in model.requests[0].tools] == ["get_weather"]
    assert roles(list(model.requests[1].messages)) == [Role.USER, Role.ASSISTANT, Role.TOOL]


async def test_invalid_arguments_reach_the_model_and_the_corrected_call_succeeds() -> None:
    store = InMemoryStore()
    model = ScriptedModel(
        calls(("c1", "get_weather", '{"town": "Lisbon"}')),
        calls(("c2", "get_weather", '{"city": "Lisbon"}')),
        answer("Sunny."),
    )
    conversation = Conversation(model, store, "conv", tools=[get_weather])
    result = await conversation.ask("Weather?")
    assert result.steps == 3
    error = model.requests[1].messages[-1].tool_results[0]
    assert error.is_error
    assert "$.city: required field missing" in (error.output.text() or "")
    assert "unknown field(s) ['town']" in (error.output.text() or "")
    fixed = model.requests[2].messages[-1].tool_results[0]
    assert not fixed.is_error and fixed.output.text() == "21 °C in Lisbon"
    assert len(await store.read("conv")) == 6


async def test_an_unknown_tool_is_an_error_result() -> None:
    model = ScriptedModel(calls(("c1", "nope", "{}")), answer("Sorry."))
    result = await Conversation(model, InMemoryStore(), "c", tools=[get_weather]).ask("x")
    error = model.requests[1].messages[-1].tool_results[0]
    assert error.is_error
    assert error.output.text() == "there is no tool named 'nope' (the tools: get_weather)"
    assert result.output == "Sorry."


async def test_tools_of_one_response_run_concurrently_results_in_call_order() -> None:
    first_started = anyio.Event()
    second_done = anyio.Event()

    @tool
    async def first() -> str:
        first_started.set()
        await second_done.wait()  # only finishes if `second` runs meanwhile
        return "first"

    @tool
    async def second() -> str:
        await first_started.wait()
        second_done.set()
        return "second"

    model = ScriptedModel(calls(("a", "first", ""), ("b", "second", "")), answer("done"))
    conversation = Conversation(model, InMemoryStore(), "c", tools=[first, second])
    with anyio.fail_after(5):
        await conversation.ask("go")
    results = model.requests[1].messages[-1].tool_results
    assert [(r.id, r.output.text()) for r in results] == [("a", "first"), ("b", "second")]


async def test_max_steps_ends_the_turn_after_exactly_that_many_model_calls() -> None:
    store = InMemoryStore()
    model = ScriptedModel(*(calls((f"c{i}", "get_weather", '{"city": "x"}')) for i in range(5)))
    conversation = Conversation(model, store, "c", tools=[get_weather], max_steps=3)
    with pytest.raises(MaxStepsError, match=r"after 3 model calls \(max_steps\)") as caught:
        await conversation.ask("loop")
    assert isinstance(caught.value, ScopeError)
    assert len(model.requests) == 3
    assert await store.read("c") == []


async def test_a_store_that_fails_once_is_retried_without_a_second_model_call() -> None:
    store = CountingStore(fail=1)
    model = ScriptedModel(calls(("c1", "get_weather", '{"city": "x"}')), answer("ok"))
    result = await Conversation(model, store, "c", tools=[get_weather]).ask("hi")
    assert result.output == "ok"
    assert len(model.requests) == 2  # one per step: the failed write called nothing again
    assert store.appends == 2
    assert roles(await store.read("c")) == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]


async def test_retries_are_bounded_and_end_in_a_retryable_commit_error() -> None:
    store = CountingStore(fail=10)
    model = ScriptedModel(answer("ok"))
    conversation = Conversation(model, store, "c", append_retries=2)
    with pytest.raises(CommitError, match=r"not stored after 2 more append\(s\)") as caught:
        await conversation.ask("hi")
    assert caught.value.retryable
    assert isinstance(caught.value.__cause__, StoreError)
    assert store.appends == 3 and len(model.requests) == 1
    store.fail = 0
    await store.append(caught.value.batch)  # the host can still land it, once
    assert [m.text for m in await store.read("c")] == ["hi", "ok"]


async def test_a_retry_that_can_never_land_ends_in_a_final_commit_error() -> None:
    class ClearedMeanwhile(CountingStore):
        async def append(self, batch: Batch) -> Receipt:
            if self.appends == 0:
                await self.clear(batch.conversation_id)  # the host cleared it meanwhile
            return await super().append(batch)

    store = ClearedMeanwhile(fail=1)
    conversation = Conversation(ScriptedModel(answer("ok")), store, "c")
    with pytest.raises(CommitError, match="failed for good") as caught:
        await conversation.ask("hi")
    assert not caught.value.retryable
    assert isinstance(caught.value.__cause__, ConversationClosedError)
    assert store.appends == 2  # the failed commit and one retry, no more


async def test_without_retries_the_middlewares_commit_error_is_raised() -> None:
    store = CountingStore(fail=1)
    conversation = Conversation(ScriptedModel(answer("ok")), store, "c", append_retries=0)
    with pytest.raises(CommitError) as caught:
        await conversation.ask("hi")
    assert caught.value.retryable and store.appends == 1


async def test_a_turn_lost_to_another_is_not_retried() -> None:
    store = CountingStore()

    async def interloper(request: Request) -> Response:
        await store.append(Batch("c", "other", [user_message("elsewhere"), assistant_message("x")]))
        return answer("late")

    conversation = Conversation(ModelFunc(interloper), store, "c")
    with pytest.raises(CommitError) as caught:
        await conversation.ask("hi")
    assert not caught.value.retryable
    assert isinstance(caught.value.__cause__, HistoryChangedError)
    assert store.appends == 2  # the interloper's and the fenced commit: no retry


async def test_cancellation_propagates_and_nothing_is_stored() -> None:
    store = InMemoryStore()
    model = ScriptedModel(Hang(after=2, script=answer("never finished")))
    conversation = Conversation(model, store, "c")
    with anyio.move_on_after(0.05) as scope:
        await conversation.ask("hi")
    assert scope.cancelled_caught
    assert await store.read("c") == []
    assert model.streams == []  # ask used call: the model is a Model too


async def test_cancellation_while_tools_run_propagates() -> None:
    store = InMemoryStore()

    @tool
    async def forever() -> str:
        await anyio.sleep_forever()
        return "never"

    model = ScriptedModel(calls(("a", "forever", ""), ("b", "forever", "")))
    conversation = Conversation(model, store, "c", tools=[forever])
    with anyio.move_on_after(0.05) as scope:
        await conversation.ask("hi")
    assert scope.cancelled_caught
    assert await store.read("c") == []


async def test_keep_interrupted_and_on_incomplete_are_passed_to_the_middleware() -> None:
    store = InMemoryStore()
    reports: list[IncompleteTurn] = []
    model = ScriptedModel(Hang(after=2, script=answer("partial answer")))
    streamer = StreamerFunc(model.stream)  # stream only: the partial is kept
    conversation = Conversation(
        streamer, store, "c", keep_interrupted=True, on_incomplete=reports.append
    )
    assert conversation.middleware.keep_interrupted
    with anyio.move_on_after(0.05):
        await conversation.ask("hi")
    stored = await store.read("c")
    assert roles(stored) == [Role.USER, Role.ASSISTANT]
    assert stored[-1].metadata.decode("scope/interrupted") == "cancelled"
    assert [r.reason for r in reports] == [IncompleteReason.CANCELLED]


async def test_on_overlap_reject_refuses_a_second_turn_before_the_model() -> None:
    store = InMemoryStore()
    started = anyio.Event()

    async def slow(request: Request) -> Response:
        started.set()
        await anyio.sleep(0.2)
        return answer("first")

    first = Conversation(ModelFunc(slow), store, "c", on_overlap="reject")
    later = ScriptedModel(answer("second"))
    second = Conversation(later, store, "c", on_overlap="reject")
    assert second.middleware.on_overlap == "reject"
    async with anyio.create_task_group() as group:
        group.start_soon(first.ask, "one")
        await started.wait()
        with pytest.raises(TurnInProgressError):
            await second.ask("two")
    assert later.requests == []
    assert [m.text for m in await store.read("c")] == ["one", "first"]


async def test_system_prompt_and_options_are_sent_not_stored() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer("ok"))
    conversation = Conversation(
        model, store, "c", system="Be brief.", options=Options(model="m-1", temperature=0.5)
    )
    await conversation.ask(user_message("hi"))
    request = model.requests[0]
    assert request.messages[0].role is Role.SYSTEM and request.messages[0].text == "Be brief."
    assert request.options.model == "m-1" and request.options.temperature == 0.5
    assert roles(await store.read("c")) == [Role.USER, Role.ASSISTANT]


# ------------------------------------------------------------------ stream()


async def test_stream_gives_chunks_tool_calls_results_and_done_in_order() -> None:
    store = InMemoryStore()
    model = ScriptedModel(
        calls(("c1", "get_weather", '{"city": "A"}'), ("c2", "get_weather", '{"city": "B"}')),
        answer("Both sunny."),
    )
    conversation = Conversation(model, store, "c", tools=[get_weather])
    events: list[TurnEvent[Any]] = []
    async with contextlib.aclosing(conversation.stream("Weather?")) as stream:
        async for event in stream:
            events.append(event)
    kinds = [event.kind for event in events]
    first_call = kinds.index(TurnEventKind.TOOL_CALL)
    assert set(kinds[:first_call]) == {TurnEventKind.CHUNK}
    assert kinds[first_call : first_call + 4] == [
        TurnEventKind.TOOL_CALL,
        TurnEventKind.TOOL_CALL,
        TurnEventKind.TOOL_RESULT,
        TurnEventKind.TOOL_RESULT,
    ]
    assert set(kinds[first_call + 4 : -1]) == {TurnEventKind.CHUNK}
    assert kinds[-1] == TurnEventKind.DONE
    assert [e.tool_result.id for e in events if e.tool_result] == ["c1", "c2"]
    text = "".join(e.chunk.text for e in events[first_call + 4 : -1] if e.chunk)
    assert text == "Both sunny."
    result = events[-1].result
    assert isinstance(result, TurnResult) and result.output == "Both sunny."
    assert all(log.closed and log.outcome == "completed" for log in model.streams)
    assert len(await store.read("c")) == 4


async def test_stopping_a_stream_early_stores_nothing() -> None:
    store = InMemoryStore()
    model = ScriptedModel(answer("a long answer in many chunks"))
    conversation = Conversation(model, store, "c")
    async with contextlib.aclosing(conversation.stream("hi")) as stream:
        async for event in stream:
            assert event.kind == "chunk"
            break
    assert model.streams[0].outcome == "stopped" and model.streams[0].closed
    assert await store.read("c") == []


async def test_stream_over_a_call_only_model_gives_each_answer_as_one_chunk() -> None:
    scripted = ScriptedModel(answer("whole"))
    conversation = Conversation(ModelFunc(scripted.call), InMemoryStore(), "c")
    events = [event async for event in conversation.stream("hi")]
    assert [e.kind for e in events] == ["chunk", "done"]
    assert events[0].chunk is not None and events[0].chunk.text == "whole"


async def test_ask_over_a_stream_only_model() -> None:
    scripted = ScriptedModel(calls(("c1", "get_weather", '{"city": "x"}')), answer("streamed"))
    conversation = Conversation(
        StreamerFunc(scripted.stream), InMemoryStore(), "c", tools=[get_weather]
    )
    result = await conversation.ask("hi")
    assert result.output == "streamed" and len(scripted.streams) == 2


# ------------------------------------------------------------------ structured answers


@attrs.frozen
class Forecast:
    city: str
    celsius: int


async def test_output_type_sends_its_schema_and_decodes_the_answer() -> None:
    model = ScriptedModel(answer('{"city": "Lisbon", "celsius": 21}'))
    result = await Conversation(model, InMemoryStore(), "c").ask("hi", output=Forecast)
    assert result.output == Forecast("Lisbon", 21)
    output_format = model.requests[0].options.output_format
    assert output_format is not None and output_format.type is OutputFormatType.JSON_SCHEMA
    assert output_format.name == "Forecast"
    assert output_format.schema is not None
    assert output_format.schema.value()["required"] == ["city", "celsius"]


async def test_output_type_works_for_non_class_types() -> None:
    model = ScriptedModel(answer("[1, 2.0]"))
    result = await Conversation(model, InMemoryStore(), "c").ask("hi", output=list[int])
    assert result.output == [1, 2]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"city": "Lisbon"}', "does not decode into Forecast: $.celsius: required field missing"),
        ("Lisbon, 21", "the answer is not JSON"),
    ],
)
async def test_an_answer_that_does_not_decode_raises_after_the_turn_is_stored(
    text: str, problem: str
) -> None:
    # Without output retries (see tests/conversation/test_output_retries.py).
    store = InMemoryStore()
    model = ScriptedModel(answer(text))
    with pytest.raises(InvalidResponseError, match="the turn is stored") as caught:
        await Conversation(model, store, "c").ask("hi", output=Forecast, output_retries=0)
    assert problem in str(caught.value)
    assert [m.text for m in await store.read("c")] == ["hi", text]


async def test_an_output_type_without_a_json_form_is_refused_before_the_model() -> None:
    model = ScriptedModel(answer("x"))
    with pytest.raises(TypeError, match="output: bytes has no JSON Schema form"):
        await Conversation(model, InMemoryStore(), "c").ask("hi", output=bytes)
    assert model.requests == []


# ------------------------------------------------------------------ tracing


async def test_tracing_middleware_sees_every_model_call_with_the_conversation_id() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = otel.tracing(provider, provider_name="scripted")
    model = ScriptedModel(calls(("c1", "get_weather", '{"city": "x"}')), answer("ok"))
    conversation = Conversation(
        model, InMemoryStore(), "conv-9", tools=[get_weather], middlewares=[tracing]
    )
    await conversation.ask("hi")
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    assert all(
        span.attributes and span.attributes["gen_ai.conversation.id"] == "conv-9" for span in spans
    )
    assert [
        span.attributes["gen_ai.response.finish_reasons"] for span in spans if span.attributes
    ] == [
        ("tool_calls",),
        ("stop",),
    ]
    provider.shutdown()


# ------------------------------------------------------------------ construction


def test_constructor_checks_its_arguments() -> None:
    store = InMemoryStore()
    model = ScriptedModel()
    with pytest.raises(TypeError, match=r"model must be a scope\.chat Model"):
        Conversation(object(), store, "c")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools\[0\] must be a scope.tools.Tool"):
        Conversation(model, store, "c", tools=[len])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"tools\[1\]: a second tool named 'get_weather'"):
        Conversation(model, store, "c", tools=[get_weather, get_weather])
    with pytest.raises(ValueError, match="max_steps must be an int >= 1, got 0"):
        Conversation(model, store, "c", max_steps=0)
    with pytest.raises(ValueError, match="append_retries must be an int >= 0, got -1"):
        Conversation(model, store, "c", append_retries=-1)
    with pytest.raises(TypeError, match=r"middlewares\[0\] must have call\(next\) and stream"):
        Conversation(model, store, "c", middlewares=[len])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="system must be a str or None"):
        Conversation(model, store, "c", system=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"options must be a scope\.chat\.Options"):
        Conversation(model, store, "c", options={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"store must be a history store"):
        Conversation(model, object(), "c")  # type: ignore[arg-type]
    conversation = Conversation(model, store, "c", tools=[get_weather], max_steps=2)
    assert conversation.conversation_id == "c"
    assert conversation.tools == (get_weather,)
    assert conversation.max_steps == 2


async def test_ask_checks_the_message() -> None:
    conversation = Conversation(ScriptedModel(answer("x")), InMemoryStore(), "c")
    with pytest.raises(TypeError, match="message must be a user Message or its text, got int"):
        await conversation.ask(1)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="must start with a user message"):
        await conversation.ask(assistant_message("not a user"))
