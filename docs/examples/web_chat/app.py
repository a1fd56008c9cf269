"""A chat service that streams answers to browsers with scope.web.

Run it (Starlette and uvicorn are the example's own dependencies, not scope's):

    pip install scope-chat starlette uvicorn
    python docs/examples/web_chat/app.py            # http://127.0.0.1:8000

With ``OPENAI_API_KEY`` set it talks to OpenAI (``OPENAI_MODEL``, default
gpt-4o-mini); without, a ``FunctionModel`` answers (it echoes the question, streamed
in small pieces), so the page works offline.

Routes:
- ``GET /``: the page (``index.html``): it posts like the AI SDK's
  ``DefaultChatTransport`` and renders the UI message stream.
- ``POST /api/chat``: the AI SDK's chat request -> UI message stream: a new message,
  an edited one (``sendMessage({messageId})``) or a regenerated answer
  (``regenerate()``), each a turn of the chat's ``Conversation`` (``ui_turn``).
- ``GET /api/chat/{chat_id}/stream``: the AI SDK's resume request (``useChat({resume:
  true})``), or any reconnect with ``Last-Event-ID``: the rest of the running turn;
  204 when none runs.
- ``POST /api/agui``: AG-UI's ``RunAgentInput`` -> AG-UI events (``HttpAgent``); a run
  whose earlier messages are not the stored thread is a 409, or an edit with
  ``on_divergence="edit"`` (``agui_turn``);
  ``GET /api/agui/{thread_id}/stream`` with ``Last-Event-ID``: the rest of the run.

Each chat (the AI SDK's chat id, AG-UI's thread id) is one ``Conversation`` over the
store, which owns the history: a request contributes only its new user message. With
``create_app``'s ``tools``, a call of one that waits for approval ends the turn's
stream, and the client's decision is the next request, a turn of its own.
Turns run apart from the requests (``ResumableTurns``): a client that disconnects can
come back for the rest, and the turn is stored once either way. A request posted again
(the same message id) is never stored twice: it streams the stored answer (no model
call), or is a 409 while the first one's turn still runs.

Errors: a malformed request is a 4xx, never a 500 — 415 for a body that is not JSON
by its content type, 413 for one over ``max_body`` bytes, 400 for every
``InvalidRequestError`` (the body, the message, the ids, the trigger: scope.web's one
error rule), 409 (``TurnInProgressError``) for a second turn of a chat whose turn
still runs, 409 (``HistoryDivergedError``) for a request whose copy of the chat is not
the stored one (an edit or regenerate naming a message the chat does not hold), 409
(``NotPendingError``) for a tool approval or an AG-UI resume naming a call that does not
wait for one, 410
(``ConversationClosedError``) for a chat that was cleared, erased or expired. A
failure during a turn reaches the client as the protocol's error event and is logged
on the ``scope.web`` logger.

Shutdown (SIGTERM, Ctrl-C): ``serve`` stops taking connections and drains at once —
running turns get ``shutdown_grace`` seconds (default 10) to end, then they are stopped
(stored as ``keep_interrupted`` says) and their readers get the protocol's error event;
then the process exits.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from scope.chat import Model, Streamer
from scope.chat import Request as ChatRequest
from scope.conversation import Conversation
from scope.errors import (
    ConversationClosedError,
    HistoryDivergedError,
    InvalidRequestError,
    NotPendingError,
    TurnInProgressError,
    TurnLogError,
)
from scope.history import ReadWriter
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel
from scope.tools import Tool
from scope.web import (
    AGUI_HEADERS,
    UI_MESSAGE_STREAM_HEADERS,
    ResumableTurns,
    TurnLog,
    agui_events,
    agui_turn,
    chat_request_from_ui,
    run_input_from_agui,
    ui_message_stream,
    ui_turn,
)

PAGE = pathlib.Path(__file__).with_name("index.html")
#: The largest request body the service reads (bytes).
MAX_BODY = 1_000_000


class _BadBody(Exception):
    """A request body the service does not read: ``status`` and why."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


