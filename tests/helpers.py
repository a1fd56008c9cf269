"""Small builders and readers of test values, shared by the whole test suite.

Test modules import helpers from here (values), ``tests.servers`` (servers and store
backends), ``tests.strategies`` / ``tests.strategies_stream`` (Hypothesis strategies) and
``tests.openai_server`` / ``tests.anthropic_server`` / ``tests.gemini_server`` /
``tests.responses_server`` (fake
provider servers), never from
another test module.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import attrs
import orjson
import pytest

from scope.chat import (
    Message,
    Options,
    Request,
    Response,
    ResponseAccumulator,
    ToolCallDelta,
    ToolDefinition,
    assistant_message,
    collect,
    user_message,
)
from scope.history import Batch
from scope.jsonvalue import RawJSON
from scope.models import (
    _anthropic_wire,
    _gemini_wire,
    _interactions_wire,
    _openai_wire,
    _responses_wire,
)
from scope.models._http import HTTPAdapter
from scope.models._provenance import Replay, stamp
from scope.models.anthropic import AnthropicModel
from scope.models.gemini import GeminiInteractionsModel, GeminiModel
from scope.models.openai import OpenAIChatModel, OpenAIResponsesModel
from tests import (
    anthropic_server,
    gemini_interactions_server,
    gemini_server,
    openai_server,
    responses_server,
)

__all__ = [
    "ANTHROPIC",
    "GEMINI",
    "OPENAI",
    "PROVIDERS",
    "RESPONSES",
    "ROOT",
    "EXACT_WEATHER",
    "TIME",
    "WEATHER",
    "Provider",
    "Sleeps",
    "accumulate",
    "answer",
    "body_of",
    "batch",
    "collect_until_cancelled",
    "hello",
    "merged",
    "numbered_turn",
    "recording_sleeps",
    "nested",
    "respell",
    "subprocess_env",
    "texts",
    "tool_call_deltas",
    "turn",
]

M = TypeVar("M")

#: The root of this source tree.
ROOT = Path(__file__).resolve().parents[1]

#: Tools the provider tests offer the model.
WEATHER = ToolDefinition(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "The current weather in a city.",
)
TIME = ToolDefinition(
    "get_time",
    {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    "The local time in a time zone.",
)
#: The weather tool with a schema holding a number to keep as spelled (``1.50``).
EXACT_WEATHER = ToolDefinition(
    "get_weather",
    RawJSON.parse(
        '{"type": "object", "properties": {"city": {"type": "string"},'
        ' "days": {"type": "number", "minimum": 1.50}}, "required": ["city"]}'
    ),
    "The current weather in a city.",
)


def turn(tag: str, size: int = 2) -> list[Message]:
    """A user question and ``size - 1`` answers: ``"<tag> q"``, ``"<tag> a"``, and for
    longer turns ``"<tag> a2"``, ``"<tag> a3"``..."""
    answers = [f"{tag} a"] + [f"{tag} a{i}" for i in range(2, size)]
    return [user_message(f"{tag} q"), *map(assistant_message, answers)]


def hello(**options: Any) -> Request:
    """``"Hi"``, with ``options``."""
    return Request([user_message("Hi")], options=Options(**options))


def numbered_turn(cid: str, aid: str, size: int = 2) -> list[Message]:
    """``size`` messages whose texts ``"<cid>|<aid>|<index>"`` say where they belong: a
    user message, then answers."""
    return [user_message(f"{cid}|{aid}|0")] + [
        assistant_message(f"{cid}|{aid}|{i}") for i in range(1, size)
    ]


def batch(cid: str, aid: str, text: str = "hello") -> Batch:
    """A two-message batch: ``text`` asked, ``text + "!"`` answered."""
    return Batch(cid, aid, [user_message(text), assistant_message(text + "!")])


def texts(messages: Iterable[Message]) -> list[str]:
    """The text of each message, in order."""
    return [m.text for m in messages]


class Sleeps:
    """Records the delays a model asks for instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await anyio.lowlevel.checkpoint()


