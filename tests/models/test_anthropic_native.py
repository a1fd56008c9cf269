"""Provider-native blocks over the Anthropic Messages API (DESIGN §6k), on real recordings.

Each transcript (tests/anthropic_transcripts/native_*.json and stream_native_*.json,
provenance in its description) is an answer recorded from the API: server web search
(with cited text), code execution (with its container), a remote MCP server, server web
fetch, the text editor code execution tool, server tool search (with a client
``tool_use`` and its ``caller``), the advisor tool and server-side compaction, by call
and by stream; code execution calling web fetch (server tool blocks with a ``caller``)
by call. Every block the adapter does not model is a native part holding the block
as recorded (what a stream's deltas bring included), in its place; text citations, the
container and a tool_use's caller are kept in metadata; the answer is stored and read
back equal; the next request to the same model carries every block back in order (the
loopback server validates the body with the official ``anthropic`` package's request
types) and names the container; a request to another model carries none of the blocks'
opaque strings."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import (
    Message,
    PartKind,
    Request,
    ToolOutput,
    ToolResult,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.models import _gemini_wire, _responses_wire
from scope.models._anthropic_wire import (
    API,
    CALLER_KEY,
    CITATIONS_KEY,
    CONTAINER_KEY,
    parse_message,
)
from tests.anthropic_server import load_transcript
from tests.helpers import ANTHROPIC, accumulate, sent_to

pytestmark = pytest.mark.anyio

#: Recorded by call and by stream (two answers each).
BOTH = [
    "native_web_search",
    "native_code_execution",
    "native_mcp",
    "native_web_fetch",
    "native_text_editor",
    "native_tool_search",
    "native_advisor",
    "native_compaction",
]
CALLS = [*BOTH, "native_code_execution_web_fetch"]
STREAMS = [f"stream_{name}" for name in BOTH]
MODELLED = {"text", "thinking", "redacted_thinking", "tool_use"}
QUESTION = Request([user_message("Look it up.")])

server = ANTHROPIC.server_fixture()


def _content(name: str) -> list[dict[str, Any]]:
    if name.startswith("stream_"):
        events = load_transcript(name)[0]["sse"]
        return [e["content_block"] for e in events if e["type"] == "content_block_start"]
    content: list[dict[str, Any]] = load_transcript(name)[0]["json"]["content"]
    return content


def _streamed(name: str, index: int, delta_type: str, member: str) -> str:
    """What the deltas of one type bring a streamed block, joined."""
    events = load_transcript(name)[0]["sse"]
    return "".join(
        e["delta"][member]
        for e in events
        if e["type"] == "content_block_delta"
        and e["index"] == index
        and e["delta"]["type"] == delta_type
    )


def _streamed_block(name: str, index: int, block: dict[str, Any]) -> dict[str, Any]:
    """A streamed block whole: a server_tool_use starts with input {}, its input arriving
    in input_json_delta fragments; a compaction block starts with content null, its
    summary arriving in compaction_delta events."""
    fragments = _streamed(name, index, "input_json_delta", "partial_json")
    if fragments.strip():
        block = {**block, "input": orjson.loads(fragments)}
    if block["type"] == "compaction":
        summary = _streamed(name, index, "compaction_delta", "content")
        assert summary  # the recording streams its summary
        block = {**block, "content": summary}
    return block


async def _answer(name: str, server: Any) -> Message:
    server.script(load_transcript(name)[0])
    model, _ = ANTHROPIC.recorded(server)
    async with model:
        if name.startswith("stream_"):
            _, response = await accumulate(model.stream(QUESTION))
        else:
            response = await model.call(QUESTION)
    assert response.output is not None and response.output.message is not None
    return response.output.message


def _opaque(block: dict[str, Any]) -> list[str]:
    """Strings of a block that are the provider's: ids and encrypted contents."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                opaque = key in ("id", "tool_use_id", "encrypted_content", "encrypted_index")
                if opaque and isinstance(item, str) and len(item) > 8:
                    found.append(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(block)
    return found


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
async def test_native_blocks_decode_in_place(name: str, server: Any) -> None:
    message = await _answer(name, server)
    content = _content(name)
    expected = [
        (index, block) for index, block in enumerate(content) if block["type"] not in MODELLED
    ]
    natives = [part.native for part in message.parts if part.kind is PartKind.NATIVE]
    assert expected and len(natives) == len(expected)
    for native, (index, block) in zip(natives, expected, strict=True):
        assert native is not None and native.provider == API and native.type == block["type"]
        if name.startswith("stream_"):
            block = _streamed_block(name, index, block)
        assert native.data == RawJSON.from_value(block)
    # Order: the native parts stand where their blocks stood among the tool blocks.
    order = [block["type"] for block in content if block["type"] not in ("text", "thinking")]
    kept = [
        part.native.type if part.native is not None else "tool_use"
        for part in message.parts
        if part.kind in (PartKind.NATIVE, PartKind.TOOL_CALL)
    ]
    assert kept == order


@pytest.mark.parametrize("name", ["native_web_search", "stream_native_web_search"])
async def test_cited_text_keeps_its_citations(name: str, server: Any) -> None:
    content = _content(name)
    if name.startswith("stream_"):
        events = load_transcript(name)[0]["sse"]
        recorded = [
            e["delta"]["citation"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta"
        ]
    else:
        recorded = [c for block in content for c in block.get("citations") or []]
    server.script(load_transcript(name)[0], load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = ANTHROPIC.recorded(server)
    async with model:
        middleware = Middleware(store, store, "c1")
        if name.startswith("stream_"):
            _, first = await accumulate(wrap_stream(model, middleware.stream).stream(QUESTION))
        else:
            first = await wrap(model, middleware.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        message = first.output.message
        cited = [part for part in message.parts if CITATIONS_KEY in part.metadata]
        assert cited
        kept = [c for part in cited for c in part.metadata[CITATIONS_KEY].value()]
        assert kept == recorded
        assert message.text  # the cited text is text
        stored = await store.read("c1")
        assert stored[-1].parts == message.parts
        await wrap(model, middleware.call).call(Request([user_message("And then?")]))
    # The next request to the same model carries each cited text block's citations as
    # recorded, on its text (another model gets none: see below).
    sent = server.requests[-1].body["messages"][1]["content"]
    back = [
        (block["text"], block["citations"])
        for block in sent
        if block["type"] == "text" and block.get("citations")
    ]
    assert back == [(part.text, part.metadata[CITATIONS_KEY].value()) for part in cited]


@pytest.mark.parametrize("name", ["native_code_execution", "stream_native_code_execution"])
async def test_the_container_is_kept_and_named_next_time(name: str, server: Any) -> None:
    # By call it is a member of the message; by stream it comes in message_delta, after
    # the last block (a chunk of message metadata without a part).
    recorded = load_transcript(name)[0]
    if "sse" in recorded:
        (late,) = [e for e in recorded["sse"] if e["type"] == "message_delta"]
        container = late["delta"]["container"]
    else:
        container = recorded["json"]["container"]
    assert container["id"].startswith("container_")
    server.script(recorded, load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = ANTHROPIC.recorded(server)
    async with model:
        middleware = Middleware(store, store, "c1")
        if "sse" in recorded:
            _, first = await accumulate(wrap_stream(model, middleware.stream).stream(QUESTION))
        else:
            first = await wrap(model, middleware.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        assert first.output.message.metadata[CONTAINER_KEY].value() == container
        stored = await store.read("c1")
        assert stored[-1].parts == first.output.message.parts
        assert stored[-1].metadata[CONTAINER_KEY] == first.output.message.metadata[CONTAINER_KEY]
        await wrap(model, middleware.call).call(Request([user_message("And again?")]))
    body = server.requests[-1].body
    assert body["container"] == container["id"]


@pytest.mark.parametrize("name", ["native_tool_search", "stream_native_tool_search"])
async def test_a_tool_use_caller_is_kept_and_goes_back_to_its_own_model(
    name: str, server: Any
) -> None:
    content = _content(name)
    (index,) = [i for i, block in enumerate(content) if block["type"] == "tool_use"]
    recorded = content[index]
    if name.startswith("stream_"):
        recorded = {
            **recorded,
            "input": orjson.loads(_streamed(name, index, "input_json_delta", "partial_json")),
        }
    assert recorded["caller"] == {"type": "direct"}
    server.script(load_transcript(name)[0], load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = ANTHROPIC.recorded(server)
    async with model:
        middleware = Middleware(store, store, "c1")
        if name.startswith("stream_"):
            _, first = await accumulate(wrap_stream(model, middleware.stream).stream(QUESTION))
        else:
            first = await wrap(model, middleware.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        answer = first.output.message
        (call,) = [p for p in answer.parts if p.kind is PartKind.TOOL_CALL]
        assert call.metadata[CALLER_KEY] == RawJSON.from_value(recorded["caller"])
        # A tool-call answer leaves the turn open: the host resubmits it with the result.
        assert call.tool_call is not None
        answered = ToolResult(call.tool_call.id, call.tool_call.name, ToolOutput.of_text("0.92"))
        turn = Request([*QUESTION.messages, answer, tool_message(answered)])
        await wrap(model, middleware.call).call(turn)
        stored = await store.read("c1")
        assert stored[1].parts == answer.parts
    sent = server.requests[-1].body["messages"][1]["content"]
    # In its place among the blocks, the caller as recorded.
    assert [block["type"] for block in sent] == [block["type"] for block in content]
    assert sent[index] == recorded


def test_a_container_without_content_is_kept_in_the_output() -> None:
    body = load_transcript("native_code_execution")[0]["json"]
    empty = parse_message(orjson.dumps({**body, "content": []}))
    assert empty.output is not None and empty.output.message is None
    assert empty.output.message_metadata[CONTAINER_KEY].value() == body["container"]


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
async def test_native_blocks_are_stored_and_go_back_in_order_to_their_own_model(
    name: str, server: Any
) -> None:
    server.script(load_transcript(name)[0], load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = ANTHROPIC.recorded(server)
    async with model:
        middleware = Middleware(store, store, "c1")
        if name.startswith("stream_"):
            _, first = await accumulate(wrap_stream(model, middleware.stream).stream(QUESTION))
        else:
            first = await wrap(model, middleware.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        answer = first.output.message
        calls = [part.tool_call for part in answer.parts if part.tool_call is not None]
        if calls:
            # A tool-call answer leaves the turn open: the host resubmits it with the results.
            results = [ToolResult(c.id, c.name, ToolOutput.of_text("0.92")) for c in calls]
            turn = Request([*QUESTION.messages, answer, tool_message(*results)])
            await wrap(model, middleware.call).call(turn)
        else:
            await wrap(model, middleware.call).call(Request([user_message("And then?")]))
        stored = await store.read("c1")
        assert stored[1].parts == answer.parts  # read back equal
    sent = server.requests[-1].body["messages"][1]
    assert sent["role"] == "assistant"
    natives = [part.native for part in answer.parts if part.kind is PartKind.NATIVE]
    blocks = [block for block in sent["content"] if block["type"] not in MODELLED]
    assert [RawJSON.from_value(block) for block in blocks] == [
        native.data for native in natives if native is not None
    ]


@pytest.mark.parametrize("name", [*CALLS, *STREAMS])
@pytest.mark.parametrize(
    ("other", "model"),
    [(API, "claude-other"), (_responses_wire.API, "gpt-x"), (_gemini_wire.API, "gemini-x")],
)
async def test_native_blocks_never_reach_another_model(
    name: str, other: str, model: str, server: Any
) -> None:
    answer = await _answer(name, server)
    request = Request([*QUESTION.messages, answer, user_message("And then?")])
    sent, replay = sent_to(other, model, request)
    for block in _content(name):
        # A tool_use is a tool call, its id the call's wherever the call goes; what the
        # block carries besides (its caller) is Anthropic's.
        if block["type"] not in MODELLED:
            for opaque in _opaque(block):
                assert opaque.encode() not in sent, opaque
    assert b'"caller"' not in sent
    citations = [part for part in answer.parts if CITATIONS_KEY in part.metadata]
    for part in citations:
        for citation in part.metadata[CITATIONS_KEY].value():
            assert citation.get("encrypted_index", "-").encode() not in sent
    assert b"container_" not in sent
    natives = [part for part in answer.parts if part.kind is PartKind.NATIVE]
    assert len([why for why in replay.left_out if "native item" in why]) == len(natives)
