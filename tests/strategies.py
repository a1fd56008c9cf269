"""Hypothesis strategies for every scope value, shared by the whole test suite.

Import them as ``from tests.strategies import messages, requests, responses`` (pytest is
run as ``python -m pytest`` from the repository root). Every strategy draws only valid
values: building them never raises. Sizes are kept small so that property tests stay fast.

Stable names: ``raw_json``, ``json_texts``, ``json_values``, ``metadata``, ``extensions``,
``media``, ``sources``, ``tool_calls``, ``tool_call_deltas``, ``tool_outputs``,
``tool_results``, ``parts``, ``messages``, ``complete_assistant_messages``,
``tool_definitions``, ``output_formats``, ``options``, ``requests``, ``usage``,
``responses``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import orjson
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Message,
    NativeItem,
    Options,
    Output,
    OutputFormat,
    OutputMetadata,
    Part,
    PartKind,
    Request,
    Response,
    ResponseMetadata,
    Role,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
)
from scope.jsonvalue import RawJSON
from scope.media import Media, Source, SourceKind
from scope.metadata import Extensions, Metadata

__all__ = [
    "complete_assistant_messages",
    "extensions",
    "json_texts",
    "json_values",
    "media",
    "messages",
    "metadata",
    "options",
    "output_formats",
    "parts",
    "raw_json",
    "requests",
    "responses",
    "sources",
    "strings",
    "tool_call_deltas",
    "tool_calls",
    "tool_definitions",
    "tool_outputs",
    "tool_results",
    "usage",
]

# ------------------------------------------------------------------------- strings


@functools.cache
def strings(
    *, min_size: int = 0, max_size: int = 12, strip: bool = False
) -> st.SearchStrategy[str]:
    """Valid Unicode text (hypothesis never draws lone surrogates by default)."""
    base = st.text(min_size=min_size, max_size=max_size)
    if strip:
        base = base.map(str.strip).filter(lambda s: len(s) >= min_size)
    return base


_ids = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P")), min_size=1, max_size=8
)

# ------------------------------------------------------------------------- JSON

_WS = st.sampled_from(["", " ", "\n", "\t", "  \r\n"])

#: Number tokens in many spellings: 2.50, 1E-7, -0, 1e+02 ...
_number_tokens = st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,5})(\.[0-9]{1,4})?([eE][+-]?[0-9]{1,2})?\Z", fullmatch=True
)


def _string_token(value: str, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


_string_tokens = st.builds(_string_token, strings(max_size=8), st.booleans())


def _array_text(draw: st.DrawFn, items: list[str]) -> str:
    ws = draw(_WS)
    return "[" + ws + ("," + ws).join(items) + ws + "]"


@st.composite
def _object_text(draw: st.DrawFn, children: st.SearchStrategy[str]) -> str:
    members = draw(st.dictionaries(strings(max_size=6), children, max_size=4))
    ws = draw(_WS)
    body = ("," + ws).join(
        f"{_string_token(k, draw(st.booleans()))}{ws}:{ws}{v}" for k, v in members.items()
    )
    return "{" + ws + body + ws + "}"


@st.composite
def _list_text(draw: st.DrawFn, children: st.SearchStrategy[str]) -> str:
    return _array_text(draw, draw(st.lists(children, max_size=4)))


@functools.cache
def json_texts(*, max_leaves: int = 12) -> st.SearchStrategy[str]:
    """JSON documents as text with arbitrary whitespace, key order, string escapes and
    number spellings (no duplicate keys, no NaN, no lone surrogates)."""
    scalars = st.one_of(_number_tokens, _string_tokens, st.sampled_from(["true", "false", "null"]))
    return st.recursive(
        scalars,
        lambda children: st.one_of(_object_text(children), _list_text(children)),
        max_leaves=max_leaves,
    )


@functools.cache
def json_values() -> st.SearchStrategy[Any]:
    """Python values ``RawJSON.from_value`` accepts (finite floats, 64-bit-safe ints)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        strings(max_size=8),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(strings(max_size=6), children, max_size=4),
        ),
        max_leaves=10,
    )


@functools.cache
def raw_json(*, max_leaves: int = 12) -> st.SearchStrategy[RawJSON]:
    """RawJSON documents with varied number spellings."""
    return json_texts(max_leaves=max_leaves).map(RawJSON.parse)


@functools.cache
def _json_objects() -> st.SearchStrategy[RawJSON]:
    return st.builds(
        lambda props: RawJSON.from_value({"type": "object", "properties": props}),
        st.dictionaries(strings(min_size=1, max_size=6), st.just({"type": "string"}), max_size=3),
    )


# ------------------------------------------------------------------------- metadata, media


