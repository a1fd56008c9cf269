"""Provider-native items over the OpenAI Responses API (DESIGN §6k), on real recordings.

Each transcript (tests/responses_transcripts/native_*.json, provenance in its
description) is one recorded answer by call and by stream: built-in web search, a
remote MCP server (``mcp_list_tools``, ``mcp_call``), built-in file search, the code
interpreter, hosted tool search (``tool_search_call``, ``tool_search_output``),
server-side compaction, the hosted shell (``shell_call``, ``shell_call_output`` run in
the API's container) and image generation, with the encrypted reasoning bound to them.
For each: both give the same message, every item the adapter does not model is a native
part holding the item as recorded, in its place; the message is stored and read back
equal; the next request to the same model carries every item back in order (the
loopback server validates it with the official ``openai`` package's request types), or,
for a compaction item, starts at it; a request to another model carries none of their
opaque strings."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from scope.chat import (
    FinishReason,
    Message,
    PartKind,
    Request,
    Role,
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
from scope.models import _anthropic_wire, _gemini_wire
from scope.models._responses_wire import API
from tests.helpers import RESPONSES, accumulate, sent_to
from tests.responses_server import load_transcript

pytestmark = pytest.mark.anyio

#: Recorded by call and by stream (one answer each).
NATIVE = [
    "native_web_search",
    "native_mcp",
    "native_file_search",
    "native_code_interpreter",
    "native_tool_search",
    "native_compaction",
    "native_hosted_shell",
    "native_image_generation",
]
#: Every recording sent back: the streamed web search's ``action.sources`` name a source
#: of type ``api`` that the ``openai`` package's request types (which the loopback
#: server checks bodies with) do not know, so its call-only sibling stands in for it.
SENT_BACK = [
    "native_web_search_call",
    "native_mcp",
    "native_file_search",
    "native_annotations",
    "native_code_interpreter",
    "native_code_interpreter_call",
    "native_tool_search",
    "native_tool_search_call",
    "native_image_generation_call",
    "native_hosted_shell",
    "native_hosted_shell_call",
    "native_image_generation",
]
QUESTION = Request([user_message("Look it up.")])
MODELLED = {"message", "reasoning", "function_call"}

server = RESPONSES.server_fixture()


def _holds_something(item: dict[str, Any]) -> bool:
    """False for an item that holds nothing to keep: a message item whose texts are
    empty, a reasoning item with neither summary text nor ``encrypted_content`` (one
    recorded without ``include: ["reasoning.encrypted_content"]``, which scope asks for)."""
    if item["type"] == "message":
        return any(content.get("text") for content in item["content"])
    if item["type"] == "reasoning":
        summary = any(entry.get("text") for entry in item.get("summary") or ())
        return summary or bool(item.get("encrypted_content"))
    return True


def _output(name: str) -> list[dict[str, Any]]:
    """The recorded answer's output items that hold something to keep."""
    output: list[dict[str, Any]] = load_transcript(name)[0]["json"]["output"]
    return [item for item in output if _holds_something(item)]


def _opaque(item: dict[str, Any]) -> list[str]:
    """The strings of an item that are the provider's state: ids and encrypted content."""
    found = [item["id"]] if "id" in item else []
    if "encrypted_content" in item:
        found.append(item["encrypted_content"])
    return found


def _unsigned(message: Message) -> Message:
    """``message`` with each reasoning signature and compaction ciphertext masked."""
    parts = []
    for part in message.parts:
        if part.kind is PartKind.REASONING:
            part = attrs.evolve(part, signature=b"-")
        elif part.native is not None and part.native.type == "compaction":
            data = RawJSON.from_value({**part.native.data.value(), "encrypted_content": "-"})
            part = attrs.evolve(part, native=attrs.evolve(part.native, data=data))
        parts.append(part)
    return attrs.evolve(message, parts=parts)


async def _answers(name: str, server: Any) -> tuple[Message, Message]:
    call, stream = load_transcript(name)
    server.script(call, stream)
    model, _ = RESPONSES.recorded(server)
    async with model:
        called = await model.call(QUESTION)
        _, streamed = await accumulate(model.stream(QUESTION))
    assert called.output is not None and called.output.message is not None
    assert streamed.output is not None and streamed.output.message is not None
    return called.output.message, streamed.output.message


@pytest.mark.parametrize("name", NATIVE)
async def test_native_items_decode_by_call_and_stream_alike(name: str, server: Any) -> None:
    called, streamed = await _answers(name, server)
    # The recordings' response.completed carries each reasoning and compaction item
    # encrypted anew (its output_item.done event another ciphertext of it): all else is
    # the same answer.
    assert _unsigned(called) == _unsigned(streamed)
    output = _output(name)
    # By stream, each native part is the item of its response.output_item.done event.
    done = [
        event["item"]
        for event in load_transcript(name)[1]["sse"]
        if event["type"] == "response.output_item.done" and event["item"]["type"] not in MODELLED
    ]
    assert [part.native.data for part in streamed.parts if part.native is not None] == [
        RawJSON.from_value(item) for item in done
    ]
    natives = [part.native for part in called.parts if part.kind is PartKind.NATIVE]
    expected = [item for item in output if item["type"] not in MODELLED]
    assert expected  # the recording has items scope does not model
    assert [native.type for native in natives if native is not None] == [
        item["type"] for item in expected
    ]
    for native, item in zip(natives, expected, strict=True):
        assert native is not None and native.provider == API
        assert native.data == RawJSON.from_value(item)
    # In the provider's order: each item is one part, text parts merge per message item.
    kinds = []
    for item in output:
        kind = {"reasoning": "reasoning", "message": "text", "function_call": "tool_call"}.get(
            item["type"], "native"
        )
        if not (kinds and kind == "text" == kinds[-1]):
            kinds.append(kind)
    assert [str(part.kind) for part in called.parts] == kinds


