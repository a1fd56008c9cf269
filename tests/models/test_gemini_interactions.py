"""GeminiInteractionsModel: recorded Interactions answers (tests/
gemini_interactions_transcripts/, with provenance) decoded by ``call`` and by ``stream``
against the loopback server (tests/gemini_interactions_server.py, which checks every
request body against the API reference as google-genai types it); signatures sent back
byte for byte to the adapter's own model only; options; errors; server-side state."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Options,
    PartKind,
    Request,
    Response,
    ToolCall,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    tool_message,
    user_message,
)
from scope.errors import BadRequestError, InvalidResponseError
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata
from scope.models._interactions_wire import (
    API,
    STATUS_KEY,
    STEP_KEY,
    EventMapper,
    build_body,
)
from scope.models._provenance import Replay
from scope.models.gemini import GeminiInteractionsModel
from tests.gemini_interactions_server import (
    InteractionsServer,
    assembled,
    check_interaction,
    events_of,
    load,
)
from tests.helpers import accumulate, answer

pytestmark = pytest.mark.anyio

MODEL = "gemini-3.7-flash"
KEY = "test-key"
WEATHER = ToolDefinition(
    "get_weather",
    RawJSON.parse(
        '{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}'
    ),
    "Get the current weather in a given location",
)
ASK = Request([user_message("What is the weather in Hobart, Tasmania?")], tools=[WEATHER])


@pytest.fixture
def server() -> Iterator[InteractionsServer]:
    with InteractionsServer() as srv:
        yield srv
        srv.check_requests()


def _model(server: InteractionsServer, **options: Any) -> GeminiInteractionsModel:
    return GeminiInteractionsModel(
        MODEL, api_key=KEY, base_url=server.base_url, max_retries=0, **options
    )


def _exchange(name: str, mode: str) -> dict[str, Any]:
    """The recorded exchange of ``name`` as ``mode`` asks it: the stream as recorded, or
    the ``Interaction`` a non-streamed request gets (assembled from the same stream)."""
    (exchange,) = load(name)["exchanges"]
    if mode == "stream":
        return exchange
    body = assembled(events_of(exchange))
    check_interaction(body)
    return {"status": 200, "headers": exchange["headers"], "json": body}


def _signatures(name: str) -> list[str]:
    return [
        event["delta"]["signature"]
        for event in events_of(load(name)["exchanges"][0])
        if event["event_type"] == "step.delta" and event["delta"]["type"] == "thought_signature"
    ]


def _step(ordinal: int, **more: Any) -> Metadata:
    return Metadata({STEP_KEY: ordinal, **more})


MODES = ["call", "stream"]


# ------------------------------------------------------------------ recorded answers


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_turn_decodes_by_call_and_by_stream(
    server: InteractionsServer, mode: str
) -> None:
    server.script(_exchange("stream_tool_call", mode))
    async with _model(server) as model:
        response = await answer(model, ASK, mode)
    assert response.output is not None and response.output.message is not None
    message = response.output.message
    (signature,) = _signatures("stream_tool_call")
    assert [p.kind for p in message.parts] == [PartKind.REASONING, PartKind.TOOL_CALL]
    thought, call = message.parts
    assert thought.text == "" and thought.signature == base64.b64decode(signature)
    assert thought.metadata == _step(0)
    assert call.tool_call == ToolCall(
        "call_3345913", "get_weather", '{"location":"Hobart, Tasmania"}'
    )
    assert call.metadata == _step(1)
    assert response.output.finish_reason is FinishReason.TOOL_CALLS
    assert response.output.metadata is not None
    assert response.output.metadata.extra == Metadata({STATUS_KEY: "completed"})
    assert response.metadata is not None and response.metadata.model == MODEL
    usage = response.metadata.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (75, 70, 51)
    assert usage.cache_read_input_tokens == 0
    stamps = {k: message.metadata[k].value() for k in message.metadata}
    assert stamps == {
        "scope/api": API,
        "scope/provider": "gcp.gemini",
        "scope/model": MODEL,
        "scope/asked": MODEL,
    }
    (recorded,) = server.requests
    assert recorded.headers["x-goog-api-key"] == KEY
    assert recorded.body["store"] is False
    assert recorded.body.get("stream", False) is (mode == "stream")
    assert recorded.body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "parameters": json.loads(WEATHER.input_schema.bytes),
        }
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_the_turn_goes_back_byte_exact_and_the_answer_decodes(
    server: InteractionsServer, mode: str
) -> None:
    server.script(_exchange("stream_tool_call", mode), _exchange("stream_final_answer", mode))
    async with _model(server) as model:
        first = await answer(model, ASK, mode)
        assert first.output is not None and first.output.message is not None
        result = ToolResult(
            "call_3345913", "get_weather", ToolOutput.of_text("Sunny, 18C, light breeze.")
        )
        follow = Request(
            [*ASK.messages, first.output.message, tool_message(result)], tools=ASK.tools
        )
        second = await answer(model, follow, mode)
    (signature,) = _signatures("stream_tool_call")
    sent = server.requests[1].body["input"]
    assert sent == [
        {
            "type": "user_input",
            "content": [{"type": "text", "text": "What is the weather in Hobart, Tasmania?"}],
        },
        {"type": "thought", "signature": signature},
        {
            "type": "function_call",
            "id": "call_3345913",
            "name": "get_weather",
            "arguments": {"location": "Hobart, Tasmania"},
        },
        {
            "type": "function_result",
            "call_id": "call_3345913",
            "name": "get_weather",
            "result": [{"type": "text", "text": "Sunny, 18C, light breeze."}],
        },
    ]
    # Byte for byte: the signature's exact text is in the wire body.
    raw = orjson.dumps(server.requests[1].body)
    assert f'"signature":"{signature}"'.encode() in raw
    assert second.output is not None and second.output.message is not None
    thought, text = second.output.message.parts
    assert thought.signature == base64.b64decode(_signatures("stream_final_answer")[0])
    assert text.text == (
        "The current weather in Hobart, Tasmania is sunny and 18°C (64°F) with a light breeze."
    )
    assert second.output.finish_reason is FinishReason.STOP


async def test_call_and_stream_give_the_same_response(server: InteractionsServer) -> None:
    for name in ("stream_tool_call", "stream_final_answer", "stream_parallel_calls"):
        server.script(_exchange(name, "call"), _exchange(name, "stream"))
        async with _model(server) as model:
            called = await model.call(ASK)
            chunks, streamed = await accumulate(model.stream(ASK))
        assert called == streamed, name
        assert all(isinstance(chunk, Response) for chunk in chunks)


@pytest.mark.parametrize("mode", MODES)
async def test_parallel_calls_follow_one_signed_thought(
    server: InteractionsServer, mode: str
) -> None:
    server.script(_exchange("stream_parallel_calls", mode))
    async with _model(server) as model:
        response = await answer(model, ASK, mode)
    assert response.output is not None and response.output.message is not None
    parts = response.output.message.parts
    assert [p.kind for p in parts] == [PartKind.REASONING] + [PartKind.TOOL_CALL] * 3
    assert [p.tool_call.arguments for p in parts[1:] if p.tool_call] == [
        '{"location":"Hobart, Australia"}',
        '{"location":"Perth, Australia"}',
        '{"location":"Darwin, Australia"}',
    ]
    body = build_body(
        Request([*ASK.messages, response.output.message]),
        default_options=Options(),
        model=MODEL,
        stream=False,
        replay=Replay(API, "gcp.gemini"),
    )
    steps = orjson.loads(orjson.dumps(body))["input"][1:]
    assert [s["type"] for s in steps] == ["thought"] + ["function_call"] * 3
    assert steps[0]["signature"] == _signatures("stream_parallel_calls")[0]


# ---------------------------------------------------------------------- errors


async def test_an_error_event_answered_with_400_is_a_bad_request(
    server: InteractionsServer,
) -> None:
    server.script(*load("signature_error")["exchanges"])
    async with _model(server) as model:
        with pytest.raises(BadRequestError) as caught:
            await model.call(ASK)
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "error": {"message": "Corrupted thought signature.", "code": "invalid_request"},
        "event_type": "error",
    }
    assert caught.value.request_id == "req_error"


async def test_an_error_event_inside_a_stream_is_raised(server: InteractionsServer) -> None:
    (exchange,) = load("signature_error")["exchanges"]
    events = _exchange("stream_tool_call", "stream")["sse"][:3]
    server.script({**exchange, "status": 200, "sse": [*events, *exchange["sse"]]})
    async with _model(server) as model:
        with pytest.raises(BadRequestError, match="Corrupted thought signature"):
            await accumulate(model.stream(ASK))


async def test_a_json_error_body_maps_by_status(server: InteractionsServer) -> None:
    server.script(
        {
            "status": 400,
            "headers": {},
            "json": {
                "error": {"message": "Unknown parameter 'tool_choice'.", "code": "invalid_request"}
            },
        }
    )
    async with _model(server) as model:
        with pytest.raises(BadRequestError, match="Unknown parameter"):
            await model.call(ASK)


def test_a_stream_that_stops_before_its_end_is_unfinished() -> None:
    mapper = EventMapper()
    for event in events_of(_exchange("stream_tool_call", "stream"))[:-1]:
        mapper.map("", orjson.dumps(event))
    assert not mapper.finish_reason_seen and not mapper.end_marker_seen


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (
            [{"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": "x"}}],
            "never started",
        ),
        (
            [
                {"event_type": "step.start", "index": 0, "step": {"type": "thought"}},
                {
                    "event_type": "step.delta",
                    "index": 0,
                    "delta": {"type": "thought_signature", "signature": "not base64!"},
                },
            ],
            "base64",
        ),
        ([{"event_type": "step.start", "index": 0, "step": {}}], "type"),
    ],
)
def test_malformed_events_are_refused(events: list[dict[str, Any]], match: str) -> None:
    mapper = EventMapper()
    with pytest.raises(InvalidResponseError, match=match):
        for event in events:
            mapper.map("", orjson.dumps(event))
