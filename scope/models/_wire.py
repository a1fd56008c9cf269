"""What the two wire mappings (``_openai_wire``, ``_anthropic_wire``) share: preparing a
request, options and extensions as body fields, tool specs, content blocks of text and
media, and turning a value's refusal of what the server sent into
``InvalidResponseError``.

Pure: no I/O and no HTTP library. The JSON shape checks live in ``_json_shape``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, final

import orjson

from scope.chat import Options, Part, PartKind, Request, ToolDefinition
from scope.errors import (
    InvalidRequestError,
    InvalidResponseError,
    ScopeError,
    UnsupportedOptionError,
)
from scope.jsonvalue import RawJSON
from scope.media import Media

__all__ = [
    "as_invalid_response",
    "extension_fields",
    "prepare",
    "put_options",
    "text_and_media_blocks",
    "tool_spec",
]


def prepare(
    request: Request, default_options: Options, model: str, adapter: str
) -> tuple[Options, str]:
    """Validate ``request``; return its options resolved over ``default_options`` and
    the model to ask for (the options' or ``model``). ``InvalidRequestError`` for a
    request that is not valid or names no model (``adapter`` is the class to name)."""
    if not isinstance(request, Request):
        raise InvalidRequestError(f"request must be a Request, got {type(request).__name__}")
    request.validate()
    options = default_options.resolve(request.options)
    chosen = options.model or model
    if not chosen:
        raise InvalidRequestError(f"no model: set Options.model or pass a model to {adapter}")
    return options, chosen


def put_options(options: Options, body: dict[str, Any], fields: Iterable[tuple[str, str]]) -> None:
    """``body[field] = options.<option>`` for each ``(option, field)`` whose option is
    set (not None), in order."""
    for option, field in fields:
        value = getattr(options, option)
        if value is not None:
            body[field] = value


def extension_fields(
    options: Options, namespace: str, reserved: frozenset[str], adapter: str
) -> Iterator[tuple[str, RawJSON]]:
    """The extensions ``<namespace>/<field>`` as ``(field, value)``, in order; one that
    would overwrite a field the adapter sets itself (``reserved``) is refused
    (``UnsupportedOptionError``) when it is reached. Other namespaces are for other
    providers: not yielded."""
    for name, raw in options.extensions.namespace(namespace).items():
        if name in reserved:
            raise UnsupportedOptionError(
                f"extension '{namespace}/{name}' would overwrite the {name!r} field, which "
                f"{adapter} sets itself"
            )
        yield name, raw


def tool_spec(tool: ToolDefinition, schema_field: str) -> dict[str, Any]:
    """A tool's name, description (when it has one) and input schema (verbatim, as
    ``schema_field``)."""
    spec: dict[str, Any] = {"name": tool.name}
    if tool.description:
        spec["description"] = tool.description
    spec[schema_field] = orjson.Fragment(tool.input_schema.bytes)
    return spec


def text_and_media_blocks(
    parts: Iterable[Part], where: str, media: Callable[[Media, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Text and media parts as content blocks: ``{"type": "text", "text": ...}`` for a
    text part, ``media(part.media, "<where>[<index>]")`` for a media part."""
    blocks: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        if part.kind is PartKind.TEXT:
            blocks.append({"type": "text", "text": part.text})
        else:
            assert part.media is not None
            blocks.append(media(part.media, f"{where}[{index}]"))
    return blocks


@final
class as_invalid_response:
    """``with as_invalid_response(where):`` a ``ScopeError`` raised inside (a scope value
    refusing what the server sent) becomes ``InvalidResponseError`` ``"<where>: <error>"``
    with the error as ``__cause__``; an ``InvalidResponseError`` passes unchanged."""

    __slots__ = ("_where",)

    def __init__(self, where: str) -> None:
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, ScopeError) and not isinstance(exc, InvalidResponseError):
            raise InvalidResponseError(f"{self._where}: {exc}") from exc
