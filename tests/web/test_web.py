"""scope.web in-process: the encoders' exact output, the request readers' every rule,
the turn logs (in memory and Redis) and ResumableTurns' disconnect semantics."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Response,
    ResponseMetadata,
    assistant_message,
    reasoning_part,
    tool_call_part,
    user_message,
)
from scope.conversation import Conversation
from scope.errors import (
    CommitError,
    ConversationClosedError,
    InvalidConversationIDError,
    InvalidRequestError,
    ProviderServerError,
    TurnInProgressError,
    TurnInterruptedError,
    TurnLogError,
)
from scope.history import Batch, ConversationID, ErasureReceipt, erase, erase_owner
from scope.history.inmemory import InMemoryStore
from scope.media import SourceKind
from scope.testing import FunctionModel, Hang, ScriptedModel
from scope.tools import tool
from scope.web import (
    AGUI_HEADERS,
    CLIENT_MESSAGE_ID_KEY,
    SHUTDOWN_TEXT,
    UI_MESSAGE_STREAM_HEADERS,
    InMemoryTurnLog,
    RedisTurnLog,
    ResumableTurns,
    TurnLog,
    agui_events,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    user_message_from_agui,
    user_message_from_ui,
)
from tests.servers import import_driver, redis_url_or_skip, unique_key_prefix
from tests.web_server import SCENARIOS, chunk, scripted, split_writes

pytestmark = pytest.mark.anyio


async def _collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([data async for data in stream])


def _parts(data: bytes) -> list[Any]:
    events = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return [e[6:].decode() if e == b"data: [DONE]" else orjson.loads(e[6:]) for e in events]


async def _items(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


# ------------------------------------------------------------------------ the encoders


def test_headers() -> None:
    assert UI_MESSAGE_STREAM_HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    assert UI_MESSAGE_STREAM_HEADERS["content-type"] == "text/event-stream"
    assert AGUI_HEADERS["content-type"] == "text/event-stream"
    with pytest.raises(TypeError):
        UI_MESSAGE_STREAM_HEADERS["x"] = "y"  # type: ignore[index]


async def test_ui_message_stream_parts() -> None:
    data = await _collect(ui_message_stream(scripted("reasoning"), message_id="m"))
    assert _parts(data) == [
        {"type": "start", "messageId": "m"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "b1"},
        {"type": "reasoning-delta", "id": "b1", "delta": "Let me "},
        {"type": "reasoning-delta", "id": "b1", "delta": "think… ☕"},
        {"type": "reasoning-end", "id": "b1"},
        {"type": "text-start", "id": "b2"},
        {"type": "text-delta", "id": "b2", "delta": "Answer: "},
        {"type": "text-delta", "id": "b2", "delta": "42"},
        {"type": "text-end", "id": "b2"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
        "[DONE]",
    ]


async def test_ui_message_stream_tool_calls_and_errors() -> None:
    data = await _collect(ui_message_stream(scripted("parallel")))
    parts = _parts(data)
    assert parts[0] == {"type": "start"}
    assert parts[2:8] == [
        {"type": "tool-input-start", "toolCallId": "call_a", "toolName": "lookup"},
        {"type": "tool-input-delta", "toolCallId": "call_a", "inputTextDelta": '{"q": '},
        {"type": "tool-input-start", "toolCallId": "call_b", "toolName": "search"},
        {"type": "tool-input-delta", "toolCallId": "call_b", "inputTextDelta": '{"term"'},
        {"type": "tool-input-delta", "toolCallId": "call_a", "inputTextDelta": '"ä"}'},
        {"type": "tool-input-delta", "toolCallId": "call_b", "inputTextDelta": ': "β", "n": 2}'},
    ]
    assert parts[8:] == [
        {
            "type": "tool-input-available",
            "toolCallId": "call_a",
            "toolName": "lookup",
            "input": {"q": "ä"},
        },
        {
            "type": "tool-input-available",
            "toolCallId": "call_b",
            "toolName": "search",
            "input": {"term": "β", "n": 2},
        },
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
        "[DONE]",
    ]


async def test_malformed_tool_arguments_are_a_tool_input_error() -> None:
    call = tool_call_part("c1", "f", "{oops")
    data = await _collect(ui_message_stream(_items(chunk(call, finish=FinishReason.TOOL_CALLS))))
    parts = _parts(data)
    assert parts[2:4] == [
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "f"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{oops"},
    ]
    assert parts[4]["type"] == "tool-input-error"
    assert parts[4]["input"] == "{oops"
    assert "'c1'" in parts[4]["errorText"]


async def test_a_failure_becomes_the_error_event_with_on_error_text() -> None:
    seen: list[Exception] = []

    def text(exc: Exception) -> str:
        seen.append(exc)
        return "sorry"

    data = await _collect(ui_message_stream(scripted("error"), on_error=text))
    assert _parts(data)[-2:] == [{"type": "error", "errorText": "sorry"}, "[DONE]"]
    assert isinstance(seen[0], ProviderServerError)
    data = await _collect(agui_events(scripted("error"), thread_id="t", run_id="r"))
    assert _parts(data)[-1] == {
        "type": "RUN_ERROR",
        "message": "the answer failed (ProviderServerError)",
    }


async def test_an_invalid_chunk_is_an_error_event() -> None:
    bad = [chunk("a", finish=FinishReason.STOP), chunk("after the finish")]
    data = await _collect(ui_message_stream(_items(*bad)))
    assert _parts(data)[-2] == {
        "type": "error",
        "errorText": "the answer failed (InvalidResponseError)",
    }
    seen: list[Exception] = []
    data = await _collect(
        ui_message_stream(_items("not a chunk"), on_error=lambda e: str(seen.append(e)))
    )
    assert isinstance(seen[0], TypeError)
    assert "Response or TurnEvent, got str" in str(seen[0])


async def test_agui_events_sequence() -> None:
    data = await _collect(agui_events(scripted("tool"), thread_id="t", run_id="r"))
    assert [p["type"] for p in _parts(data)] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert _parts(data)[0] == {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}


@pytest.mark.parametrize("bad", [{"thread_id": ""}, {"run_id": 3}])
def test_agui_events_needs_ids(bad: dict[str, Any]) -> None:
    ids: dict[str, Any] = {"thread_id": "t", "run_id": "r", **bad}
    with pytest.raises(TypeError, match="must be a non-empty str"):
        agui_events(scripted("text"), **ids)


async def test_conversation_events_carry_tool_results_and_steps() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = ScriptedModel(
        Response(
            Output(
                assistant_message(tool_call_part("c1", "add", '{"a": 2, "b": 3}')),
                FinishReason.TOOL_CALLS,
            )
        ),
        Response(Output(assistant_message("5"), FinishReason.STOP)),
    )
    conversation = Conversation(model, InMemoryStore(), "c", tools=[add])
    parts = _parts(await _collect(ui_message_stream(conversation.stream("2+3?"))))
    kinds = [p if isinstance(p, str) else p["type"] for p in parts]
    assert kinds.count("start-step") == kinds.count("finish-step") == 2
    assert {"type": "tool-output-available", "toolCallId": "c1", "output": 5} in parts
    assert parts[-2] == {"type": "finish", "finishReason": "stop"}
    model = ScriptedModel(*model_turns_again())
    conversation = Conversation(model, InMemoryStore(), "c", tools=[add])
    events = _parts(
        await _collect(agui_events(conversation.stream("2+3?"), thread_id="t", run_id="r"))
    )
    assert {
        "type": "TOOL_CALL_RESULT",
        "messageId": "r:result:c1",
        "toolCallId": "c1",
        "content": "5",
        "role": "tool",
    } in events


def model_turns_again() -> list[Response]:
    return [
        Response(
            Output(
                assistant_message(tool_call_part("c1", "add", '{"a": 2, "b": 3}')),
                FinishReason.TOOL_CALLS,
            )
        ),
        Response(Output(assistant_message("5"), FinishReason.STOP)),
    ]


async def test_the_stream_is_closed_when_the_consumer_stops_early() -> None:
    closed = []

    async def source() -> AsyncIterator[Response]:
        try:
            for word in ("a", "b", "c"):
                yield chunk(word)
        finally:
            closed.append(True)

    encoded = ui_message_stream(source())
    async with contextlib.aclosing(encoded):  # type: ignore[type-var]
        async for _ in encoded:
            break
    assert closed == [True]


async def test_cancellation_propagates_and_sends_no_error_event() -> None:
    model = ScriptedModel(Hang(after=1))
    from scope.chat import Request, user_message

    got: list[bytes] = []
    with anyio.move_on_after(0.5) as scope:
        async for data in ui_message_stream(model.stream(Request([user_message("hi")]))):
            got.append(data)
    assert scope.cancelled_caught
    assert b'"error"' not in b"".join(got)
    assert model.streams[0].outcome == "cancelled"


async def test_usage_and_metadata_only_chunks_write_nothing_extra() -> None:
    items = [
        chunk("hi"),
        Response(metadata=ResponseMetadata(id="x")),
        chunk(finish=FinishReason.STOP),
    ]
    parts = _parts(await _collect(ui_message_stream(_items(*items))))
    assert [p if isinstance(p, str) else p["type"] for p in parts] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
        "[DONE]",
    ]


async def test_media_parts_become_file_parts() -> None:
    from scope.chat import media_part
    from scope.media import Media

    items = [
        chunk(
            media_part(Media.from_bytes("image/png", b"\x89PNG")),
            reasoning_part("", signature=b"s"),
            finish=FinishReason.STOP,
        )
    ]
    parts = _parts(await _collect(ui_message_stream(_items(*items))))
    assert {
        "type": "file",
        "url": "data:image/png;base64,iVBORw==",
        "mediaType": "image/png",
    } in parts
    # A signature-only reasoning part opens no block (tests/web/test_web_reasoning.py).
    assert [p for p in parts if "reasoning" in str(p)] == []


# ------------------------------------------------------------------ the request readers


UI_BODY = {
    "id": "chat",
    "trigger": "submit-message",
    "messages": [
        {"id": "1", "role": "user", "parts": [{"type": "text", "text": "an old question"}]},
        {"id": "2", "role": "assistant", "parts": [{"type": "text", "text": "forged answer"}]},
        {
            "id": "3",
            "role": "user",
            "parts": [
                {"type": "text", "text": "What is in "},
                {"type": "file", "url": "data:image/png;base64,iVBORw==", "mediaType": "image/png"},
                {
                    "type": "file",
                    "url": "https://example.com/a.pdf",
                    "mediaType": "application/pdf",
                },
                {"type": "data-note", "data": {"x": 1}},
            ],
        },
    ],
}


@pytest.mark.parametrize("encode", [orjson.dumps, lambda b: orjson.dumps(b).decode(), lambda b: b])
def test_user_message_from_ui_takes_only_the_new_message(encode: Any) -> None:
    message = user_message_from_ui(encode(UI_BODY))
    assert message.role == "user"
    assert message.text == "What is in "
    kinds = [p.kind for p in message.parts]
    assert kinds == ["text", "media", "media"]
    assert message.parts[1].media is not None and message.parts[1].media.source.data == b"\x89PNG"
    assert message.parts[2].media is not None
    assert message.parts[2].media.source.kind is SourceKind.URI


def _ui(*parts: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"id": "1", "role": role, "parts": list(parts)}]}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{no", "not JSON"),
        (b"\xff", "not JSON"),
        ([1], "must be a JSON object"),
        ({}, "messages must be an array"),
        ({"messages": []}, "messages are empty"),
        ({"messages": ["x"]}, r"messages\[0\] must be an object"),
        (
            _ui({"type": "text", "text": "hi"}, role="assistant"),
            r"messages\[0\]\.role is 'assistant'",
        ),
        ({"messages": [{"role": "user", "parts": "hi"}]}, r"messages\[0\]\.parts must be an array"),
        (_ui(), "no text or file part"),
        (_ui({"type": "text", "text": ""}), "no text or file part"),
        (_ui({"type": "data-x", "data": 1}), "no text or file part"),
        (_ui("hi"), r"parts\[0\] must be an object"),
        (_ui({"type": "text", "text": 1}), r"parts\[0\]\.text must be a string"),
        (_ui({"type": "reasoning", "text": "x"}), r"parts\[0\]\.type 'reasoning' is not"),
        (_ui({"type": "file", "url": "x"}), "needs string url and mediaType"),
        (
            _ui({"type": "file", "url": "data:image/png,abc", "mediaType": "image/png"}),
            "base64 encoded",
        ),
        (
            _ui({"type": "file", "url": "data:image/png;base64,@@", "mediaType": "image/png"}),
            "invalid base64",
        ),
        (_ui({"type": "file", "url": "not a uri", "mediaType": "image/png"}), r"parts\[0\]: "),
    ],
)
def test_user_message_from_ui_refuses(body: Any, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        user_message_from_ui(body)


AGUI_BODY = {
    "threadId": "t",
    "runId": "r",
    "messages": [
        {"id": "1", "role": "user", "content": "old"},
        {"id": "2", "role": "assistant", "content": "forged"},
        {
            "id": "3",
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {
                    "type": "image",
                    "source": {"type": "data", "value": "iVBORw==", "mimeType": "image/png"},
                },
                {
                    "type": "document",
                    "source": {
                        "type": "url",
                        "value": "https://example.com/a.pdf",
                        "mimeType": "application/pdf",
                    },
                },
            ],
        },
    ],
}


def test_user_message_from_agui_takes_only_the_new_message() -> None:
    message = user_message_from_agui(orjson.dumps(AGUI_BODY))
    assert [p.kind for p in message.parts] == ["text", "media", "media"]
    assert message.text == "Look: "
    plain = user_message_from_agui({"messages": [{"id": "1", "role": "user", "content": "Hi"}]})
    assert plain.text == "Hi"


def _agui(content: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"id": "1", "role": role, "content": content}]}


def _image(source: Any) -> dict[str, Any]:
    return _agui([{"type": "image", "source": source}])


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"nope", "not JSON"),
        ("[]", "must be a JSON object"),
        ({"messages": {}}, "messages must be an array"),
        (_agui("hi", role="assistant"), r"role is 'assistant'"),
        (_agui(""), "content is empty"),
        (_agui(3), "must be a string or an array"),
        (_agui([]), "no text or media"),
        (_agui(["x"]), r"content\[0\] must be an object"),
        (_agui([{"type": "text", "text": None}]), r"content\[0\]\.text must be a string"),
        (_agui([{"type": "binary"}]), r"content\[0\]\.type 'binary' is not"),
        (_image("x"), r"source must be an object"),
        (_image({"type": "data", "value": "x"}), "needs string value and mimeType"),
        (_image({"type": "file", "value": "f", "mimeType": "image/png"}), "is not data or url"),
        (_image({"type": "data", "value": "@@", "mimeType": "image/png"}), "invalid base64"),
        (_image({"type": "url", "value": "no uri", "mimeType": "image/png"}), r"content\[0\]: "),
    ],
)
def test_user_message_from_agui_refuses(body: Any, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        user_message_from_agui(body)


# ------------------------------------------------------------------------- turn logs


@pytest.fixture(params=["memory", "redis"])
async def log(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[TurnLog]:
    if request.param == "memory":
        yield InMemoryTurnLog(max_events=20)
        return
    if anyio_backend != "asyncio":
        pytest.skip("redis-py's asyncio client runs under asyncio only")
    url = redis_url_or_skip()
    aioredis = import_driver("redis.asyncio")
    client = aioredis.Redis.from_url(url)
    prefix = unique_key_prefix()
    try:
        yield RedisTurnLog(client, prefix=prefix, max_events=20, block_ms=100)
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def _read(log: TurnLog, turn: str, after: str | None = None) -> list[tuple[str, bytes]]:
    return [event async for event in log.events(turn, after)]


async def test_log_replays_and_resumes(log: TurnLog) -> None:
    await log.open("t")
    ids = [await log.append("t", f"e{i}".encode()) for i in range(3)]
    await log.end("t")
    assert await _read(log, "t") == list(zip(ids, [b"e0", b"e1", b"e2"], strict=True))
    assert await _read(log, "t", ids[0]) == [(ids[1], b"e1"), (ids[2], b"e2")]
    assert await _read(log, "t", ids[2]) == []


async def test_log_readers_wait_for_more(log: TurnLog) -> None:
    await log.open("t")
    got: list[bytes] = []

    async def reader() -> None:
        got.extend(data for _, data in await _read(log, "t"))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            await anyio.wait_all_tasks_blocked()
            await log.append("t", b"a")
            await log.append("t", b"b")
            await log.end("t")
    assert got == [b"a", b"b"]


async def test_log_errors(log: TurnLog) -> None:
    with pytest.raises(TurnLogError, match="'nope' is unknown or expired"):
        await _read(log, "nope")
    await log.open("t")
    with pytest.raises(TurnInProgressError, match="'t' is still running") as refused:
        await log.open("t")
    assert refused.value.conversation_id == "t"
    ids = [await log.append("t", b"x") for _ in range(25)]
    await log.end("t")
    with pytest.raises(TurnLogError, match="dropped"):
        await _read(log, "t", ids[0])
    with pytest.raises(TurnLogError):
        await _read(log, "t")
    with pytest.raises(TurnLogError, match="not an event id"):
        await _read(log, "t", "bogus")
    assert [d for _, d in await _read(log, "t", ids[5])] == [b"x"] * 19
    await log.open("t")  # an ended turn may start again, empty
    await log.end("t")
    assert await _read(log, "t") == []


async def test_in_memory_log_forgets_ended_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    log = InMemoryTurnLog(keep_seconds=1)
    await log.open("t")
    await log.end("t")
    assert await _read(log, "t") == []
    later = time.monotonic() + 2
    monkeypatch.setattr(time, "monotonic", lambda: later)
    with pytest.raises(TurnLogError, match="unknown or expired"):
        await _read(log, "t")
    with pytest.raises(TurnLogError, match="is not open"):
        await log.append("t", b"x")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_events": 0}, ValueError),
        ({"max_events": True}, TypeError),
        ({"max_events": 1.5}, TypeError),
        ({"keep_seconds": 0}, ValueError),
        ({"keep_seconds": "1"}, TypeError),
    ],
)
def test_log_limits(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        InMemoryTurnLog(**kwargs)
    with pytest.raises(error):
        RedisTurnLog(object(), **kwargs)


def test_resumable_turns_arguments() -> None:
    with pytest.raises(TypeError, match="log must be a TurnLog"):
        ResumableTurns(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cancel_on_disconnect must be a bool"):
        ResumableTurns(cancel_on_disconnect=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prefix"):
        RedisTurnLog(object(), prefix="")


# ----------------------------------------------------------------- ResumableTurns


def _gated_model(gate: anyio.Event) -> Any:
    from scope.chat import Request, StreamerFunc

    async def stream(request: Request) -> AsyncIterator[Response]:
        yield chunk("first ")
        await gate.wait()
        yield chunk("second")
        yield chunk(finish=FinishReason.STOP)

    return StreamerFunc(stream)


async def test_start_needs_async_with() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await ResumableTurns().start("t", ui_message_stream(scripted("text")))


async def test_a_turn_runs_on_after_its_reader_leaves_and_is_stored_once(log: TurnLog) -> None:
    gate = anyio.Event()
    store = InMemoryStore()
    conversation = Conversation(_gated_model(gate), store, "c")
    with anyio.fail_after(10):
        async with ResumableTurns(log) as turns:
            await turns.start("c", ui_message_stream(conversation.stream("hi")))
            reader = turns.stream("c")
            first = b""
            while b'"delta":"first "' not in first:
                event = await anext(reader)
                assert re.match(rb"id: \S+\ndata: [^\n]*\n\n$", event)  # one event, its id
                first += event
            await reader.aclose()  # the client disconnects mid-turn
            found = re.search(rb"id: (\S+)\ndata: [^\n]*\n\n$", first)
            assert found is not None
            gate.set()
            rest = b"".join([data async for data in turns.stream("c", found[1].decode())])
            again = b"".join([data async for data in turns.stream("c")])  # from the start
    assert rest.endswith(b"data: [DONE]\n\n")
    assert b'"delta":"second"' in rest and b'"delta":"first "' not in rest
    assert again.startswith(first) and again.endswith(rest)
    stored = await store.read("c")
    assert [m.text for m in stored] == ["hi", "first second"]


async def test_cancel_on_disconnect_stops_the_turn_unstored() -> None:
    gate = anyio.Event()
    store = InMemoryStore()
    conversation = Conversation(_gated_model(gate), store, "c")
    with anyio.fail_after(10):
        async with ResumableTurns(cancel_on_disconnect=True) as turns:
            await turns.start("c", ui_message_stream(conversation.stream("hi")))
            reader = turns.stream("c")
            await anext(reader)
            await reader.aclose()
        assert await _read(turns.log, "c") != []  # what was sent stays readable
    assert await store.read("c") == []


async def test_a_second_start_of_a_running_turn_is_refused_after_the_handover_timeout() -> None:
    gate = anyio.Event()
    closed: list[bool] = []

    async def second() -> AsyncIterator[Response]:
        try:
            yield chunk("another answer")
            await anyio.sleep_forever()
        finally:
            closed.append(True)

    with anyio.fail_after(10):
        async with ResumableTurns(handover_timeout=0.05) as turns:
            await turns.start("c", ui_message_stream(_gated_model(gate).stream(_request())))
            with pytest.raises(TurnInProgressError, match="'c' is still running") as refused:
                await turns.start("c", ui_message_stream(second()))
            assert refused.value.conversation_id == "c"
            assert refused.value.started_at is not None
            assert closed == [True]  # the new turn was stopped
            gate.set()
        body = b"".join([data async for data in turns.stream("c")])
    assert b"another answer" not in body and b'"delta":"second"' in body


def _request() -> Any:
    from scope.chat import Request, user_message

    return Request([user_message("hi")])


def test_every_scenario_encodes() -> None:
    assert set(SCENARIOS) >= {"text", "reasoning", "tool", "parallel", "error", "empty"}


# ------------------------------------------------------- arguments, the error rule, logs


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda: ui_message_stream("text"), "stream must be an async iterable"),  # type: ignore[arg-type]
        (lambda: ui_message_stream(b"x"), "stream must be an async iterable"),  # type: ignore[arg-type]
        (lambda: ui_message_stream([chunk("a")]), "got list"),  # type: ignore[arg-type]
        (lambda: ui_message_stream(scripted("text"), message_id=5), "message_id must be a str"),  # type: ignore[arg-type]
        (lambda: ui_message_stream(scripted("text"), on_error=None), "on_error must be callable"),  # type: ignore[arg-type]
        (lambda: agui_events("text", thread_id="t", run_id="r"), "stream must be an async"),  # type: ignore[arg-type]
        (lambda: agui_events(scripted("text"), thread_id="t", run_id="r", on_error=3), "on_error"),  # type: ignore[arg-type]
    ],
)
def test_wrong_argument_types_raise_type_error_before_streaming(call: Any, problem: str) -> None:
    with pytest.raises(TypeError, match=problem):
        call()


def test_an_empty_message_id_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="message_id must not be empty"):
        ui_message_stream(scripted("text"), message_id="")


async def test_a_failed_turn_is_logged_on_the_scope_web_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("INFO", logger="scope.web"):
        encoded = ui_message_stream(scripted("error"))
        assert encoded.error is None
        data = await _collect(encoded)
    assert b'"type":"error"' in data
    assert isinstance(encoded.error, ProviderServerError)
    (record,) = [r for r in caplog.records if r.name == "scope.web"]
    assert record.levelname == "ERROR"
    assert "ProviderServerError" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is encoded.error


async def test_a_refused_or_interrupted_turn_is_logged_as_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = [
        TurnInProgressError("busy", conversation_id="c"),
        TurnInterruptedError("stopped", conversation_id="c"),
    ]
    with caplog.at_level("INFO", logger="scope.web"):
        for error in errors:
            await _collect(agui_events(_items(chunk("a"), error), thread_id="t", run_id="r"))
    records = [r for r in caplog.records if r.name == "scope.web"]
    assert [r.levelname for r in records] == ["INFO", "INFO"]
    assert [r.exc_info for r in records] == [None, None]
    assert "TurnInProgressError: busy" in records[0].getMessage()


async def test_an_interrupted_turn_is_an_abort_with_its_reason() -> None:
    interrupted = TurnInterruptedError("stopped", conversation_id="c")
    encoded = ui_message_stream(
        _items(chunk("a"), interrupted), on_error=lambda exc: f"stopped: {type(exc).__name__}"
    )
    data = await _collect(encoded)
    assert data.endswith(
        b'data: {"type":"abort","reason":"stopped: TurnInterruptedError"}\n\ndata: [DONE]\n\n'
    )
    assert b'"type":"error"' not in data and encoded.error is interrupted
    # AG-UI 1.0 has no abort event: the run ends with RUN_ERROR.
    events = await _collect(agui_events(_items(chunk("a"), interrupted), thread_id="t", run_id="r"))
    assert b'"type":"RUN_ERROR","message":"the answer failed (TurnInterruptedError)"' in events


async def test_a_turn_of_a_closed_conversation_is_logged_without_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Erased while the turn ran: the error names the conversation, the log must not.
    closed = ConversationClosedError("conversation 'erased-7f3' is closed")
    answer = assistant_message("a")
    commit = CommitError(
        "the turn could not be stored: conversation 'erased-7f3' is closed",
        batch=Batch("erased-7f3", "a1", [user_message("q"), answer]),
        response=Response(Output(answer, FinishReason.STOP)),
        retryable=False,
    )
    commit.__cause__ = closed
    with caplog.at_level("DEBUG"):
        for error in (closed, commit):
            encoded = ui_message_stream(_items(chunk("a"), error))
            data = await _collect(encoded)
            assert b'"type":"error"' in data and encoded.error is error
    records = [r for r in caplog.records if r.name == "scope.web"]
    assert [r.levelname for r in records] == ["INFO", "INFO"]
    assert [r.exc_info for r in records] == [None, None]
    assert "its conversation is closed (CommitError)" in records[1].getMessage()
    assert "erased-7f3" not in caplog.text


async def test_the_encoded_stream_closes_its_source_in_async_with() -> None:
    closed: list[bool] = []

    async def source() -> AsyncIterator[Response]:
        try:
            yield chunk("a")
            yield chunk("b")
        finally:
            closed.append(True)

    async with ui_message_stream(source()) as encoded:
        assert (await anext(encoded)).startswith(b'data: {"type":"start"}')
    assert closed == [True]


@pytest.mark.parametrize(
    ("trigger", "problem"),
    [
        (
            "submit-user-message",
            "trigger 'submit-user-message' is not 'submit-message' or 'regenerate-message'",
        ),
        (None, "trigger must be a string, got null"),
        (1, "trigger must be a string, got a number"),
    ],
)
def test_only_the_two_triggers_are_accepted(trigger: Any, problem: str) -> None:
    body = {**UI_BODY, "trigger": trigger}
    with pytest.raises(InvalidRequestError, match=problem):
        user_message_from_ui(body)
    with pytest.raises(InvalidRequestError, match=problem):
        chat_request_from_ui(body)
    without = {k: v for k, v in UI_BODY.items() if k != "trigger"}
    assert user_message_from_ui(without).text == "What is in "  # no trigger: a new message


def test_chat_request_from_ui_reads_the_chat_id() -> None:
    request = chat_request_from_ui(orjson.dumps(UI_BODY))
    assert request.chat_id == "chat" and type(request.chat_id) is ConversationID
    assert request.message == user_message_from_ui(UI_BODY)
    assert (request.trigger, request.message_id, request.client_message_id) == (
        "submit-message",
        None,
        "3",
    )


def test_chat_request_from_ui_reads_the_trigger_and_the_message_ids() -> None:
    regenerate = chat_request_from_ui({**UI_BODY, "trigger": "regenerate-message"})
    assert regenerate.trigger == "regenerate-message"
    assert regenerate.message == user_message_from_ui(UI_BODY)  # the question, as sent
    edit = chat_request_from_ui({**UI_BODY, "messageId": "3"})
    assert (edit.trigger, edit.message_id) == ("submit-message", "3")
    assert chat_request_from_ui({**UI_BODY, "messageId": None}).message_id is None
    without = {k: v for k, v in UI_BODY.items() if k != "trigger"}
    assert chat_request_from_ui(without).trigger == "submit-message"
    last = dict(UI_BODY["messages"][-1])  # type: ignore[index]
    del last["id"]
    no_id = {**UI_BODY, "messages": [last]}
    assert chat_request_from_ui(no_id).client_message_id is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"messageId": 3}, "messageId must be a string, got a number"),
        ({"messageId": ""}, "messageId must not be empty"),
        ({"messageId": " 3"}, "messageId ' 3' must not have surrounding whitespace"),
        ({"messageId": "a\nb"}, "control characters"),
    ],
)
def test_a_bad_message_id_is_an_invalid_request(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        chat_request_from_ui({**UI_BODY, **change})


@pytest.mark.parametrize(
    ("value", "problem"),
    [(3, r"messages\[2\].id must be a string, got a number"), ("", "must not be empty")],
)
def test_a_bad_last_message_id_is_an_invalid_request(value: Any, problem: str) -> None:
    messages = [*UI_BODY["messages"][:-1], {**UI_BODY["messages"][-1], "id": value}]  # type: ignore[index]
    with pytest.raises(InvalidRequestError, match=problem):
        chat_request_from_ui({**UI_BODY, "messages": messages})
    agui = [*AGUI_BODY["messages"][:-1], {**AGUI_BODY["messages"][-1], "id": value}]  # type: ignore[index]
    with pytest.raises(InvalidRequestError, match=problem):
        run_input_from_agui({**AGUI_BODY, "messages": agui})


@pytest.mark.parametrize(
    ("chat_id", "problem"),
    [
        (" chat", "id ' chat' must not have surrounding whitespace"),
        ("chat\t", "surrounding whitespace"),
        ("ch\x00at", "id 'ch\\\\x00at' must not contain control characters"),
        ("ch\u0085at", "control characters"),
        ("", "id must not be empty"),
        ("\ud800", "not valid Unicode"),
        ("é" * 300, "at most 512 UTF-8 bytes"),
        (7, "id must be a string, got a number"),
        ([], "id must be a string, got an array"),
        (True, "got a boolean"),
    ],
)
def test_an_invalid_chat_id_is_an_invalid_request(chat_id: Any, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem):
        chat_request_from_ui({**UI_BODY, "id": chat_id})
    agui = {**AGUI_BODY, "threadId": chat_id}
    agui_problem = "threadId" + problem[2:] if problem.startswith("id ") else problem
    with pytest.raises(InvalidRequestError, match=agui_problem):
        run_input_from_agui(agui)


def test_run_input_from_agui_reads_the_ids() -> None:
    run = run_input_from_agui(orjson.dumps(AGUI_BODY))
    assert (run.thread_id, run.run_id, run.client_message_id) == ("t", "r", "3")
    # The earlier user messages, with their ids; assistant messages are not read.
    assert [(m.text, m.metadata.decode(CLIENT_MESSAGE_ID_KEY)) for m in run.prior] == [("old", "1")]
    assert type(run.thread_id) is ConversationID
    assert run.message == user_message_from_agui(AGUI_BODY)
    with pytest.raises(InvalidRequestError, match="has no runId"):
        run_input_from_agui({k: v for k, v in AGUI_BODY.items() if k != "runId"})
    with pytest.raises(InvalidRequestError, match="runId 'r\\\\n' must not have surrounding"):
        run_input_from_agui({**AGUI_BODY, "runId": "r\n"})


def test_an_invalid_id_error_chains_the_id_error() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        chat_request_from_ui({**UI_BODY, "id": " x"})
    assert isinstance(caught.value.__cause__, InvalidConversationIDError)
    assert not isinstance(caught.value, InvalidConversationIDError)


# ------------------------------------------------- ResumableTurns and on_overlap


def _slow_model(started: list[str], gate: anyio.Event | None = None) -> FunctionModel:
    async def answer(request: Any) -> str:
        question = request.messages[-1].text
        started.append(question)
        if gate is not None and question == "first":
            await gate.wait()
        return f"answer to {question}"

    return FunctionModel(answer, chunk_delay=0.001)


async def _turn(turns: ResumableTurns, conversation: Conversation, question: str) -> None:
    await turns.start("c", ui_message_stream(conversation.stream(question)))


async def test_resumable_turns_refuse_a_rejected_turn_with_its_own_error() -> None:
    gate = anyio.Event()
    started: list[str] = []
    store = InMemoryStore()
    model = _slow_model(started, gate)
    with anyio.fail_after(10):
        async with ResumableTurns() as turns:
            await _turn(turns, Conversation(model, store, "c", on_overlap="reject"), "first")
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(TurnInProgressError) as refused:
                await _turn(turns, Conversation(model, store, "c", on_overlap="reject"), "2nd")
            assert "conversation 'c'" in str(refused.value)  # the Middleware's error
            assert started == ["first"]  # refused before the model was called
            gate.set()
    assert [m.text for m in await store.read("c")] == ["first", "answer to first"]


async def _read_into(turns: ResumableTurns, out: list[bytes]) -> None:
    out.extend([data async for data in turns.stream("c")])


async def test_resumable_turns_let_a_waiting_turn_run_after_the_running_one() -> None:
    gate = anyio.Event()
    started: list[str] = []
    store = InMemoryStore()
    model = _slow_model(started, gate)
    one: list[bytes] = []
    with anyio.fail_after(10):
        async with ResumableTurns() as turns:
            await _turn(turns, Conversation(model, store, "c", on_overlap="wait"), "first")
            async with anyio.create_task_group() as group:
                group.start_soon(_read_into, turns, one)  # a reader of the first turn
                await anyio.wait_all_tasks_blocked()
                group.start_soon(
                    _turn, turns, Conversation(model, store, "c", on_overlap="wait"), "second"
                )
                await anyio.wait_all_tasks_blocked()
                assert started == ["first"]  # the second waits for the lease
                gate.set()
            two = b"".join([data async for data in turns.stream("c")])
    first = b"".join(one)
    assert first.count(b'"type":"start"') == two.count(b'"type":"start"') == 1
    assert b'"type":"finish"' in first and b'"type":"finish"' in two
    assert b'"type":"error"' not in first + two
    stored = [m.text for m in await store.read("c")]
    assert stored == ["first", "answer to first", "second", "answer to second"]


async def test_resumable_turns_let_an_interrupting_turn_take_over() -> None:
    started: list[str] = []
    store = InMemoryStore()
    model = _slow_model(started, anyio.Event())  # the first never finishes by itself
    one: list[bytes] = []
    with anyio.fail_after(10):
        async with ResumableTurns() as turns:
            await _turn(turns, Conversation(model, store, "c", on_overlap="interrupt"), "first")
            async with anyio.create_task_group() as group:
                group.start_soon(_read_into, turns, one)  # a reader of the first turn
                await anyio.wait_all_tasks_blocked()
                await _turn(
                    turns, Conversation(model, store, "c", on_overlap="interrupt"), "second"
                )
            two = b"".join([data async for data in turns.stream("c")])
    first = b"".join(one)
    # Stopped on purpose, not failed: the AI SDK's abort part, with the reason.
    assert b'{"type":"abort","reason":"the answer failed (TurnInterruptedError)"}' in first
    assert first.endswith(b"data: [DONE]\n\n") and b'"type":"error"' not in first
    assert b"answer to" not in first  # the first turn's reader never sees the second turn
    assert first.startswith(b'id: 1\ndata: {"type":"start"')
    assert b'"type":"finish"' in two and b'"type":"error"' not in two
    assert started == ["first", "second"]
    stored = [m.text for m in await store.read("c")]
    assert stored == ["second", "answer to second"]


async def test_start_checks_its_arguments() -> None:
    async with ResumableTurns() as turns:
        with pytest.raises(TypeError, match="turn_id must be a non-empty str"):
            await turns.start("", ui_message_stream(scripted("text")))
        with pytest.raises(TypeError, match="frames must be an async iterator"):
            await turns.start("t", [b"data: x\n\n"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="handover_timeout"):
        ResumableTurns(handover_timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handover_timeout"):
        ResumableTurns(handover_timeout=-1)


# ------------------------------------------------------------- shutdown: the drain


def _sse(body: bytes) -> list[Any]:
    """The ``data:`` payloads of SSE bytes, decoded (``[DONE]`` kept as the string)."""
    found = re.findall(rb"^data: (.*)$", body, re.MULTILINE)
    return [d.decode() if d == b"[DONE]" else orjson.loads(d) for d in found]


async def _first_delta(turns: ResumableTurns) -> None:
    """Read turn ``c`` until its first text delta (the model is answering)."""
    reader = turns.stream("c")
    async with contextlib.aclosing(reader):  # type: ignore[type-var]
        async for data in reader:
            if b'"type":"text-delta"' in data:
                return


@pytest.mark.parametrize("keep", [True, False])
async def test_shutdown_stops_a_turn_still_running_after_the_grace_period(
    keep: bool, log: TurnLog
) -> None:
    store = InMemoryStore()
    conversation = Conversation(_gated_model(anyio.Event()), store, "c", keep_interrupted=keep)
    with anyio.fail_after(10):
        async with ResumableTurns(log) as turns:
            await turns.start("c", ui_message_stream(conversation.stream("hi")))
            await _first_delta(turns)
            await turns.shutdown(0)  # returns once the turn's log has ended
            body = b"".join([data async for data in turns.stream("c")])
    events = _sse(body)
    assert events[-2:] == [{"type": "error", "errorText": SHUTDOWN_TEXT}, "[DONE]"]
    assert body.count(b"[DONE]") == 1 and b'"type":"finish"' not in body
    stored = await store.read("c")
    if not keep:
        assert stored == []
        return
    assert [m.text for m in stored] == ["hi", "first "]
    assert stored[-1].metadata.decode("scope/interrupted") == "cancelled"


async def test_shutdown_stops_an_agui_run_with_run_error() -> None:
    store = InMemoryStore()
    conversation = Conversation(_gated_model(anyio.Event()), store, "c")
    with anyio.fail_after(10):
        async with ResumableTurns(shutdown_grace=0) as turns:
            frames = agui_events(conversation.stream("hi"), thread_id="c", run_id="r")
            await turns.start("c", frames)
            reader = turns.stream("c")
            async with contextlib.aclosing(reader):  # type: ignore[type-var]
                async for data in reader:
                    if b'"TEXT_MESSAGE_CONTENT"' in data:
                        break
        # Leaving ``async with`` drained: shutdown_grace=0 stopped the turn.
        events = _sse(b"".join([data async for data in turns.stream("c")]))
    assert events[-1] == {"type": "RUN_ERROR", "message": SHUTDOWN_TEXT}
    assert not any(e["type"] == "RUN_FINISHED" for e in events)
    assert await store.read("c") == []


async def test_a_turn_that_ends_within_the_grace_period_ends_as_usual() -> None:
    gate = anyio.Event()
    store = InMemoryStore()
    started: list[str] = []
    later = _slow_model(started)
    with anyio.fail_after(10):
        async with ResumableTurns() as turns:
            conversation = Conversation(_gated_model(gate), store, "c")
            await turns.start("c", ui_message_stream(conversation.stream("hi")))
            await _first_delta(turns)
            async with anyio.create_task_group() as group:
                group.start_soon(turns.shutdown, 3600)
                await anyio.wait_all_tasks_blocked()
                # Shutting down: a new turn is refused, its frames closed unread.
                with pytest.raises(RuntimeError, match="shutting down"):
                    await _turn(turns, Conversation(later, store, "d"), "later")
                gate.set()  # the running turn ends within the grace period
            body = b"".join([data async for data in turns.stream("c")])
    events = _sse(body)
    assert events[-2]["type"] == "finish" and events[-1] == "[DONE]"
    assert SHUTDOWN_TEXT.encode() not in body
    assert started == []  # the refused turn's model was never called
    assert [m.text for m in await store.read("c")] == ["hi", "first second"]
    assert await store.read("d") == []


async def test_a_drain_cancelled_from_outside_stops_every_turn() -> None:
    store = InMemoryStore()
    conversation = Conversation(_gated_model(anyio.Event()), store, "c")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            with anyio.CancelScope() as outer:
                async with ResumableTurns(shutdown_grace=3600) as turns:
                    await turns.start("c", ui_message_stream(conversation.stream("hi")))
                    await _first_delta(turns)

                    async def cancel_the_drain() -> None:
                        await anyio.wait_all_tasks_blocked()  # leaving: the drain waits
                        outer.cancel()

                    group.start_soon(cancel_the_drain)
        assert outer.cancelled_caught
        body = b"".join([data async for data in turns.stream("c")])  # its log ended
    assert b'"type":"finish"' not in body
    assert await store.read("c") == []


async def test_shutdown_checks_its_grace() -> None:
    with pytest.raises(TypeError, match="shutdown_grace"):
        ResumableTurns(shutdown_grace="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shutdown_grace"):
        ResumableTurns(shutdown_grace=-1)
    async with ResumableTurns() as turns:
        with pytest.raises(ValueError, match="grace"):
            await turns.shutdown(float("inf"))
        await turns.shutdown(0)  # nothing runs: returns at once
        await turns.shutdown()  # again: nothing to do
        with pytest.raises(RuntimeError, match="shutting down"):
            await turns.start("t", ui_message_stream(scripted("text")))
    async with turns:  # entered again after the drain: it takes turns again
        await turns.start("t", ui_message_stream(scripted("text")))
    body = b"".join([data async for data in turns.stream("t")])
    assert b'"type":"finish"' in body


async def test_frames_split_anywhere_are_logged_one_event_per_entry() -> None:
    async with ResumableTurns() as turns:
        await turns.start("t", split_writes(ui_message_stream(scripted("text")), size=7))
        served = [data async for data in turns.stream("t")]
    direct = await _collect(ui_message_stream(scripted("text")))
    assert b"".join(re.sub(rb"^id: \S+\n", b"", data) for data in served) == direct
    assert all(re.match(rb"id: \S+\ndata: [^\n]*\n\n$", data) for data in served)


# ------------------------------------------------------ RedisTurnLog: one opener wins


async def test_redis_turn_log_open_has_one_winner_across_two_clients(
    anyio_backend: str,
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("redis-py's asyncio client runs under asyncio only")
    url = redis_url_or_skip()
    aioredis = import_driver("redis.asyncio")
    clients = [aioredis.Redis.from_url(url), aioredis.Redis.from_url(url)]
    prefix = unique_key_prefix()
    logs = [RedisTurnLog(client, prefix=prefix) for client in clients]
    try:
        for round_ in range(5):
            turn = f"race-{round_}"
            won: list[int] = []
            refused: list[TurnInProgressError] = []

            async def open_(
                index: int,
                turn: str = turn,
                won: list[int] = won,
                refused: list[TurnInProgressError] = refused,
            ) -> None:
                try:
                    await logs[index % 2].open(turn)
                except TurnInProgressError as exc:
                    refused.append(exc)
                else:
                    won.append(index)

            async with anyio.create_task_group() as group:
                for index in range(24):
                    group.start_soon(open_, index)
            assert len(won) == 1 and len(refused) == 23
            assert {error.conversation_id for error in refused} == {turn}
            winner = logs[won[0] % 2]
            event = await winner.append(turn, b"data: x\n\n")
            await winner.end(turn)
            assert await _read(logs[(won[0] + 1) % 2], turn) == [(event, b"data: x\n\n")]
            await logs[1].open(turn)  # an ended turn opens again, from either client
            with pytest.raises(TurnInProgressError):
                await logs[0].open(turn)
    finally:
        keys = [key async for key in clients[0].scan_iter(match=f"{prefix}:*")]
        if keys:
            await clients[0].delete(*keys)
        for client in clients:
            await client.aclose()


def test_redis_turn_log_needs_a_redis_client() -> None:
    with pytest.raises(TypeError, match=r"client must be a redis\.asyncio"):
        RedisTurnLog(object())


async def test_a_stream_failing_before_its_first_item_still_starts() -> None:
    data = await _collect(ui_message_stream(_items(ProviderServerError("x"))))
    assert _parts(data) == [
        {"type": "start"},
        {"type": "error", "errorText": "the answer failed (ProviderServerError)"},
        "[DONE]",
    ]
    events = _parts(
        await _collect(agui_events(_items(ProviderServerError("x")), thread_id="t", run_id="r"))
    )
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    # an item that fails half way leaves nothing of itself, the earlier items stay
    bad = [
        Response(metadata=ResponseMetadata(id="x")),
        chunk("a", finish=FinishReason.STOP),
        chunk("b"),
    ]
    parts = _parts(await _collect(ui_message_stream(_items(*bad))))
    assert [p if isinstance(p, str) else p["type"] for p in parts] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "error",
        "[DONE]",
    ]


# ------------------------------------------------------------------ erasing turn logs


async def test_log_erase_deletes_the_turn(log: TurnLog) -> None:
    await log.open("t")
    await log.append("t", b"e0")
    await log.end("t")
    await log.open("other")
    await log.append("other", b"kept")
    await log.end("other")
    await log.erase("t")  # type: ignore[attr-defined]
    with pytest.raises(TurnLogError, match="unknown or expired"):
        await _read(log, "t")
    assert [data for _, data in await _read(log, "other")] == [b"kept"]
    await log.erase("never-opened")  # type: ignore[attr-defined]
    await log.open("t")  # a new turn of the erased id starts afresh
    await log.append("t", b"new")
    await log.end("t")
    assert [data for _, data in await _read(log, "t")] == [b"new"]


async def test_redis_log_erase_leaves_no_key(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("redis-py's asyncio client runs under asyncio only")
    url = redis_url_or_skip()
    aioredis = import_driver("redis.asyncio")
    client = aioredis.Redis.from_url(url)
    prefix = unique_key_prefix()
    try:
        log = RedisTurnLog(client, prefix=prefix)
        await log.open("c")
        await log.append("c", b"secret words")
        await log.end("c")
        assert [key async for key in client.scan_iter(match=f"{prefix}:*")] != []
        await log.erase("c")
        assert [key async for key in client.scan_iter(match=f"{prefix}:*")] == []
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_resumable_turns_erase_stops_a_running_turn_and_deletes_its_log(
    log: TurnLog,
) -> None:
    gate = anyio.Event()
    store = InMemoryStore()
    conversation = Conversation(_gated_model(gate), store, "c")
    with anyio.fail_after(10):
        async with ResumableTurns(log) as turns:
            await turns.start("c", ui_message_stream(conversation.stream("hi")))
            reader = turns.stream("c")
            await anext(reader)
            await reader.aclose()
            await turns.erase("c")
            with pytest.raises(TurnLogError):
                await _collect(turns.stream("c"))
    assert await store.read("c") == []  # the running turn was stopped, nothing stored


async def test_resumable_turns_follow_erase_owner_and_stop_a_running_turn(log: TurnLog) -> None:
    # DESIGN §6n: after erase_owner, no copy of the erased chats is served or stored.
    gate = anyio.Event()
    store = InMemoryStore()
    for cid in ("chat-a", "chat-b", "chat-c"):
        first = Batch(cid, "t0", [user_message("q0"), assistant_message("a0")])
        await store.append(first, owner="bob" if cid == "chat-c" else "alice")
    running = Conversation(_gated_model(gate), store, "chat-a")
    kept = Conversation(_gated_model(gate), store, "chat-c")
    with anyio.fail_after(10):
        async with ResumableTurns(log) as turns:
            await turns.start("chat-a", ui_message_stream(running.stream("hi")))
            await turns.start("chat-c", ui_message_stream(kept.stream("hi")))
            reader = turns.stream("chat-a")
            seen = b""
            while b"first" not in seen:  # the turn is answering (held at the gate)
                seen += await anext(reader)
            await reader.aclose()
            receipts = await erase_owner(store, "alice")
            assert sorted(str(r.conversation_id) for r in receipts) == ["chat-a", "chat-b"]
            await turns.erased(receipts)
            with pytest.raises(TurnLogError):
                await _collect(turns.stream("chat-a"))
            gate.set()  # bob's turn goes on, and is stored
            assert b"second" in await _collect(turns.stream("chat-c"))
    # The running turn was stopped: nothing of it stored, the tombstone proves it.
    for receipt in receipts:
        assert await store.check_erased(receipt) == []
        assert await store.read(str(receipt.conversation_id)) == []
        # The id is handed over in memory only: never in the receipt's JSON or repr.
        assert str(receipt.conversation_id).encode() not in receipt.to_json()
        assert str(receipt.conversation_id) not in repr(receipt)
    assert [m.text for m in await store.read("chat-c")] == ["q0", "a0", "hi", "first second"]


async def test_resumable_turns_erased_checks_every_receipt_first() -> None:
    store = InMemoryStore()
    await store.append(Batch("c", "t0", [user_message("q"), assistant_message("a")]))
    receipt = await erase(store, "c")
    assert receipt.conversation_id == "c"
    read_back = ErasureReceipt.from_json(receipt.to_json())
    assert read_back == receipt and read_back.conversation_id is None
    erased: list[str] = []
    turns = ResumableTurns()
    original = turns.erase

    async def recording(turn_id: str) -> None:
        erased.append(turn_id)
        await original(turn_id)

    turns.erase = recording  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=r"receipts\[1\] names no conversation"):
        await turns.erased([receipt, read_back])
    with pytest.raises(TypeError, match=r"receipts\[1\] must be an ErasureReceipt, got str"):
        await turns.erased([receipt, "c"])  # type: ignore[list-item]
    assert erased == []  # nothing touched before every receipt passed
    await turns.erased([receipt, receipt])
    assert erased == ["c"]


async def test_resumable_turns_erase_needs_a_log_that_erases() -> None:
    class NoErase:
        async def open(self, turn_id: str) -> None: ...
        async def append(self, turn_id: str, data: bytes) -> str:
            return "1"

        async def end(self, turn_id: str) -> None: ...
        def events(self, turn_id: str, after: str | None = None) -> Any:
            raise NotImplementedError

    turns = ResumableTurns(NoErase())
    with pytest.raises(TypeError, match="has no erase"):
        await turns.erase("c")
    with pytest.raises(TypeError, match="turn_id"):
        await ResumableTurns().erase("")
