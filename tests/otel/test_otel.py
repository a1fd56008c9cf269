"""scope.otel: GenAI spans and metrics as middleware; the history tracing hooks.

Spans and metrics are read back with the OpenTelemetry SDK's in-memory exporter and
metric reader. Every async test runs under asyncio and trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scope import otel
from scope.chat import (
    FinishReason,
    Message,
    ModelFunc,
    Options,
    Output,
    OutputFormat,
    Request,
    Response,
    ResponseMetadata,
    Role,
    StreamerFunc,
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
    CommitError,
    ConversationClosedError,
    ProviderServerError,
    StoreError,
)
from scope.history import Batch, Middleware
from scope.history import _trace as history_trace
from scope.history.inmemory import InMemoryStore
from scope.media import Media
from scope.models._provenance import stamp
from scope.models.openai import OpenAIChatModel
from scope.testing import Fail, Hang, ScriptedModel
from tests.helpers import collect_until_cancelled
from tests.openai_server import OpenAIServer, load_transcript

#: The repository root: ``python -c`` there imports this checkout's ``scope``, as pytest does.
ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUEST = Request([user_message("hi")])
ANSWER = Response(
    Output(assistant_message("Hello there, friend"), FinishReason.STOP),
    ResponseMetadata(
        id="resp-1",
        model="gpt-test-2025",
        usage=Usage(
            120,
            30,
            reasoning_tokens=10,
            cache_read_input_tokens=100,
            cache_write_input_tokens=5,
        ),
    ),
)


class Telemetry:
    """A tracer provider and a meter provider that keep what they receive."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def tracing(self, **kwargs: Any) -> otel.Tracing:
        kwargs.setdefault("provider_name", "scripted")
        return otel.tracing(self.tracer_provider, self.meter_provider, **kwargs)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self) -> ReadableSpan:
        spans = self.spans()
        assert len(spans) == 1, [s.name for s in spans]
        return spans[0]

    def points(self, name: str) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        out: list[HistogramDataPoint] = []
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        out.extend(metric.data.data_points)  # type: ignore[arg-type]
        return out


@pytest.fixture
def latest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")


@pytest.fixture
def tel(latest: None) -> Telemetry:
    return Telemetry()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- import and configuration ----------------------------------------------------------


def test_importing_scope_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, scope, scope.chat, scope.history, scope.testing\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_history_hooks_are_no_ops_without_opentelemetry() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "from scope.history import _trace as t\n"
        "with t.read_span('c') as s:\n"
        "    s.read(3, length=3, closed=False)\n"
        "with t.commit_span('c') as s:\n"
        "    s.outcome('committed')\n"
        "t.annotate_conversation('c')\n"
        "assert t.read_span('c') is t.commit_span('d') is t._NOOP\n"
        "assert t._api is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_model_that_does_not_name_its_provider_needs_the_argument(tel: Telemetry) -> None:
    t = otel.tracing(tel.tracer_provider, tel.meter_provider)
    with pytest.raises(ValueError, match="provider_name"):
        wrap(ScriptedModel(), t.call)
    with pytest.raises(ValueError, match="non-empty"):
        otel.tracing(provider_name="")


def test_default_conventions_are_v1_36_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    tel = Telemetry()
    t = tel.tracing()
    assert not t.latest_conventions
    with pytest.warns(RuntimeWarning, match="gen_ai_latest_experimental"):
        quiet = tel.tracing(capture_content=True)
    assert not quiet.capture_content

    async def run() -> None:
        await wrap(ScriptedModel(ANSWER), quiet.call).call(REQUEST)

    anyio.run(run)
    got = attrs(tel.span())
    assert got["gen_ai.system"] == "scripted"
    assert "gen_ai.provider.name" not in got
    assert "gen_ai.input.messages" not in got and "gen_ai.output.messages" not in got
    assert tel.span().instrumentation_scope.schema_url.endswith("/1.36.0")
    (point,) = tel.points("gen_ai.client.operation.duration")
    assert point.attributes["gen_ai.system"] == "scripted"


# -- calls -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_call_span_attributes(tel: Telemetry) -> None:
    t = tel.tracing()
    assert t.latest_conventions
    options = Options(
        model="gpt-test",
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        max_tokens=256,
        stop=("END", "STOP"),
        frequency_penalty=0.1,
        presence_penalty=-0.2,
        output_format=OutputFormat.json(),
    )
    model = wrap(ScriptedModel(ANSWER), t.call)
    assert await model.call(Request([user_message("hi")], options=options)) == ANSWER
    span = tel.span()
    assert span.name == "chat gpt-test"
    assert span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert span.instrumentation_scope.name == "scope.otel"
    assert span.instrumentation_scope.schema_url.endswith("/" + otel.SEMCONV_VERSION)
    assert attrs(span) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.top_k": 40.0,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.stop_sequences": ("END", "STOP"),
        "gen_ai.request.frequency_penalty": 0.1,
        "gen_ai.request.presence_penalty": -0.2,
        "gen_ai.output.type": "json",
        "gen_ai.response.id": "resp-1",
        "gen_ai.response.model": "gpt-test-2025",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.cache_creation.input_tokens": 5,
        "gen_ai.usage.reasoning.output_tokens": 10,
        "scope.chat.outcome": "completed",
    }


