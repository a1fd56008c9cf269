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
    Message,
    NativeItem,
    Options,
    OutputFormat,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    ToolCall,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import BadRequestError, InvalidResponseError, UnsupportedOptionError
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.metadata import Extensions, Metadata
from scope.models._interactions_wire import (
    API,
    INTERACTION_KEY,
    STATUS_KEY,
    STEP_KEY,
    EventMapper,
    build_body,
    parse_response,
)
from scope.models._provenance import Replay
from scope.models.gemini import GeminiInteractionsModel
from tests.gemini_interactions_server import (
    InteractionsServer,
    assembled,
    check_interaction,
    check_request_body,
    disassembled,
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


# ------------------------------------------- steps scope keeps whole (invented answer)


def _unary(mode: str) -> dict[str, Any]:
    (exchange,) = load("unary_server_tools")["exchanges"]
    check_interaction(exchange["json"])
    if mode == "call":
        return exchange
    return {"status": 200, "headers": exchange["headers"], "sse": disassembled(exchange["json"])}


@pytest.mark.parametrize("mode", MODES)
async def test_unmodelled_steps_are_kept_whole_in_order(
    server: InteractionsServer, mode: str
) -> None:
    body = load("unary_server_tools")["exchanges"][0]["json"]
    server.script(_unary(mode))
    async with _model(server) as model:
        response = await answer(model, ASK, mode)
    assert response.output is not None and response.output.message is not None
    message = response.output.message
    thought, call, result, text, image = message.parts
    assert thought.kind is PartKind.REASONING
    assert thought.text == "**Searching**\n\nI should look this up. Then answer."
    assert thought.signature == b"invented-thought-signature"
    assert [call.kind, result.kind] == [PartKind.NATIVE, PartKind.NATIVE]
    assert call.native == NativeItem(
        API, "google_search_call", RawJSON.from_value(body["steps"][2])
    )
    assert result.native == NativeItem(
        API, "google_search_result", RawJSON.from_value(body["steps"][3])
    )
    assert text.text == "Team A won the final." and text.metadata == _step(3)
    assert image.media == Media.from_bytes("image/png", base64.b64decode("iVBORw0KGgo="))
    assert message.metadata[INTERACTION_KEY].value() == "v1_invented_interaction_1"
    assert response.output.finish_reason is FinishReason.STOP
    # Message metadata (stored with the turn), by call and by stream alike.
    annotations = message.metadata["gemini/annotations"].value()
    assert annotations == {"3": body["steps"][4]["content"][0]["annotations"]}
    assert response.metadata is not None
    usage = response.metadata.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (40, 42, 30)
    assert usage.cache_read_input_tokens == 8


async def test_call_and_stream_agree_on_the_invented_answer(server: InteractionsServer) -> None:
    server.script(_unary("call"), _unary("stream"))
    async with _model(server) as model:
        called = await model.call(ASK)
        _, streamed = await accumulate(model.stream(ASK))
    assert called == streamed


async def test_native_steps_go_back_verbatim_in_position_to_their_own_model(
    server: InteractionsServer,
) -> None:
    body = load("unary_server_tools")["exchanges"][0]["json"]
    server.script(_unary("call"), _exchange("stream_final_answer", "call"))
    async with _model(server) as model:
        first = await model.call(ASK)
        assert first.output is not None and first.output.message is not None
        follow = Request([*ASK.messages, first.output.message, user_message("Thanks!")])
        second = await model.call(follow)
    assert second.metadata is not None
    assert "scope/dropped_parts" not in second.metadata.extra
    sent = server.requests[1].body["input"]
    assert sent[1] == {
        "type": "thought",
        "signature": body["steps"][1]["signature"],
        "summary": [
            {"type": "text", "text": "**Searching**\n\nI should look this up. Then answer."}
        ],
    }
    assert sent[2] == body["steps"][2] and sent[3] == body["steps"][3]
    assert sent[4] == {
        "type": "model_output",
        "content": [
            {"type": "text", "text": "Team A won the final."},
            {"type": "image", "mime_type": "image/png", "data": "iVBORw0KGgo="},
        ],
    }
    assert sent[5] == {"type": "user_input", "content": [{"type": "text", "text": "Thanks!"}]}


def test_another_models_state_is_left_out_and_counted() -> None:
    body = load("unary_server_tools")["exchanges"][0]["json"]
    answer_ = parse_response(orjson.dumps(body))
    assert answer_.output is not None and answer_.output.message is not None
    produced = Replay(API, "gcp.gemini", model="gemini-3.7-flash").stamp(
        answer_.output.message, "gemini-3.7-flash"
    )
    replay = Replay(API, "gcp.gemini")
    sent = build_body(
        Request([*ASK.messages, produced, user_message("Thanks!")]),
        default_options=Options(),
        model="gemini-3.6-flash",
        stream=False,
        replay=replay,
    )
    steps = orjson.loads(orjson.dumps(sent))["input"]
    assert [s["type"] for s in steps] == ["user_input", "model_output", "user_input"]
    assert len(replay.left_out) == 3  # the thought and the two search steps


# --------------------------------------------------------------------- options


def _body(request: Request, **kwargs: Any) -> dict[str, Any]:
    built = build_body(request, default_options=Options(), model=MODEL, stream=False, **kwargs)
    body: dict[str, Any] = orjson.loads(orjson.dumps(built))
    check_request_body(body)
    return body


def test_options_map_to_the_body() -> None:
    schema = RawJSON.parse('{"type":"object","properties":{"a":{"type":"string"}}}')
    request = Request(
        [system_message("Be brief."), system_message("Be kind."), user_message("Hi")],
        options=Options(
            max_tokens=100,
            stop=("END",),
            reasoning_effort="low",
            output_format=OutputFormat.json_schema("answer", schema),
            extensions=Extensions(
                {
                    "gemini-interactions/generation_config": {"seed": 7},
                    "gemini-interactions/service_tier": "flex",
                    "gemini/safetySettings": [],
                }
            ),
        ),
    )
    body = _body(request)
    assert body["system_instruction"] == "Be brief.\n\nBe kind."
    assert body["generation_config"] == {
        "max_output_tokens": 100,
        "stop_sequences": ["END"],
        "thinking_level": "low",
        "thinking_summaries": "auto",
        "seed": 7,
    }
    assert body["response_format"] == {
        "type": "text",
        "mime_type": "application/json",
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    assert body["service_tier"] == "flex"
    assert "safetySettings" not in body  # another adapter's extension
    assert body["store"] is False and "previous_interaction_id" not in body


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (Request([user_message("Hi")], options=Options(top_k=3)), "top_k"),
        (Request([user_message("Hi")], options=Options(temperature=0.2)), "temperature"),
        (Request([user_message("Hi")], options=Options(top_p=0.5)), "top_p"),
        (Request([user_message("Hi")], options=Options(presence_penalty=0.1)), "presence"),
        (Request([user_message("Hi")], options=Options(reasoning_effort="none")), "thinking"),
        (
            Request(
                [user_message("Hi")],
                options=Options(extensions=Extensions({"gemini-interactions/input": "other"})),
            ),
            "input",
        ),
        (
            Request(
                [user_message("Hi")],
                options=Options(
                    max_tokens=5,
                    extensions=Extensions(
                        {"gemini-interactions/generation_config": {"max_output_tokens": 9}}
                    ),
                ),
            ),
            "already",
        ),
        (
            Request(
                [
                    user_message("Hi"),
                    assistant_message(tool_call_part("c1", "f", "[1]")),
                    tool_message(ToolResult("c1", "f")),
                ],
                tools=[ToolDefinition("f", RawJSON.parse('{"type":"object"}'))],
            ),
            "JSON object",
        ),
        (
            Request([user_message(media_part(Media.from_reference("application/pdf", "f1")))]),
            "reference",
        ),
    ],
)
async def test_unsupported_requests_are_refused_before_io(
    server: InteractionsServer, request_: Request, match: str
) -> None:
    async with _model(server) as model:
        with pytest.raises(UnsupportedOptionError, match=match):
            await model.call(request_)
        with pytest.raises(UnsupportedOptionError, match=match):
            await accumulate(model.stream(request_))
    assert server.requests == []


