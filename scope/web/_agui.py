"""AG-UI 1.0 events over SSE: encoder and ``RunAgentInput`` reader."""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterable, Mapping
from types import MappingProxyType
from typing import Any, Final, final

import attrs
import orjson

from scope._json import kind
from scope.chat import (
    FinishReason,
    Message,
    Part,
    ToolCall,
    ToolResult,
    Usage,
    text_part,
    user_message,
)
from scope.chat import media_part as _media_part
from scope.errors import InvalidRequestError, ScopeError
from scope.history import ConversationID
from scope.media import Media
from scope.web._core import (
    Driver,
    EncodedStream,
    ErrorText,
    StreamItem,
    check_encoder_arguments,
    default_error_text,
)
from scope.web._request import (
    CLIENT_MESSAGE_ID_KEY,
    ToolApproval,
    conversation_id_field,
    decode_body,
    id_field,
    last_user_message,
    optional_id_field,
)

__all__ = [
    "AGUI_HEADERS",
    "AGUIRunInput",
    "agui_events",
    "run_input_from_agui",
    "user_message_from_agui",
]

#: The response headers of an AG-UI event stream (SSE).
AGUI_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
    }
)

_dumps = orjson.dumps
#: The ``reason`` of the interrupt a tool call that waits for approval ends a run with.
APPROVAL_REASON: Final = "tool_approval"
#: The key of a denied call's mark in its TOOL_CALL_RESULT's metadata: the reason given
#: (``Conversation.deny``), as the history marks the result.
DENIED_KEY: Final = "scope/denied"


class _AGUISink:
    """Writes AG-UI events (``data: {json}\\n\\n``) to ``out``."""

    __slots__ = ("interrupts", "out", "run_id", "steps", "thread_id")

    def __init__(self, out: list[bytes], thread_id: str, run_id: str) -> None:
        self.out = out
        self.thread_id = thread_id
        self.run_id = run_id
        self.steps = 0
        self.interrupts: list[dict[str, Any]] = []  # the calls that wait for a decision

    def _event(self, event: dict[str, Any]) -> None:
        self.out.append(b"data: " + _dumps(event) + b"\n\n")

    def start(self) -> None:
        self._event({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})

    def step_start(self) -> None:
        self.steps += 1
        self._event({"type": "STEP_STARTED", "stepName": f"model-call-{self.steps}"})

    def step_end(self) -> None:
        self._event({"type": "STEP_FINISHED", "stepName": f"model-call-{self.steps}"})

    def step_restart(self) -> None:  # AG-UI has no reset: the retry is a step of its own
        self.step_end()
        self.step_start()

    def text_start(self, block: str) -> None:
        self._event({"type": "TEXT_MESSAGE_START", "messageId": block, "role": "assistant"})

    def text_delta(self, block: str, text: str) -> None:
        self.out.append(
            b"data: "
            + _dumps({"type": "TEXT_MESSAGE_CONTENT", "messageId": block, "delta": text})
            + b"\n\n"
        )

    def text_end(self, block: str) -> None:
        self._event({"type": "TEXT_MESSAGE_END", "messageId": block})

    def reasoning_start(self, block: str) -> None:
        self._event({"type": "REASONING_START", "messageId": block})
        self._event({"type": "REASONING_MESSAGE_START", "messageId": block, "role": "reasoning"})

    def reasoning_delta(self, block: str, text: str) -> None:
        self._event({"type": "REASONING_MESSAGE_CONTENT", "messageId": block, "delta": text})

    def reasoning_end(self, block: str) -> None:
        self._event({"type": "REASONING_MESSAGE_END", "messageId": block})
        self._event({"type": "REASONING_END", "messageId": block})

    def tool_start(self, call_id: str, name: str) -> None:
        self._event({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name})

    def tool_delta(self, call_id: str, arguments: str) -> None:
        self._event({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments})

    def tool_end(self, call: ToolCall) -> None:
        self._event({"type": "TOOL_CALL_END", "toolCallId": call.id})

    def earlier_call(self, call: ToolCall) -> None:
        # Nothing: a resume run's client holds the call (HttpAgent would add it again),
        # and a reconnecting one reads on from its Last-Event-ID.
        return

    def tool_result(self, result: ToolResult, denied: str | None) -> None:
        event: dict[str, Any] = {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{self.run_id}:result:{result.id}",
            "toolCallId": result.id,
            "content": result.output.text() or "",
            "role": "tool",
        }
        if denied is not None:
            # AG-UI has no denied result: the content says it (as the model is told),
            # and the event's metadata, which the client keeps on the tool message,
            # marks it with the reason.
            event["metadata"] = {DENIED_KEY: denied}
        self._event(event)

    def approval_request(self, call: ToolCall) -> None:
        # Sent with RUN_FINISHED (its interrupt outcome); the interrupt's id is the
        # call's, and a resume entry answers it by that id (run_input_from_agui).
        self.interrupts.append(
            {
                "id": call.id,
                "reason": APPROVAL_REASON,
                "message": f"approve the call of {call.name}?",
                "toolCallId": call.id,
            }
        )

    def media(self, media: Media) -> None:
        pass  # AG-UI streams no assistant media

    def source(self, source_id: str, url: str, title: str) -> None:
        # AG-UI has no source event: a CUSTOM one, as its custom events allow.
        value = {"sourceId": source_id, "url": url, "title": title}
        self._event({"type": "CUSTOM", "name": "source", "value": value})

    def document(self, source_id: str, media_type: str, title: str, filename: str) -> None:
        # A cited document (no URL): a CUSTOM event of its own.
        value = {"sourceId": source_id, "mediaType": media_type, "title": title}
        if filename:
            value["filename"] = filename
        self._event({"type": "CUSTOM", "name": "document", "value": value})

    def finish(self, reason: FinishReason | None, usage: Usage | None) -> None:
        event: dict[str, Any] = {
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
        }
        if self.interrupts:  # the run waits: a resume run answers each interrupt
            event["outcome"] = {"type": "interrupt", "interrupts": self.interrupts}
        self._event(event)

    def error(self, text: str) -> None:
        self._event({"type": "RUN_ERROR", "message": text})

    def abort(self, reason: str) -> None:  # AG-UI 1.0 ends a stopped run as an error
        self.error(reason)