@pytest.mark.anyio
async def test_unset_options_are_left_out_and_the_name_is_the_operation(tel: Telemetry) -> None:
    bare = Response(Output(assistant_message("ok"), FinishReason.STOP))
    await wrap(ScriptedModel(bare), tel.tracing().call).call(REQUEST)
    span = tel.span()
    assert span.name == "chat"
    assert attrs(span) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.response.finish_reasons": ("stop",),
        "scope.chat.outcome": "completed",
    }


@pytest.mark.anyio
async def test_call_metrics(tel: Telemetry) -> None:
    model = wrap(ScriptedModel(ANSWER), tel.tracing().call)
    await model.call(Request([user_message("hi")], options=Options(model="gpt-test")))
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "gpt-test-2025",
    }
    (duration,) = tel.points("gen_ai.client.operation.duration")
    assert dict(duration.attributes or {}) == expected
    assert duration.count == 1 and 0 <= duration.sum < 5
    assert list(duration.explicit_bounds) == [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ]  # fmt: skip
    tokens = {p.attributes["gen_ai.token.type"]: p for p in tel.points("gen_ai.client.token.usage")}
    assert set(tokens) == {"input", "output"}
    assert tokens["input"].sum == 120 and tokens["output"].sum == 30
    assert dict(tokens["input"].attributes or {}) == {**expected, "gen_ai.token.type": "input"}
    assert list(tokens["input"].explicit_bounds)[:3] == [1, 4, 16]
    assert list(tokens["input"].explicit_bounds)[-1] == 67108864
    assert tel.points("gen_ai.client.operation.time_to_first_chunk") == []


@pytest.mark.anyio
async def test_call_error_is_recorded_and_propagates(tel: Telemetry) -> None:
    error = ProviderServerError("upstream 503")
    model = wrap(ScriptedModel(error), tel.tracing().call)
    with pytest.raises(ProviderServerError) as info:
        await model.call(REQUEST)
    assert info.value is error
    span = tel.span()
    assert span.status.status_code is StatusCode.ERROR
    assert "upstream 503" in (span.status.description or "")
    assert attrs(span)["error.type"] == "ProviderServerError"
    assert attrs(span)["scope.chat.outcome"] == "failed"
    (event,) = span.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"].endswith("ProviderServerError")
    (duration,) = tel.points("gen_ai.client.operation.duration")
    assert (duration.attributes or {})["error.type"] == "ProviderServerError"
    assert tel.points("gen_ai.client.token.usage") == []


@pytest.mark.anyio
async def test_call_cancellation_is_not_an_error(tel: Telemetry) -> None:
    model = wrap(ScriptedModel(Hang()), tel.tracing().call)
    with anyio.move_on_after(0.02) as scope:
        await model.call(REQUEST)
    assert scope.cancelled_caught
    span = tel.span()
    assert span.status.status_code is StatusCode.UNSET
    assert attrs(span)["scope.chat.outcome"] == "cancelled"
    assert "error.type" not in attrs(span)
    assert span.events == ()
    assert tel.points("gen_ai.client.operation.duration") == []


class Raising:
    """A model whose call raises ``exc`` (any BaseException, groups included)."""

    provider_name = "test"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def call(self, request: Request) -> Response:
        raise self.exc


@pytest.mark.anyio
async def test_a_group_of_cancellations_is_cancelled_and_a_mixed_group_failed(
    tel: Telemetry,
) -> None:
    cancelled = asyncio.CancelledError  # classified by class, under either backend
    only_cancel = BaseExceptionGroup("all cancelled", [cancelled(), cancelled()])
    mixed = BaseExceptionGroup("mixed", [cancelled(), ValueError("the real failure")])
    t = tel.tracing()
    for exc in (only_cancel, mixed):
        with pytest.raises(BaseExceptionGroup):
            await wrap(Raising(exc), t.call).call(REQUEST)
    cancel_span, failed_span = tel.spans()
    assert attrs(cancel_span)["scope.chat.outcome"] == "cancelled"
    assert cancel_span.status.status_code is StatusCode.UNSET
    assert attrs(failed_span)["scope.chat.outcome"] == "failed"
    assert attrs(failed_span)["error.type"] == "BaseExceptionGroup"


@pytest.mark.anyio
async def test_the_call_span_is_current_while_the_model_runs(tel: Telemetry) -> None:
    inner_tracer = tel.tracer_provider.get_tracer("fake-http")

    async def call(request: Request) -> Response:
        with inner_tracer.start_as_current_span("POST /chat/completions"):
            await anyio.lowlevel.checkpoint()
        return ANSWER

    outer = inner_tracer.start_span("app")
    with trace.use_span(outer, end_on_exit=True):
        await wrap(ModelFunc(call), tel.tracing().call).call(REQUEST)
        assert trace.get_current_span() is outer
    http, chat, app = tel.spans()
    assert (http.name, chat.name, app.name) == ("POST /chat/completions", "chat", "app")
    assert http.parent is not None and http.parent.span_id == chat.context.span_id
    assert chat.parent is not None and chat.parent.span_id == app.context.span_id


