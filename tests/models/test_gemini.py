"""GeminiModel alone: every mapping of its transcripts (tests/gemini_transcripts/) by
``call`` and by ``stream`` against the loopback server (tests/gemini_server.py), under
asyncio and trio; the request bodies (checked against google-genai's types); signatures
byte for byte; options; errors. What every adapter shares is in test_http_adapters.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Options,
    Output,
    OutputFormat,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    ToolCall,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    collect,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.errors import (
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderServerError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.media import Media
from scope.metadata import Extensions, Metadata
from scope.models._gemini_wire import (
    BLOCK_REASON_KEY,
    FINISH_REASON_KEY,
    SIGNATURE_KEY,
    SIGNATURE_ONLY_KEY,
    SYNTHETIC_ID_KEY,
    ChunkMapper,
    parse_response,
)
from tests.gemini_server import GeminiServer, check_request_body, check_response, load_transcript
from tests.helpers import GEMINI, TIME, WEATHER, accumulate, body_of

pytestmark = pytest.mark.anyio

HI = Request([user_message("Hi")])


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    with GEMINI.serve() as srv:
        yield srv


def _equivalent(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The one ``generateContent`` body a stream stands for: every chunk's parts in order,
    the last chunk's finish, usage, model and id (what google-genai's chat keeps)."""
    parts = [
        p for c in chunks for cand in c.get("candidates", []) for p in cand["content"]["parts"]
    ]
    last = dict(chunks[-1])
    if "candidates" in last:
        candidate = dict(last["candidates"][0])
        candidate["content"] = {"parts": parts, "role": "model"}
        last["candidates"] = [candidate]
    return last


STREAMS = [
    "stream_text",
    "stream_parallel_tools",
    "stream_final_answer",
    "stream_blocked_prompt",
]


@pytest.mark.parametrize("name", STREAMS)
async def test_a_merged_stream_equals_call_on_the_equivalent_body(
    server: GeminiServer, name: str
) -> None:
    exchange = load_transcript(name)[0]
    server.script(exchange)
    async with GEMINI.make(server.base_url) as model:
        chunks, streamed = await accumulate(model.stream(HI))
    assert len(chunks) == len(exchange["sse"])
    for chunk in exchange["sse"]:
        check_response(chunk)
    assert streamed == _as_answered(parse_response(orjson.dumps(_equivalent(exchange["sse"]))))
    (recorded,) = server.requests
    assert recorded.path == "/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse"
    assert recorded.headers["x-goog-api-key"] == GEMINI.api_key


def _as_answered(response: Response) -> Response:
    """``response`` as the adapter answers it: its message stamped with its provenance
    (DESIGN §6c; the model that answered)."""
    output = response.output
    if output is None or output.message is None:
        return response
    assert response.metadata is not None
    message = GEMINI.own(output.message, response.metadata.model, asked=GEMINI.model)
    return attrs.evolve(response, output=attrs.evolve(output, message=message))


def _transcript_response(name: str) -> dict[str, Any]:
    body: dict[str, Any] = load_transcript(name)[0]["json"]
    check_response(body)
    return body


