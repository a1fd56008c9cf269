"""OpenTelemetry GenAI spans and metrics for scope models, as middleware (``scope-chat[otel]``).

::

    from scope import chat, otel

    t = otel.tracing()                       # the global tracer and meter providers
    model = chat.wrap(OpenAIChatModel("gpt-4o-mini"), t.call)
    streamer = chat.wrap_stream(OpenAIChatModel("gpt-4o-mini"), t.stream)

Importing ``scope`` never imports this module; importing it imports ``opentelemetry-api``
(nothing else: the SDK and exporters are the application's choice).

**Conventions.** Spans and metrics follow the GenAI semantic conventions of OpenTelemetry
semantic conventions **v1.41.0** (status: development). As those conventions ask of
instrumentations, the environment variable ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a
comma-separated list, read when ``tracing()`` is called) chooses the version:

- it contains ``gen_ai_latest_experimental``: the v1.41.0 conventions, all of them;
- otherwise (the default) the attribute names of v1.36.0, the last version before the
  breaking renames: ``gen_ai.system`` instead of ``gen_ai.provider.name`` (on spans and
  metrics), and no message content (v1.36.0 recorded content as log events, which this
  module does not emit: ``capture_content=True`` then warns and records nothing).

**One span per operation**: name ``chat {gen_ai.request.model}`` (``chat`` when the model
is unknown), kind ``CLIENT``, current while the inner model runs (so an instrumented HTTP
client's span is its child). A stream's span starts at the stream's first iteration and
ends when the stream ends, fails, is closed early or is cancelled; it is current while
the inner stream produces each chunk (never while the consumer holds a chunk).

Attributes: ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name`` (the inner
model's ``provider_name`` attribute when it has one, else the ``provider_name`` argument),
``gen_ai.request.model`` (the request's ``options.model``, else the inner model's
``model`` attribute), ``server.address``/``server.port`` (from the inner model's
``base_url`` attribute when it has one), ``gen_ai.output.type`` and the request options
that are set (``gen_ai.request.temperature``, ``top_p``, ``top_k``, ``max_tokens``,
``stop_sequences``, ``frequency_penalty``, ``presence_penalty``); from the response
``gen_ai.response.id``, ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` (``input_tokens`` includes cached
tokens, as both scope and the conventions count them) and, when reported,
``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens``
and ``gen_ai.usage.reasoning.output_tokens``; ``gen_ai.conversation.id`` when a
``scope.history.Middleware`` outside this one says which conversation the call belongs to
(``scope.history._trace.conversation(id)`` current when ``call`` or ``stream`` is called).
Streams add ``gen_ai.response.time_to_first_chunk`` (seconds from the first iteration to
the first chunk, an attribute) and ``scope.chat.chunks`` (chunks forwarded).
``scope.replay.dropped_parts``: how many parts of the request the adapter left out
(another model's reasoning, say: DESIGN §6c), when the response says so.

How an operation ended, ``scope.chat.outcome``: ``completed``; ``failed`` (status ERROR,
``error.type`` = the exception's class name, the exception recorded as an event);
``stopped`` (the consumer closed the stream early: status unset); ``cancelled``
(``asyncio.CancelledError`` or trio's ``Cancelled``: not an error, status unset). Errors
and cancellations propagate untouched.

**Content** (``capture_content=True``, off by default, needs the latest conventions):
``gen_ai.input.messages`` and ``gen_ai.output.messages`` as the conventions' JSON (role and
typed parts: ``text``, ``reasoning``, ``tool_call``, ``tool_call_response``, ``uri``,
``file``). Media bytes are never recorded: a media part given as bytes (or as a ``data:``
URI) becomes ``{"type": "media", "mime_type", "modality", "size"}``, a URI a ``uri`` part,
a provider file reference a ``file`` part. Reasoning signatures are never recorded.

**Metrics**: ``gen_ai.client.operation.duration`` (s), ``gen_ai.client.token.usage``
({token}, one record per token type, when usage was reported) and, for streams,
``gen_ai.client.operation.time_to_first_chunk`` (s); histograms with the conventions'
bucket advice and attributes (operation, provider, request and response model, server
address and port, ``error.type`` on failures). They are recorded for completed and failed
operations; a stopped or cancelled one shows on its span only.

Everything works under asyncio and trio alike: no event-loop API is used, and context is
attached and detached within one step of a stream, never across a ``yield``.
"""