@pytest.mark.anyio
async def test_conversation_id_from_the_history_hook(tel: Telemetry) -> None:
    model = wrap(ScriptedModel(ANSWER, ANSWER), tel.tracing().call)
    with history_trace.conversation("conv-42"):
        await model.call(REQUEST)
    await model.call(REQUEST)
    first, second = tel.spans()
    assert attrs(first)["gen_ai.conversation.id"] == "conv-42"
    assert "gen_ai.conversation.id" not in attrs(second)


@pytest.mark.anyio
async def test_stream_conversation_id_is_read_when_the_stream_is_made(tel: Telemetry) -> None:
    """An outer middleware holds ``conversation()`` only around ``next.stream(...)``."""
    streamer = wrap_stream(ScriptedModel(ANSWER), tel.tracing().stream)
    with history_trace.conversation("conv-7"):
        stream = streamer.stream(REQUEST)
    assert history_trace.current_conversation() is None
    await collect(stream)
    assert attrs(tel.span())["gen_ai.conversation.id"] == "conv-7"


@pytest.mark.anyio
async def test_tracing_inside_the_history_middleware_sees_the_replayed_history(
    tel: Telemetry,
) -> None:
    store = InMemoryStore()
    await store.append(Batch("conv-1", "seed", [user_message("earlier"), assistant_message("ok")]))
    t = tel.tracing(capture_content=True)
    scripted = ScriptedModel(ANSWER, ANSWER)
    history = Middleware(store, store, "conv-1")
    await wrap(scripted, history.call, t.call).call(REQUEST)
    await collect(wrap_stream(scripted, history.stream, t.stream).stream(REQUEST))
    called, streamed = tel.spans()
    for span in (called, streamed):
        sent = json.loads(attrs(span)["gen_ai.input.messages"])
        assert [m["parts"][0]["content"] for m in sent][:3] == ["earlier", "ok", "hi"]
    assert len(await store.read("conv-1")) == 6  # both turns committed through the tracing


# -- streams -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_span_attributes_and_metrics(tel: Telemetry) -> None:
    scripted = ScriptedModel(ANSWER)
    streamer = wrap_stream(scripted, tel.tracing().stream)
    stream = streamer.stream(Request([user_message("hi")], options=Options(model="gpt-test")))
    await anyio.lowlevel.checkpoint()
    assert tel.spans() == [] and scripted.streams == []  # nothing before the first iteration
    assert await collect(stream) == ANSWER
    span = tel.span()
    got = attrs(span)
    chunks = len(ScriptedModel.chunks(ANSWER))
    assert span.name == "chat gpt-test" and span.kind is SpanKind.CLIENT
    assert got["scope.chat.chunks"] == chunks
    assert got["scope.chat.outcome"] == "completed"
    assert got["gen_ai.response.id"] == "resp-1"
    assert got["gen_ai.response.model"] == "gpt-test-2025"
    assert got["gen_ai.response.finish_reasons"] == ("stop",)
    assert got["gen_ai.usage.input_tokens"] == 120
    assert got["gen_ai.usage.output_tokens"] == 30
    assert got["gen_ai.usage.cache_read.input_tokens"] == 100
    ttfc = got["gen_ai.response.time_to_first_chunk"]
    assert isinstance(ttfc, float)
    assert span.end_time is not None and span.start_time is not None
    assert 0 <= ttfc * 1e9 <= span.end_time - span.start_time
    assert span.status.status_code is StatusCode.UNSET
    (duration,) = tel.points("gen_ai.client.operation.duration")
    assert duration.count == 1
    (first,) = tel.points("gen_ai.client.operation.time_to_first_chunk")
    assert first.count == 1 and first.sum == pytest.approx(ttfc)
    assert {p.attributes["gen_ai.token.type"] for p in tel.points("gen_ai.client.token.usage")} == {
        "input",
        "output",
    }


@pytest.mark.anyio
async def test_stream_error_mid_stream(tel: Telemetry) -> None:
    error = ProviderServerError("dropped")
    scripted = ScriptedModel(Fail(error, after=2))
    with pytest.raises(ProviderServerError) as info:
        await collect(wrap_stream(scripted, tel.tracing().stream).stream(REQUEST))
    assert info.value is error
    span = tel.span()
    assert span.status.status_code is StatusCode.ERROR
    assert attrs(span)["error.type"] == "ProviderServerError"
    assert attrs(span)["scope.chat.outcome"] == "failed"
    assert attrs(span)["scope.chat.chunks"] == 2
    assert [e.name for e in span.events] == ["exception"]
    assert scripted.streams[0].closed and scripted.streams[0].outcome == "failed"


