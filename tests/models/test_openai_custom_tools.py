"""Custom (freeform) tool calls over OpenAI Chat Completions, against the loopback server.

A call whose ``type`` is ``custom`` carries the text the model wrote as its ``input``: its
part is a tool call marked ``scope/freeform`` whose arguments are that text exactly, and
``Conversation`` runs a ``@tool(freeform=True)`` tool with it. To the model that made it
the call goes back as a custom call, its answer as the usual ``tool`` message (the
loopback server validates the body with the official ``openai`` package's request
types); to any other model as a function call, as before. A freeform tool is offered as
a function tool of one string unless the request's ``openai/tools`` extension offers a
custom tool; the stream documents no custom call, and one is refused, not guessed at.

The bodies are shaped as the API reference and the package's types give them
(``ChatCompletionMessageCustomToolCall``, ``ChatCompletionCustomToolParam``); their ids
and inputs are invented (INVENTED), since no public recording of one was found."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scope.chat import (
    Options,
    PartKind,
    Request,
    ToolOutput,
    ToolResult,
    assistant_message,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.conversation import Conversation
from scope.errors import InvalidResponseError
from scope.history.inmemory import InMemoryStore
from scope.models._openai_wire import (
    API,
    EXTRA_CONTENT_KEY,
    FREEFORM_KEY,
    PROVIDER,
    ChunkMapper,
    build_body,
    parse_completion,
)
from scope.models._provenance import Replay, stamp
from scope.models._responses_wire import API as RESPONSES_API
from scope.tools import FREEFORM_KEY as TOOLS_FREEFORM_KEY
from scope.tools import tool
from tests.helpers import OPENAI
from tests.openai_server import check_request_body

pytestmark = pytest.mark.anyio

server = OPENAI.server_fixture()

MODEL = "gpt-5"

# INVENTED: the text is a patch, with quotes, a backslash and newlines: nothing JSON.
PATCH = '*** Begin Patch\n*** Update File: a.py\n-print("hi")\n+print("hi\\n")\n*** End Patch\n'

# INVENTED ids and input; the call's shape is ChatCompletionMessageCustomToolCall's.
CUSTOM_CALL: dict[str, Any] = {
    "id": "call_custom_01",
    "type": "custom",
    "custom": {"name": "apply_patch", "input": PATCH},
}

# The custom tool definition a request offers through the openai/tools extension
# (ChatCompletionCustomToolParam).
CUSTOM_TOOL: dict[str, Any] = {
    "type": "custom",
    "custom": {"name": "apply_patch", "description": "Apply a patch to the files."},
}


def _completion(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    # INVENTED ids; the shape of a chat.completion body.
    return {
        "id": "chatcmpl-custom01",
        "object": "chat.completion",
        "created": 1760000000,
        "model": "gpt-5-2025-08-07",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "tool_calls": list(calls) or None,
                },
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70},
    }


def _exchange(body: dict[str, Any]) -> dict[str, Any]:
    return {"status": 200, "json": body}


def _patcher(ran: list[str]) -> Any:
    @tool(freeform=True)
    def apply_patch(patch: str) -> str:
        """Apply a patch to the files."""
        ran.append(patch)
        return "applied"

    return apply_patch


def test_a_custom_call_is_marked_freeform_and_keeps_its_input_exactly() -> None:
    function_call = {
        "id": "call_function_01",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    response = parse_completion(orjson.dumps(_completion(CUSTOM_CALL, function_call)))
    assert response.output is not None and response.output.message is not None
    custom, function = response.output.message.parts
    assert custom.kind is PartKind.TOOL_CALL and custom.tool_call is not None
    assert custom.tool_call.id == "call_custom_01"
    assert custom.tool_call.name == "apply_patch"
    assert custom.tool_call.arguments == PATCH
    assert custom.metadata[FREEFORM_KEY].value() is True
    assert FREEFORM_KEY == TOOLS_FREEFORM_KEY  # the mark Conversation reads
    # A function call is not freeform.
    assert function.tool_call is not None and function.tool_call.arguments == '{"city": "Paris"}'
    assert FREEFORM_KEY not in function.metadata


def test_a_custom_call_keeps_its_extra_content_beside_the_mark() -> None:
    call = {**CUSTOM_CALL, "extra_content": {"google": {"thought_signature": "c2ln"}}}
    response = parse_completion(orjson.dumps(_completion(call)))
    assert response.output is not None and response.output.message is not None
    (part,) = response.output.message.parts
    assert part.metadata[FREEFORM_KEY].value() is True
    assert part.metadata[EXTRA_CONTENT_KEY].value() == {"google": {"thought_signature": "c2ln"}}


async def test_conversation_runs_a_freeform_tool_with_the_text_and_sends_the_call_back(
    server: Any,
) -> None:
    ran: list[str] = []
    final = _completion(content="Patched.")
    server.script(_exchange(_completion(CUSTOM_CALL)), _exchange(final))
    model, _ = OPENAI.recorded(server, model=MODEL)
    options = Options(extensions={"openai/tools": [CUSTOM_TOOL]})
    async with model:
        conversation = Conversation(
            model, InMemoryStore(), "c1", tools=[_patcher(ran)], options=options
        )
        result = await conversation.ask("Fix the newline.")
    assert ran == [PATCH]  # the function got the text as it is
    assert result.steps == 2
    assert result.messages[-1].text == "Patched."
    server.check_requests()  # the openai package's request types accept both bodies
    first, second = (request.body for request in server.requests)
    assert first["tools"] == [CUSTOM_TOOL]  # the extension's tools, as given
    assistant, answer = second["messages"][1:]
    assert assistant["tool_calls"] == [CUSTOM_CALL]
    assert answer == {"role": "tool", "tool_call_id": "call_custom_01", "content": "applied"}
    part = result.messages[1].parts[0]
    assert part.metadata[FREEFORM_KEY].value() is True


async def test_a_freeform_tool_is_offered_as_a_function_of_one_string(server: Any) -> None:
    # Without the extension: what every compatible server takes, and the text comes
    # as the one property.
    ran: list[str] = []
    arguments = orjson.dumps({"patch": PATCH}).decode()
    function_call = {
        "id": "call_function_01",
        "type": "function",
        "function": {"name": "apply_patch", "arguments": arguments},
    }
    server.script(_exchange(_completion(function_call)), _exchange(_completion(content="Ok.")))
    model, _ = OPENAI.recorded(server, model=MODEL)
    async with model:
        conversation = Conversation(model, InMemoryStore(), "c1", tools=[_patcher(ran)])
        await conversation.ask("Fix the newline.")
    assert ran == [PATCH]
    server.check_requests()
    first, second = (request.body for request in server.requests)
    (offered,) = first["tools"]
    assert offered["type"] == "function"
    assert offered["function"]["name"] == "apply_patch"
    assert offered["function"]["parameters"]["properties"] == {"patch": {"type": "string"}}
    assert second["messages"][1]["tool_calls"] == [function_call]


def _history(api: str, provider: str, model: str) -> Request:
    """A question, an answer of (``api``, ``provider``, ``model``) holding a marked
    custom call, and the tool message answering it."""
    marked = tool_call_part("call_custom_01", "apply_patch", PATCH, {FREEFORM_KEY: True})
    answer = stamp(assistant_message(marked), api, provider, model, asked=model)
    result = tool_message(
        ToolResult("call_custom_01", "apply_patch", ToolOutput.of_text("applied"))
    )
    return Request([user_message("Fix the newline."), answer, result])


def _sent(request: Request, replay: Replay) -> list[dict[str, Any]]:
    body = build_body(request, default_options=Options(), model=MODEL, stream=False, replay=replay)
    decoded: dict[str, Any] = orjson.loads(orjson.dumps(body))
    check_request_body(decoded)
    messages: list[dict[str, Any]] = decoded["messages"]
    return messages


@pytest.mark.parametrize(
    ("api", "provider", "model"),
    [
        (API, PROVIDER, "gpt-4.1"),  # another model
        (API, "vllm", MODEL),  # another provider
        (RESPONSES_API, PROVIDER, MODEL),  # another API: a Responses custom_tool_call
    ],
    ids=["model", "provider", "api"],
)
def test_to_another_model_a_freeform_call_is_a_function_call(
    api: str, provider: str, model: str
) -> None:
    sent = _sent(_history(api, provider, model), Replay(API, PROVIDER))
    assert sent[1]["tool_calls"] == [
        {
            "id": "call_custom_01",
            "type": "function",
            "function": {"name": "apply_patch", "arguments": PATCH},
        }
    ]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_custom_01", "content": "applied"}


def test_to_its_own_model_a_freeform_call_is_a_custom_call() -> None:
    sent = _sent(_history(API, PROVIDER, MODEL), Replay(API, PROVIDER))
    assert sent[1]["tool_calls"] == [CUSTOM_CALL]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_custom_01", "content": "applied"}


@pytest.mark.parametrize(
    "fragment",
    [
        {"index": 0, "id": "call_custom_01", "type": "custom", "custom": {"name": "apply_patch"}},
        {"index": 0, "custom": {"input": "*** Begin"}},
    ],
    ids=["type", "member"],
)
def test_a_streamed_custom_call_is_refused_not_guessed_at(fragment: dict[str, Any]) -> None:
    # The chunk's tool-call delta documents function calls only.
    chunk = {
        "id": "chatcmpl-custom01",
        "object": "chat.completion.chunk",
        "created": 1760000000,
        "model": "gpt-5-2025-08-07",
        "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}],
    }
    with pytest.raises(InvalidResponseError, match="streamed custom tool call"):
        ChunkMapper().map("", orjson.dumps(chunk))
