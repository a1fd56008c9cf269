"""The Anthropic adapter's pure mapping: request bodies, responses, stream events.

Every body built here is validated with the official ``anthropic`` package's request
types (unknown fields refused at every level), unless a test deliberately passes a
field only an extension sets.
"""

from __future__ import annotations

import base64
import functools
import subprocess
import sys
from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Options,
    OutputFormat,
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
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
    UnsupportedOptionError,
)
from scope.media import Media
from scope.metadata import Metadata
from scope.models._anthropic_wire import API, PROVIDER, EventMapper, build_body, parse_message
from scope.models._provenance import Replay
from scope.models.anthropic import AnthropicModel
from tests.anthropic_server import check_event, check_message, check_request_body
from tests.helpers import ANTHROPIC, EXACT_WEATHER, hello, merged
from tests.helpers import body_of as provider_body_of

SIG = base64.b64encode(b"\x01signature bytes\xff").decode()  # padded: ends with "="


body_of = functools.partial(provider_body_of, ANTHROPIC)


# ----------------------------------------------------------------------------- requests


def test_full_request_maps_every_part_kind() -> None:
    request = Request(
        [
            system_message("Be brief."),
            system_message("Use metric units."),
            user_message(
                "What is in these?",
                media_part(Media.from_bytes("image/png", b"\x89PNG")),
                media_part(Media.from_uri("image/jpeg", "https://example.com/cat.jpg")),
                media_part(
                    Media("application/pdf", Media.from_bytes("a/b", b"%PDF").source, name="r.pdf")
                ),
                media_part(Media.from_uri("application/pdf", "https://example.com/r.pdf")),
                media_part(Media.from_bytes("text/plain; charset=utf-8", "héllo".encode())),
                media_part(Media.from_reference("application/pdf", "file_011abc")),
            ),
            ANTHROPIC.own(
                assistant_message(
                    reasoning_part("thinking...", b"\x01signature bytes\xff"),
                    reasoning_part("from another provider"),  # unsigned: not sent back
                    text_part("Let me check."),
                    tool_call_part("toolu_1", "get_weather", '{"city": "Paris", "days": 2.50}'),
                    tool_call_part("toolu_2", "get_weather", ""),
                )
            ),
            tool_message(ToolResult("toolu_1", "get_weather", ToolOutput.of_text("18C"))),
            tool_message(
                ToolResult(
                    "toolu_2",
                    "get_weather",
                    ToolOutput.of_json({"error": "bad args"}),
                    is_error=True,
                )
            ),
            user_message("And tomorrow?"),
        ],
        tools=[EXACT_WEATHER],
    )
    body = body_of(request)
    check_request_body(body)
    assert body["model"] == "claude-sonnet-4-5"
    assert body["max_tokens"] == 4096
    assert body["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use metric units."},
    ]
    user, assistant, results = body["messages"]
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these?"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="},
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="},
                "title": "r.pdf",
            },
            {"type": "document", "source": {"type": "url", "url": "https://example.com/r.pdf"}},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "héllo"},
            },
            {"type": "document", "source": {"type": "file", "file_id": "file_011abc"}},
        ],
    }
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "thinking...", "signature": SIG},
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris", "days": 2.5},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
        ],
    }
    # Consecutive tool messages and the user's next words form one user turn.
    assert results == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "18C"}],
            },
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [{"type": "text", "text": '{"error":"bad args"}'}],
                "is_error": True,
            },
            {"type": "text", "text": "And tomorrow?"},
        ],
    }
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "input_schema": orjson.loads(EXACT_WEATHER.input_schema.bytes),
        }
    ]


def test_schemas_and_arguments_keep_their_number_spelling() -> None:
    request = Request(
        [
            user_message("Hi"),
            assistant_message(tool_call_part("toolu_1", "get_weather", '{"days": 2.50}')),
            tool_message(ToolResult("toolu_1", "get_weather", ToolOutput.of_text("ok"))),
        ],
        tools=[EXACT_WEATHER],
    )
    raw = orjson.dumps(build_body(request, default_options=Options(), model="m", stream=False))
    assert b'"minimum":1.50' in raw
    assert b'"input":{"days":2.50}' in raw


