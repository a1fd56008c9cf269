"""``Request``: the messages, tools and options of one model call."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import final

import attrs

from scope._validate import to_tuple
from scope.chat._message import Message
from scope.chat._options import Options, ToolDefinition
from scope.chat._types import PartKind, Role
from scope.errors import InvalidRequestError

__all__ = ["Request"]


def _to_options(value: Options | None) -> Options:
    """``None`` means the default options; a wrong type (only possible past the type
    checker) is left for ``validate()``."""
    if value is None:
        return _DEFAULT_OPTIONS
    return value


def _to_messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return to_tuple(value)


def _to_tools(value: Iterable[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    return to_tuple(value)


_DEFAULT_OPTIONS = Options()


@final
@attrs.frozen
class Request:
    """One model call.

    Rules: at least one message; system messages form a leading prefix; no
    tool_call_delta parts; tool names unique; a tool message directly follows an assistant
    message with tool calls (or another tool message after it) and every tool result
    answers one of that assistant message's calls, each call at most once.
    """

    messages: tuple[Message, ...] = attrs.field(converter=_to_messages)
    tools: tuple[ToolDefinition, ...] = attrs.field(default=(), converter=_to_tools)
    options: Options = attrs.field(default=_DEFAULT_OPTIONS, converter=_to_options)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def with_checked_messages(self, messages: tuple[Message, ...]) -> Request:
        """This request with other ``messages``, *without* validating them: a trusted
        constructor for a caller that vouches for them.

        Only for callers that have proved ``messages`` pass ``check_sequence`` (the
        history Middleware: a validated request's system prefix and open turn around a
        replay it checked itself; see ``scope.history._replay``). Tools and options are
        this request's, already valid.
        """
        request = object.__new__(Request)
        object.__setattr__(request, "messages", messages)
        object.__setattr__(request, "tools", self.tools)
        object.__setattr__(request, "options", self.options)
        return request

    def validate(self) -> None:
        """Check the request (construction already did)."""
        if type(self.messages) is not tuple:
            raise InvalidRequestError(
                f"messages must be a sequence of messages, got {type(self.messages).__name__}"
            )
        if not self.messages:
            raise InvalidRequestError("a request needs at least one message")
        if type(self.tools) is not tuple:
            raise InvalidRequestError(
                f"tools must be a sequence of tool definitions, got {type(self.tools).__name__}"
            )
        if not isinstance(self.options, Options):
            raise InvalidRequestError(f"options must be Options, got {type(self.options).__name__}")
        names: set[str] = set()
        for index, tool in enumerate(self.tools):
            if not isinstance(tool, ToolDefinition):
                raise InvalidRequestError(
                    f"tools[{index}] must be a ToolDefinition, got {type(tool).__name__}"
                )
            if tool.name in names:
                raise InvalidRequestError(f"tools[{index}]: tool name {tool.name!r} is not unique")
            names.add(tool.name)
        check_sequence(self.messages, InvalidRequestError)


def check_sequence(
    messages: Sequence[Message], error: type[Exception] = InvalidRequestError
) -> None:
    """Check the message-order rules of a request on ``messages`` (what
    ``Request.validate`` checks of its messages' order): system messages only as a
    leading prefix; a tool message only after an assistant message with tool calls (or
    another tool message), each of its results answering one of those calls, once; no
    ``tool_call_delta`` parts and no call id repeated within an assistant message.
    Raises ``error`` (default ``InvalidRequestError``) naming the first message that
    breaks a rule.

    The state it carries from one message to the next is reset by every message that is
    not a tool message (a user message clears it; an assistant message replaces it with
    its own calls), so a sequence can be checked in pieces that start at such a message:
    the history Middleware relies on that (``scope.history._replay``)."""
    in_prefix = True
    open_calls: dict[str, bool] | None = None  # call id -> answered, after a tool-call message
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise error(f"messages[{index}] must be a Message, got {type(message).__name__}")
        role = message.role
        if role is Role.SYSTEM:
            if not in_prefix:
                raise error(f"messages[{index}]: system messages must form a leading prefix")
            continue
        in_prefix = False
        if role is Role.TOOL:
            if open_calls is None:
                raise error(
                    f"messages[{index}]: a tool message must follow an assistant message "
                    "with tool calls"
                )
            for part_index, part in enumerate(message.parts):
                result = part.tool_result
                assert result is not None
                answered = open_calls.get(result.id)
                if answered is None:
                    raise error(
                        f"messages[{index}].parts[{part_index}]: tool result {result.id!r} "
                        "answers no call of the preceding assistant message"
                    )
                if answered:
                    raise error(
                        f"messages[{index}].parts[{part_index}]: tool call {result.id!r} "
                        "is answered more than once"
                    )
                open_calls[result.id] = True
            continue
        open_calls = None
        if role is Role.ASSISTANT:
            calls: dict[str, bool] = {}
            for part_index, part in enumerate(message.parts):
                if part.kind is PartKind.TOOL_CALL_DELTA:
                    raise error(
                        f"messages[{index}].parts[{part_index}]: a request must not carry "
                        "tool_call_delta parts"
                    )
                if part.tool_call is not None:
                    if part.tool_call.id in calls:
                        raise error(
                            f"messages[{index}].parts[{part_index}]: tool call id "
                            f"{part.tool_call.id!r} is repeated"
                        )
                    calls[part.tool_call.id] = False
            if calls:
                open_calls = calls