def agui_events(
    stream: AsyncIterable[StreamItem],
    *,
    thread_id: str,
    run_id: str,
    on_error: ErrorText = default_error_text,
) -> EncodedStream:
    """Encode a scope stream as AG-UI 1.0 events over SSE.

    - ``stream``: a model's ``AsyncIterator[Response]``, or ``Conversation.stream(...)``'s
      events (then tool results and steps are sent too).
    - ``thread_id``, ``run_id``: the run's ids, as the client sent them in
      ``RunAgentInput``.
    - ``on_error``: the message of ``RUN_ERROR`` for a failure (default: the
      exception's type only).

    Events: ``RUN_STARTED``; per model call ``STEP_STARTED``/``STEP_FINISHED``; one
    ``TEXT_MESSAGE_START``/``_CONTENT``/``_END`` per text part of the accumulated answer;
    reasoning text as ``REASONING_START``, ``REASONING_MESSAGE_*``, ``REASONING_END``
    (not the deprecated ``THINKING_*`` events; a signature or encrypted reasoning is
    never sent, so no ``REASONING_ENCRYPTED_VALUE`` either); tool
    calls as ``TOOL_CALL_START``/``_ARGS``/``_END``; tool results as
    ``TOOL_CALL_RESULT``; then ``RUN_FINISHED`` (with an interrupt ``outcome``, one
    interrupt per call, when the turn waits for approval: ``TurnResult.pending``; a
    resume run answers them, ``run_input_from_agui``), or ``RUN_ERROR`` when the stream fails
    (the failure is logged on the ``scope.web`` logger and kept as
    ``EncodedStream.error``; the encoded stream still ends normally; cancellation
    propagates). Serve it with ``AGUI_HEADERS``. Wrong argument types raise
    ``TypeError`` here, before anything is streamed, as for ``ui_message_stream``.
    """
    check_encoder_arguments(stream, on_error)
    for name, value in (("thread_id", thread_id), ("run_id", run_id)):
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name} must be a non-empty str, got {value!r}")
    out: list[bytes] = []
    sink = _AGUISink(out, thread_id, run_id)
    return EncodedStream(stream, Driver(sink, f"{run_id}:"), out, on_error)


