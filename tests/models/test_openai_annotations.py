"""Annotations on a Chat Completions answer (DESIGN §6k, §7e), on real recordings.

``tests/openai_transcripts/openrouter_annotations.json`` and
``stream_openrouter_annotations.json`` (provenance in their descriptions): OpenRouter's web
plugin answering by call (the message's ``annotations``) and by stream (five deltas that
each carry one annotation before the text). Both keep them as message metadata
``openai/annotations``, in order, as received; the Middleware stores them; no request
carries them (the API takes none on an input message)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import Request, user_message, wrap, wrap_stream
from scope.errors import InvalidResponseError
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.models._openai_wire import ANNOTATIONS_KEY, ChunkMapper
from tests.helpers import OPENAI, accumulate
from tests.openai_server import load_transcript

pytestmark = pytest.mark.anyio

QUESTION = Request([user_message("What is pydantic-ai?")])

server = OPENAI.server_fixture()


def _recorded(name: str) -> list[Any]:
    exchange = load_transcript(name)[0]
    if "json" in exchange:
        annotations: list[Any] = exchange["json"]["choices"][0]["message"]["annotations"]
        return annotations
    return [
        annotation
        for event in exchange["sse"]
        if isinstance(event, dict) and event["choices"]
        for annotation in event["choices"][0]["delta"].get("annotations") or []
    ]


@pytest.mark.parametrize("name", ["openrouter_annotations", "stream_openrouter_annotations"])
async def test_annotations_are_kept_by_call_and_by_stream_and_stored(
    name: str, server: Any
) -> None:
    recorded = _recorded(name)
    assert len(recorded) >= 2 and all(a["type"] == "url_citation" for a in recorded)
    server.script(load_transcript(name)[0], load_transcript("plain_answer")[0])
    store = InMemoryStore()
    model, _ = OPENAI.recorded(server, model="deepseek/deepseek-chat")
    async with model:
        middleware = Middleware(store, store, "c1")
        if name.startswith("stream_"):
            chunks, response = await accumulate(
                wrap_stream(model, middleware.stream).stream(QUESTION)
            )
            # the text streamed before the annotations' message metadata came
            assert chunks[-1].output is not None and chunks[-1].output.message is None
        else:
            response = await wrap(model, middleware.call).call(QUESTION)
        assert response.output is not None and response.output.message is not None
        message = response.output.message
        assert message.metadata[ANNOTATIONS_KEY].value() == recorded
        assert message.text
        stored = await store.read("c1")
        assert stored[-1].metadata[ANNOTATIONS_KEY] == message.metadata[ANNOTATIONS_KEY]
        await wrap(model, middleware.call).call(Request([user_message("Thanks.")]))
    body = server.requests[-1].body
    (assistant,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert "annotations" not in assistant
    assert recorded[0]["url_citation"]["title"].encode() not in orjson.dumps(body)


def test_annotations_after_the_finish_follow_as_message_metadata() -> None:
    # Invented order (no recording has it): an annotation after the finish reason.
    mapper = ChunkMapper()
    cite = {"type": "url_citation", "url_citation": {"url": "https://example.com", "title": "E"}}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return orjson.dumps({"id": "c", "choices": [choice]})

    assert mapper.map("message", event({"content": "Hi", "annotations": [cite]})) is not None
    finished = mapper.map("message", event({}, "stop"))
    assert finished is not None and finished.output is not None
    assert finished.output.message_metadata[ANNOTATIONS_KEY].value() == [cite]
    late = mapper.map("message", event({"annotations": [cite]}))
    assert late is not None and late.output is not None
    assert late.output.message_metadata[ANNOTATIONS_KEY].value() == [cite, cite]
    with pytest.raises(InvalidResponseError, match=r"delta\.annotations must be an array"):
        ChunkMapper().map("message", event({"annotations": {"type": "url_citation"}}))