def recording_sleeps(model: M) -> tuple[M, Sleeps]:
    """``model``, its retry sleeps recorded (not waited) by the returned ``Sleeps``."""
    sleeps = Sleeps()
    model._sleep = sleeps  # type: ignore[attr-defined]
    return model, sleeps


async def collect_until_cancelled(stream: AsyncIterator[Response], after: float = 0.05) -> None:
    """Collect ``stream`` under a cancel scope that fires after ``after`` seconds: the
    cancellation must reach this caller, once, and end at the scope."""
    caught: list[type[BaseException]] = []
    with anyio.move_on_after(after) as scope:
        try:
            await collect(stream)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(type(exc))
            raise
    assert scope.cancelled_caught
    assert caught == [anyio.get_cancelled_exc_class()]


def tool_call_deltas(chunks: Iterable[Response]) -> list[ToolCallDelta]:
    """The tool call fragments of ``chunks``, in order."""
    return [
        part.tool_call_delta
        for chunk in chunks
        if chunk.output is not None and chunk.output.message is not None
        for part in chunk.output.message.parts
        if part.tool_call_delta is not None
    ]


def merged(chunks: Iterable[Response]) -> Response:
    """The chunks merged by a ResponseAccumulator (each must be valid, and one at least
    non-empty)."""
    accumulator = ResponseAccumulator()
    for chunk in chunks:
        accumulator.add(chunk)
    response = accumulator.response()
    assert response is not None
    return response


async def accumulate(stream: AsyncIterator[Response]) -> tuple[list[Response], Response]:
    """Every chunk of ``stream``, and the chunks ``merged``."""
    async with contextlib.aclosing(stream) as iterator:  # type: ignore[type-var]
        chunks = [chunk async for chunk in iterator]
    return chunks, merged(chunks)


async def answer(model: Any, request: Request, mode: str) -> Response:
    """The whole response of ``model``, by ``call`` (``mode == "call"``) or by
    accumulating ``stream`` (``mode == "stream"``)."""
    if mode == "call":
        response: Response = await model.call(request)
        return response
    _, response = await accumulate(model.stream(request))
    return response


# ------------------------------------------------------------------- provider adapters


