"""The annotations of a Responses answer's text (DESIGN §6k), on a real recording.

``tests/responses_transcripts/native_annotations.json`` (provenance in its description)
holds two answers to one web search question: one by call, one by stream. The stream
sends the annotation after the text it annotates (``response.output_text.annotation.added``,
then whole in ``response.output_item.done``): a call and a stream both keep it in the
message metadata ``openai/annotations``, by the message item's id; it is stored, goes
back with its text to the same model as received, and never to another model."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from scope.chat import Message, PartKind, Request, user_message, wrap, wrap_stream
from scope.errors import InvalidResponseError
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.models import _anthropic_wire, _gemini_wire, _openai_wire
from scope.models._responses_wire import ANNOTATIONS_KEY, API, parse_response
from tests.helpers import RESPONSES, accumulate, sent_to
from tests.responses_server import load_transcript

pytestmark = pytest.mark.anyio

QUESTION = Request([user_message("What is the tallest mountain in Alberta?")])

server = RESPONSES.server_fixture()


def _message_item(exchange: dict[str, Any]) -> dict[str, Any]:
    """The recorded ``message`` item of an exchange (by stream: its output_item.done)."""
    if "json" in exchange:
        items = exchange["json"]["output"]
    else:
        items = [e["item"] for e in exchange["sse"] if e["type"] == "response.output_item.done"]
    (item,) = [item for item in items if item["type"] == "message"]
    return item


def _expected(exchange: dict[str, Any]) -> dict[str, Any]:
    item = _message_item(exchange)
    annotations = [content["annotations"] for content in item["content"]]
    assert any(annotations)  # the recording cites a page
    return {item["id"]: annotations}


async def _answer(exchange: dict[str, Any], server: Any, store: InMemoryStore) -> Message:
    server.script(exchange)
    model, _ = RESPONSES.recorded(server)
    async with model:
        middleware = Middleware(store, store, "c1")
        if "sse" in exchange:
            streamed = wrap_stream(model, middleware.stream).stream(QUESTION)
            _, response = await accumulate(streamed)
        else:
            response = await wrap(model, middleware.call).call(QUESTION)
    assert response.output is not None and response.output.message is not None
    return response.output.message


@pytest.mark.parametrize("way", ["call", "stream"])
async def test_annotations_are_kept_by_call_and_by_stream_and_stored(way: str, server: Any) -> None:
    exchange = load_transcript("native_annotations")[way == "stream"]
    store = InMemoryStore()
    message = await _answer(exchange, server, store)
    assert message.metadata[ANNOTATIONS_KEY].value() == _expected(exchange)
    assert message.text == _message_item(exchange)["content"][0]["text"]
    stored = await store.read("c1")
    assert stored[-1].metadata[ANNOTATIONS_KEY] == message.metadata[ANNOTATIONS_KEY]
    assert stored[-1].parts == message.parts


@pytest.mark.parametrize("way", ["call", "stream"])
async def test_annotations_go_back_with_their_text_to_the_same_model(way: str, server: Any) -> None:
    exchange = load_transcript("native_annotations")[way == "stream"]
    store = InMemoryStore()
    await _answer(exchange, server, store)
    server.script(load_transcript("text")[0])
    model, _ = RESPONSES.recorded(server)
    async with model:
        await wrap(model, Middleware(store, store, "c1").call).call(
            Request([user_message("And the second tallest?")])
        )
    server.check_requests()  # the openai package's request types accept the body
    item = _message_item(exchange)
    (sent,) = [i for i in server.requests[-1].body["input"] if i.get("id") == item["id"]]
    assert [c["annotations"] for c in sent["content"]] == [
        c["annotations"] for c in item["content"]
    ]


@pytest.mark.parametrize(
    ("other", "model"),
    [
        (API, "gpt-5-other"),
        (_openai_wire.API, "gpt-x"),
        (_anthropic_wire.API, "claude-x"),
        (_gemini_wire.API, "gemini-x"),
    ],
)
def test_annotations_never_reach_another_model(other: str, model: str) -> None:
    exchange = load_transcript("native_annotations")[0]
    answer = parse_response(orjson.dumps(exchange["json"]))
    assert answer.output is not None and answer.output.message is not None
    request = Request([*QUESTION.messages, answer.output.message, user_message("And then?")])
    sent, _ = sent_to(other, model, request)
    for content in _message_item(exchange)["content"]:
        for annotation in content["annotations"]:
            assert annotation["title"].encode() not in sent
    assert answer.output.message.text.encode() in sent or other != API


async def test_merged_contents_send_their_text_without_annotations(server: Any) -> None:
    # Invented shape (no recording has it): a message item with two output_text
    # contents, which merge into one text part; the annotations cannot be told apart.
    exchange = copy.deepcopy(load_transcript("native_annotations")[0])
    item = _message_item(exchange)
    item["content"].append({"type": "output_text", "text": " More.", "annotations": []})
    store = InMemoryStore()
    message = await _answer(exchange, server, store)
    assert [p.kind for p in message.parts] == [PartKind.NATIVE, PartKind.TEXT]
    assert len(message.metadata[ANNOTATIONS_KEY].value()[item["id"]]) == 2
    server.script(load_transcript("text")[0])
    model, _ = RESPONSES.recorded(server)
    async with model:
        await wrap(model, Middleware(store, store, "c1").call).call(
            Request([user_message("And then?")])
        )
    (back,) = [i for i in server.requests[-1].body["input"] if i.get("id") == item["id"]]
    assert [c["annotations"] for c in back["content"]] == [[]]
    assert back["content"][0]["text"].endswith(" More.")


def test_annotations_of_a_wrong_type_are_refused() -> None:
    body = copy.deepcopy(load_transcript("native_annotations")[0]["json"])
    (item,) = [i for i in body["output"] if i["type"] == "message"]
    item["content"][0]["annotations"] = {"type": "url_citation"}
    with pytest.raises(InvalidResponseError, match=r"content\[0\]\.annotations must be an array"):
        parse_response(orjson.dumps(body))
