"""What a browser is shown of provider-native items (DESIGN §6k), on recorded answers.

The pages a built-in search read (OpenAI ``web_search_call`` sources, Anthropic
``web_search_tool_result``) and the pages Anthropic's cited text points at become the AI
SDK's ``source-url`` parts (AG-UI: ``CUSTOM`` ``source`` events), each URL once; a
generated image a ``file`` part. Nothing else of a native item, and none of its
encrypted content, reaches the browser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from scope.chat import Message, Output, Response, assistant_message, native_part, text_part
from scope.models._anthropic_wire import parse_message
from scope.models._openai_wire import ChunkMapper
from scope.models._responses_wire import EventMapper, parse_response
from scope.web import agui_events, ui_message_stream
from tests.anthropic_server import load_transcript as anthropic_transcript
from tests.openai_server import load_transcript as openai_transcript
from tests.responses_server import load_transcript as responses_transcript

pytestmark = pytest.mark.anyio


async def _items(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _ui(*chunks: Response) -> list[Any]:
    data = b"".join([piece async for piece in ui_message_stream(_items(*chunks))])
    events = [e[6:] for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]
    return [orjson.loads(e) for e in events]


def _responses_chunks(name: str) -> list[Response]:
    mapper = EventMapper()
    chunks = [mapper.map("", orjson.dumps(event)) for event in responses_transcript(name)[1]["sse"]]
    return [chunk for chunk in chunks if chunk is not None]


async def test_an_openai_web_search_shows_the_pages_it_read() -> None:
    # The recorded search read an API (a source of type "api", no page): nothing shown.
    parts = await _ui(*_responses_chunks("native_web_search"))
    assert not any(p["type"] == "source-url" for p in parts)
    text = b"".join(orjson.dumps(p) for p in parts)
    assert b"gAAAAA" not in text and b"ws_" not in text  # no encrypted content, no ids
    # A search that read pages (INVENTED id and pages; the shape per the API reference).
    search = native_part(
        "openai.responses",
        "web_search_call",
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {
                "type": "search",
                "query": "paris",
                "sources": [
                    {"type": "url", "url": "https://example.org/paris"},
                    {"type": "api", "name": "oai-weather"},
                    {"type": "url", "url": "https://example.org/paris"},
                ],
            },
        },
    )
    parts = await _ui(Response(Output(assistant_message(search, "Sunny."))))
    shown = [p for p in parts if p["type"] == "source-url"]
    assert shown == [
        {"type": "source-url", "sourceId": "bsrc1", "url": "https://example.org/paris"}
    ]


async def test_anthropic_search_results_and_citations_show_each_page_once() -> None:
    answer = parse_message(orjson.dumps(anthropic_transcript("native_web_search")[0]["json"]))
    parts = await _ui(answer)
    shown = [p for p in parts if p["type"] == "source-url"]
    content = anthropic_transcript("native_web_search")[0]["json"]["content"]
    results = [
        r["url"] for b in content if b["type"] == "web_search_tool_result" for r in b["content"]
    ]
    cited = [c["url"] for b in content if b["type"] == "text" for c in b.get("citations") or []]
    assert [p["url"] for p in shown] == list(dict.fromkeys([*results, *cited]))
    assert all(p["title"] for p in shown)
    text = b"".join(orjson.dumps(p) for p in parts)
    assert b"encrypted" not in text and b"srvtoolu_" not in text
    # AG-UI: the same pages as CUSTOM source events.
    data = b"".join(
        [piece async for piece in agui_events(_items(answer), thread_id="t", run_id="r")]
    )
    events = [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: ")]
    custom = [e["value"]["url"] for e in events if e["type"] == "CUSTOM" and e["name"] == "source"]
    assert custom == [p["url"] for p in shown]
    assert b"encrypted" not in data


async def test_a_generated_image_is_a_file_part() -> None:
    # INVENTED id and image; the shape per the API reference.
    image = native_part(
        "openai.responses",
        "image_generation_call",
        {
            "type": "image_generation_call",
            "id": "ig_1",
            "status": "completed",
            "result": "iVBORw0KGgo=",
        },
    )
    parts = await _ui(Response(Output(assistant_message(image))))
    files = [p for p in parts if p["type"] == "file"]
    assert files == [
        {"type": "file", "url": "data:image/png;base64,iVBORw0KGgo=", "mediaType": "image/png"}
    ]
    assert not any(p["type"] == "source-url" for p in parts)


async def test_gemini_grounding_shows_its_web_pages() -> None:
    # INVENTED pages; the shape of groundingMetadata per the API reference. A grounding
    # chunk from file search (retrievedContext, as recorded) has no page: not shown.
    grounding = {
        "groundingChunks": [
            {"web": {"uri": "https://example.org/a", "title": "A"}},
            {"retrievedContext": {"text": "Paris is the capital of France."}},
            {"web": {"uri": "https://example.org/a", "title": "A"}},
        ],
    }
    message = assistant_message("Paris.")
    message = Message(message.role, message.parts, {"gemini/grounding": grounding})
    parts = await _ui(Response(Output(message)))
    shown = [p for p in parts if p["type"] == "source-url"]
    assert shown == [
        {"type": "source-url", "sourceId": "bsrc1", "url": "https://example.org/a", "title": "A"}
    ]


async def test_gemini_retrieved_context_with_a_uri_or_title_shows_as_a_source() -> None:
    # INVENTED uris and titles; RetrievedContext's uri, title and text per the Gemini
    # API reference (GroundingChunk.retrievedContext; Vertex AI fills uri and title).
    # A web uri is a page, any other uri or a title alone a document, its media type
    # guessed from its title; a chunk that is not an object is skipped.
    grounding = {
        "groundingChunks": [
            {"retrievedContext": {"uri": "https://example.org/kb/paris", "title": "Paris"}},
            {"retrievedContext": {"uri": "gs://example-bucket/france.pdf", "title": "france.pdf"}},
            {"retrievedContext": {"title": "Notes", "text": "Paris is the capital."}},
            "not a chunk",
        ],
    }
    message = assistant_message("Paris.")
    message = Message(message.role, message.parts, {"gemini/grounding": grounding})
    parts = await _ui(Response(Output(message)))
    shown = [p for p in parts if p["type"].startswith("source-")]
    assert shown == [
        {"type": "source-url", "sourceId": "bsrc1", "url": "https://example.org/kb/paris",
         "title": "Paris"},
        {"type": "source-document", "sourceId": "bsrc2", "mediaType": "application/pdf",
         "title": "france.pdf", "filename": "france.pdf"},
        {"type": "source-document", "sourceId": "bsrc3",
         "mediaType": "application/octet-stream", "title": "Notes", "filename": "Notes"},
    ]  # fmt: skip


async def test_openai_responses_annotations_after_the_text_show_their_pages() -> None:
    # Recorded: the stream's annotation comes after the text (message metadata of a
    # chunk without a message); the page shows once it is there.
    exchange = responses_transcript("native_annotations")[1]
    mapper = EventMapper()
    chunks = [mapper.map("", orjson.dumps(event)) for event in exchange["sse"]]
    parts = await _ui(*(chunk for chunk in chunks if chunk is not None))
    (item,) = [
        e["item"]
        for e in exchange["sse"]
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "message"
    ]
    (cited,) = item["content"][0]["annotations"]
    shown = [p for p in parts if p["type"] == "source-url"]
    assert shown == [
        {"type": "source-url", "sourceId": "bsrc1", "url": cited["url"], "title": cited["title"]}
    ]
    last_text = max(i for i, p in enumerate(parts) if p["type"] == "text-delta")
    assert parts.index(shown[0]) > last_text


async def test_openai_chat_completions_annotations_show_their_pages() -> None:
    exchange = openai_transcript("stream_openrouter_annotations")[0]
    mapper = ChunkMapper()
    chunks = [
        mapper.map("", event.encode() if isinstance(event, str) else orjson.dumps(event))
        for event in exchange["sse"]
    ]
    parts = await _ui(*(chunk for chunk in chunks if chunk is not None))
    cited = [
        a["url_citation"]
        for e in exchange["sse"]
        if isinstance(e, dict) and e["choices"]
        for a in e["choices"][0]["delta"].get("annotations") or []
    ]
    urls = list(dict.fromkeys(c["url"] for c in cited))
    assert len(urls) >= 2
    assert [p["url"] for p in parts if p["type"] == "source-url"] == urls


@pytest.mark.parametrize("way", ["call", "stream"])
async def test_a_file_search_citation_is_a_source_document(way: str) -> None:
    # Recorded: a file search answer whose text cites the file it found (file_citation).
    call = responses_transcript("native_file_search")[0]
    if way == "call":
        chunks = [parse_response(orjson.dumps(call["json"]))]
    else:
        chunks = _responses_chunks("native_file_search")
    parts = await _ui(*chunks)
    (message,) = [i for i in call["json"]["output"] if i["type"] == "message"]
    (citation,) = message["content"][0]["annotations"]
    assert citation["type"] == "file_citation"
    documents = [p for p in parts if p["type"] == "source-document"]
    assert documents == [
        {
            "type": "source-document",
            "sourceId": "bsrc1",
            "mediaType": "text/plain",
            "title": citation["filename"],
            "filename": citation["filename"],
        }
    ]
    assert citation["file_id"].encode() not in b"".join(orjson.dumps(p) for p in parts)


async def test_anthropic_document_citations_show_each_document_once() -> None:
    # INVENTED citations; their shapes per the Messages API reference (a plain-text
    # document cited twice, a PDF once, a custom-content document without a title).
    citations = [
        {
            "type": "char_location",
            "cited_text": "Paris",
            "document_index": 0,
            "document_title": "Capitals",
            "start_char_index": 0,
            "end_char_index": 5,
        },
        {
            "type": "page_location",
            "cited_text": "Rome",
            "document_index": 1,
            "document_title": "Atlas",
            "start_page_number": 3,
            "end_page_number": 4,
        },
        {
            "type": "char_location",
            "cited_text": "Paris",
            "document_index": 0,
            "document_title": "Capitals",
            "start_char_index": 9,
            "end_char_index": 14,
        },
        {
            "type": "content_block_location",
            "cited_text": "Bern",
            "document_index": 2,
            "document_title": None,
            "start_block_index": 0,
            "end_block_index": 1,
        },
    ]
    part = text_part("Paris, Rome and Bern.", {"anthropic/citations": citations})
    parts = await _ui(Response(Output(assistant_message(part))))
    documents = [
        (p["sourceId"], p["mediaType"], p["title"]) for p in parts if p["type"] == "source-document"
    ]
    assert documents == [
        ("bsrc1", "text/plain", "Capitals"),
        ("bsrc2", "application/pdf", "Atlas"),
        ("bsrc3", "text/plain", "Document 3"),
    ]


async def test_agui_gets_a_cited_document_as_a_custom_event() -> None:
    call = responses_transcript("native_file_search")[0]
    answer = parse_response(orjson.dumps(call["json"]))
    data = b"".join(
        [piece async for piece in agui_events(_items(answer), thread_id="t", run_id="r")]
    )
    events = [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e]
    (document,) = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "document"]
    assert document["value"]["mediaType"] == "text/plain"
    assert document["value"]["title"] == document["value"]["filename"]
