"""The enums of the chat protocol."""

from __future__ import annotations

import enum

__all__ = ["FinishReason", "OutputFormatType", "PartKind", "Role"]


class Role(enum.StrEnum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class PartKind(enum.StrEnum):
    """Which payload a part carries."""

    TEXT = "text"
    MEDIA = "media"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_CALL_DELTA = "tool_call_delta"
    TOOL_RESULT = "tool_result"


class FinishReason(enum.StrEnum):
    """Why generation stopped. "Not finished" is ``None``, never a member."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    OTHER = "other"


class OutputFormatType(enum.StrEnum):
    """The shape the answer must take."""

    TEXT = "text"
    JSON = "json"
    JSON_SCHEMA = "json_schema"
