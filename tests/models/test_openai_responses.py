"""OpenAIResponsesModel against a real HTTP server on loopback replaying Responses API
transcripts, and its pure wire mapping (scope/models/_responses_wire.py).

The server (tests/responses_server.py) serves the canned transcripts of
tests/responses_transcripts/ (in the shapes of recorded traffic, every event the API
sends included, those the adapter ignores too); every request body it receives is
validated with the official ``openai`` package's Responses request types when the test
ends, and every canned response and event parses with its models. Everything that does
I/O runs under asyncio and trio.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pydantic
import pytest

from scope.chat import (
    FinishReason,
    Options,
    OutputFormat,
    Part,
    PartKind,
    Request,
    Response,
    ToolCall,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    media_part,
    native_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import (
    BadRequestError,
    InvalidOptionsError,
    InvalidResponseError,
    ProviderServerError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.media import Media
from scope.metadata import Extensions, Metadata
from scope.models._responses_wire import EventMapper, build_body, parse_response, sent_item_id
from scope.models.openai import OpenAIResponsesModel
from tests.helpers import RESPONSES, TIME, WEATHER, accumulate, body_of, merged
from tests.openai_server import Recorded
from tests.responses_server import (
    TRANSCRIPTS,
    ResponsesServer,
    check_event,
    check_request_body,
    check_response,
    load_transcript,
)

QUESTION = Request([user_message("What's the weather in Paris?")], tools=[WEATHER, TIME])

server = RESPONSES.server_fixture()
make_model = RESPONSES.recorded


def _item(name: str, index: int) -> dict[str, Any]:
    """Output item ``index`` of the JSON answer of transcript ``name``."""
    item: dict[str, Any] = load_transcript(name)[0]["json"]["output"][index]
    return item


def _meta(item_id: str, **extra: Any) -> Metadata:
    return Metadata({"openai/item_id": item_id, **extra})


# ------------------------------------------------------------------------ transcripts


def test_every_transcript_is_valid_for_the_official_sdk() -> None:
    # The native_* transcripts are the API's answers as another project recorded them in
    # 2025, kept verbatim: the package's models now require fields added since
    # (usage.input_tokens_details.cache_write_tokens) and know fewer source types than
    # the API sent (a web search source of type "api"), so they are not checked here.
    names = sorted(
        path.stem for path in TRANSCRIPTS.glob("*.json") if not path.stem.startswith("native_")
    )
    assert len(names) >= 20
    seen: set[str] = set()
    for name in names:
        for exchange in load_transcript(name):
            if "json" in exchange:
                check_response(exchange["json"])
            for event in exchange.get("sse", []):
                if isinstance(event, dict) and not any(key.startswith("$") for key in event):
                    check_event(event)
                    seen.add(event["type"])
    # The events the API sends that the adapter ignores are served too.
    assert {
        "response.in_progress",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.function_call_arguments.done",
        "response.refusal.done",
        "error",
        "response.failed",
        "response.incomplete",
    } <= seen


def test_the_checkers_refuse_bad_shapes() -> None:
    with pytest.raises(pydantic.ValidationError):
        check_request_body({"model": "m", "input": [], "bogus": 1})
    with pytest.raises(pydantic.ValidationError):
        check_event({"type": "response.output_text.delta", "delta": "x"})
    with pytest.raises(AssertionError):
        check_event({"type": "error", "error": {"message": "m"}, "extra": 1})
    body = load_transcript("text")[0]["json"]
    with pytest.raises(pydantic.ValidationError):
        check_response({**body, "output": [{"type": "message"}]})


#: transcript -> the Response both modes must give (stream: the chunks accumulated).
ENC1 = _item("reasoning_tool_turn", 0)["encrypted_content"]
ENC2 = _item("reasoning_final_answer", 0)["encrypted_content"]
ENC3 = _item("two_reasoning_items", 2)["encrypted_content"]


def _answer(
    response_id: str, parts: list[Part], finish: FinishReason, usage: Usage
) -> dict[str, Any]:
    return {"id": response_id, "parts": parts, "finish": finish, "usage": usage}


EXPECTED: dict[str, dict[str, Any]] = {
    "text": _answer(
        "resp_text1",
        [text_part("The capital of France is Paris.", _meta("msg_text1"))],
        FinishReason.STOP,
        Usage(12, 8, 0, 0),
    ),
    "reasoning_tool_turn": _answer(
        "resp_tool1",
        [
            reasoning_part(
                "**Checking the weather**\n\nThe user wants Paris weather.\n\n"
                "I'll call get_weather.",
                ENC1.encode(),
                _meta("rs_tool1"),
            ),
            tool_call_part("call_Wx1", "get_weather", '{"city":"Paris"}', _meta("fc_tool1")),
        ],
        FinishReason.TOOL_CALLS,
        Usage(120, 90, 64, 64),
    ),
    "reasoning_final_answer": _answer(
        "resp_final1",
        [
            reasoning_part("Answering briefly.", ENC2.encode(), _meta("rs_final1")),
            text_part("It is 18°C and sunny in Paris.", _meta("msg_final1")),
        ],
        FinishReason.STOP,
        Usage(260, 40, 16, 128),
    ),
    "parallel_tools": _answer(
        "resp_par1",
        [
            reasoning_part("Two tools needed.", ENC1.encode(), _meta("rs_par1")),
            tool_call_part("call_P1", "get_weather", '{"city":"Paris"}', _meta("fc_par1")),
            tool_call_part("call_P2", "get_time", '{"zone":"Europe/Paris"}', _meta("fc_par2")),
        ],
        FinishReason.TOOL_CALLS,
        Usage(140, 70, 32, 0),
    ),
    "two_reasoning_items": _answer(
        "resp_two1",
        [
            reasoning_part("First thought.", ENC1.encode(), _meta("rs_two1")),
            text_part("Let me think again.", _meta("msg_two1", **{"openai/phase": "commentary"})),
            reasoning_part("", ENC3.encode(), _meta("rs_two2")),
            text_part("Done: 42.", _meta("msg_two2", **{"openai/phase": "final_answer"})),
        ],
        FinishReason.STOP,
        Usage(30, 50, 20, 0),
    ),
    "refusal": _answer(
        "resp_ref1",
        [
            text_part(
                "I'm sorry, I can't help with that.",
                _meta("msg_ref1", **{"openai/refusal": True}),
            )
        ],
        FinishReason.STOP,
        Usage(15, 9, 0, 0),
    ),
    "max_output_tokens": _answer(
        "resp_inc1",
        [
            reasoning_part("Long story.", ENC2.encode(), _meta("rs_inc1")),
            text_part("Once upon a time", _meta("msg_inc1")),
        ],
        FinishReason.LENGTH,
        Usage(11, 16, 8, 0),
    ),
    "content_filter": _answer(
        "resp_cf1",
        [text_part("I was", _meta("msg_cf1"))],
        FinishReason.CONTENT_FILTER,
        Usage(10, 2, 0, 0),
    ),
}


def _check(response: Response, expected: dict[str, Any]) -> None:
    assert response.output is not None and response.metadata is not None
    # The answer, stamped with its provenance (DESIGN §6c: the model that answered;
    # §6g: the one asked for).
    answered = RESPONSES.own(
        assistant_message(*expected["parts"]), "gpt-5-mini-2025-08-07", asked="gpt-5-mini"
    )
    assert response.output.message == answered
    assert response.output.finish_reason is expected["finish"]
    assert response.metadata.id == expected["id"]
    assert response.metadata.model == "gpt-5-mini-2025-08-07"
    assert response.metadata.usage == expected["usage"]
    response.validate_complete()


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_call_maps_the_answer(server: ResponsesServer, name: str) -> None:
    server.script(*load_transcript(name))
    model, _ = make_model(server)
    async with model:
        response = await model.call(QUESTION)
    _check(response, EXPECTED[name])
    (recorded,) = server.requests
    assert recorded.path == "/v1/responses" and "stream" not in recorded.body


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_stream_maps_the_answer(server: ResponsesServer, name: str) -> None:
    server.script(*load_transcript(f"stream_{name}" if name != "text" else "stream_text"))
    model, _ = make_model(server)
    async with model:
        chunks, response = await accumulate(model.stream(QUESTION))
    if name == "text":
        assert [chunk.text for chunk in chunks if chunk.text] == ["Hello", " world", "!"]
        assert response.text == "Hello world!"
    else:
        _check(response, EXPECTED[name])
    assert server.requests[0].body["stream"] is True
    # Each chunk is a small delta, not the whole answer again: the metadata once, the
    # usage once (at the end).
    assert sum(chunk.metadata is not None and bool(chunk.metadata.id) for chunk in chunks) == 1
    assert [chunk.metadata.usage for chunk in chunks if chunk.metadata][-1] == (
        response.metadata.usage if response.metadata else None
    )


def _completed(events: list[Any]) -> dict[str, Any]:
    final: dict[str, Any] = events[-1]["response"]
    return final


def _mapped(events: list[Any]) -> list[Response]:
    mapper = EventMapper()
    chunks = []
    for event in events:
        chunk = mapper.map(event["type"], json.dumps(event).encode())
        if chunk is not None:
            chunks.append(chunk)
    assert mapper.end_marker_seen and mapper.finish_reason_seen
    return chunks


STREAMS = sorted(
    path.stem
    for path in TRANSCRIPTS.glob("stream_*.json")
    if load_transcript(path.stem)[0]["sse"][-1].get("type")
    in ("response.completed", "response.incomplete")
)


@pytest.mark.parametrize("name", STREAMS)
def test_accumulated_deltas_equal_the_call_answer(name: str) -> None:
    # The stream's chunks, merged, are what call makes of the final response object.
    events = load_transcript(name)[0]["sse"]
    expected = parse_response(json.dumps(_completed(events)).encode())
    assert merged(_mapped(events)) == expected


@pytest.mark.parametrize("name", STREAMS)
def test_a_server_that_sends_no_deltas_still_gives_the_whole_answer(name: str) -> None:
    # Only the items' .added/.done events (some Open Responses servers): the .done items
    # say everything.
    events = [
        event
        for event in load_transcript(name)[0]["sse"]
        if not event["type"].endswith(".delta")
        and event["type"] != "response.reasoning_summary_part.added"
    ]
    expected = parse_response(json.dumps(_completed(events)).encode())
    assert merged(_mapped(events)) == expected


def test_the_unfinished_encrypted_content_of_output_item_added_is_not_used() -> None:
    events = load_transcript("stream_reasoning_tool_turn")[0]["sse"]
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["encrypted_content"] != ENC1  # unfinished, as recorded
    (reasoning,) = [
        part
        for chunk in _mapped(events)
        if chunk.output and chunk.output.message
        for part in chunk.output.message.parts
        if part.signature
    ]
    assert reasoning.signature == ENC1.encode()


def test_two_reasoning_items_stay_two_parts_and_summaries_join_with_a_blank_line() -> None:
    chunks = _mapped(load_transcript("stream_reasoning_tool_turn")[0]["sse"])
    texts = [
        part.text
        for chunk in chunks
        if chunk.output and chunk.output.message
        for part in chunk.output.message.parts
        if part.kind is PartKind.REASONING
    ]
    assert texts == [
        "**Checking",
        " the weather**\n\nThe user wants Paris weather.",
        "\n\n",
        "I'll call",
        " get_weather.",
        "",
    ]
    both = merged(_mapped(load_transcript("stream_two_reasoning_items")[0]["sse"]))
    assert both.output is not None and both.output.message is not None
    assert [part.kind for part in both.output.message.parts] == [
        PartKind.REASONING,
        PartKind.TEXT,
        PartKind.REASONING,
        PartKind.TEXT,
    ]


def test_argument_deltas_are_keyed_by_item_id() -> None:
    events = load_transcript("stream_parallel_tools")[0]["sse"]
    deltas = [
        (part.metadata["openai/item_id"].value(), part.tool_call_delta)
        for chunk in _mapped(events)
        if chunk.output and chunk.output.message
        for part in chunk.output.message.parts
        if part.tool_call_delta is not None
    ]
    assert [(item, d.id, d.arguments) for item, d in deltas] == [
        ("fc_par1", "call_P1", ""),
        ("fc_par1", "call_P1", '{"city":'),
        ("fc_par1", "call_P1", '"Paris"}'),
        ("fc_par2", "call_P2", ""),
        ("fc_par2", "call_P2", '{"zone":"Europe/'),
        ("fc_par2", "call_P2", 'Paris"}'),
    ]
    mapper = EventMapper()
    stray = {"type": "response.function_call_arguments.delta", "item_id": "fc_x", "delta": "{"}
    with pytest.raises(InvalidResponseError, match="'fc_x', which is no function call"):
        mapper.map("", json.dumps(stray).encode())


# ------------------------------------------------------------------------ errors


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_an_unknown_model_is_a_bad_request(server: ResponsesServer, mode: str) -> None:
    server.script(*load_transcript("model_not_found"))
    model, sleeps = make_model(server)
    async with model:
        with pytest.raises(BadRequestError, match="does not exist") as info:
            if mode == "call":
                await model.call(QUESTION)
            else:
                await accumulate(model.stream(QUESTION))
    assert info.value.status_code == 400 and info.value.request_id == "req_400_1"
    assert info.value.body["error"]["code"] == "model_not_found"
    assert sleeps.delays == []


@pytest.mark.anyio
async def test_response_failed_mid_stream_raises_by_its_code(server: ResponsesServer) -> None:
    server.script(*load_transcript("stream_failed"))
    model, sleeps = make_model(server)
    texts = []
    async with model:
        with pytest.raises(RateLimitError, match="Rate limit exceeded while generating") as info:
            async for chunk in model.stream(QUESTION):
                texts.append(chunk.text)
    assert texts == ["", "Hm"]
    assert (info.value.status_code, info.value.request_id) == (200, "req_fail_1")
    assert info.value.body["response"]["error"]["code"] == "rate_limit_exceeded"
    assert sleeps.delays == [] and len(server.requests) == 1


@pytest.mark.anyio
async def test_a_failed_response_body_raises_by_its_code(server: ResponsesServer) -> None:
    server.script(*load_transcript("failed"))
    model, _ = make_model(server)
    async with model:
        with pytest.raises(ProviderServerError, match="The model crashed") as info:
            await model.call(QUESTION)
    assert (info.value.status_code, info.value.request_id) == (200, "req_fail_2")


def test_the_error_event_in_the_sdk_shape_is_read_too() -> None:
    flat = {"type": "error", "sequence_number": 3, "code": "rate_limit_exceeded", "message": "m"}
    check_event(flat)
    with pytest.raises(RateLimitError, match="stream error: m"):
        EventMapper().map("error", json.dumps(flat).encode())


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"output": {}}, r"response\.output must be an array, got an object"),
        ({"output": [1]}, r"response\.output\[0\] must be an object, got a number"),
        ({"output": [{"type": "message", "id": ""}]}, r"response\.output\[0\]\.id must be"),
        (
            {"output": [{"type": "message", "id": "m", "content": [{"type": "audio"}]}]},
            r"content\[0\]\.type must be 'output_text' or 'refusal', got 'audio'",
        ),
        (
            {"output": [{"type": "function_call", "id": "f", "call_id": "", "name": "x"}]},
            r"response\.output\[0\]: .*id",
        ),
        (
            {"output": [{"type": "reasoning", "id": "r", "summary": [{"text": 1}]}]},
            r"summary\[0\]\.text must be a string, got a number",
        ),
        ({"usage": {"input_tokens": -1}}, r"response\.usage\.input_tokens must be a non-negative"),
        ({"status": 7}, r"response\.status must be a string, got a number"),
        ({"id": " r"}, r"response\.id must not have surrounding whitespace"),
    ],
)
def test_malformed_responses_name_the_path(body: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidResponseError, match=match):
        parse_response(json.dumps({"status": "completed", **body}).encode())


def test_items_of_other_types_are_kept_whole_never_calls() -> None:
    body = {
        "status": "completed",
        "output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "message", "id": "msg_1", "content": [{"type": "output_text", "text": "A"}]},
        ],
    }
    response = parse_response(json.dumps(body).encode())
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.output.message == assistant_message(
        native_part(
            "openai.responses",
            "web_search_call",
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ),
        text_part("A", _meta("msg_1")),
    )


@pytest.mark.parametrize(
    ("status", "details", "finish"),
    [
        ("completed", None, FinishReason.STOP),
        ("incomplete", {"reason": "max_output_tokens"}, FinishReason.LENGTH),
        ("incomplete", {"reason": "content_filter"}, FinishReason.CONTENT_FILTER),
        ("incomplete", None, FinishReason.OTHER),
        ("cancelled", None, FinishReason.OTHER),
    ],
)
def test_finish_reasons(status: str, details: Any, finish: FinishReason) -> None:
    body = {"status": status, "incomplete_details": details, "output": []}
    response = parse_response(json.dumps(body).encode())
    assert response.output is not None and response.output.finish_reason is finish


# ------------------------------------------------------------------------ requests


def _body(request: Request, *, stream: bool = False, encrypted_reasoning: bool = True) -> Any:
    """The body built for ``request`` (the JSON sent), checked with the SDK's types."""
    built = build_body(
        request,
        default_options=Options(),
        model=RESPONSES.model,
        stream=stream,
        encrypted_reasoning=encrypted_reasoning,
    )
    body = orjson.loads(orjson.dumps(built))
    check_request_body(body)
    return body