@pytest.mark.anyio
async def test_stream_early_stop_ends_the_span_and_closes_the_inner_stream(
    tel: Telemetry,
) -> None:
    scripted = ScriptedModel(ANSWER)
    streamer = wrap_stream(scripted, tel.tracing().stream)
    async with contextlib.aclosing(streamer.stream(REQUEST)) as chunks:  # type: ignore[type-var]
        async for _ in chunks:
            break
        assert tel.spans() == []  # still open while the consumer holds the stream
    span = tel.span()
    assert scripted.streams[0].closed and scripted.streams[0].outcome == "stopped"
    assert attrs(span)["scope.chat.outcome"] == "stopped"
    assert attrs(span)["scope.chat.chunks"] == 1
    assert span.status.status_code is StatusCode.UNSET
    assert "error.type" not in attrs(span)
    assert tel.points("gen_ai.client.operation.duration") == []


@pytest.mark.anyio
async def test_stream_cancellation_is_not_an_error(tel: Telemetry) -> None:
    scripted = ScriptedModel(Hang(after=2))
    streamer = wrap_stream(scripted, tel.tracing().stream)
    await collect_until_cancelled(streamer.stream(REQUEST))
    span = tel.span()
    assert attrs(span)["scope.chat.outcome"] == "cancelled"
    assert attrs(span)["scope.chat.chunks"] == 2
    assert span.status.status_code is StatusCode.UNSET
    assert "error.type" not in attrs(span) and span.events == ()
    assert scripted.streams[0].closed and scripted.streams[0].outcome == "cancelled"


@pytest.mark.anyio
async def test_stream_span_is_current_only_while_the_inner_stream_runs(tel: Telemetry) -> None:
    """The adapter's HTTP span (here a fake one per chunk) is a child of the chat span;
    the consumer's code between chunks still sees its own span."""
    tracer = tel.tracer_provider.get_tracer("fake-http")
    seen_by_consumer: list[Any] = []

    async def provider(request: Request) -> AsyncIterator[Response]:
        with tracer.start_as_current_span("connect"):
            await anyio.lowlevel.checkpoint()
        for piece in ("a", "b", "c"):
            with tracer.start_as_current_span(f"read {piece}"):
                await anyio.lowlevel.checkpoint()
            yield Response(Output(Message(Role.ASSISTANT, [text_part(piece)])))
        yield Response(Output(finish_reason=FinishReason.STOP))

    streamer = wrap_stream(StreamerFunc(provider), tel.tracing().stream)
    app = tracer.start_span("app")
    with trace.use_span(app, end_on_exit=True):
        async with contextlib.aclosing(streamer.stream(REQUEST)) as chunks:  # type: ignore[type-var]
            async for _ in chunks:
                seen_by_consumer.append(trace.get_current_span())
                await anyio.lowlevel.checkpoint()
    assert seen_by_consumer == [app] * 4
    by_name = {s.name: s for s in tel.spans()}
    chat = by_name["chat"]
    assert chat.parent is not None and chat.parent.span_id == app.get_span_context().span_id
    for name in ("connect", "read a", "read b", "read c"):
        parent = by_name[name].parent
        assert parent is not None and parent.span_id == chat.context.span_id, name


@pytest.mark.anyio
async def test_stream_resumed_from_another_task_keeps_contexts_apart(tel: Telemetry) -> None:
    """Each step attaches and detaches within itself, so a stream consumed from two
    tasks in turn (different contexts) neither leaks the chat span nor fails to detach."""
    streamer = wrap_stream(ScriptedModel(ANSWER), tel.tracing().stream)
    stream = streamer.stream(REQUEST)
    seen: list[Any] = []

    async def step() -> None:
        await stream.__anext__()
        seen.append(trace.get_current_span())

    async with anyio.create_task_group() as tg:
        tg.start_soon(step)
    async with anyio.create_task_group() as tg:
        tg.start_soon(step)
    await collect(stream)
    assert seen == [trace.INVALID_SPAN] * 2
    assert attrs(tel.span())["scope.chat.outcome"] == "completed"


# -- content -----------------------------------------------------------------------------


RICH_REQUEST = Request(
    [
        system_message("Be brief."),
        user_message(
            "What is in these?",
            media_part(Media.from_bytes("image/png", b"\x89PNG" + b"\0" * 96)),
            media_part(Media.from_uri("image/jpeg", "https://example.com/cat.jpg")),
            media_part(Media.from_uri("image/gif", "data:image/gif;base64,R0lGODlhAQABAAAAACw=")),
            media_part(Media.from_reference("application/pdf", "file-abc123")),
        ),
        assistant_message(
            reasoning_part("think", signature=b"secret-signature"),
            tool_call_part("call_1", "lookup", '{"q": "cats"}'),
            tool_call_part("call_2", "broken", "{not json"),
        ),
        tool_message(
            ToolResult("call_1", "lookup", ToolOutput.of_text("two cats")),
            ToolResult("call_2", "broken", ToolOutput.of_text("bad args"), is_error=True),
        ),
    ]
)


