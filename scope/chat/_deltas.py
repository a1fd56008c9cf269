"""Stream values built without the cost of their validating constructors:
``text_delta`` (the chunk of one text or reasoning fragment), ``token_usage`` and
``response_metadata`` (which a provider may send with every chunk).

Almost every chunk a provider adapter yields is ``Response(Output(Message(ASSISTANT,
(Part(kind, text=text, metadata=metadata),))), metadata)``. Built through the four
``__init__`` methods it costs ~3 us, most of it re-checking what the shape already
guarantees (a one-part tuple, an assistant role, no payload, no finish reason). Here the
checks that can fail for this shape run first, exactly as ``Part.validate`` runs them, and
the values are assembled through each slot's member descriptor (``object.__new__`` plus
what ``object.__setattr__`` ends up calling, as the codec's generated structurers do).
Anything the fast checks do not accept takes the checked constructors, so an invalid
value never exists and every error is the one the constructors raise.
``token_usage`` and ``response_metadata`` accept what the fast paths of ``Usage.validate`` and
``ResponseMetadata.validate`` accept (inlined) and otherwise take the constructor, the
same way; their converters are no-ops on what they accept (a ``Usage``, a ``Metadata``).
tests/chat/test_deltas.py proves with hypothesis that each function and its constructors agree
on every input.

Public through ``scope.chat`` (a provider adapter of anyone's builds its chunks with
them; ``scope.models`` does).
"""

from __future__ import annotations

from typing import Any, Final

from scope._json import check_str
from scope._validate import MAX_INT
from scope.chat._message import Message, Part
from scope.chat._response import Output, Response, ResponseMetadata, Usage
from scope.chat._types import PartKind, Role
from scope.metadata import EMPTY_METADATA, Metadata

__all__ = ["response_metadata", "text_delta", "token_usage"]

_TEXT: Final = PartKind.TEXT
_REASONING: Final = PartKind.REASONING
_ASSISTANT: Final = Role.ASSISTANT
_new: Final = object.__new__


def _setters(cls: type, *names: str) -> tuple[Any, ...]:
    """The member descriptors' ``__set__`` of ``cls``'s slots, in ``names`` order; every
    slot must be named (a new field makes this fail at import, not build half values)."""
    slots = {name for base in cls.__mro__ for name in getattr(base, "__slots__", ())}
    slots.discard("__weakref__")
    if slots != set(names):
        raise AssertionError(f"{cls.__name__} slots {sorted(slots)} != {sorted(names)}")
    return tuple(cls.__dict__[name].__set__ for name in names)


(
    _part_kind,
    _part_text,
    _part_media,
    _part_signature,
    _part_call,
    _part_call_delta,
    _part_result,
    _part_metadata,
    _part_native,
) = _setters(
    Part,
    "kind",
    "text",
    "media",
    "signature",
    "tool_call",
    "tool_call_delta",
    "tool_result",
    "metadata",
    "native",
)
_message_role, _message_parts, _message_metadata, _message_json = _setters(
    Message, "role", "parts", "metadata", "_json"
)
_output_message, _output_finish, _output_metadata, _output_message_metadata = _setters(
    Output, "message", "finish_reason", "metadata", "message_metadata"
)
_response_output, _response_metadata = _setters(Response, "output", "metadata")
_usage_setters: Final = _setters(
    Usage,
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
)
_meta_id, _meta_model, _meta_usage, _meta_extra = _setters(
    ResponseMetadata, "id", "model", "usage", "extra"
)