def test_the_body_is_stateless_and_asks_for_encrypted_reasoning() -> None:
    body = _body(QUESTION, stream=True)
    assert body == {
        "model": "gpt-5-mini",
        "input": [{"type": "message", "role": "user", "content": "What's the weather in Paris?"}],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "stream": True,
        "tools": [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema.value(),
                "strict": False,
            }
            for tool in (WEATHER, TIME)
        ],
    }


def test_options_map_to_their_fields() -> None:
    options = Options(
        max_tokens=100,
        temperature=0.5,
        top_p=0.9,
        reasoning_effort="low",
        stop=(),
        output_format=OutputFormat.json_schema(
            "answer", {"type": "object", "properties": {}}, "An answer."
        ),
        extensions=Extensions({"openai/parallel_tool_calls": False, "other/x": 1}),
    )
    body = _body(Request([user_message("Hi")], options=options))
    assert {
        key: body[key] for key in body if key not in ("model", "input", "store", "include")
    } == {
        "max_output_tokens": 100,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "low"},
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "description": "An answer.",
                "schema": {"type": "object", "properties": {}},
            }
        },
        "parallel_tool_calls": False,
    }
    json_mode = _body(
        Request([user_message("Hi")], options=Options(output_format=OutputFormat.json()))
    )
    assert json_mode["text"] == {"format": {"type": "json_object"}}
    plain = _body(Request([user_message("Hi")], options=Options(output_format=OutputFormat.text())))
    assert "text" not in plain
    summary = Extensions({"openai/reasoning": {"effort": "high", "summary": "auto"}})
    chosen = _body(
        Request([user_message("Hi")], options=Options(reasoning_effort="low", extensions=summary))
    )
    assert chosen["reasoning"] == {"effort": "high", "summary": "auto"}  # the extension wins


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (Options(top_k=3), "top_k is not part of the OpenAI Responses API"),
        (Options(frequency_penalty=0.5), "frequency_penalty is not part of"),
        (Options(presence_penalty=0.5), "presence_penalty is not part of"),
        (Options(stop=("END",)), "stop is not part of the OpenAI Responses API"),
        *[
            (
                Options(extensions=Extensions({f"openai/{field}": 1})),
                f"extension 'openai/{field}' would overwrite the '{field}' field",
            )
            for field in (
                "input",
                "model",
                "stream",
                "store",
                "include",
                "previous_response_id",
                "conversation",
            )
        ],
    ],
)
def test_unsupported_options_are_refused(options: Options, match: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=match):
        body_of(RESPONSES, Request([user_message("Hi")], options=options))