def expected_input() -> list[dict[str, Any]]:
    return [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is in these?"},
                {"type": "media", "modality": "image", "mime_type": "image/png", "size": 100},
                {
                    "type": "uri",
                    "modality": "image",
                    "mime_type": "image/jpeg",
                    "uri": "https://example.com/cat.jpg",
                },
                # a data: URI is bytes in disguise: its length is recorded, not the URI
                {"type": "media", "modality": "image", "mime_type": "image/gif", "size": 42},
                {
                    "type": "file",
                    "modality": "application",
                    "mime_type": "application/pdf",
                    "file_id": "file-abc123",
                },
            ],
        },
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "think"},
                {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": "cats"}},
                {"type": "tool_call", "id": "call_2", "name": "broken", "arguments": "{not json"},
            ],
        },
        {
            "role": "tool",
            "parts": [
                {"type": "tool_call_response", "id": "call_1", "response": "two cats"},
                {
                    "type": "tool_call_response",
                    "id": "call_2",
                    "response": "bad args",
                    "is_error": True,
                },
            ],
        },
    ]


TOOL_ANSWER = Response(
    Output(
        assistant_message("Checking.", tool_call_part("call_3", "lookup", '{"q":"dogs"}')),
        FinishReason.TOOL_CALLS,
    )
)
EXPECTED_OUTPUT = [
    {
        "role": "assistant",
        "parts": [
            {"type": "text", "content": "Checking."},
            {"type": "tool_call", "id": "call_3", "name": "lookup", "arguments": {"q": "dogs"}},
        ],
        "finish_reason": "tool_call",
    }
]


@pytest.mark.anyio
async def test_content_capture_call(tel: Telemetry) -> None:
    t = tel.tracing(capture_content=True)
    assert t.capture_content
    await wrap(ScriptedModel(TOOL_ANSWER), t.call).call(RICH_REQUEST)
    got = attrs(tel.span())
    assert json.loads(got["gen_ai.input.messages"]) == expected_input()
    assert json.loads(got["gen_ai.output.messages"]) == EXPECTED_OUTPUT
    text = got["gen_ai.input.messages"]
    assert "secret-signature" not in text and "c2VjcmV0" not in text  # signature, raw or b64
    assert "iVBOR" not in text and "R0lGOD" not in text  # no media bytes, nor data: URIs


@pytest.mark.anyio
async def test_content_capture_stream(tel: Telemetry) -> None:
    t = tel.tracing(capture_content=True)
    await collect(wrap_stream(ScriptedModel(TOOL_ANSWER), t.stream).stream(RICH_REQUEST))
    got = attrs(tel.span())
    assert json.loads(got["gen_ai.input.messages"]) == expected_input()
    assert json.loads(got["gen_ai.output.messages"]) == EXPECTED_OUTPUT


@pytest.mark.anyio
async def test_an_unfinished_stream_records_no_output_message(tel: Telemetry) -> None:
    t = tel.tracing(capture_content=True)
    with pytest.raises(ProviderServerError):
        await collect(
            wrap_stream(ScriptedModel(Fail(ProviderServerError("x"), after=1)), t.stream).stream(
                REQUEST
            )
        )
    got = attrs(tel.span())
    assert "gen_ai.input.messages" in got and "gen_ai.output.messages" not in got


@pytest.mark.anyio
async def test_content_capture_is_off_by_default(tel: Telemetry) -> None:
    t = tel.tracing()
    assert not t.capture_content
    await wrap(ScriptedModel(TOOL_ANSWER), t.call).call(RICH_REQUEST)
    await collect(wrap_stream(ScriptedModel(TOOL_ANSWER), t.stream).stream(RICH_REQUEST))
    for span in tel.spans():
        assert not [key for key in attrs(span) if "messages" in key]


