"""The tracing middlewares: one span per model call or stream, and its metrics."""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, final

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from scope import __version__
from scope._context import current_conversation, is_cancellation
from scope._validate import check_name
from scope.chat import (
    FinishReason,
    Model,
    Request,
    Response,
    ResponseAccumulator,
    Streamer,
    Usage,
)
from scope.errors import InvalidResponseError
from scope.otel import _conventions as conv
from scope.otel._conventions import CANCELLED, COMPLETED, FAILED, STOPPED
from scope.otel._metrics import Instruments

__all__ = ["Tracing", "tracing"]


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
        "_instruments",
        "_latest",
        "_provider_key",
        "_provider_name",
        "_tracer",
    )

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = False,
        provider_name: str | None = None,
    ) -> None:
        if provider_name is not None:
            check_name(provider_name, "tracing provider_name")
        latest = conv.latest_requested()
        if capture_content and not latest:
            warnings.warn(
                "scope.otel: capture_content=True records message content only with the "
                f"latest GenAI conventions; set OTEL_SEMCONV_STABILITY_OPT_IN={conv.OPT_IN} "
                "(nothing is captured with the v1.36.0 conventions)",
                RuntimeWarning,
                stacklevel=3,
            )
        version = conv.SEMCONV_VERSION if latest else conv.LEGACY_VERSION
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
        self._instruments = Instruments(meter)

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
        common.update(conv.server(inner))
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
        for option, key in conv.REQUEST_ATTRIBUTES:
            value = getattr(options, option)
            if value is not None:
                attrs[key] = value
        if options.top_k is not None:
            attrs["gen_ai.request.top_k"] = float(options.top_k)  # a double in the conventions
        if options.output_format is not None:
            attrs["gen_ai.output.type"] = conv.OUTPUT_TYPES[options.output_format.type]
        if conversation is not None:
            attrs["gen_ai.conversation.id"] = conversation
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat", kind=SpanKind.CLIENT, attributes=attrs
        )
        capture = self._capture and span.is_recording()
        if capture:
            conv.set_json(
                span, "gen_ai.input.messages", [conv.message(m) for m in request.messages]
            )
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
                dropped = extra.get(conv.DROPPED_KEY)
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
                    output = conv.output(final)
                    if output is not None:
                        conv.set_json(span, "gen_ai.output.messages", [output])
            if error_type is not None:
                assert error is not None
                span.record_exception(error, escaped=True)
                span.set_status(Status(StatusCode.ERROR, f"{error_type}: {error}"))
        span.end()
        if outcome in (COMPLETED, FAILED):
            if error_type is not None:
                metric_attrs["error.type"] = error_type
            tracing._instruments.record(duration, self.first_chunk, self.usage, metric_attrs)


def _outcome(exc: BaseException) -> str:
    return CANCELLED if is_cancellation(exc) else FAILED


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