def test_tool_result_media_and_empty_output() -> None:
    request = Request(
        [
            user_message("Draw"),
            assistant_message(
                tool_call_part("toolu_1", "draw", "{}"), tool_call_part("toolu_2", "draw", "{}")
            ),
            tool_message(
                ToolResult(
                    "toolu_1",
                    "draw",
                    ToolOutput(
                        [text_part("Here:"), media_part(Media.from_bytes("image/gif", b"G"))]
                    ),
                ),
                ToolResult("toolu_2", "draw", ToolOutput()),
            ),
        ]
    )
    body = body_of(request)
    check_request_body(body)
    first, second = body["messages"][2]["content"]
    assert first["content"] == [
        {"type": "text", "text": "Here:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "Rw=="}},
    ]
    assert second == {"type": "tool_result", "tool_use_id": "toolu_2"}


def test_redacted_reasoning_goes_back_as_redacted_thinking() -> None:
    data = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"
    redacted = {"anthropic/redacted": True}
    request = Request(
        [
            user_message("Hi"),
            ANTHROPIC.own(
                assistant_message(
                    reasoning_part("", data.encode(), metadata=redacted),
                    reasoning_part(
                        "", b"x" + data.encode(), metadata={**redacted, "anthropic/block": 1}
                    ),
                    text_part("Hello."),
                )
            ),
            user_message("Again"),
        ]
    )
    body = body_of(request)
    check_request_body(body)
    assert body["messages"][1]["content"][:2] == [
        {"type": "redacted_thinking", "data": data},
        {"type": "redacted_thinking", "data": "x" + data},
    ]
    bad = Request(
        [
            user_message("Hi"),
            ANTHROPIC.own(assistant_message(reasoning_part("", b"\xff", metadata=redacted), "ok")),
            user_message("Again"),
        ]
    )
    with pytest.raises(UnsupportedOptionError, match="data as UTF-8"):
        body_of(bad)


def test_options_map_to_their_fields() -> None:
    body = body_of(
        hello(
            max_tokens=300,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            stop=["END", "STOP"],
        )
    )
    check_request_body(body)
    assert body["max_tokens"] == 300
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.5, 0.9, 40)
    assert body["stop_sequences"] == ["END", "STOP"]
    assert "stop_sequences" not in body_of(hello(stop=()))


@pytest.mark.parametrize(
    ("effort", "thinking", "max_tokens"),
    [
        ("none", {"type": "disabled"}, 4096),
        ("minimal", {"type": "enabled", "budget_tokens": 1024}, 4096 + 1024),
        ("low", {"type": "enabled", "budget_tokens": 4096}, 4096 + 4096),
        ("medium", {"type": "enabled", "budget_tokens": 8192}, 4096 + 8192),
        ("high", {"type": "enabled", "budget_tokens": 16384}, 4096 + 16384),
        ("xhigh", {"type": "enabled", "budget_tokens": 32768}, 4096 + 32768),
    ],
)
def test_reasoning_effort_is_a_thinking_budget(
    effort: str, thinking: dict[str, Any], max_tokens: int
) -> None:
    body = body_of(hello(reasoning_effort=effort))
    check_request_body(body)
    assert body["thinking"] == thinking
    assert body["max_tokens"] == max_tokens
    assert body_of(hello(reasoning_effort=effort, max_tokens=40000))["max_tokens"] == 40000


def test_the_thinking_extension_wins_over_reasoning_effort() -> None:
    thinking = {"type": "adaptive"}
    body = body_of(hello(reasoning_effort="high", extensions={"anthropic/thinking": thinking}))
    check_request_body(body)
    assert body["thinking"] == thinking
    assert body["max_tokens"] == 4096  # no budget from reasoning_effort


def test_the_thinking_extensions_budget_shapes_max_tokens() -> None:
    thinking = {"type": "enabled", "budget_tokens": 10000}
    body = body_of(hello(extensions={"anthropic/thinking": thinking}))
    check_request_body(body)
    assert body["thinking"] == thinking and body["max_tokens"] == 4096 + 10000
    with pytest.raises(
        UnsupportedOptionError, match="extension 'anthropic/thinking' is a thinking budget"
    ):
        body_of(hello(max_tokens=10000, extensions={"anthropic/thinking": thinking}))


def test_unknown_reasoning_effort_is_refused() -> None:
    with pytest.raises(UnsupportedOptionError, match="'max' has no Anthropic thinking budget"):
        body_of(hello(reasoning_effort="max"))


