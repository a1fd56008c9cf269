"""scope.web carrying durable tool approval (``@tool(requires_approval=...)``): the AI
SDK's ``tool-approval-request`` part and AG-UI's interrupt outcome for a turn that
waits, the client's decision read from a request (the AI SDK's ``approval-responded``
tool parts, AG-UI's ``resume`` entries: every rule), and ``ui_turn``/``agui_turn``
taking it (``stream_approve``/``stream_deny``) with the resumed turn streamed and
stored."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Response,
    Role,
    assistant_message,
    tool_call_part,
)
from scope.conversation import Conversation
from scope.errors import ConversationClosedError, InvalidRequestError, NotPendingError
from scope.history import erase
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import tool
from scope.web import (
    ToolApproval,
    UIChatRequest,
    agui_events,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    ui_turn,
)

pytestmark = pytest.mark.anyio


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order.

    :param order: the order id
    """
    return f"refunded {order}"


def _asks(*orders: str) -> Response:
    calls = [
        tool_call_part(f"call-{i}", "refund", orjson.dumps({"order": order}).decode())
        for i, order in enumerate(orders, 1)
    ]
    return Response(Output(assistant_message(*calls), FinishReason.TOOL_CALLS))


def _says(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


def _parts(data: bytes) -> list[Any]:
    events = [e for e in data.split(b"\n\n") if e]
    return [e[6:].decode() if e == b"data: [DONE]" else orjson.loads(e[6:]) for e in events]


async def _encoded(stream: AsyncIterator[bytes]) -> list[Any]:
    return _parts(b"".join([data async for data in stream]))


USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Refund o7"}]}


def _tool_part(call_id: str = "call-1", **approval: Any) -> dict[str, Any]:
    return {
        "type": "tool-refund",
        "toolCallId": call_id,
        "state": "approval-responded",
        "input": {"order": "o7"},
        "approval": {"id": call_id, "approved": True, **approval},
    }


def _call(call_id: str = "call-1", order: str = "o7") -> dict[str, Any]:
    """The decided call, sent again before its result (a resumed stream's reader has
    only this stream)."""
    return {
        "type": "tool-input-available",
        "toolCallId": call_id,
        "toolName": "refund",
        "input": {"order": order},
    }


def _answer(*parts: Any) -> dict[str, Any]:
    """The body the AI SDK chat posts after addToolApprovalResponse."""
    assistant = {"id": "a1", "role": "assistant", "parts": [{"type": "step-start"}, *parts]}
    return {
        "id": "chat-1",
        "trigger": "submit-message",
        "messageId": "a1",
        "messages": [copy.deepcopy(USER), assistant],
    }


def _submit() -> UIChatRequest:
    return chat_request_from_ui({"id": "chat-1", "messages": [copy.deepcopy(USER)]})


def _conversation(store: InMemoryStore, *answers: Response) -> Conversation:
    return Conversation(ScriptedModel(*answers), store, "chat-1", tools=[refund])


# ------------------------------------------------------------------ the encoders


async def test_a_waiting_turn_ends_with_a_tool_approval_request_part() -> None:
    store = InMemoryStore()
    conversation = _conversation(store, _asks("o7"))
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, _submit())))
    assert [p if isinstance(p, str) else p["type"] for p in parts][-5:] == [
        "tool-input-available",
        "finish-step",
        "tool-approval-request",
        "finish",
        "[DONE]",
    ]
    # The shape both ai 6 and ai 7 accept (their uiMessageChunkSchema): the approval's
    # id is the call's.
    assert parts[-3] == {
        "type": "tool-approval-request",
        "approvalId": "call-1",
        "toolCallId": "call-1",
    }
    assert parts[-2] == {"type": "finish", "finishReason": "tool-calls"}


