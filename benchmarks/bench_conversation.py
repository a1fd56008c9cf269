"""``Conversation`` against the hand-written turn loop it replaces (issue 24).

The same turns, side by side in one run: a user message, a tool call (``get_weather``
with ``{"city": "Lisbon"}``), its result, the final answer; ``ScriptedModel`` as the model,
the in-memory store, a fresh conversation per turn (so every turn does the same work),
best of 7 in three interleaved passes, cyclic GC off while timing (as ``timeit`` does).

- ``README loop, stream``: the handler of the README before issue 24, verbatim but for
  the printing (the Middleware per turn, a ``ResponseAccumulator`` per step,
  ``aclosing``, ``CommitError`` handling, the tool output built inline).
- ``README loop, call``: the same loop over ``Middleware.call`` (no stream).
- ``Conversation.ask``: what a service writes now (it uses the model's ``call``); the tool
  is a ``@tool`` function, so the arguments are decoded and validated too, which the
  hand-written loop never does.
- ``Conversation.stream``: drained, against the streaming loop.

Target: ``ask`` at most 1.2x the README loop.

Run: ``python benchmarks/bench_conversation.py``
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from scope import chat
from scope.conversation import Conversation
from scope.errors import CommitError
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import tool

WEATHER = chat.ToolDefinition("get_weather", {"type": "object", "properties": {"city": {}}})
CALL = chat.tool_call_part("call_1", "get_weather", '{"city": "Lisbon"}')
TURNS = (
    chat.Response(chat.Output(chat.assistant_message(CALL), chat.FinishReason.TOOL_CALLS)),
    chat.Response(chat.Output(chat.assistant_message("21 °C, sunny."), chat.FinishReason.STOP)),
)


@tool
async def get_weather(city: str) -> str:
    """The current weather in a city."""
    return "21 °C"


async def readme_stream(store: Any, model: Any, conversation_id: str, text: str) -> str:
    streamer = Middleware(store, store, conversation_id).stream(model)
    turn = [chat.user_message(text)]
    while True:
        accumulator = chat.ResponseAccumulator()
        request = chat.Request(turn, tools=[WEATHER])
        try:
            async with contextlib.aclosing(streamer.stream(request)) as chunks:
                async for chunk in chunks:
                    accumulator.add(chunk)
            response = accumulator.response()
        except CommitError as err:
            if not err.retryable:
                raise
            await store.append(err.batch)
            response = err.response
        assert response is not None
        if not response.tool_calls:
            return response.text
        output = chat.ToolOutput.of_text("21 °C")
        results = [chat.ToolResult(call.id, call.name, output) for call in response.tool_calls]
        assert response.message is not None
        turn = [*turn, response.message, chat.tool_message(*results)]


async def readme_call(store: Any, model: Any, conversation_id: str, text: str) -> str:
    bound = Middleware(store, store, conversation_id).call(model)
    turn = [chat.user_message(text)]
    while True:
        request = chat.Request(turn, tools=[WEATHER])
        try:
            response = await bound.call(request)
        except CommitError as err:
            if not err.retryable:
                raise
            await store.append(err.batch)
            response = err.response
        if not response.tool_calls:
            return response.text
        output = chat.ToolOutput.of_text("21 °C")
        results = [chat.ToolResult(call.id, call.name, output) for call in response.tool_calls]
        assert response.message is not None
        turn = [*turn, response.message, chat.tool_message(*results)]


async def conversation_ask(store: Any, model: Any, conversation_id: str, text: str) -> str:
    conversation = Conversation(model, store, conversation_id, tools=[get_weather])
    return (await conversation.ask(text)).output


async def conversation_stream(store: Any, model: Any, conversation_id: str, text: str) -> str:
    conversation = Conversation(model, store, conversation_id, tools=[get_weather])
    async with contextlib.aclosing(conversation.stream(text)) as events:
        async for event in events:
            if event.result is not None:
                return str(event.result.output)
    raise AssertionError("no result")


Handler = Callable[[Any, Any, str, str], Awaitable[str]]


async def best_of(handler: Handler, repeats: int, inner: int) -> float:
    """Best mean seconds per turn."""
    best = float("inf")
    for _ in range(repeats):
        store = InMemoryStore()
        models = [ScriptedModel(*TURNS) for _ in range(inner)]
        elapsed = 0.0
        gc.collect()
        gc.disable()
        try:
            for index, model in enumerate(models):
                start = time.perf_counter()
                answer = await handler(store, model, f"c{index}", "Weather in Lisbon?")
                elapsed += time.perf_counter() - start
                assert answer == "21 °C, sunny."
        finally:
            gc.enable()
        best = min(best, elapsed / inner)
    return best


async def main() -> None:
    cases: dict[str, Handler] = {
        "README loop, stream": readme_stream,
        "README loop, call": readme_call,
        "Conversation.ask": conversation_ask,
        "Conversation.stream": conversation_stream,
    }
    times = dict.fromkeys(cases, float("inf"))
    for _ in range(3):  # interleaved, so a slow phase hits every case
        for name, handler in cases.items():
            times[name] = min(times[name], await best_of(handler, 7, 200))
    base_stream, base_call = times["README loop, stream"], times["README loop, call"]
    print(f"{'one tool-call turn (2 model calls), in memory':48} {'per turn':>10}")
    for name, seconds in times.items():
        print(f"{name:48} {seconds * 1e6:8.1f}us")
    ask = times["Conversation.ask"]
    print(f"Conversation.ask / README loop (stream)    {ask / base_stream:5.2f}x")
    print(f"Conversation.ask / README loop (call)      {ask / base_call:5.2f}x")
    print(
        f"Conversation.stream / README loop (stream) "
        f"{times['Conversation.stream'] / base_stream:5.2f}x"
    )


if __name__ == "__main__":
    anyio.run(main)
