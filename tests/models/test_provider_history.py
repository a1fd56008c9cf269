"""A tool loop through the history Middleware, end to end against each provider's
loopback server (tests.helpers.PROVIDERS), under asyncio and trio, by ``call`` and by
``stream``: a tool call (two in parallel for OpenAI's stream; with extended thinking
for Anthropic; thought summaries and signatures for Gemini; with reasoning for the
Responses API), the tool results, the final answer; the next turn replays the stored turn
(for Anthropic the thinking block, for Gemini the thought signatures, for the Responses
API the reasoning items' encrypted content, byte for byte)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from scope.chat import (
    FinishReason,
    Options,
    Request,
    Response,
    ToolDefinition,
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
from tests.helpers import ANTHROPIC, GEMINI, OPENAI, RESPONSES, TIME, WEATHER, Provider
from tests.openai_server import OpenAIServer

pytestmark = pytest.mark.anyio


@attrs.frozen
class Turn:
    """One provider's tool loop in one mode: the transcripts of the tool call and the
    final answer, the transcript answering the replaying turn, the tool outputs (one a
    call), the final text."""

    transcripts: list[str]
    replay: str
    outputs: list[str]
    final: str


def _check_openai(bodies: list[Any], calls: int) -> None:
    tools = ["tool"] * calls
    assert [m["role"] for m in bodies[1]["messages"]] == ["system", "user", "assistant", *tools]
    assert [m["role"] for m in bodies[2]["messages"]] == [
        "system",
        "user",
        "assistant",
        *tools,
        "assistant",
        "user",
    ]


def _check_anthropic(bodies: list[Any], calls: int) -> None:
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


def _check_gemini(bodies: list[Any], calls: int) -> None:
    # The model turn goes back as received: signed calls, no made-up ids; the trailing
    # signature of a streamed answer, in order.
    tool_turn = bodies[1]["contents"][1]
    assert tool_turn["role"] == "model" and tool_turn["parts"][0]["thoughtSignature"]
    responses = bodies[1]["contents"][2]["parts"]
    assert len(responses) == calls and all("functionResponse" in p for p in responses)
    assert bodies[2]["contents"][1] == tool_turn
    assert bodies[2]["contents"][2]["parts"] == responses
    assert bodies[2]["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in bodies[2]["contents"]] == ["user", "model", "user", "model", "user"]
    assert bodies[2]["contents"][3]["parts"][-1]["thoughtSignature"]


def _check_responses(bodies: list[Any], calls: int) -> None:
    # Stateless: every request carries the whole history, the encrypted reasoning back
    # byte for byte, each reasoning item followed by the item it belongs to (with its id).
    for body in bodies:
        assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
        assert "previous_response_id" not in body
    first = RESPONSES.load_transcript("reasoning_tool_turn")[0]["json"]["output"]
    final = RESPONSES.load_transcript("reasoning_final_answer")[0]["json"]["output"]
    reasoning, call = first
    sent = bodies[1]["input"]
    assert [item["type"] for item in sent] == [
        "message",
        "message",
        "reasoning",
        *["function_call"] * calls,
        *["function_call_output"] * calls,
    ]
    assert sent[2] == {
        "type": "reasoning",
        "id": reasoning["id"],
        "summary": [
            {
                "type": "summary_text",
                "text": "\n\n".join(summary["text"] for summary in reasoning["summary"]),
            }
        ],
        "encrypted_content": reasoning["encrypted_content"],
    }
    assert (sent[3]["id"], sent[3]["call_id"], sent[3]["arguments"]) == (
        call["id"],
        call["call_id"],
        call["arguments"],
    )
    assert sent[4]["call_id"] == call["call_id"]
    replay = bodies[2]["input"]
    assert replay[:5] == sent
    assert replay[5]["encrypted_content"] == final[0]["encrypted_content"]
    assert [(item["type"], item.get("id")) for item in replay[5:]] == [
        ("reasoning", final[0]["id"]),
        ("message", final[1]["id"]),
        ("message", None),
    ]


@attrs.frozen
class Loop:
    provider: Provider
    tools: list[ToolDefinition]
    options: Options
    turns: dict[str, Turn]
    #: Checks the requests sent (tool call, tool results, replaying turn).
    check_bodies: Callable[[list[Any], int], None]

    def __str__(self) -> str:
        return self.provider.name


ONE_CALL = "It is 18°C and sunny in Paris."
LOOPS = [
    Loop(
        OPENAI,
        [WEATHER, TIME],
        Options(),
        {
            "call": Turn(["tool_turn"], "plain_answer", ["18C, sunny"], ONE_CALL),
            "stream": Turn(
                ["stream_parallel_tools", "stream_final_answer"],
                "stream_text",
                ["18C", "14:05"],
                "It is 18°C in Paris and 14:05 there.",
            ),
        },
        _check_openai,
    ),
    Loop(
        ANTHROPIC,
        [WEATHER],
        Options(reasoning_effort="low"),
        {
            "call": Turn(["thinking_tool_turn"], "text", ["18C, sunny"], ONE_CALL),
            "stream": Turn(["stream_thinking_tool_turn"], "stream_text", ["18C, sunny"], ONE_CALL),
        },
        _check_anthropic,
    ),
    Loop(
        GEMINI,
        [WEATHER, TIME],
        Options(reasoning_effort="low"),
        {
            "call": Turn(["tool_turn"], "text", ["18C, sunny"], ONE_CALL),
            "stream": Turn(
                ["stream_parallel_tools", "stream_final_answer"],
                "stream_text",
                ["18C", "14:05"],
                "It is 18°C in Paris and 14:05 there.",
            ),
        },
        _check_gemini,
    ),
    Loop(
        RESPONSES,
        [WEATHER],
        Options(reasoning_effort="low"),
        {
            "call": Turn(
                ["reasoning_tool_turn", "reasoning_final_answer"], "text", ["18C, sunny"], ONE_CALL
            ),
            "stream": Turn(
                ["stream_reasoning_tool_turn", "stream_reasoning_final_answer"],
                "stream_text",
                ["18C, sunny"],
                ONE_CALL,
            ),
        },
        _check_responses,
    ),
]


@pytest.mark.parametrize("loop", LOOPS, ids=str)
@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_tool_loop_through_the_history_middleware(
    loop: Loop, mode: str, tmp_path: Path
) -> None:
    steps = loop.turns[mode]
    load = loop.provider.load_transcript
    with loop.provider.serve() as server:
        server.script(*(e for name in steps.transcripts for e in load(name)), *load(steps.replay))
        bodies = await _run(loop, server, mode, tmp_path)
    loop.check_bodies(bodies, len(steps.outputs))


async def _run(loop: Loop, server: OpenAIServer, mode: str, tmp_path: Path) -> list[Any]:
    """The tool loop of ``loop`` in ``mode`` against ``server``; the bodies it sent."""
    steps = loop.turns[mode]
    model = loop.provider.make(server.base_url)
    async with model, await SQLiteStore.open(tmp_path / "h.db") as store:
        middleware = Middleware(store, store, "paris")

        async def send(request: Request) -> Response:
            if mode == "call":
                return await wrap(model, middleware.call).call(request)
            return await collect(wrap_stream(model, middleware.stream).stream(request))

        system = system_message("Be brief.")
        turn = [user_message("What's the weather in Paris?")]
        first = await send(Request([system, *turn], tools=loop.tools, options=loop.options))
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        assert await store.read("paris") == []  # the tool-call pause writes nothing
        calls = first.output.message.tool_calls
        results = [
            ToolResult(call.id, call.name, ToolOutput.of_text(text))
            for call, text in zip(calls, steps.outputs, strict=True)
        ]
        final = await send(
            Request(
                [system, *turn, first.output.message, tool_message(*results)],
                tools=loop.tools,
                options=loop.options,
            )
        )
        assert final.text == steps.final
        assert final.output is not None and final.output.finish_reason is FinishReason.STOP
        stored = await store.read("paris")
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[1] == first.output.message
        assert len(stored[1].tool_calls) == len(steps.outputs)
        assert stored[3].text == final.text
        # The next turn replays the stored turn.
        await send(Request([system, user_message("And tomorrow?")], tools=loop.tools))
    return server.bodies()