async def test_every_waiting_call_gets_its_request_after_the_calls_that_ran() -> None:
    @tool
    def lookup(order: str) -> str:
        """Look an order up.

        :param order: the order id
        """
        return f"{order}: paid"

    both = assistant_message(
        tool_call_part("call-1", "refund", '{"order": "o7"}'),
        tool_call_part("call-2", "lookup", '{"order": "o7"}'),
        tool_call_part("call-3", "refund", '{"order": "o8"}'),
    )
    conversation = Conversation(
        ScriptedModel(Response(Output(both, FinishReason.TOOL_CALLS))),
        InMemoryStore(),
        "chat-1",
        tools=[refund, lookup],
    )
    parts = await _encoded(ui_message_stream(conversation.stream("Refund o7 and o8")))
    tail = [p for p in parts if isinstance(p, dict)][-4:]
    assert tail == [
        {"type": "tool-output-available", "toolCallId": "call-2", "output": "o7: paid"},
        {"type": "tool-approval-request", "approvalId": "call-1", "toolCallId": "call-1"},
        {"type": "tool-approval-request", "approvalId": "call-3", "toolCallId": "call-3"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]


async def test_agui_ends_a_waiting_run_with_an_interrupt_outcome() -> None:
    conversation = _conversation(InMemoryStore(), _asks("o7"))
    stream = agui_events(conversation.stream("Refund o7"), thread_id="t", run_id="r")
    events = await _encoded(stream)
    assert events[-1] == {
        "type": "RUN_FINISHED",
        "threadId": "t",
        "runId": "r",
        "outcome": {
            "type": "interrupt",
            "interrupts": [
                {
                    "id": "call-1",
                    "reason": "tool_approval",
                    "message": "approve the call of refund?",
                    "toolCallId": "call-1",
                }
            ],
        },
    }


async def test_a_finished_turn_asks_for_nothing() -> None:
    conversation = _conversation(InMemoryStore(), _says("Hi."), _says("Hi again."))
    parts = await _encoded(ui_message_stream(conversation.stream("Hello")))
    assert all(p == "[DONE]" or p["type"] != "tool-approval-request" for p in parts)
    events = await _encoded(agui_events(conversation.stream("Again"), thread_id="t", run_id="r"))
    assert events[-1] == {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}


# ------------------------------------------------------------ reading the decision


def test_chat_request_from_ui_reads_the_decisions() -> None:
    body = _answer(
        _tool_part("call-1"),
        {"type": "text", "text": "between"},
        _tool_part("call-3", approved=False, reason="too much"),
        {**_tool_part("call-9"), "state": "output-available"},  # decided before: skipped
        {**_tool_part("call-4", approved=False, reason=""), "type": "dynamic-tool"},
    )
    request = chat_request_from_ui(orjson.dumps(body))
    assert request.approvals == (
        ToolApproval("call-1", True),
        ToolApproval("call-3", False, "too much"),
        ToolApproval("call-4", False, None),
    )
    assert request.chat_id == "chat-1"
    assert request.message.role is Role.USER and request.message.text == "Refund o7"
    assert request.client_message_id == "u1"
    assert request.message_id == "a1"
    assert request.trigger == "submit-message"


def test_a_request_without_decisions_has_none() -> None:
    assert _submit().approvals == ()


def _with(change: Any) -> dict[str, Any]:
    body = _answer(_tool_part())
    change(body)
    return body


def _part(body: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = body["messages"][-1]["parts"][1]
    return part


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda b: b.update(trigger="regenerate-message"),
            r"messages\[1\]\.role is 'assistant' and the trigger is 'regenerate-message'",
        ),
        (
            lambda b: b["messages"][-1].update(parts=[{"type": "text", "text": "hi"}]),
            r"messages\[1\]\.role is 'assistant' and it answers no tool approval",
        ),
        (
            lambda b: b["messages"][-1].update(parts="x"),
            r"messages\[1\]\.parts must be an array",
        ),
        (
            lambda b: b["messages"][-1]["parts"].append(3),
            r"messages\[1\]\.parts\[2\] must be an object, got a number",
        ),
        (
            lambda b: _part(b).pop("toolCallId"),
            r"messages\[1\]\.parts\[1\] answers an approval but has no toolCallId",
        ),
        (
            lambda b: _part(b).update(toolCallId=7),
            r"messages\[1\]\.parts\[1\]\.toolCallId must be a string",
        ),
        (
            lambda b: _part(b).update(toolCallId=" c"),
            r"messages\[1\]\.parts\[1\]\.toolCallId",
        ),
        (
            lambda b: _part(b).update(approval=None),
            r"messages\[1\]\.parts\[1\]\.approval must be an object, got null",
        ),
        (
            lambda b: _part(b)["approval"].update(id="other"),
            r"messages\[1\]\.parts\[1\]\.approval\.id is 'other', not the approval asked for",
        ),
        (
            lambda b: _part(b)["approval"].pop("approved"),
            r"messages\[1\]\.parts\[1\]\.approval\.approved must be a boolean, got null",
        ),
        (
            lambda b: _part(b)["approval"].update(approved="yes"),
            r"messages\[1\]\.parts\[1\]\.approval\.approved must be a boolean, got a string",
        ),
        (
            lambda b: _part(b)["approval"].update(reason=1),
            r"messages\[1\]\.parts\[1\]\.approval\.reason must be a string or null",
        ),
        (
            lambda b: b["messages"][-1]["parts"].append(copy.deepcopy(_part(b))),
            r"messages\[1\]\.parts\[2\]: call 'call-1' is decided twice",
        ),
        (
            lambda b: b["messages"].pop(0),
            r"messages\[0\] answers tool approvals, but no user message comes before it",
        ),
        (
            lambda b: b["messages"][0].update(parts=[]),
            r"messages\[0\] has no text or file part",
        ),
        (
            lambda b: b["messages"][0].update(id=""),
            r"messages\[0\]\.id",
        ),
        (lambda b: b.update(messageId=5), "messageId must be a string"),
        (lambda b: b.pop("id"), "the request body has no id"),
    ],
)
def test_a_bad_decision_is_an_invalid_request(change: Any, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        chat_request_from_ui(_with(change))


# ------------------------------------------------------------- ui_turn decides


async def _wait(store: InMemoryStore, *answers: Response) -> None:
    conversation = _conversation(store, _asks("o7"), *answers)
    await _encoded(ui_message_stream(await ui_turn(conversation, _submit())))
    assert [call.id for call in await conversation.pending()] == ["call-1"]


async def test_ui_turn_approves_and_streams_the_resumed_turn() -> None:
    store = InMemoryStore()
    await _wait(store)
    conversation = _conversation(store, _says("Refunded o7."))
    request = chat_request_from_ui(_answer(_tool_part()))
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, request)))
    assert parts[:3] == [
        {"type": "start"},
        _call(),
        {"type": "tool-output-available", "toolCallId": "call-1", "output": "refunded o7"},
    ]
    text = "".join(p["delta"] for p in parts if p != "[DONE]" and p["type"] == "text-delta")
    assert text == "Refunded o7."
    assert parts[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
    assert await conversation.pending() == ()
    history = await store.read("chat-1")
    assert [(m.role, m.text) for m in history] == [
        (Role.USER, "Refund o7"),
        (Role.ASSISTANT, ""),
        (Role.TOOL, ""),
        (Role.ASSISTANT, "Refunded o7."),
    ]
    assert history[2].tool_results[0].output.text() == "refunded o7"
    assert not history[2].tool_results[0].is_error


@pytest.mark.parametrize(
    ("reason", "told"), [("not today", "not today"), (None, "denied by the user")]
)
async def test_ui_turn_denies_with_the_clients_reason(reason: str | None, told: str) -> None:
    store = InMemoryStore()
    await _wait(store)
    conversation = _conversation(store, _says("I did not refund o7."))
    approval = {"approved": False} if reason is None else {"approved": False, "reason": reason}
    request = chat_request_from_ui(_answer(_tool_part(**approval)))
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, request)))
    # A denial, not a failure: the AI SDK's tool-output-denied (the model is told why).
    assert parts[1:3] == [_call(), {"type": "tool-output-denied", "toolCallId": "call-1"}]
    history = await store.read("chat-1")
    assert [(m.role, m.text) for m in history][-1] == (Role.ASSISTANT, "I did not refund o7.")
    result = history[2].tool_results[0]
    assert result.is_error and result.output.text() == f"the call was denied: {told}"
    assert history[2].parts[0].metadata.decode("scope/denied") == told
    # The user's message sent again replays the stored turn: the denial reads as one.
    again = await _encoded(ui_message_stream(await ui_turn(conversation, _submit())))
    results = [p for p in again if isinstance(p, dict) and p["type"].startswith("tool-output")]
    assert results == [{"type": "tool-output-denied", "toolCallId": "call-1"}]


