"""The example service (docs/examples/web_chat/app.py) as a newcomer runs it, over a
live server with a ``FunctionModel``: every common malformed request is a 4xx (never a
500, never a model call, nothing stored), and a client that disconnects mid-turn
resumes it with ``Last-Event-ID`` and gets the rest, the turn stored once — no
custom routes or middleware, the service as shipped.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from scope.chat import Request, user_message
from scope.history import erase
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from tests.web_server import live_server, refund, refunder

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / "web_chat" / "app.py"
JSON = {"content-type": "application/json"}


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("web_chat_example_service", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Service:
    """The example app over a ``FunctionModel`` that answers with the example's own
    offline answer and counts its calls."""

    def __init__(self, base: str, store: InMemoryStore, module: Any) -> None:
        self.base = base
        self.store = store
        self.module = module
        self.questions: list[str] = []


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    module = _example()
    store = InMemoryStore()
    lock = threading.Lock()
    holder: list[Service] = []

    def answer(request: Request) -> str:
        with lock:
            holder[0].questions.append(request.messages[-1].text)
        return str(module.offline_answer(request))

    model = FunctionModel(answer, chunk_delay=0.01)
    app = module.create_app(model, store, max_body=10_000)
    with live_server(app) as base:
        holder.append(Service(base, store, module))
        yield holder[0]


def _ui(chat: Any = "chat-ok", *, trigger: Any = "submit-message", **message: Any) -> bytes:
    last = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}], **message}
    body: dict[str, Any] = {"id": chat, "messages": [last]}
    if trigger is not None:
        body["trigger"] = trigger
    return orjson.dumps(body)


def _agui(**fields: Any) -> bytes:
    body = {
        "threadId": "thread-ok",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "Hi"}],
        **fields,
    }
    return orjson.dumps({k: v for k, v in body.items() if v is not None})


def _approval(approval: dict[str, Any]) -> bytes:
    """The AI SDK chat's request after addToolApprovalResponse."""
    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
    tool = {"type": "tool-refund", "toolCallId": "call-1", "state": "approval-responded",
            "input": {}, "approval": approval}  # fmt: skip
    assistant = {"id": "a1", "role": "assistant", "parts": [tool]}
    body = {"id": "chat-ok", "trigger": "submit-message", "messageId": "a1",
            "messages": [user, assistant]}  # fmt: skip
    return orjson.dumps(body)


