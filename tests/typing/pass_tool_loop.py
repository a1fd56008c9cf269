"""The README's tool loop and service handlers, typed (mypy --strict: no errors):
``response.message`` and ``response.tool_calls`` need no ``None`` checks.
tests/test_typing.py also runs ``main()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

import anyio

from scope import chat
from scope.errors import CommitError
from scope.history import Middleware, Store
from scope.history.inmemory import InMemoryStore as MemoryStore
from scope.testing import ScriptedModel

WEATHER = chat.ToolDefinition("get_weather", {"type": "object"}, description="Weather.")


def run_tool(call: chat.ToolCall) -> chat.ToolResult:
    return chat.ToolResult(call.id, call.name, chat.ToolOutput.of_text("sunny"))


async def tool_loop(bound: chat.Model, text: str) -> str:
    turn: list[chat.Message] = [chat.user_message(text)]
    while True:
        response = await bound.call(chat.Request(turn, tools=[WEATHER]))
        message = response.message
        if not response.tool_calls:
            break  # final answer: the whole turn is stored
        results = [run_tool(call) for call in response.tool_calls]
        turn = [*turn, message, chat.tool_message(*results)]
    return message.text


async def answer(store: Store, model: chat.Model, conversation_id: str, text: str) -> str:
    history = Middleware(store, store, conversation_id)
    bound = chat.wrap(model, history.call)
    request = chat.Request([chat.system_message("Be brief."), chat.user_message(text)])
    try:
        response = await bound.call(request)
    except CommitError as err:
        if not err.retryable:
            raise
        await store.append(err.batch)
        response = err.response
    return response.text


async def answer_stream(
    store: Store, streamer: chat.Streamer, conversation_id: str, text: str
) -> AsyncGenerator[str, None]:
    history = Middleware(store, store, conversation_id)
    stream = history.stream(streamer).stream(chat.Request([chat.user_message(text)]))
    async with contextlib.aclosing(stream):
        async for chunk in stream:
            yield chunk.text


async def main() -> None:
    call = chat.assistant_message(chat.tool_call_part("c1", "get_weather", '{"city": "Oslo"}'))
    model = ScriptedModel(
        chat.Response(chat.Output(call, chat.FinishReason.TOOL_CALLS)),
        chat.Response(chat.Output(chat.assistant_message("Sunny."), chat.FinishReason.STOP)),
        chat.Response(chat.Output(chat.assistant_message("Hello!"), chat.FinishReason.STOP)),
        chat.Response(chat.Output(chat.assistant_message("Oslo."), chat.FinishReason.STOP)),
    )
    store = MemoryStore()
    bound = chat.wrap(model, Middleware(store, store, "user-1").call)
    assert await tool_loop(bound, "Weather in Oslo?") == "Sunny."
    assert [m.role for m in await store.read("user-1")] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert await answer(store, model, "user-2", "Hi!") == "Hello!"
    pieces = [piece async for piece in answer_stream(store, model, "user-2", "Capital?")]
    assert "".join(pieces) == "Oslo."


if __name__ == "__main__":
    anyio.run(main)