async def test_text_with_usage_and_signature(server: GeminiServer) -> None:
    body = _transcript_response("text")
    server.script(*load_transcript("text"))
    async with GEMINI.make(server.base_url) as model:
        response = await model.call(HI)
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part.kind is PartKind.TEXT and part.text == "The capital of France is Paris."
    signature = body["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    assert part.metadata == Metadata({SIGNATURE_KEY: signature})
    assert response.output.finish_reason is FinishReason.STOP
    assert response.output.metadata is not None
    assert response.output.metadata.extra == Metadata({FINISH_REASON_KEY: "STOP"})
    assert response.metadata is not None
    assert (response.metadata.id, response.metadata.model) == (
        "bXdTaYv8Lb2nz7IP1",
        "gemini-3-pro-preview",
    )
    usage = response.metadata.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (8, 28, 21)
    assert usage.cache_read_input_tokens is None
    assert server.requests[0].path == GEMINI.path


async def test_a_tool_call_without_id_gets_one_that_is_never_sent_back(
    server: GeminiServer,
) -> None:
    first, second = load_transcript("tool_turn")
    server.script(first, second)
    signature = first["json"]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    async with GEMINI.make(server.base_url) as model:
        request = Request([user_message("Weather in Paris?")], tools=[WEATHER])
        response = await model.call(request)
        assert response.output is not None and response.output.message is not None
        assert response.output.finish_reason is FinishReason.TOOL_CALLS
        (part,) = response.output.message.parts
        assert part.tool_call == ToolCall("dG9vbC0x-1", "get_weather", '{"city":"Paris"}')
        assert part.metadata == Metadata({SIGNATURE_KEY: signature, SYNTHETIC_ID_KEY: True})
        assert response.metadata is not None
        assert response.metadata.usage.output_tokens == 15 + 88
        result = ToolResult(part.tool_call.id, "get_weather", ToolOutput.of_text("18C, sunny"))
        final = await model.call(
            Request(
                [*request.messages, response.output.message, tool_message(result)], tools=[WEATHER]
            )
        )
    assert final.metadata is not None and final.metadata.usage.cache_read_input_tokens == 32
    body = server.requests[1].body
    assert body["contents"][1] == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                "thoughtSignature": signature,
            }
        ],
    }
    assert body["contents"][2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"result": "18C, sunny"}}}
        ],
    }
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "The current weather in a city.",
                    "parametersJsonSchema": json.loads(WEATHER.input_schema.bytes),
                }
            ]
        }
    ]


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_signatures_are_kept_in_order_and_sent_back_byte_exact(
    server: GeminiServer, mode: str
) -> None:
    exchange = load_transcript("signatures")[0]
    wire_parts = exchange["json"]["candidates"][0]["content"]["parts"]
    if mode == "stream":  # the same parts, one per chunk, the finish on the last
        body = exchange["json"]
        chunks = []
        for index, part in enumerate(wire_parts):
            candidate: dict[str, Any] = {"content": {"parts": [part], "role": "model"}, "index": 0}
            if index == len(wire_parts) - 1:
                candidate["finishReason"] = "STOP"
            chunks.append({**body, "candidates": [candidate]})
        exchange = {"status": 200, "sse": chunks}
    server.script(exchange)
    async with GEMINI.make(server.base_url) as model:
        if mode == "call":
            response = await model.call(HI)
        else:
            _, response = await accumulate(model.stream(HI))
        assert response.output is not None and response.output.message is not None
        message = response.output.message
        kinds = [p.kind for p in message.parts]
        assert kinds == [PartKind.REASONING, PartKind.MEDIA, PartKind.TEXT, PartKind.REASONING]
        thought, image, text, tail = message.parts
        assert thought.signature == base64.b64decode(wire_parts[0]["thoughtSignature"])
        assert thought.metadata == Metadata()  # standard base64: the bytes say it all
        assert image.media == Media.from_bytes("image/png", b"\x89PNG\r\n\x1a\nfake")
        assert image.metadata == Metadata({SIGNATURE_KEY: wire_parts[1]["thoughtSignature"]})
        url_safe = wire_parts[2]["thoughtSignature"]
        assert "-" in url_safe or "_" in url_safe
        assert text.metadata == Metadata({SIGNATURE_KEY: url_safe})
        assert tail.text == "" and tail.metadata == Metadata({SIGNATURE_ONLY_KEY: True})
        assert tail.signature == base64.b64decode(wire_parts[3]["thoughtSignature"])
        server.script(*load_transcript("text"))
        await model.call(Request([user_message("Hi"), message, user_message("Again")]))
    sent = server.requests[1].body["contents"][1]
    assert sent["role"] == "model"
    assert sent["parts"] == wire_parts  # every part, every signature, as received


