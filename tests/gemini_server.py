"""The loopback server of tests/openai_server.py, speaking the Gemini API.

Transcripts live in tests/gemini_transcripts/ (same format; every ``sse`` object is one
whole ``GenerateContentResponse`` sent as ``data: <json>``, with no end marker). The base
URL is the host root, as the adapter's is; the server answers any path, and each test
checks the path it expects.

The checkers validate request bodies and responses with the official ``google-genai``
package's pydantic types (a test-only dependency). Those types are snake_case with
camelCase aliases, and accept both spellings by default: here every JSON object is
validated **by alias only** (``by_alias=True, by_name=False``), from the JSON text (so
``thoughtSignature`` is read as base64, as the SDK reads the wire), with unknown fields
refused at every level (the SDK's models forbid extra fields). The SDK has no type for the
REST request body as a whole (its ``GenerateContentConfig`` flattens
``generationConfig`` into the config), so these are **checked by hand**:

- the body's top-level members are among ``contents``, ``systemInstruction``, ``tools``,
  ``toolConfig``, ``safetySettings``, ``generationConfig``, ``cachedContent``, ``labels``
  (each then validated with its SDK type: ``Content``, ``Tool``, ``ToolConfig``,
  ``SafetySetting``, ``GenerationConfig``);
- each content's ``role`` is ``user`` or ``model`` (the SDK's type takes any string);
- every ``thoughtSignature`` is base64 (standard or URL-safe) and not empty.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import orjson

from tests.openai_server import OpenAIServer, Recorded

__all__ = [
    "TRANSCRIPTS",
    "GeminiServer",
    "Recorded",
    "check_request_body",
    "check_response",
    "load_transcript",
]

TRANSCRIPTS = Path(__file__).parent / "gemini_transcripts"

_TOP_LEVEL = {
    "contents": "Content[]",
    "systemInstruction": "Content",
    "tools": "Tool[]",
    "toolConfig": "ToolConfig",
    "safetySettings": "SafetySetting[]",
    "generationConfig": "GenerationConfig",
    "cachedContent": "str",
    "labels": "dict",
}
_B64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}\Z")


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The exchanges of ``tests/gemini_transcripts/<name>.json``."""
    data = json.loads((TRANSCRIPTS / f"{name}.json").read_text(encoding="utf-8"))
    exchanges: list[dict[str, Any]] = data["exchanges"]
    return exchanges


class GeminiServer(OpenAIServer):
    """``with GeminiServer() as s``: ``s.base_url`` is ``http://127.0.0.1:<port>``."""

    @property
    def base_url(self) -> str:
        return super().base_url.removesuffix("/v1")

    def check_requests(self) -> None:
        """Validate every request body received with the ``google-genai`` types."""
        for recorded in self.requests:
            check_request_body(recorded.body)


def _validate(type_name: str, value: Any) -> None:
    from google.genai import types

    cls = getattr(types, type_name)
    cls.model_validate_json(orjson.dumps(value), by_alias=True, by_name=False)


def _signatures(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "thoughtSignature":
                assert isinstance(item, str) and _B64.match(item), item
                base64.urlsafe_b64decode(item.replace("+", "-").replace("/", "_") + "==")
            else:
                _signatures(item)
    elif isinstance(value, list):
        for item in value:
            _signatures(item)


def check_request_body(body: Any) -> None:
    """Validate a request body (see the module docstring). Raises pydantic's
    ``ValidationError`` or ``AssertionError`` for an invalid body."""
    assert isinstance(body, dict), f"request body is not a JSON object: {body!r}"
    unknown = set(body) - set(_TOP_LEVEL)
    assert not unknown, f"unknown request fields: {sorted(unknown)}"
    assert isinstance(body.get("contents"), list), "contents must be an array"
    for name, kind in _TOP_LEVEL.items():
        if name not in body:
            continue
        value = body[name]
        if kind.endswith("[]"):
            assert isinstance(value, list), name
            for item in value:
                _validate(kind[:-2], item)
        elif kind == "str":
            assert isinstance(value, str), name
        elif kind == "dict":
            assert isinstance(value, dict), name
        else:
            _validate(kind, value)
    for content in body["contents"]:
        assert content.get("role") in ("user", "model"), content.get("role")
    _signatures(body)


def check_response(body: Any) -> None:
    """Parse a ``GenerateContentResponse`` (or one stream chunk) with the SDK's model, by
    alias."""
    if "error" in body:
        assert set(body["error"]) <= {"code", "message", "status", "details"}, body
        return
    _validate("GenerateContentResponse", body)