PNG = Media.from_bytes("image/png", b"\x89PNG")


def test_messages_map_to_input_items() -> None:
    request = Request(
        [
            system_message("Be brief."),
            user_message(
                "Look:",
                media_part(PNG),
                media_part(Media.from_uri("image/jpeg", "https://x.test/a.jpg")),
                media_part(Media.from_reference("image/png", "file-img")),
                media_part(Media.from_bytes("application/pdf", b"%PDF")),
                media_part(Media.from_uri("application/pdf", "https://x.test/a.pdf")),
                media_part(Media.from_reference("application/pdf", "file-doc")),
            ),
            RESPONSES.own(
                assistant_message(
                    text_part("No.", _meta("msg_1", **{"openai/refusal": True})),
                    text_part("Plain", {}),
                    tool_call_part("call_1", "get_weather", '{"city": "Paris"}', _meta("fc_1")),
                    tool_call_part("call_2", "get_time", "{}"),
                )
            ),
            tool_message(
                ToolResult("call_1", "get_weather", ToolOutput.of_text("18C")),
                ToolResult("call_2", "get_time", ToolOutput((media_part(PNG),))),
            ),
        ]
    )
    items = _body(request)["input"]
    data_png = "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    assert items == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "detail": "auto", "image_url": data_png},
                {"type": "input_image", "detail": "auto", "image_url": "https://x.test/a.jpg"},
                {"type": "input_image", "detail": "auto", "file_id": "file-img"},
                {
                    "type": "input_file",
                    "filename": "file.pdf",
                    "file_data": "data:application/pdf;base64,"
                    + base64.b64encode(b"%PDF").decode(),
                },
                {"type": "input_file", "file_url": "https://x.test/a.pdf"},
                {"type": "input_file", "file_id": "file-doc"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "refusal", "refusal": "No."}],
        },
        {"type": "message", "role": "assistant", "content": "Plain"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "id": "fc_1",
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_image", "detail": "auto", "image_url": data_png}],
        },
    ]


