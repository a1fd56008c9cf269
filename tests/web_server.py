"""Scripted streams and a live HTTP server for the scope.web tests.

``SCENARIOS`` are the streams every client must accept (DESIGN §9's acceptance list);
``scenario_app()`` serves each one under ``/ui/{name}`` (AI SDK UI message stream) and
``/agui/{name}`` (AG-UI), cutting every write into 5-byte pieces so multi-byte
characters arrive split, and under ``/ui-retry`` a turn whose structured answer is sent
back once (``output_retries``), with ``reset-step`` when the query says ``reset=1``.
``approval_app(store)`` serves ``/api/chat`` and ``/api/agui``: a chat whose model asks
to refund an order with a tool that waits for approval (``ui_turn``/``agui_turn`` and
their encoders, approvals included). ``live_server(app)`` runs an ASGI app on a
loopback port in a thread (uvicorn) for the Node and Chromium clients.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import orjson

from scope.chat import (
    FinishReason,
    Output,
    Response,
    Role,
    assistant_message,
    media_part,
    native_part,
    reasoning_part,
    text_part,
    tool_call_delta_part,
    tool_call_part,
)
from scope.chat import Request as ModelRequest
from scope.conversation import Conversation
from scope.errors import (
    HistoryError,
    InvalidRequestError,
    ProviderServerError,
    TurnInterruptedError,
)
from scope.history.inmemory import InMemoryStore
from scope.media import Media
from scope.testing import FunctionModel
from scope.tools import tool
from scope.web import (
    AGUI_HEADERS,
    UI_MESSAGE_STREAM_HEADERS,
    agui_events,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    ui_turn,
    user_message_from_agui,
    user_message_from_ui,
)


def chunk(*parts: Any, finish: FinishReason | None = None) -> Response:
    message = assistant_message(*parts) if parts else None
    return Response(Output(message, finish))


def _delta(call_id: str, name: str, args: str) -> Any:
    return tool_call_delta_part(call_id, name, args)


TEXT = ["Hé", "llo, wö", "rld 👋", " 日本", "語", " ✓"]

#: name -> (chunks, an exception raised after them or None)
SCENARIOS: dict[str, tuple[list[Response], Exception | None]] = {
    "text": ([*(chunk(t) for t in TEXT), chunk(finish=FinishReason.STOP)], None),
    "reasoning": (
        [
            chunk(reasoning_part("Let me ")),
            chunk(reasoning_part("think… ☕")),
            chunk(text_part("Answer: ")),
            chunk(text_part("42"), finish=FinishReason.STOP),
        ],
        None,
    ),
    "tool": (
        [
            chunk(text_part("Checking.")),
            chunk(_delta("call_1", "get_weather", '{"ci')),
            chunk(_delta("call_1", "get_weather", 'ty": "Zür')),
            chunk(_delta("call_1", "get_weather", 'ich"}')),
            chunk(finish=FinishReason.TOOL_CALLS),
        ],
        None,
    ),
    "parallel": (
        [
            chunk(_delta("call_a", "lookup", '{"q": ')),
            chunk(_delta("call_b", "search", '{"term"')),
            chunk(_delta("call_a", "lookup", '"ä"}')),
            chunk(_delta("call_b", "search", ': "β", "n": 2}'), finish=FinishReason.TOOL_CALLS),
        ],
        None,
    ),
    "error": ([chunk("Partial ans"), chunk("wer…")], ProviderServerError("upstream 503")),
    "empty": ([chunk(finish=FinishReason.STOP)], None),
    # A page a built-in search read (INVENTED, the Responses API's shape) and an image:
    # source-url and file parts (AG-UI: a CUSTOM source event, no media).
    "sources": (
        [
            chunk(
                native_part(
                    "openai.responses",
                    "web_search_call",
                    {
                        "type": "web_search_call",
                        "id": "ws_1",
                        "status": "completed",
                        "action": {
                            "type": "search",
                            "query": "zürich",
                            "sources": [{"type": "url", "url": "https://example.org/zürich"}],
                        },
                    },
                )
            ),
            chunk(media_part(Media.from_bytes("image/png", b"\x89PNG"))),
            chunk(text_part("Sunny."), finish=FinishReason.STOP),
            # After the last part (as a Responses stream sends a text's annotations):
            # a file the answer cites, a source-document part. INVENTED file id.
            Response(
                Output(
                    message_metadata={
                        "openai/annotations": {
                            "msg_1": [
                                [
                                    {
                                        "type": "file_citation",
                                        "file_id": "file-1",
                                        "filename": "zürich-notes.txt",
                                        "index": 6,
                                    }
                                ]
                            ]
                        }
                    }
                )
            ),
        ],
        None,
    ),
    # Stopped by a newer turn (on_overlap="interrupt"): the AI SDK's abort, not an error.
    "interrupted": (
        [chunk("Partial ans"), chunk("wer…")],
        TurnInterruptedError("a newer turn interrupted it", conversation_id="chat-1"),
    ),
}


async def scripted(name: str) -> AsyncIterator[Response]:
    chunks, error = SCENARIOS[name]
    for item in chunks:
        yield item
    if error is not None:
        raise error


async def split_writes(frames: AsyncIterator[bytes], size: int = 5) -> AsyncIterator[bytes]:
    """Every write cut into ``size``-byte pieces: UTF-8 characters arrive split."""
    async with contextlib.aclosing(frames):  # type: ignore[type-var]
        async for data in frames:
            for start in range(0, len(data), size):
                yield data[start : start + size]


@attrs.frozen
class Forecast:
    city: str
    celsius: int


#: The answers of ``/ui-retry``: the first misses a field, the one sent back decodes.
RETRY_ANSWERS = ('{"city": "Zürich"}', '{"city": "Zürich", "celsius": 21}')


def _forecaster(request: ModelRequest) -> str:
    sent_back = len(request.messages) > 1  # the answer, then the message sending it back
    return RETRY_ANSWERS[1] if sent_back else RETRY_ANSWERS[0]


def scenario_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def ui(request: Request) -> Any:
        try:
            user_message_from_ui(await request.body())
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        stream = ui_message_stream(scripted(request.path_params["name"]), message_id="m-1")
        return StreamingResponse(split_writes(stream), headers=dict(UI_MESSAGE_STREAM_HEADERS))

    async def ui_retry(request: Request) -> Any:
        try:
            asked = chat_request_from_ui(await request.body())
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        conversation = Conversation(FunctionModel(_forecaster), InMemoryStore(), asked.chat_id)
        events = await ui_turn(conversation, asked, output=Forecast)
        reset = request.query_params.get("reset") == "1"
        stream = ui_message_stream(events, message_id="m-1", reset_step=reset)
        return StreamingResponse(split_writes(stream), headers=dict(UI_MESSAGE_STREAM_HEADERS))

    async def agui(request: Request) -> Any:
        body = await request.body()
        try:
            user_message_from_agui(body)
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        run = orjson.loads(body)
        stream = agui_events(
            scripted(request.path_params["name"]),
            thread_id=run["threadId"],
            run_id=run["runId"],
        )
        return StreamingResponse(split_writes(stream), headers=dict(AGUI_HEADERS))

    return Starlette(
        routes=[
            Route("/ui/{name}", ui, methods=["POST"]),
            Route("/ui-retry", ui_retry, methods=["POST"]),
            Route("/agui/{name}", agui, methods=["POST"]),
        ]
    )


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order.

    :param order: the order id
    """
    return f"refunded {order}"


