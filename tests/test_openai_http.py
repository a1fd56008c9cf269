"""OpenAIChatModel against a real HTTP server on loopback replaying wire transcripts.

The server (tests/openai_server.py) serves the canned transcripts of
tests/openai_transcripts/ over real sockets; every request body it receives is
validated with the official ``openai`` package's request types when the test ends, and
every canned response parses with its ``ChatCompletion`` / ``ChatCompletionChunk``.
Everything runs under asyncio and trio.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pydantic
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Model,
    Options,
    Request,
    Streamer,
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
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.models import _http
from scope.models.openai import OpenAIChatModel
from tests.helpers import TIME, WEATHER, Sleeps, accumulate, recording_sleeps, tool_call_deltas
from tests.openai_server import (
    TRANSCRIPTS,
    OpenAIServer,
    check_chunk,
    check_completion,
    load_transcript,
)

QUESTION = Request([user_message("What's the weather in Paris?")], tools=[WEATHER, TIME])


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv
    srv.check_requests()


def make_model(server: OpenAIServer, **kwargs: Any) -> tuple[OpenAIChatModel, Sleeps]:
    kwargs.setdefault("api_key", "sk-test")
    kwargs.setdefault("retry_backoff", 0.01)
    return recording_sleeps(OpenAIChatModel("gpt-4o-mini", base_url=server.base_url, **kwargs))


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


def test_the_model_is_a_model_and_a_streamer() -> None:
    model = OpenAIChatModel("gpt-4o-mini", api_key="k")
    assert isinstance(model, Model) and isinstance(model, Streamer)
    assert OpenAIChatModel.__module__ == "scope.models.openai"


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
async def test_a_malformed_event_raises_once(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_malformed"))
    model, sleeps = make_model(server)
    async with model:
        stream = model.stream(Request([user_message("Hi")]))
        first = await stream.__anext__()
        assert first.text == "Hel"
        with pytest.raises(InvalidResponseError, match="not valid JSON"):
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    assert len(server.requests) == 1 and sleeps.delays == []


@pytest.mark.anyio
async def test_a_dropped_connection_raises_once(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_dropped"))
    model, sleeps = make_model(server)
    async with model:
        stream = model.stream(Request([user_message("Tell me a story")]))
        texts = [(await stream.__anext__()).text, (await stream.__anext__()).text]
        with pytest.raises(ProviderConnectionError) as info:
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    assert texts == ["Once upon", " a time"]
    assert isinstance(info.value.__cause__, httpx.HTTPError)
    assert len(server.requests) == 1 and sleeps.delays == []  # never retried mid-stream


@pytest.mark.anyio
async def test_an_early_stop_closes_the_connection(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_early_stop"))
    model, _ = make_model(server)
    async with model:
        stream = model.stream(Request([user_message("Count")]))
        assert (await stream.__anext__()).text == "one"
        assert (await stream.__anext__()).text == " two"
        await stream.aclose()  # type: ignore[attr-defined]
        # The server is blocked reading the socket: it sees EOF only if the client closed.
        closed = await anyio.to_thread.run_sync(server.closed_by_client.wait, 10)
        assert closed
        assert model._client is not None
        assert not model._client.is_closed  # the connection, not the client, was closed


@pytest.mark.anyio
async def test_cancellation_mid_stream_closes_the_connection(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_early_stop"))
    model, _ = make_model(server)
    texts: list[str] = []
    async with model:
        with anyio.move_on_after(0.3) as scope:
            async for chunk in model.stream(Request([user_message("Count")])):
                texts.append(chunk.text)  # the fourth chunk never comes
        assert scope.cancelled_caught
        assert texts == ["one", " two", " three"]
        assert await anyio.to_thread.run_sync(server.closed_by_client.wait, 10)


@pytest.mark.anyio
async def test_an_error_event_mid_stream(server: OpenAIServer) -> None:
    server.script(*load_transcript("stream_error_event"))
    model, _ = make_model(server)
    async with model:
        stream = model.stream(Request([user_message("Hi")]))
        assert (await stream.__anext__()).text == "Par"
        with pytest.raises(ProviderError, match="overloaded") as info:
            await stream.__anext__()
    # The error type says what the missing status would have: a server error.
    assert type(info.value) is ProviderServerError
    assert info.value.body["error"]["type"] == "server_error"
    assert info.value.status_code == 200
    assert info.value.request_id == "req_err_1"


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


@pytest.mark.anyio
async def test_a_stream_that_ends_early_is_a_connection_error(server: OpenAIServer) -> None:
    chunk = load_transcript("stream_text")[0]["sse"][1]
    server.script({"status": 200, "sse": [chunk]})
    model, _ = make_model(server)
    async with model:
        with pytest.raises(ProviderConnectionError, match="before it finished"):
            await collect(model.stream(Request([user_message("Hi")])))


@pytest.mark.anyio
async def test_a_finished_stream_without_done_is_accepted(server: OpenAIServer) -> None:
    events = load_transcript("stream_text")[0]["sse"]
    server.script({"status": 200, "sse": events[:-1]})  # no [DONE]
    model, _ = make_model(server)
    async with model:
        response = await collect(model.stream(Request([user_message("Hi")])))
    assert response.text == "Hello world!"


@pytest.mark.anyio
async def test_a_server_that_ignores_stream_true(server: OpenAIServer) -> None:
    server.script(*load_transcript("plain_answer"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(Request([user_message("Hi")])))
    assert len(chunks) == 1 and response.text == "The capital of France is Paris."


@pytest.mark.anyio
async def test_a_stream_starts_nothing_until_iterated_and_validates_first(
    server: OpenAIServer,
) -> None:
    model, _ = make_model(server)
    async with model:
        stream = model.stream(Request([user_message("Hi")], options=Options(top_k=3)))
        assert server.requests == []
        with pytest.raises(UnsupportedOptionError, match="top_k"):
            await stream.__anext__()
        with pytest.raises(UnsupportedOptionError, match="top_k"):
            await model.call(Request([user_message("Hi")], options=Options(top_k=3)))
    assert server.requests == []


@pytest.mark.anyio
async def test_stream_retries_before_the_first_byte(server: OpenAIServer) -> None:
    server.script(load_transcript("server_error_twice")[0], *load_transcript("stream_text"))
    model, sleeps = make_model(server)
    async with model:
        response = await collect(model.stream(Request([user_message("Hi")])))
    assert response.text == "Hello world!"
    assert len(server.requests) == 2 and len(sleeps.delays) == 1


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
    # finish_reason "" on every chunk is "not finished": all five chunks were read.
    assert all(c.output is None or c.output.finish_reason is None for c in chunks)
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is None
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


@pytest.mark.anyio
async def test_rate_limit_then_success_honours_retry_after(server: OpenAIServer) -> None:
    server.script(*load_transcript("rate_limit_then_ok"))
    model, sleeps = make_model(server)
    async with model:
        response = await model.call(Request([user_message("Hi")]))
    assert response.text == "Done waiting."
    assert sleeps.delays == [2.0]
    first, second = server.requests
    assert first.body == second.body


@pytest.mark.anyio
async def test_rate_limit_exhausted(server: OpenAIServer) -> None:
    server.script(*load_transcript("rate_limit_then_ok"))
    model, sleeps = make_model(server, max_retries=0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(Request([user_message("Hi")]))
    error = info.value
    assert (error.status_code, error.retry_after, error.request_id) == (429, 2.0, "req_429_1")
    assert error.body["error"]["code"] == "rate_limit_exceeded"
    assert "Rate limit reached" in str(error) and "req_429_1" in str(error)
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_a_retry_after_longer_than_allowed_is_not_waited(server: OpenAIServer) -> None:
    server.script(*load_transcript("rate_limit_then_ok"))
    model, sleeps = make_model(server, retry_max_delay=1.0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(Request([user_message("Hi")]))
    assert info.value.retry_after == 2.0
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_server_errors_twice_then_success(server: OpenAIServer) -> None:
    server.script(*load_transcript("server_error_twice"))
    model, sleeps = make_model(server, retry_backoff=0.1)
    async with model:
        response = await model.call(Request([user_message("Hi")]))
    assert response.text == "Third time lucky."
    assert len(server.requests) == 3
    first, second = sleeps.delays
    assert 0.075 <= first <= 0.1 and 0.15 <= second <= 0.2  # exponential, with jitter


@pytest.mark.anyio
async def test_server_errors_exhausted(server: OpenAIServer) -> None:
    server.script(*load_transcript("server_error_twice"))
    model, sleeps = make_model(server, max_retries=1)
    async with model:
        with pytest.raises(ProviderServerError) as info:
            await model.call(Request([user_message("Hi")]))
    assert (info.value.status_code, info.value.request_id) == (500, "req_500_2")
    assert len(server.requests) == 2 and len(sleeps.delays) == 1


@pytest.mark.anyio
async def test_unauthorized(server: OpenAIServer) -> None:
    server.script(*load_transcript("unauthorized"))
    model, sleeps = make_model(server, api_key="sk-bad")
    async with model:
        with pytest.raises(AuthenticationError, match="Incorrect API key") as info:
            await model.call(Request([user_message("Hi")]))
    assert (info.value.status_code, info.value.request_id) == (401, "req_401_1")
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, BadRequestError),
        (403, AuthenticationError),
        (404, BadRequestError),
        (409, BadRequestError),
        (413, BadRequestError),
        (422, BadRequestError),
        (302, ProviderError),
        (503, ProviderServerError),
    ],
)
async def test_status_mapping(
    server: OpenAIServer, status: int, error: type[ProviderError]
) -> None:
    server.script({"status": status, "json": {"error": {"message": f"status {status}"}}})
    model, _ = make_model(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderError, match=f"status {status}") as info:
            await model.call(Request([user_message("Hi")]))
    assert type(info.value) is error
    assert info.value.status_code == status


@pytest.mark.anyio
async def test_a_non_json_error_body_is_kept_as_text(server: OpenAIServer) -> None:
    server.script({"status": 502, "sse": [{"$raw": "<html>Bad gateway</html>"}]})
    model, _ = make_model(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderServerError, match="Bad gateway") as info:
            await collect(model.stream(Request([user_message("Hi")])))
    assert info.value.body == "<html>Bad gateway</html>"


@pytest.mark.anyio
async def test_an_error_body_cut_short_still_maps_the_status(server: OpenAIServer) -> None:
    server.script({"status": 503, "sse": [{"$drop": True}]})
    model, _ = make_model(server, max_retries=0)
    async with model:
        with pytest.raises(ProviderServerError) as info:
            await collect(model.stream(Request([user_message("Hi")])))
    assert (info.value.status_code, info.value.body) == (503, None)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.anyio
async def test_connection_refused_is_retried_then_raised() -> None:
    model = OpenAIChatModel(
        "gpt-4o-mini", api_key="k", base_url=f"http://127.0.0.1:{_closed_port()}/v1"
    )
    sleeps = Sleeps()
    model._sleep = sleeps
    async with model:
        with pytest.raises(ProviderConnectionError) as info:
            await model.call(Request([user_message("Hi")]))
        with pytest.raises(ProviderConnectionError):
            await collect(model.stream(Request([user_message("Hi")])))
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert len(sleeps.delays) == 4


@pytest.mark.anyio
async def test_a_read_timeout_is_not_retried(server: OpenAIServer) -> None:
    server.script({"stall": True})
    model, sleeps = make_model(server, timeout=0.2)
    async with model:
        with pytest.raises(ProviderTimeoutError) as info:
            await model.call(Request([user_message("Hi")]))
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_cancellation_during_backoff_propagates(server: OpenAIServer) -> None:
    server.serve_repeatedly(load_transcript("server_error_twice")[0])
    model = OpenAIChatModel("m", api_key="k", base_url=server.base_url, retry_backoff=30)
    async with model:
        with anyio.move_on_after(0.3) as scope:
            await model.call(Request([user_message("Hi")]))
    assert scope.cancelled_caught
    assert len(server.requests) == 1


def test_every_httpx_error_is_mapped() -> None:
    def subclasses(cls: type[httpx.HTTPError]) -> Iterator[type[httpx.HTTPError]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    request = httpx.Request("POST", "http://x.test")
    response = httpx.Response(500, request=request)
    seen: set[type[httpx.HTTPError]] = set()
    classes: list[type[httpx.HTTPError]] = [httpx.HTTPError, *subclasses(httpx.HTTPError)]
    for cls in classes:
        exc: httpx.HTTPError
        if cls is httpx.HTTPStatusError:
            exc = httpx.HTTPStatusError("boom", request=request, response=response)
        else:
            exc = cls("boom")
        mapped = _http.map_transport_error(exc)
        expected: type[Exception]
        if issubclass(cls, httpx.TimeoutException):
            expected = ProviderTimeoutError
        elif issubclass(cls, httpx.DecodingError):
            expected = InvalidResponseError
        else:
            expected = ProviderConnectionError
        assert type(mapped) is expected, cls
        seen.add(cls)
    assert httpx.RemoteProtocolError in seen and httpx.PoolTimeout in seen


# -------------------------------------------------------------------------- clients


@pytest.mark.anyio
async def test_own_client_is_closed_and_a_given_one_is_not(server: OpenAIServer) -> None:
    server.serve_repeatedly(load_transcript("plain_answer")[0])
    model, _ = make_model(server)
    assert model._client is None  # nothing created before first use
    async with model:
        await model.call(Request([user_message("Hi")]))
        own = model._client
        assert own is not None
    assert own.is_closed
    with pytest.raises(RuntimeError, match="closed"):
        await model.call(Request([user_message("Hi")]))

    async with httpx.AsyncClient() as client:
        given = OpenAIChatModel(
            "gpt-4o-mini", api_key="k", base_url=server.base_url, http_client=client
        )
        async with given:
            await given.call(Request([user_message("Hi")]))
        await given.aclose()  # idempotent
        assert not client.is_closed
        response = await client.get(server.base_url.replace("/v1", "/"))
        assert response.status_code == 501  # the client still works


@pytest.mark.anyio
async def test_environment_api_key_reaches_the_server(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    server.script(*load_transcript("plain_answer"))
    async with OpenAIChatModel("gpt-4o-mini", headers={"X-Trace": "t1"}) as model:
        await model.call(Request([user_message("Hi")]))
    (recorded,) = server.requests
    assert recorded.headers["authorization"] == "Bearer sk-from-env"
    assert recorded.headers["x-trace"] == "t1"


@pytest.mark.anyio
async def test_concurrent_calls_share_one_model(server: OpenAIServer) -> None:
    server.serve_repeatedly(load_transcript("plain_answer")[0])
    model, _ = make_model(server)
    results: list[Message] = []

    async def one() -> None:
        response = await model.call(Request([user_message("Hi")]))
        assert response.output is not None and response.output.message is not None
        results.append(response.output.message)

    async with model, anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert len(results) == 8 and len(server.requests) == 8


def _capturing_client(seen: list[httpx.Request], **kwargs: Any) -> httpx.AsyncClient:
    completion = load_transcript("plain_answer")[0]["json"]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), **kwargs)


@pytest.mark.anyio
async def test_an_explicit_timeout_none_overrides_a_given_clients_timeout() -> None:
    # timeout=None with http_client means "no timeout for these requests", not "the
    # client's own timeout" (which leaving timeout out means).
    seen: list[httpx.Request] = []
    async with _capturing_client(seen, timeout=5.0) as client:
        unlimited = OpenAIChatModel("m", base_url="http://x/v1", http_client=client, timeout=None)
        await unlimited.call(Request([user_message("Hi")]))
        default = OpenAIChatModel("m", base_url="http://x/v1", http_client=client)
        await default.call(Request([user_message("Hi")]))
    assert seen[0].extensions["timeout"] == httpx.Timeout(None).as_dict()
    assert seen[1].extensions["timeout"] == httpx.Timeout(5.0).as_dict()


@pytest.mark.anyio
async def test_headers_override_the_defaults_whatever_their_case() -> None:
    seen: list[httpx.Request] = []
    async with _capturing_client(seen) as client:
        model = OpenAIChatModel(
            "m",
            api_key="sk-default",
            base_url="http://x/v1",
            http_client=client,
            headers={"authorization": "Bearer sk-other", "user-agent": "mine/1"},
        )
        await model.call(Request([user_message("Hi")]))
    (request,) = seen
    assert request.headers.get_list("authorization") == ["Bearer sk-other"]
    assert request.headers.get_list("user-agent") == ["mine/1"]