def test_max_tokens_must_exceed_the_thinking_budget() -> None:
    with pytest.raises(UnsupportedOptionError, match="below max_tokens \\(16384\\)"):
        body_of(hello(reasoning_effort="high", max_tokens=16384))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"frequency_penalty": 0.1}, "frequency_penalty is not part"),
        ({"presence_penalty": -0.1}, "presence_penalty is not part"),
        ({"temperature": 1.5}, "temperature must be between 0 and 1"),
    ],
)
def test_options_the_api_cannot_carry_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=match):
        body_of(hello(**options))


def test_output_formats_travel_as_the_fallback_instruction() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    fmt = OutputFormat.json_schema("place", schema, "A place.")
    body = body_of(
        Request(
            [system_message("Be brief."), user_message("Hi")], options=Options(output_format=fmt)
        )
    )
    check_request_body(body)
    assert body["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": fmt.fallback_instruction()},
    ]
    json_body = body_of(hello(output_format=OutputFormat.json()))
    assert json_body["system"] == [
        {"type": "text", "text": OutputFormat.json().fallback_instruction()}
    ]
    assert "system" not in body_of(hello(output_format=OutputFormat.text()))


def test_anthropic_extensions_become_body_fields() -> None:
    body = body_of(
        hello(
            extensions={
                "anthropic/tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
                "anthropic/metadata": {"user_id": "u-1"},
                "anthropic/service_tier": "standard_only",
                "openai/seed": 7,  # another provider's: ignored
            }
        )
    )
    check_request_body(body)
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert body["metadata"] == {"user_id": "u-1"}
    assert body["service_tier"] == "standard_only"
    assert "seed" not in body


@pytest.mark.parametrize("field", ["messages", "model", "stream", "system"])
def test_reserved_extensions_are_refused(field: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=f"'anthropic/{field}' would overwrite"):
        body_of(hello(extensions={f"anthropic/{field}": 1}))


def test_streaming_body() -> None:
    body = body_of(hello(), stream=True)
    check_request_body(body)
    assert body["stream"] is True


def test_default_options_lie_under_the_request_options() -> None:
    body = body_of(
        hello(temperature=0.1),
        defaults=Options(model="claude-opus-4-1", temperature=0.9, max_tokens=99),
    )
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("claude-opus-4-1", 0.1, 99)


@pytest.mark.parametrize(
    ("media", "match"),
    [
        (Media.from_bytes("audio/wav", b"RIFF"), "audio/wav media cannot be sent"),
        (Media.from_bytes("image/tiff", b"II*"), "image/tiff media cannot be sent"),
        (Media.from_uri("text/plain", "https://example.com/a.txt"), "text/plain media cannot"),
        (Media.from_bytes("text/plain", b"\xff"), "text/plain media is not UTF-8"),
    ],
)
def test_media_the_api_cannot_carry_is_refused(media: Media, match: str) -> None:
    with pytest.raises(UnsupportedOptionError, match=match):
        body_of(Request([user_message(media_part(media))]))
    request = Request(
        [
            user_message("Hi"),
            assistant_message(tool_call_part("toolu_1", "f", "{}")),
            tool_message(ToolResult("toolu_1", "f", ToolOutput([media_part(media)]))),
        ]
    )
    with pytest.raises(UnsupportedOptionError, match=match):
        body_of(request)


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ((media_part(Media.from_bytes("image/png", b"x")),), "cannot carry media parts"),
        ((tool_call_part("toolu_1", "f", "{'not json"),), "arguments are not JSON"),
        ((tool_call_part("toolu_1", "f", "[1, 2]"),), "must be a JSON object"),
    ],
)
def test_assistant_parts_the_api_cannot_carry_are_refused(
    parts: tuple[Any, ...], match: str
) -> None:
    with pytest.raises(UnsupportedOptionError, match=f"messages\\[1\\].*{match}"):
        body_of(Request([user_message("Hi"), assistant_message(*parts), user_message("Go on")]))


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://localhost:8080/")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    model = AnthropicModel("claude-haiku-4-5")
    assert model.base_url == "http://localhost:8080"
    assert str(model._url) == "http://localhost:8080/v1/messages"
    assert model._headers["x-api-key"] == "sk-ant-env"
    assert "sk-ant-env" not in repr(model)
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    model = AnthropicModel("claude-haiku-4-5", headers={"X-API-KEY": "sk-other"})
    assert str(model._url) == "https://api.anthropic.com/v1/messages"
    assert model._headers["X-API-KEY"] == "sk-other" and "x-api-key" not in model._headers