def test_a_foreign_call_of_this_turn_gets_the_placeholder_thought() -> None:
    call = assistant_message(tool_call_part("c1", "get_weather", '{"location":"x"}'))
    request = Request(
        [*ASK.messages, call, tool_message(ToolResult("c1", "get_weather"))], tools=ASK.tools
    )
    steps = _body(request)["input"]
    assert steps[1] == {"type": "thought", "signature": "skip_thought_signature_validator"}
    assert steps[2]["type"] == "function_call" and "signature" not in steps[2]
    # An earlier turn's foreign call needs none.
    steps = _body(Request([*request.messages, user_message("And now?")]))["input"]
    assert [s["type"] for s in steps] == [
        "user_input",
        "function_call",
        "function_result",
        "user_input",
    ]


def test_media_in_and_tool_results_out() -> None:
    image = Media.from_bytes("image/png", b"\x89PNG")
    doc = Media.from_uri(
        "application/pdf", "https://generativelanguage.googleapis.com/v1beta/files/f"
    )
    request = Request(
        [
            user_message("Look", media_part(image), media_part(doc)),
            assistant_message(tool_call_part("c1", "get_weather", "")),
            tool_message(
                ToolResult("c1", "get_weather", ToolOutput.of_text('{"t": 18}')),
            ),
            assistant_message(tool_call_part("c2", "get_weather", "{}")),
            tool_message(
                ToolResult("c2", "get_weather", ToolOutput.of_text("boom"), is_error=True)
            ),
        ],
        tools=ASK.tools,
    )
    steps = _body(request)["input"]
    assert steps[0]["content"][1:] == [
        {"type": "image", "mime_type": "image/png", "data": base64.b64encode(b"\x89PNG").decode()},
        {"type": "document", "mime_type": "application/pdf", "uri": doc.source.uri},
    ]
    assert steps[2]["arguments"] == {}
    assert steps[3]["result"] == {"t": 18}
    assert steps[-1] == {
        "type": "function_result",
        "call_id": "c2",
        "name": "get_weather",
        "result": [{"type": "text", "text": "boom"}],
        "is_error": True,
    }