def test_image_detail_comes_from_media_metadata() -> None:
    image = Media("image/png", PNG.source, metadata=Metadata({"openai/detail": "low"}))
    items = _body(Request([user_message(media_part(image))]))["input"]
    assert items[0]["content"] == [
        {"type": "input_image", "detail": "low", "image_url": "data:image/png;base64,iVBORw=="}
    ]


def test_assistant_media_is_refused() -> None:
    request = Request([user_message("Hi"), assistant_message(media_part(PNG)), user_message("?")])
    with pytest.raises(UnsupportedOptionError, match=r"messages\[1\]\.parts\[0\]: an assistant"):
        body_of(RESPONSES, request)


def _replayed(*parts: Part, encrypted_reasoning: bool = True) -> list[Any]:
    own = RESPONSES.own(assistant_message(*parts))
    request = Request([user_message("Hi"), own, user_message("Again")])
    items: list[Any] = _body(request, encrypted_reasoning=encrypted_reasoning)["input"][1:-1]
    return items


REASONING = reasoning_part("Thinking.", ENC1.encode(), _meta("rs_1"))
ANSWER = text_part("Hello.", _meta("msg_1"))


def test_reasoning_goes_back_with_its_item() -> None:
    assert _replayed(REASONING, ANSWER) == [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Thinking."}],
            "encrypted_content": ENC1,
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
        },
    ]
    silent = reasoning_part("", ENC3.encode(), _meta("rs_2"))
    assert _replayed(silent, ANSWER)[0]["summary"] == []