def test_importing_scope_does_not_import_httpx() -> None:
    code = (
        "import sys, scope, scope.chat, scope.models, scope.errors, scope.codec\n"
        "import scope.models._anthropic_wire\n"
        "assert 'httpx' not in sys.modules, 'httpx imported'\n"
        "import scope.models.anthropic\n"
        "assert 'httpx' in sys.modules and 'anthropic' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_surface() -> None:
    import scope.models.anthropic as module

    assert module.__all__ == [
        "API_VERSION",
        "AnthropicModel",
        "DEFAULT_BASE_URL",
        "DEFAULT_MAX_TOKENS",
        "DEFAULT_TIMEOUT",
        "REASONING_BUDGETS",
    ]
    assert AnthropicModel.__module__ == "scope.models.anthropic"


# ---------------------------------------------------------------------------- responses


def message(content: list[Any], stop: str | None = "end_turn", **extra: Any) -> bytes:
    body: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    body.update(extra)
    check_message(body)
    return orjson.dumps(body)


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("max_tokens", FinishReason.LENGTH),
        ("tool_use", FinishReason.TOOL_CALLS),
        ("refusal", FinishReason.CONTENT_FILTER),
        ("pause_turn", FinishReason.OTHER),
        ("model_context_window_exceeded", FinishReason.OTHER),
        (None, None),
    ],
)
def test_stop_reasons(wire: str | None, reason: FinishReason | None) -> None:
    response = parse_message(message([{"type": "text", "text": "x"}], wire))
    assert response.output is not None and response.output.finish_reason is reason


def test_parse_usage_stop_sequence_and_thinking_tokens() -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 50,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 20,
        "output_tokens_details": {"thinking_tokens": 30},
    }
    response = parse_message(
        message([{"type": "text", "text": "a"}], "stop_sequence", stop_sequence="END", usage=usage)
    )
    assert response.usage == Usage(130, 50, 30, 100, 20)
    assert response.metadata is not None
    assert response.metadata.extra == Metadata({"anthropic/stop_sequence": "END"})


def test_parse_thinking_tool_use_and_adjacent_blocks() -> None:
    content = [
        {"type": "thinking", "thinking": "a", "signature": SIG},
        {"type": "thinking", "thinking": "b", "signature": SIG},
        {"type": "text", "text": "t"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    ]
    response = parse_message(message(content, "tool_use"))
    assert response.output is not None and response.output.message is not None
    signature = base64.b64decode(SIG)
    assert response.output.message.parts == (
        reasoning_part("a", signature),
        reasoning_part("b", signature, metadata={"anthropic/block": 1}),
        text_part("t"),
        tool_call_part("toolu_1", "f", '{"x":1}'),
        # The server's own block, kept whole in its place (DESIGN §6k).
        native_part(
            "anthropic.messages",
            "server_tool_use",
            {"id": "srvtoolu_1", "input": {}, "name": "web_search", "type": "server_tool_use"},
        ),
    )


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{oops", "not valid JSON"),
        (b"[]", "must be an object"),
        (b'{"content": {}}', "content must be an array"),
        (b'{"content": [1]}', r"content\[0\] must be an object"),
        (b'{"content": [{"type": "text", "text": 1}]}', r"content\[0\].text must be a string"),
        (
            b'{"content": [{"type": "thinking", "thinking": "a", "signature": "abc"}]}',
            "signature is not base64",
        ),
        (
            b'{"content": [{"type": "thinking", "thinking": "a", "signature": "YWI"}]}',
            "not base64|not canonical",
        ),
        (
            b'{"content": [{"type": "thinking", "thinking": "a", "signature": "YWJ="}]}',
            "not canonical base64",
        ),
        (b'{"content": [{"type": "redacted_thinking", "data": ""}]}', "data must not be empty"),
        (
            b'{"content": [{"type": "tool_use", "id": "", "name": "f"}]}',
            r"content\[0\]: tool call id must not be empty",
        ),
        (b'{"content": [{"type": "tool_use", "id": "t", "name": "f", "input": 1}]}', "input must"),
        (b'{"content": [], "stop_reason": 3}', "stop_reason must be a string"),
        (b'{"content": [], "usage": {"input_tokens": -1}}', "input_tokens must be a non-negative"),
        (b'{"content": [], "stop_sequence": 1}', "stop_sequence must be a string"),
        (b'{"content": [], "id": " msg"}', "surrounding whitespace"),
        (b'{"content": [{"type": "text", "text": "\\ud800"}]}', "response"),
    ],
)
def test_malformed_messages(body: bytes, match: str) -> None:
    with pytest.raises(InvalidResponseError, match=match):
        parse_message(body)