async def test_parallel_calls_keep_ids_and_only_the_first_signature(
    server: GeminiServer,
) -> None:
    exchange = load_transcript("stream_parallel_tools")[0]
    server.script(exchange, *load_transcript("text"))
    wire = exchange["sse"][-1]["candidates"][0]["content"]["parts"]
    async with GEMINI.make(server.base_url) as model:
        request = Request([user_message("Weather and time?")], tools=[WEATHER, TIME])
        _, response = await accumulate(model.stream(request))
        assert response.output is not None and response.output.message is not None
        message = response.output.message
        assert response.output.finish_reason is FinishReason.TOOL_CALLS
        assert message.parts[0].kind is PartKind.REASONING
        assert message.parts[0].text == "**Checking both**\nI need the weather and the local time."
        weather, time_ = message.tool_calls
        assert (weather.id, time_.id) == ("fc_weather_1", "fc_time_1")
        assert message.parts[1].metadata == Metadata({SIGNATURE_KEY: wire[0]["thoughtSignature"]})
        assert message.parts[2].metadata == Metadata()
        results = tool_message(
            ToolResult("fc_weather_1", "get_weather", ToolOutput.of_json({"temp": 18})),
            ToolResult("fc_time_1", "get_time", ToolOutput.of_text("no clock"), is_error=True),
        )
        await model.call(
            Request(
                [*request.messages, message, results, user_message("Thanks")], tools=[WEATHER, TIME]
            )
        )
    body = server.requests[1].body
    # The unsigned thought summary is not sent back; the calls go back as received.
    assert body["contents"][1] == {"role": "model", "parts": wire}
    assert body["contents"][2] == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": "fc_weather_1",
                    "name": "get_weather",
                    "response": {"temp": 18},
                }
            },
            {
                "functionResponse": {
                    "id": "fc_time_1",
                    "name": "get_time",
                    "response": {"error": "no clock"},
                }
            },
            {"text": "Thanks"},
        ],
    }


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_a_blocked_prompt_is_a_content_filter_answer_without_a_message(
    server: GeminiServer, mode: str
) -> None:
    name = "blocked_prompt" if mode == "call" else "stream_blocked_prompt"
    server.script(*load_transcript(name))
    async with GEMINI.make(server.base_url) as model:
        if mode == "call":
            response = await model.call(HI)
        else:
            _, response = await accumulate(model.stream(HI))
    assert response.output is not None and response.output.message is None
    assert response.output.finish_reason is FinishReason.CONTENT_FILTER
    assert response.metadata is not None
    reason = "PROHIBITED_CONTENT" if mode == "call" else "SAFETY"
    assert response.metadata.extra == Metadata({BLOCK_REASON_KEY: reason})
    assert response.metadata.usage.input_tokens == 12
    # The history stores no answer without a message.
    store = InMemoryStore()
    server.script(*load_transcript(name))
    async with GEMINI.make(server.base_url) as model:
        with pytest.raises(InvalidResponseError):
            if mode == "call":
                await wrap(model, Middleware(store, store, "c").call).call(HI)
            else:
                await collect(wrap_stream(model, Middleware(store, store, "c").stream).stream(HI))
    assert await store.read("c") == []