# (path, body, headers, expected status, what the answer names)
MALFORMED: list[Any] = [
    pytest.param("/api/chat", b"{not json", JSON, 400, "not JSON", id="bad-json"),
    pytest.param("/api/chat", b"\xff\xfe", JSON, 400, "not JSON", id="not-utf8"),
    pytest.param("/api/chat", _ui(), {"content-type": "text/plain"}, 415, "application/json",
                 id="wrong-content-type"),
    pytest.param("/api/chat", _ui(), {}, 415, "application/json", id="no-content-type"),
    pytest.param("/api/chat", b"[1, 2]", JSON, 400, "must be a JSON object", id="array-body"),
    pytest.param("/api/chat", b'{"id": "c"}', JSON, 400, "messages must be an array",
                 id="missing-messages"),
    pytest.param("/api/chat", b'{"id": "c", "messages": []}', JSON, 400, "messages are empty",
                 id="empty-messages"),
    pytest.param("/api/chat", _ui(role="assistant"), JSON, 400, "no new user message",
                 id="last-not-user"),
    pytest.param("/api/chat", _ui(parts=[{"type": "text", "text": ""}]), JSON, 400,
                 "no text or file part", id="empty-text"),
    pytest.param("/api/chat", _ui(parts="Hi"), JSON, 400, "parts must be an array",
                 id="parts-not-array"),
    pytest.param("/api/chat", _ui(parts=[{"type": "text", "text": 5}]), JSON, 400,
                 "text must be a string", id="text-not-string"),
    pytest.param("/api/chat", _ui(parts=[{"type": "tool-x"}]), JSON, 400,
                 "is not a user message part", id="unknown-part"),
    pytest.param("/api/chat", _ui(parts=[{"type": "file", "url": "data:image/png;base64,@@",
                                          "mediaType": "image/png"}]), JSON, 400,
                 "invalid base64", id="bad-file"),
    pytest.param("/api/chat", _ui(None), JSON, 400, "id must be a string, got null",
                 id="null-id"),
    pytest.param("/api/chat", orjson.dumps({"messages": orjson.loads(_ui())["messages"]}), JSON,
                 400, "has no id", id="missing-id"),
    pytest.param("/api/chat", _ui(42), JSON, 400, "id must be a string, got a number",
                 id="number-id"),
    pytest.param("/api/chat", _ui(" chat-1 "), JSON, 400, "surrounding whitespace",
                 id="id-whitespace"),
    pytest.param("/api/chat", _ui("chat\n1"), JSON, 400, "control characters",
                 id="id-newline"),
    pytest.param("/api/chat", _ui("chat\x001"), JSON, 400, "control characters", id="id-nul"),
    pytest.param("/api/chat", _ui(""), JSON, 400, "must not be empty", id="id-empty"),
    pytest.param("/api/chat", _ui("x" * 600), JSON, 400, "at most 512", id="id-too-long"),
    pytest.param("/api/chat", _ui(trigger="regenerate-message"), JSON, 409,
                 "no stored turn has the user message 'm1' to answer again",
                 id="regenerate-unknown-message"),
    pytest.param("/api/chat", _ui(trigger="regenerate-message", id=None), JSON, 409,
                 "last message has no id", id="regenerate-without-id"),
    pytest.param("/api/chat", orjson.dumps({**orjson.loads(_ui()), "messageId": "m0"}), JSON,
                 409, "no stored turn has the user message 'm0' to edit", id="edit-unknown"),
    pytest.param("/api/chat", orjson.dumps({**orjson.loads(_ui()), "messageId": 7}), JSON,
                 400, "messageId must be a string, got a number", id="message-id-number"),
    pytest.param("/api/chat", _ui(id=" m1"), JSON, 400, "messages[0].id",
                 id="message-id-whitespace"),
    pytest.param("/api/chat", _ui(trigger="resubmit"), JSON, 400, "trigger 'resubmit'",
                 id="unknown-trigger"),
    pytest.param("/api/chat", _ui(trigger=["submit-message"]), JSON, 400,
                 "trigger must be a string", id="trigger-wrong-type"),
    pytest.param("/api/chat", b'{"id": "c", "messages": [], "pad": "' + b"x" * 20_000 + b'"}',
                 JSON, 413, "larger than", id="too-large"),
    pytest.param("/api/agui", b"nope", JSON, 400, "not JSON", id="agui-bad-json"),
    pytest.param("/api/agui", _agui(threadId=" t "), JSON, 400, "threadId",
                 id="agui-thread-whitespace"),
    pytest.param("/api/agui", _agui(runId=None), JSON, 400, "has no runId", id="agui-no-run-id"),
    pytest.param("/api/agui", _agui(runId="r\x07"), JSON, 400, "runId", id="agui-run-id-bell"),
    pytest.param("/api/agui", _agui(messages=[{"id": "u", "role": "user", "content": ""}]),
                 JSON, 400, "content is empty", id="agui-empty-content"),
    pytest.param("/api/agui", _agui(messages=[{"id": "u0", "role": "user", "content": "Hi"},
                                             {"id": "u1", "role": "user", "content": "Hi"}]),
                 JSON, 409, "the client holds messages the server never stored",
                 id="agui-diverged"),
    pytest.param("/api/agui", _agui(messages=[{"id": "u0", "role": "user", "content": 5},
                                             {"id": "u1", "role": "user", "content": "Hi"}]),
                 JSON, 400, "messages[0].content must be a string or an array",
                 id="agui-bad-earlier-message"),
    pytest.param("/api/chat", _approval({"id": "call-1", "approved": True}), JSON, 409,
                 "tool call 'call-1' does not wait for a decision", id="approval-not-waiting"),
    pytest.param("/api/chat", _approval({"id": "call-1", "approved": "yes"}), JSON, 400,
                 "approval.approved must be a boolean", id="approval-not-boolean"),
    pytest.param("/api/agui", orjson.dumps({**orjson.loads(_agui()), "resume": [
                     {"interruptId": "call-1", "status": "resolved", "payload": True}]}),
                 JSON, 409, "tool call 'call-1' does not wait", id="agui-resume-not-waiting"),
    pytest.param("/api/agui", orjson.dumps({**orjson.loads(_agui()), "resume": [
                     {"interruptId": "call-1", "status": "later"}]}),
                 JSON, 400, "status must be 'resolved' or 'cancelled'", id="agui-resume-status"),
    pytest.param("/api/agui", _agui(), {"content-type": "application/x-www-form-urlencoded"},
                 415, "application/json", id="agui-form"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "headers", "status", "problem"), MALFORMED)
def test_a_malformed_request_is_a_4xx_before_any_model_call(
    service: Service, path: str, body: bytes, headers: dict[str, str], status: int, problem: str
) -> None:
    calls = len(service.questions)
    answer = httpx.post(f"{service.base}{path}", content=body, headers=headers, timeout=10)
    assert answer.status_code == status, answer.text
    assert problem in answer.text
    assert len(service.questions) == calls  # the model was never called
    for chat in ("chat-ok", "thread-ok", "c"):
        assert anyio.run(service.store.read, chat) == []  # nothing stored