@functools.cache
def metadata(*, max_size: int = 3) -> st.SearchStrategy[Metadata]:
    """Metadata with RawJSON values (number spellings kept)."""
    values = raw_json(max_leaves=4)
    return st.dictionaries(strings(min_size=1, max_size=8), values, max_size=max_size).map(Metadata)


_segment = st.text(
    alphabet=st.one_of(st.characters(categories=("L", "Nd")), st.sampled_from("._-")),
    min_size=1,
    max_size=6,
)


@functools.cache
def extensions(*, max_size: int = 3) -> st.SearchStrategy[Extensions]:
    """Extensions with ``namespace/name`` keys."""
    keys = st.builds(lambda a, b: f"{a}/{b}", _segment, _segment)
    return st.dictionaries(keys, raw_json(max_leaves=4), max_size=max_size).map(Extensions)


_mimes = st.sampled_from(
    ["image/png", "image/jpeg", "audio/wav", "application/pdf", 'text/plain; charset="utf-8"']
)


@functools.cache
def sources() -> st.SearchStrategy[Source]:
    return st.one_of(
        st.builds(lambda d: Source(SourceKind.BYTES, data=d), st.binary(min_size=1, max_size=24)),
        st.builds(
            lambda host, path: Source(SourceKind.URI, uri=f"https://{host}.example/{path}"),
            st.from_regex(r"\A[a-z0-9]{1,8}\Z", fullmatch=True),
            st.from_regex(r"\A[a-z0-9/_.-]{0,12}\Z", fullmatch=True),
        ),
        st.builds(lambda r: Source(SourceKind.REFERENCE, ref=r), _ids),
    )


@functools.cache
def media() -> st.SearchStrategy[Media]:
    return st.builds(
        Media,
        _mimes,
        sources(),
        id=st.one_of(st.just(""), _ids),
        name=strings(max_size=8),
        metadata=st.one_of(st.just(Metadata()), metadata(max_size=1)),
    )


# ------------------------------------------------------------------------- tools, parts


@functools.cache
def tool_calls() -> st.SearchStrategy[ToolCall]:
    return st.builds(ToolCall, _ids, _ids, strings(max_size=16))


@functools.cache
def tool_call_deltas() -> st.SearchStrategy[ToolCallDelta]:
    return st.builds(ToolCallDelta, _ids, _ids, strings(max_size=16))


@functools.cache
def tool_outputs() -> st.SearchStrategy[ToolOutput]:
    content = st.lists(st.one_of(_text_parts(), _media_parts()), max_size=2)
    return st.builds(ToolOutput, content, st.one_of(st.none(), raw_json(max_leaves=6)))