@attrs.frozen
class Provider:
    """One provider adapter (scope.models._http.HTTPAdapter) with its loopback server
    and transcripts, for the tests both adapters share (tests/models/test_http_adapters.py,
    tests/models/test_provider_history.py); the expected values that differ by provider."""

    name: str
    model_class: type[HTTPAdapter]
    #: The fake server (tests/openai_server.py, tests/anthropic_server.py).
    server_class: type[openai_server.OpenAIServer]
    load_transcript: Callable[[str], list[dict[str, Any]]]
    build_body: Callable[..., Any]
    model: str
    api_key: str
    #: The environment variables' prefix (``<env>_API_KEY``, ``<env>_BASE_URL``).
    env: str
    default_base_url: str
    #: The path every request goes to.
    path: str
    #: The header carrying the API key, and its value for a key.
    auth_header: str
    auth_value: Callable[[str], str]
    #: A header of the provider's own the caller passes on.
    extra_header: tuple[str, str]
    #: Options the adapter refuses (UnsupportedOptionError naming the first key).
    unsupported: dict[str, Any]
    #: The transcript of a plain text answer, and its text.
    text: str
    text_answer: str
    #: rate_limit_then_ok's 429: the error message's start and a field of body["error"].
    rate_limit_message: str
    rate_limit_error: tuple[str, str]
    #: unauthorized's 401: the message's start and a field of body["error"].
    unauthorized_message: str
    unauthorized_error: tuple[str, str]
    #: A transcript of retried server errors, then an answer: its name, the
    #: (status, request id) of each error, the message, body["error"]["type"], the answer.
    server_error: str
    server_errors: tuple[tuple[int, str], ...]
    server_error_message: str
    server_error_type: str
    server_error_answer: str
    #: stream_error_event: the chunks' texts before the error event, the message, the
    #: request id and body["error"]["type"].
    error_event: tuple[tuple[str, ...], str, str, str]
    #: stream_early_stop: the chunks' texts before the server holds.
    early_stop_texts: tuple[str, ...]
    #: Stream bodies: one with a malformed event, one dropped mid-body, one ending
    #: before the response finished; the chunks' texts before each (malformed, dropped).
    malformed: Callable[[], dict[str, Any]]
    malformed_texts: tuple[str, ...]
    dropped: Callable[[], dict[str, Any]]
    dropped_texts: tuple[str, ...]
    unfinished: Callable[[], dict[str, Any]]
    #: An error body for a status, with ``message``.
    error_body: Callable[[str], dict[str, Any]]
    #: The member of ``body["error"]`` naming the error's kind (``server_error_type``,
    #: ``error_event``'s).
    error_kind: str = "type"
    #: The status_code of stream_error_event's error: the HTTP status (200) unless the
    #: event states one.
    error_event_status: int = 200
    #: The module the adapter lives in (``scope.models.<name>`` unless given).
    module: str = attrs.field(
        default=attrs.Factory(lambda self: f"scope.models.{self.name}", takes_self=True)
    )
    #: Whether the stream ends with an event of its own after the finish (``[DONE]``,
    #: ``message_stop``); Gemini's has none, the Responses API's ``response.completed`` is both.
    end_event: bool = True

    def __str__(self) -> str:
        return self.name

    def make(self, base_url: str, **kwargs: Any) -> Any:
        """The adapter for ``base_url`` (the default model unless ``model`` is given; a
        test API key unless ``api_key`` is given)."""
        kwargs.setdefault("api_key", self.api_key)
        model = kwargs.pop("model", self.model)
        return self.model_class(model, base_url=base_url, **kwargs)

    def own(self, message: Message, model: str = "", *, asked: str | None = None) -> Message:
        """``message`` stamped as this adapter's answer (DESIGN §6c: its state goes
        back), from ``model`` (default: the model the provider tests ask for); with
        ``asked``, stamped as v0.4 stamps (``scope/asked``, §6g), else as v0.3 did."""
        wire = self.model_class._WIRE
        return stamp(message, wire.api, wire.provider, model or self.model, asked=asked)

    def recorded(self, server: openai_server.OpenAIServer, **kwargs: Any) -> tuple[Any, Sleeps]:
        """The adapter for ``server`` (retry backoff 0.01 s unless given), its retry
        sleeps recorded, not waited (``recording_sleeps``)."""
        kwargs.setdefault("retry_backoff", 0.01)
        return recording_sleeps(self.make(server.base_url, **kwargs))

    def server_fixture(self) -> Any:
        """A ``server`` fixture for a test module: this provider's server, running."""

        @pytest.fixture
        def server() -> Iterator[openai_server.OpenAIServer]:
            with self.serve() as srv:
                yield srv

        return server

    def stream_text(self) -> dict[str, Any]:
        """The exchange of stream_text ("Hello world!")."""
        return self.load_transcript("stream_text")[0]

    @contextlib.contextmanager
    def serve(self) -> Iterator[openai_server.OpenAIServer]:
        """The running server; every request it received is checked at the end."""
        with self.server_class() as server:
            yield server
        server.check_requests()


def _openai_unfinished() -> dict[str, Any]:
    return {"status": 200, "sse": [openai_server.load_transcript("stream_text")[0]["sse"][1]]}


def _anthropic_sse(items: list[Any]) -> dict[str, Any]:
    return {"status": 200, "sse": items}


def _anthropic_text_events() -> list[Any]:
    events: list[Any] = anthropic_server.load_transcript("stream_text")[0]["sse"]
    return events


