"""The GenAI semantic conventions scope.otel emits: versions, attribute names, bucket
advice, outcomes, and the conventions' JSON for message content."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from opentelemetry import trace

from scope.chat import FinishReason, Message, OutputFormatType, Part, PartKind, Response
from scope.media import Media, SourceKind

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "DROPPED_KEY",
    "DURATION_BUCKETS",
    "FAILED",
    "LEGACY_VERSION",
    "OPT_IN",
    "OUTPUT_TYPES",
    "REQUEST_ATTRIBUTES",
    "SEMCONV_VERSION",
    "STOPPED",
    "TOKEN_BUCKETS",
    "latest_requested",
    "message",
    "output",
    "server",
    "set_json",
]

#: The version of the OpenTelemetry semantic conventions emitted with
#: ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``.
SEMCONV_VERSION: Final = "1.41.0"
LEGACY_VERSION: Final = "1.36.0"
OPT_IN: Final = "gen_ai_latest_experimental"

# Bucket advice of the conventions.
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# Request options recorded as they are: (option, span attribute), in this order. top_k
# is there for its place; it is written again as a double.
REQUEST_ATTRIBUTES: Final = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("stop", "gen_ai.request.stop_sequences"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
)
OUTPUT_TYPES: Final = {
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
DROPPED_KEY: Final = "scope/dropped_parts"

COMPLETED: Final = "completed"
FAILED: Final = "failed"
STOPPED: Final = "stopped"
CANCELLED: Final = "cancelled"


def latest_requested() -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest conventions."""
    raw = os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return OPT_IN in (item.strip() for item in raw.split(","))


def server(inner: object) -> dict[str, Any]:
    """``server.address`` and ``server.port`` from the inner model's ``base_url``."""
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


def set_json(span: trace.Span, key: str, value: Any) -> None:
    """Set ``key`` on ``span`` to ``value`` as compact JSON."""
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
    if kind is PartKind.NATIVE:
        # A provider's own item: named, never its data (it may hold encrypted state).
        native = part.native
        assert native is not None
        return {"type": "native", "provider": native.provider, "item_type": native.type}
    return None  # tool_call_delta: never in a request, merged away in a response


def _parts(parts: Sequence[Part]) -> list[dict[str, Any]]:
    return [p for p in map(_part, parts) if p is not None]


def message(message: Message) -> Mapping[str, Any]:
    """A request message as the conventions' input message JSON."""
    return {"role": message.role.value, "parts": _parts(message.parts)}


def output(response: Response) -> dict[str, Any] | None:
    """A finished response as the conventions' output message JSON (None: unfinished)."""
    output = response.output
    if output is None or output.finish_reason is None:
        return None  # unfinished: the conventions need a finish reason
    parts = [] if output.message is None else _parts(output.message.parts)
    return {
        "role": "assistant",
        "parts": parts,
        "finish_reason": _MESSAGE_FINISH[output.finish_reason],
    }