@pytest.mark.parametrize(
    "parts",
    [
        # no signature, no item id, a signature that is no encrypted_content string
        (reasoning_part("Thinking.", b"", _meta("rs_1")), ANSWER),
        (reasoning_part("Thinking.", ENC1.encode()), ANSWER),
        (reasoning_part("Thinking.", b"\xff\xfe", _meta("rs_1")), ANSWER),
        # the item that followed it does not go back with its id (or nothing follows)
        (REASONING, text_part("Hello.")),
        (REASONING,),
        (REASONING, reasoning_part("More.", ENC2.encode(), _meta("rs_2")), ANSWER),
    ],
)
def test_reasoning_that_cannot_go_back_is_omitted_not_turned_into_text(
    parts: tuple[Part, ...],
) -> None:
    if parts == (REASONING,):
        parts = (REASONING, tool_call_part("call_1", "get_time", "{}"))
    items = _replayed(*parts)
    kept = [item for item in items if item["type"] == "reasoning"]
    assert all(item["id"] == "rs_2" for item in kept)
    assert "Thinking." not in json.dumps(items)


def test_without_encrypted_reasoning_no_reasoning_goes_back() -> None:
    request = Request([user_message("Hi"), assistant_message(REASONING, ANSWER)])
    body = _body(request, encrypted_reasoning=False)
    assert "include" not in body
    assert [item["type"] for item in body["input"]] == ["message", "message"]


