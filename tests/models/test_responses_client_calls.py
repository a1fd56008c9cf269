"""Items the client answers, over the OpenAI Responses API (DESIGN §6k).

``custom_tool_call``, ``mcp_approval_request``, ``local_shell_call``, ``shell_call``,
``apply_patch_call`` and ``computer_call`` are tool calls: decoded by call and by stream
alike (the item kept verbatim in metadata ``openai/item``); to the same model the call
goes back as the item it came as and the tool message answering it as the matching
output item (the loopback server validates both with the official ``openai`` package's
request types); to another model as a plain ``function_call`` and its output. An answer
made only of such a call is one turn the history Middleware stores.

The items are shaped as the API reference and the package's types give them; their ids
and contents are invented (INVENTED), since no public recording of them was found."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Options,
    PartKind,
    Request,
    ToolOutput,
    ToolResult,
    media_part,
    tool_message,
    user_message,
    wrap,
)
from scope.conversation import Conversation
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.media import Media
from scope.models._provenance import Replay
from scope.models._responses_wire import (
    API,
    ITEM_KEY,
    PROVIDER,
    EventMapper,
    build_body,
    parse_response,
)
from scope.models._responses_wire import (
    FREEFORM_KEY as WIRE_FREEFORM_KEY,
)
from scope.tools import FREEFORM_KEY, tool
from tests.helpers import RESPONSES, merged
from tests.responses_server import load_transcript

pytestmark = pytest.mark.anyio

# INVENTED ids and contents; shapes per the API reference.
ITEMS: dict[str, dict[str, Any]] = {
    "custom_tool_call": {
        "type": "custom_tool_call",
        "id": "ctc_01",
        "call_id": "call_custom_01",
        "name": "code_exec",
        "input": 'print("hello")',
        "status": "completed",
    },
    "mcp_approval_request": {
        "type": "mcp_approval_request",
        "id": "mcpr_01",
        "name": "ask_question",
        "arguments": '{"repoName": "openai/codex", "question": "What is it?"}',
        "server_label": "deepwiki",
    },
    "local_shell_call": {
        "type": "local_shell_call",
        "id": "lsh_01",
        "call_id": "call_local_01",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls", "-la"], "env": {}, "timeout_ms": 2500},
    },
    "shell_call": {
        "type": "shell_call",
        "id": "sh_01",
        "call_id": "call_shell_01",
        "status": "completed",
        "action": {"commands": ["ls"], "timeout_ms": 2500, "max_output_length": 4096},
    },
    "apply_patch_call": {
        "type": "apply_patch_call",
        "id": "apc_01",
        "call_id": "call_patch_01",
        "status": "completed",
        "operation": {"type": "update_file", "path": "app.py", "diff": "@@\n-a\n+b\n"},
    },
    "computer_call": {
        "type": "computer_call",
        "id": "cu_01",
        "call_id": "call_computer_01",
        "status": "completed",
        "action": {"type": "click", "button": "left", "x": 10, "y": 20},
        "pending_safety_checks": [],
    },
}
#: (call id, tool name, arguments) each item becomes.
CALLS: dict[str, tuple[str, str, str]] = {
    "custom_tool_call": ("call_custom_01", "code_exec", 'print("hello")'),
    "mcp_approval_request": (
        "mcpr_01",
        "ask_question",
        '{"repoName": "openai/codex", "question": "What is it?"}',
    ),
    "local_shell_call": (
        "call_local_01",
        "local_shell",
        '{"command":["ls","-la"],"env":{},"timeout_ms":2500,"type":"exec"}',
    ),
    "shell_call": (
        "call_shell_01",
        "shell",
        '{"commands":["ls"],"max_output_length":4096,"timeout_ms":2500}',
    ),
    "apply_patch_call": (
        "call_patch_01",
        "apply_patch",
        '{"diff":"@@\\n-a\\n+b\\n","path":"app.py","type":"update_file"}',
    ),
    "computer_call": (
        "call_computer_01",
        "computer",
        '{"button":"left","type":"click","x":10,"y":20}',
    ),
}
#: The output item type answering each.
ANSWERS = {
    "custom_tool_call": "custom_tool_call_output",
    "mcp_approval_request": "mcp_approval_response",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
}
SCREENSHOT = Media.from_bytes("image/png", b"\x89PNG\r\n\x1a\n")  # INVENTED
QUESTION = Request([user_message("Go ahead.")])

server = RESPONSES.server_fixture()


def _body(item: dict[str, Any]) -> dict[str, Any]:
    answer = load_transcript("text")[0]["json"]
    return {**answer, "id": "resp_client_01", "output": [item]}


def _result(item_type: str) -> ToolResult:
    call_id, name, _ = CALLS[item_type]
    if item_type == "computer_call":
        return ToolResult(call_id, name, ToolOutput((media_part(SCREENSHOT),)))
    return ToolResult(call_id, name, ToolOutput.of_text("done"))


@pytest.mark.parametrize("item_type", list(ITEMS))
def test_a_client_answered_item_is_a_tool_call_by_call_and_by_stream(item_type: str) -> None:
    item = ITEMS[item_type]
    called = parse_response(orjson.dumps(_body(item)))
    mapper = EventMapper()
    chunks = [
        mapper.map("", orjson.dumps({"type": "response.output_item.added", "item": item})),
        mapper.map("", orjson.dumps({"type": "response.output_item.done", "item": item})),
        mapper.map("", orjson.dumps({"type": "response.completed", "response": _body(item)})),
    ]
    streamed = merged(chunk for chunk in chunks if chunk is not None)
    for response in (called, streamed):
        assert response.output is not None and response.output.message is not None
        assert response.output.finish_reason is FinishReason.TOOL_CALLS
        (part,) = response.output.message.parts
        assert part.kind is PartKind.TOOL_CALL and part.tool_call is not None
        call = part.tool_call
        assert (call.id, call.name, call.arguments) == CALLS[item_type]
        assert part.metadata[ITEM_KEY].value() == item
    assert called.output is not None and streamed.output is not None
    assert called.output.message == streamed.output.message


@pytest.mark.parametrize("item_type", list(ITEMS))
async def test_the_call_and_its_answer_go_back_as_the_items(item_type: str, server: Any) -> None:
    item = ITEMS[item_type]
    server.script({"status": 200, "json": _body(item)}, load_transcript("text")[0])
    store = InMemoryStore()
    model, _ = RESPONSES.recorded(server)
    async with model:
        history = wrap(model, Middleware(store, store, "c1").call)
        first = await history.call(QUESTION)
        assert first.output is not None and first.output.message is not None
        result = _result(item_type)
        await history.call(
            Request([*QUESTION.messages, first.output.message, tool_message(result)])
        )
        # An answer made only of the call, its answer and the final text: one turn.
        stored = await store.read("c1")
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[1].parts == first.output.message.parts
    sent = server.requests[-1].body["input"]
    # As received, less what the API documents as output only (a custom call's status).
    assert sent[1] == {
        k: v for k, v in item.items() if (item_type, k) != ("custom_tool_call", "status")
    }
    answer = sent[2]
    assert answer["type"] == ANSWERS[item_type]
    if item_type == "mcp_approval_request":
        assert answer == {
            "type": "mcp_approval_response",
            "approval_request_id": "mcpr_01",
            "approve": True,
        }
    elif item_type == "local_shell_call":
        assert answer == {"type": "local_shell_call_output", "id": "lsh_01", "output": "done"}
    elif item_type == "computer_call":
        assert answer["output"]["type"] == "computer_screenshot"
        assert answer["output"]["image_url"].startswith("data:image/png;base64,")
    else:
        assert answer["call_id"] == CALLS[item_type][0]


@pytest.mark.parametrize(
    ("item_type", "expected"),
    [
        (
            "mcp_approval_request",
            {
                "type": "mcp_approval_response",
                "approval_request_id": "mcpr_01",
                "approve": False,
                "reason": "not this repo",
            },
        ),
        (
            "apply_patch_call",
            {
                "type": "apply_patch_call_output",
                "call_id": "call_patch_01",
                "status": "failed",
                "output": "not this repo",
            },
        ),
        (
            "shell_call",
            {
                "type": "shell_call_output",
                "call_id": "call_shell_01",
                "output": [
                    {
                        "stdout": "not this repo",
                        "stderr": "",
                        "outcome": {"type": "exit", "exit_code": 1},
                    }
                ],
            },
        ),
    ],
)
def test_an_error_result_denies_fails_or_exits_non_zero(
    item_type: str, expected: dict[str, Any]
) -> None:
    answer = parse_response(orjson.dumps(_body(ITEMS[item_type])))
    assert answer.output is not None and answer.output.message is not None
    call_id, name, _ = CALLS[item_type]
    denial = ToolResult(call_id, name, ToolOutput.of_text("not this repo"), is_error=True)
    message = Replay(API, PROVIDER, "gpt-5-mini").stamp(answer.output.message, "gpt-5-mini")
    request = Request([*QUESTION.messages, message, tool_message(denial)])
    body = build_body(request, default_options=Options(), model="gpt-5-mini", stream=False)
    assert orjson.loads(orjson.dumps(body))["input"][2] == expected


@pytest.mark.parametrize("item_type", list(ITEMS))
def test_another_model_gets_a_plain_function_call(item_type: str) -> None:
    answer = parse_response(orjson.dumps(_body(ITEMS[item_type])))
    assert answer.output is not None and answer.output.message is not None
    message = Replay(API, PROVIDER, "gpt-5-mini").stamp(answer.output.message, "gpt-5-mini")
    request = Request([*QUESTION.messages, message, tool_message(_result(item_type))])
    if item_type == "computer_call":
        return  # a screenshot result goes to another model as input_image content
    body = orjson.loads(
        orjson.dumps(
            build_body(request, default_options=Options(), model="gpt-other", stream=False)
        )
    )
    call_id, name, arguments = CALLS[item_type]
    assert body["input"][1] == {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    assert body["input"][2] == {
        "type": "function_call_output",
        "call_id": call_id,
        "output": "done",
    }
    if item_type != "mcp_approval_request":  # whose call id is the item's id
        assert ITEMS[item_type]["id"].encode() not in orjson.dumps(body)


# INVENTED id and image; the shape per the API reference (an image generation's output
# item carries the image as base64 in ``result``).
IMAGE = {
    "type": "image_generation_call",
    "id": "ig_01",
    "status": "completed",
    "result": "iVBORw0KGgo=",
}


async def test_an_image_only_answer_is_one_stored_turn(server: Any) -> None:
    server.script({"status": 200, "json": _body(IMAGE)}, {"status": 200, "json": _body(IMAGE)})
    model, _ = RESPONSES.recorded(server)
    async with model:
        store = InMemoryStore()
        history = wrap(model, Middleware(store, store, "c1").call)
        answer = await history.call(Request([user_message("Draw a cat.")]))
        assert answer.output is not None and answer.output.finish_reason is FinishReason.STOP
        stored = await store.read("c1")
        assert [m.role for m in stored] == ["user", "assistant"]
        (part,) = stored[1].parts
        assert part.native is not None and part.native.type == "image_generation_call"
        # And by a Conversation: the turn is stored, its text empty.
        conversation = Conversation(model, InMemoryStore(), "c2")
        result = await conversation.ask("Draw a dog.")
        assert result.output == "" and result.steps == 1
        assert [m.role for m in result.messages] == ["user", "assistant"]
        assert result.messages[1].parts[0].native is not None


@pytest.mark.parametrize("item_type", ["shell_call", "mcp_approval_request"])
async def test_a_conversation_runs_a_client_answered_call_like_any_tool(
    item_type: str, server: Any
) -> None:
    ran: list[dict[str, Any]] = []

    @tool
    def shell(commands: list[str], timeout_ms: int, max_output_length: int) -> str:
        """Run shell commands."""
        ran.append({"commands": commands})
        return "file.txt"

    @tool
    def ask_question(repoName: str, question: str) -> str:
        """Approve a call of the MCP tool ask_question."""
        ran.append({"repoName": repoName})
        return "approved"

    final = load_transcript("text")[0]
    server.script({"status": 200, "json": _body(ITEMS[item_type])}, final)
    model, _ = RESPONSES.recorded(server)
    async with model:
        conversation = Conversation(model, InMemoryStore(), "c1", tools=[shell, ask_question])
        result = await conversation.ask("Go ahead.")
    assert result.steps == 2 and len(ran) == 1
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    sent = server.requests[-1].body["input"]
    assert sent[1]["type"] == item_type
    assert sent[2]["type"] == ANSWERS[item_type]


async def test_a_freeform_tool_is_a_custom_tool_and_takes_the_text(server: Any) -> None:
    # The model writes the tool's text itself (a custom tool): the function gets the
    # custom_tool_call's input exactly, and the answer goes back as its output item.
    ran: list[str] = []

    @tool(freeform=True)
    def code_exec(code: str) -> str:
        """Run Python code."""
        ran.append(code)
        return "hello"

    final = load_transcript("text")[0]
    server.script({"status": 200, "json": _body(ITEMS["custom_tool_call"])}, final)
    model, _ = RESPONSES.recorded(server)
    async with model:
        conversation = Conversation(model, InMemoryStore(), "c1", tools=[code_exec])
        result = await conversation.ask("Say hello in Python.")
    assert ran == [ITEMS["custom_tool_call"]["input"]]
    assert result.steps == 2
    server.check_requests()  # the openai package's request types accept both bodies
    first, second = (request.body for request in server.requests)
    assert first["tools"] == [
        {"type": "custom", "name": "code_exec", "description": "Run Python code."}
    ]
    assert second["input"][2] == {
        "type": "custom_tool_call_output",
        "call_id": "call_custom_01",
        "output": "hello",
    }
    # The mark is the adapter's, named as scope.tools names it.
    part = result.messages[1].parts[0]
    assert part.metadata[FREEFORM_KEY].value() is True
    assert WIRE_FREEFORM_KEY == FREEFORM_KEY


async def test_a_custom_call_of_a_tool_that_takes_json_is_an_error_result(server: Any) -> None:
    @tool
    def code_exec(code: str) -> str:
        """Run Python code."""
        raise AssertionError("never runs")

    final = load_transcript("text")[0]
    server.script({"status": 200, "json": _body(ITEMS["custom_tool_call"])}, final)
    model, _ = RESPONSES.recorded(server)
    async with model:
        conversation = Conversation(model, InMemoryStore(), "c1", tools=[code_exec])
        result = await conversation.ask("Say hello in Python.")
    (answer,) = result.messages[2].parts
    assert answer.tool_result is not None and answer.tool_result.is_error
    assert "takes JSON arguments" in (answer.tool_result.output.text() or "")