from __future__ import annotations

import os
import time
import urllib.parse
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Final, final

import orjson

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "scope.otel needs the OpenTelemetry API: pip install 'scope-chat[otel]' "
        "(or opentelemetry-api)"
    ) from exc

from scope import __version__
from scope.chat import (
    FinishReason,
    Message,
    Model,
    OutputFormatType,
    Part,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    Streamer,
    Usage,
)
from scope.errors import InvalidResponseError
from scope.history._trace import current_conversation
from scope.media import Media, SourceKind

__all__ = ["SEMCONV_VERSION", "Tracing", "tracing"]

#: The version of the OpenTelemetry semantic conventions emitted with
#: ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``.
SEMCONV_VERSION: Final = "1.41.0"
_LEGACY_VERSION: Final = "1.36.0"
_OPT_IN: Final = "gen_ai_latest_experimental"

# Bucket advice of the conventions.
_DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# Request options recorded as they are: (option, span attribute), in this order. top_k
# is there for its place; it is written again as a double.
_REQUEST_ATTRIBUTES: Final = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("stop", "gen_ai.request.stop_sequences"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
)
_OUTPUT_TYPES: Final = {
    OutputFormatType.TEXT: "text",
    OutputFormatType.JSON: "json",
    OutputFormatType.JSON_SCHEMA: "json",
}
# Output message finish reasons as the conventions spell them.
_MESSAGE_FINISH: Final = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_call",
    FinishReason.CONTENT_FILTER: "content_filter",
    FinishReason.OTHER: "other",
}

#: Response extra metadata an adapter sets to the number of request parts it left out
#: (DESIGN §6c; scope.models._provenance.DROPPED_KEY, a layer this one cannot import).
_DROPPED_KEY: Final = "scope/dropped_parts"

COMPLETED: Final = "completed"
FAILED: Final = "failed"
STOPPED: Final = "stopped"
CANCELLED: Final = "cancelled"


def _latest_requested() -> bool:
    raw = os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return _OPT_IN in (item.strip() for item in raw.split(","))


def _is_cancellation(exc: BaseException) -> bool:
    # asyncio.CancelledError and trio.Cancelled are BaseException but not Exception;
    # GeneratorExit, KeyboardInterrupt and SystemExit are not cancellations.
    return not isinstance(exc, Exception | GeneratorExit | KeyboardInterrupt | SystemExit)


def _server(inner: object) -> dict[str, Any]:
    base_url = getattr(inner, "base_url", None)
    if not isinstance(base_url, str) or not base_url:
        return {}
    try:
        parsed = urllib.parse.urlsplit(base_url)
        port = parsed.port
    except ValueError:
        return {}
    if not parsed.hostname:
        return {}
    if port is None:
        port = {"http": 80, "https": 443}.get(parsed.scheme)
    out: dict[str, Any] = {"server.address": parsed.hostname}
    if port is not None:
        out["server.port"] = port
    return out