def test_the_ownership_decision_is_one_function() -> None:
    assert sent_item_id(REASONING, own=True, send_reasoning=True) == "rs_1"
    assert sent_item_id(REASONING, own=True, send_reasoning=False) is None
    assert sent_item_id(ANSWER, own=True, send_reasoning=False) == "msg_1"
    bad = text_part("x", {"openai/item_id": 5})
    assert sent_item_id(bad, own=True, send_reasoning=True) is None
    # Another model's message (DESIGN §6c): no state of it goes back, ids included.
    assert sent_item_id(REASONING, own=False, send_reasoning=True) is None
    assert sent_item_id(ANSWER, own=False, send_reasoning=True) is None


def test_a_message_phase_goes_back() -> None:
    (item,) = _replayed(text_part("Hm.", _meta("msg_1", **{"openai/phase": "commentary"})))
    assert item["phase"] == "commentary" and item["id"] == "msg_1"


def test_text_parts_of_one_item_form_one_message_item() -> None:
    items = _replayed(
        text_part("A", _meta("msg_1")),
        text_part("B", _meta("msg_1", **{"openai/refusal": True})),
        text_part("C", _meta("msg_2")),
    )
    assert [(item["id"], len(item["content"])) for item in items] == [("msg_1", 2), ("msg_2", 1)]