async def _json_body(request: Request, limit: int) -> bytes:
    """The body of a JSON request, at most ``limit`` bytes (read no further)."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise _BadBody(415, f"the request body must be application/json, got {kind or 'none'!r}")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _BadBody(413, f"the request body is larger than {limit} bytes")
    return bytes(body)


def create_app(
    model: Model | Streamer,
    store: ReadWriter,
    *,
    log: TurnLog | None = None,
    on_overlap: Literal["fence", "reject", "wait", "interrupt"] = "reject",
    on_divergence: Literal["refuse", "edit"] = "refuse",
    keep_interrupted: bool = False,
    shutdown_grace: float = 10.0,
    max_body: int = MAX_BODY,
    output: type | None = None,
    reset_step: bool = False,
    tools: Sequence[Tool[..., Any]] = (),
) -> Starlette:
    """The service: ``model`` answers, ``store`` keeps every chat's history, ``log``
    keeps running turns' events (default in memory; ``RedisTurnLog`` for several
    processes), ``on_overlap`` says what a second message does while a chat's turn
    runs (``"reject"``: 409 before any model call; ``"wait"``: it runs after;
    ``"interrupt"``: it stops the running turn and runs), ``on_divergence`` what an
    AG-UI run whose client dropped stored turns is (``"refuse"``: 409; ``"edit"``: an
    edit of the first turn it dropped), ``keep_interrupted`` whether a stopped turn
    keeps what it had said, ``shutdown_grace`` how long running turns may go on once
    the service shuts down (``serve``). ``output``: a type the AI SDK chat's answers
    decode into (``ui_turn(..., output=)``: an answer that does not is sent back once);
    ``reset_step``: show only the answer that decoded, for clients on ``ai`` 7.0.70 or
    later (``ui_message_stream(..., reset_step=True)``; ``ai`` 6 rejects the part).
    ``tools``: the chats' tools; one with ``requires_approval`` makes a turn wait, and
    the client's decision is a turn of its own (``ui_turn``/``agui_turn``), run and
    resumable like any other."""
    turns = ResumableTurns(log, shutdown_grace=shutdown_grace)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with turns:  # on the way out: the drain (turns.shutdown())
            yield

    def conversation(chat_id: str) -> Conversation:
        return Conversation(
            model,
            store,
            chat_id,
            tools=tools,
            on_overlap=on_overlap,
            keep_interrupted=keep_interrupted,
        )

    async def sse(turn_id: str, last_event_id: str | None, headers: Any) -> Response:
        stream = turns.stream(turn_id, last_event_id)
        try:
            first = await anext(stream)  # TurnLogError surfaces before the response starts
        except (TurnLogError, StopAsyncIteration):
            await stream.aclose()
            return Response(status_code=204)

        async def body() -> AsyncIterator[bytes]:
            async with contextlib.aclosing(stream):
                yield first
                async for data in stream:
                    yield data

        return StreamingResponse(body(), headers=dict(headers))

    async def chat(request: Request) -> Response:
        try:
            asked = chat_request_from_ui(await _json_body(request, max_body))
        except _BadBody as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        try:  # a new message, an edit or a regenerate: what the request asks for
            events = await ui_turn(conversation(asked.chat_id), asked, output=output)
        except HistoryDivergedError as exc:  # it names a message the chat does not hold
            return PlainTextResponse(str(exc), status_code=409)
        except NotPendingError as exc:  # a tool approval for a call that does not wait
            return PlainTextResponse(str(exc), status_code=409)
        except ConversationClosedError as exc:  # cleared, erased or expired
            return PlainTextResponse(str(exc), status_code=410)
        # The answer to a tool approval continues the assistant message the client holds:
        # it keeps that message's id (a new one would make the client start another).
        message_id = asked.message_id if asked.approvals else uuid.uuid4().hex
        frames = ui_message_stream(events, message_id=message_id, reset_step=reset_step)
        try:
            await turns.start(asked.chat_id, frames)
        except TurnInProgressError as exc:  # a turn of this chat is still running
            return PlainTextResponse(str(exc), status_code=409)
        except RuntimeError as exc:  # the service is shutting down (turns.shutdown())
            return PlainTextResponse(str(exc), status_code=503)
        return await sse(asked.chat_id, None, UI_MESSAGE_STREAM_HEADERS)

    async def resume(request: Request) -> Response:
        return await sse(
            request.path_params["chat_id"],
            request.headers.get("last-event-id"),
            UI_MESSAGE_STREAM_HEADERS,
        )

    async def agui_resume(request: Request) -> Response:
        return await sse(
            request.path_params["thread_id"], request.headers.get("last-event-id"), AGUI_HEADERS
        )

    async def agui(request: Request) -> Response:
        try:
            run = run_input_from_agui(await _json_body(request, max_body))
        except _BadBody as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        try:
            events = await agui_turn(conversation(run.thread_id), run, on_divergence=on_divergence)
        except HistoryDivergedError as exc:  # the client's thread is not the stored one
            return PlainTextResponse(str(exc), status_code=409)
        except NotPendingError as exc:  # a resume for a call that does not wait
            return PlainTextResponse(str(exc), status_code=409)
        except ConversationClosedError as exc:
            return PlainTextResponse(str(exc), status_code=410)
        frames = agui_events(events, thread_id=run.thread_id, run_id=run.run_id)
        try:
            await turns.start(run.thread_id, frames)
        except TurnInProgressError as exc:
            return PlainTextResponse(str(exc), status_code=409)
        except RuntimeError as exc:
            return PlainTextResponse(str(exc), status_code=503)
        return await sse(run.thread_id, request.headers.get("last-event-id"), AGUI_HEADERS)

    async def page(request: Request) -> Response:
        return FileResponse(PAGE)

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/api/chat", chat, methods=["POST"]),
            Route("/api/chat/{chat_id}/stream", resume),
            Route("/api/agui", agui, methods=["POST"]),
            Route("/api/agui/{thread_id}/stream", agui_resume),
        ],
        lifespan=lifespan,
    )
    app.state.turns = turns
    return app


async def serve(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Run ``app`` (``create_app``) under uvicorn until SIGINT or SIGTERM, then drain.

    uvicorn waits for open responses before it ends the app's lifespan, and a turn's
    stream stays open while the turn runs, so leaving ``async with turns`` alone would
    wait for every running turn, however long. Here the drain starts with the
    shutdown: uvicorn stops accepting connections while ``turns.shutdown()`` lets
    running turns go on for ``shutdown_grace`` seconds and then stops the rest (their
    readers get the protocol's error event, their responses end), so the process exits
    within about the grace period (plus a stopped turn's ``keep_interrupted`` write).
    ``sockets``: already bound listening sockets to serve on instead of ``host:port``.
    Run it in the main thread (uvicorn handles the signals there), e.g.
    ``anyio.run(serve, app)``.
    """
    import uvicorn

    turns: ResumableTurns = app.state.turns

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            async with anyio.create_task_group() as group:
                group.start_soon(turns.shutdown)  # the drain, alongside uvicorn's own
                await super().shutdown(sockets)

    config = uvicorn.Config(app, host=host, port=port, lifespan="on")
    await DrainingServer(config).serve(sockets=sockets)


def offline_answer(request: ChatRequest) -> str:
    """What the offline model says: it answers the question it was asked."""
    question = request.messages[-1].text.strip() or "(no text)"
    return (
        f"Hello from scope! You wrote: {question}. This answer was streamed to your "
        "browser, piece by piece."
    )


def _model() -> Model | Streamer:
    if os.environ.get("OPENAI_API_KEY"):
        from scope.models.openai import OpenAIChatModel

        return OpenAIChatModel(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return FunctionModel(offline_answer, chunk_delay=0.02)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO)  # scope.web logs failed turns
    anyio.run(serve, create_app(_model(), InMemoryStore()))
