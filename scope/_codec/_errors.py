"""Decode failures: the error each class raises, and the path that names the bad value.

A structurer raises ``Fail`` at the bad value; every level it unwinds through prepends
its step (a field name, an array index, a metadata ``Key``), and the entry point turns it
into the target type's error, ``messages[1].parts[0].kind: ...``, with the inner error
as ``__cause__``.
"""

from __future__ import annotations

import typing
from typing import Any, Final

from scope._json import Num
from scope.chat import (
    Message,
    NativeItem,
    Options,
    Output,
    OutputFormat,
    OutputMetadata,
    Part,
    Request,
    Response,
    ResponseMetadata,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
)
from scope.errors import (
    InvalidJSONError,
    InvalidMediaError,
    InvalidMessageError,
    InvalidMetadataError,
    InvalidOptionsError,
    InvalidOutputFormatError,
    InvalidPartError,
    InvalidRequestError,
    InvalidResponseError,
    InvalidToolCallError,
    InvalidToolDefinitionError,
    InvalidToolResultError,
    InvalidUsageError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, Source
from scope.metadata import Extensions, Metadata

__all__ = [
    "ERRORS",
    "PLAIN",
    "VALUE_ERRORS",
    "Fail",
    "Key",
    "decode_error_for",
    "expected",
    "raise_as",
]

#: The protocol value classes, each decoded and encoded by generated functions, and the
#: error each raises when it cannot be decoded.
VALUE_ERRORS: Final[dict[type, type[Exception]]] = {
    Source: InvalidMediaError,
    Media: InvalidMediaError,
    ToolCall: InvalidToolCallError,
    ToolCallDelta: InvalidToolCallError,
    ToolOutput: InvalidToolResultError,
    ToolResult: InvalidToolResultError,
    NativeItem: InvalidPartError,
    Part: InvalidPartError,
    Message: InvalidMessageError,
    ToolDefinition: InvalidToolDefinitionError,
    OutputFormat: InvalidOutputFormatError,
    Options: InvalidOptionsError,
    Request: InvalidRequestError,
    Usage: InvalidUsageError,
    ResponseMetadata: InvalidResponseError,
    OutputMetadata: InvalidResponseError,
    Output: InvalidResponseError,
    Response: InvalidResponseError,
}

#: The error every decodable class raises (``register_own`` adds more).
ERRORS: Final[dict[type, type[Exception]]] = {
    **VALUE_ERRORS,
    Metadata: InvalidMetadataError,
    Extensions: InvalidMetadataError,
    RawJSON: InvalidJSONError,
}

#: Targets decoded into plain JSON types, and the JSON type each needs at the top (what
#: ``OutputFormat.schema_as(dict)`` decodes into).
PLAIN: Final[dict[Any, type | None]] = {
    dict: dict,
    dict[str, Any]: dict,
    list: list,
    list[Any]: list,
    Any: None,
}


def decode_error_for(cls: Any) -> type[Exception]:
    """The error class ``from_json(..., cls)`` raises for bad input (for ``list[X]`` and
    ``tuple[X, ...]``, the error of ``X``)."""
    origin = typing.get_origin(cls)
    if (origin is list or origin is tuple) and cls not in PLAIN:
        return decode_error_for(typing.get_args(cls)[0])
    return ERRORS.get(cls, InvalidJSONError)


class Key(str):
    """A metadata key in an error path (shown as ``['key']``)."""

    __slots__ = ()


class Fail(Exception):
    """A decoding failure on its way up; the path is built as it unwinds."""

    def __init__(
        self, message: str, error: type[Exception], cause: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error = error
        self.cause = cause
        self.path: list[str | int] = []

    def at(self, step: str | int) -> Fail:
        self.path.insert(0, step)
        return self


#: How a JSON value of each type is named in messages (numbers also show the value).
_JSON_TYPES: Final[dict[type, str]] = {
    bool: "boolean",
    str: "string",
    type(None): "null",
    dict: "object",
    list: "array",
    tuple: "array",
}


def _json_type(value: Any) -> str:
    if isinstance(value, Num):
        return f"number {value}"
    for base in type(value).__mro__:  # bool before int, subclasses as their base
        name = _JSON_TYPES.get(base)
        if name is not None:
            return name
        if base is int or base is float:
            return f"number {value!r}"
    return type(value).__name__


def expected(what: str, value: Any, error: type[Exception]) -> Fail:
    """The failure for a value of the wrong JSON type."""
    return Fail(f"expected {what}, got {_json_type(value)}", error)


def raise_as(cls: Any, fail: Fail) -> typing.NoReturn:
    """Raise ``decode_error_for(cls)`` for a failure, its path before its message."""
    error = decode_error_for(cls)
    path = ""
    for step in fail.path:
        if isinstance(step, int):
            path += f"[{step}]"
        elif isinstance(step, Key):
            path += f"[{str(step)!r}]"
        else:
            path += f".{step}" if path else step
    message = f"{path}: {fail.message}" if path else fail.message
    cause = fail.cause
    if cause is None and fail.error is not error:
        cause = fail.error(message)
    raise error(message) from cause
