"""A chat service that streams answers to browsers with scope.web.

Run it (Starlette and uvicorn are the example's own dependencies, not scope's):

    pip install scope-chat starlette uvicorn
    python docs/examples/web_chat/app.py            # http://127.0.0.1:8000

With ``OPENAI_API_KEY`` set it talks to OpenAI (``OPENAI_MODEL``, default
gpt-4o-mini); without, a scripted model answers, so the page works offline.

Routes:
- ``GET /``: the page (``index.html``): it posts like the AI SDK's
  ``DefaultChatTransport`` and renders the UI message stream.
- ``POST /api/chat``: the AI SDK's chat request -> UI message stream.
- ``GET /api/chat/{chat_id}/stream``: the AI SDK's resume request (``useChat({resume:
  true})``), or any reconnect with ``Last-Event-ID``: the rest of the running turn;
  204 when none runs.
- ``POST /api/agui``: AG-UI's ``RunAgentInput`` -> AG-UI events (``HttpAgent``);
  ``GET /api/agui/{thread_id}/stream`` with ``Last-Event-ID``: the rest of the run.

Each chat (the AI SDK's chat id, AG-UI's thread id) is one ``Conversation`` over the
store, which owns the history: a request contributes only its new user message.
Turns run apart from the requests (``ResumableTurns``): a client that disconnects can
come back for the rest, and the turn is stored once either way.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from scope.chat import FinishReason, Model, Output, Streamer, assistant_message
from scope.chat import Response as ChatResponse
from scope.conversation import Conversation
from scope.errors import InvalidRequestError, TurnLogError
from scope.history import ReadWriter
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.web import (
    AGUI_HEADERS,
    UI_MESSAGE_STREAM_HEADERS,
    ResumableTurns,
    TurnLog,
    agui_events,
    ui_message_stream,
    user_message_from_agui,
    user_message_from_ui,
)

PAGE = pathlib.Path(__file__).with_name("index.html")


def create_app(
    model: Model | Streamer, store: ReadWriter, *, log: TurnLog | None = None
) -> Starlette:
    """The service: ``model`` answers, ``store`` keeps every chat's history, ``log``
    keeps running turns' events (default in memory; ``RedisTurnLog`` for several
    processes)."""
    turns = ResumableTurns(log)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with turns:  # running turns finish before the server stops
            yield

    def conversation(chat_id: str) -> Conversation:
        return Conversation(model, store, chat_id)

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
        body = await request.body()
        try:
            message = user_message_from_ui(body)
            chat_id = orjson.loads(body).get("id")
            if not isinstance(chat_id, str) or not chat_id:
                raise InvalidRequestError("the request body's id must be a non-empty string")
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        frames = ui_message_stream(
            conversation(chat_id).stream(message), message_id=uuid.uuid4().hex
        )
        try:
            await turns.start(chat_id, frames)
        except ValueError as exc:  # a turn of this chat is still running
            return PlainTextResponse(str(exc), status_code=409)
        return await sse(chat_id, None, UI_MESSAGE_STREAM_HEADERS)

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
        body = await request.body()
        try:
            message = user_message_from_agui(body)
            run = orjson.loads(body)
            thread_id, run_id = run.get("threadId"), run.get("runId")
            if not (
                isinstance(thread_id, str) and thread_id and isinstance(run_id, str) and run_id
            ):
                raise InvalidRequestError("threadId and runId must be non-empty strings")
        except InvalidRequestError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        frames = agui_events(
            conversation(thread_id).stream(message), thread_id=thread_id, run_id=run_id
        )
        try:
            await turns.start(thread_id, frames)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=409)
        return await sse(thread_id, request.headers.get("last-event-id"), AGUI_HEADERS)

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


def _model() -> Model | Streamer:
    if os.environ.get("OPENAI_API_KEY"):
        from scope.models.openai import OpenAIChatModel

        return OpenAIChatModel(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    answer = "Hello from scope! This answer was streamed to your browser, word by word."
    return ScriptedModel(
        *[ChatResponse(Output(assistant_message(answer), FinishReason.STOP))] * 100
    )


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(create_app(_model(), InMemoryStore()), host="127.0.0.1", port=8000)