# ------------------------------------------------------------------------ the adapter


def test_constructor_switches() -> None:
    model = OpenAIResponsesModel("gpt-5-mini", api_key="k")
    assert model.encrypted_reasoning is True and model.provider_name == "openai"
    assert OpenAIResponsesModel(encrypted_reasoning=False).encrypted_reasoning is False
    with pytest.raises(TypeError, match="encrypted_reasoning must be a bool, got int"):
        OpenAIResponsesModel(encrypted_reasoning=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionsError, match="provider_name must be a non-empty string"):
        OpenAIResponsesModel(provider_name=" ")
    assert OpenAIResponsesModel(provider_name="azure").provider_name == "azure"


@pytest.mark.anyio
async def test_the_switch_reaches_the_wire(server: ResponsesServer) -> None:
    server.script(*load_transcript("text"))
    model, _ = make_model(server, encrypted_reasoning=False)
    own = RESPONSES.own(assistant_message(REASONING, ANSWER))
    history = Request([user_message("Hi"), own, user_message("?")])
    async with model:
        await model.call(history)
    (recorded,) = server.requests
    assert isinstance(recorded, Recorded)
    assert "include" not in recorded.body and recorded.body["store"] is False
    assert [item["type"] for item in recorded.body["input"]] == ["message"] * 3


@pytest.mark.anyio
async def test_a_stored_tool_turn_goes_back_exactly(server: ResponsesServer) -> None:
    server.script(*load_transcript("reasoning_tool_turn"), *load_transcript("text"))
    model, _ = make_model(server)
    async with model:
        first = await model.call(QUESTION)
        assert first.output is not None and first.output.message is not None
        (call,) = first.output.message.tool_calls
        assert call == ToolCall("call_Wx1", "get_weather", '{"city":"Paris"}')
        result = ToolResult(call.id, call.name, ToolOutput.of_text("18C"))
        await model.call(
            Request(
                [*QUESTION.messages, first.output.message, tool_message(result)], QUESTION.tools
            )
        )
    reasoning, function_call = load_transcript("reasoning_tool_turn")[0]["json"]["output"]
    sent = server.requests[1].body["input"][1:]
    assert sent[0]["encrypted_content"] == reasoning["encrypted_content"]
    assert sent[0]["id"] == reasoning["id"]
    assert {k: sent[1][k] for k in ("id", "call_id", "name", "arguments")} == {
        k: function_call[k] for k in ("id", "call_id", "name", "arguments")
    }
    assert sent[2] == {"type": "function_call_output", "call_id": "call_Wx1", "output": "18C"}


