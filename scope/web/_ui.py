"""The Vercel AI SDK UI message stream (``ai`` 5 and later): encoder and request reader."""

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
from scope.media import Media, SourceKind
from scope.web._core import (
    Driver,
    EncodedStream,
    ErrorText,
    StreamItem,
    check_encoder_arguments,
    default_error_text,
)
from scope.web._request import (
    SUBMIT,
    ToolApproval,
    check_trigger,
    conversation_id_field,
    decode_body,
    last_user_message,
    optional_id_field,
)

__all__ = [
    "UI_MESSAGE_STREAM_HEADERS",
    "UIChatRequest",
    "chat_request_from_ui",
    "ui_message_stream",
    "user_message_from_ui",
]

#: The response headers of a UI message stream (the AI SDK checks the last one).
UI_MESSAGE_STREAM_HEADERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
        "x-vercel-ai-ui-message-stream": "v1",
    }
)

_FINISH: Final = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool-calls",
    FinishReason.CONTENT_FILTER: "content-filter",
    FinishReason.OTHER: "other",
}
_DONE: Final = b"data: [DONE]\n\n"
_dumps = orjson.dumps


class _UISink:
    """Writes UI message stream parts (``data: {json}\\n\\n``) to ``out``."""

    __slots__ = ("message_id", "out", "reset_step")

    def __init__(self, out: list[bytes], message_id: str | None, reset_step: bool) -> None:
        self.out = out
        self.message_id = message_id
        self.reset_step = reset_step

    def _part(self, part: dict[str, Any]) -> None:
        self.out.append(b"data: " + _dumps(part) + b"\n\n")

    def start(self) -> None:
        if self.message_id is None:
            self.out.append(b'data: {"type":"start"}\n\n')
        else:
            self._part({"type": "start", "messageId": self.message_id})

    def step_start(self) -> None:
        self.out.append(b'data: {"type":"start-step"}\n\n')

    def step_end(self) -> None:
        self.out.append(b'data: {"type":"finish-step"}\n\n')

    def step_restart(self) -> None:
        if self.reset_step:  # the client drops the parts since the step's start-step
            self.out.append(b'data: {"type":"reset-step"}\n\n')
        else:  # a client before reset-step keeps both answers, each its own step
            self.out.append(b'data: {"type":"finish-step"}\n\ndata: {"type":"start-step"}\n\n')

    def text_start(self, block: str) -> None:
        self._part({"type": "text-start", "id": block})

    def text_delta(self, block: str, text: str) -> None:
        self.out.append(
            b"data: " + _dumps({"type": "text-delta", "id": block, "delta": text}) + b"\n\n"
        )

    def text_end(self, block: str) -> None:
        self._part({"type": "text-end", "id": block})

    def reasoning_start(self, block: str) -> None:
        self._part({"type": "reasoning-start", "id": block})

    def reasoning_delta(self, block: str, text: str) -> None:
        self._part({"type": "reasoning-delta", "id": block, "delta": text})

    def reasoning_end(self, block: str) -> None:
        self._part({"type": "reasoning-end", "id": block})

    def tool_start(self, call_id: str, name: str) -> None:
        self._part({"type": "tool-input-start", "toolCallId": call_id, "toolName": name})

    def tool_delta(self, call_id: str, arguments: str) -> None:
        self._part({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": arguments})

    def tool_end(self, call: ToolCall) -> None:
        # The protocol carries the parsed input; arguments are the model's exact text and
        # may be malformed, which the protocol reports as a tool-input-error.
        text = call.arguments
        try:
            value = orjson.loads(text) if text else {}
        except orjson.JSONDecodeError as exc:
            self._part(
                {
                    "type": "tool-input-error",
                    "toolCallId": call.id,
                    "toolName": call.name,
                    "input": text,
                    "errorText": f"the arguments of tool call {call.id!r} are not JSON: {exc}",
                }
            )
            return
        self._part(
            {
                "type": "tool-input-available",
                "toolCallId": call.id,
                "toolName": call.name,
                "input": value,
            }
        )

    def earlier_call(self, call: ToolCall) -> None:
        # tool-input-available: a client that holds the call (in state
        # approval-responded) updates that part and keeps its approval; one that reads
        # this stream from its start (a resumed stream) gets the part its result needs.
        self.tool_end(call)

    def tool_result(self, result: ToolResult, denied: str | None) -> None:
        if denied is not None:  # the client shows the call as denied (output-denied)
            self._part({"type": "tool-output-denied", "toolCallId": result.id})
            return
        output = result.output
        text = output.text()
        if result.is_error:
            self._part(
                {"type": "tool-output-error", "toolCallId": result.id, "errorText": text or ""}
            )
            return
        value: Any = text
        if not output.content and output.details is not None:
            value = orjson.Fragment(output.details.bytes)
        self._part({"type": "tool-output-available", "toolCallId": result.id, "output": value})

    def approval_request(self, call: ToolCall) -> None:
        # The approval's id is the call's: the client answers with it
        # (addToolApprovalResponse), and chat_request_from_ui reads it back.
        self._part({"type": "tool-approval-request", "approvalId": call.id, "toolCallId": call.id})

    def media(self, media: Media) -> None:
        source = media.source
        if source.kind is SourceKind.BYTES:
            url = f"data:{media.mime};base64,{base64.b64encode(source.data).decode('ascii')}"
        elif source.kind is SourceKind.URI:
            url = source.uri
        else:  # a provider's file id means nothing to a browser
            return
        self._part({"type": "file", "url": url, "mediaType": media.mime})

    def source(self, source_id: str, url: str, title: str) -> None:
        part: dict[str, Any] = {"type": "source-url", "sourceId": source_id, "url": url}
        if title:
            part["title"] = title
        self._part(part)

    def document(self, source_id: str, media_type: str, title: str, filename: str) -> None:
        part: dict[str, Any] = {
            "type": "source-document",
            "sourceId": source_id,
            "mediaType": media_type,
            "title": title,
        }
        if filename:
            part["filename"] = filename
        self._part(part)

    def finish(self, reason: FinishReason | None, usage: Usage | None) -> None:
        if reason is None:
            self.out.append(b'data: {"type":"finish"}\n\n')
        else:
            self._part({"type": "finish", "finishReason": _FINISH[reason]})
        self.out.append(_DONE)

    def error(self, text: str) -> None:
        self._part({"type": "error", "errorText": text})
        self.out.append(_DONE)

    def abort(self, reason: str) -> None:
        self._part({"type": "abort", "reason": reason})
        self.out.append(_DONE)


def ui_message_stream(
    stream: AsyncIterable[StreamItem],
    *,
    message_id: str | None = None,
    on_error: ErrorText = default_error_text,
    reset_step: bool = False,
) -> EncodedStream:
    """Encode a scope stream as the AI SDK's UI message stream (SSE bytes).

    - ``stream``: a model's ``AsyncIterator[Response]`` (for example a
      ``Middleware``-wrapped streamer), or ``Conversation.stream(...)``'s events (then
      tool results and steps are sent too).
    - ``message_id``: the assistant message's id in the ``start`` part, a non-empty
      ``str`` (the client makes one up when None).
    - ``on_error``: the text of the ``error`` part for a failure, and of the ``abort``
      part's ``reason`` (default: the exception's type only, never its message).
    - ``reset_step``: send ``reset-step`` when a step is restarted (below). Only for
      clients that read it: ``ai`` 7.0.70 or later. ``ai`` 6, and ``ai`` 7 before
      7.0.70, reject the part and the chat fails, so it is off by default.

    Wrong argument types (a ``stream`` that is not an async iterable, a ``message_id``
    that is not a string, an ``on_error`` that is not callable) raise ``TypeError``
    here, before anything is streamed; an empty ``message_id`` raises ``ValueError``.

    Parts: ``start``, per model call ``start-step`` ... ``finish-step``, text and
    reasoning blocks (``*-start``/``-delta``/``-end``, one block per part of the
    accumulated answer), tool calls (``tool-input-start``/``-delta``/``-available``),
    tool results (``tool-output-available``/``-error``; ``tool-output-denied`` for a
    call denied with ``Conversation.deny``), sources (``source-url``, ``source-document``),
    media (``file``), ``finish`` with the finish reason, then ``data: [DONE]``. A turn
    of ``Conversation.stream`` that waits for approval (``TurnResult.pending``) sends a
    ``tool-approval-request`` per waiting call before ``finish`` (its ``approvalId`` is
    the call id; ``chat_request_from_ui`` reads the client's answer). A call the stream
    names but an earlier stream carried (``ui_turn``'s decided calls, the calls a partial
    decision leaves waiting) is sent first as ``tool-input-available``, so the stream
    read alone (a resumed one, replayed from its start) holds every call it names.

    A step is restarted when ``Conversation.stream`` sends an answer back because it
    did not decode (``output_retries``) and the model answers again. The answer sent
    back is stored, but it is no answer to the user: with ``reset_step=True`` the
    client gets ``reset-step`` and drops that answer's parts, showing only the one
    that decoded; without it the retry is a new step (``finish-step``,
    ``start-step``), so an older client shows both answers, as the history holds
    them. A resent turn (``ui_turn`` replaying a stored one) gets the same parts.

    A failure of the stream (or an invalid chunk) sends ``error`` and ``[DONE]``
    instead of ``finish``; a turn stopped on purpose by a newer turn
    (``TurnInterruptedError``: ``on_overlap="interrupt"``) sends ``abort`` with
    ``on_error``'s text as its ``reason`` and ``[DONE]`` (the client keeps the partial
    answer without an error; that answer is not stored). Either is logged on the
    ``scope.web`` logger and ends the encoded stream normally (``EncodedStream.error``
    keeps the exception); cancellation propagates. The stream is closed on every path.
    Serve it with ``UI_MESSAGE_STREAM_HEADERS``.
    """
    check_encoder_arguments(stream, on_error)
    if message_id is not None:
        if not isinstance(message_id, str):
            raise TypeError(f"message_id must be a str or None, got {type(message_id).__name__}")
        if not message_id:
            raise ValueError("message_id must not be empty (None lets the client choose one)")
    out: list[bytes] = []
    if not isinstance(reset_step, bool):
        raise TypeError(f"reset_step must be a bool, got {type(reset_step).__name__}")
    sink = _UISink(out, message_id, reset_step)
    return EncodedStream(stream, Driver(sink, "b"), out, on_error)


def _ui_part(part: object, path: str) -> Part | None:
    if not isinstance(part, dict):
        raise InvalidRequestError(f"{path} must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{path}.text must be a string")
        return text_part(text) if text else None
    if kind == "file":
        url, mime = part.get("url"), part.get("mediaType")
        if not isinstance(url, str) or not isinstance(mime, str):
            raise InvalidRequestError(f"{path}: a file part needs string url and mediaType")
        try:
            return _media_part(_media_from_url(url, mime))
        except ScopeError as exc:
            raise InvalidRequestError(f"{path}: {exc}") from exc
    if isinstance(kind, str) and kind.startswith("data-"):
        return None  # application data parts are the app's business, not the model's
    raise InvalidRequestError(f"{path}.type {kind!r} is not a user message part (text, file)")


def _media_from_url(url: str, mime: str) -> Media:
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise InvalidRequestError("a data URL must be base64 encoded")
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise InvalidRequestError(f"a data URL holds invalid base64: {exc}") from None
        return Media.from_bytes(mime, data)
    return Media.from_uri(mime, url)


@final
@attrs.frozen
class UIChatRequest:
    """An AI SDK chat request, read.

    - ``chat_id``: the body's ``id``, the chat the ``Conversation`` keeps.
    - ``message``: the user message the request ends with (the new one; for a
      regenerate request, the question to answer again, as the client holds it).
    - ``trigger``: ``"submit-message"`` (a new or an edited message) or
      ``"regenerate-message"``.
    - ``message_id``: the body's ``messageId``, or None: for ``submit-message`` the id
      of the earlier user message the new one replaces (an edit), for
      ``regenerate-message`` the assistant message to answer again.
    - ``client_message_id``: the ``id`` of the message the request ends with, or None.
    - ``approvals``: the decisions on tool calls that wait for approval, when the
      request answers them (below); empty otherwise.

    A request that ends with the assistant message holding tool parts in state
    ``approval-responded`` (the client's ``addToolApprovalResponse``, sent by
    ``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses``)
    answers the approvals ``ui_message_stream`` asked for: ``approvals`` holds the
    decisions, in the message's order; ``message`` and ``client_message_id`` are then
    the user message before it (the question of the turn that waits) and
    ``message_id`` the assistant message's id.

    ``ui_turn(conversation, request)`` runs what it asks for.
    """

    chat_id: ConversationID
    message: Message
    trigger: str = "submit-message"
    message_id: str | None = None
    client_message_id: str | None = None
    # Added with tool approval: a default, so requests made without it still build.
    approvals: tuple[ToolApproval, ...] = ()


def chat_request_from_ui(body: bytes | str | Mapping[str, Any]) -> UIChatRequest:
    """An AI SDK chat request (``DefaultChatTransport``'s body: ``{"id", "messages":
    [UIMessage, ...], "trigger", "messageId", ...}``): its chat id, its last user
    message, its trigger and the message ids it names.

    ``id`` must be a valid conversation id (a string, non-empty, at most 512 UTF-8
    bytes, no control characters, no surrounding whitespace), and so must
    ``messageId`` and the last message's ``id`` when present (null or absent: None);
    the message is read as ``user_message_from_ui`` reads it. Every problem raises
    ``InvalidRequestError`` naming the field: answer it with a 4xx.

    A body whose last message is an assistant message answers tool approvals
    (``UIChatRequest.approvals``): each of its tool parts (``tool-<name>`` or
    ``dynamic-tool``) in state ``approval-responded`` is a decision. Such a part needs
    a ``toolCallId`` (an id, as above) and an ``approval`` object whose ``id`` is that
    call id (the ``approvalId`` ``ui_message_stream`` sent), whose ``approved`` is a
    boolean and whose ``reason`` is a string, null or absent; one call is decided once
    per request. The trigger must be ``submit-message``, the message must have at
    least one such part, and a user message must come before it (read as above).
    Every problem raises ``InvalidRequestError`` naming the field.
    """
    decoded = decode_body(body)
    trigger = check_trigger(decoded)
    messages = decoded.get("messages")
    if isinstance(messages, list) and messages:
        final = messages[-1]
        if isinstance(final, Mapping) and final.get("role") == "assistant":
            return _approval_request(decoded, messages, trigger)
    message = user_message_from_ui(decoded)
    last, path = last_user_message(decoded, "role")
    return UIChatRequest(
        conversation_id_field(decoded, "id"),
        message,
        trigger,
        optional_id_field(decoded, "messageId", "messageId"),
        optional_id_field(last, "id", f"{path}.id"),
    )


def _approval_request(body: Mapping[str, Any], messages: list[Any], trigger: str) -> UIChatRequest:
    """A request that ends with the assistant message answering tool approvals."""
    index = len(messages) - 1
    path = f"messages[{index}]"
    final = messages[index]
    if trigger != SUBMIT:
        raise InvalidRequestError(
            f"{path}.role is 'assistant' and the trigger is {trigger!r}: tool approvals "
            f"are answered by {SUBMIT!r}"
        )
    approvals = _approvals(final, path)
    chat_id = conversation_id_field(body, "id")
    message_id = optional_id_field(body, "messageId", "messageId")
    for number in range(index - 1, -1, -1):
        earlier = messages[number]
        if isinstance(earlier, Mapping) and earlier.get("role") == "user":
            user_path = f"messages[{number}]"
            return UIChatRequest(
                chat_id,
                _user_from_ui(earlier, user_path),
                trigger,
                message_id,
                optional_id_field(earlier, "id", f"{user_path}.id"),
                approvals,
            )
    raise InvalidRequestError(f"{path} answers tool approvals, but no user message comes before it")


def _approvals(message: Mapping[str, Any], path: str) -> tuple[ToolApproval, ...]:
    """The decisions an assistant message holds (tool parts in ``approval-responded``)."""
    raw_parts = message.get("parts")
    if not isinstance(raw_parts, list):
        raise InvalidRequestError(f"{path}.parts must be an array")
    found: list[ToolApproval] = []
    seen: set[str] = set()
    for i, part in enumerate(raw_parts):
        if not isinstance(part, Mapping):
            raise InvalidRequestError(f"{path}.parts[{i}] must be an object, got {kind(part)}")
        part_type = part.get("type")
        if not isinstance(part_type, str) or not (
            part_type.startswith("tool-") or part_type == "dynamic-tool"
        ):
            continue
        if part.get("state") != "approval-responded":
            continue
        where = f"{path}.parts[{i}]"
        call_id = optional_id_field(part, "toolCallId", f"{where}.toolCallId")
        if call_id is None:
            raise InvalidRequestError(f"{where} answers an approval but has no toolCallId")
        approval = part.get("approval")
        if not isinstance(approval, Mapping):
            raise InvalidRequestError(f"{where}.approval must be an object, got {kind(approval)}")
        if approval.get("id") != call_id:
            raise InvalidRequestError(
                f"{where}.approval.id is {approval.get('id')!r}, not the approval asked for "
                f"call {call_id!r} (its approvalId is the call id)"
            )
        approved = approval.get("approved")
        if not isinstance(approved, bool):
            raise InvalidRequestError(
                f"{where}.approval.approved must be a boolean, got {kind(approved)}"
            )
        reason = approval.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise InvalidRequestError(
                f"{where}.approval.reason must be a string or null, got {kind(reason)}"
            )
        if call_id in seen:
            raise InvalidRequestError(f"{where}: call {call_id!r} is decided twice")
        seen.add(call_id)
        found.append(ToolApproval(call_id, approved, reason or None))
    if not found:
        raise InvalidRequestError(
            f"{path}.role is 'assistant' and it answers no tool approval (no tool part in "
            "state 'approval-responded'): the request carries no new user message"
        )
    return tuple(found)


def user_message_from_ui(body: bytes | str | Mapping[str, Any]) -> Message:
    """The user message an AI SDK chat request ends with (``DefaultChatTransport``'s
    body: ``{"id", "messages": [UIMessage, ...], "trigger", ...}``).

    ``body``: the raw request body, or the JSON object already decoded. Only the last
    message is read, and it must be a user message with at least one text or file part:
    the server's store owns the history, so the prior messages a client sends are
    ignored, never trusted. ``trigger`` must be absent, ``"submit-message"`` or
    ``"regenerate-message"`` (then the last message is the question to answer again:
    ``ui_turn`` finds its stored turn by its id). Raises ``InvalidRequestError``
    (naming the field) for a body that is not JSON, has no ``messages``, ends in
    anything but a user message or has another trigger.
    """
    decoded = decode_body(body)
    check_trigger(decoded)
    last, path = last_user_message(decoded, "role")
    return _user_from_ui(last, path)


def _user_from_ui(last: Mapping[str, Any], path: str) -> Message:
    """A user message of a request (its text and file parts)."""
    raw_parts = last.get("parts")
    if not isinstance(raw_parts, list):
        raise InvalidRequestError(f"{path}.parts must be an array")
    parts = [
        p
        for i, raw in enumerate(raw_parts)
        if (p := _ui_part(raw, f"{path}.parts[{i}]")) is not None
    ]
    if not parts:
        raise InvalidRequestError(f"{path} has no text or file part: no new user message")
    return user_message(*parts)