OPENAI = Provider(
    name="openai",
    model_class=OpenAIChatModel,
    server_class=openai_server.OpenAIServer,
    load_transcript=openai_server.load_transcript,
    build_body=_openai_wire.build_body,
    model="gpt-4o-mini",
    api_key="sk-test",
    env="OPENAI",
    default_base_url="https://api.openai.com/v1",
    path="/v1/chat/completions",
    auth_header="authorization",
    auth_value="Bearer {}".format,
    extra_header=("X-Trace", "t1"),
    unsupported={"top_k": 3},
    text="plain_answer",
    text_answer="The capital of France is Paris.",
    rate_limit_message="Rate limit reached",
    rate_limit_error=("code", "rate_limit_exceeded"),
    unauthorized_message="Incorrect API key",
    unauthorized_error=("code", "invalid_api_key"),
    server_error="server_error_twice",
    server_errors=((500, "req_500_1"), (500, "req_500_2")),
    server_error_message="The server had an error",
    server_error_type="server_error",
    server_error_answer="Third time lucky.",
    error_event=(("Par",), "overloaded", "req_err_1", "server_error"),
    early_stop_texts=("one", " two", " three"),
    malformed=lambda: openai_server.load_transcript("stream_malformed")[0],
    malformed_texts=("Hel",),
    dropped=lambda: openai_server.load_transcript("stream_dropped")[0],
    dropped_texts=("Once upon", " a time"),
    unfinished=_openai_unfinished,
    error_body=lambda message: {"error": {"message": message}},
)

ANTHROPIC = Provider(
    name="anthropic",
    model_class=AnthropicModel,
    server_class=anthropic_server.AnthropicServer,
    load_transcript=anthropic_server.load_transcript,
    build_body=_anthropic_wire.build_body,
    model="claude-sonnet-4-5",
    api_key="sk-ant-test",
    env="ANTHROPIC",
    default_base_url="https://api.anthropic.com",
    path="/v1/messages",
    auth_header="x-api-key",
    auth_value="{}".format,
    extra_header=("anthropic-beta", "context-1m-2025-08-07"),
    unsupported={"frequency_penalty": 0.5},
    text="text",
    text_answer="The capital of France is Paris.",
    rate_limit_message="Number of request tokens",
    rate_limit_error=("type", "rate_limit_error"),
    unauthorized_message="invalid x-api-key",
    unauthorized_error=("type", "authentication_error"),
    server_error="overloaded_then_ok",
    server_errors=((529, "req_529_1"),),
    server_error_message="Overloaded",
    server_error_type="overloaded_error",
    server_error_answer="Back again.",
    error_event=(("", "Par"), "Overloaded", "req_serr_1", "overloaded_error"),
    early_stop_texts=("", "one", " two"),
    malformed=lambda: _anthropic_sse(
        [*_anthropic_text_events()[:2], {"$raw": "event: x\ndata: {oops\n\n"}]
    ),
    malformed_texts=("",),
    dropped=lambda: _anthropic_sse([*_anthropic_text_events()[:5], {"$drop": True}]),
    dropped_texts=("", "Hello", " world"),
    unfinished=lambda: _anthropic_sse(_anthropic_text_events()[:4]),
    error_body=lambda message: {"type": "error", "error": {"message": message}},
)


def _gemini_sse(items: list[Any]) -> dict[str, Any]:
    return {"status": 200, "sse": items}


def _gemini_text_chunks() -> list[Any]:
    chunks: list[Any] = gemini_server.load_transcript("stream_text")[0]["sse"]
    return chunks


GEMINI = Provider(
    name="gemini",
    model_class=GeminiModel,
    server_class=gemini_server.GeminiServer,
    load_transcript=gemini_server.load_transcript,
    build_body=_gemini_wire.build_body,
    model="gemini-3-pro-preview",
    api_key="AIza-test",
    env="GEMINI",
    default_base_url="https://generativelanguage.googleapis.com",
    path="/v1beta/models/gemini-3-pro-preview:generateContent",
    auth_header="x-goog-api-key",
    auth_value="{}".format,
    extra_header=("x-goog-user-project", "proj-1"),
    unsupported={"reasoning_effort": "extreme"},
    text="text",
    text_answer="The capital of France is Paris.",
    rate_limit_message="You exceeded your current quota",
    rate_limit_error=("status", "RESOURCE_EXHAUSTED"),
    unauthorized_message="Request had invalid authentication credentials",
    unauthorized_error=("status", "UNAUTHENTICATED"),
    server_error="server_error_twice",
    server_errors=((503, "req_503_1"), (503, "req_503_2")),
    server_error_message="The model is overloaded",
    server_error_type="UNAVAILABLE",
    server_error_answer="Third time lucky.",
    error_event=(("Par",), "The model is overloaded", "req_err_1", "UNAVAILABLE"),
    early_stop_texts=("one", " two", " three"),
    malformed=lambda: _gemini_sse([_gemini_text_chunks()[0], {"$raw": "data: {oops\n\n"}]),
    malformed_texts=("Hello",),
    dropped=lambda: _gemini_sse([*_gemini_text_chunks()[:2], {"$drop": True}]),
    dropped_texts=("Hello", " world"),
    unfinished=lambda: _gemini_sse(_gemini_text_chunks()[:2]),
    error_body=lambda message: {"error": {"message": message, "status": "STATUS"}},
    error_kind="status",
    error_event_status=503,
    end_event=False,
)


