"""Tool calls, tool results, parts and messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias, TypeVar, final

import attrs

from scope._validate import check_text, nested, to_bytes, to_enum, to_tuple
from scope.chat._types import PartKind, PartKindLike, Role, RoleLike
from scope.errors import (
    InvalidMessageError,
    InvalidPartError,
    InvalidToolCallError,
    InvalidToolResultError,
)
from scope.jsonvalue import JSONDocument, RawJSON, coerce_raw_json
from scope.media import Media
from scope.metadata import EMPTY_METADATA, Metadata

__all__ = [
    "Message",
    "NativeItem",
    "Part",
    "ToolCall",
    "ToolCallDelta",
    "ToolOutput",
    "ToolResult",
    "assistant_message",
    "media_part",
    "native_part",
    "reasoning_part",
    "system_message",
    "text_part",
    "tool_call_delta_part",
    "tool_call_part",
    "tool_message",
    "tool_result_part",
    "user_message",
]


def _check_call(value: ToolCall | ToolCallDelta, what: str) -> None:
    check_text(value.id, f"{what} id", InvalidToolCallError, required=True)
    check_text(value.name, f"{what} name", InvalidToolCallError, required=True)
    check_text(value.arguments, f"{what} arguments", InvalidToolCallError)


@final
@attrs.frozen
class ToolCall:
    """A complete tool call. ``arguments`` is the model's exact text: never parsed or
    re-spelled, so it may be malformed JSON."""

    id: str
    name: str
    arguments: str = ""

    def __attrs_post_init__(self) -> None:
        _check_call(self, "tool call")

    def validate(self) -> None:
        """Check the call (construction already did)."""
        _check_call(self, "tool call")


@final
@attrs.frozen
class ToolCallDelta:
    """One streamed fragment of a tool call; fragments merge by ``id``."""

    id: str
    name: str
    arguments: str = ""

    def __attrs_post_init__(self) -> None:
        _check_call(self, "tool call delta")

    def validate(self) -> None:
        """Check the fragment (construction already did)."""
        _check_call(self, "tool call delta")


def _optional_raw_json(value: JSONDocument | None) -> RawJSON | None:
    if value is None:
        return None
    raw = coerce_raw_json(value)
    # The JSON document ``null`` is "no details": the wire cannot tell them apart
    # ("details":null decodes as absent), so both are None and round trips stay equal.
    return None if raw == _NULL else raw


_NULL = RawJSON.parse("null")


def _to_details(value: JSONDocument | None) -> RawJSON | None:
    return nested(_optional_raw_json, value, InvalidToolResultError, "tool output details")


def _to_content(value: Iterable[Part]) -> tuple[Part, ...]:
    return to_tuple(value)


@final
@attrs.frozen
class ToolOutput:
    """What a tool returned: text and media parts, and/or a JSON ``details`` document.

    ``details`` is None when absent; the JSON document ``null`` counts as absent.
    """

    content: tuple[Part, ...] = attrs.field(default=(), converter=_to_content)
    details: RawJSON | None = attrs.field(default=None, converter=_to_details)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the output (construction already did)."""
        if type(self.content) is not tuple:
            raise InvalidToolResultError(
                "tool output content must be a sequence of parts, got "
                f"{type(self.content).__name__}"
            )
        for index, part in enumerate(self.content):
            if not isinstance(part, Part):
                raise InvalidToolResultError(
                    f"tool output content[{index}] must be a Part, got {type(part).__name__}"
                )
            if part.kind is not PartKind.TEXT and part.kind is not PartKind.MEDIA:
                raise InvalidToolResultError(
                    f"tool output content[{index}] must be a text or media part, got {part.kind}"
                )

    @classmethod
    def of_text(cls, text: str) -> ToolOutput:
        """Output of one text part; empty text gives the empty output."""
        if text == "":
            return cls()
        try:
            return cls((text_part(text),))
        except InvalidPartError as exc:
            raise InvalidToolResultError(f"tool output text: {exc}") from exc

    @classmethod
    def of_json(
        cls, raw: RawJSON | str | bytes | bytearray | memoryview | dict[str, Any] | list[Any]
    ) -> ToolOutput:
        """Output whose details are a JSON document (RawJSON, JSON text, dict or list)."""
        try:
            details = (
                RawJSON.parse(raw)
                if isinstance(raw, str | bytes | bytearray | memoryview)
                else coerce_raw_json(raw)
            )
        except Exception as exc:
            if not isinstance(exc, ValueError):
                raise
            raise InvalidToolResultError(f"tool output details: {exc}") from exc
        return cls(details=details)

    def text(self) -> str | None:
        """The concatenated text; the details JSON when content is empty; None when the
        content holds media."""
        if not self.content:
            return "" if self.details is None else str(self.details)
        if any(part.kind is PartKind.MEDIA for part in self.content):
            return None
        return "".join(part.text for part in self.content)


