"""The codec: round-trips, canonical bytes, exact numbers, and strict decoding."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given, settings

from scope import codec
from scope.chat import (
    FinishReason,
    Message,
    Options,
    Output,
    OutputFormat,
    Part,
    PartKind,
    Request,
    Response,
    ResponseMetadata,
    Role,
    ToolCall,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    reasoning_part,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.codec import from_builtins, from_json, to_builtins, to_json
from scope.errors import (
    InvalidBatchError,
    InvalidJSONError,
    InvalidMediaError,
    InvalidMessageError,
    InvalidMetadataError,
    InvalidOptionsError,
    InvalidPartError,
    InvalidRequestError,
    InvalidResponseError,
    InvalidToolCallError,
    InvalidToolDefinitionError,
    InvalidToolResultError,
    InvalidUsageError,
)
from scope.history import Batch
from scope.jsonvalue import RawJSON
from scope.media import Media, Source
from scope.metadata import Extensions, Metadata
from tests.helpers import respell
from tests.strategies import messages, requests, responses, usage

FAST = settings(max_examples=100, deadline=None)

# ------------------------------------------------------------------ properties


def assert_builtins_round_trip(value: Any, cls: Any) -> None:
    """to_builtins decodes RawJSON positions to Python values, so a number keeps its
    value but not an unusual spelling (2.50 comes back as 2.5). The round trip is exact
    when every number is already in its canonical spelling, and always a fixed point."""
    data = to_json(value)
    back = from_builtins(to_builtins(value), cls)
    assert to_builtins(back) == to_builtins(value)
    assert from_builtins(to_builtins(back), cls) == back
    if orjson.dumps(orjson.loads(data), option=orjson.OPT_SORT_KEYS) == data:
        assert back == value


@FAST
@given(messages(deltas=True))
def test_message_round_trips(message: Message) -> None:
    data = to_json(message)
    assert from_json(data, Message) == message
    assert to_json(from_json(data, Message)) == data
    assert_builtins_round_trip(message, Message)


@FAST
@given(requests())
def test_request_round_trips(request: Request) -> None:
    data = to_json(request)
    assert from_json(data, Request) == request
    assert from_json(data.decode(), Request) == request
    assert_builtins_round_trip(request, Request)
    # Canonical: a respelled copy (reversed keys, indentation, \\u escapes) re-encodes
    # to the same bytes.
    assert to_json(from_json(respell(data, indent="  "), Request)) == data


@FAST
@given(responses())
def test_response_round_trips(response: Response) -> None:
    data = to_json(response)
    assert from_json(data, Response) == response
    assert_builtins_round_trip(response, Response)
    assert to_json(from_json(respell(data, ascii_=False), Response)) == data


@FAST
@given(responses(complete=True))
def test_complete_response_round_trips(response: Response) -> None:
    response.validate_complete()
    assert from_json(to_json(response), Response) == response


@FAST
@given(usage())
def test_usage_round_trips(value: Usage) -> None:
    assert from_json(to_json(value), Usage) == value


@FAST
@given(messages())
def test_equal_values_give_equal_bytes(message: Message) -> None:
    rebuilt = attrs.evolve(message)  # equal, never encoded
    assert rebuilt == message
    assert to_json(rebuilt) == to_json(message)
    assert to_json([message, message]) == b"[" + to_json(message) + b"," + to_json(message) + b"]"


def test_message_cache_is_not_part_of_the_value() -> None:
    message = user_message("hi")
    fresh = user_message("hi")
    to_json(message)
    assert message == fresh and hash(message) == hash(fresh)
    assert repr(message) == repr(fresh)
    assert "_json" not in repr(message)
    changed = attrs.evolve(message, role=Role.ASSISTANT)
    assert to_json(changed) == b'{"parts":[{"kind":"text","text":"hi"}],"role":"assistant"}'


# ------------------------------------------------------------------ exact number spelling

SPELLED = b'{"metadata":{"cost":1E-7,"x":2.50},"parts":[{"kind":"text","text":"t"}],"role":"user"}'


def test_metadata_numbers_keep_their_spelling() -> None:
    message = from_json(SPELLED, Message)
    assert message.metadata["x"].bytes == b"2.50"
    assert message.metadata["cost"].bytes == b"1E-7"
    assert to_json(message) == SPELLED
    assert to_json(from_json(to_json(message), Message)) == SPELLED


def test_orjson_route_loses_spelling() -> None:
    # What a plain orjson.loads of the whole document does: the bytes change.
    via_orjson = from_builtins(orjson.loads(SPELLED), Message)
    assert to_json(via_orjson) != SPELLED
    assert via_orjson.metadata["x"].bytes == b"2.5"
    assert via_orjson.metadata["cost"].bytes == b"1e-7"


def test_schema_and_details_keep_their_spelling() -> None:
    schema = b'{"maximum":2.50,"minimum":1E-7,"type":"object"}'
    doc = (
        b'{"messages":[{"parts":[{"kind":"text","text":"q"}],"role":"user"}],'
        b'"options":{"output_format":{"name":"n","schema":' + schema + b',"type":"json_schema"}},'
        b'"tools":[{"input_schema":' + schema + b',"name":"f"}]}'
    )
    request = from_json(doc, Request)
    assert request.tools[0].input_schema.bytes == schema
    assert request.options.output_format is not None
    assert request.options.output_format.schema == RawJSON.parse(schema)
    assert to_json(request) == doc
    details = b'{"nested":{"deep":[1.10,{"e":-0.0e+00}]}}'
    result = b'{"id":"c","name":"f","output":{"details":' + details + b"}}"
    decoded = from_json(result, ToolResult)
    assert decoded.output.details is not None and decoded.output.details.bytes == details
    assert to_json(decoded) == result


def test_batch_re_encodes_byte_identical() -> None:
    messages_ = [
        from_json(SPELLED, Message),
        assistant_message(
            tool_call_part("c", "f", '{"a": 1.0}'),
        ),
        tool_message(ToolResult("c", "f", ToolOutput.of_json('{"t": 21.50, "u": 1E3}'))),
    ]
    batch = Batch("conv", "a1", messages_)
    data = batch.to_json()
    again = Batch.from_json(data)
    assert again == batch and again.digest == batch.digest
    assert again.to_json() == data
    assert Batch.from_json(respell(data, indent=" ")).to_json() == data
    for message in messages_:
        assert to_json(from_json(to_json(message), Message)) == to_json(message)
    # The orjson route re-spells 21.50 and 1E3, so the digest would not match.
    via_orjson = [from_builtins(m, Message) for m in orjson.loads(data)["messages"]]
    assert Batch("conv", "a1", via_orjson).digest != batch.digest


# ------------------------------------------------------------------ strict decoding

MSG = '{"role":"user","parts":[{"kind":"text","text":"hi"}]}'
REQ = '{"messages":[' + MSG + "]}"


def _err(data: str | bytes, cls: Any) -> BaseException:
    with pytest.raises(ValueError) as info:
        from_json(data, cls)
    return info.value


DUPLICATES: list[tuple[str, Any, type[Exception]]] = [
    (
        '{"role":"user","role":"user","parts":[{"kind":"text","text":"hi"}]}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","kind":"text","text":"hi"}]}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","text":"hi"}],"metadata":{"a":1,"a":1}}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","text":"hi"}],"metadata":{"a":{"b":1,"b":2}}}',
        Message,
        InvalidMessageError,
    ),
    ('{"messages":[' + MSG + '],"messages":[' + MSG + "]}", Request, InvalidRequestError),
    (
        '{"messages":['
        + MSG
        + '],"tools":[{"name":"f","input_schema":{"type":"object","type":"object"}}]}',
        Request,
        InvalidRequestError,
    ),
    ('{"output":{"finish_reason":"stop","finish_reason":"stop"}}', Response, InvalidResponseError),
    ('{"input_tokens":1,"input_tokens":1}', Usage, InvalidUsageError),
    ('{"a":1,"a":2}', Metadata, InvalidMetadataError),
    ('{"a":1,"a":2}', RawJSON, InvalidJSONError),
]


@pytest.mark.parametrize(("data", "cls", "error"), DUPLICATES)
def test_duplicate_member_names_refused(data: str, cls: Any, error: type[Exception]) -> None:
    assert type(_err(data, cls)) is error


BAD_INPUT: list[tuple[str, str | bytes]] = [
    ("empty", b""),
    ("not JSON", b"hello"),
    ("truncated", MSG[:-1].encode()),
    ("trailing", (MSG + "x").encode()),
    ("not UTF-8", MSG.replace("hi", "h\xff").encode("latin-1")),
    ("UTF-16", MSG.encode("utf-16")),
    ("BOM", b"\xef\xbb\xbf" + MSG.encode()),
    ("NaN", MSG.replace('"hi"', "NaN").encode()),
    ("lone surrogate escape", MSG.replace("hi", "\\ud800").encode()),
    ("lone surrogate str", MSG.replace("hi", "\ud800")),
    ("lone surrogate key", MSG.replace('"role"', '"\\udc00","role"').encode()),
    ("not an object", b"[]"),
    ("null", b"null"),
]


@pytest.mark.parametrize("data", [b[1] for b in BAD_INPUT], ids=[b[0] for b in BAD_INPUT])
@pytest.mark.parametrize(
    ("cls", "error"),
    [(Message, InvalidMessageError), (Request, InvalidRequestError), (Part, InvalidPartError)],
)
def test_bad_input_raises_target_error(data: str | bytes, cls: Any, error: type[Exception]) -> None:
    if cls is Request and isinstance(data, bytes) and data.startswith(b"{"):
        data = b'{"messages":[' + data + b"]}"
    elif cls is Request and isinstance(data, str) and data.startswith("{"):
        data = '{"messages":[' + data + "]}"
    assert type(_err(data, cls)) is error


SURROGATES: list[tuple[str, Any, type[Exception]]] = [
    ('{"role":"user","parts":[{"kind":"text","text":"\\ud800"}]}', Message, InvalidMessageError),
    (
        '{"role":"assistant","parts":[{"kind":"tool_call","tool_call":{"id":"c","name":"f","arguments":"\\udfff"}}]}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"\\ud800":1}}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"k":"\\ud800"}}',
        Message,
        InvalidMessageError,
    ),
    (
        '{"messages":[' + MSG + '],"options":{"model":"\\ud800"}}',
        Request,
        InvalidRequestError,
    ),
    ('{"messages":[' + MSG + '],"options":{"stop":["\\ud800"]}}', Request, InvalidRequestError),
    ('{"metadata":{"id":"\\ud800"}}', Response, InvalidResponseError),
    (
        '{"mime":"image/png","source":{"kind":"reference","ref":"\\udc00"}}',
        Media,
        InvalidMediaError,
    ),
    ('{"id":"c","name":"\\ud800"}', ToolCall, InvalidToolCallError),
]


@pytest.mark.parametrize(("data", "cls", "error"), SURROGATES)
def test_lone_surrogates_refused(data: str, cls: Any, error: type[Exception]) -> None:
    assert type(_err(data, cls)) is error
    assert type(_err(data.encode(), cls)) is error


PATHS: list[tuple[str, Any, type[Exception], str, type[Exception] | None]] = [
    (
        '{"messages":[' + MSG + ',{"role":"user","parts":[{"kind":"video"}]}]}',
        Request,
        InvalidRequestError,
        "messages[1].parts[0].kind: must be one of",
        InvalidPartError,
    ),
    (
        '{"messages":[{"role":"user","parts":[{"kind":"text","text":1}]}]}',
        Request,
        InvalidRequestError,
        "messages[0].parts[0].text: expected a string, got number 1",
        InvalidPartError,
    ),
    (
        '{"messages":[{"role":"user","parts":[{"kind":"text"}]}]}',
        Request,
        InvalidRequestError,
        "messages[0].parts[0]: a text part needs non-empty text",
        InvalidPartError,
    ),
    (
        '{"messages":[{"role":"system","parts":[{"kind":"text","text":"x"}]},' + MSG + ","
        '{"role":"system","parts":[{"kind":"text","text":"x"}]}]}',
        Request,
        InvalidRequestError,
        "messages[2]: system messages must form a leading prefix",
        None,
    ),
    (
        '{"messages":[' + MSG + '],"options":{"temperature":3}}',
        Request,
        InvalidRequestError,
        "options: temperature must be between 0 and 2, got 3.0",
        InvalidOptionsError,
    ),
    (
        '{"messages":[' + MSG + '],"options":{"extensions":{"seed":1}}}',
        Request,
        InvalidRequestError,
        "options.extensions['seed']: extensions key 'seed' must be namespace/name",
        InvalidMetadataError,
    ),
    (
        '{"messages":[' + MSG + '],"tools":[{"name":"f","input_schema":[]}]}',
        Request,
        InvalidRequestError,
        "tools[0]: tool 'f' input_schema must be a JSON object",
        InvalidToolDefinitionError,
    ),
    (
        '{"output":{"message":{"role":"assistant","parts":[{"kind":"tool_call",'
        '"tool_call":{"id":"","name":"f"}}]}}}',
        Response,
        InvalidResponseError,
        "output.message.parts[0].tool_call: tool call id must not be empty",
        InvalidToolCallError,
    ),
    (
        '{"role":"tool","parts":[{"kind":"tool_result","tool_result":{"id":"c","name":"f",'
        '"output":{"content":[{"kind":"reasoning","text":"r"}]}}}]}',
        Message,
        InvalidMessageError,
        "parts[0].tool_result.output: tool output content[0] must be a text or media part",
        InvalidToolResultError,
    ),
    (
        '{"metadata":{"usage":{"input_tokens":-1}}}',
        Response,
        InvalidResponseError,
        "metadata.usage: input_tokens must be at least 0",
        InvalidUsageError,
    ),
    (
        '{"role":"user","parts":[{"kind":"media","media":{"mime":"image/png",'
        '"source":{"kind":"bytes","bytes":"!!"}}}]}',
        Message,
        InvalidMessageError,
        "parts[0].media.source.bytes: invalid base64",
        InvalidMediaError,
    ),
    (
        '{"role":"user","parts":[{"kind":"text","text":"x","colour":"red"}]}',
        Message,
        InvalidMessageError,
        "parts[0].colour: unknown field 'colour' in Part",
        InvalidPartError,
    ),
    (
        '{"parts":[{"kind":"text","text":"x"}]}',
        Message,
        InvalidMessageError,
        "role: missing required field 'role' of Message",
        None,
    ),
]


@pytest.mark.parametrize(("data", "cls", "error", "message", "cause"), PATHS)
def test_errors_name_the_path(
    data: str, cls: Any, error: type[Exception], message: str, cause: type[Exception] | None
) -> None:
    exc = _err(data, cls)
    assert type(exc) is error
    assert str(exc).startswith(message), str(exc)
    if cause is not None:
        assert type(exc.__cause__) is cause


WRONG: list[tuple[str, Any, str]] = [
    # (document, class, fragment of the message)
    ('{"role":1,"parts":[]}', Message, "role: expected a string"),
    ('{"role":"user","parts":{}}', Message, "parts: expected an array"),
    ('{"role":"user","parts":[[]]}', Message, "parts[0]: expected an object (Part)"),
    ('{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":[]}', Message, "metadata"),
    ('{"messages":[' + MSG + '],"options":{"max_tokens":"5"}}', Request, "options.max_tokens"),
    ('{"messages":[' + MSG + '],"options":{"max_tokens":5.0}}', Request, "expected an integer"),
    ('{"messages":[' + MSG + '],"options":{"max_tokens":1e3}}', Request, "expected an integer"),
    ('{"messages":[' + MSG + '],"options":{"temperature":"1"}}', Request, "expected a number"),
    ('{"messages":[' + MSG + '],"options":{"temperature":true}}', Request, "expected a number"),
    ('{"messages":[' + MSG + '],"options":{"temperature":1e999}}', Request, "out of range"),
    ('{"messages":[' + MSG + '],"options":{"stop":"x"}}', Request, "options.stop"),
    ('{"messages":[' + MSG + '],"options":{"output_format":"json"}}', Request, "output_format"),
    ('{"messages":[' + MSG + '],"tools":{}}', Request, "tools"),
    ('{"id":"c","name":"f","is_error":1}', ToolResult, "is_error: expected a boolean"),
    ('{"id":"c","name":"f","is_error":"true"}', ToolResult, "is_error: expected a boolean"),
    ('{"id":"c","name":"f","output":{"details":NaN}}', ToolResult, "invalid JSON"),
    ('{"id":"c","name":"f","output":[]}', ToolResult, "output: expected an object"),
    ('{"output":{"finish_reason":"done"}}', Response, "output.finish_reason"),
    ('{"output":{"finish_reason":""}}', Response, "output.finish_reason"),
    ('{"output":null,"extra":1}', Response, "unknown field 'extra'"),
    ('{"kind":"reasoning","signature":"AAE"}', Part, "signature: invalid base64"),
    ('{"kind":"reasoning","signature":"AAF="}', Part, "signature: non-canonical base64"),
    ('{"kind":"reasoning","signature":"AA\\nAA"}', Part, "signature: invalid base64"),
    ('{"kind":"reasoning","signature":"-_8="}', Part, "signature: invalid base64"),
    ('{"kind":"reasoning","signature":1}', Part, "signature: expected a base64 string"),
    ('{"kind":"text","text":null}', Part, "text: expected a string, got null"),
]


@pytest.mark.parametrize(("data", "cls", "fragment"), WRONG)
def test_wrong_types_refused(data: str, cls: Any, fragment: str) -> None:
    exc = _err(data, cls)
    assert type(exc) is codec.decode_error_for(cls)
    assert fragment in str(exc), str(exc)


INT_FIELDS: list[tuple[str, Any, str]] = [
    ('{"messages":[' + MSG + '],"options":{"max_tokens":%s}}', Request, "max_tokens"),
    ('{"messages":[' + MSG + '],"options":{"top_k":%s}}', Request, "top_k"),
    ('{"input_tokens":%s}', Usage, "input_tokens"),
    ('{"output_tokens":%s}', Usage, "output_tokens"),
    ('{"input_tokens":9223372036854775807,"cache_read_input_tokens":%s}', Usage, "cache_read"),
    ('{"input_tokens":9223372036854775807,"cache_write_input_tokens":%s}', Usage, "cache_write"),
    ('{"output_tokens":9223372036854775807,"reasoning_tokens":%s}', Usage, "reasoning_tokens"),
    ('{"metadata":{"usage":{"input_tokens":%s}}}', Response, "input_tokens"),
]


@pytest.mark.parametrize(("template", "cls", "field"), INT_FIELDS)
@pytest.mark.parametrize(
    "number", ["9223372036854775808", "18446744073709551616", "1" + "0" * 5000, "-1"]
)
def test_int_fields_refuse_out_of_range(template: str, cls: Any, field: str, number: str) -> None:
    exc = _err(template % number, cls)
    assert type(exc) is codec.decode_error_for(cls)
    assert field in str(exc)


@pytest.mark.parametrize(("template", "cls", "field"), INT_FIELDS)
def test_int_fields_accept_max(template: str, cls: Any, field: str) -> None:
    from_json(template % "9223372036854775807", cls)


def test_usage_sum_beyond_64_bits_refused() -> None:
    data = '{"input_tokens":9223372036854775807,"output_tokens":1}'
    assert type(_err(data, Usage)) is InvalidUsageError


def _nest(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize(
    ("template", "cls", "error"),
    [
        (
            '{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"k":%s}}',
            Message,
            InvalidMessageError,
        ),
        ('{"id":"c","name":"f","output":{"details":%s}}', ToolResult, InvalidToolResultError),
        ('{"output":{"metadata":{"extra":{"k":%s}}}}', Response, InvalidResponseError),
        (
            '{"messages":[' + MSG + '],"options":{"extensions":{"a/b":%s}}}',
            Request,
            InvalidRequestError,
        ),
        ("%s", RawJSON, InvalidJSONError),
    ],
)
def test_raw_json_depth_in_documents(template: str, cls: Any, error: type[Exception]) -> None:
    value = from_json(template % _nest(512), cls)  # 512 levels inside the RawJSON: fine
    assert _nest(512).encode() in to_json(value)
    assert from_json(to_json(value), cls) == value
    assert type(_err(template % _nest(513), cls)) is error
    assert type(_err(template % _nest(50000), cls)) is error


def test_from_builtins_refuses_non_finite_floats() -> None:
    tree = json.loads(MSG)
    tree["metadata"] = {"k": float("nan")}
    with pytest.raises(InvalidMessageError):
        from_builtins(tree, Message)
    with pytest.raises(InvalidRequestError):
        from_builtins(
            {"messages": [json.loads(MSG)], "options": {"temperature": float("inf")}}, Request
        )


@FAST
@given(requests())
def test_builtins_round_trip_exact_with_canonical_numbers(request: Request) -> None:
    # Re-spell every RawJSON number canonically, then the builtins route is exact.
    canonical = from_builtins(to_builtins(request), Request)
    assert from_builtins(to_builtins(canonical), Request) == canonical


def test_from_builtins_accepts_exact_trees() -> None:
    from scope._json import parse_exact

    assert to_json(from_builtins(parse_exact(SPELLED), Message)) == SPELLED


def test_from_builtins_accepts_builtin_numbers() -> None:
    tree = {"messages": [json.loads(MSG)], "options": {"temperature": 1, "max_tokens": 5}}
    request = from_builtins(tree, Request)
    assert request.options.temperature == 1.0 and request.options.max_tokens == 5
    with pytest.raises(InvalidRequestError):
        from_builtins({"messages": [json.loads(MSG)], "options": {"max_tokens": True}}, Request)


def test_converter_hooks() -> None:
    request = Request((user_message("hi"),), options=Options(temperature=0.5))
    assert codec.converter.structure(to_builtins(request), Request) == request
    assert orjson.dumps(codec.converter.unstructure(request), option=orjson.OPT_SORT_KEYS) == (
        to_json(request)
    )
    with pytest.raises(InvalidRequestError):
        codec.converter.structure({"messages": []}, Request)
    tree = to_builtins(request)
    tree["messages"][0]["metadata"] = {"k": float("nan")}
    with pytest.raises(InvalidRequestError):
        codec.converter.structure(tree, Request)


def test_lists_and_unsupported_types() -> None:
    turn = [user_message("a"), assistant_message("b")]
    assert from_json(to_json(turn), list[Message]) == turn
    assert from_json(to_json(turn), tuple[Message, ...]) == tuple(turn)
    exc = _err('[{"role":"user","parts":[]}]', list[Message])
    assert type(exc) is InvalidMessageError and str(exc).startswith("[0]: ")
    with pytest.raises(TypeError, match="cannot decode"):
        from_json("{}", set)
    with pytest.raises(TypeError, match="cannot decode"):
        from_json("[1]", list[int])
    with pytest.raises(TypeError):
        to_json(object())
    assert codec.decode_error_for(list[Request]) is InvalidRequestError


def test_metadata_and_extensions_top_level() -> None:
    assert from_json('{"b": 2.50, "a": 1}', Metadata) == Metadata(
        {"a": 1, "b": RawJSON.parse("2.50")}
    )
    assert to_json(Metadata({"b": 1, "a": [2]})) == b'{"a":[2],"b":1}'
    assert type(_err('{"nons": 1}', Extensions)) is InvalidMetadataError
    assert type(_err('{"": 1}', Metadata)) is InvalidMetadataError
    assert type(_err("[1]", Metadata)) is InvalidMetadataError


# ------------------------------------------------------------------ wire layout


def test_zero_values_omitted_and_set_optionals_written() -> None:
    assert to_json(Options()) == b"{}"
    assert to_json(Options(temperature=0.0, stop=(), top_p=0)) == (
        b'{"stop":[],"temperature":0.0,"top_p":0.0}'
    )
    assert to_json(Usage()) == b"{}"
    assert to_json(Usage(reasoning_tokens=0)) == b'{"reasoning_tokens":0}'
    assert to_json(Response()) == b"{}"
    assert to_json(ResponseMetadata()) == b"{}"
    assert to_json(ToolResult("c", "f")) == b'{"id":"c","name":"f","output":{}}'
    assert to_json(ToolCall("c", "f")) == b'{"id":"c","name":"f"}'
    assert to_json(OutputFormat.text()) == b'{"type":"text"}'
    assert to_json(Request((user_message("x"),))) == (
        b'{"messages":[{"parts":[{"kind":"text","text":"x"}],"role":"user"}]}'
    )
    assert to_json(reasoning_part(signature=b"\x00\x01\xff")) == (
        b'{"kind":"reasoning","signature":"AAH/"}'
    )
    assert to_json(Media.from_bytes("image/png", b"ab")) == (
        b'{"mime":"image/png","source":{"bytes":"YWI=","kind":"bytes"}}'
    )
    assert (
        to_json(Source("uri", uri="https://x.example"))
        == b'{"kind":"uri","uri":"https://x.example"}'
    )
    assert to_json(Output(finish_reason=FinishReason.STOP)) == b'{"finish_reason":"stop"}'
    assert to_json(ToolDefinition("f", {"type": "object"})) == (
        b'{"input_schema":{"type":"object"},"name":"f"}'
    )


def test_missing_optional_fields_take_defaults() -> None:
    part = from_json('{"kind":"tool_result","tool_result":{"id":"c","name":"f"}}', Part)
    assert part.tool_result == ToolResult("c", "f")
    assert from_json('{"output":null,"metadata":null}', Response) == Response()
    assert (
        from_json('{"messages":[' + MSG + '],"options":{"stop":null}}', Request).options.stop
        is None
    )
    assert from_json('{"messages":[' + MSG + '],"options":{"stop":[]}}', Request).options.stop == ()


def test_legacy_and_foreign_layouts() -> None:
    # Go writes every field of a part kind it knows; a zero payload is null there.
    data = (
        '{"kind":"text","text":"hi","media":null,"tool_call":null,'
        '"tool_call_delta":null,"tool_result":null}'
    )
    assert from_json(data, Part) == text_part("hi")
    assert from_json('{"kind":"text","text":"hi","signature":""}', Part) == text_part("hi")
    delta = from_json('{"kind":"tool_call_delta","tool_call_delta":{"id":"c","name":"f"}}', Part)
    assert delta.kind is PartKind.TOOL_CALL_DELTA


def test_from_builtins_refuses_huge_ints_in_float_fields() -> None:
    for name in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        with pytest.raises(InvalidOptionsError, match=name):
            from_builtins({name: 10**400}, Options)
    assert from_builtins({"temperature": 2}, Options) == Options(temperature=2.0)


def test_to_builtins_keeps_big_integers_exact() -> None:
    big = 123456789012345678901234567890
    value = text_part("x", {"n": big, "neg": -(2**63) - 1})
    out = to_builtins(value)
    assert out["metadata"] == {"n": big, "neg": -(2**63) - 1}
    assert type(out["metadata"]["n"]) is int
    assert from_builtins(out, Part) == value


def test_an_out_of_range_float_token_has_no_python_value() -> None:
    # A valid JSON number beyond double range: kept exactly as bytes, but it has no float
    # (v0.1 gave inf, another value); to_builtins and value() both say so.
    raw = RawJSON.parse("1e999")
    assert raw.bytes == b"1e999"
    with pytest.raises(InvalidJSONError, match="1e999 is out of float range"):
        raw.value()
    with pytest.raises(InvalidJSONError, match="out of float range"):
        to_builtins(Metadata({"x": raw}))
    assert RawJSON.parse("[1e308, -1e308]").value() == [1e308, -1e308]
    with pytest.raises(InvalidJSONError):
        RawJSON.parse('{"a": [-1E+400]}').value()


def test_the_exact_parse_is_private_and_plain_json_is_from_json() -> None:
    import scope.codec

    assert not hasattr(scope.codec, "parse")
    # Whitespace does not change the Python types of plain JSON read through the codec.
    assert from_json('{"a": 2.5}', Any) == from_json('{"a":2.5}', Any) == {"a": 2.5}
    assert type(from_json('{"a": 2.5}', Any)["a"]) is float


# -- plain JSON targets ------------------------------------------------------------------


@pytest.mark.parametrize("cls", [dict, dict[str, Any], Any])
def test_plain_dict_target(cls: Any) -> None:
    data = '{"b": 2.50, "a": [1, true, null, "x"], "n": 123456789012345678901234567890}'
    decoded = from_json(data, cls)
    assert decoded == {"a": [1, True, None, "x"], "b": 2.5, "n": 123456789012345678901234567890}
    assert type(decoded["b"]) is float and type(decoded["a"]) is list
    assert from_json(data, cls) is not decoded  # a fresh tree every time
    assert from_builtins({"a": (1, 2)}, cls) == {"a": [1, 2]}


@pytest.mark.parametrize("cls", [list, list[Any], Any])
def test_plain_list_target(cls: Any) -> None:
    assert from_json('[1, {"k": 1.0}]', cls) == [1, {"k": 1.0}]


def test_plain_any_target_takes_any_document() -> None:
    assert from_json('"s"', Any) == "s"
    assert from_json("3", Any) == 3
    assert from_json("null", Any) is None


@pytest.mark.parametrize(
    ("data", "cls", "says"),
    [
        ("[1]", dict, "expected an object, got array"),
        ('"s"', dict[str, Any], "expected an object, got string"),
        ("{}", list, "expected an array, got object"),
        ("{", dict, "invalid JSON"),
        ('{"a": 1, "a": 2}', dict, "invalid JSON"),
        ("NaN", Any, "invalid JSON"),
        (b"\xff", list, "invalid JSON"),
    ],
)
def test_plain_targets_refuse_bad_input_with_invalid_json_error(
    data: str | bytes, cls: Any, says: str
) -> None:
    exc = _err(data, cls)
    assert type(exc) is InvalidJSONError and says in str(exc)
    assert codec.decode_error_for(cls) is InvalidJSONError


def test_plain_targets_refuse_non_json_builtins() -> None:
    with pytest.raises(InvalidJSONError):
        from_builtins({"a": float("nan")}, dict)
    with pytest.raises(InvalidJSONError):
        from_builtins({1: "a"}, Any)


# -- history Batch ------------------------------------------------------------------------


def test_batch_through_the_codec() -> None:
    batch = Batch("conv", "a1", [from_json(SPELLED, Message)], expected_length=3)
    data = to_json(batch)
    assert data == batch.to_json()
    decoded = from_json(data, Batch)
    assert decoded == batch and decoded.expected_length == 3
    assert decoded.encoded_messages == batch.encoded_messages
    # Any spelling of the document: indented, reordered (the exact reader's route).
    assert from_json(respell(data, indent=" "), Batch).expected_length == 3
    assert from_json(respell(data, indent=" "), Batch) == batch
    assert to_json([batch, batch]) == b"[" + data + b"," + data + b"]"
    assert from_json(to_json([batch]), list[Batch]) == [batch]
    assert to_builtins(batch) == orjson.loads(data)
    # Python objects lose number spellings (2.50 -> 2.5), so only a batch without such
    # numbers survives the builtins route; the digest check refuses the other.
    plain = Batch("conv", "a2", [user_message("hi"), assistant_message("hello")], 2)
    assert from_builtins(to_builtins(plain), Batch) == plain
    assert codec.converter.structure(to_builtins(plain), Batch) == plain
    with pytest.raises(InvalidBatchError, match="digest mismatch"):
        from_builtins(to_builtins(batch), Batch)
    assert codec.decode_error_for(Batch) is InvalidBatchError


def test_batch_decoding_errors_are_invalid_batch_errors() -> None:
    batch = Batch("conv", "a1", [user_message("hi")])
    tree = orjson.loads(batch.to_json())
    wrong_digest = {**tree, "digest": "sha256:" + "0" * 64}
    exc = _err(orjson.dumps(wrong_digest), Batch)
    assert type(exc) is InvalidBatchError and "digest mismatch" in str(exc)
    bad_message = {**tree, "messages": [{"role": "user", "parts": []}]}
    exc = _err(orjson.dumps(bad_message), Batch)
    assert type(exc) is InvalidBatchError and str(exc).startswith("messages[0]: ")
    assert type(exc.__cause__) is InvalidMessageError
    exc = _err(b"[" + batch.to_json() + b"," + orjson.dumps(wrong_digest) + b"]", list[Batch])
    assert type(exc) is InvalidBatchError and str(exc).startswith("[1]: digest mismatch")
    for data in ("", "[]", "{"):
        assert type(_err(data, Batch)) is InvalidBatchError


def test_codec_does_not_import_history() -> None:
    # Batch registers itself with the codec; the codec never imports scope.history.
    code = "import sys, scope.codec; assert 'scope.history' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
