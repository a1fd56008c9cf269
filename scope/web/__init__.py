"""Serving scope streams to browsers (DESIGN §9): the Vercel AI SDK's UI message
stream and AG-UI 1.0 events, their request readers, and resumable turns.

Framework-neutral: the encoders yield SSE bytes and the headers are plain mappings,
so any ASGI app (Starlette, FastAPI, Quart, ...) can return them. The server's store
owns the history: the readers take only the new user message from a request, and
``ui_turn``/``agui_turn`` run what it asks for (a new turn, an edit, a regenerated
answer) on a ``Conversation``, refusing a client whose copy diverged
(``HistoryDivergedError``: a 409).

One error rule: whatever a client can get wrong in a request (the body, the message,
an id, the trigger) raises ``InvalidRequestError`` naming the field, so a service maps
that one type to a 4xx; wrong argument types from the service's own code raise
``TypeError`` before anything is streamed; a failure during a turn becomes the
protocol's error event and is logged on the ``scope.web`` logger.
"""

from scope.errors import HistoryDivergedError as HistoryDivergedError
from scope.errors import TurnLogError as TurnLogError
from scope.web._agui import AGUI_HEADERS as AGUI_HEADERS
from scope.web._agui import AGUIRunInput as AGUIRunInput
from scope.web._agui import agui_events as agui_events
from scope.web._agui import run_input_from_agui as run_input_from_agui
from scope.web._agui import user_message_from_agui as user_message_from_agui
from scope.web._core import EncodedStream as EncodedStream
from scope.web._core import default_error_text as default_error_text
from scope.web._request import CLIENT_MESSAGE_ID_KEY as CLIENT_MESSAGE_ID_KEY
from scope.web._request import ToolApproval as ToolApproval
from scope.web._resume import SHUTDOWN_GRACE as SHUTDOWN_GRACE
from scope.web._resume import SHUTDOWN_TEXT as SHUTDOWN_TEXT
from scope.web._resume import InMemoryTurnLog as InMemoryTurnLog
from scope.web._resume import RedisTurnLog as RedisTurnLog
from scope.web._resume import ResumableTurns as ResumableTurns
from scope.web._resume import TurnLog as TurnLog
from scope.web._turns import agui_turn as agui_turn
from scope.web._turns import ui_turn as ui_turn
from scope.web._ui import UI_MESSAGE_STREAM_HEADERS as UI_MESSAGE_STREAM_HEADERS
from scope.web._ui import UIChatRequest as UIChatRequest
from scope.web._ui import chat_request_from_ui as chat_request_from_ui
from scope.web._ui import ui_message_stream as ui_message_stream
from scope.web._ui import user_message_from_ui as user_message_from_ui

__all__ = [
    "AGUIRunInput",
    "AGUI_HEADERS",
    "CLIENT_MESSAGE_ID_KEY",
    "EncodedStream",
    "HistoryDivergedError",
    "InMemoryTurnLog",
    "RedisTurnLog",
    "ResumableTurns",
    "SHUTDOWN_GRACE",
    "SHUTDOWN_TEXT",
    "ToolApproval",
    "TurnLog",
    "TurnLogError",
    "UIChatRequest",
    "UI_MESSAGE_STREAM_HEADERS",
    "agui_events",
    "agui_turn",
    "chat_request_from_ui",
    "default_error_text",
    "run_input_from_agui",
    "ui_message_stream",
    "ui_turn",
    "user_message_from_agui",
    "user_message_from_ui",
]

from scope._validate import publish as _publish

_publish(__name__, [n for n in __all__ if not n.endswith("Error") and not n.isupper()], globals())