@final
class Tracing:
    """Call and stream middlewares that trace a model (see the module docstring).

    Made by ``tracing()``. ``t.call`` is a ``chat.CallMiddleware`` and ``t.stream`` a
    ``chat.StreamMiddleware``: ``chat.wrap(model, t.call)``,
    ``chat.wrap_stream(streamer, t.stream)``. One ``Tracing`` may wrap any number of
    models, used from any number of tasks.

    Place it innermost (closest to the provider adapter) to see the adapter's provider
    name, default model and server address, and the messages it really receives (behind
    a ``history.Middleware``, the replayed history).
    """

    __slots__ = (
        "_capture",
        "_duration",
        "_latest",
        "_provider_key",
        "_provider_name",
        "_token_usage",
        "_tracer",
        "_ttfc",
    )

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = False,
        provider_name: str | None = None,
    ) -> None:
        if provider_name is not None and (not isinstance(provider_name, str) or not provider_name):
            raise ValueError(f"provider_name must be a non-empty string, got {provider_name!r}")
        latest = _latest_requested()
        if capture_content and not latest:
            warnings.warn(
                "scope.otel: capture_content=True records message content only with the "
                f"latest GenAI conventions; set OTEL_SEMCONV_STABILITY_OPT_IN={_OPT_IN} "
                "(nothing is captured with the v1.36.0 conventions)",
                RuntimeWarning,
                stacklevel=3,
            )
        version = SEMCONV_VERSION if latest else _LEGACY_VERSION
        schema_url = f"https://opentelemetry.io/schemas/{version}"
        if tracer_provider is None:
            tracer = trace.get_tracer("scope.otel", __version__, schema_url=schema_url)
        else:
            tracer = tracer_provider.get_tracer("scope.otel", __version__, schema_url=schema_url)
        if meter_provider is None:
            meter = metrics.get_meter("scope.otel", __version__, schema_url=schema_url)
        else:
            meter = meter_provider.get_meter("scope.otel", __version__, schema_url=schema_url)
        self._tracer = tracer
        self._latest = latest
        self._capture = bool(capture_content) and latest
        self._provider_name = provider_name
        self._provider_key = "gen_ai.provider.name" if latest else "gen_ai.system"
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=list(_TOKEN_BUCKETS),
        )
        self._ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )

    @property
    def capture_content(self) -> bool:
        """Whether message content is recorded (requested and the latest conventions)."""
        return self._capture

    @property
    def latest_conventions(self) -> bool:
        """True when emitting the v1.41.0 conventions, False for the v1.36.0 names."""
        return self._latest

    def call(self, next: Model) -> Model:
        """A call middleware: trace ``next`` (use with ``chat.wrap``)."""
        return _TracedModel(self, next, self._base(next))

    def stream(self, next: Streamer) -> Streamer:
        """A stream middleware: trace ``next`` (use with ``chat.wrap_stream``)."""
        return _TracedStreamer(self, next, self._base(next))

    # ------------------------------------------------------------------ internals

    def _base(self, inner: object) -> _Base:
        provider = getattr(inner, "provider_name", None)
        if not isinstance(provider, str) or not provider:
            provider = self._provider_name
        if provider is None:
            raise ValueError(
                f"scope.otel: {type(inner).__name__} does not say which provider it talks "
                "to (no provider_name attribute): pass tracing(provider_name=...), e.g. "
                "'openai' (gen_ai.provider.name is required by the conventions)"
            )
        default_model = getattr(inner, "model", None)
        if not isinstance(default_model, str):
            default_model = ""
        common: dict[str, Any] = {"gen_ai.operation.name": "chat", self._provider_key: provider}
        common.update(_server(inner))
        return _Base(common, default_model)

    def _start(
        self, base: _Base, request: Request, stream: bool, conversation: str | None
    ) -> _Operation:
        options = request.options
        model = options.model or base.default_model
        metric_attrs = dict(base.common)
        if model:
            metric_attrs["gen_ai.request.model"] = model
        attrs = dict(metric_attrs)
        for option, key in _REQUEST_ATTRIBUTES:
            value = getattr(options, option)
            if value is not None:
                attrs[key] = value
        if options.top_k is not None:
            attrs["gen_ai.request.top_k"] = float(options.top_k)  # a double in the conventions
        if options.output_format is not None:
            attrs["gen_ai.output.type"] = _OUTPUT_TYPES[options.output_format.type]
        if conversation is not None:
            attrs["gen_ai.conversation.id"] = conversation
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat", kind=SpanKind.CLIENT, attributes=attrs
        )
        capture = self._capture and span.is_recording()
        if capture:
            _set_json(span, "gen_ai.input.messages", [_message(m) for m in request.messages])
        return _Operation(self, span, metric_attrs, capture, stream)


