"""A tool loop through the history Middleware, end to end against the loopback
Anthropic server, under asyncio and trio, by ``call`` and by ``stream``: extended
thinking, a tool call, the tool result, the final answer; the stored turn replays the
thinking block (signature byte for byte) in the next request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scope.chat import (
    FinishReason,
    Options,
    Request,
    Response,
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
from scope.history.inmemory import InMemoryStore
from scope.models.anthropic import AnthropicModel
from tests.anthropic_server import AnthropicServer, load_transcript
from tests.helpers import WEATHER

pytestmark = pytest.mark.anyio


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as srv:
        yield srv
    srv.check_requests()


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_tool_loop_through_the_history_middleware(server: AnthropicServer, mode: str) -> None:
    prefix = "" if mode == "call" else "stream_"
    server.script(
        *load_transcript(f"{prefix}thinking_tool_turn"), *load_transcript(f"{prefix}text")
    )
    store = InMemoryStore()
    middleware = Middleware(store, store, "paris")
    model = AnthropicModel("claude-sonnet-4-5", api_key="sk-ant-test", base_url=server.base_url)
    options = Options(reasoning_effort="low")

    async def send(request: Request) -> Response:
        if mode == "call":
            return await wrap(model, middleware.call).call(request)
        return await collect(wrap_stream(model, middleware.stream).stream(request))

    system = system_message("Be brief.")
    turn = [user_message("What's the weather in Paris?")]
    async with model:
        first = await send(Request([system, *turn], tools=[WEATHER], options=options))
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        assert await store.read("paris") == []  # the tool-call pause writes nothing
        (call,) = first.output.message.tool_calls
        result = tool_message(ToolResult(call.id, call.name, ToolOutput.of_text("18C, sunny")))
        final = await send(
            Request([system, *turn, first.output.message, result], tools=[WEATHER], options=options)
        )
        assert final.output is not None and final.output.finish_reason is FinishReason.STOP
        stored = await store.read("paris")
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[1] == first.output.message
        assert stored[3].text == final.text
        # The next turn replays the stored turn: the thinking block goes back unchanged.
        await send(Request([system, user_message("And tomorrow?")], tools=[WEATHER]))
    bodies = server.bodies()
    thinking = bodies[1]["messages"][1]["content"][0]
    assert thinking["type"] == "thinking" and thinking["signature"]
    assert bodies[2]["messages"][1]["content"][0] == thinking
    assert bodies[2]["system"] == [{"type": "text", "text": "Be brief."}]
    assert [m["role"] for m in bodies[2]["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