@pytest.mark.parametrize(
    ("name", "finish", "texts"),
    [
        ("safety_finish", FinishReason.CONTENT_FILTER, ["Here is how"]),
        ("max_tokens", FinishReason.LENGTH, ["Let me think about the", "The answer begins"]),
    ],
)
async def test_finish_reasons(
    server: GeminiServer, name: str, finish: FinishReason, texts: list[str]
) -> None:
    raw = _transcript_response(name)["candidates"][0]["finishReason"]
    server.script(*load_transcript(name))
    async with GEMINI.make(server.base_url) as model:
        response = await model.call(HI)
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is finish
    assert [p.text for p in response.output.message.parts] == texts
    assert response.output.metadata is not None
    assert response.output.metadata.extra == Metadata({FINISH_REASON_KEY: raw})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("STOP", FinishReason.STOP),
        ("MAX_TOKENS", FinishReason.LENGTH),
        ("SAFETY", FinishReason.CONTENT_FILTER),
        ("RECITATION", FinishReason.CONTENT_FILTER),
        ("BLOCKLIST", FinishReason.CONTENT_FILTER),
        ("PROHIBITED_CONTENT", FinishReason.CONTENT_FILTER),
        ("SPII", FinishReason.CONTENT_FILTER),
        ("MALFORMED_FUNCTION_CALL", FinishReason.OTHER),
        ("LANGUAGE", FinishReason.OTHER),
    ],
)
def test_every_finish_reason(raw: str, expected: FinishReason) -> None:
    body = {
        "candidates": [
            {"content": {"parts": [{"text": "x"}], "role": "model"}, "finishReason": raw}
        ]
    }
    check_response(body)
    response = parse_response(orjson.dumps(body))
    assert response.output is not None and response.output.finish_reason is expected


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_an_invalid_api_key_is_an_authentication_error(
    server: GeminiServer, mode: str
) -> None:
    server.script(*load_transcript("api_key_invalid"))
    model, sleeps = GEMINI.recorded(server)
    async with model:
        with pytest.raises(AuthenticationError, match="API key not valid") as info:
            if mode == "call":
                await model.call(HI)
            else:
                await accumulate(model.stream(HI))
    assert (info.value.status_code, info.value.request_id) == (400, "req_key_1")
    assert info.value.body["error"]["status"] == "INVALID_ARGUMENT"
    assert sleeps.delays == []


async def test_a_plain_400_stays_a_bad_request(server: GeminiServer) -> None:
    body = load_transcript("api_key_invalid")[0]["json"]
    body["error"]["details"][0]["reason"] = "SOMETHING_ELSE"
    server.script({"status": 400, "json": body})
    async with GEMINI.make(server.base_url) as model:
        with pytest.raises(BadRequestError):
            await model.call(HI)


async def test_the_retry_delay_of_the_body(server: GeminiServer) -> None:
    server.script(load_transcript("rate_limit_then_ok")[0])
    model, _ = GEMINI.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(HI)
    assert info.value.retry_after == 2.0
    # A Retry-After header wins over the body.
    exchange = load_transcript("rate_limit_then_ok")[0]
    exchange["headers"]["retry-after"] = "5"
    server.script(exchange)
    model, _ = GEMINI.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(RateLimitError) as info:
            await model.call(HI)
    assert info.value.retry_after == 5.0


async def test_errors_as_json_under_an_event_stream_type(server: GeminiServer) -> None:
    server.script(*load_transcript("stream_error_json"))
    model, _ = GEMINI.recorded(server, max_retries=0)
    async with model:
        with pytest.raises(BadRequestError, match="Invalid JSON payload") as bad:
            await accumulate(model.stream(HI))
        with pytest.raises(ProviderServerError, match="internal error") as internal:
            await accumulate(model.stream(HI))
    assert bad.value.status_code == 400 and bad.value.body["error"]["status"] == "INVALID_ARGUMENT"
    assert (internal.value.status_code, internal.value.request_id) == (500, "req_sj_2")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"candidates": {}}, r"response\.candidates must be an array"),
        (
            {"candidates": [{"content": {"parts": [{"text": 1}]}}]},
            r"response\.candidates\[0\]\.content\.parts\[0\]\.text must be a string",
        ),
        (
            {"candidates": [{"content": {"parts": [{"text": "", "thoughtSignature": "%%"}]}}]},
            r"parts\[0\]\.thoughtSignature is not base64",
        ),
        (
            {"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": []}}]}}]},
            r"functionCall\.args must be an object",
        ),
        (
            {"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]},
            r"functionCall.*name",
        ),
        ({"candidates": [{"finishReason": 3}]}, r"finishReason must be a string"),
        ({"usageMetadata": {"promptTokenCount": -1}}, r"promptTokenCount must be a non-negative"),
        (
            {"candidates": [{"content": {"parts": [{"text": "x", "thought": "yes"}]}}]},
            r"thought must be a boolean",
        ),
        ({"responseId": " x"}, r"responseId must not have surrounding whitespace"),
    ],
)
def test_malformed_responses_are_refused(body: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidResponseError, match=match):
        parse_response(orjson.dumps(body))