# INVENTED: the exchanges the shared adapter tests ask for by name, for the Interactions
# API (no public recordings of its errors but a 400's body, ``{"error": {"message",
# "code"}}``, whose shape they follow); the text answer is a recorded one.


def _interactions_sse(items: list[Any], status: int = 200) -> dict[str, Any]:
    """An exchange streaming ``items``: event payloads framed as the API frames them
    (``event: <event_type>``), ``"[DONE]"`` as its ``done`` event, control items as they
    are."""
    out: list[Any] = []
    for item in items:
        if item == "[DONE]":
            out.append({"$raw": "event: done\ndata: [DONE]\n\n"})
        elif any(key.startswith("$") for key in item):
            out.append(item)
        else:
            data = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
            out.append({"$raw": f"event: {item['event_type']}\ndata: {data}\n\n"})
    return {"status": status, "headers": {}, "sse": out}


def _interactions_head(*texts: str) -> list[Any]:
    created = {"id": "", "status": "in_progress", "model": "gemini-3.7-flash"}
    events: list[Any] = [
        {"event_type": "interaction.created", "interaction": created},
        {"event_type": "step.start", "index": 0, "step": {"type": "model_output"}},
    ]
    events += [
        {"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": text}}
        for text in texts
    ]
    return events


def _interactions_tail() -> list[Any]:
    usage = {"total_input_tokens": 3, "total_output_tokens": 3, "total_tokens": 6}
    done = {"id": "", "status": "completed", "model": "gemini-3.7-flash", "usage": usage}
    return [
        {"event_type": "step.stop", "index": 0},
        {"event_type": "interaction.completed", "interaction": done},
        "[DONE]",
    ]


def _interactions_answer(text: str) -> dict[str, Any]:
    steps = [{"type": "model_output", "content": [{"type": "text", "text": text}]}]
    body = {"id": "", "status": "completed", "model": "gemini-3.7-flash", "steps": steps}
    return {"status": 200, "headers": {}, "json": body}


def _interactions_error(status: int, request_id: str, code: str, message: str) -> dict[str, Any]:
    body = {"error": {"message": message, "code": code}}
    return {"status": status, "headers": {"x-request-id": request_id}, "json": body}