def token_usage(
    input_tokens: int = 0,
    output_tokens: int = 0,
    reasoning_tokens: int | None = None,
    cache_read_input_tokens: int | None = None,
    cache_write_input_tokens: int | None = None,
) -> Usage:
    """``Usage(...)`` of the same arguments, cheaper for valid counts: an equal value,
    or the same ``InvalidUsageError`` (anything the fast check does not accept takes the
    constructor). For code that builds a usage snapshot per streamed chunk."""
    reasoning = reasoning_tokens
    cache_read = cache_read_input_tokens
    cache_write = cache_write_input_tokens
    if not (
        # ``Usage.validate``'s fast path, inlined: the counts it accepts need no other
        # check (tests/chat/test_deltas.py); anything else takes the constructor.
        type(input_tokens) is int
        and type(output_tokens) is int
        and input_tokens >= 0
        and output_tokens >= 0
        and input_tokens + output_tokens <= MAX_INT
        and (reasoning is None or (type(reasoning) is int and 0 <= reasoning <= output_tokens))
        and (cache_read is None or (type(cache_read) is int and 0 <= cache_read <= input_tokens))
        and (cache_write is None or (type(cache_write) is int and 0 <= cache_write <= input_tokens))
    ):
        return Usage(input_tokens, output_tokens, reasoning, cache_read, cache_write)
    value = _new(Usage)
    set_input, set_output, set_reasoning, set_read, set_write = _usage_setters
    set_input(value, input_tokens)
    set_output(value, output_tokens)
    set_reasoning(value, reasoning_tokens)
    set_read(value, cache_read_input_tokens)
    set_write(value, cache_write_input_tokens)
    return value


def response_metadata(
    id: str = "",
    model: str = "",
    usage: Usage | None = None,
    extra: Metadata = EMPTY_METADATA,
) -> ResponseMetadata:
    """``ResponseMetadata(id, model, usage, extra)``, cheaper for the usual input: an
    equal value, or the same error. With a ``Usage`` (``token_usage`` makes one), a
    ``Metadata`` and an ASCII id and model without surrounding whitespace the fields are
    written directly; anything else takes the constructor. For code that sends response
    metadata with streamed chunks."""
    if not (
        type(usage) is Usage
        and type(extra) is Metadata
        and type(id) is str
        and type(model) is str
        and id.isascii()
        and model.isascii()
        and id.strip() == id
        and model.strip() == model
    ):
        return ResponseMetadata(id, model, usage, extra)
    value = _new(ResponseMetadata)
    _meta_id(value, id)
    _meta_model(value, model)
    _meta_usage(value, usage)
    _meta_extra(value, extra)
    return value


def text_delta(
    kind: PartKind,
    text: str,
    metadata: Metadata = EMPTY_METADATA,
    response_metadata: ResponseMetadata | None = None,
) -> Response:
    """The stream chunk of one text or reasoning fragment: ``Response(Output(Message(
    Role.ASSISTANT, (Part(kind, text=text, metadata=metadata),))), response_metadata)``.

    Equal to what those constructors build and raising what they raise
    (``InvalidPartError`` for empty text or a lone surrogate, ...), at about half the
    cost for the usual input: ``kind`` text or reasoning, ``text`` a non-empty
    valid ``str``, ``metadata`` a ``Metadata`` and ``response_metadata`` None or a
    ``ResponseMetadata``. The message metadata is ``EMPTY_METADATA`` itself (what the
    accumulator's fast path looks for). For a provider adapter's stream mapper: most of
    the chunks it yields are of this shape."""
    if (
        (kind is _TEXT or kind is _REASONING)
        and type(text) is str
        and text
        and (text.isascii() or check_str(text))
        and type(metadata) is Metadata
        and (response_metadata is None or type(response_metadata) is ResponseMetadata)
    ):
        # What Part/Message/Output/Response.validate check for this shape, all true:
        # the kind's payload (none) is the only one set, the text is non-empty valid
        # Unicode, the signature is b"", the metadata is Metadata; the message has one
        # Part of a kind an assistant may carry; the output's message is an assistant
        # Message; the response's output is an Output and its metadata None or
        # ResponseMetadata. No converter changes any of these inputs.
        part = _new(Part)
        _part_kind(part, kind)
        _part_text(part, text)
        _part_media(part, None)
        _part_signature(part, b"")
        _part_call(part, None)
        _part_call_delta(part, None)
        _part_result(part, None)
        _part_metadata(part, metadata)
        _part_native(part, None)
        message = _new(Message)
        _message_role(message, _ASSISTANT)
        _message_parts(message, (part,))
        _message_metadata(message, EMPTY_METADATA)
        _message_json(message, None)
        output = _new(Output)
        _output_message(output, message)
        _output_finish(output, None)
        _output_metadata(output, None)
        _output_message_metadata(output, EMPTY_METADATA)
        response = _new(Response)
        _response_output(response, output)
        _response_metadata(response, response_metadata)
        return response
    part = Part(kind, text=text, metadata=metadata)
    return Response(Output(Message(_ASSISTANT, (part,))), response_metadata)