# ---------------------------------------------------------------------------- request


def test_options_map_to_generation_config() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "number", "minimum": 1.50}}}
    options = Options(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        max_tokens=256,
        stop=("END",),
        presence_penalty=0.1,
        frequency_penalty=-0.2,
        reasoning_effort="high",
        output_format=OutputFormat.json_schema("answer", schema),
        extensions=Extensions(
            {
                "gemini/safetySettings": [
                    {"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}
                ],
                "gemini/generationConfig": {"seed": 7},
                "openai/store": True,
            }
        ),
    )
    body = body_of(
        GEMINI, Request([system_message("Be brief."), user_message("Hi")], options=options)
    )
    check_request_body(body)
    assert body["generationConfig"] == {
        "temperature": 0.5,
        "topP": 0.9,
        "topK": 40,
        "maxOutputTokens": 256,
        "presencePenalty": 0.1,
        "frequencyPenalty": -0.2,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
        "seed": 7,
    }
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["safetySettings"][0]["threshold"] == "BLOCK_NONE"
    assert set(body) == {"contents", "systemInstruction", "generationConfig", "safetySettings"}
    none = body_of(
        GEMINI, Request([user_message("Hi")], options=Options(reasoning_effort="none", stop=()))
    )
    assert none["generationConfig"] == {"thinkingConfig": {"thinkingBudget": 0}}
    json_only = body_of(
        GEMINI, Request([user_message("Hi")], options=Options(output_format=OutputFormat.json()))
    )
    assert json_only["generationConfig"] == {"responseMimeType": "application/json"}


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (
            Request([user_message("Hi")], options=Options(reasoning_effort="extreme")),
            "reasoning_effort 'extreme' has no Gemini thinking level",
        ),
        (
            Request(
                [user_message("Hi")],
                options=Options(extensions=Extensions({"gemini/contents": []})),
            ),
            "extension 'gemini/contents' would overwrite",
        ),
        (
            Request(
                [user_message("Hi")], options=Options(extensions=Extensions({"gemini/tools": []}))
            ),
            "extension 'gemini/tools' would overwrite",
        ),
        (
            Request(
                [user_message("Hi")],
                options=Options(
                    temperature=1,
                    extensions=Extensions({"gemini/generationConfig": {"temperature": 0}}),
                ),
            ),
            "sets 'temperature', which the options already set",
        ),
        (
            Request(
                [user_message("Hi")],
                options=Options(extensions=Extensions({"gemini/generationConfig": [1]})),
            ),
            "'gemini/generationConfig' must be a JSON object",
        ),
        (
            Request(
                [
                    user_message(
                        text_part("Hi"), media_part(Media.from_reference("image/png", "files/abc"))
                    )
                ]
            ),
            r"messages\[0\]\.parts\[1\]: media by reference",
        ),
        (
            Request(
                [user_message("Hi"), assistant_message(tool_call_part("c1", "get_weather", "[1]"))],
                tools=[WEATHER],
            ),
            r"messages\[1\]\.parts\[0\]: tool call arguments must be a JSON object",
        ),
        (
            Request(
                [
                    user_message("Hi"),
                    assistant_message(tool_call_part("c1", "get_weather", "{oops")),
                ],
                tools=[WEATHER],
            ),
            r"messages\[1\]\.parts\[0\]: tool call arguments are not JSON",
        ),
        (
            Request(
                [
                    user_message("Hi"),
                    assistant_message(tool_call_part("c1", "get_weather", "{}")),
                    tool_message(
                        ToolResult(
                            "c1",
                            "get_weather",
                            ToolOutput([media_part(Media.from_bytes("image/png", b"x"))]),
                        )
                    ),
                ],
                tools=[WEATHER],
            ),
            r"messages\[2\]\.parts\[0\]\.output: tool results with media",
        ),
    ],
)
def test_unsupported_requests_are_refused_before_io(request_: Request, match: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=match):
        body_of(GEMINI, request_)