@functools.cache
def tool_results(id: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[ToolResult]:
    return st.builds(
        ToolResult, id if id is not None else _ids, _ids, tool_outputs(), st.booleans()
    )


@functools.cache
def _part_metadata() -> st.SearchStrategy[Metadata]:
    return st.one_of(st.just(Metadata()), metadata(max_size=1))


@functools.cache
def _text_parts() -> st.SearchStrategy[Part]:
    return st.builds(
        Part, st.just(PartKind.TEXT), text=strings(min_size=1), metadata=_part_metadata()
    )


@functools.cache
def _media_parts() -> st.SearchStrategy[Part]:
    return st.builds(Part, st.just(PartKind.MEDIA), media=media(), metadata=_part_metadata())


def _safe_reasoning(text: str, signature: bytes, meta: Metadata) -> Part:
    if not text and not signature:
        text = "…"
    return Part(PartKind.REASONING, text=text, signature=signature, metadata=meta)


@functools.cache
def _tool_call_parts(call: st.SearchStrategy[ToolCall] | None = None) -> st.SearchStrategy[Part]:
    return st.builds(
        Part,
        st.just(PartKind.TOOL_CALL),
        tool_call=call if call is not None else tool_calls(),
        metadata=_part_metadata(),
    )


@functools.cache
def _tool_call_delta_parts() -> st.SearchStrategy[Part]:
    return st.builds(
        Part,
        st.just(PartKind.TOOL_CALL_DELTA),
        tool_call_delta=tool_call_deltas(),
        metadata=_part_metadata(),
    )


@functools.cache
def _tool_result_parts() -> st.SearchStrategy[Part]:
    return st.builds(
        Part, st.just(PartKind.TOOL_RESULT), tool_result=tool_results(), metadata=_part_metadata()
    )


def _object_from(members: dict[str, str]) -> RawJSON:
    body = ",".join(f"{orjson.dumps(key).decode()}:{value}" for key, value in members.items())
    return RawJSON.parse("{" + body + "}")


@functools.cache
def _native_parts() -> st.SearchStrategy[Part]:
    """Native parts (DESIGN §6k): a provider's item as a JSON object, number spellings
    as written."""
    item = st.builds(
        NativeItem,
        st.sampled_from(("openai.responses", "anthropic.messages", "gemini", "x.custom")),
        strings(min_size=1, max_size=8).filter(lambda s: s.strip() == s),
        st.dictionaries(strings(max_size=6), json_texts(max_leaves=4), max_size=3).map(
            _object_from
        ),
    )
    return st.builds(Part, st.just(PartKind.NATIVE), native=item, metadata=_part_metadata())


@functools.cache
def parts(kind: PartKind | None = None) -> st.SearchStrategy[Part]:
    """Parts of one kind, or of any kind."""
    by_kind: dict[PartKind, st.SearchStrategy[Part]] = {
        PartKind.TEXT: _text_parts(),
        PartKind.MEDIA: _media_parts(),
        PartKind.REASONING: st.builds(
            _safe_reasoning, strings(), st.binary(max_size=16), _part_metadata()
        ),
        PartKind.TOOL_CALL: _tool_call_parts(),
        PartKind.TOOL_CALL_DELTA: _tool_call_delta_parts(),
        PartKind.TOOL_RESULT: _tool_result_parts(),
        PartKind.NATIVE: _native_parts(),
    }
    if kind is not None:
        return by_kind[kind]
    return st.one_of(*by_kind.values())


_ROLE_KINDS: dict[Role, tuple[PartKind, ...]] = {
    Role.SYSTEM: (PartKind.TEXT,),
    Role.USER: (PartKind.TEXT, PartKind.MEDIA),
    Role.ASSISTANT: (
        PartKind.TEXT,
        PartKind.MEDIA,
        PartKind.REASONING,
        PartKind.TOOL_CALL,
        PartKind.NATIVE,
    ),
    Role.TOOL: (PartKind.TOOL_RESULT,),
}


@functools.cache
def messages(
    role: Role | None = None, *, deltas: bool = False, max_parts: int = 3
) -> st.SearchStrategy[Message]:
    """Valid messages of ``role`` (any role when None).

    Without ``deltas`` no message carries tool_call_delta parts, so every drawn message
    is complete: it may be stored in a history Batch. Tool-call ids within one message
    are not guaranteed unique (a Message does not require it; a Request does).
    """
    if role is None:
        return st.one_of(*(messages(r, deltas=deltas, max_parts=max_parts) for r in Role))
    kinds = _ROLE_KINDS[role]
    if deltas and role is Role.ASSISTANT:
        kinds = (*kinds, PartKind.TOOL_CALL_DELTA)
    part = st.one_of(*(parts(k) for k in kinds))
    return st.builds(
        Message,
        st.just(role),
        st.lists(part, min_size=1, max_size=max_parts),
        metadata=st.one_of(st.just(Metadata()), metadata(max_size=2)),
    )


@functools.cache
def complete_assistant_messages(*, max_parts: int = 3) -> st.SearchStrategy[Message]:
    """Assistant messages without tool_call_delta parts (what ends a complete response)."""
    return messages(Role.ASSISTANT, max_parts=max_parts)


# ------------------------------------------------------------------------- request


@functools.cache
def tool_definitions() -> st.SearchStrategy[ToolDefinition]:
    return st.builds(
        ToolDefinition,
        st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z", fullmatch=True),
        _json_objects(),
        strings(max_size=16),
    )


@functools.cache
def output_formats() -> st.SearchStrategy[OutputFormat]:
    return st.one_of(
        st.just(OutputFormat.text()),
        st.just(OutputFormat.json()),
        st.builds(
            OutputFormat.json_schema,
            strings(min_size=1, max_size=8, strip=True),
            _json_objects(),
            strings(max_size=8, strip=True),
        ),
    )


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@functools.cache
def options() -> st.SearchStrategy[Options]:
    return st.builds(
        Options,
        model=strings(max_size=10, strip=True),
        output_format=_maybe(output_formats()),
        frequency_penalty=_maybe(st.floats(-2, 2)),
        max_tokens=_maybe(st.integers(1, 2**63 - 1)),
        presence_penalty=_maybe(st.floats(-2, 2)),
        reasoning_effort=st.sampled_from(["", "low", "medium", "high"]),
        stop=_maybe(st.lists(strings(min_size=1, max_size=5), max_size=3)),
        temperature=_maybe(st.floats(0, 2)),
        top_k=_maybe(st.integers(1, 2**63 - 1)),
        top_p=_maybe(st.floats(0, 1)),
        extensions=st.one_of(st.just(Extensions()), extensions(max_size=2)),
    )


@st.composite
def _tool_round(draw: st.DrawFn) -> list[Message]:
    """An assistant message with uniquely-id'd tool calls, then tool messages answering
    some of them, each call at most once."""
    call_ids = draw(st.lists(_ids, min_size=1, max_size=3, unique=True))
    calls = [ToolCall(cid, draw(_ids), draw(strings(max_size=12))) for cid in call_ids]
    extra = draw(
        st.lists(
            st.one_of(parts(PartKind.TEXT), parts(PartKind.REASONING), parts(PartKind.MEDIA)),
            max_size=2,
        )
    )
    call_parts = [Part(PartKind.TOOL_CALL, tool_call=c) for c in calls]
    assistant = Message(Role.ASSISTANT, extra + call_parts)
    answered = draw(st.lists(st.sampled_from(calls), unique_by=lambda c: c.id, max_size=3))
    out = [assistant]
    while answered:
        take = draw(st.integers(1, len(answered)))
        chunk, answered = answered[:take], answered[take:]
        results = [
            Part(
                PartKind.TOOL_RESULT,
                tool_result=ToolResult(c.id, c.name, draw(tool_outputs()), draw(st.booleans())),
            )
            for c in chunk
        ]
        out.append(Message(Role.TOOL, results))
    return out


@st.composite
def _conversation(draw: st.DrawFn, max_turns: int) -> list[Message]:
    out: list[Message] = draw(st.lists(messages(Role.SYSTEM, max_parts=2), max_size=2))
    segments = draw(
        st.lists(
            st.one_of(
                messages(Role.USER).map(lambda m: [m]),
                st.builds(
                    Message,
                    st.just(Role.ASSISTANT),
                    st.lists(
                        st.one_of(*(parts(k) for k in _ROLE_KINDS[Role.ASSISTANT][:3])),
                        min_size=1,
                        max_size=3,
                    ),
                ).map(lambda m: [m]),
                _tool_round(),
            ),
            min_size=0 if out else 1,
            max_size=max_turns,
        )
    )
    for segment in segments:
        out.extend(segment)
    return out


@functools.cache
def requests(*, max_turns: int = 4) -> st.SearchStrategy[Request]:
    """Valid requests: a system prefix, then user, assistant and tool-call rounds."""
    return st.builds(
        Request,
        _conversation(max_turns),
        st.lists(tool_definitions(), max_size=3, unique_by=lambda t: t.name),
        options(),
    )


# ------------------------------------------------------------------------- response


@st.composite
def usage(draw: st.DrawFn, *, max_tokens: int = 2**40) -> Usage:
    """Valid usage: breakdowns within their totals; unreported breakdowns are None."""
    inp = draw(st.integers(0, max_tokens))
    out = draw(st.integers(0, max_tokens))

    def within(total: int) -> st.SearchStrategy[int | None]:
        return st.one_of(st.none(), st.integers(0, total))

    return Usage(inp, out, draw(within(out)), draw(within(inp)), draw(within(inp)))


@functools.cache
def _response_metadata() -> st.SearchStrategy[ResponseMetadata]:
    return st.builds(
        ResponseMetadata,
        id=st.one_of(st.just(""), _ids),
        model=strings(max_size=10, strip=True),
        usage=usage(),
        extra=st.one_of(st.just(Metadata()), metadata(max_size=2)),
    )


@functools.cache
def _output_metadata() -> st.SearchStrategy[OutputMetadata | None]:
    return _maybe(st.builds(OutputMetadata, metadata(max_size=2)))


@st.composite
def _complete_response(draw: st.DrawFn) -> Response:
    message = draw(complete_assistant_messages())
    has_call = any(p.kind is PartKind.TOOL_CALL for p in message.parts)
    reasons = list(FinishReason) if has_call else [r for r in FinishReason if r != "tool_calls"]
    output = Output(message, draw(st.sampled_from(reasons)), draw(_output_metadata()))
    return Response(output, draw(_maybe(_response_metadata())))


@functools.cache
def responses(*, complete: bool = False) -> st.SearchStrategy[Response]:
    """Responses. ``complete=True``: every drawn value passes ``validate_complete()``.
    ``complete=False``: any valid response or stream chunk (the empty Response, partial
    outputs, tool_call_delta parts, no finish reason ...), complete ones included."""
    if complete:
        return _complete_response()
    reasons = _maybe(st.sampled_from(list(FinishReason)))
    outputs = st.one_of(
        st.builds(
            Output, _maybe(messages(Role.ASSISTANT, deltas=True)), reasons, _output_metadata()
        ),
        # metadata for the message after its last part: a chunk without a message
        st.builds(Output, st.none(), reasons, _output_metadata(), metadata(max_size=2)),
    )
    chunk = st.builds(Response, _maybe(outputs), _maybe(_response_metadata()))
    return st.one_of(st.just(Response()), chunk, _complete_response())