async def test_ui_turn_takes_several_decisions_in_order() -> None:
    store = InMemoryStore()
    first = _conversation(store, _asks("o7", "o8"))
    await _encoded(ui_message_stream(await ui_turn(first, _submit())))
    assert [c.id for c in await first.pending()] == ["call-1", "call-2"]
    conversation = _conversation(store, _says("One of two."))
    request = chat_request_from_ui(
        _answer(_tool_part("call-1"), _tool_part("call-2", approved=False, reason="no"))
    )
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, request)))
    dicts = [p for p in parts if isinstance(p, dict)]
    assert dicts[1:5] == [
        _call(),
        {"type": "tool-output-available", "toolCallId": "call-1", "output": "refunded o7"},
        _call("call-2", "o8"),
        {"type": "tool-output-denied", "toolCallId": "call-2"},
    ]
    assert not any(p["type"] == "tool-approval-request" for p in dicts)
    history = await store.read("chat-1")
    assert history[-1].text == "One of two." and await conversation.pending() == ()


async def test_a_partial_decision_asks_again_for_the_calls_that_still_wait() -> None:
    store = InMemoryStore()
    first = _conversation(store, _asks("o7", "o8"))
    await _encoded(ui_message_stream(await ui_turn(first, _submit())))
    conversation = _conversation(store)
    request = chat_request_from_ui(_answer(_tool_part("call-1")))
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, request)))
    # Each call this stream names is in it: the decided one, and the one still waiting.
    assert [p for p in parts if isinstance(p, dict)] == [
        {"type": "start"},
        _call(),
        {"type": "tool-output-available", "toolCallId": "call-1", "output": "refunded o7"},
        _call("call-2", "o8"),
        {"type": "tool-approval-request", "approvalId": "call-2", "toolCallId": "call-2"},
        {"type": "finish"},
    ]
    assert [c.id for c in await conversation.pending()] == ["call-2"]


