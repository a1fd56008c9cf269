"""What both request readers share: decoding the body, finding the new user message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from scope.errors import InvalidRequestError

__all__ = ["decode_body", "last_user_message"]


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
