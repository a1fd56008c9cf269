"""The loopback server of tests/openai_server.py, speaking the OpenAI Responses API.

Transcripts live in tests/responses_transcripts/ (same format; every ``sse`` object goes
out with an ``event: <its "type">`` line, as the API frames them). The base URL ends in
``/v1``, as for Chat Completions. The checkers validate request bodies, responses and
stream events with the official ``openai`` package's Responses types.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.openai_server import OpenAIServer, Recorded, validate_body

__all__ = [
    "TRANSCRIPTS",
    "Recorded",
    "ResponsesServer",
    "check_event",
    "check_request_body",
    "check_response",
    "load_transcript",
]

TRANSCRIPTS = Path(__file__).parent / "responses_transcripts"


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of ``tests/responses_transcripts/<name>.json``."""
    data = json.loads((TRANSCRIPTS / f"{name}.json").read_text(encoding="utf-8"))
    exchanges: list[dict[str, Any]] = data["exchanges"]
    return exchanges


def _named(exchange: dict[str, Any]) -> dict[str, Any]:
    return {"named_events": True, **exchange} if "sse" in exchange else exchange


class ResponsesServer(OpenAIServer):
    """``with ResponsesServer() as s``: ``s.base_url`` is ``http://127.0.0.1:<port>/v1``."""

    def script(self, *exchanges: dict[str, Any]) -> None:
        super().script(*(_named(exchange) for exchange in exchanges))

    def serve_repeatedly(self, exchange: dict[str, Any]) -> None:
        super().serve_repeatedly(_named(exchange))

    def check_requests(self) -> None:
        """Validate every request body received with the ``openai`` package's Responses
        request types."""
        for recorded in self.requests:
            check_request_body(recorded.body)


def _params(streaming: bool) -> Any:
    from openai.types.responses import response_create_params as params

    if streaming:
        return params.ResponseCreateParamsStreaming
    return params.ResponseCreateParamsNonStreaming


def check_request_body(body: Any) -> None:
    """Validate a request body with the official ``openai`` package's Responses request
    types (``validate_body``: unknown fields refused at every level)."""
    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    validate_body(body, _params)


def check_response(body: Any) -> None:
    """Parse a ``response`` body with the ``openai`` package's model (an error body with
    its ``ErrorObject``-shaped ``error``)."""
    from openai.types.responses import Response

    if body.get("object") != "response":
        _check_error_object(body["error"])
        return
    Response.model_validate(body, strict=False)


def _check_error_object(error: Any) -> None:
    from openai.types.shared import ErrorObject

    ErrorObject.model_validate(error)


def check_event(body: Any) -> None:
    """Parse one stream event with the ``openai`` package's event union.

    An ``error`` event is the exception: recorded traffic nests its fields under
    ``"error"`` (``{"type": "error", "sequence_number": n, "error": {"type", "code",
    "message", "param"}}``) while the package's ``ResponseErrorEvent`` has them at the top
    level; both shapes are accepted, the nested one checked field by field.
    """
    from openai.types.responses import ResponseErrorEvent, ResponseStreamEvent
    from pydantic import TypeAdapter

    if body.get("type") == "error" and isinstance(body.get("error"), dict):
        assert set(body) == {"type", "sequence_number", "error"}, body
        assert type(body["sequence_number"]) is int
        _check_error_object(body["error"])
    elif body.get("type") == "error":
        ResponseErrorEvent.model_validate(body)
    else:
        TypeAdapter(ResponseStreamEvent).validate_python(body)
