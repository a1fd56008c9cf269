"""OpenAIChatModel against a real HTTP server on loopback replaying wire transcripts.

The server (tests/openai_server.py) serves the canned transcripts of
tests/openai_transcripts/ over real sockets; every request body it receives is
validated with the official ``openai`` package's request types when the test ends, and
every canned response parses with its ``ChatCompletion`` / ``ChatCompletionChunk``.
Everything runs under asyncio and trio.
"""

from __future__ import annotations

import json

import pydantic
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Request,
    Response,
    ToolCall,
    ToolOutput,
    ToolResult,
    Usage,
    collect,
    reasoning_part,
    text_part,
    tool_message,
    user_message,
)
from scope.errors import (
    BadRequestError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
)
from scope.models.openai import OpenAIChatModel
from tests.helpers import (
    OPENAI,
    TIME,
    WEATHER,
    accumulate,
    tool_call_deltas,
)
from tests.openai_server import (
    TRANSCRIPTS,
    OpenAIServer,
    check_chunk,
    check_completion,
    load_transcript,
)

QUESTION = Request([user_message("What's the weather in Paris?")], tools=[WEATHER, TIME])


server = OPENAI.server_fixture()
make_model = OPENAI.recorded


# ------------------------------------------------------------------------ transcripts


def test_every_canned_response_parses_with_the_openai_sdk() -> None:
    files = sorted(TRANSCRIPTS.glob("*.json"))
    assert len(files) >= 10
    seen = 0
    for path in files:
        if "nonstandard" in json.loads(path.read_text(encoding="utf-8")):
            continue  # a real server's shape outside the protocol: see the next test
        for exchange in load_transcript(path.stem):
            body = exchange.get("json")
            if body is not None and exchange["status"] == 200:
                check_completion(body)
                seen += 1
            elif body is not None:
                assert isinstance(body["error"]["message"], str)
            for item in exchange.get("sse", ()):
                if isinstance(item, dict) and not any(k.startswith("$") for k in item):
                    if "error" in item:
                        continue
                    check_chunk(item)
                    seen += 1
    assert seen > 40


def test_nonstandard_transcripts_are_refused_by_the_openai_sdk() -> None:
    # Each transcript marked "nonstandard" holds a shape a real server sends that the
    # protocol (as the official SDK types it) does not allow: what the adapter tolerates.
    marked = 0
    for path in sorted(TRANSCRIPTS.glob("*.json")):
        if "nonstandard" not in json.loads(path.read_text(encoding="utf-8")):
            continue
        marked += 1
        refused = 0
        for exchange in load_transcript(path.stem):
            items = [exchange["json"]] if "json" in exchange else exchange["sse"]
            for item in items:
                if not isinstance(item, dict) or any(k.startswith("$") for k in item):
                    continue
                try:
                    (check_completion if "json" in exchange else check_chunk)(item)
                except pydantic.ValidationError:
                    refused += 1
        assert refused, path.name
    assert marked >= 4


# ------------------------------------------------------------------------------- call


@pytest.mark.anyio
async def test_plain_answer(server: OpenAIServer) -> None:
    server.script(*load_transcript("plain_answer"))
    model, _ = make_model(server)
    async with model:
        response = await model.call(Request([user_message("Capital of France?")]))
    assert response.text == "The capital of France is Paris."
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None
    assert response.metadata.id == "chatcmpl-AB1plain"
    assert response.metadata.model == "gpt-4o-mini-2024-07-18"
    assert response.usage == Usage(1200, 8, reasoning_tokens=0, cache_read_input_tokens=1024)
    assert response.metadata.extra.decode("openai/system_fingerprint") == "fp_f85bea6784"
    response.validate_complete()
    (recorded,) = server.requests
    assert recorded.path == "/v1/chat/completions"
    assert recorded.headers["authorization"] == "Bearer sk-test"
    assert recorded.headers["accept"] == "application/json"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.body == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Capital of France?"}],
    }


@pytest.mark.anyio
async def test_refusal(server: OpenAIServer) -> None:
    server.script(*load_transcript("refusal"))
    model, _ = make_model(server)
    async with model:
        response = await model.call(Request([user_message("Help me with something bad")]))
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part == text_part(
        "I'm sorry, I can't help with that.", metadata={"openai/refusal": True}
    )