async def test_a_decision_on_a_call_that_does_not_wait_is_refused_before_any_event() -> None:
    store = InMemoryStore()
    await _wait(store, _says("Refunded o7."))
    conversation = _conversation(store, _says("unused"))
    request = chat_request_from_ui(_answer(_tool_part("call-2")))
    with pytest.raises(NotPendingError, match="'call-2' does not wait") as caught:
        await ui_turn(conversation, request)
    assert caught.value.call_id == "call-2" and caught.value.conversation_id == "chat-1"
    # Decided once: the same decision again (a resent request) is refused too.
    again = chat_request_from_ui(_answer(_tool_part("call-1")))
    await _encoded(ui_message_stream(await ui_turn(conversation, again)))
    with pytest.raises(NotPendingError, match="calls that wait: none"):
        await ui_turn(conversation, again)


async def test_a_decision_on_an_erased_chat_is_a_closed_conversation() -> None:
    store = InMemoryStore()
    await _wait(store)
    await erase(store, "chat-1")
    conversation = _conversation(store)
    with pytest.raises(ConversationClosedError):
        await ui_turn(conversation, chat_request_from_ui(_answer(_tool_part())))


async def test_a_new_message_while_a_call_waits_is_the_streams_error() -> None:
    store = InMemoryStore()
    await _wait(store)
    conversation = _conversation(store, _says("unused"))
    body = {"id": "chat-1", "messages": [{**USER, "id": "u2", "parts": [USER["parts"][0]]}]}
    stream = ui_message_stream(await ui_turn(conversation, chat_request_from_ui(body)))
    parts = await _encoded(stream)
    assert parts[-2] == {"type": "error", "errorText": "the answer failed (ApprovalPendingError)"}


# ------------------------------------------------------------------------ AG-UI


def _resume_run(*entries: Any) -> dict[str, Any]:
    """The RunAgentInput HttpAgent posts for runAgent({resume})."""
    return {
        "threadId": "chat-1",
        "runId": "run-2",
        "messages": [
            {"id": "u1", "role": "user", "content": "Refund o7"},
            {
                "id": "call-1",
                "role": "assistant",
                "toolCalls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "refund", "arguments": '{"order":"o7"}'},
                    }
                ],
            },
        ],
        "resume": list(entries),
    }


def _resolved(call_id: str = "call-1", payload: Any = True) -> dict[str, Any]:
    return {"interruptId": call_id, "status": "resolved", "payload": payload}


def test_run_input_from_agui_reads_the_resume_entries() -> None:
    run = run_input_from_agui(
        _resume_run(
            _resolved("call-1"),
            _resolved("call-2", {"approved": False, "reason": "too much"}),
            _resolved("call-3", {"approved": True, "reason": "fine"}),
            {"interruptId": "call-4", "status": "cancelled"},
            _resolved("call-5", {"approved": False, "reason": ""}),
        )
    )
    assert run.approvals == (
        ToolApproval("call-1", True),
        ToolApproval("call-2", False, "too much"),
        ToolApproval("call-3", True, "fine"),
        ToolApproval("call-4", False),
        ToolApproval("call-5", False),
    )
    assert run.message.text == "Refund o7" and run.client_message_id == "u1"
    assert run.prior == () and run.run_id == "run-2" and run.thread_id == "chat-1"