def _agui_part(part: object, path: str) -> Part | None:
    if not isinstance(part, Mapping):
        raise InvalidRequestError(f"{path} must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{path}.text must be a string")
        return text_part(text) if text else None
    if kind in ("image", "audio", "video", "document"):
        source = part.get("source")
        if not isinstance(source, Mapping):
            raise InvalidRequestError(f"{path}.source must be an object")
        value, mime = source.get("value"), source.get("mimeType")
        if not isinstance(value, str) or not isinstance(mime, str):
            raise InvalidRequestError(f"{path}.source needs string value and mimeType")
        try:
            if source.get("type") == "data":
                try:
                    data = base64.b64decode(value, validate=True)
                except binascii.Error as exc:
                    raise InvalidRequestError(
                        f"{path}.source.value: invalid base64: {exc}"
                    ) from None
                return _media_part(Media.from_bytes(mime, data))
            if source.get("type") == "url":
                return _media_part(Media.from_uri(mime, value))
        except InvalidRequestError:
            raise
        except ScopeError as exc:
            raise InvalidRequestError(f"{path}: {exc}") from exc
        raise InvalidRequestError(f"{path}.source.type {source.get('type')!r} is not data or url")
    raise InvalidRequestError(f"{path}.type {kind!r} is not a user content part")


@final
@attrs.frozen
class AGUIRunInput:
    """An AG-UI ``RunAgentInput``, read.

    - ``thread_id``: the conversation; ``run_id``: the run.
    - ``message``: the new user message (the last one).
    - ``client_message_id``: its ``id``, or None.
    - ``prior``: the user messages before it, in order, as the client holds them (each
      with its ``id`` under ``CLIENT_MESSAGE_ID_KEY`` in its metadata, when it has
      one). They are never stored: ``agui_turn`` compares them with the stored head
      path to see whether the client's copy of the thread diverged.
    - ``approvals``: the decisions a resume run brings (``resume``: the answers to the
      interrupts of a run that ended waiting for approval), in order; empty for any
      other run. For a resume run ``message`` is the last user message the run holds
      (the question of the turn that waits) and ``prior`` the user messages before it.
    """

    thread_id: ConversationID
    run_id: str
    message: Message
    client_message_id: str | None = None
    prior: tuple[Message, ...] = ()
    # Added with tool approval: a default, so inputs made without it still build.
    approvals: tuple[ToolApproval, ...] = ()


def run_input_from_agui(body: bytes | str | Mapping[str, Any]) -> AGUIRunInput:
    """An AG-UI ``RunAgentInput`` (what ``HttpAgent`` posts): its thread id, run id, new
    user message and the user messages before it.

    ``threadId`` and ``runId`` must each be a valid id (a string, non-empty, at most
    512 UTF-8 bytes, no control characters, no surrounding whitespace), and so must a
    user message's ``id`` when present; the new message is read as
    ``user_message_from_agui`` reads it, each earlier user message the same way. Every
    problem raises ``InvalidRequestError`` naming the field: answer it with a 4xx.
    """
    decoded = decode_body(body)
    approvals: tuple[ToolApproval, ...] = ()
    if decoded.get("resume") is not None:
        approvals = _resume(decoded["resume"])
        last, path, end = _last_user(decoded)
        message = _agui_user(last, path)
    else:
        message = user_message_from_agui(decoded)
        last, path = last_user_message(decoded, "role")
        end = len(decoded["messages"]) - 1
    thread_id = conversation_id_field(decoded, "threadId")
    messages = decoded["messages"]
    prior: list[Message] = []
    for index, raw in enumerate(messages[:end]):
        where = f"messages[{index}]"
        if not isinstance(raw, Mapping):
            raise InvalidRequestError(f"{where} must be an object, got {type(raw).__name__}")
        if raw.get("role") != "user":
            continue
        user = _agui_user(raw, where)
        client_id = optional_id_field(raw, "id", f"{where}.id")
        if client_id is not None:
            user = Message(user.role, user.parts, {CLIENT_MESSAGE_ID_KEY: client_id})
        prior.append(user)
    return AGUIRunInput(
        thread_id,
        id_field(decoded, "runId"),
        message,
        optional_id_field(last, "id", f"{path}.id"),
        tuple(prior),
        approvals,
    )