@pytest.mark.anyio
async def test_full_tool_turn(server: OpenAIServer) -> None:
    server.script(*load_transcript("tool_turn"))
    model, _ = make_model(server)
    async with model:
        first = await model.call(QUESTION)
        first.validate_complete()
        assert first.output is not None and first.output.message is not None
        assert first.output.finish_reason is FinishReason.TOOL_CALLS
        (call,) = first.output.message.tool_calls
        assert call == ToolCall("call_weather01", "get_weather", '{"city": "Paris"}')
        follow_up = Request(
            [
                *QUESTION.messages,
                first.output.message,
                tool_message(ToolResult(call.id, call.name, ToolOutput.of_text("18C, sunny"))),
            ],
            tools=QUESTION.tools,
        )
        final = await model.call(follow_up)
    final.validate_complete()
    assert final.text == "It is 18°C and sunny in Paris."
    first_body, second_body = server.bodies()
    assert [t["function"]["name"] for t in first_body["tools"]] == ["get_weather", "get_time"]
    assert second_body["messages"][1:] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_weather01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_weather01", "content": "18C, sunny"},
    ]


# ----------------------------------------------------------------------------- stream


@pytest.mark.anyio
async def test_stream_text_with_usage_only_final_chunk(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_text"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(Request([user_message("Hi")])))
    assert response.text == "Hello world!"
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None and response.metadata.id == "chatcmpl-AB3stream"
    assert response.usage == Usage(1100, 3, reasoning_tokens=0, cache_read_input_tokens=1024)
    response.validate_complete()
    # The usage-only chunk (empty choices) is a delta of its own: metadata, no output.
    last = chunks[-1]
    assert last.output is None and last.usage.input_tokens == 1100
    (recorded,) = server.requests
    assert recorded.headers["accept"] == "text/event-stream"
    assert recorded.body["stream"] is True
    assert recorded.body["stream_options"] == {"include_usage": True}


@pytest.mark.anyio
async def test_stream_parallel_tool_calls(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_parallel_tools"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(QUESTION))
    deltas = tool_call_deltas(chunks)
    assert [(d.id, d.name) for d in deltas] == [
        ("call_weather01", "get_weather"),
        ("call_weather01", "get_weather"),
        ("call_time02", "get_time"),
        ("call_weather01", "get_weather"),
        ("call_time02", "get_time"),
        ("call_weather01", "get_weather"),
        ("call_time02", "get_time"),
    ]
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is FinishReason.TOOL_CALLS
    assert response.output.message.tool_calls == (
        ToolCall("call_weather01", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_time02", "get_time", '{"zone": "Europe/Paris"}'),
    )
    assert response.usage == Usage(82, 46, reasoning_tokens=0, cache_read_input_tokens=0)


@pytest.mark.anyio
async def test_streamed_tool_turn(server: OpenAIServer) -> None:
    server.script(
        *load_transcript("stream_parallel_tools"), *load_transcript("stream_final_answer")
    )
    model, _ = make_model(server)
    async with model:
        first = await collect(model.stream(QUESTION))
        assert first.output is not None and first.output.message is not None
        results = [
            ToolResult(call.id, call.name, ToolOutput.of_text(answer))
            for call, answer in zip(first.output.message.tool_calls, ["18C", "14:05"], strict=True)
        ]
        follow_up = Request(
            [*QUESTION.messages, first.output.message, tool_message(*results)],
            tools=QUESTION.tools,
        )
        final = await collect(model.stream(follow_up))
    final.validate_complete()
    assert final.text == "It is 18°C in Paris and 14:05 there."
    second = server.bodies()[1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool", "tool"]
    assert [m.get("tool_call_id") for m in second["messages"][2:]] == [
        "call_weather01",
        "call_time02",
    ]


@pytest.mark.anyio
async def test_stream_deepseek_reasoning(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_reasoning_deepseek"))
    model = OpenAIChatModel("deepseek-reasoner", api_key="k", base_url=server.base_url)
    async with model:
        _, response = await accumulate(model.stream(Request([user_message("9.11 or 9.8?")])))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (
        reasoning_part("The user asks for 9.11 vs 9.8. 9.8 is larger."),
        text_part("9.8 is larger."),
    )
    assert response.usage == Usage(18, 120, reasoning_tokens=112, cache_read_input_tokens=0)
    assert response.metadata is not None and response.metadata.model == "deepseek-reasoner"
    response.validate_complete()
    # The reasoning is not sent back in the next turn.
    server.script(*load_transcript("plain_answer"))
    async with OpenAIChatModel("deepseek-reasoner", api_key="k", base_url=server.base_url) as m:
        await m.call(
            Request([user_message("9.11 or 9.8?"), response.output.message, user_message("Why?")])
        )
    assert server.bodies()[1]["messages"][1] == {"role": "assistant", "content": "9.8 is larger."}


@pytest.mark.anyio
async def test_an_error_object_in_a_200_body(server: OpenAIServer) -> None:
    error = {"message": "The engine is currently overloaded", "type": "server_error"}
    server.script(
        {"status": 200, "headers": {"x-request-id": "req_body_err"}, "json": {"error": error}}
    )
    model, _ = make_model(server)
    async with model:
        with pytest.raises(ProviderError, match="overloaded") as info:
            await model.call(Request([user_message("Hi")]))
    assert type(info.value) is ProviderServerError
    assert info.value.status_code == 200  # stated by no one: the HTTP status
    assert info.value.request_id == "req_body_err"
    assert info.value.body == {"error": error}


# ------------------------------------------------------- what real servers send


@pytest.mark.anyio
async def test_mistral_content_blocks_via_call(server: OpenAIServer) -> None:
    server.script(*load_transcript("content_blocks_mistral"))
    model, _ = make_model(server)
    async with model:
        response = await model.call(Request([user_message("Capital of France?")]))
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (
        reasoning_part("Paris is the capital; answer briefly."),
        text_part("The capital of France is Paris."),
    )


@pytest.mark.anyio
async def test_mistral_content_blocks_via_stream(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_content_blocks_mistral"))
    model, _ = make_model(server)
    async with model:
        _, response = await accumulate(model.stream(Request([user_message("9.11 or 9.8?")])))
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (
        reasoning_part("The user compares 9.11 and 9.8. 9.8 = 9.80 > 9.11."),
        text_part("9.8 is larger."),
    )
    assert response.usage == Usage(12, 48)


@pytest.mark.anyio
async def test_cortex_placeholders_via_call(server: OpenAIServer) -> None:
    server.script(*load_transcript("placeholders_cortex"))
    model, _ = make_model(server)
    async with model:
        response = await model.call(QUESTION)
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is FinishReason.TOOL_CALLS
    assert response.output.message.text == "Let me check the weather."
    assert response.output.message.tool_calls == (
        ToolCall("tooluse_Kq1", "get_weather", '{"city": "Paris"}'),
    )


@pytest.mark.anyio
async def test_cortex_placeholders_via_stream(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_placeholders_cortex"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(QUESTION))
    # finish_reason "" on every chunk is "not finished": all five chunks were read,
    # and [DONE] finished the answer: tool_calls, as it has a call (DESIGN §7e).
    assert all(c.output is None or c.output.finish_reason is None for c in chunks[:-1])
    assert chunks[-1] == Response(Output(None, FinishReason.TOOL_CALLS))
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is FinishReason.TOOL_CALLS
    assert response.output.message.text == "Let me check."
    assert response.output.message.tool_calls == (
        ToolCall("tooluse_Kq1", "get_weather", '{"city": "Paris"}'),
    )
    assert response.usage == Usage(310, 41)


@pytest.mark.anyio
async def test_late_tool_call_ids_via_stream(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_late_tool_call_id"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(QUESTION))
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.message.tool_calls == (
        ToolCall("call_w1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_t2", "get_time", '{"zone": "Europe/Paris"}'),
    )
    ids = {delta.id for delta in tool_call_deltas(chunks)}
    assert ids == {"call_w1", "call_t2"}  # never a synthetic call_<index>


@pytest.mark.anyio
async def test_groq_error_event_is_a_bad_request(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_error_event_groq"))
    model, sleeps = make_model(server)
    async with model:
        stream = model.stream(QUESTION)
        assert (await stream.__anext__()).text == "I will"
        with pytest.raises(BadRequestError, match="Failed to call a function") as info:
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    assert info.value.status_code == 400
    assert info.value.request_id == "req_groq_err"
    assert info.value.body["error"]["code"] == "tool_use_failed"
    assert sleeps.delays == [] and len(server.requests) == 1  # never retried mid-stream


@pytest.mark.anyio
async def test_openrouter_error_chunk_is_a_rate_limit(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_error_chunk_openrouter"))
    model, sleeps = make_model(server)
    async with model:
        with pytest.raises(RateLimitError, match="rate limited upstream") as info:
            await collect(model.stream(QUESTION))
    assert info.value.status_code == 429 and info.value.retry_after is None
    assert sleeps.delays == [] and len(server.requests) == 1


# ---------------------------------------------------------------- errors and retries


# -------------------------------------------------------------------------- clients