def test_a_run_without_resume_has_no_approvals() -> None:
    body = {"threadId": "t", "runId": "r", "messages": [{"role": "user", "content": "hi"}]}
    assert run_input_from_agui(body).approvals == ()
    assert run_input_from_agui({**body, "resume": None}).approvals == ()


def _run_with(change: Any) -> dict[str, Any]:
    body = _resume_run(_resolved())
    change(body)
    return body


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda b: b.update(resume={}), "resume must be an array of resume entries, got an object"),
        (lambda b: b.update(resume=[]), "resume is empty: it answers no interrupt"),
        (lambda b: b["resume"].append("x"), r"resume\[1\] must be an object, got a string"),
        (lambda b: b["resume"][0].pop("interruptId"), r"resume\[0\] has no interruptId"),
        (
            lambda b: b["resume"][0].update(interruptId=3),
            r"resume\[0\]\.interruptId must be a string",
        ),
        (
            lambda b: b["resume"].append(_resolved()),
            r"resume\[1\]: interrupt 'call-1' is answered twice",
        ),
        (
            lambda b: b["resume"][0].update(status="done"),
            r"resume\[0\]\.status must be 'resolved' or 'cancelled', got 'done'",
        ),
        (
            lambda b: b["resume"][0].pop("payload"),
            r"resume\[0\]\.payload must be a boolean or an object with approved, got null",
        ),
        (
            lambda b: b["resume"][0].update(payload={"reason": "x"}),
            r"resume\[0\]\.payload\.approved must be a boolean, got null",
        ),
        (
            lambda b: b["resume"][0].update(payload={"approved": True, "reason": 2}),
            r"resume\[0\]\.payload\.reason must be a string or null, got a number",
        ),
        (
            lambda b: b["resume"][0].update(payload={"approved": True, "editedArgs": {}}),
            r"resume\[0\]\.payload\.editedArgs: a call waits with the arguments the model gave",
        ),
        (
            lambda b: b.update(messages=b["messages"][1:]),
            "the run resumes interrupts, but its messages hold no user message",
        ),
        (lambda b: b.update(messages={}), "messages must be an array"),
        (
            lambda b: b["messages"][0].update(content=""),
            r"messages\[0\]\.content is empty",
        ),
        (lambda b: b.pop("runId"), "the request body has no runId"),
    ],
)
def test_a_bad_resume_is_an_invalid_request(change: Any, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        run_input_from_agui(_run_with(change))


async def _agui_wait(store: InMemoryStore) -> None:
    conversation = _conversation(store, _asks("o7"))
    body = {
        "threadId": "chat-1",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "Refund o7"}],
    }
    events = await agui_turn(conversation, run_input_from_agui(body))
    encoded = await _encoded(agui_events(events, thread_id="chat-1", run_id="run-1"))
    assert encoded[-1]["outcome"]["interrupts"][0]["id"] == "call-1"


@pytest.mark.parametrize(
    ("entry", "result", "said"),
    [
        (_resolved(), "refunded o7", "Refunded o7."),
        (_resolved(payload={"approved": False, "reason": "no"}), "the call was denied: no", "No."),
        (
            {"interruptId": "call-1", "status": "cancelled"},
            "the call was denied: denied by the user",
            "No.",
        ),
    ],
)
async def test_agui_turn_resumes_with_the_decision(
    entry: dict[str, Any], result: str, said: str
) -> None:
    store = InMemoryStore()
    await _agui_wait(store)
    conversation = _conversation(store, _says(said))
    events = await agui_turn(conversation, run_input_from_agui(_resume_run(entry)))
    encoded = await _encoded(agui_events(events, thread_id="chat-1", run_id="run-2"))
    denied = result.removeprefix("the call was denied: ") if result != "refunded o7" else None
    assert encoded[1] == {
        "type": "TOOL_CALL_RESULT",
        "messageId": "run-2:result:call-1",
        "toolCallId": "call-1",
        "content": result,
        "role": "tool",
        # AG-UI has no denied result: the event's metadata marks one, with the reason.
        **({} if denied is None else {"metadata": {"scope/denied": denied}}),
    }
    assert encoded[-1] == {"type": "RUN_FINISHED", "threadId": "chat-1", "runId": "run-2"}
    history = await store.read("chat-1")
    assert [m.text for m in history][-1] == said
    assert history[2].tool_results[0].output.text() == result
    assert await conversation.pending() == ()