def refunder(request: ModelRequest) -> Response | str:
    """Asks to refund the orders the user names (comma-separated: a call each, in one
    response); then says what the tools answered."""
    last = request.messages[-1]
    if last.role is Role.USER:
        calls = [
            tool_call_part(f"call-{i}", "refund", orjson.dumps({"order": order}).decode())
            for i, order in enumerate(last.text.split(","), 1)
        ]
        return Response(Output(assistant_message(*calls), FinishReason.TOOL_CALLS))
    return "; ".join(
        f"{'failed' if result.is_error else 'done'}: {result.output.text() or ''}"
        for result in last.tool_results
    )


def approval_app(store: InMemoryStore) -> Any:
    """``POST /api/chat``: the chat ``refunder`` answers, its refund waiting for approval;
    a refused request is a 400 (``InvalidRequestError``) or a 409 (``HistoryError``:
    a decision on a call that does not wait, a diverged chat)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def chat(request: Request) -> Any:
        try:
            asked = chat_request_from_ui(await request.body())
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        conversation = Conversation(FunctionModel(refunder), store, asked.chat_id, tools=[refund])
        try:
            events = await ui_turn(conversation, asked)
        except HistoryError as exc:
            return PlainTextResponse(str(exc), status_code=409)
        # A new turn's answer is a new message (its own id); the answer to a decision
        # continues the assistant message the client holds, so it keeps that one's id.
        message_id = asked.message_id if asked.approvals else uuid.uuid4().hex
        stream = ui_message_stream(events, message_id=message_id)
        return StreamingResponse(stream, headers=dict(UI_MESSAGE_STREAM_HEADERS))

    async def agui(request: Request) -> Any:
        try:
            run = run_input_from_agui(await request.body())
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        conversation = Conversation(FunctionModel(refunder), store, run.thread_id, tools=[refund])
        try:
            events = await agui_turn(conversation, run)
        except HistoryError as exc:
            return PlainTextResponse(str(exc), status_code=409)
        stream = agui_events(events, thread_id=str(run.thread_id), run_id=run.run_id)
        return StreamingResponse(stream, headers=dict(AGUI_HEADERS))

    return Starlette(
        routes=[
            Route("/api/chat", chat, methods=["POST"]),
            Route("/api/agui", agui, methods=["POST"]),
        ]
    )


@contextlib.contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        ready = threading.Event()
        for _ in range(1000):  # bounded: 10 s
            if server.started or not thread.is_alive():
                break
            ready.wait(0.01)
        if not server.started:
            raise RuntimeError("the test server did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