def test_there_are_at_least_twenty_malformations() -> None:
    assert len(MALFORMED) >= 20


def test_a_well_formed_request_is_answered_from_the_question(service: Service) -> None:
    answer = httpx.post(
        f"{service.base}/api/chat", content=_ui("chat-hello"), headers=JSON, timeout=10
    )
    assert answer.status_code == 200
    deltas = [
        part["delta"]
        for line in answer.text.splitlines()
        if line.startswith("data: {") and (part := json.loads(line[6:]))["type"] == "text-delta"
    ]
    expected = "Hello from scope! You wrote: Hi. This answer was streamed to your browser, "
    assert "".join(deltas) == expected + "piece by piece."
    stored = anyio.run(service.store.read, "chat-hello")
    assert [m.text for m in stored] == ["Hi", expected + "piece by piece."]


def _events(lines: Iterator[str], stop: Any = None) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(event id, part) per SSE event; ``[DONE]`` as {"type": "[DONE]"}."""
    event_id: str | None = None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
            yield event_id, ({"type": data} if data == "[DONE]" else json.loads(data))
            event_id = None


def test_a_client_that_disconnects_resumes_with_last_event_id(service: Service) -> None:
    chat = "chat-resume"
    question = "Tell me about resuming a stream after a dropped connection"
    body = _ui(chat, parts=[{"type": "text", "text": question}])
    expected = service.module.offline_answer(Request([user_message(question)]))
    first: list[tuple[str | None, dict[str, Any]]] = []
    with httpx.Client(base_url=service.base, timeout=10) as client:
        with client.stream("POST", "/api/chat", content=body, headers=JSON) as response:
            assert response.status_code == 200
            for event in _events(response.iter_lines()):
                first.append(event)
                if sum(part["type"] == "text-delta" for _, part in first) == 2:
                    break  # the client drops the connection mid-answer
        assert all(event_id is not None for event_id, _ in first)  # every event has its id
        last_id = first[-1][0]
        assert last_id is not None
        with client.stream(
            "GET", f"/api/chat/{chat}/stream", headers={"last-event-id": last_id}
        ) as response:
            assert response.status_code == 200
            rest = list(_events(response.iter_lines()))
        again = client.get(f"/api/chat/{chat}/stream")  # from the start (AI SDK's resume)
        done = client.get(f"/api/chat/{chat}/stream", headers={"last-event-id": rest[-1][0] or ""})
    parts = [part for _, part in first + rest]
    text = "".join(part["delta"] for part in parts if part["type"] == "text-delta")
    assert text == expected
    assert [p["type"] for p in parts].count("start") == 1
    assert parts[-2:] == [{"type": "finish", "finishReason": "stop"}, {"type": "[DONE]"}]
    whole = [part for _, part in _events(iter(again.text.splitlines()))]
    assert whole == parts
    assert done.status_code == 204  # nothing after the last event
    stored = anyio.run(service.store.read, chat)
    assert [m.text for m in stored] == [question, expected]  # stored once
    assert service.questions.count(question) == 1


def test_a_second_message_while_a_turn_runs_is_409_before_the_model(service: Service) -> None:
    chat = "chat-busy"
    body = _ui(chat, parts=[{"type": "text", "text": "a long question " * 60}])  # seconds
    with (
        httpx.Client(base_url=service.base, timeout=10) as client,
        client.stream("POST", "/api/chat", content=body, headers=JSON) as running,
    ):
        assert running.status_code == 200
        next(running.iter_lines())  # the turn runs
        calls = len(service.questions)
        again = client.post("/api/chat", content=_ui(chat), headers=JSON)
        assert again.status_code == 409
        assert "TurnInProgress" not in again.text and chat in again.text
        assert len(service.questions) == calls  # on_overlap="reject": no model call
    deadline = time.monotonic() + 10
    while len(anyio.run(service.store.read, chat)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # the first turn runs on after its client left, and completes
    assert [m.role for m in anyio.run(service.store.read, chat)] == ["user", "assistant"]


@pytest.mark.parametrize("route", ["/api/chat", "/api/agui"])
def test_a_request_to_an_erased_chat_is_410_before_the_model(service: Service, route: str) -> None:
    chat = f"chat-erased{route.replace('/', '-')}"
    with httpx.Client(base_url=service.base, timeout=10) as client:
        first = client.post("/api/chat", content=_ui(chat, id="m1"), headers=JSON)
        assert first.status_code == 200
        anyio.run(erase, service.store, chat)
        calls = len(service.questions)
        if route == "/api/chat":
            body = _ui(chat, id="m2")
        else:
            body = _agui(threadId=chat, messages=[{"id": "m2", "role": "user", "content": "hi"}])
        refused = client.post(route, content=body, headers=JSON)
    assert refused.status_code == 410
    assert f"chat {chat!r} is erased: it takes no new turn" in refused.text
    assert len(service.questions) == calls


def _deltas(text: str, kind: str = "text-delta") -> str:
    return "".join(
        part["delta"]
        for line in text.splitlines()
        if line.startswith("data: {") and (part := json.loads(line[6:]))["type"] == kind
    )


def test_a_resent_request_gets_the_stored_answer_with_no_model_call(service: Service) -> None:
    # The browser posts the same body again (a dropped connection, a retry): the turn
    # is not stored twice; the resend streams the stored answer.
    body = _ui("chat-resent", parts=[{"type": "text", "text": "Once only"}])
    expected = service.module.offline_answer(Request([user_message("Once only")]))
    with httpx.Client(base_url=service.base, timeout=10) as client:
        first = client.post("/api/chat", content=body, headers=JSON)
        calls = len(service.questions)
        again = client.post("/api/chat", content=body, headers=JSON)
        other = client.post(
            "/api/chat",
            content=_ui("chat-resent", parts=[{"type": "text", "text": "Other"}]),
            headers=JSON,
        )
        run = _agui(
            threadId="thread-resent", messages=[{"id": "u1", "role": "user", "content": "Hi"}]
        )
        agui_first = client.post("/api/agui", content=run, headers=JSON)
        agui_calls = len(service.questions)
        agui_again = client.post("/api/agui", content=run, headers=JSON)
    assert first.status_code == again.status_code == agui_again.status_code == 200
    assert _deltas(first.text) == _deltas(again.text) == expected
    assert '"finishReason":"stop"' in again.text
    assert other.status_code == 409 and "'m1' is already stored as turn 1" in other.text
    assert agui_first.status_code == 200

    def agui_text(text: str) -> str:
        return "".join(
            json.loads(line[6:]).get("delta", "")
            for line in text.splitlines()
            if line.startswith("data: {")
        )

    assert agui_text(agui_again.text) == agui_text(agui_first.text)
    assert agui_text(agui_first.text).startswith("Hello from scope! You wrote: Hi.")
    assert "RUN_FINISHED" in agui_again.text
    assert len(service.questions) == agui_calls == calls + 1  # no model call for a resend
    stored = anyio.run(service.store.read, "chat-resent")
    assert [m.text for m in stored] == ["Once only", expected]  # stored once
    assert len(anyio.run(service.store.read, "thread-resent")) == 2


def test_a_tool_approval_runs_through_resumable_turns() -> None:
    # The example service with a tool that waits for approval: the waiting turn and the
    # decided one each run through ResumableTurns, and a GET of either replays it whole
    # (the AI SDK's resume), each part with its id.
    store = InMemoryStore()
    app = _example().create_app(FunctionModel(refunder), store, tools=[refund])
    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "o7"}]}
    with live_server(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        asked = client.post(
            "/api/chat", content=orjson.dumps({"id": "c", "messages": [user]}), headers=JSON
        )
        waiting = list(_events(iter(asked.text.splitlines())))
        replayed = list(_events(iter(client.get("/api/chat/c/stream").text.splitlines())))
        assert replayed == waiting and all(event_id for event_id, _ in waiting)
        parts = [part for _, part in waiting]
        assert parts[-3:] == [
            {"type": "tool-approval-request", "approvalId": "call-1", "toolCallId": "call-1"},
            {"type": "finish", "finishReason": "tool-calls"},
            {"type": "[DONE]"},
        ]
        message_id = parts[0]["messageId"]
        tool = {
            "type": "tool-refund",
            "toolCallId": "call-1",
            "state": "approval-responded",
            "input": {"order": "o7"},
            "approval": {"id": "call-1", "approved": True},
        }
        assistant = {"id": message_id, "role": "assistant", "parts": [tool]}
        decision = {
            "id": "c",
            "trigger": "submit-message",
            "messageId": message_id,
            "messages": [user, assistant],
        }
        decided = client.post("/api/chat", content=orjson.dumps(decision), headers=JSON)
        answer = list(_events(iter(decided.text.splitlines())))
        again = list(_events(iter(client.get("/api/chat/c/stream").text.splitlines())))
    assert again == answer
    # The decided turn's stream holds the call its result belongs to: read alone (a
    # resumed stream, replayed from its start), it rebuilds the message.
    assert [part for _, part in answer][:3] == [
        {"type": "start", "messageId": message_id},
        {
            "type": "tool-input-available",
            "toolCallId": "call-1",
            "toolName": "refund",
            "input": {"order": "o7"},
        },
        {"type": "tool-output-available", "toolCallId": "call-1", "output": "refunded o7"},
    ]
    stored = anyio.run(store.read, "c")
    assert [m.text for m in stored] == ["o7", "", "", "done: refunded o7"]
