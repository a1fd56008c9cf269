"""The OpenAI adapter's pure mapping: request bodies, responses, stream chunks, SSE.

Every body built here is validated with the official ``openai`` package's request types
(unknown fields refused at every level), unless a test deliberately passes a field
that only a compatible server knows.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Options,
    Output,
    OutputFormat,
    Request,
    Response,
    ToolCall,
    ToolCallDelta,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import (
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media
from scope.models import _sse
from scope.models._http import retry_after as _retry_after
from scope.models._openai_wire import ChunkMapper, build_body, parse_completion
from scope.models._sse import SSEDecoder
from scope.models.openai import OpenAIChatModel
from tests.helpers import EXACT_WEATHER, OPENAI, hello, merged
from tests.helpers import body_of as provider_body_of
from tests.openai_server import check_request_body

body_of = functools.partial(provider_body_of, OPENAI)


# ----------------------------------------------------------------------------- requests


def test_full_request_maps_every_part_kind() -> None:
    request = Request(
        [
            system_message("Be brief."),
            user_message(
                "What is in these?",
                media_part(Media.from_bytes("image/png", b"\x89PNG")),
                media_part(Media.from_uri("image/jpeg", "https://example.com/cat.jpg")),
                media_part(Media.from_bytes("audio/wav", b"RIFF")),
                media_part(
                    Media(
                        "application/pdf",
                        Media.from_bytes("a/b", b"%PDF").source,
                        name="report.pdf",
                    )
                ),
                media_part(Media.from_reference("application/pdf", "file-abc123")),
            ),
            OPENAI.own(
                assistant_message(
                    reasoning_part("thinking...", b"sig"),
                    text_part("Let me check."),
                    tool_call_part("call_1", "get_weather", '{"city": "Paris"}'),
                    tool_call_part("call_2", "get_weather", "{'not json"),
                )
            ),
            tool_message(
                ToolResult("call_1", "get_weather", ToolOutput.of_text("18C")),
                ToolResult(
                    "call_2",
                    "get_weather",
                    ToolOutput.of_json({"error": "bad args"}),
                    is_error=True,
                ),
            ),
        ],
        tools=[EXACT_WEATHER],
    )
    body = body_of(request)
    check_request_body(body)
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {
                    "type": "file",
                    "file": {
                        "filename": "report.pdf",
                        "file_data": "data:application/pdf;base64,JVBERg==",
                    },
                },
                {"type": "file", "file": {"file_id": "file-abc123"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{'not json"},
                },
            ],
            # The reasoning of a tool-calling message goes back (DESIGN §7e).
            "reasoning_content": "thinking...",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"error":"bad args"}'},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city.",
                "parameters": EXACT_WEATHER.input_schema.value(),
            },
        }
    ]
    assert "stream" not in body


def test_schemas_are_sent_verbatim() -> None:
    fmt = OutputFormat.json_schema("answer", RawJSON.parse('{"type":"object","x":2.50}'))
    raw = orjson.dumps(
        build_body(
            Request(
                [user_message("Hi")], tools=[EXACT_WEATHER], options=Options(output_format=fmt)
            ),
            default_options=Options(),
            model="m",
            stream=False,
        )
    )
    assert b'"minimum":1.50' in raw
    assert b'"x":2.50' in raw


def test_options_map_to_their_fields() -> None:
    body = body_of(
        hello(
            max_tokens=100,
            temperature=0.5,
            top_p=0.9,
            stop=["END", "STOP"],
            frequency_penalty=-1,
            presence_penalty=1.5,
            reasoning_effort="low",
            output_format=OutputFormat.json_schema(
                "answer", {"type": "object"}, description="The answer."
            ),
        )
    )
    check_request_body(body)
    assert {k: v for k, v in body.items() if k not in ("model", "messages")} == {
        "max_completion_tokens": 100,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END", "STOP"],
        "frequency_penalty": -1.0,
        "presence_penalty": 1.5,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "answer",
                "description": "The answer.",
                "schema": {"type": "object"},
            },
        },
    }


def test_json_and_text_output_formats() -> None:
    body = body_of(hello(output_format=OutputFormat.json()))
    check_request_body(body)
    assert body["response_format"] == {"type": "json_object"}
    body = body_of(hello(output_format=OutputFormat.text()))
    assert "response_format" not in body


def test_empty_stop_list_is_the_default() -> None:
    body = body_of(hello(stop=()), defaults=Options(stop=["x"]))
    assert "stop" not in body


def test_default_options_lie_under_the_request_options() -> None:
    defaults = Options(model="gpt-4o", temperature=0.2, top_p=0.5)
    body = body_of(hello(temperature=0.7), defaults=defaults)
    check_request_body(body)
    assert (body["model"], body["temperature"], body["top_p"]) == ("gpt-4o", 0.7, 0.5)
    body = body_of(hello(model="o3-mini"), defaults=defaults)
    assert body["model"] == "o3-mini"


def test_streaming_body_asks_for_usage() -> None:
    body = body_of(hello(), stream=True)
    check_request_body(body)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_openai_extensions_become_body_fields() -> None:
    body = body_of(
        hello(
            temperature=0.3,
            extensions={
                "openai/seed": 7,
                "openai/parallel_tool_calls": False,
                "openai/user": "u-1",
                "openai/temperature": 1.0,
                "openai/n": 1,
            },
        )
    )
    check_request_body(body)
    assert body["seed"] == 7
    assert body["parallel_tool_calls"] is False
    assert body["user"] == "u-1"
    assert body["n"] == 1
    assert body["temperature"] == 1.0  # written last: the explicit wire field wins


def test_extensions_reach_fields_the_sdk_does_not_know() -> None:
    # For compatible servers (vLLM, Ollama): not validated with the openai types.
    body = body_of(hello(extensions={"openai/top_k": 40, "openai/max_tokens": 12}))
    assert (body["top_k"], body["max_tokens"]) == (40, 12)


def test_other_namespaces_are_ignored() -> None:
    body = body_of(hello(extensions={"anthropic/top_k": 5, "vertex/safety": "high"}))
    check_request_body(body)
    assert "top_k" not in body and "safety" not in body


@pytest.mark.parametrize("field", ["messages", "model", "stream", "stream_options"])
def test_reserved_extensions_are_refused(field: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=f"openai/{field}"):
        body_of(hello(extensions={f"openai/{field}": 1}))


def test_more_than_one_choice_is_refused() -> None:
    with pytest.raises(UnsupportedOptionError, match="openai/n"):
        body_of(hello(extensions={"openai/n": 2}))


def test_top_k_is_refused() -> None:
    with pytest.raises(UnsupportedOptionError, match="top_k"):
        body_of(hello(top_k=40))


def test_top_k_from_default_options_is_refused() -> None:
    with pytest.raises(UnsupportedOptionError, match="top_k"):
        body_of(hello(), defaults=Options(top_k=3))


def _after_call(*results: ToolResult) -> Request:
    return Request(
        [
            user_message("Draw it"),
            assistant_message(tool_call_part("call_1", "draw", "{}")),
            tool_message(*results),
        ]
    )


def test_media_in_a_tool_result_is_refused() -> None:
    output = ToolOutput([text_part("here"), media_part(Media.from_bytes("image/png", b"x"))])
    with pytest.raises(UnsupportedOptionError, match=r"messages\[2\]\.parts\[0\].*media"):
        body_of(_after_call(ToolResult("call_1", "draw", output)))


def test_media_in_an_assistant_message_is_refused() -> None:
    request = Request(
        [
            user_message("Draw"),
            assistant_message(media_part(Media.from_bytes("image/png", b"x"))),
            user_message("Thanks"),
        ]
    )
    with pytest.raises(UnsupportedOptionError, match=r"messages\[1\]\.parts\[0\]"):
        body_of(request)


def test_audio_other_than_wav_or_mp3_is_refused() -> None:
    request = Request([user_message(media_part(Media.from_bytes("audio/ogg", b"OggS")))])
    with pytest.raises(UnsupportedOptionError, match="wav or mp3"):
        body_of(request)


@pytest.mark.parametrize("mime", ["application/pdf", "audio/wav"])
def test_non_image_media_by_uri_is_refused(mime: str) -> None:
    request = Request([user_message(media_part(Media.from_uri(mime, "https://x.test/f")))])
    with pytest.raises(UnsupportedOptionError, match="URI"):
        body_of(request)


def test_media_details_and_names() -> None:
    image = Media.from_uri("image/png", "https://x.test/a.png")
    image = Media(image.mime, image.source, metadata={"openai/detail": "low"})
    request = Request(
        [
            user_message(
                media_part(image),
                media_part(Media.from_bytes("audio/mpeg; rate=44100", b"ID3")),
                media_part(Media.from_bytes("text/plain", b"hello")),
            )
        ]
    )
    body = body_of(request)
    check_request_body(body)
    content = body["messages"][0]["content"]
    assert content[0]["image_url"] == {"url": "https://x.test/a.png", "detail": "low"}
    assert content[1]["input_audio"]["format"] == "mp3"
    assert content[2]["file"] == {
        "filename": "file.txt",
        "file_data": "data:text/plain;base64,aGVsbG8=",
    }


def test_reasoning_is_not_sent_back_and_refusals_are() -> None:
    request = Request(
        [
            user_message("Do it"),
            assistant_message(
                reasoning_part("secret"),
                text_part("I can't.", metadata={"openai/refusal": True}),
            ),
            user_message("Please"),
            assistant_message(reasoning_part("only thoughts")),
            user_message("?"),
        ]
    )
    body = body_of(request)
    check_request_body(body)
    assert body["messages"][1] == {"role": "assistant", "refusal": "I can't."}
    assert body["messages"][3] == {"role": "assistant", "content": ""}


def test_a_tool_result_with_empty_output_sends_empty_content() -> None:
    body = body_of(_after_call(ToolResult("call_1", "draw")))
    check_request_body(body)
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": ""}


# ------------------------------------------------------------------------- constructor


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model = OpenAIChatModel("llama3.2")
    assert model.base_url == "http://localhost:11434/v1"
    assert model._headers["Authorization"] == "Bearer sk-env"
    assert "sk-env" not in repr(model)
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    model = OpenAIChatModel("gpt-4o", headers={"OpenAI-Organization": "org-1"})
    assert model.base_url == "https://api.openai.com/v1"
    assert "Authorization" not in model._headers
    assert model._headers["OpenAI-Organization"] == "org-1"


def test_importing_scope_does_not_import_httpx() -> None:
    code = (
        "import sys, scope, scope.chat, scope.models, scope.errors, scope.codec\n"
        "assert 'httpx' not in sys.modules, 'httpx imported'\n"
        "import scope.models.openai\n"
        "assert 'httpx' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- responses


def completion(message: dict[str, Any], **extra: Any) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
    }
    body.update(extra)
    return orjson.dumps(body)


def test_parse_text_usage_and_metadata() -> None:
    response = parse_completion(
        completion(
            {"content": "Hi!", "refusal": None, "annotations": []},
            usage={
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "total_tokens": 15,
                "prompt_tokens_details": {"cached_tokens": 4},
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
            system_fingerprint="fp_1",
            service_tier="default",
        )
    )
    assert response.text == "Hi!"
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None
    assert (response.metadata.id, response.metadata.model) == ("chatcmpl-1", "gpt-4o-mini")
    assert response.usage == Usage(10, 5, reasoning_tokens=2, cache_read_input_tokens=4)
    assert response.metadata.extra.values_dict() == {
        "openai/system_fingerprint": "fp_1",
        "openai/service_tier": "default",
    }
    response.validate_complete()


def test_parse_reasoning_refusal_and_tool_calls() -> None:
    response = parse_completion(
        completion(
            {
                "reasoning_content": "hmm",
                "content": "Partly:",
                "refusal": "no more",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{bad"},
                    },
                    {"type": "function", "function": {"name": "g", "arguments": ""}},
                ],
                "annotations": [{"type": "url_citation", "url_citation": {"url": "u"}}],
            }
        )
    )
    assert response.output is not None and response.output.message is not None
    message = response.output.message
    assert [p.kind for p in message.parts] == [
        "reasoning",
        "text",
        "text",
        "tool_call",
        "tool_call",
    ]
    assert message.parts[0].text == "hmm"
    assert message.parts[2].metadata.values_dict() == {"openai/refusal": True}
    assert message.tool_calls == (ToolCall("c1", "f", "{bad"), ToolCall("call_1", "g", ""))
    assert message.metadata.decode("openai/annotations")[0]["type"] == "url_citation"


def test_parse_reasoning_field_of_other_servers() -> None:
    response = parse_completion(completion({"content": "4", "reasoning": "2+2"}))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts[0] == reasoning_part("2+2")


def test_parse_legacy_function_call() -> None:
    body = orjson.loads(completion({"function_call": {"name": "f", "arguments": "{}"}}))
    body["choices"][0]["finish_reason"] = "function_call"
    response = parse_completion(orjson.dumps(body))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.tool_calls == (ToolCall("function_call", "f", "{}"),)
    assert response.output.finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("tool_calls", FinishReason.TOOL_CALLS),
        ("function_call", FinishReason.TOOL_CALLS),
        ("content_filter", FinishReason.CONTENT_FILTER),
        ("eos_token", FinishReason.OTHER),
        # A whole body is a finished answer: no reason ("" or absent) is "stop".
        (None, FinishReason.STOP),
        ("", FinishReason.STOP),
    ],
)
def test_finish_reasons(wire: str | None, reason: FinishReason | None) -> None:
    body = orjson.loads(completion({"content": "x"}))
    body["choices"][0]["finish_reason"] = wire
    response = parse_completion(orjson.dumps(body))
    assert response.output is not None and response.output.finish_reason == reason


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be an object"),
        (b'{"choices": []}', "at least one choice"),
        (b'{"choices": "x"}', "choices must be an array"),
        (b'{"choices": [{"message": {"content": 5}}]}', r"message\.content must be a string"),
        (
            b'{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {}}]}}]}',
            r"tool_calls\[0\]",
        ),
        (b'{"choices": [{"message": {}, "finish_reason": 3}]}', "finish_reason"),
        (b'{"id": " x ", "choices": [{"message": {}}]}', "response.id"),
        (b'{"choices": [{"message": {}}], "usage": {"prompt_tokens": -1}}', "prompt_tokens"),
        (
            # (More reasoning than completion is reasoning counted outside it, as
            # Gemini's compatible endpoint does: tests/models/test_openai_state.py.)
            b'{"choices": [{"message": {}}], "usage": {"prompt_tokens": 1,'
            b' "prompt_tokens_details": {"cached_tokens": 2}}}',
            "cache_read_input_tokens",
        ),
    ],
)
def test_malformed_completions(data: bytes, match: str) -> None:
    with pytest.raises(InvalidResponseError, match=match):
        parse_completion(data)


def test_an_error_body_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="overloaded") as info:
        parse_completion(b'{"error": {"message": "overloaded"}}')
    assert type(info.value) is ProviderError


# ---------------------------------------------------------------------- stream chunks


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "m",
        "created": 1,
    }
    body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    body.update(extra)
    return orjson.dumps(body)


def fragment(
    index: int, id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    out: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        out["id"] = id
    return out


def run_chunks(*events: bytes) -> Response:
    mapper = ChunkMapper()
    return merged(c for data in events if (c := mapper.map("message", data)) is not None)


def test_chunk_ids_and_models_are_sent_when_they_change() -> None:
    mapper = ChunkMapper()
    first = mapper.map("message", chunk({"role": "assistant", "content": ""}))
    assert first is not None and first.metadata is not None and first.metadata.id == "c"
    assert first.output is None
    assert mapper.map("message", chunk({"content": ""})) is None
    second = mapper.map("message", chunk({"content": "x"}))
    assert second is not None and second.metadata is None and second.text == "x"
    # [DONE] without a finish reason: the answer is complete all the same (§7e).
    done = mapper.map("message", b"[DONE]")
    assert done == Response(Output(None, FinishReason.STOP)) and mapper.end_marker_seen


def test_a_fragment_without_id_gets_one_from_its_index() -> None:
    response = run_chunks(
        chunk({"tool_calls": [fragment(3, name="f", args="{")]}),
        chunk({"tool_calls": [fragment(3, args="}")]}, "tool_calls"),
    )
    assert response.output is not None and response.output.message is not None
    assert response.output.message.tool_calls == (ToolCall("call_3", "f", "{}"),)


def test_a_new_id_on_a_known_index_starts_a_new_call() -> None:
    # Some servers send each complete parallel call at index 0.
    response = run_chunks(
        chunk({"tool_calls": [fragment(0, "a", "f", "{}")]}),
        chunk({"tool_calls": [fragment(0, "b", "g", "[]")]}, "tool_calls"),
    )
    assert response.output is not None and response.output.message is not None
    assert response.output.message.tool_calls == (
        ToolCall("a", "f", "{}"),
        ToolCall("b", "g", "[]"),
    )


def test_a_repeated_name_is_fine_and_a_changed_one_is_not() -> None:
    mapper = ChunkMapper()
    mapper.map("message", chunk({"tool_calls": [fragment(0, "a", "f")]}))
    mapper.map("message", chunk({"tool_calls": [fragment(0, "a", "f", "{")]}))
    with pytest.raises(InvalidResponseError, match="changed its name"):
        mapper.map("message", chunk({"tool_calls": [fragment(0, None, "g", "}")]}))


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (
            [chunk({"tool_calls": [fragment(0, "a")]}), chunk(finish="tool_calls")],
            "index 0 never got a name",
        ),
        ([chunk({"tool_calls": [fragment(0, "a")]}), b"[DONE]"], "index 0 never got a name"),
        (
            [
                chunk({"tool_calls": [fragment(0, "a")]}),
                chunk({"tool_calls": [fragment(0, "b", "f")]}),
            ],
            "changed its id from 'a' to 'b' before its name arrived",
        ),
        (
            [
                chunk({"tool_calls": [fragment(0, None, "f")]}),
                chunk({"tool_calls": [fragment(0, None, "g")]}),
            ],
            "changed its name from 'f' to 'g'",
        ),
        ([chunk({"tool_calls": [{"index": "0"}]})], "index must be an integer"),
        ([chunk(finish="stop"), chunk({"content": "late"})], "after the finish_reason"),
        ([b"[DONE]", chunk({"content": "late"})], "after \\[DONE\\]"),
        ([b"{oops"], "not valid JSON"),
        ([b'"text"'], "must be an object"),
        ([chunk({"content": ["x"]})], r"delta.content\[0\] must be an object"),
        ([chunk({"content": 7})], "delta.content must be a string, an array of content blocks"),
        ([chunk({"content": [{"type": "image_url"}]})], r"content\[0\].type must be 'text' or"),
        (
            [chunk({"content": [{"type": "thinking", "thinking": 3}]})],
            r"content\[0\].thinking must be a string or an array of text chunks",
        ),
        (
            [chunk({"content": [{"type": "thinking", "thinking": [{"type": "ref"}]}]})],
            r"thinking\[0\].type must be 'text'",
        ),
        ([chunk({"content": [{"type": "text", "text": 1}]})], r"content\[0\].text must be"),
        ([chunk(usage={"prompt_tokens": "9"})], "prompt_tokens"),
        ([chunk(choices="x")], "choices must be an array"),
    ],
)
def test_malformed_chunks(events: list[bytes], match: str) -> None:
    mapper = ChunkMapper()
    with pytest.raises(InvalidResponseError, match=match):
        for data in events:
            mapper.map("message", data)


def test_an_error_event_is_a_provider_error() -> None:
    mapper = ChunkMapper()
    with pytest.raises(ProviderError, match="overloaded") as info:
        mapper.map("message", b'{"error": {"message": "overloaded"}}')
    assert type(info.value) is ProviderError and info.value.status_code is None
    with pytest.raises(ProviderError, match="no message") as info:
        ChunkMapper().map("error", b'{"detail": 1}')
    assert type(info.value) is ProviderError


@pytest.mark.parametrize(
    ("error", "extra", "cls", "status"),
    [
        ({"message": "m", "code": 400}, {}, BadRequestError, 400),
        ({"message": "m", "code": "429"}, {}, RateLimitError, 429),
        ({"message": "m", "code": 502}, {}, ProviderServerError, 502),
        (
            {"message": "m", "type": "invalid_request_error"},
            {"status_code": 401},
            AuthenticationError,
            401,
        ),  # Groq
        ({"message": "m", "status_code": 403}, {}, AuthenticationError, 403),
        ({"message": "m", "status": 404}, {}, BadRequestError, 404),
        ({"message": "m", "type": "invalid_request_error"}, {}, BadRequestError, None),
        ({"message": "m", "type": "rate_limit_exceeded"}, {}, RateLimitError, None),
        ({"message": "m", "code": "rate_limit_exceeded"}, {}, RateLimitError, None),
        ({"message": "m", "type": "server_error"}, {}, ProviderServerError, None),
        ({"message": "m", "type": "overloaded_error"}, {}, ProviderServerError, None),
        ({"message": "m", "code": 700, "type": "mystery"}, {}, ProviderError, None),
        ({"message": "m", "code": True}, {}, ProviderError, None),
    ],
)
def test_an_embedded_error_code_picks_the_class(
    error: dict[str, Any], extra: dict[str, Any], cls: type[ProviderError], status: int | None
) -> None:
    data = orjson.dumps({"error": error, **extra})
    with pytest.raises(ProviderError, match="mid-stream: m") as info:
        ChunkMapper().map("error", data)
    assert type(info.value) is cls and info.value.status_code == status
    with pytest.raises(ProviderError, match="with an error: m") as info:
        parse_completion(data)
    assert type(info.value) is cls and info.value.status_code == status


def test_refusal_deltas_merge_into_one_marked_part() -> None:
    response = run_chunks(
        chunk({"role": "assistant", "refusal": "I can"}),
        chunk({"refusal": "'t."}, "stop"),
    )
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part.text == "I can't." and part.metadata.decode("openai/refusal") is True


def test_late_tool_call_ids_are_reconciled_by_index() -> None:
    mapper = ChunkMapper()
    # The first fragments have only an index (and arguments): held back, nothing yet.
    first = mapper.map("message", chunk({"tool_calls": [{"index": 0}]}))
    assert first is not None and first.output is None  # the id and model only
    assert mapper.map("message", chunk({"tool_calls": [fragment(0, args='{"ci')]})) is None
    late = mapper.map("message", chunk({"tool_calls": [fragment(0, "call_a", "f", 'ty"')]}))
    assert late is not None and late.output is not None and late.output.message is not None
    (part,) = late.output.message.parts
    assert part.tool_call_delta == ToolCallDelta("call_a", "f", '{"city"')
    after = mapper.map("message", chunk({"tool_calls": [fragment(0, "", None, ': "P"}')]}))
    assert after is not None and after.output is not None and after.output.message is not None
    assert after.output.message.parts[0].tool_call_delta == ToolCallDelta("call_a", "f", ': "P"}')


def test_a_name_first_then_the_id() -> None:
    response = run_chunks(
        chunk({"tool_calls": [fragment(0, None, "f", "{")]}),
        chunk({"tool_calls": [fragment(1, None, "g", "[")]}),
        chunk({"tool_calls": [fragment(1, "id_g", None, "]")]}),
        chunk({"tool_calls": [fragment(0, "id_f", None, "}")]}, "tool_calls"),
    )
    assert response.output is not None and response.output.message is not None
    assert response.output.message.tool_calls == (
        ToolCall("id_g", "g", "[]"),
        ToolCall("id_f", "f", "{}"),
    )


def test_calls_held_back_are_flushed_at_done_without_a_finish_reason() -> None:
    mapper = ChunkMapper()
    held = mapper.map("message", chunk({"tool_calls": [fragment(2, None, "f", "{}")]}))
    assert held is not None and held.output is None
    flushed = mapper.map("message", b"[DONE]")
    assert flushed is not None and flushed.output is not None
    assert flushed.output.message is not None
    assert flushed.output.message.parts[0].tool_call_delta == ToolCallDelta("call_2", "f", "{}")
    assert mapper.end_marker_seen


def test_content_blocks_in_a_completion() -> None:
    body = {
        "id": "cmpl-mistral",
        "object": "chat.completion",
        "created": 1,
        "model": "magistral-medium-latest",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "thinking",
                            "thinking": [
                                {"type": "text", "text": "Okay, "},
                                {"type": "text", "text": "9.8 > 9.11."},
                            ],
                        },
                        {"type": "text", "text": "9.8 is "},
                        {"type": "thinking", "thinking": " Sure."},
                        {"type": "text", "text": "larger."},
                    ],
                },
                "finish_reason": "stop",
            }
        ],
    }
    response = parse_completion(orjson.dumps(body))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (
        reasoning_part("Okay, 9.8 > 9.11. Sure."),
        text_part("9.8 is larger."),
    )


def test_content_blocks_in_stream_deltas() -> None:
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Hmm."}]}
    response = run_chunks(
        chunk({"role": "assistant", "content": [thinking]}),
        chunk({"content": [{"type": "text", "text": "Hi"}]}),
        chunk({"content": [{"type": "text", "text": " there"}, {"type": "text", "text": "!"}]}),
        chunk({"content": []}, "stop"),
    )
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (reasoning_part("Hmm."), text_part("Hi there!"))


def test_empty_placeholders_are_absent() -> None:
    placeholders = {
        "function_call": {"name": "", "arguments": ""},
        "audio": {},
        "refusal": "",
    }
    body = {
        "id": "",
        "object": "chat.completion",
        "created": 1,
        "model": "claude-3-5-sonnet",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    **placeholders,
                    "tool_calls": [
                        {
                            "id": "tool_1",
                            "type": "",
                            "function": {"name": "f", "arguments": "{}"},
                            "custom": {},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
    }
    response = parse_completion(orjson.dumps(body))
    response.validate_complete()
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts == (
        text_part("Checking."),
        tool_call_part("tool_1", "f", "{}"),
    )
    assert response.metadata is not None and response.metadata.id == ""
    # In a stream: every chunk says finish_reason "" and carries the placeholders.
    mapper = ChunkMapper()
    for delta in ({"content": "Che", **placeholders}, {"content": "cking.", **placeholders}):
        mapped = mapper.map("message", chunk(delta, "", id=""))
        assert mapped is not None and not mapper.finish_reason_seen
    mapper.map("message", chunk({"function_call": {"name": "", "arguments": ""}}, "stop"))
    assert mapper.finish_reason_seen


def test_other_choices_are_not_mapped() -> None:
    data = orjson.dumps({"id": "c", "choices": [{"index": 1, "delta": {"content": "x"}}]})
    response = ChunkMapper().map("message", data)
    assert response is not None and response.output is None


# ------------------------------------------------------------------------------- SSE


def test_sse_basic_events() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(
        b": keep-alive\n\ndata: a\n\nevent: error\ndata: b1\ndata:b2\nid: 7\nretry: 5\n\n"
    )
    assert events == [("message", b"a"), ("error", b"b1\nb2")]
    assert decoder.feed(b"data: c\n") == []  # not dispatched before the blank line
    assert decoder.feed(b"\n") == [("message", b"c")]
    assert decoder.feed(b"event: x\n\n") == []  # no data: nothing dispatched
    assert decoder.feed(b"data: d\n\n") == [("message", b"d")]  # event type was reset


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_sse_every_split_point_and_line_ending(newline: bytes) -> None:
    stream = (
        b'\xef\xbb\xbfdata: {"a": "\xc3\xa9"}'
        + newline
        + newline
        + b"data: x"
        + newline
        + b"data: y"
        + newline
        + newline
        + b"data: [DONE]"
        + newline
        + newline
    )
    expected = [("message", b'{"a": "\xc3\xa9"}'), ("message", b"x\ny"), ("message", b"[DONE]")]
    for cut in range(len(stream) + 1):
        for second in range(cut, len(stream) + 1, 7):
            decoder = SSEDecoder()
            events = decoder.feed(stream[:cut])
            events += decoder.feed(stream[cut:second])
            events += decoder.feed(stream[second:])
            assert events == expected, (cut, second)


def test_sse_byte_by_byte() -> None:
    stream = b"data: one\r\n\r\ndata: two\r\n\r\n"
    decoder = SSEDecoder()
    events = []
    for index in range(len(stream)):
        events += decoder.feed(stream[index : index + 1])
    assert events == [("message", b"one"), ("message", b"two")]


def test_sse_refuses_a_line_without_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sse, "MAX_LINE_BYTES", 16)
    decoder = SSEDecoder()
    decoder.feed(b"data: 0123456789")
    with pytest.raises(InvalidResponseError, match="longer than 16 bytes"):
        decoder.feed(b"abcdef")


def test_sse_an_event_whose_data_is_empty_is_not_dispatched() -> None:
    # WHATWG: a data buffer that is empty after removing its final LF dispatches nothing
    # (a lone "data:" keep-alive must not reach the JSON parser); two empty lines are LF.
    decoder = SSEDecoder()
    assert decoder.feed(b"data:\n\n") == []
    assert decoder.feed(b"data\n\nevent: x\ndata: \n\n") == []
    assert decoder.feed(b"data: a\n\n") == [("message", b"a")]  # event type was reset
    assert decoder.feed(b"data:\ndata:\n\n") == [("message", b"\n")]


def test_sse_refuses_an_event_name_that_is_not_utf8() -> None:
    with pytest.raises(InvalidResponseError, match="not UTF-8"):
        SSEDecoder().feed(b"event: \xff\n")


# ---------------------------------------------------------------------------- retries


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    assert _retry_after({"retry-after": "2"}) == 2.0
    assert _retry_after({"retry-after": "0.5"}) == 0.5
    assert _retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert _retry_after({"retry-after-ms": "soon", "retry-after": "9"}) == 9.0
    date = "Tue, 14 Nov 2023 22:13:30 GMT"  # now + 10 s
    assert _retry_after({"retry-after": date}, now=now) == pytest.approx(10.0)
    assert _retry_after({"retry-after": "Tue, 14 Nov 2023 22:13:30 -0000"}, now=now) == (
        pytest.approx(10.0)
    )
    assert _retry_after({"retry-after": date}, now=now + 60) == 0.0
    assert _retry_after({"retry-after": "-1"}) is None
    assert _retry_after({"retry-after": "nan"}) is None
    assert _retry_after({"retry-after": "tomorrow"}) is None
    assert _retry_after({}) is None


def test_lone_surrogates_are_an_invalid_response() -> None:
    with pytest.raises(InvalidResponseError):
        ChunkMapper().map("message", b'{"choices": [{"delta": {"content": "\\ud800"}}]}')
    with pytest.raises(InvalidResponseError):
        parse_completion(b'{"choices": [{"message": {"content": "\\udc00"}}]}')


def test_public_surface() -> None:
    import scope.models.openai as module

    assert module.__all__ == [
        "DEFAULT_BASE_URL",
        "DEFAULT_TIMEOUT",
        "OpenAIChatModel",
        "OpenAIResponsesModel",
    ]
    assert OpenAIChatModel.__module__ == "scope.models.openai"