def _interactions_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of a transcript: a recorded one of
    tests/gemini_interactions_transcripts/, a stream as recorded and the text answer
    (``"text"``) and the tool call (``"tool_call"``) assembled from one; or one of the
    invented ones above."""
    if name in ("text", "tool_call"):  # a recorded stream, as one body
        recorded = "stream_final_answer" if name == "text" else "stream_tool_call"
        (exchange,) = gemini_interactions_server.load(recorded)["exchanges"]
        body = gemini_interactions_server.assembled(gemini_interactions_server.events_of(exchange))
        return [{"status": 200, "headers": exchange["headers"], "json": body}]
    if name == "stream_text":
        return [
            _interactions_sse([*_interactions_head("Hello", " world", "!"), *_interactions_tail()])
        ]
    if name == "rate_limit_then_ok":
        limited = _interactions_error(
            429, "req_429_1", "resource_exhausted", "You exceeded your current quota"
        )
        limited["headers"]["retry-after"] = "2"
        return [limited, _interactions_answer("Done waiting.")]
    if name == "unauthorized":
        message = "Request had invalid authentication credentials"
        return [_interactions_error(401, "req_401_1", "unauthenticated", message)]
    if name == "server_error_twice":
        return [
            _interactions_error(503, "req_503_1", "unavailable", "The model is overloaded"),
            _interactions_error(503, "req_503_2", "unavailable", "The model is overloaded"),
            _interactions_answer("Third time lucky."),
        ]
    if name == "stream_error_event":
        error = {
            "event_type": "error",
            "error": {"message": "The model is overloaded", "code": "unavailable"},
        }
        exchange = _interactions_sse([*_interactions_head("Par"), error])
        exchange["headers"] = {"x-request-id": "req_err_1"}
        return [exchange]
    if name == "stream_early_stop":
        return [_interactions_sse([*_interactions_head("one", " two", " three"), {"$hold": True}])]
    exchanges: list[dict[str, Any]] = gemini_interactions_server.load(name)["exchanges"]
    return exchanges


INTERACTIONS = Provider(
    name="gemini-interactions",
    model_class=GeminiInteractionsModel,
    server_class=gemini_interactions_server.InteractionsServer,
    load_transcript=_interactions_transcript,
    build_body=_interactions_wire.build_body,
    model="gemini-3.7-flash",
    api_key="AIza-test",
    env="GEMINI",
    default_base_url="https://generativelanguage.googleapis.com",
    path="/v1beta/interactions",
    auth_header="x-goog-api-key",
    auth_value="{}".format,
    extra_header=("x-goog-user-project", "proj-1"),
    unsupported={"top_k": 3},
    text="text",
    text_answer=(
        "The current weather in Hobart, Tasmania is sunny and 18°C (64°F) with a light breeze."
    ),
    rate_limit_message="You exceeded your current quota",
    rate_limit_error=("code", "resource_exhausted"),
    unauthorized_message="Request had invalid authentication credentials",
    unauthorized_error=("code", "unauthenticated"),
    server_error="server_error_twice",
    server_errors=((503, "req_503_1"), (503, "req_503_2")),
    server_error_message="The model is overloaded",
    server_error_type="unavailable",
    server_error_answer="Third time lucky.",
    error_event=(("", "Par"), "The model is overloaded", "req_err_1", "unavailable"),
    early_stop_texts=("", "one", " two", " three"),
    malformed=lambda: _interactions_sse(
        [*_interactions_head("Hello"), {"$raw": "event: step.delta\ndata: {oops\n\n"}]
    ),
    malformed_texts=("", "Hello"),
    dropped=lambda: _interactions_sse([*_interactions_head("Hello", " world"), {"$drop": True}]),
    dropped_texts=("", "Hello", " world"),
    unfinished=lambda: _interactions_sse(_interactions_head("Hello", " world")),
    error_body=lambda message: {"error": {"message": message, "code": "invalid_request"}},
    error_kind="code",
    module="scope.models.gemini",
)


def _responses_sse(items: list[Any]) -> dict[str, Any]:
    return {"status": 200, "sse": items}


def _responses_text_events() -> list[Any]:
    events: list[Any] = responses_server.load_transcript("stream_text")[0]["sse"]
    return events


def _responses_upto(delta: str) -> list[Any]:
    """The events of stream_text up to the text delta ``delta``."""
    events = _responses_text_events()
    end = next(
        index
        for index, event in enumerate(events)
        if event["type"] == "response.output_text.delta" and event["delta"] == delta
    )
    return events[: end + 1]


RESPONSES = Provider(
    name="openai-responses",
    model_class=OpenAIResponsesModel,
    server_class=responses_server.ResponsesServer,
    load_transcript=responses_server.load_transcript,
    build_body=_responses_wire.build_body,
    model="gpt-5-mini",
    api_key="sk-test",
    env="OPENAI",
    default_base_url="https://api.openai.com/v1",
    path="/v1/responses",
    auth_header="authorization",
    auth_value="Bearer {}".format,
    extra_header=("OpenAI-Organization", "org-test"),
    unsupported={"top_k": 3},
    text="text",
    text_answer="The capital of France is Paris.",
    rate_limit_message="Rate limit reached",
    rate_limit_error=("code", "rate_limit_exceeded"),
    unauthorized_message="Incorrect API key",
    unauthorized_error=("code", "invalid_api_key"),
    server_error="server_error_twice",
    server_errors=((500, "req_500_1"), (500, "req_500_2")),
    server_error_message="The server had an error",
    server_error_type="server_error",
    server_error_answer="Third time lucky.",
    error_event=(("", "Par"), "overloaded", "req_err_1", "server_error"),
    early_stop_texts=("", "one", " two", " three"),
    malformed=lambda: _responses_sse(
        [*_responses_upto("Hello"), {"$raw": "event: response.output_text.delta\ndata: {oops\n\n"}]
    ),
    malformed_texts=("", "Hello"),
    dropped=lambda: _responses_sse([*_responses_upto(" world"), {"$drop": True}]),
    dropped_texts=("", "Hello", " world"),
    unfinished=lambda: _responses_sse(_responses_text_events()[:-1]),
    error_body=lambda message: {"error": {"message": message}},
    module="scope.models.openai",
    end_event=False,
)


#: Each adapter's wire module and default provider, by its ``scope/api``.
WIRES: dict[str, tuple[Any, str]] = {
    wire.API: (wire, wire.PROVIDER)
    for wire in (_openai_wire, _anthropic_wire, _gemini_wire, _responses_wire, _interactions_wire)
}


def sent_to(api: str, model: str, request: Request) -> tuple[bytes, Replay]:
    """The body the adapter of ``api`` builds for ``request`` to ``model`` (its JSON
    bytes), and the ``Replay`` that says what it left out."""
    wire, provider = WIRES[api]
    replay = Replay(api, provider)
    body = wire.build_body(
        request, default_options=Options(), model=model, stream=False, replay=replay
    )
    return orjson.dumps(body), replay


def body_of(
    provider: Provider,
    request: Request,
    *,
    stream: bool = False,
    defaults: Options | None = None,
) -> Any:
    """The request body ``provider``'s wire module builds for ``request`` (its default
    model, ``defaults`` as the adapter's default options), as the JSON it sends."""
    built = provider.build_body(
        request, default_options=defaults or Options(), model=provider.model, stream=stream
    )
    return orjson.loads(orjson.dumps(built))


