"""Provider-native parts over the Gemini API (DESIGN §6k), on real recordings.

Each transcript (tests/gemini_transcripts/native_*.json and stream_native_*.json,
provenance in its description) is an answer recorded from the API: code execution
(``executableCode``, ``codeExecutionResult``) and file search run as a server tool
(``toolCall``, ``toolResponse``), their thought signatures and ``groundingMetadata``, by
call and by stream. A part the adapter does not model is a native part holding the wire
part as recorded, its signature included, in its place; the answer is stored and read
back equal; it goes back in place to the same model (the loopback server validates the
body with the official ``google-genai`` types) and to no other. Grounding is the
message's metadata and is never sent. ``stream_native_code``'s first chunk, taken as one
body, is the call of the same answer."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import PartKind, Request, Response, user_message, wrap, wrap_stream
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.models import _anthropic_wire, _interactions_wire, _responses_wire
from scope.models._gemini_wire import API, GROUNDING_KEY, parse_response
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


#: Recorded answers with parts the adapter keeps whole, by call and by stream.
CALLS = ["native_code_execution", "native_tool_call"]
STREAMS = ["stream_native_code", "stream_native_code_execution", "stream_native_tool_call"]


def _bodies(name: str) -> list[dict[str, Any]]:
    exchange = load_transcript(name)[0]
    bodies: list[dict[str, Any]] = exchange["sse"] if "sse" in exchange else [exchange["json"]]
    return bodies


def _wire_parts(name: str) -> list[dict[str, Any]]:
    return [
        part
        for body in _bodies(name)
        for candidate in body.get("candidates", [])
        for part in (candidate.get("content") or {}).get("parts", [])
    ]


def _kept(name: str) -> list[dict[str, Any]]:
    """The recorded parts the adapter does not model: code, its result, server tool
    calls and responses (each with its thought signature)."""
    return [part for part in _wire_parts(name) if "text" not in part]


def _order(kinds: list[str]) -> list[str]:
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


async def _answer(name: str, server: Any, model: Any) -> Response:
    if name.startswith("stream_"):
        _, response = await accumulate(model.stream(QUESTION))
        return response
    response: Response = await model.call(QUESTION)
    return response


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
async def test_native_parts_decode_whole_and_in_place(name: str, server: Any) -> None:
    server.script(load_transcript(name)[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        response = await _answer(name, server, model)
    assert response.output is not None and response.output.message is not None
    parts = response.output.message.parts
    kept = _kept(name)
    natives = [part.native for part in parts if part.native is not None]
    assert kept
    assert [(native.provider, native.type, native.data) for native in natives] == [
        (API, next(key for key in part if key != "thoughtSignature"), RawJSON.from_value(part))
        for part in kept
    ]
    # In place: the native parts stand where theirs stood among the text.
    recorded = [
        "text" if "text" in part else "native" for part in _wire_parts(name) if part.get("text", 1)
    ]
    kinds = [str(part.kind) for part in parts if part.kind in (PartKind.NATIVE, PartKind.TEXT)]
    assert _order(kinds) == _order(recorded)


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
async def test_native_parts_are_stored_and_go_back_to_their_own_model(
    name: str, server: Any
) -> None:
    server.script(load_transcript(name)[0], load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = GEMINI.recorded(server)
    async with model:
        history = Middleware(store, store, "c1")
        if name.startswith("stream_"):
            _, first = await accumulate(wrap_stream(model, history.stream).stream(QUESTION))
        else:
            first = await wrap(model, history.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        stored = await store.read("c1")
        assert stored[-1].parts == first.output.message.parts
        assert stored[-1].metadata.get(GROUNDING_KEY) == first.output.message.metadata.get(
            GROUNDING_KEY
        )
        await wrap(model, history.call).call(Request([user_message("And Italy's?")]))
    sent = server.requests[-1].body["contents"][1]
    assert sent["role"] == "model"
    # Every kept part goes back as recorded (its thought signature byte-exact), in place.
    assert [part for part in sent["parts"] if "text" not in part] == _kept(name)
    recorded = [
        "text" if "text" in part else "native" for part in _wire_parts(name) if part.get("text", 1)
    ]
    back = ["text" if "text" in part else "native" for part in sent["parts"] if part.get("text", 1)]
    assert _order(back) == _order(recorded)
    # Grounding is the answer's metadata, never sent.
    assert b"groundingChunks" not in orjson.dumps(server.requests[-1].body)


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
@pytest.mark.parametrize(
    ("other", "model_name"),
    [
        (API, "gemini-other"),
        (_anthropic_wire.API, "claude-x"),
        (_responses_wire.API, "gpt-x"),
        (_interactions_wire.API, GEMINI.model),
    ],
)
async def test_native_parts_never_reach_another_model(
    name: str, other: str, model_name: str, server: Any
) -> None:
    server.script(load_transcript(name)[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        response = await _answer(name, server, model)
    assert response.output is not None and response.output.message is not None
    request = Request([*QUESTION.messages, response.output.message, user_message("And then?")])
    sent, replay = sent_to(other, model_name, request)
    for part in _kept(name):
        for key, value in part.items():
            # Each member as the wire spells it, and the signature.
            spelled = orjson.dumps(value)
            assert (spelled[1:-1] if key == "thoughtSignature" else spelled) not in sent
    natives = [part for part in response.output.message.parts if part.kind is PartKind.NATIVE]
    assert len([why for why in replay.left_out if "native item" in why]) == len(natives)


@pytest.mark.parametrize("name", ["native_tool_call", "stream_native_tool_call"])
async def test_grounding_of_a_recorded_answer_is_kept_on_the_message(
    name: str, server: Any
) -> None:
    (recorded,) = [
        candidate["groundingMetadata"]
        for body in _bodies(name)
        for candidate in body.get("candidates", [])
        if "groundingMetadata" in candidate
    ]
    server.script(load_transcript(name)[0])
    model, _ = GEMINI.recorded(server)
    async with model:
        response = await _answer(name, server, model)
    assert response.output is not None and response.output.message is not None
    assert response.output.message.metadata[GROUNDING_KEY].value() == recorded