def test_the_recorded_400_for_a_lone_reasoning_item_is_a_bad_request_shape() -> None:
    # What the API answers when a reasoning item goes back without its following item
    # (why the adapter never sends one): an invalid_request_error, a 400.
    (exchange,) = load_transcript("reasoning_item_without_following")
    assert exchange["status"] == 400
    check_response(exchange["json"])
    assert "without its required following item" in exchange["json"]["error"]["message"]
    lone = _replayed(REASONING, tool_call_part("call_1", "get_time", "{}"))
    assert [item["type"] for item in lone] == ["function_call"]


def test_message_parts_keep_the_accumulator_shape() -> None:
    # Two output_text contents of one item make one text part, as their deltas merge.
    body = {
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "content": [
                    {"type": "output_text", "text": "A"},
                    {"type": "output_text", "text": ""},
                    {"type": "output_text", "text": "B"},
                ],
            }
        ],
    }
    response = parse_response(json.dumps(body).encode())
    assert response.output is not None
    assert response.output.message == assistant_message(text_part("AB", _meta("msg_1")))


def test_lone_surrogates_are_an_invalid_response() -> None:
    delta = b'{"type": "response.output_text.delta", "item_id": "m", "delta": "\\ud800"}'
    with pytest.raises(InvalidResponseError, match="not valid JSON"):
        EventMapper().map("response.output_text.delta", delta)
    body = b'{"status": "completed", "output": [{"type": "message", "id": "m", "content":'
    with pytest.raises(InvalidResponseError, match="not valid JSON"):
        parse_response(body + b' [{"type": "output_text", "text": "\\udc00"}]}]}')


def test_a_stream_event_that_is_no_object_is_an_invalid_response() -> None:
    with pytest.raises(InvalidResponseError, match="stream event must be an object, got an array"):
        EventMapper().map("", b"[1]")
    mapper = EventMapper()
    assert mapper.map("", b"[DONE]") is None and mapper.end_marker_seen


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (
            [{"type": "response.output_text.delta", "item_id": "", "delta": "x"}],
            r"stream event\.item_id must be a non-empty string",
        ),
        (
            [{"type": "response.output_text.delta", "item_id": "m", "delta": 1}],
            r"stream event\.delta must be a string, got a number",
        ),
        (
            [{"type": "response.refusal.delta", "item_id": "m", "delta": ["x"]}],
            r"stream event\.delta must be a string, got an array",
        ),
        (
            [
                {
                    "type": "response.reasoning_summary_text.delta",
                    "item_id": "r",
                    "summary_index": -1,
                }
            ],
            r"summary_index must be a non-negative integer, got -1",
        ),
        (
            [
                {
                    "type": "response.reasoning_summary_part.added",
                    "item_id": "r",
                    "summary_index": 2,
                },
                {
                    "type": "response.reasoning_summary_text.delta",
                    "item_id": "r",
                    "summary_index": 1,
                },
            ],
            r"summary_index 1 of item 'r' after 2",
        ),
        (
            [{"type": "response.created", "response": []}],
            r"stream event\.response must be an object, got an array",
        ),
        (
            [{"type": "response.output_item.added", "item": {"type": "function_call", "id": "f"}}],
            r"stream event 'response\.output_item\.added': .*",
        ),
    ],
)
def test_malformed_events_name_the_path(events: list[dict[str, Any]], match: str) -> None:
    mapper = EventMapper()
    with pytest.raises(InvalidResponseError, match=match):
        for event in events:
            mapper.map(event["type"], json.dumps(event).encode())
