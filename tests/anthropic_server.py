"""The loopback server of tests/openai_server.py, speaking the Anthropic Messages API.

Transcripts live in tests/anthropic_transcripts/ (same format; every ``sse`` object goes
out with an ``event: <its "type">`` line, as the API frames them). The base URL has no
``/v1``, as the official SDK's does. The checkers validate request bodies and responses
with the official ``anthropic`` package's types (a test-only dependency).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.openai_server import OpenAIServer, Recorded, validate_body

__all__ = [
    "TRANSCRIPTS",
    "AnthropicServer",
    "Recorded",
    "check_error",
    "check_event",
    "check_message",
    "check_request_body",
    "load_transcript",
]

TRANSCRIPTS = Path(__file__).parent / "anthropic_transcripts"


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of ``tests/anthropic_transcripts/<name>.json``."""
    data = json.loads((TRANSCRIPTS / f"{name}.json").read_text(encoding="utf-8"))
    exchanges: list[dict[str, Any]] = data["exchanges"]
    return exchanges


def _named(exchange: dict[str, Any]) -> dict[str, Any]:
    return {"named_events": True, **exchange} if "sse" in exchange else exchange


class AnthropicServer(OpenAIServer):
    """``with AnthropicServer() as s``: ``s.base_url`` is ``http://127.0.0.1:<port>``."""

    @property
    def base_url(self) -> str:
        return super().base_url.removesuffix("/v1")

    def script(self, *exchanges: dict[str, Any]) -> None:
        super().script(*(_named(exchange) for exchange in exchanges))

    def serve_repeatedly(self, exchange: dict[str, Any]) -> None:
        super().serve_repeatedly(_named(exchange))

    def check_requests(self) -> None:
        """Validate every request body received with the ``anthropic`` package's types."""
        for recorded in self.requests:
            check_request_body(recorded.body)


#: Sampling fields the installed ``anthropic`` package (2.x) no longer lists in its
#: request types, which the API has long accepted and the adapter maps (Options
#: temperature, top_p and top_k): checked here by hand, then removed before the SDK
#: types see the body.
_SAMPLING = {"temperature": float, "top_p": float, "top_k": int}


def check_request_body(body: Any) -> None:
    """Validate a request body with the official ``anthropic`` package's request types
    (``validate_body``: unknown fields refused at every level). Raises pydantic's
    ``ValidationError`` (or ``AssertionError``) for an invalid body.
    """
    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    body = dict(body)
    for name, kind in _SAMPLING.items():
        if name in body:
            value = body.pop(name)
            assert isinstance(value, kind | int) and not isinstance(value, bool), (name, value)
            assert value >= 0 and (kind is int or value <= 1), (name, value)
    validate_body(body, _anthropic_params)


def _anthropic_params(streaming: bool) -> Any:
    from anthropic.types import message_create_params as params

    if streaming:
        return params.MessageCreateParamsStreaming
    return params.MessageCreateParamsNonStreaming


def check_message(body: Any) -> None:
    """Parse a ``message`` body with the official ``anthropic`` package's model."""
    from anthropic.types import Message

    Message.model_validate(body)


def check_event(body: Any) -> None:
    """Parse one stream event with the official ``anthropic`` package's event union
    (``error`` events with its ``ErrorResponse``; the SDK handles ``ping``, which has no
    model, by name: it must be exactly ``{"type": "ping"}``)."""
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    if body.get("type") == "ping":
        assert body == {"type": "ping"}, body
    elif body.get("type") == "error":
        check_error(body)
    else:
        TypeAdapter(RawMessageStreamEvent).validate_python(body)


def check_error(body: Any) -> None:
    """Parse an error body (or ``error`` event) with the ``anthropic`` package's model."""
    from anthropic.types import ErrorResponse

    ErrorResponse.model_validate(body)
