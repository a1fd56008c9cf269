"""Provider-native parts over the Gemini API (DESIGN §6k), on a real recording.

``stream_native_code`` (tests/gemini_transcripts, provenance in its description) is an
answer recorded from the API: an ``executableCode`` part (file search run as code), then
text. The part the adapter does not model is a native part holding the wire part as
recorded, in its place, by stream and by call (the same chunks as one body); it goes
back in place to the same model (the loopback server validates the body with the
official ``google-genai`` types) and to no other."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import PartKind, Request, user_message
from scope.jsonvalue import RawJSON
from scope.models import _anthropic_wire, _interactions_wire, _responses_wire
from scope.models._gemini_wire import API, parse_response
from tests.gemini_server import load_transcript
from tests.helpers import GEMINI, accumulate, sent_to

pytestmark = pytest.mark.anyio

QUESTION = Request([user_message("What is the capital of France?")])

server = GEMINI.server_fixture()


def _chunks() -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = load_transcript("stream_native_code")[0]["sse"]
    return chunks


def _code_part() -> dict[str, Any]:
    part: dict[str, Any] = _chunks()[0]["candidates"][0]["content"]["parts"][0]
    assert "executableCode" in part
    return part


async def test_executable_code_is_kept_in_place_by_stream_and_call(server: Any) -> None:
    server.script(load_transcript("stream_native_code")[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        _, streamed = await accumulate(model.stream(QUESTION))
    assert streamed.output is not None and streamed.output.message is not None
    parts = streamed.output.message.parts
    assert [part.kind for part in parts] == [PartKind.NATIVE, PartKind.TEXT]
    native = parts[0].native
    assert native is not None and (native.provider, native.type) == (API, "executableCode")
    assert native.data == RawJSON.from_value(_code_part())
    assert streamed.output.message.text.startswith("The capital of France is Paris.")
    # By call: the first chunk as one body gives the same part.
    called = parse_response(orjson.dumps(_chunks()[0]))
    assert called.output is not None and called.output.message is not None
    assert called.output.message.parts[0] == parts[0]


async def test_executable_code_goes_back_to_its_own_model_only(server: Any) -> None:
    server.script(load_transcript("stream_native_code")[0], load_transcript("text")[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        _, streamed = await accumulate(model.stream(QUESTION))
        assert streamed.output is not None and streamed.output.message is not None
        answer = streamed.output.message
        request = Request([*QUESTION.messages, answer, user_message("And Italy's?")])
        await model.call(request)
    sent = server.requests[-1].body["contents"][1]
    assert sent["role"] == "model"
    assert sent["parts"][0] == _code_part()
    code = _code_part()["executableCode"]["code"].encode()
    others = [
        (API, "gemini-other"),
        (_anthropic_wire.API, "claude-x"),
        (_responses_wire.API, "gpt-x"),
        (_interactions_wire.API, GEMINI.model),
    ]
    for other, model_name in others:
        sent_body, replay = sent_to(other, model_name, request)
        assert sent_body.find(orjson.dumps(code.decode())[1:-1]) == -1
        assert any("native item" in why for why in replay.left_out)


async def test_grounding_is_kept_on_the_message_and_never_sent_back(server: Any) -> None:
    from scope.models._gemini_wire import GROUNDING_KEY

    server.script(load_transcript("stream_native_code")[0], load_transcript("text")[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        _, streamed = await accumulate(model.stream(QUESTION))
        assert streamed.output is not None and streamed.output.message is not None
        answer = streamed.output.message
        recorded = _chunks()[-1]["candidates"][0]["groundingMetadata"]
        assert answer.metadata[GROUNDING_KEY].value() == recorded
        # By call: the last chunk as one body keeps it too.
        called = parse_response(orjson.dumps(_chunks()[-1]))
        assert called.output is not None and called.output.message is not None
        assert called.output.message.metadata[GROUNDING_KEY].value() == recorded
        await model.call(Request([*QUESTION.messages, answer, user_message("And Italy's?")]))
    assert b"groundingChunks" not in orjson.dumps(server.requests[-1].body)


async def test_grounding_on_a_chunk_without_parts_is_kept_on_the_message(server: Any) -> None:
    # Invented variation of the recording: the grounding comes on a last chunk of its own
    # (no content, the finish reason), after the text; it is metadata for the message all the same.
    from scope.models._gemini_wire import GROUNDING_KEY

    exchange = load_transcript("stream_native_code")[0]
    last = dict(exchange["sse"][-1])
    recorded = last["candidates"][0]["groundingMetadata"]
    moved = ("groundingMetadata", "finishReason")
    candidate = {k: v for k, v in last["candidates"][0].items() if k not in moved}
    finish = last["candidates"][0]["finishReason"]
    alone = {"candidates": [{"index": 0, "groundingMetadata": recorded, "finishReason": finish}]}
    exchange = {
        **exchange,
        "sse": [*exchange["sse"][:-1], {**last, "candidates": [candidate]}, alone],
    }
    server.script(exchange)
    model, _ = GEMINI.recorded(server)
    async with model:
        chunks, streamed = await accumulate(model.stream(QUESTION))
    assert chunks[-1].output is not None and chunks[-1].output.message is None
    assert streamed.output is not None and streamed.output.message is not None
    assert streamed.output.message.metadata[GROUNDING_KEY].value() == recorded