# -- the loopback OpenAI server ----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.mark.anyio
async def test_openai_adapter_call(tel: Telemetry, server: OpenAIServer) -> None:
    server.script(*load_transcript("plain_answer"))
    async with OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url=server.base_url) as m:
        t = otel.tracing(tel.tracer_provider, tel.meter_provider)  # the adapter names itself
        response = await wrap(m, t.call).call(Request([user_message("Capital of France?")]))
    assert response.text == "The capital of France is Paris."
    span = tel.span()
    got = attrs(span)
    port = int(server.base_url.split(":")[2].split("/")[0])
    assert span.name == "chat gpt-4o-mini"
    assert got["gen_ai.provider.name"] == "openai"
    assert got["gen_ai.request.model"] == "gpt-4o-mini"
    assert got["server.address"] == "127.0.0.1" and got["server.port"] == port
    assert got["gen_ai.response.id"] == "chatcmpl-AB1plain"
    assert got["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert got["gen_ai.response.finish_reasons"] == ("stop",)
    assert got["gen_ai.usage.input_tokens"] == 1200
    assert got["gen_ai.usage.output_tokens"] == 8
    assert got["gen_ai.usage.cache_read.input_tokens"] == 1024
    (duration,) = tel.points("gen_ai.client.operation.duration")
    assert (duration.attributes or {})["server.address"] == "127.0.0.1"


@pytest.mark.anyio
async def test_openai_adapter_stream_and_provider_name(
    tel: Telemetry, server: OpenAIServer
) -> None:
    server.script(*load_transcript("stream_text"))
    async with OpenAIChatModel(
        "deepseek-chat", api_key="sk-test", base_url=server.base_url, provider_name="deepseek"
    ) as m:
        t = tel.tracing(provider_name="ignored: the adapter knows")
        response = await collect(wrap_stream(m, t.stream).stream(REQUEST))
    assert response.text == "Hello world!"
    got = attrs(tel.span())
    assert got["gen_ai.provider.name"] == "deepseek"
    assert got["gen_ai.request.model"] == "deepseek-chat"
    assert got["gen_ai.response.id"] == "chatcmpl-AB3stream"
    assert got["gen_ai.usage.input_tokens"] == 1100
    assert got["gen_ai.usage.output_tokens"] == 3
    assert got["scope.chat.outcome"] == "completed"
    assert got["scope.chat.chunks"] >= 4
    assert got["gen_ai.response.time_to_first_chunk"] > 0


@pytest.mark.anyio
async def test_openai_adapter_server_error(tel: Telemetry, server: OpenAIServer) -> None:
    server.script(*load_transcript("unauthorized"))
    async with OpenAIChatModel("gpt-4o-mini", api_key="sk-bad", base_url=server.base_url) as m:
        with pytest.raises(Exception) as info:
            await wrap(m, otel.tracing(tel.tracer_provider, tel.meter_provider).call).call(REQUEST)
    span = tel.span()
    assert span.status.status_code is StatusCode.ERROR
    assert attrs(span)["error.type"] == type(info.value).__qualname__ == "AuthenticationError"


def test_openai_provider_name_is_checked() -> None:
    from scope.errors import InvalidOptionsError

    assert OpenAIChatModel("m", api_key="k").provider_name == "openai"
    with pytest.raises(InvalidOptionsError, match="provider_name"):
        OpenAIChatModel("m", api_key="k", provider_name=" ")


# -- history hooks -----------------------------------------------------------------------

# The hooks use the global tracer provider; it can be set once per process.
_GLOBAL = InMemorySpanExporter()


@pytest.fixture
def history_spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_GLOBAL))
        trace.set_tracer_provider(provider)
    _GLOBAL.clear()
    yield _GLOBAL
    _GLOBAL.clear()


BATCH = Batch("conv-1", "append-1", [user_message("q"), assistant_message("a")])


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def test_history_read_span(history_spans: InMemorySpanExporter) -> None:
    with history_trace.read_span("conv-1") as span:
        assert trace.get_current_span().is_recording()
        span.read(4, length=6, closed=False)
    assert not trace.get_current_span().is_recording()
    got = only(history_spans)
    assert got.name == "scope.history.read" and got.kind is SpanKind.INTERNAL
    assert attrs(got) == {
        "gen_ai.conversation.id": "conv-1",
        "scope.history.messages": 4,
        "scope.history.length": 6,
        "scope.history.closed": False,
    }
    assert got.status.status_code is StatusCode.UNSET


def test_history_read_failure(history_spans: InMemorySpanExporter) -> None:
    with pytest.raises(StoreError), history_trace.read_span("conv-1"):
        raise StoreError("disk on fire")
    got = only(history_spans)
    assert got.status.status_code is StatusCode.ERROR
    assert attrs(got)["error.type"] == "StoreError"
    assert [e.name for e in got.events] == ["exception"]


def test_history_commit_committed(history_spans: InMemorySpanExporter) -> None:
    with history_trace.commit_span("conv-1") as span:
        span.batch(BATCH)
    got = only(history_spans)
    assert got.name == "scope.history.commit"
    assert attrs(got) == {
        "gen_ai.conversation.id": "conv-1",
        "scope.history.batch.size": 2,
        "scope.history.append_id": "append-1",
        "scope.history.digest": BATCH.digest,
        "scope.history.outcome": "committed",
    }
    assert got.status.status_code is StatusCode.UNSET


def test_history_commit_tool_pause(history_spans: InMemorySpanExporter) -> None:
    with history_trace.commit_span("conv-1") as span:
        span.outcome(history_trace.CommitOutcome.TOOL_PAUSE)
    got = only(history_spans)
    assert attrs(got)["scope.history.outcome"] == "tool_pause"
    assert "scope.history.batch.size" not in attrs(got)
    assert got.status.status_code is StatusCode.UNSET


def commit_error(cause: BaseException) -> CommitError:
    try:
        raise CommitError("not persisted", batch=BATCH, receipt=None, response=ANSWER) from cause
    except CommitError as exc:
        return exc


class HistoryChangedError(Exception):
    """Stands in for scope.errors.HistoryChangedError until the fence lands."""


