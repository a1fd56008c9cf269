"""Golden documents in the Go field layout: they decode, and encode to exact bytes.

Each ``tests/golden/NAME.json`` is written the way another implementation might write
it (Go field order, indentation, ``\\u`` escapes, numbers such as ``2.50``, ``0E0`` and
``1.20E-3``); ``NAME.canonical.json`` holds the exact canonical bytes (no trailing
newline). A change to these bytes is a wire-format change: update them only on purpose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scope.chat import FinishReason, PartKind, Request, Response, ToolResult
from scope.codec import from_json, to_json
from scope.history import Batch

GOLDEN = Path(__file__).parents[1] / "golden"
CASES: list[tuple[str, Any]] = [
    ("request", Request),
    ("response", Response),
    ("chunk", Response),
    ("tool_result", ToolResult),
]


@pytest.mark.parametrize(("name", "cls"), CASES)
def test_golden_document_encodes_to_exact_bytes(name: str, cls: Any) -> None:
    source = (GOLDEN / f"{name}.json").read_bytes()
    expected = (GOLDEN / f"{name}.canonical.json").read_bytes()
    value = from_json(source, cls)
    assert to_json(value) == expected
    assert from_json(expected, cls) == value
    assert to_json(from_json(expected, cls)) == expected


def test_golden_request_contents() -> None:
    request = from_json((GOLDEN / "request.json").read_bytes(), Request)
    kinds = {part.kind for message in request.messages for part in message.parts}
    assert kinds == set(PartKind) - {PartKind.TOOL_CALL_DELTA}  # a request carries no deltas
    assert request.messages[1].metadata["trace"].bytes == b'{"span":"s1","weight":2.50}'
    assert request.tools[0].input_schema.bytes.count(b"0E0") == 1
    assert request.options.stop == ("\n\n", "END")
    assert request.options.temperature == 0.0
    assert request.options.extensions.decode("openai/seed") == 7
    assert request.messages[2].parts[1].signature == b"\x00\x01"


def test_golden_response_contents() -> None:
    response = from_json((GOLDEN / "response.json").read_bytes(), Response)
    response.validate_complete()
    assert response.usage.cache_write_input_tokens == 0
    assert response.output is not None and response.output.finish_reason is FinishReason.STOP
    assert response.metadata is not None
    assert response.metadata.extra["cost_usd"].bytes == b"1.20E-3"
    # A provider's own item keeps its position and its number spellings (DESIGN §6k).
    native = response.output.message.parts[1].native if response.output.message else None
    assert native is not None and native.type == "web_search_call"
    assert b'"score":0.50,' in native.data.bytes
    assert response.text == "It is the Belém Tower."
    chunk = from_json((GOLDEN / "chunk.json").read_bytes(), Response)
    with pytest.raises(ValueError):
        chunk.validate_complete()


def test_golden_messages_in_a_batch_keep_their_digest() -> None:
    request = from_json((GOLDEN / "request.json").read_bytes(), Request)
    batch = Batch("golden", "a1", request.messages[1:])
    again = Batch.from_json(batch.to_json())
    assert again.digest == batch.digest
    assert again.to_json() == batch.to_json()