def test_unsigned_reasoning_is_left_out_and_media_goes_inline_or_by_uri() -> None:
    request = Request(
        [
            user_message(
                text_part("Look"),
                media_part(Media.from_bytes("image/png", b"\x00\x01")),
                media_part(Media.from_uri("application/pdf", "https://example.com/a.pdf")),
            ),
            assistant_message(reasoning_part("thinking aloud"), "Seen."),
            assistant_message(reasoning_part("only this")),
            user_message("And?"),
        ]
    )
    body = body_of(GEMINI, request)
    check_request_body(body)
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "Look"},
                {"inlineData": {"mimeType": "image/png", "data": "AAE="}},
                {
                    "fileData": {
                        "mimeType": "application/pdf",
                        "fileUri": "https://example.com/a.pdf",
                    }
                },
            ],
        },
        {"role": "model", "parts": [{"text": "Seen."}]},
        {"role": "user", "parts": [{"text": "And?"}]},
    ]


def test_the_model_of_the_options_picks_the_url() -> None:
    from scope.models._gemini_wire import route

    assert route("gemini-2.5-flash", False) == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert route("models/gemini-2.5-flash", True) == (
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )
    assert route("a b/c", False) == "/v1beta/models/a%20b%2Fc:generateContent"


async def test_options_model_reaches_the_path(server: GeminiServer) -> None:
    server.script(*load_transcript("text"))
    async with GEMINI.make(server.base_url) as model:
        await model.call(Request([user_message("Hi")], options=Options(model="gemini-2.5-pro")))
    assert server.requests[0].path == "/v1beta/models/gemini-2.5-pro:generateContent"


def test_adjacent_signed_thoughts_stay_apart() -> None:
    sig_a, sig_b = base64.b64encode(b"a" * 9).decode(), base64.b64encode(b"b" * 9).decode()
    body = {
        "candidates": [
            {
                "content": {
                    "parts": [
                        {"text": "one", "thought": True, "thoughtSignature": sig_a},
                        {"text": "two", "thought": True, "thoughtSignature": sig_b},
                        {"text": "three", "thought": True},
                    ]
                },
                "finishReason": "STOP",
            }
        ]
    }
    response = parse_response(orjson.dumps(body))
    assert response.output is not None and response.output.message is not None
    parts = response.output.message.parts
    assert [(p.text, p.signature) for p in parts] == [
        ("one", b"a" * 9),
        ("two", b"b" * 9),
        ("three", b""),
    ]
    own = GEMINI.own(response.output.message)
    sent = body_of(GEMINI, Request([user_message("Hi"), own, user_message("More")]))
    assert sent["contents"][1]["parts"] == body["candidates"][0]["content"]["parts"][:2]


# ------------------------------------------------------------------ stream hot path