async def test_agui_resume_of_a_call_that_does_not_wait_is_refused() -> None:
    store = InMemoryStore()
    await _agui_wait(store)
    conversation = _conversation(store)
    with pytest.raises(NotPendingError, match=r"thread 'chat-1': tool call 'call-7'") as caught:
        await agui_turn(conversation, run_input_from_agui(_resume_run(_resolved("call-7"))))
    assert caught.value.call_id == "call-7"
    assert [c.id for c in await conversation.pending()] == ["call-1"]


async def test_a_resent_request_of_a_waiting_turn_asks_again_without_a_model_call() -> None:
    store = InMemoryStore()
    await _wait(store)
    conversation = _conversation(store)  # no answer scripted: a model call would fail
    parts = await _encoded(ui_message_stream(await ui_turn(conversation, _submit())))
    dicts = [p for p in parts if isinstance(p, dict)]
    assert dicts[-2:] == [
        {"type": "tool-approval-request", "approvalId": "call-1", "toolCallId": "call-1"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]
    assert {
        "type": "tool-input-available",
        "toolCallId": "call-1",
        "toolName": "refund",
        "input": {"order": "o7"},
    } in dicts
    assert len((await store.read_tree("chat-1")).batches) == 1  # nothing written
    assert [c.id for c in await conversation.pending()] == ["call-1"]
    # And the same over AG-UI: the resent run ends with the interrupt again.
    body = {
        "threadId": "chat-1",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "Refund o7"}],
    }
    events = await agui_turn(conversation, run_input_from_agui(body))
    encoded = await _encoded(agui_events(events, thread_id="chat-1", run_id="run-1"))
    assert encoded[-1]["outcome"]["interrupts"][0]["toolCallId"] == "call-1"


async def test_of_two_decisions_checked_at_once_one_is_taken_the_other_streams_an_error() -> None:
    # Both requests pass ui_turn's check while the call waits; the decision is taken by
    # the first stream that runs, and the other's stream ends with the error part.
    store = InMemoryStore()
    await _wait(store)
    first = _conversation(store, _says("Refunded o7."))
    second = _conversation(store, _says("unused"))
    approve = chat_request_from_ui(_answer(_tool_part()))
    deny = chat_request_from_ui(_answer(_tool_part(approved=False, reason="no")))
    taken = ui_message_stream(await ui_turn(first, approve))
    lost = ui_message_stream(await ui_turn(second, deny))
    assert (await _encoded(taken))[-2] == {"type": "finish", "finishReason": "stop"}
    parts = await _encoded(lost)
    assert parts[-2:] == [
        {"type": "error", "errorText": "the answer failed (NotPendingError)"},
        "[DONE]",
    ]
    assert isinstance(lost.error, NotPendingError)
    history = await store.read("chat-1")
    assert history[-1].text == "Refunded o7." and not history[2].tool_results[0].is_error


async def test_agui_a_partial_resume_ends_with_the_interrupts_that_remain() -> None:
    store = InMemoryStore()
    first = _conversation(store, _asks("o7", "o8"))
    body = {
        "threadId": "chat-1",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "Refund o7"}],
    }
    events = await agui_turn(first, run_input_from_agui(body))
    encoded = await _encoded(agui_events(events, thread_id="chat-1", run_id="run-1"))
    interrupts = encoded[-1]["outcome"]["interrupts"]
    assert [i["toolCallId"] for i in interrupts] == ["call-1", "call-2"]
    conversation = _conversation(store)
    run = run_input_from_agui(_resume_run(_resolved("call-2", False)))
    events = await agui_turn(conversation, run)
    encoded = await _encoded(agui_events(events, thread_id="chat-1", run_id="run-2"))
    assert [e["type"] for e in encoded] == ["RUN_STARTED", "TOOL_CALL_RESULT", "RUN_FINISHED"]
    assert encoded[1]["content"] == "the call was denied: denied by the user"
    assert [i["id"] for i in encoded[-1]["outcome"]["interrupts"]] == ["call-1"]
    assert [c.id for c in await conversation.pending()] == ["call-1"]
