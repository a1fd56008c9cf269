"""The enums of the chat protocol."""

from __future__ import annotations

import enum
from typing import Literal, TypeAlias

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
    NATIVE = "native"


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


# What constructors accept where an enum member goes: the member, or its value spelled
# as a literal string, so a type checker catches ``Message("bot", ...)`` while
# ``Message("user", ...)`` stays as short as the Go docs' examples. (A ``str`` variable
# must be converted first, ``Role(name)``: its value is only known at run time.) The
# literals are checked against the enums by tests/chat/test_values.py.

#: ``Role`` or its value.
RoleLike: TypeAlias = Role | Literal["system", "user", "assistant", "tool"]
#: ``PartKind`` or its value.
PartKindLike: TypeAlias = (
    PartKind
    | Literal["text", "media", "reasoning", "tool_call", "tool_call_delta", "tool_result", "native"]
)
#: ``FinishReason`` or its value.
FinishReasonLike: TypeAlias = (
    FinishReason | Literal["stop", "length", "tool_calls", "content_filter", "other"]
)
#: ``OutputFormatType`` or its value.
OutputFormatTypeLike: TypeAlias = OutputFormatType | Literal["text", "json", "json_schema"]