@final
class _Base:
    __slots__ = ("common", "default_model")

    def __init__(self, common: dict[str, Any], default_model: str) -> None:
        self.common = common
        self.default_model = default_model


@final
class _Operation:
    """One traced call or stream: its span, what the response said, how it ended."""

    __slots__ = (
        "accumulator",
        "capture",
        "chunks",
        "context",
        "dropped",
        "finish",
        "first_chunk",
        "metric_attrs",
        "model",
        "response_id",
        "span",
        "start",
        "stream",
        "tracing",
        "usage",
    )

    def __init__(
        self,
        tracing: Tracing,
        span: trace.Span,
        metric_attrs: dict[str, Any],
        capture: bool,
        stream: bool,
    ) -> None:
        self.tracing = tracing
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.metric_attrs = metric_attrs
        self.capture = capture
        self.stream = stream
        self.accumulator: ResponseAccumulator | None = (
            ResponseAccumulator() if capture and stream else None
        )
        self.chunks = 0
        self.first_chunk: float | None = None
        self.response_id = ""
        self.model = ""
        self.finish: FinishReason | None = None
        self.usage: Usage | None = None
        # scope/dropped_parts of the response: parts of the request the adapter left out.
        self.dropped: int | None = None
        self.start = time.perf_counter()

    def observe(self, response: Response) -> None:
        """Note what a response (or a stream's chunk) says about the response."""
        meta = response.metadata
        if meta is not None:
            if meta.id:
                self.response_id = meta.id
            if meta.model:
                self.model = meta.model
            usage = meta.usage
            if not usage.is_zero():
                self.usage = usage
            extra = meta.extra
            if extra:
                dropped = extra.get(_DROPPED_KEY)
                if dropped is not None:
                    value = dropped.value()
                    if type(value) is int:
                        self.dropped = value
        output = response.output
        if output is not None and output.finish_reason is not None:
            self.finish = output.finish_reason
        accumulator = self.accumulator
        if accumulator is not None:
            try:
                accumulator.add(response)
            except InvalidResponseError:
                # Not ours to raise: the consumer sees the chunk; content stops here.
                self.accumulator = None

    def chunk(self, response: Response) -> None:
        if self.first_chunk is None:
            self.first_chunk = time.perf_counter() - self.start
        self.chunks += 1
        self.observe(response)

    def end(self, outcome: str, error: BaseException | None, final: Response | None) -> None:
        """Finish the span and record the metrics."""
        tracing = self.tracing
        span = self.span
        duration = time.perf_counter() - self.start
        metric_attrs = self.metric_attrs
        if self.model:
            metric_attrs["gen_ai.response.model"] = self.model
        error_type = None if error is None or outcome != FAILED else type(error).__qualname__
        if span.is_recording():
            attrs: dict[str, Any] = {"scope.chat.outcome": outcome}
            if self.response_id:
                attrs["gen_ai.response.id"] = self.response_id
            if self.model:
                attrs["gen_ai.response.model"] = self.model
            if self.finish is not None:
                attrs["gen_ai.response.finish_reasons"] = (self.finish.value,)
            usage = self.usage
            if usage is not None:
                attrs["gen_ai.usage.input_tokens"] = usage.input_tokens
                attrs["gen_ai.usage.output_tokens"] = usage.output_tokens
                if usage.cache_read_input_tokens is not None:
                    attrs["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_input_tokens
                if usage.cache_write_input_tokens is not None:
                    attrs["gen_ai.usage.cache_creation.input_tokens"] = (
                        usage.cache_write_input_tokens
                    )
                if usage.reasoning_tokens is not None:
                    attrs["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
            if self.dropped is not None:
                attrs["scope.replay.dropped_parts"] = self.dropped
            if self.stream:
                attrs["scope.chat.chunks"] = self.chunks
                if self.first_chunk is not None:
                    attrs["gen_ai.response.time_to_first_chunk"] = self.first_chunk
            if error_type is not None:
                attrs["error.type"] = error_type
            span.set_attributes(attrs)
            if self.capture:
                if self.accumulator is not None:
                    final = self.accumulator.response()
                if final is not None:
                    output = _output(final)
                    if output is not None:
                        _set_json(span, "gen_ai.output.messages", [output])
            if error_type is not None:
                assert error is not None
                span.record_exception(error, escaped=True)
                span.set_status(Status(StatusCode.ERROR, f"{error_type}: {error}"))
        span.end()
        if outcome in (COMPLETED, FAILED):
            if error_type is not None:
                metric_attrs["error.type"] = error_type
            tracing._duration.record(duration, metric_attrs)
            if self.first_chunk is not None:
                tracing._ttfc.record(self.first_chunk, metric_attrs)
            usage = self.usage
            if usage is not None:
                record = tracing._token_usage.record
                record(usage.input_tokens, {**metric_attrs, "gen_ai.token.type": "input"})
                record(usage.output_tokens, {**metric_attrs, "gen_ai.token.type": "output"})


def _outcome(exc: BaseException) -> str:
    return CANCELLED if _is_cancellation(exc) else FAILED


@final
class _TracedModel:
    """``Tracing.call(next)``."""

    __slots__ = ("_base", "_next", "_tracing")

    def __init__(self, tracing: Tracing, next: Model, base: _Base) -> None:
        self._tracing = tracing
        self._next = next
        self._base = base

    @property
    def next(self) -> Model:
        """The model this one traces."""
        return self._next

    async def call(self, request: Request) -> Response:
        if not isinstance(request, Request):
            return await self._next.call(request)  # the model refuses it; nothing to trace
        operation = self._tracing._start(
            self._base, request, stream=False, conversation=current_conversation()
        )
        token = otel_context.attach(operation.context)
        try:
            response = await self._next.call(request)
        except BaseException as exc:
            otel_context.detach(token)
            operation.end(_outcome(exc), exc, None)
            raise
        otel_context.detach(token)
        if isinstance(response, Response):
            operation.observe(response)
            operation.end(COMPLETED, None, response)
        else:  # not ours to refuse: whoever called the model will
            operation.end(COMPLETED, None, None)
        return response


@final
class _TracedStreamer:
    """``Tracing.stream(next)``."""

    __slots__ = ("_base", "_next", "_tracing")

    def __init__(self, tracing: Tracing, next: Streamer, base: _Base) -> None:
        self._tracing = tracing
        self._next = next
        self._base = base

    @property
    def next(self) -> Streamer:
        """The streamer this one traces."""
        return self._next

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        if not isinstance(request, Request):
            return self._next.stream(request)  # the streamer refuses it; nothing to trace
        # The conversation is read now, when the stream is made: an enclosing
        # history.Middleware sets it around this call, never across its own yields.
        return self._run(request, current_conversation())

    async def _run(
        self, request: Request, conversation: str | None
    ) -> AsyncGenerator[Response, None]:
        if conversation is None:
            conversation = current_conversation()
        operation = self._tracing._start(
            self._base, request, stream=True, conversation=conversation
        )
        context = operation.context
        outcome = COMPLETED
        error: BaseException | None = None
        inner: AsyncIterator[Response] | None = None
        try:
            # The span is made current for each step of the inner stream and detached
            # before each yield: attaching across a yield would leak it into the
            # consumer's code and break when the consumer resumes from another context.
            token = otel_context.attach(context)
            try:
                inner = self._next.stream(request)
            finally:
                otel_context.detach(token)
            del request
            while True:
                token = otel_context.attach(context)
                try:
                    chunk = await inner.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    otel_context.detach(token)
                operation.chunk(chunk)
                yield chunk
        except GeneratorExit:
            outcome = STOPPED
            raise
        except BaseException as exc:
            outcome = _outcome(exc)
            error = exc
            raise
        finally:
            try:
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    token = otel_context.attach(context)
                    try:
                        await aclose()
                    finally:
                        otel_context.detach(token)
            finally:
                operation.end(outcome, error, None)


# -- content -------------------------------------------------------------------------------


def _set_json(span: trace.Span, key: str, value: Any) -> None:
    span.set_attribute(key, orjson.dumps(value).decode())


def _modality(mime: str) -> str:
    return mime.split("/", 1)[0].strip().lower()


def _media(media: Media) -> dict[str, Any]:
    source = media.source
    mime = media.mime
    out: dict[str, Any]
    if source.kind is SourceKind.URI and not source.uri.lower().startswith("data:"):
        out = {"type": "uri", "modality": _modality(mime), "mime_type": mime, "uri": source.uri}
    elif source.kind is SourceKind.REFERENCE:
        out = {"type": "file", "modality": _modality(mime), "mime_type": mime}
        out["file_id"] = source.ref
    else:
        # Bytes (or a data: URI, bytes in disguise) are never recorded: their size is.
        size = len(source.data) if source.kind is SourceKind.BYTES else len(source.uri)
        out = {"type": "media", "modality": _modality(mime), "mime_type": mime, "size": size}
    if media.id:
        out["id"] = media.id
    if media.name:
        out["name"] = media.name
    return out


def _arguments(text: str) -> Any:
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return text  # malformed arguments are recorded as the model wrote them


def _part(part: Part) -> dict[str, Any] | None:
    kind = part.kind
    if kind is PartKind.TEXT:
        return {"type": "text", "content": part.text}
    if kind is PartKind.REASONING:
        return {"type": "reasoning", "content": part.text}  # the signature never
    if kind is PartKind.MEDIA:
        assert part.media is not None
        return _media(part.media)
    if kind is PartKind.TOOL_CALL:
        call = part.tool_call
        assert call is not None
        return {
            "type": "tool_call",
            "id": call.id,
            "name": call.name,
            "arguments": _arguments(call.arguments),
        }
    if kind is PartKind.TOOL_RESULT:
        result = part.tool_result
        assert result is not None
        text = result.output.text()
        response: Any = text
        if text is None:
            response = [p for p in map(_part, result.output.content) if p is not None]
        out = {"type": "tool_call_response", "id": result.id, "response": response}
        if result.is_error:
            out["is_error"] = True
        return out
    return None  # tool_call_delta: never in a request, merged away in a response


def _parts(parts: Sequence[Part]) -> list[dict[str, Any]]:
    return [p for p in map(_part, parts) if p is not None]


def _message(message: Message) -> Mapping[str, Any]:
    return {"role": message.role.value, "parts": _parts(message.parts)}


def _output(response: Response) -> dict[str, Any] | None:
    output = response.output
    if output is None or output.finish_reason is None:
        return None  # unfinished: the conventions need a finish reason
    parts = [] if output.message is None else _parts(output.message.parts)
    return {
        "role": "assistant",
        "parts": parts,
        "finish_reason": _MESSAGE_FINISH[output.finish_reason],
    }


def tracing(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    capture_content: bool = False,
    provider_name: str | None = None,
) -> Tracing:
    """Middlewares that trace model calls and streams with OpenTelemetry.

    ``tracer_provider`` / ``meter_provider``: where spans and metrics go (default: the
    global providers, resolved when used, so ``tracing()`` may run before the SDK is set
    up). ``capture_content``: record input and output messages (off by default: they may
    hold personal data; needs ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``).
    ``provider_name``: ``gen_ai.provider.name`` for models that do not say it themselves
    (an adapter's ``provider_name`` attribute wins); wrapping a model that does not say
    it without this argument raises ``ValueError``.

    Returns a ``Tracing``: ``chat.wrap(model, t.call)``, ``chat.wrap_stream(s, t.stream)``.
    """
    return Tracing(tracer_provider, meter_provider, capture_content, provider_name)