def test_unsigned_or_foreign_reasoning_is_left_out() -> None:
    replay = Replay(API, "gcp.gemini")
    request = Request(
        [
            user_message("Hi"),
            assistant_message(reasoning_part("thinking"), "Hello"),
            user_message("x"),
        ]
    )
    steps = _body(request, replay=replay)["input"]
    assert [s["type"] for s in steps] == ["user_input", "model_output", "user_input"]
    assert len(replay.left_out) == 1


# ---------------------------------------------------------------- server-side state


async def test_store_stamps_the_interaction_and_continues_from_it(
    server: InteractionsServer,
) -> None:
    body = load("unary_server_tools")["exchanges"][0]["json"]
    server.script(_unary("call"), _exchange("stream_final_answer", "call"))
    async with _model(server, store=True) as model:
        assert model.store is True
        first = await model.call(ASK)
        assert first.output is not None and first.output.message is not None
        follow = Request(
            [
                system_message("Be brief."),
                *ASK.messages,
                first.output.message,
                user_message("Thanks!"),
            ],
            tools=ASK.tools,
        )
        await model.call(follow)
    assert server.requests[0].body["store"] is True
    sent = server.requests[1].body
    assert sent["store"] is True
    assert sent["previous_interaction_id"] == body["id"]
    assert sent["input"] == [
        {"type": "user_input", "content": [{"type": "text", "text": "Thanks!"}]}
    ]
    assert sent["system_instruction"] == "Be brief." and sent["tools"]