def _last_user(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], str, int]:
    """A resume run's last user message, its path and its index."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("the request body's messages must be an array")
    for index in range(len(messages) - 1, -1, -1):
        raw = messages[index]
        if isinstance(raw, Mapping) and raw.get("role") == "user":
            return raw, f"messages[{index}]", index
    raise InvalidRequestError(
        "the run resumes interrupts, but its messages hold no user message (the question "
        "of the turn that waits)"
    )


def _resume(entries: object) -> tuple[ToolApproval, ...]:
    """The decisions of ``RunAgentInput.resume`` (answers to the interrupts a run ended
    with: ``agui_events`` names each by its call's id)."""
    if not isinstance(entries, list):
        raise InvalidRequestError(f"resume must be an array of resume entries, got {kind(entries)}")
    if not entries:
        raise InvalidRequestError("resume is empty: it answers no interrupt")
    found: list[ToolApproval] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"resume[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidRequestError(f"{where} must be an object, got {kind(entry)}")
        call_id = optional_id_field(entry, "interruptId", f"{where}.interruptId")
        if call_id is None:
            raise InvalidRequestError(f"{where} has no interruptId")
        if call_id in seen:
            raise InvalidRequestError(f"{where}: interrupt {call_id!r} is answered twice")
        seen.add(call_id)
        status = entry.get("status")
        if status == "cancelled":  # abandoned: the call does not run
            found.append(ToolApproval(call_id, False, None))
            continue
        if status != "resolved":
            raise InvalidRequestError(
                f"{where}.status must be 'resolved' or 'cancelled', got {status!r}"
            )
        payload = entry.get("payload")
        if isinstance(payload, bool):
            found.append(ToolApproval(call_id, payload, None))
            continue
        if not isinstance(payload, Mapping):
            raise InvalidRequestError(
                f"{where}.payload must be a boolean or an object with approved, got {kind(payload)}"
            )
        approved = payload.get("approved")
        if not isinstance(approved, bool):
            raise InvalidRequestError(
                f"{where}.payload.approved must be a boolean, got {kind(approved)}"
            )
        reason = payload.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise InvalidRequestError(
                f"{where}.payload.reason must be a string or null, got {kind(reason)}"
            )
        if payload.get("editedArgs") is not None:
            raise InvalidRequestError(
                f"{where}.payload.editedArgs: a call waits with the arguments the model "
                "gave; approve or deny them (edited arguments are not taken)"
            )
        found.append(ToolApproval(call_id, approved, reason or None))
    return tuple(found)


def user_message_from_agui(body: bytes | str | Mapping[str, Any]) -> Message:
    """The new user message of an AG-UI ``RunAgentInput`` (what ``HttpAgent`` posts).

    ``body``: the raw request body, or the JSON object already decoded. Only the last
    message is read, and it must be a user message (``content`` a string, or text and
    media parts with data or url sources): the server's store owns the history, so
    prior messages the client sends are never stored. Raises ``InvalidRequestError``
    (naming the field) for a body that is not JSON or carries no new user message.
    """
    last, path = last_user_message(decode_body(body), "role")
    return _agui_user(last, path)


def _agui_user(last: Mapping[str, Any], path: str) -> Message:
    """The user message ``last`` (at ``path``) holds."""
    content = last.get("content")
    if isinstance(content, str):
        if not content:
            raise InvalidRequestError(f"{path}.content is empty: no new user message")
        return user_message(content)
    if not isinstance(content, list):
        raise InvalidRequestError(f"{path}.content must be a string or an array of parts")
    parts = [
        p
        for i, raw in enumerate(content)
        if (p := _agui_part(raw, f"{path}.content[{i}]")) is not None
    ]
    if not parts:
        raise InvalidRequestError(f"{path}.content has no text or media: no new user message")
    return user_message(*parts)