@pytest.mark.parametrize(
    ("error_type", "cls"),
    [
        ("invalid_request_error", BadRequestError),
        ("authentication_error", AuthenticationError),
        ("permission_error", AuthenticationError),
        ("not_found_error", BadRequestError),
        ("rate_limit_error", RateLimitError),
        ("api_error", ProviderServerError),
        ("overloaded_error", ProviderServerError),
        ("brand_new_error", ProviderError),
    ],
)
def test_error_bodies_and_events_pick_the_class_of_their_type(
    error_type: str, cls: type[ProviderError]
) -> None:
    data = orjson.dumps({"type": "error", "error": {"type": error_type, "message": "boom"}})
    with pytest.raises(ProviderError, match="with an error: boom") as info:
        parse_message(data)
    assert type(info.value) is cls and info.value.status_code is None
    with pytest.raises(ProviderError, match="mid-stream: boom") as info:
        EventMapper().map("error", data)
    assert type(info.value) is cls


# ------------------------------------------------------------------------------- events


def event(kind: str, **fields: Any) -> bytes:
    body = {"type": kind, **fields}
    check_event(body)
    return orjson.dumps(body)


START = event(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 5},
    },
)


def run_events(*events: bytes) -> tuple[list[Response], Response]:
    mapper = EventMapper()
    chunks = [chunk for data in events if (chunk := mapper.map("", data)) is not None]
    return chunks, merged(chunks)


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return event("content_block_start", index=index, content_block=block)


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return event("content_block_delta", index=index, delta=delta)


def block_stop(index: int) -> bytes:
    return event("content_block_stop", index=index)


def test_stream_usage_is_a_cumulative_snapshot() -> None:
    chunks, response = run_events(
        START,
        event(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": 20, "input_tokens": 10, "cache_read_input_tokens": 5},
        ),
        event("message_stop"),
    )
    assert chunks[0].usage == Usage(15, 1, cache_read_input_tokens=5)
    assert response.usage == Usage(15, 20, cache_read_input_tokens=5)
    assert response.metadata is not None and response.metadata.id == "msg_1"


def test_stream_adjacent_thinking_blocks_stay_apart() -> None:
    _, response = run_events(
        START,
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        block_delta(0, {"type": "thinking_delta", "thinking": "a"}),
        block_delta(0, {"type": "signature_delta", "signature": SIG}),
        block_stop(0),
        block_start(1, {"type": "thinking", "thinking": "", "signature": ""}),
        block_delta(1, {"type": "thinking_delta", "thinking": "b"}),
        block_delta(1, {"type": "signature_delta", "signature": SIG}),
        block_stop(1),
    )
    assert response.output is not None and response.output.message is not None
    signature = base64.b64decode(SIG)
    assert response.output.message.parts == (
        reasoning_part("a", signature),
        reasoning_part("b", signature, metadata={"anthropic/block": 1}),
    )


def test_stream_tool_use_with_input_at_start_and_no_deltas() -> None:
    _, response = run_events(
        START,
        block_start(0, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}),
        block_stop(0),
    )
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part.tool_call == ToolCall("toolu_1", "f", '{"a":1}')