@pytest.mark.parametrize(
    ("raised", "outcome", "error_type"),
    [
        (commit_error(StoreError("connection reset")), "failed", "CommitError"),
        (commit_error(ConversationClosedError("closed")), "closed", "CommitError"),
        (
            ConversationClosedError("closed before the model ran"),
            "closed",
            "ConversationClosedError",
        ),
        (commit_error(HistoryChangedError("expected 4, got 6")), "history_changed", "CommitError"),
    ],
)
def test_history_commit_failures_are_classified(
    history_spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    outcome: str,
    error_type: str,
) -> None:
    import scope.errors

    monkeypatch.setattr(scope.errors, "HistoryChangedError", HistoryChangedError, raising=False)
    with pytest.raises(type(raised)), history_trace.commit_span("conv-1") as span:
        span.batch(BATCH)
        raise raised
    got = only(history_spans)
    assert attrs(got)["scope.history.outcome"] == outcome
    assert attrs(got)["error.type"] == error_type
    assert got.status.status_code is StatusCode.ERROR
    assert [e.name for e in got.events] == ["exception"]


def test_history_commit_explicit_outcome_wins(history_spans: InMemorySpanExporter) -> None:
    with pytest.raises(CommitError), history_trace.commit_span("conv-1") as span:
        span.outcome("history_changed")
        raise commit_error(StoreError("whatever the cause says"))
    got = only(history_spans)
    assert attrs(got)["scope.history.outcome"] == "history_changed"
    assert got.status.status_code is StatusCode.ERROR


def test_history_commit_outcome_without_exception(history_spans: InMemorySpanExporter) -> None:
    with history_trace.commit_span("conv-1") as span:
        span.outcome("closed")
    got = only(history_spans)
    assert attrs(got)["scope.history.outcome"] == "closed"
    assert attrs(got)["error.type"] == "closed"
    assert got.status.status_code is StatusCode.ERROR
    with pytest.raises(ValueError):
        span.outcome("stored-ish")


@pytest.mark.anyio
async def test_history_commit_cancelled(history_spans: InMemorySpanExporter) -> None:
    with anyio.move_on_after(0.01):
        with history_trace.commit_span("conv-1") as span:
            span.batch(BATCH)
            await anyio.sleep_forever()
    got = only(history_spans)
    assert attrs(got)["scope.history.outcome"] == "cancelled"
    assert got.status.status_code is StatusCode.UNSET
    assert "error.type" not in attrs(got) and got.events == ()


@pytest.mark.parametrize(
    ("raised", "outcome"),
    [
        (BaseExceptionGroup("interrupt", [KeyboardInterrupt()]), "failed"),
        (BaseExceptionGroup("g", [asyncio.CancelledError(), OSError("disk")]), "failed"),
        (
            BaseExceptionGroup("g", [BaseExceptionGroup("n", [asyncio.CancelledError()])]),
            "cancelled",
        ),
    ],
)
def test_history_commit_groups_are_classified_like_the_middleware_does(
    history_spans: InMemorySpanExporter, raised: BaseException, outcome: str
) -> None:
    with pytest.raises(BaseExceptionGroup), history_trace.commit_span("conv-1"):
        raise raised
    assert attrs(only(history_spans))["scope.history.outcome"] == outcome


def test_annotate_conversation(history_spans: InMemorySpanExporter) -> None:
    history_trace.annotate_conversation("nobody-listening")  # no current span: no effect
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("turn"):
        history_trace.annotate_conversation("conv-9")
    got = only(history_spans)
    assert attrs(got) == {"gen_ai.conversation.id": "conv-9"}


@pytest.mark.anyio
async def test_history_spans_parent_a_chat_span_started_inside(
    tel: Telemetry, history_spans: InMemorySpanExporter
) -> None:
    """A chat span started inside a commit/read block (or the other way round) nests."""
    model = wrap(ScriptedModel(ANSWER), tel.tracing().call)
    with history_trace.read_span("conv-1"):
        await model.call(REQUEST)
    (read,) = history_spans.get_finished_spans()
    chat = tel.span()
    assert chat.parent is not None and chat.parent.span_id == read.context.span_id


# -- history outcomes through the Middleware ----------------------------------------------