#: Every adapter, for ``pytest.mark.parametrize("provider", PROVIDERS, ids=str)``.
PROVIDERS = [OPENAI, ANTHROPIC, GEMINI, RESPONSES, INTERACTIONS]


def respell(text: str | bytes, *, indent: str = "", ascii_: bool = True) -> str:
    """The same document with reversed key order, other whitespace and string escapes;
    number tokens verbatim."""
    tree = json.loads(text, parse_float=_Token, parse_int=_Token)
    return _write(tree, indent, ascii_, 0)


class _Token(str):
    __slots__ = ()


def _write(value: Any, indent: str, ascii_: bool, level: int) -> str:
    pad = "\n" + indent * (level + 1) if indent else " "
    end = "\n" + indent * level if indent else ""
    if isinstance(value, _Token):
        return str(value)
    if isinstance(value, dict):
        items = [
            f"{json.dumps(k, ensure_ascii=ascii_)} : {_write(v, indent, ascii_, level + 1)}"
            for k, v in reversed(list(value.items()))
        ]
        return "{" + ",".join(pad + item for item in items) + end + "}"
    if isinstance(value, list):
        return "[" + ",".join(pad + _write(v, indent, ascii_, level + 1) for v in value) + end + "]"
    return json.dumps(value, ensure_ascii=ascii_)


def nested(depth: int) -> Any:
    """``1`` inside ``depth`` lists."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def subprocess_env(tmp_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``python -m scope`` subprocess: this environment without scope's
    and the provider's settings, its data and temporary files under ``tmp_path``, UTF-8
    standard streams, and this source tree's ``scope`` importable first; then ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SCOPE_", "OPENAI_")) and key != "XDG_DATA_HOME"
    }
    env["TMPDIR"] = str(tmp_path)
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["PYTHONIOENCODING"] = "utf-8"
    # The subprocess imports the scope under test (this source tree), as pytest does
    # (pythonpath = ["."]), not whichever copy is installed in the environment.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env