async def test_without_store_the_whole_history_goes_and_no_previous_id(
    server: InteractionsServer,
) -> None:
    server.script(_unary("call"), _exchange("stream_final_answer", "call"))
    async with _model(server) as model:
        first = await model.call(ASK)
        assert first.output is not None and first.output.message is not None
        await model.call(Request([*ASK.messages, first.output.message, user_message("Thanks!")]))
    sent = server.requests[1].body
    assert "previous_interaction_id" not in sent and len(sent["input"]) == 6


def test_store_must_be_a_bool() -> None:
    with pytest.raises(TypeError):
        GeminiInteractionsModel(MODEL, store="yes")  # type: ignore[arg-type]


def test_the_revision_header_is_sent() -> None:
    model = GeminiInteractionsModel(MODEL, api_key="k")
    assert model._headers["Api-Revision"] == "2026-05-20"
    assert model._headers["x-goog-api-key"] == "k"


# ------------------------------------------- between generateContent and Interactions


async def test_a_turn_moves_between_generate_content_and_interactions(
    server: InteractionsServer,
) -> None:
    from scope.models import _gemini_wire
    from tests.gemini_server import check_request_body as check_generate_content
    from tests.gemini_server import load_transcript
    from tests.helpers import GEMINI

    # A turn GeminiModel produced (a signed function call, then a signed answer) ...
    with GEMINI.serve() as gemini_server:
        gemini_server.script(*load_transcript("tool_turn"))
        async with GEMINI.make(gemini_server.base_url) as gemini:
            paused = await gemini.call(ASK)
            assert paused.output is not None and paused.output.message is not None
            (call,) = paused.output.message.tool_calls
            results = tool_message(ToolResult(call.id, call.name, ToolOutput.of_text("18C")))
            done = await gemini.call(Request([*ASK.messages, paused.output.message, results]))
            assert done.output is not None and done.output.message is not None
    generated = [*ASK.messages, paused.output.message, results, done.output.message]
    # ... goes to GeminiInteractionsModel: nothing of generateContent's goes with it.
    server.script(_exchange("stream_final_answer", "call"))
    async with _model(server) as model:
        answered = await model.call(Request([*generated, user_message("Thanks!")]))
    sent = orjson.dumps(server.requests[0].body)
    for signature in (b"thoughtSignature", b"thought_signature", b"+//+Y3YPdZB19vcGf5eRsz2"):
        assert signature not in sent
    steps = server.requests[0].body["input"]
    assert [s["type"] for s in steps] == [
        "user_input",
        "function_call",
        "function_result",
        "model_output",
        "user_input",
    ]
    assert steps[1]["id"] == steps[2]["call_id"] == call.id
    # And the Interactions turn goes back to GeminiModel: no Interactions field or state.
    assert answered.output is not None and answered.output.message is not None
    follow = Request([*generated, user_message("Thanks!"), answered.output.message])
    replay = Replay(_gemini_wire.API, _gemini_wire.PROVIDER)
    built = _gemini_wire.build_body(
        Request([*follow.messages, user_message("Bye")]),
        default_options=Options(),
        model=GEMINI.model,
        stream=False,
        replay=replay,
    )
    body = orjson.loads(orjson.dumps(built))
    check_generate_content(body)
    (signature,) = _signatures("stream_final_answer")
    assert signature.encode() not in orjson.dumps(body)
    assert replay.left_out == ["messages[5].parts[0] (reasoning of another model)"]


