"""A full history-Middleware turn with a tool call, end to end against the loopback
OpenAI-compatible server, under asyncio and trio (call and stream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scope.chat import (
    FinishReason,
    Request,
    ToolOutput,
    ToolResult,
    collect,
    system_message,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.history import Middleware
from scope.historystores.sqlite import SQLiteStore
from scope.models.openai import OpenAIChatModel
from tests.helpers import TIME, WEATHER
from tests.openai_server import OpenAIServer, load_transcript

pytestmark = pytest.mark.anyio


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv
    srv.check_requests()


async def test_history_turn_with_tool_call_via_call(server: OpenAIServer, tmp_path: Path) -> None:
    server.script(*load_transcript("tool_turn"))
    model = OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url=server.base_url)
    async with model, await SQLiteStore.open(tmp_path / "h.db") as store:
        bound = wrap(model, Middleware(store, store, "paris").call)
        turn = [user_message("What's the weather in Paris?")]
        request = Request([system_message("Be brief."), *turn], tools=[WEATHER, TIME])
        first = await bound.call(request)
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        assert await store.read("paris") == []  # the tool-call pause writes nothing
        (call,) = first.output.message.tool_calls
        result = tool_message(ToolResult(call.id, call.name, ToolOutput.of_text("18C, sunny")))
        final = await bound.call(
            Request(
                [system_message("Be brief."), *turn, first.output.message, result],
                tools=[WEATHER, TIME],
            )
        )
        stored = await store.read("paris")
    assert final.text == "It is 18°C and sunny in Paris."
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1] == first.output.message
    assert stored[3].text == final.text
    second_body = server.bodies()[1]
    assert [m["role"] for m in second_body["messages"]] == ["system", "user", "assistant", "tool"]


async def test_history_turn_with_parallel_tool_calls_via_stream(
    server: OpenAIServer, tmp_path: Path
) -> None:
    server.script(
        *load_transcript("stream_parallel_tools"), *load_transcript("stream_final_answer")
    )
    model = OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url=server.base_url)
    async with model, await SQLiteStore.open(tmp_path / "h.db") as store:
        bound = wrap_stream(model, Middleware(store, store, "paris").stream)
        turn = [user_message("What's the weather in Paris?")]
        first = await collect(bound.stream(Request(turn, tools=[WEATHER, TIME])))
        assert first.output is not None and first.output.message is not None
        results = [
            ToolResult(call.id, call.name, ToolOutput.of_text(text))
            for call, text in zip(first.output.message.tool_calls, ["18C", "14:05"], strict=True)
        ]
        follow_up = Request(
            [*turn, first.output.message, tool_message(*results)], tools=[WEATHER, TIME]
        )
        final = await collect(bound.stream(follow_up))
        stored = await store.read("paris")
    assert final.text == "It is 18°C in Paris and 14:05 there."
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert len(stored[1].tool_calls) == 2