@pytest.mark.parametrize("name", SENT_BACK)
async def test_native_items_are_stored_and_go_back_in_order(name: str, server: Any) -> None:
    call = load_transcript(name)[0]
    follow_up = load_transcript("text")[0]
    server.script(call, follow_up)
    store = InMemoryStore()
    model, _ = RESPONSES.recorded(server)
    async with model:
        history = Middleware(store, store, "c1")
        wrapped = wrap(model, history.call)
        first = await wrapped.call(QUESTION)
        assert first.output is not None and first.output.message is not None
        answer = first.output.message
        calls = [part.tool_call for part in answer.parts if part.tool_call is not None]
        if calls:
            # A tool-call answer leaves the turn open: the host resubmits it with the
            # results (the last item sent is then the function_call_output).
            results = [ToolResult(c.id, c.name, ToolOutput.of_text("0.92")) for c in calls]
            await wrapped.call(Request([*QUESTION.messages, answer, tool_message(*results)]))
        else:
            await wrapped.call(Request([user_message("And then?")]))
        stored = await store.read("c1")
        # Read back equal (the middleware adds its usage and response id stamps).
        assert stored[1].parts == answer.parts
    sent = server.requests[-1].body["input"]
    output = _output(name)
    # The answer's items go back in the order the model gave them, every item the
    # adapter does not model as recorded, the reasoning bound to them included.
    back = sent[1:-1]
    assert [item["type"] for item in back] == [item["type"] for item in output]
    for item, original in zip(back, output, strict=True):
        if original["type"] not in MODELLED:
            assert item == original
        elif original["type"] == "reasoning":
            assert item["encrypted_content"] == original["encrypted_content"]


@pytest.mark.parametrize("streamed", [False, True], ids=["call", "stream"])
async def test_a_hosted_shell_call_is_no_call_for_the_client(streamed: bool, server: Any) -> None:
    # The API ran the commands in its container and answered with their output: a
    # shell_call there is the hosted tool's item, not a tool call (a local one is).
    call, stream = load_transcript("native_hosted_shell")
    server.script(stream if streamed else call)
    model, _ = RESPONSES.recorded(server)
    async with model:
        if streamed:
            _, response = await accumulate(model.stream(QUESTION))
        else:
            response = await model.call(QUESTION)
    assert response.output is not None and response.output.message is not None
    assert response.output.finish_reason is FinishReason.STOP
    natives = [part.native for part in response.output.message.parts if part.native is not None]
    assert [native.type for native in natives] == ["shell_call", "shell_call_output"] * 2
    assert not [p for p in response.output.message.parts if p.kind is PartKind.TOOL_CALL]


@pytest.mark.parametrize("streamed", [False, True], ids=["call", "stream"])
async def test_a_recorded_compaction_item_starts_the_next_window(
    streamed: bool, server: Any
) -> None:
    call, stream = load_transcript("native_compaction")
    server.script(stream if streamed else call, load_transcript("text")[0])
    if streamed:
        (item,) = [
            event["item"]
            for event in stream["sse"]
            if event["type"] == "response.output_item.done"
            and event["item"]["type"] == "compaction"
        ]
    else:
        (item,) = [item for item in _output("native_compaction") if item["type"] == "compaction"]
    store = InMemoryStore()
    model, _ = RESPONSES.recorded(server)
    async with model:
        history = Middleware(store, store, "c1")
        if streamed:
            _, first = await accumulate(wrap_stream(model, history.stream).stream(QUESTION))
        else:
            first = await wrap(model, history.call).call(QUESTION)
        assert first.output is not None and first.output.message is not None
        stored = await store.read("c1")
        assert stored[-1].parts == first.output.message.parts
        await wrap(model, history.call).call(Request([user_message("And then?")]))
    # To its own model the item stands for the turns before it, its message included: the
    # window starts at it, byte-exact, then what follows.
    body = server.requests[-1].body["input"]
    assert body[0] == item
    assert body[1:] == [{"type": "message", "role": "user", "content": "And then?"}]


@pytest.mark.parametrize("name", sorted({*NATIVE, *SENT_BACK}))
@pytest.mark.parametrize(
    ("other", "model"),
    [(API, "gpt-5-other"), (_anthropic_wire.API, "claude-x"), (_gemini_wire.API, "gemini-x")],
)
async def test_native_items_never_reach_another_model(
    name: str, other: str, model: str, server: Any
) -> None:
    server.script(load_transcript(name)[0])
    adapter, _ = RESPONSES.recorded(server)
    async with adapter:
        answer = await adapter.call(QUESTION)
    assert answer.output is not None and answer.output.message is not None
    assert answer.output.message.role is Role.ASSISTANT
    request = Request([*QUESTION.messages, answer.output.message, user_message("And then?")])
    sent, replay = sent_to(other, model, request)
    natives = [item for item in _output(name) if item["type"] not in MODELLED]
    for item in natives:
        for opaque in _opaque(item):
            assert opaque.encode() not in sent
    reasoning = [item for item in _output(name) if item["type"] == "reasoning"]
    for item in reasoning:
        assert item["encrypted_content"].encode() not in sent
    assert len([why for why in replay.left_out if "native item" in why]) == len(natives)