def test_a_signature_spelled_otherwise_goes_back_as_received_with_its_summary() -> None:
    # INVENTED: a stream whose signature is unpadded (the API pads; a proxy may not).
    events = [
        {"event_type": "interaction.created", "interaction": {"id": "", "model": MODEL}},
        {"event_type": "step.start", "index": 0, "step": {"type": "thought"}},
        {
            "event_type": "step.delta",
            "index": 0,
            "delta": {"type": "thought_summary", "content": {"type": "text", "text": "plan"}},
        },
        {
            "event_type": "step.delta",
            "index": 0,
            "delta": {"type": "thought_signature", "signature": "aW52ZW50ZWQ"},
        },
        {"event_type": "step.stop", "index": 0},
        {"event_type": "step.start", "index": 1, "step": {"type": "model_output"}},
        {"event_type": "step.delta", "index": 1, "delta": {"type": "text", "text": "Done."}},
        {"event_type": "step.stop", "index": 1},
        {"event_type": "interaction.completed", "interaction": {"id": "", "status": "completed"}},
    ]
    mapper = EventMapper()
    chunks = [mapper.map("", orjson.dumps(event)) for event in events]
    accumulator = ResponseAccumulator()
    for chunk in chunks:
        if chunk is not None:
            accumulator.add(chunk)
    response = accumulator.response()
    assert response is not None and response.output is not None
    assert response.output.message is not None
    message = Replay(API, "gcp.gemini", model=MODEL).stamp(response.output.message, MODEL)
    assert [p.kind for p in message.parts] == [PartKind.REASONING] * 2 + [PartKind.TEXT]
    assert message.parts[1].signature == b"invented"
    replay = Replay(API, "gcp.gemini")
    steps = _body(Request([*ASK.messages, message, user_message("ok")]), replay=replay)["input"]
    assert steps[1] == {
        "type": "thought",
        "summary": [{"type": "text", "text": "plan"}],
        "signature": "aW52ZW50ZWQ",
    }
    assert replay.left_out == []


# ------------------------------------------------------- storage, retries, errors


@pytest.mark.parametrize("name", ["stream_tool_call", "stream_parallel_calls"])
async def test_answers_store_and_come_back_equal(server: InteractionsServer, name: str) -> None:
    from scope.codec import from_json, to_json

    server.script(_exchange(name, "stream"), _unary("call"))
    async with _model(server) as model:
        for _ in range(2):
            response = await answer(model, ASK, "stream" if not server.requests else "call")
            assert response.output is not None and response.output.message is not None
            message = response.output.message
            assert from_json(to_json(message), Message) == message


async def test_rate_limits_and_server_errors_are_retried(server: InteractionsServer) -> None:
    # INVENTED error bodies, in the shape recorded for a 400 (code, message).
    server.script(
        {
            "status": 429,
            "headers": {"Retry-After": "0"},
            "json": {"error": {"code": "resource_exhausted", "message": "Slow down."}},
        },
        {"status": 503, "headers": {}, "json": {"error": {"code": "unavailable", "message": "x"}}},
        _exchange("stream_final_answer", "call"),
    )
    model = GeminiInteractionsModel(
        MODEL, api_key=KEY, base_url=server.base_url, max_retries=2, retry_backoff=0.0
    )
    async with model:
        response = await model.call(ASK)
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert len(server.requests) == 3


async def test_a_bad_key_is_an_authentication_error(server: InteractionsServer) -> None:
    from scope.errors import AuthenticationError

    # INVENTED: Google's API_KEY_INVALID detail, as the generateContent answers carry it.
    server.script(
        {
            "status": 400,
            "headers": {},
            "json": {
                "error": {
                    "code": 400,
                    "message": "API key not valid. Please pass a valid API key.",
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                        }
                    ],
                }
            },
        }
    )
    async with _model(server) as model:
        with pytest.raises(AuthenticationError, match="API key not valid"):
            await model.call(ASK)


def test_an_echoed_input_in_a_stream_is_skipped() -> None:
    (exchange,) = load("stream_final_answer")["exchanges"]
    events = events_of(exchange)
    echo = {"type": "user_input", "content": [{"type": "text", "text": "Hi"}]}
    shifted = [
        {**event, "index": event["index"] + 1} if "index" in event else event for event in events
    ]
    stream = [
        shifted[0],
        {"event_type": "step.start", "index": 0, "step": echo},
        {"event_type": "step.stop", "index": 0},
        *shifted[1:],
    ]
    mapper, plain = EventMapper(), EventMapper()
    chunks = [c for e in stream if (c := mapper.map("", orjson.dumps(e))) is not None]
    expected = [c for e in events if (c := plain.map("", orjson.dumps(e))) is not None]
    assert chunks == expected