def _sse_chunk(parts: list[dict[str, Any]], **members: Any) -> dict[str, Any]:
    return {"candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0}], **members}


def test_a_stream_sends_its_metadata_only_when_it_changes() -> None:
    usage_1 = {"promptTokenCount": 5, "candidatesTokenCount": 1}
    usage_2 = {"promptTokenCount": 5, "candidatesTokenCount": 2}
    meta = {"responseId": "r1", "modelVersion": "gemini-2.5-flash"}
    events = [
        _sse_chunk([{"text": "a"}], usageMetadata=usage_1, **meta),
        _sse_chunk([{"text": "b"}], usageMetadata=usage_1, **meta),  # repeated: none
        _sse_chunk([{"text": "c"}], usageMetadata=usage_2, **meta),  # usage changed
        _sse_chunk([{"text": "d"}], usageMetadata=usage_2, **meta),
    ]
    final = _sse_chunk([{"text": "e"}], usageMetadata=usage_2, **meta)
    final["candidates"][0]["finishReason"] = "STOP"
    mapper = ChunkMapper()
    chunks = [mapper.map("message", orjson.dumps(event)) for event in [*events, final]]
    assert [chunk is not None and chunk.metadata is not None for chunk in chunks] == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert chunks[1] == Response(Output(assistant_message("b")))
    assert chunks[2] is not None and chunks[2].metadata == ResponseMetadata(
        "r1", "gemini-2.5-flash", Usage(5, 2)
    )
    merged = ResponseAccumulator()
    for chunk in chunks:
        assert chunk is not None
        merged.add(chunk)
    # The merge is what one body with the last chunk's metadata gives.
    assert merged.response() == parse_response(orjson.dumps(_equivalent([*events, final])))


def test_a_changed_usage_is_still_checked() -> None:
    mapper = ChunkMapper()
    mapper.map("message", orjson.dumps(_sse_chunk([{"text": "a"}], usageMetadata={})))
    bad = _sse_chunk([{"text": "b"}], usageMetadata={"candidatesTokenCount": -1})
    with pytest.raises(
        InvalidResponseError,
        match=r"^stream event\.usageMetadata\.candidatesTokenCount must be a non-negative",
    ):
        mapper.map("message", orjson.dumps(bad))
    huge = _sse_chunk(
        [{"text": "b"}], usageMetadata={"promptTokenCount": 2**63 - 1, "candidatesTokenCount": 1}
    )
    with pytest.raises(
        InvalidResponseError,
        match=r"^stream event\.usageMetadata: input_tokens \+ output_tokens must be below",
    ):
        mapper.map("message", orjson.dumps(huge))
    with pytest.raises(
        InvalidResponseError, match=r"^stream event\.modelVersion must be a string, got a number"
    ):
        mapper.map("message", orjson.dumps(_sse_chunk([{"text": "b"}], modelVersion=1)))


_SIGNATURE = base64.b64encode(b"sig").decode()
_WIRE_PARTS = [
    {"text": "plain"},
    {"text": "signed", "thoughtSignature": _SIGNATURE},
    {"text": "thought", "thought": True},
    {"text": "signed thought", "thought": True, "thoughtSignature": _SIGNATURE},
    {"text": "", "thoughtSignature": _SIGNATURE},
    {"functionCall": {"name": "f", "args": {"x": 1}}},
    {"text": ""},
]


@settings(max_examples=500)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(_WIRE_PARTS), min_size=0, max_size=2),
            st.sampled_from([None, {"promptTokenCount": 1}, {"promptTokenCount": 2}]),
            st.sampled_from([None, "r1", "r2"]),
        ),
        max_size=8,
    )
)
@example(  # a plain text part counts as a wire part: the next signed thoughts' index
    [([_WIRE_PARTS[0]], None, None), ([_WIRE_PARTS[3]], None, None), ([_WIRE_PARTS[2]], None, None)]
)
def test_the_text_hot_path_maps_exactly_like_the_general_path(
    events: list[tuple[list[dict[str, Any]], Any, Any]],
) -> None:
    fast, general = ChunkMapper(), ChunkMapper()
    for parts, usage, response_id in events:
        body = _sse_chunk(parts, usageMetadata=usage, responseId=response_id)
        # chunk() takes the hot path when it can; _chunk() is the general path.
        data = orjson.dumps(body)
        assert fast.chunk(body, "stream event", data) == general._chunk(body, "stream event", data)
