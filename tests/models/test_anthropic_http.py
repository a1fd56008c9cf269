"""AnthropicModel against a real HTTP server on loopback replaying wire transcripts.

The server (tests/anthropic_server.py) serves the canned transcripts of
tests/anthropic_transcripts/ over real sockets; every request body it receives is
validated with the official ``anthropic`` package's request types when the test ends,
and every canned response parses with its ``Message`` / stream event models. Each test
runs under asyncio and trio, and most in both modes (``call`` and ``stream``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from scope.chat import (
    FinishReason,
    Options,
    Request,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
    text_part,
    tool_message,
    user_message,
)
from scope.errors import (
    BadRequestError,
)
from scope.metadata import Metadata
from tests.anthropic_server import (
    TRANSCRIPTS,
    AnthropicServer,
    check_error,
    check_event,
    check_message,
    load_transcript,
)
from tests.helpers import (
    ANTHROPIC,
    TIME,
    WEATHER,
    accumulate,
    answer,
    tool_call_deltas,
)

MOON = ToolDefinition("get_moon", {"type": "object"}, "The moon's phase tonight.")
QUESTION = Request([user_message("What's the weather in Paris?")], tools=[WEATHER, TIME, MOON])

MODES = ["call", "stream"]


server = ANTHROPIC.server_fixture()
make_model = ANTHROPIC.recorded


def transcript(name: str, mode: str) -> list[dict[str, Any]]:
    return load_transcript(name if mode == "call" else f"stream_{name}")


# ------------------------------------------------------------------------ transcripts


def test_every_canned_response_parses_with_the_anthropic_sdk() -> None:
    # The *native_* transcripts are the API's answers as another project recorded them,
    # kept verbatim: a remote MCP server's blocks are in the package's beta types only,
    # and a 2025 message_delta lacks fields the models now require; not checked here.
    files = sorted(path for path in TRANSCRIPTS.glob("*.json") if "native_" not in path.stem)
    assert len(files) >= 15
    seen = 0
    for path in files:
        for exchange in json.loads(path.read_text(encoding="utf-8"))["exchanges"]:
            body = exchange.get("json")
            if body is not None:
                (check_message if exchange["status"] == 200 else check_error)(body)
                seen += 1
            for item in exchange.get("sse", ()):
                if not any(key.startswith("$") for key in item):
                    check_event(item)
                    seen += 1
    assert seen > 90


# ------------------------------------------------------------------------------ text


@pytest.mark.anyio
async def test_text_via_call(server: AnthropicServer) -> None:
    server.script(*load_transcript("text"))
    model, _ = make_model(server)
    async with model:
        response = await model.call(
            Request([user_message("Capital of France?")], options=Options(temperature=0.2))
        )
    response.validate_complete()
    assert response.text == "The capital of France is Paris."
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None
    assert response.metadata.id == "msg_01TextAnswer"
    assert response.metadata.model == "claude-sonnet-4-5-20250929"
    # scope's input count includes both cache counts.
    assert response.usage == Usage(
        12 + 2048 + 310, 9, cache_read_input_tokens=2048, cache_write_input_tokens=310
    )
    (recorded,) = server.requests
    assert recorded.path == "/v1/messages"
    assert recorded.headers["x-api-key"] == "sk-ant-test"
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    assert recorded.headers["accept"] == "application/json"
    assert "authorization" not in recorded.headers
    assert recorded.body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
        "temperature": 0.2,
    }


@pytest.mark.anyio
async def test_text_via_stream(server: AnthropicServer) -> None:
    server.script(*load_transcript("stream_text"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(Request([user_message("Hi")])))
    response.validate_complete()
    assert response.text == "Hello world!"
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None and response.metadata.id == "msg_01StreamText"
    assert response.usage == Usage(
        12 + 2048, 5, cache_read_input_tokens=2048, cache_write_input_tokens=0
    )
    assert [c.text for c in chunks if c.text] == ["Hello", " world", "!"]
    (recorded,) = server.requests
    assert recorded.headers["accept"] == "text/event-stream"
    assert recorded.body["stream"] is True


# ------------------------------------------------------------------ thinking turn


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_thinking_signature_round_trips_byte_for_byte(
    server: AnthropicServer, mode: str
) -> None:
    exchanges = transcript("thinking_tool_turn", mode)
    server.script(*exchanges)
    if mode == "call":
        sent = next(b for b in exchanges[0]["json"]["content"] if b["type"] == "thinking")
        signature = sent["signature"]
    else:
        signature = "".join(
            item["delta"]["signature"]
            for item in exchanges[0]["sse"]
            if item["type"] == "content_block_delta" and item["delta"]["type"] == "signature_delta"
        )
    model, _ = make_model(server)
    request = Request(
        [user_message("What's the weather in Paris?")],
        tools=[WEATHER],
        options=Options(reasoning_effort="low"),
    )
    async with model:
        first = await answer(model, request, mode)
        first.validate_complete()
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        reasoning = first.output.message.parts[0]
        assert reasoning.kind == "reasoning" and reasoning.text.startswith("The user wants")
        assert reasoning.signature == base64.b64decode(signature)
        (call,) = first.output.message.tool_calls
        assert call.id.startswith("toolu_01") and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"} | (
            {"days": 1.5} if mode == "call" else {}
        )
        result = ToolResult(call.id, call.name, ToolOutput.of_text("18C, sunny"))
        follow_up = Request(
            [*request.messages, first.output.message, tool_message(result)],
            tools=request.tools,
            options=request.options,
        )
        final = await answer(model, follow_up, mode)
    final.validate_complete()
    assert final.text == "It is 18°C and sunny in Paris."
    first_body, second_body = server.bodies()
    assert first_body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert first_body["max_tokens"] == 4096 + 4096
    assistant = second_body["messages"][1]
    assert assistant["role"] == "assistant"
    # The signature goes back exactly as it came, padding included.
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": reasoning.text,
        "signature": signature,
    }
    assert assistant["content"][1:] == [
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": call.id,
            "name": "get_weather",
            "input": json.loads(call.arguments),
        },
    ]
    assert second_body["messages"][2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": [{"type": "text", "text": "18C, sunny"}],
            }
        ],
    }


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_redacted_thinking_and_server_tools(server: AnthropicServer, mode: str) -> None:
    exchanges = transcript("redacted_thinking", mode)
    server.script(*exchanges, *load_transcript("text"))
    model, _ = make_model(server)
    async with model:
        response = await answer(model, Request([user_message("Weather in Paris?")]), mode)
        response.validate_complete()
        assert response.output is not None and response.output.message is not None
        parts = response.output.message.parts
        thinking, first, second, search, result, text = parts
        # The server's web search is kept whole, in place (DESIGN §6k), never a call.
        assert search.native is not None and search.native.type == "server_tool_use"
        assert result.native is not None and result.native.type == "web_search_tool_result"
        assert thinking.text == "Let me look this up." and not thinking.metadata
        redacted = {"anthropic/redacted": True}
        # Adjacent redacted blocks stay separate parts: the second carries its index.
        assert first.text == "" and first.metadata == Metadata(redacted)
        assert second.metadata == Metadata({**redacted, "anthropic/block": 2})
        assert text == text_part("It is sunny in Paris.")
        assert response.output.message.tool_calls == ()  # server tools are not calls
        await model.call(
            Request(
                [
                    user_message("Weather in Paris?"),
                    response.output.message,
                    user_message("Thanks!"),
                ]
            )
        )
    if mode == "call":
        blocks = exchanges[0]["json"]["content"]
    else:
        blocks = [i["content_block"] for i in exchanges[0]["sse"] if "content_block" in i]
    data = [b["data"] for b in blocks if b["type"] == "redacted_thinking"]
    assert [first.signature, second.signature] == [d.encode() for d in data]
    sent = server.bodies()[1]["messages"][1]["content"]
    assert [b["type"] for b in sent] == [
        "thinking",
        "redacted_thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert [b["data"] for b in sent[1:3]] == data
    # As recorded (a streamed server_tool_use starts with input {}: its input followed).
    assert sent[4] == blocks[4] and sent[3]["id"] == blocks[3]["id"]
    assert sent[3]["input"] == {"query": "Paris weather"}


# ------------------------------------------------------------------ parallel tools


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_parallel_tool_use(server: AnthropicServer, mode: str) -> None:
    server.script(*transcript("parallel_tools", mode), *transcript("final_answer", mode))
    model, _ = make_model(server)
    async with model:
        first = await answer(model, QUESTION, mode)
        first.validate_complete()
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        calls = first.output.message.tool_calls
        assert [(c.id, c.name) for c in calls] == [
            ("toolu_01A", "get_weather"),
            ("toolu_01B", "get_time"),
            ("toolu_01C", "get_moon"),
        ]
        assert [json.loads(c.arguments) for c in calls] == [
            {"city": "Paris"},
            {"zone": "Europe/Paris"},
            {},
        ]
        assert calls[2].arguments == "{}"  # no input at all: {}
        results = [
            ToolResult(call.id, call.name, ToolOutput.of_text(text))
            for call, text in zip(calls, ["18C", "14:05", "full"], strict=True)
        ]
        follow_up = Request(
            [
                *QUESTION.messages,
                first.output.message,
                tool_message(*results[:2]),
                tool_message(results[2]),
            ],
            tools=QUESTION.tools,
        )
        final = await answer(model, follow_up, mode)
    final.validate_complete()
    assert final.text == "It is 18°C in Paris and 14:05 there."
    second = server.bodies()[1]
    # The two tool messages travel as one user turn of tool_result blocks.
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in second["messages"][2]["content"]] == [
        "toolu_01A",
        "toolu_01B",
        "toolu_01C",
    ]


@pytest.mark.anyio
async def test_interleaved_input_json_deltas_keep_their_calls(server: AnthropicServer) -> None:
    server.script(*load_transcript("stream_parallel_tools"))
    model, _ = make_model(server)
    async with model:
        chunks, _ = await accumulate(model.stream(QUESTION))
    deltas = [(delta.id, delta.arguments) for delta in tool_call_deltas(chunks)]
    assert deltas == [
        ("toolu_01A", ""),
        ("toolu_01B", ""),
        ("toolu_01A", '{"city":'),
        ("toolu_01B", '{"zone": "Europe/'),
        ("toolu_01A", ' "Paris"}'),
        ("toolu_01B", 'Paris"}'),
        ("toolu_01C", ""),
        ("toolu_01C", "{}"),
    ]


# ------------------------------------------------------------------------ max tokens


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_max_tokens_stop(server: AnthropicServer, mode: str) -> None:
    server.script(*transcript("max_tokens", mode))
    model, _ = make_model(server)
    async with model:
        response = await answer(
            model, Request([user_message("A story")], options=Options(max_tokens=8)), mode
        )
    response.validate_complete()
    assert response.output is not None and response.output.finish_reason is FinishReason.LENGTH
    assert response.text == "Once upon a time, in a land far"
    assert response.usage == Usage(15, 8, cache_read_input_tokens=0, cache_write_input_tokens=0)
    assert server.bodies()[0]["max_tokens"] == 8


# ------------------------------------------------------------------ errors, retries


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_bad_request_with_an_error_object(server: AnthropicServer, mode: str) -> None:
    server.script(*load_transcript("bad_request"))
    model, sleeps = make_model(server)
    async with model:
        with pytest.raises(BadRequestError, match="Invalid `signature`") as info:
            await answer(model, Request([user_message("Hi")]), mode)
    error = info.value
    assert (error.status_code, error.request_id) == (400, "req_400_1")
    assert error.body["error"]["type"] == "invalid_request_error"
    assert "req_400_1" in str(error)
    assert sleeps.delays == [] and len(server.requests) == 1


# -------------------------------------------------------------------------- clients
