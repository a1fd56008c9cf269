"""OpenTelemetry GenAI spans and metrics for scope models, as middleware (``scope-chat[otel]``).

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
(the history Middleware makes the id current while it calls ``call`` or ``stream``).
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

try:
    import opentelemetry.metrics
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "scope.otel needs the OpenTelemetry API: pip install 'scope-chat[otel]' "
        "(or opentelemetry-api)"
    ) from exc

from scope._validate import publish as _publish
from scope.otel._conventions import SEMCONV_VERSION as SEMCONV_VERSION
from scope.otel._spans import Tracing as Tracing
from scope.otel._spans import tracing as tracing

__all__ = ["SEMCONV_VERSION", "Tracing", "tracing"]

_publish(__name__, __all__, globals())