def test_stream_ping_and_unknown_events_add_nothing_server_blocks_come_whole() -> None:
    mapper = EventMapper()
    assert mapper.map("ping", b'{"type": "ping"}') is None
    assert mapper.map("future", b'{"type": "future_event", "x": 1}') is None
    server_block = {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "web_search",
        "input": {},
    }
    assert mapper.map("", block_start(0, server_block)) is None
    for fragment in ('{"query": ', '"Paris 2.50"}'):
        delta = {"type": "input_json_delta", "partial_json": fragment}
        assert mapper.map("", block_delta(0, delta)) is None
    # The block arrives whole when it stops: its input as streamed (DESIGN §6k).
    whole = mapper.map("", block_stop(0))
    assert whole is not None and whole.message is not None
    native = whole.message.parts[0].native
    assert native is not None and native.type == "server_tool_use"
    assert native.data.bytes == (
        b'{"id":"srvtoolu_1","input":{"query":"Paris 2.50"},"name":"web_search",'
        b'"type":"server_tool_use"}'
    )
    assert mapper.map("", event("message_stop")) is None and mapper.end_marker_seen


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([block_delta(0, {"type": "text_delta", "text": "x"})], "block 0 was never started"),
        ([block_stop(3)], "block 3 was never started"),
        ([b'{"type": "content_block_stop", "index": -1}'], "index must be a non-negative"),
        (
            [
                block_start(0, {"type": "text", "text": ""}),
                block_delta(0, {"type": "input_json_delta", "partial_json": "{"}),
            ],
            "an input_json_delta for a text block",
        ),
        (
            [
                block_start(0, {"type": "text", "text": ""}),
                block_start(0, {"type": "text", "text": ""}),
            ],
            "started twice",
        ),
        (
            [
                block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
                block_delta(0, {"type": "signature_delta", "signature": "YWJ="}),
                block_stop(0),
            ],
            "not canonical base64",
        ),
        (
            [
                event(
                    "message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}
                ),
                block_start(0, {"type": "text", "text": "late"}),
            ],
            "after the stop_reason",
        ),
        ([event("message_stop"), event("ping")], "after message_stop"),
        ([b"{oops"], "not valid JSON"),
        ([b'{"type": "message_start", "message": 1}'], "message must be an object"),
        (
            [block_start(0, {"type": "tool_use", "id": "", "name": "f", "input": {}})],
            "content_block_start",
        ),
        ([block_start(0, {"type": "redacted_thinking", "data": ""})], "data must not be empty"),
    ],
)
def test_malformed_events(events: list[bytes], match: str) -> None:
    mapper = EventMapper()
    with pytest.raises(InvalidResponseError, match=match):
        for data in events:
            mapper.map("", data)


def test_stream_maps_like_call() -> None:
    # The same answer through both paths gives equal responses (bar the block key that
    # only adjacency adds, which both paths add alike).
    content = [
        {"type": "thinking", "thinking": "hm", "signature": SIG},
        {"type": "redacted_thinking", "data": "AAAA"},
        {"type": "redacted_thinking", "data": "BBBB"},
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    ]
    called = parse_message(message(content, "tool_use"))
    _, streamed = run_events(
        START,
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        block_delta(0, {"type": "thinking_delta", "thinking": "hm"}),
        block_delta(0, {"type": "signature_delta", "signature": SIG}),
        block_stop(0),
        block_start(1, {"type": "redacted_thinking", "data": "AAAA"}),
        block_stop(1),
        block_start(2, {"type": "redacted_thinking", "data": "BBBB"}),
        block_stop(2),
        block_start(3, {"type": "text", "text": ""}),
        block_delta(3, {"type": "text_delta", "text": "Hi"}),
        block_stop(3),
        block_start(4, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}),
        block_stop(4),
        event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 5}),
        event("message_stop"),
    )
    assert called.output is not None and streamed.output is not None
    assert called.output.message == streamed.output.message
    assert called.output.finish_reason is streamed.output.finish_reason is FinishReason.TOOL_CALLS
    assert called.output.message is not None
    assert called.output.message.tool_calls == (ToolCall("toolu_1", "f", "{}"),)


def test_reasoning_that_cannot_go_back_is_left_out_and_counted() -> None:
    # Unsigned thinking (another provider's, or an interrupted turn's) cannot be
    # verified by the API; a message left with nothing is left out whole, and the
    # user turns around it are joined by the API.
    replay = Replay(API, PROVIDER)
    request = Request(
        [
            user_message("Hi"),
            ANTHROPIC.own(assistant_message(reasoning_part("unsigned"))),
            user_message("Go on"),
            ANTHROPIC.own(assistant_message(reasoning_part("half a thought"), "Sure.")),
            user_message("Thanks"),
        ]
    )
    body = orjson.loads(
        orjson.dumps(
            build_body(
                request,
                default_options=Options(),
                model=ANTHROPIC.model,
                stream=False,
                replay=replay,
            )
        )
    )
    check_request_body(body)
    assert [m["role"] for m in body["messages"]] == ["user", "user", "assistant", "user"]
    assert body["messages"][2]["content"] == [{"type": "text", "text": "Sure."}]
    assert replay.left_out == [
        "messages[1].parts[0] (reasoning without a signature)",
        "messages[3].parts[0] (reasoning without a signature)",
    ]


def test_a_streamed_container_that_is_no_object_is_refused() -> None:
    mapper = EventMapper()
    mapper.map("", START)
    # Built by hand: the SDK's event types (event() checks with them) refuse it too.
    bad = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "container": "c1"}}
    late = orjson.dumps(bad)
    with pytest.raises(InvalidResponseError, match=r"message_delta\.delta\.container"):
        mapper.map("", late)