def _final(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


def history_span(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


@pytest.mark.anyio
async def test_middleware_traces_a_committed_turn(history_spans: InMemorySpanExporter) -> None:
    store = InMemoryStore()
    await (
        Middleware(store, store, "traced")
        .call(ScriptedModel(_final("a")))
        .call(Request([user_message("q")]))
    )
    read = history_span(history_spans, "scope.history.read")
    assert attrs(read) == {
        "gen_ai.conversation.id": "traced",
        "scope.history.messages": 0,
        "scope.history.length": 0,
        "scope.history.closed": False,
    }
    commit = history_span(history_spans, "scope.history.commit")
    assert attrs(commit)["scope.history.outcome"] == "committed"
    assert attrs(commit)["scope.history.batch.size"] == 2
    assert attrs(commit)["scope.history.expected_length"] == 0
    assert commit.status.status_code is StatusCode.UNSET


@pytest.mark.anyio
async def test_middleware_traces_a_tool_pause(history_spans: InMemorySpanExporter) -> None:
    store = InMemoryStore()
    calls = Response(Output(assistant_message(tool_call_part("c1", "f")), FinishReason.TOOL_CALLS))
    stream = (
        Middleware(store, store, "traced")
        .stream(ScriptedModel(calls))
        .stream(Request([user_message("q")]))
    )
    await collect(stream)
    commit = history_span(history_spans, "scope.history.commit")
    assert attrs(commit)["scope.history.outcome"] == "tool_pause"
    assert "scope.history.append_id" not in attrs(commit)


@pytest.mark.anyio
async def test_middleware_traces_a_turn_lost_to_another(
    history_spans: InMemorySpanExporter,
) -> None:
    store = InMemoryStore()

    class Interloper:
        async def call(self, request: Request) -> Response:
            await store.append(
                Batch("traced", "other", [user_message("x"), assistant_message("y")])
            )
            return _final("late")

    with pytest.raises(CommitError):
        await (
            Middleware(store, store, "traced").call(Interloper()).call(Request([user_message("q")]))
        )
    commit = history_span(history_spans, "scope.history.commit")
    assert attrs(commit)["scope.history.outcome"] == "history_changed"
    assert commit.status.status_code is StatusCode.ERROR


@pytest.mark.anyio
async def test_middleware_traces_a_closed_conversation(
    history_spans: InMemorySpanExporter,
) -> None:
    store = InMemoryStore()
    await store.clear("traced")
    model = ScriptedModel(_final("never"))
    with pytest.raises(ConversationClosedError):
        await Middleware(store, store, "traced").call(model).call(Request([user_message("q")]))
    assert model.requests == []
    read = history_span(history_spans, "scope.history.read")
    assert attrs(read)["scope.history.closed"] is True
    commit = history_span(history_spans, "scope.history.commit")
    assert attrs(commit)["scope.history.outcome"] == "closed"
    assert "scope.history.batch.size" not in attrs(commit)


@pytest.mark.anyio
async def test_middleware_traces_a_failed_and_a_cancelled_append(
    history_spans: InMemorySpanExporter,
) -> None:
    store = InMemoryStore()

    class Broken:
        async def append(self, batch: Batch) -> Any:
            raise StoreError("disk on fire")

    with pytest.raises(CommitError):
        await (
            Middleware(store, Broken(), "traced")
            .call(ScriptedModel(_final("a")))
            .call(Request([user_message("q")]))
        )
    assert (
        attrs(history_span(history_spans, "scope.history.commit"))["scope.history.outcome"]
        == "failed"
    )
    history_spans.clear()

    with anyio.CancelScope() as scope:

        class Slow:
            async def append(self, batch: Batch) -> Any:
                scope.cancel()  # cancelled inside the append, however slow the machine
                await anyio.sleep(10)

        await (
            Middleware(store, Slow(), "traced")
            .call(ScriptedModel(_final("a")))
            .call(Request([user_message("q")]))
        )
    commit = history_span(history_spans, "scope.history.commit")
    assert attrs(commit)["scope.history.outcome"] == "cancelled"
    assert commit.status.status_code is StatusCode.UNSET


def test_history_hooks_are_idle_until_an_sdk_provider_is_set() -> None:
    code = """
from unittest import mock
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from scope.history import _trace

assert _trace._otel() is None  # loads the API once (one look at the environment)
with mock.patch.object(trace, "get_tracer_provider", wraps=trace.get_tracer_provider) as get:
    for _ in range(3):
        assert _trace._otel() is None  # API installed, no SDK provider: no spans
        assert _trace.read_span("c") is _trace._NOOP
    # get_tracer_provider() looks at os.environ on every call while none is set
    assert get.call_count == 0
trace.set_tracer_provider(TracerProvider())
assert _trace._otel() is not None and _trace.read_span("c") is not _trace._NOOP
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).resolve().parents[2],
        env={k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"},
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_parts_an_adapter_left_out_are_on_the_span(
    tel: Telemetry, server: OpenAIServer, mode: str
) -> None:
    # Another provider's reasoning in a tool-calling message is not sent back to
    # OpenAI: the response says so, and so does the span.

    server.script(*load_transcript("plain_answer" if mode == "call" else "stream_text"))
    foreign = stamp(
        assistant_message(reasoning_part("mine", b"sig"), tool_call_part("c1", "f", "{}")),
        "anthropic.messages",
        "anthropic",
        "claude-sonnet-4-5",
    )
    request = Request(
        [
            user_message("Capital of France?"),
            foreign,
            tool_message(ToolResult("c1", "f", ToolOutput.of_text("Paris"))),
        ]
    )
    async with OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url=server.base_url) as m:
        t = otel.tracing(tel.tracer_provider, tel.meter_provider)
        if mode == "call":
            response = await wrap(m, t.call).call(request)
        else:
            response = await collect(wrap_stream(m, t.stream).stream(request))
    assert response.metadata is not None
    assert response.metadata.extra.decode("scope/dropped_parts") == 1
    assert attrs(tel.span())["scope.replay.dropped_parts"] == 1
    assert "reasoning_content" not in server.bodies()[0]["messages"][1]