@final
@attrs.frozen
class ToolResult:
    """The answer to one tool call, matched by ``id``."""

    id: str
    name: str
    output: ToolOutput = attrs.field(factory=ToolOutput)
    is_error: bool = False

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the result (construction already did)."""
        check_text(self.id, "tool result id", InvalidToolResultError, required=True)
        check_text(self.name, "tool result name", InvalidToolResultError, required=True)
        if not isinstance(self.output, ToolOutput):
            raise InvalidToolResultError(
                f"tool result output must be a ToolOutput, got {type(self.output).__name__}"
            )
        if type(self.is_error) is not bool:
            raise InvalidToolResultError(
                f"tool result is_error must be a bool, got {type(self.is_error).__name__}"
            )


#: What a native item's data may be given as: a JSON document, or its JSON text.
NativeData: TypeAlias = "JSONDocument | str | bytes | bytearray | memoryview"


def _native_data(value: NativeData) -> RawJSON:
    if isinstance(value, str | bytes | bytearray | memoryview):
        return RawJSON.parse(value)
    return coerce_raw_json(value)


def _to_native_data(value: NativeData) -> RawJSON:
    if type(value) is RawJSON:
        return value
    return nested(_native_data, value, InvalidPartError, "native item data")


@final
@attrs.frozen
class NativeItem:
    """A provider's own output item or content block, kept whole (DESIGN §6k).

    ``provider`` names whose wire form ``data`` is in (``openai.responses``,
    ``anthropic.messages``, ``gemini``: the adapter's ``scope/api``), ``type`` the item's
    kind in that wire form (``web_search_call``, ``server_tool_use``,
    ``executableCode``), and ``data`` the provider's JSON of that one item, verbatim (a
    JSON object: key order and whitespace don't count, strings and numbers do). Only the
    adapter that produced it sends it back; every other model is sent nothing of it.
    """

    provider: str
    type: str
    data: RawJSON = attrs.field(converter=_to_native_data)

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the item (construction already did): provider and type non-empty and
        free of surrounding whitespace, data a JSON object (``InvalidPartError``)."""
        check_text(
            self.provider, "native item provider", InvalidPartError, required=True, strip=True
        )
        check_text(self.type, "native item type", InvalidPartError, required=True, strip=True)
        if type(self.data) is not RawJSON:
            raise InvalidPartError(
                f"native item data must be RawJSON, got {type(self.data).__name__}"
            )
        if not self.data.bytes.startswith(b"{"):
            raise InvalidPartError(f"native item data must be a JSON object, got {self.data}")


_PAYLOADS: Final = ("media", "tool_call", "tool_call_delta", "tool_result", "native")
_PAYLOAD_TYPES: Final[dict[str, type]] = {
    "media": Media,
    "tool_call": ToolCall,
    "tool_call_delta": ToolCallDelta,
    "tool_result": ToolResult,
    "native": NativeItem,
}
#: The kinds ``Part.validate`` compares with, as module constants (an enum member read
#: through its class costs a lookup on the metaclass each time; validate is hot).
_TEXT: Final = PartKind.TEXT
_REASONING: Final = PartKind.REASONING

#: The payload field each kind selects (text and reasoning carry none).
_PAYLOAD_OF: Final[dict[PartKind, str | None]] = {
    PartKind.TEXT: None,
    PartKind.MEDIA: "media",
    PartKind.REASONING: None,
    PartKind.TOOL_CALL: "tool_call",
    PartKind.TOOL_CALL_DELTA: "tool_call_delta",
    PartKind.TOOL_RESULT: "tool_result",
    PartKind.NATIVE: "native",
}


def _to_part_kind(value: PartKindLike) -> PartKind:
    if type(value) is PartKind:
        return value
    return to_enum(PartKind, value, InvalidPartError, "part kind")


def _to_signature(value: bytes | bytearray | memoryview) -> bytes:
    return to_bytes(value)


def _to_part_metadata(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidPartError, "part metadata")


@final
@attrs.frozen
class Part:
    """One piece of a message. ``kind`` selects exactly one payload:

    text (non-empty ``text``), media, reasoning (``text`` and/or ``signature``),
    tool_call, tool_call_delta, tool_result or native (a provider's own item, DESIGN
    §6k). Every other payload field stays empty.
    """

    kind: PartKind = attrs.field(converter=_to_part_kind)
    text: str = ""
    media: Media | None = None
    signature: bytes = attrs.field(default=b"", converter=_to_signature)
    tool_call: ToolCall | None = None
    tool_call_delta: ToolCallDelta | None = None
    tool_result: ToolResult | None = None
    metadata: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_part_metadata)
    native: NativeItem | None = None

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the part (construction already did)."""
        kind = self.kind
        if type(kind) is not PartKind:
            raise InvalidPartError(f"part kind must be a PartKind, got {kind!r}")
        text = self.text
        if type(text) is not str or not text.isascii():
            check_text(text, "part text", InvalidPartError)
        if type(self.signature) is not bytes:
            raise InvalidPartError(
                f"part signature must be bytes, got {type(self.signature).__name__}"
            )
        if type(self.metadata) is not Metadata:
            raise InvalidPartError(
                f"part metadata must be Metadata, got {type(self.metadata).__name__}"
            )
        # Fast path: exactly the payload the kind selects is set, with the right type.
        payload_name = _PAYLOAD_OF[kind]
        set_count = (
            (self.media is not None)
            + (self.tool_call is not None)
            + (self.tool_call_delta is not None)
            + (self.tool_result is not None)
            + (self.native is not None)
        )
        if payload_name is None:
            if set_count:
                self._payload_error(kind)
        elif (
            set_count != 1 or type(getattr(self, payload_name)) is not _PAYLOAD_TYPES[payload_name]
        ):
            self._payload_error(kind)
        if kind is _TEXT:
            if not text:
                raise InvalidPartError("a text part needs non-empty text")
        elif kind is _REASONING:
            if not text and not self.signature:
                raise InvalidPartError("a reasoning part needs text or a signature")
        elif text:
            raise InvalidPartError(f"a {kind} part must not set text")
        if self.signature and kind is not _REASONING:
            raise InvalidPartError(f"a {kind} part must not set a signature")

    def _payload_error(self, kind: PartKind) -> None:
        for name in _PAYLOADS:
            payload = getattr(self, name)
            if payload is None:
                if name == kind:
                    raise InvalidPartError(f"a {kind} part needs its {name}")
                continue
            if name != kind:
                raise InvalidPartError(f"a {kind} part must not set {name}")
            if type(payload) is not _PAYLOAD_TYPES[name]:
                raise InvalidPartError(
                    f"part {name} must be a {_PAYLOAD_TYPES[name].__name__}, "
                    f"got {type(payload).__name__}"
                )
        raise AssertionError("unreachable: _payload_error found no error")  # pragma: no cover


def native_part(
    provider: str,
    type: str,
    data: NativeData,
    metadata: Metadata | dict[str, Any] | None = None,
) -> Part:
    """A native part: the provider's own item ``data`` (its wire JSON, whole) of kind
    ``type`` in the wire form ``provider`` (DESIGN §6k)."""
    try:
        item = NativeItem(provider, type, data)
    except InvalidPartError as exc:
        raise InvalidPartError(f"part native: {exc}") from exc
    return Part(PartKind.NATIVE, native=item, metadata=_or_empty(metadata))


def _or_empty(metadata: Metadata | dict[str, Any] | None) -> Metadata | dict[str, Any]:
    return EMPTY_METADATA if metadata is None else metadata


_C = TypeVar("_C")


def _tool_call_payload(make: Callable[[str, str, str], _C], what: str, *args: str) -> _C:
    """``make(id, name, arguments)``; its ``InvalidToolCallError`` as ``InvalidPartError``."""
    try:
        return make(*args)
    except InvalidToolCallError as exc:
        raise InvalidPartError(f"part {what}: {exc}") from exc


def text_part(text: str, metadata: Metadata | dict[str, Any] | None = None) -> Part:
    """A text part."""
    return Part(PartKind.TEXT, text=text, metadata=_or_empty(metadata))


def media_part(media: Media, metadata: Metadata | dict[str, Any] | None = None) -> Part:
    """A media part."""
    return Part(PartKind.MEDIA, media=media, metadata=_or_empty(metadata))


def reasoning_part(
    text: str = "",
    signature: bytes | bytearray | memoryview = b"",
    metadata: Metadata | dict[str, Any] | None = None,
) -> Part:
    """A reasoning part: visible reasoning text and/or an opaque provider signature."""
    return Part(PartKind.REASONING, text=text, signature=signature, metadata=_or_empty(metadata))


def tool_call_part(
    id: str, name: str, arguments: str = "", metadata: Metadata | dict[str, Any] | None = None
) -> Part:
    """A complete tool-call part."""
    call = _tool_call_payload(ToolCall, "tool_call", id, name, arguments)
    return Part(PartKind.TOOL_CALL, tool_call=call, metadata=_or_empty(metadata))


def tool_call_delta_part(
    id: str, name: str, arguments: str = "", metadata: Metadata | dict[str, Any] | None = None
) -> Part:
    """A streamed tool-call fragment part."""
    delta = _tool_call_payload(ToolCallDelta, "tool_call_delta", id, name, arguments)
    return Part(PartKind.TOOL_CALL_DELTA, tool_call_delta=delta, metadata=_or_empty(metadata))


def tool_result_part(result: ToolResult, metadata: Metadata | dict[str, Any] | None = None) -> Part:
    """A tool-result part."""
    return Part(PartKind.TOOL_RESULT, tool_result=result, metadata=_or_empty(metadata))


_ALLOWED: Final[dict[Role, frozenset[PartKind]]] = {
    Role.SYSTEM: frozenset({PartKind.TEXT}),
    Role.USER: frozenset({PartKind.TEXT, PartKind.MEDIA}),
    Role.ASSISTANT: frozenset(
        {
            PartKind.TEXT,
            PartKind.MEDIA,
            PartKind.REASONING,
            PartKind.TOOL_CALL,
            PartKind.TOOL_CALL_DELTA,
            PartKind.NATIVE,
        }
    ),
    Role.TOOL: frozenset({PartKind.TOOL_RESULT}),
}


def _to_role(value: RoleLike) -> Role:
    if type(value) is Role:
        return value
    return to_enum(Role, value, InvalidMessageError, "message role")


def _to_parts_field(value: Iterable[Part]) -> tuple[Part, ...]:
    return to_tuple(value)


def _to_message_metadata(value: Mapping[str, Any]) -> Metadata:
    if type(value) is Metadata:
        return value
    return nested(Metadata.coerce, value, InvalidMessageError, "message metadata")


@final
@attrs.frozen
class Message:
    """A message: a role and at least one part of a kind that role may carry.

    system: text; user: text, media; assistant: text, media, reasoning, tool_call,
    tool_call_delta, native; tool: tool_result.
    """

    role: Role = attrs.field(converter=_to_role)
    parts: tuple[Part, ...] = attrs.field(converter=_to_parts_field)
    metadata: Metadata = attrs.field(default=EMPTY_METADATA, converter=_to_message_metadata)
    # The canonical JSON encoding, filled by scope.codec on first encode. Not part of the
    # value: excluded from __init__, eq, hash and repr; attrs.evolve starts it afresh.
    # Safe to share across threads: every writer stores the same bytes.
    _json: bytes | None = attrs.field(
        default=None, init=False, eq=False, hash=False, repr=False, alias="_json"
    )

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the message (construction already did)."""
        if type(self.metadata) is not Metadata:
            raise InvalidMessageError(
                f"message metadata must be Metadata, got {type(self.metadata).__name__}"
            )
        if type(self.parts) is not tuple:
            raise InvalidMessageError(
                f"message parts must be a sequence of parts, got {type(self.parts).__name__}"
            )
        if not self.parts:
            raise InvalidMessageError(f"a {self.role} message needs at least one part")
        allowed = _ALLOWED[self.role]
        for index, part in enumerate(self.parts):
            if not isinstance(part, Part):
                raise InvalidMessageError(
                    f"parts[{index}] must be a Part, got {type(part).__name__}"
                )
            if part.kind not in allowed:
                raise InvalidMessageError(
                    f"parts[{index}]: a {self.role} message cannot carry a {part.kind} part"
                )

    @property
    def text(self) -> str:
        """The text parts concatenated (reasoning, native and other parts excluded)."""
        return "".join(part.text for part in self.parts if part.kind is PartKind.TEXT)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The complete tool calls of this message, in order."""
        return tuple(p.tool_call for p in self.parts if p.tool_call is not None)

    @property
    def tool_results(self) -> tuple[ToolResult, ...]:
        """The tool results of this message, in order."""
        return tuple(p.tool_result for p in self.parts if p.tool_result is not None)


def _to_parts(parts: Iterable[Part | str], error: type[Exception]) -> tuple[Part, ...]:
    out: list[Part] = []
    for index, part in enumerate(parts):
        if isinstance(part, str):
            try:
                out.append(text_part(part))
            except InvalidPartError as exc:
                raise error(f"parts[{index}]: {exc}") from exc
        else:
            out.append(part)
    return tuple(out)


def system_message(text: str) -> Message:
    """A system message of one text part."""
    return Message(Role.SYSTEM, _to_parts((text,), InvalidMessageError))


def user_message(*parts: Part | str) -> Message:
    """A user message; ``str`` arguments become text parts."""
    return Message(Role.USER, _to_parts(parts, InvalidMessageError))


def assistant_message(*parts: Part | str) -> Message:
    """An assistant message; ``str`` arguments become text parts."""
    return Message(Role.ASSISTANT, _to_parts(parts, InvalidMessageError))


def tool_message(*results: ToolResult) -> Message:
    """A tool message of one tool-result part per result."""
    parts: list[Part] = []
    for index, result in enumerate(results):
        try:
            parts.append(tool_result_part(result))
        except InvalidPartError as exc:
            raise InvalidMessageError(f"parts[{index}]: {exc}") from exc
    return Message(Role.TOOL, parts)
