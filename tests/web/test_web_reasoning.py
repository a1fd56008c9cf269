"""Reasoning reaches a browser as text only: the AI SDK's ``reasoning-*`` parts and
AG-UI's ``REASONING_*`` events (never the deprecated ``THINKING_*`` ones, which
``@ag-ui/core`` 1.0 no longer has). A provider's encrypted or redacted reasoning (a
signature without text) opens no block, and no signature is ever sent: not in clear,
not base64, not as AG-UI's ``REASONING_ENCRYPTED_VALUE`` (the server's store owns the
history, so a client has nothing to send it back for)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from scope.chat import FinishReason, Output, Response, assistant_message, reasoning_part
from scope.web import agui_events, ui_message_stream

pytestmark = pytest.mark.anyio

SECRET = b"opaque-provider-signature:9f8e7d"
REDACTED = {"anthropic/redacted": True, "anthropic/block": 0}


def _chunks() -> list[Response]:
    return [
        # Redacted reasoning: a signature, no text.
        Response(Output(assistant_message(reasoning_part(signature=SECRET, metadata=REDACTED)))),
        # Visible reasoning whose signature arrives with its last delta.
        Response(
            Output(assistant_message(reasoning_part("Think", metadata={"anthropic/block": 1})))
        ),
        Response(
            Output(
                assistant_message(
                    reasoning_part("ing.", signature=SECRET, metadata={"anthropic/block": 1})
                )
            )
        ),
        Response(Output(assistant_message("Answer."), FinishReason.STOP)),
    ]


async def _stream() -> AsyncIterator[Response]:
    for chunk in _chunks():
        yield chunk


def _events(data: bytes) -> list[dict[str, Any]]:
    lines = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(line) for line in lines if line != b"[DONE]"]


def _never_sent(data: bytes) -> None:
    assert SECRET not in data
    assert base64.b64encode(SECRET) not in data
    assert base64.b64encode(SECRET).rstrip(b"=") not in data
    assert b"ENCRYPTED" not in data and b"THINKING" not in data


async def test_ui_stream_sends_reasoning_text_and_no_signature() -> None:
    data = b"".join([d async for d in ui_message_stream(_stream())])
    _never_sent(data)
    parts = _events(data)
    kinds = [p["type"] for p in parts]
    assert kinds.count("reasoning-start") == kinds.count("reasoning-end") == 1
    deltas = [p["delta"] for p in parts if p["type"] == "reasoning-delta"]
    assert deltas == ["Think", "ing."]


async def test_agui_sends_reasoning_events_and_no_encrypted_value() -> None:
    data = b"".join([d async for d in agui_events(_stream(), thread_id="t", run_id="r")])
    _never_sent(data)
    kinds = [e["type"] for e in _events(data)]
    reasoning = [k for k in kinds if k.startswith("REASONING")]
    assert reasoning == [
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
    ]
    assert kinds[-1] == "RUN_FINISHED"


async def test_only_redacted_reasoning_shows_no_reasoning_at_all() -> None:
    async def stream() -> AsyncIterator[Response]:
        yield _chunks()[0]
        yield Response(Output(assistant_message("Answer."), FinishReason.STOP))

    for encoded in (ui_message_stream(stream()), agui_events(stream(), thread_id="t", run_id="r")):
        data = b"".join([d async for d in encoded])
        _never_sent(data)
        assert b"reasoning" not in data.lower()
