"""What both request readers share: decoding the body, finding the new user message,
reading the ids a request names.

The one error rule of ``scope.web``: whatever a client can get wrong in a request (the
body, a message, an id, the trigger) raises ``InvalidRequestError`` naming the field,
so one ``except InvalidRequestError`` answers every malformed request with a 4xx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs
import orjson

from scope._json import kind
from scope.errors import InvalidConversationIDError, InvalidRequestError
from scope.history import ConversationID

__all__ = [
    "CLIENT_MESSAGE_ID_KEY",
    "ToolApproval",
    "check_trigger",
    "conversation_id_field",
    "decode_body",
    "id_field",
    "last_user_message",
    "optional_id_field",
]

#: The message metadata key under which ``ui_turn``/``agui_turn`` store the id a
#: client gave a user message (the AI SDK's ``UIMessage.id``, AG-UI's message ``id``),
#: so that a later request naming that id finds its stored turn.
CLIENT_MESSAGE_ID_KEY: Final = "scope/client_message_id"

#: The AI SDK's triggers: a new message, or a new answer to the last one.
SUBMIT: Final = "submit-message"
REGENERATE: Final = "regenerate-message"


@final
@attrs.frozen
class ToolApproval:
    """A client's decision on a tool call that waits for approval (the AI SDK's
    ``addToolApprovalResponse``, an AG-UI resume entry): ``call_id`` the call,
    ``approved`` the decision, ``reason`` the user's reason (None when the client gave
    none). ``ui_turn``/``agui_turn`` take it with ``Conversation.stream_approve`` or
    ``stream_deny``."""

    call_id: str
    approved: bool
    reason: str | None = None


def decode_body(body: object) -> Mapping[str, Any]:
    """The request's JSON object: ``body`` as bytes/str (decoded here) or decoded."""
    if isinstance(body, bytes | bytearray | memoryview | str):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise InvalidRequestError(
            f"the request body must be a JSON object, got {type(body).__name__}"
        )
    return body


def last_user_message(body: Mapping[str, Any], role_key: str) -> tuple[Mapping[str, Any], str]:
    """The last entry of ``body["messages"]`` (and its path), which must be a user message."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("the request body's messages must be an array")
    if not messages:
        raise InvalidRequestError("the request body's messages are empty: no new user message")
    path = f"messages[{len(messages) - 1}]"
    last = messages[-1]
    if not isinstance(last, Mapping):
        raise InvalidRequestError(f"{path} must be an object, got {type(last).__name__}")
    role = last.get(role_key)
    if role != "user":
        raise InvalidRequestError(
            f"{path}.{role_key} is {role!r}: the request carries no new user message"
        )
    return last, path


def check_trigger(body: Mapping[str, Any]) -> str:
    """The AI SDK's ``trigger``: ``submit-message`` (also when absent) or
    ``regenerate-message`` (a new answer to a stored question: a rewind and a turn,
    DESIGN §6h); anything else raises ``InvalidRequestError``."""
    if "trigger" not in body:
        return SUBMIT
    trigger = body["trigger"]
    if trigger in (SUBMIT, REGENERATE):
        return str(trigger)
    if not isinstance(trigger, str):
        raise InvalidRequestError(f"trigger must be a string, got {kind(trigger)}")
    raise InvalidRequestError(f"trigger {trigger!r} is not {SUBMIT!r} or {REGENERATE!r}")


def optional_id_field(body: Mapping[str, Any], key: str, path: str) -> str | None:
    """``body[key]`` as an id (the rules of ``id_field``), or None when it is absent or
    null; ``InvalidRequestError`` naming ``path``."""
    if body.get(key) is None:
        return None
    value = body[key]
    if not isinstance(value, str):
        raise InvalidRequestError(f"{path} must be a string, got {kind(value)}")
    try:
        return str(ConversationID(value))
    except InvalidConversationIDError as exc:
        message = str(exc).replace("conversation id", path, 1)
        raise InvalidRequestError(message) from exc


def id_field(body: Mapping[str, Any], key: str) -> str:
    """``body[key]``: an id, valid as a conversation id is (non-empty, at most 512
    UTF-8 bytes, no control characters, no surrounding whitespace)."""
    return str(conversation_id_field(body, key))


def conversation_id_field(body: Mapping[str, Any], key: str) -> ConversationID:
    """``body[key]`` as a ``ConversationID``; ``InvalidRequestError`` naming ``key``."""
    if key not in body:
        raise InvalidRequestError(f"the request body has no {key}")
    value = body[key]
    if not isinstance(value, str):
        raise InvalidRequestError(f"{key} must be a string, got {kind(value)}")
    try:
        return ConversationID(value)
    except InvalidConversationIDError as exc:
        message = str(exc).replace("conversation id", key, 1)
        raise InvalidRequestError(message) from exc
