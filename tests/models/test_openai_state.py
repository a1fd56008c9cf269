"""The state OpenAI-compatible servers attach (DESIGN §7e), against the loopback server:
Gemini's ``extra_content`` thought signatures on tool calls, OpenRouter's
``reasoning_details``, DeepSeek-style ``reasoning_content`` inside a tool loop, and
answers that never state a finish reason (Snowflake Cortex). Each is kept, sent back
exactly, and stored by the history Middleware, by ``call`` and by ``stream``, under
asyncio and trio."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    ResponseAccumulator,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    reasoning_part,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata
from scope.models._openai_wire import (
    EXTRA_CONTENT_KEY,
    REASONING_DETAILS_KEY,
    ChunkMapper,
    parse_completion,
)
from tests.helpers import OPENAI, TIME, WEATHER, answer, body_of, merged
from tests.openai_server import OpenAIServer, check_request_body, load_transcript

pytestmark = pytest.mark.anyio

server = OPENAI.server_fixture()
make_model = OPENAI.recorded

QUESTION = user_message("What's the weather in Paris?")
MODES = ["call", "stream"]


def _transcript(name: str, mode: str) -> list[dict[str, Any]]:
    return load_transcript(name if mode == "call" else f"stream_{name}")


def _first_json(name: str) -> dict[str, Any]:
    exchange: dict[str, Any] = load_transcript(name)[0]["json"]
    return exchange


#: The model each recorded service answered with, and the provider_name to say.
SERVICES = {
    "gemini_compat_tool_turn": ("gemini-3-pro-preview", "gemini"),
    "openrouter_reasoning_details": ("anthropic/claude-sonnet-4.5", "openrouter"),
}


async def _tool_loop(
    server: OpenAIServer, name: str, mode: str, outputs: list[str]
) -> tuple[Response, Response, InMemoryStore]:
    """Run one tool loop through the history Middleware: the call, the tool results
    (one per call, in order), the answer. Returns both responses and the store."""
    store = InMemoryStore()
    server.script(*_transcript(name, mode))
    model_name, provider = SERVICES[name]
    model, _ = make_model(server, model=model_name, provider_name=provider)
    history = Middleware(store, store, "c1")
    async with model:
        bound: Any = wrap(model, history.call) if mode == "call" else None
        streamer: Any = wrap_stream(model, history.stream) if mode == "stream" else None
        target = bound if mode == "call" else streamer
        first = await answer(target, Request([QUESTION], tools=[WEATHER, TIME]), mode)
        assert first.output is not None and first.output.message is not None
        calls = first.output.message.tool_calls
        assert await store.read("c1") == []  # a tool call pauses the turn
        results = tool_message(
            *(
                ToolResult(call.id, call.name, ToolOutput.of_text(text))
                for call, text in zip(calls, outputs, strict=True)
            )
        )
        request = Request([QUESTION, first.output.message, results], tools=[WEATHER, TIME])
        second = await answer(target, request, mode)
    return first, second, store


# ------------------------------------------------------------ Gemini's extra_content


@pytest.mark.parametrize("mode", MODES)
async def test_gemini_thought_signatures_in_extra_content_go_back_on_their_call(
    server: OpenAIServer, mode: str
) -> None:
    first, second, store = await _tool_loop(
        server, "gemini_compat_tool_turn", mode, ["18C", "14:05"]
    )
    signature = _first_json("gemini_compat_tool_turn")["choices"][0]["message"]["tool_calls"][0][
        "extra_content"
    ]["google"]["thought_signature"]
    assert first.output is not None and first.output.message is not None
    parts = first.output.message.parts
    assert parts[0].metadata[EXTRA_CONTENT_KEY].value() == {
        "google": {"thought_signature": signature}
    }
    assert not parts[1].metadata  # only the first call of a parallel set has one
    # Gemini counts thinking outside completion_tokens: scope's output includes it.
    assert first.usage == Usage(74, 28 + 112, 112)
    sent = server.bodies()[1]["messages"][1]["tool_calls"]
    assert sent[0]["extra_content"] == {"google": {"thought_signature": signature}}
    assert "extra_content" not in sent[1]
    assert second.text == "It is 18°C in Paris and 14:05 there."
    stored = await store.read("c1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    # The stored call keeps it for the next turn's replay.
    assert stored[1].parts[0].metadata[EXTRA_CONTENT_KEY] == parts[0].metadata[EXTRA_CONTENT_KEY]


def test_extra_content_is_sent_verbatim_with_its_numbers() -> None:
    extra = RawJSON.parse('{"google":{"thought_signature":"c2ln"},"x":{"weight":1.50}}')
    request = Request(
        [
            QUESTION,
            OPENAI.own(
                assistant_message(
                    tool_call_part("c1", "get_weather", "{}", metadata={EXTRA_CONTENT_KEY: extra})
                )
            ),
            tool_message(ToolResult("c1", "get_weather", ToolOutput.of_text("18C"))),
        ]
    )
    built = OPENAI.build_body(
        request, default_options=request.options, model=OPENAI.model, stream=False
    )
    assert b'"extra_content":{"google":{"thought_signature":"c2ln"},"x":{"weight":1.50}}' in (
        orjson.dumps(built)
    )
    check_request_body(body_of(OPENAI, request))


def test_extra_content_on_a_held_back_fragment_survives_until_the_call_is_sent() -> None:
    mapper = ChunkMapper()

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return orjson.dumps(
            {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    extra = {"google": {"thought_signature": "c2ln"}}
    chunks = [
        mapper.map("message", chunk({"tool_calls": [{"index": 0, "extra_content": extra}]})),
        mapper.map(
            "message",
            chunk({"tool_calls": [{"index": 0, "id": "f1", "function": {"name": "f"}}]}),
        ),
        mapper.map(
            "message", chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
        ),
        mapper.map("message", chunk({}, "tool_calls")),
    ]
    response = merged(c for c in chunks if c is not None)
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part.tool_call is not None and part.tool_call.arguments == "{}"
    assert part.metadata[EXTRA_CONTENT_KEY].value() == extra


# ------------------------------------------------------- OpenRouter's reasoning_details


@pytest.mark.parametrize("mode", MODES)
async def test_openrouter_reasoning_details_are_kept_and_sent_back(
    server: OpenAIServer, mode: str
) -> None:
    first, second, store = await _tool_loop(server, "openrouter_reasoning_details", mode, ["18C"])
    details = _first_json("openrouter_reasoning_details")["choices"][0]["message"][
        "reasoning_details"
    ]
    assert first.output is not None and first.output.message is not None
    message = first.output.message
    # The stream's fragments assemble into exactly the array the whole body carries.
    assert message.metadata[REASONING_DETAILS_KEY].value() == details
    assert message.parts[0] == reasoning_part("The user wants the weather in Paris.")
    sent = server.bodies()[1]["messages"][1]
    assert sent["reasoning_details"] == details
    assert "reasoning_content" not in sent  # the details say it all
    assert second.text == "It is 18°C and sunny in Paris."
    stored = await store.read("c1")
    assert stored[1].metadata[REASONING_DETAILS_KEY] == message.metadata[REASONING_DETAILS_KEY]


def test_reasoning_details_alone_give_the_reasoning_text() -> None:
    body = _first_json("openrouter_reasoning_details")
    del body["choices"][0]["message"]["reasoning"]
    response = parse_completion(orjson.dumps(body))
    assert response.output is not None and response.output.message is not None
    assert response.output.message.parts[0] == reasoning_part(
        "The user wants the weather in Paris."
    )


def test_reasoning_details_after_the_last_part_go_to_the_message() -> None:
    # Details still unsent when a stream finishes without a part to carry them are
    # metadata for the message without a part: accumulated, the message has them.
    mapper = ChunkMapper()
    detail = {"type": "reasoning.encrypted", "data": "ZW5j", "index": 0}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return orjson.dumps(
            {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    acc = ResponseAccumulator()
    for data in (chunk({"content": "Hi"}), chunk({"reasoning_details": [detail]})):
        mapped = mapper.map("message", data)
        if mapped is not None:
            acc.add(mapped)
    finished = mapper.map("message", chunk({}, "stop"))
    details = Metadata({REASONING_DETAILS_KEY: [detail]})
    assert finished == Response(Output(None, FinishReason.STOP, message_metadata=details))
    acc.add(finished)
    response = acc.response()
    assert response is not None and response.output is not None
    assert response.output.message is not None
    assert response.output.message.metadata == details


@pytest.mark.parametrize(
    ("details", "match"),
    [
        ("x", r"reasoning_details must be an array"),
        ([1], r"reasoning_details\[0\] must be an object"),
        ([{"index": "0", "text": "a"}], r"reasoning_details\[0\]\.index must be an integer"),
        ([{"index": 0, "text": 5}], r"reasoning_details\[0\]\.text must be a string"),
    ],
)
def test_malformed_reasoning_details_are_an_invalid_response(details: Any, match: str) -> None:
    from scope.errors import InvalidResponseError

    data = orjson.dumps({"choices": [{"index": 0, "delta": {"reasoning_details": details}}]})
    with pytest.raises(InvalidResponseError, match=match):
        ChunkMapper().map("message", data)


# ------------------------------------------------ reasoning text inside a tool loop


def test_reasoning_goes_back_on_tool_calling_messages_only() -> None:
    request = Request(
        [
            user_message("Weather?"),
            assistant_message(reasoning_part("Plain answer thoughts."), "Sunny."),
            user_message("And in Paris?"),
            OPENAI.own(
                assistant_message(
                    reasoning_part("I need "),
                    reasoning_part("the tool.", b"sig"),
                    tool_call_part("c1", "get_weather", '{"city": "Paris"}'),
                )
            ),
            tool_message(ToolResult("c1", "get_weather", ToolOutput.of_text("18C"))),
        ],
        tools=[WEATHER],
    )
    body = body_of(OPENAI, request)
    check_request_body(body)
    assert body["messages"][1] == {"role": "assistant", "content": "Sunny."}
    assert body["messages"][3]["reasoning_content"] == "I need the tool."


# --------------------------------------------------- answers without a finish reason


@pytest.mark.parametrize("mode", MODES)
async def test_snowflake_answers_without_a_finish_reason_are_stored(
    server: OpenAIServer, mode: str
) -> None:
    # Cortex says finish_reason "" on every response: the history used to refuse it
    # ("a complete response needs a finish_reason").
    store = InMemoryStore()
    name = "placeholders_cortex" if mode == "call" else "stream_placeholders_cortex"
    server.script(*load_transcript(name))
    model, _ = make_model(server)
    history = Middleware(store, store, "c1")
    target: Any = (
        wrap(model, history.call) if mode == "call" else wrap_stream(model, history.stream)
    )
    async with model:
        paused = await answer(target, Request([QUESTION], tools=[WEATHER]), mode)
        assert paused.output is not None and paused.output.finish_reason is FinishReason.TOOL_CALLS
        assert paused.output.message is not None
        (call,) = paused.output.message.tool_calls
        final = {
            "status": 200,
            "sse" if mode == "stream" else "json": (
                [
                    {
                        "id": "",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": "claude-3-5-sonnet",
                        "choices": [
                            {"index": 0, "delta": {"content": "18C."}, "finish_reason": ""}
                        ],
                    },
                    "[DONE]",
                ]
                if mode == "stream"
                else {
                    "id": "",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "claude-3-5-sonnet",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "18C."},
                            "finish_reason": "",
                        }
                    ],
                }
            ),
        }
        server.script(final)
        request = Request(
            [
                QUESTION,
                paused.output.message,
                tool_message(ToolResult(call.id, call.name, ToolOutput.of_text("18C"))),
            ],
            tools=[WEATHER],
        )
        done = await answer(target, request, mode)
    assert done.output is not None and done.output.finish_reason is FinishReason.STOP
    stored = await store.read("c1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[-1] == Message(stored[-1].role, [text_part("18C.")], stored[-1].metadata)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # OpenAI: completion_tokens includes the reasoning.
        ({"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 40}, Usage(10, 30, 20)),
        # Gemini's compatible endpoint: total = prompt + completion + reasoning.
        ({"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 60}, Usage(10, 50, 20)),
        # No total, but more reasoning than completion: it cannot be included.
        ({"prompt_tokens": 10, "completion_tokens": 5}, Usage(10, 25, 20)),
    ],
)
def test_reasoning_counted_outside_completion_tokens_is_added(
    usage: dict[str, int], expected: Usage
) -> None:
    body = _first_json("gemini_compat_tool_turn")
    body["usage"] = {**usage, "completion_tokens_details": {"reasoning_tokens": 20}}
    assert parse_completion(orjson.dumps(body)).usage == expected
