"""Every validation rule of the chat values (DESIGN §2): the bad input and the exact error.

Each row of ``BAD`` builds one invalid value; the test asserts the exact error class (not
a subclass or a sibling) and, where the rule is about a nested value, that the inner
error is chained as ``__cause__``.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Options,
    Output,
    OutputFormat,
    OutputFormatType,
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
    assistant_message,
    media_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    tool_result_part,
    user_message,
)
from scope.chat._types import FinishReasonLike, OutputFormatTypeLike, PartKindLike, RoleLike
from scope.errors import (
    InvalidJSONError,
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
from scope.media import Media, SourceKind, SourceKindLike
from scope.metadata import Extensions, Metadata

LONE = "a\ud800b"
IMG = Media.from_bytes("image/png", b"\x89PNG")
SCHEMA = {"type": "object", "properties": {}}
CALL = tool_call_part("c1", "f", "{}")
RESULT = ToolResult("c1", "f")
ASSISTANT_CALL = assistant_message(CALL)
TOOL = tool_message(RESULT)
BIG = 2**63

# (id, build, error, inner error expected as __cause__ or None)
BAD: list[tuple[str, Callable[[], Any], type[Exception], type[Exception] | None]] = [
    # ToolCall / ToolCallDelta
    ("call empty id", lambda: ToolCall("", "f"), InvalidToolCallError, None),
    ("call empty name", lambda: ToolCall("c", ""), InvalidToolCallError, None),
    ("call id not str", lambda: ToolCall(1, "f"), InvalidToolCallError, None),
    ("call lone surrogate name", lambda: ToolCall("c", LONE), InvalidToolCallError, None),
    ("call lone surrogate args", lambda: ToolCall("c", "f", LONE), InvalidToolCallError, None),
    ("call args not str", lambda: ToolCall("c", "f", {"a": 1}), InvalidToolCallError, None),
    ("delta empty id", lambda: ToolCallDelta("", "f"), InvalidToolCallError, None),
    ("delta empty name", lambda: ToolCallDelta("c", ""), InvalidToolCallError, None),
    ("delta lone surrogate", lambda: ToolCallDelta(LONE, "f"), InvalidToolCallError, None),
    # ToolOutput / ToolResult
    (
        "output reasoning content",
        lambda: ToolOutput((reasoning_part("x"),)),
        InvalidToolResultError,
        None,
    ),
    ("output call content", lambda: ToolOutput((CALL,)), InvalidToolResultError, None),
    ("output content not parts", lambda: ToolOutput(("x",)), InvalidToolResultError, None),
    ("output content a str", lambda: ToolOutput("text"), InvalidToolResultError, None),
    (
        "output details NaN",
        lambda: ToolOutput(details={"x": float("nan")}),
        InvalidToolResultError,
        InvalidJSONError,
    ),
    (
        "output details str",
        lambda: ToolOutput(details="{}"),
        InvalidToolResultError,
        InvalidJSONError,
    ),
    ("of_json invalid", lambda: ToolOutput.of_json("{"), InvalidToolResultError, InvalidJSONError),
    (
        "of_text lone surrogate",
        lambda: ToolOutput.of_text(LONE),
        InvalidToolResultError,
        InvalidPartError,
    ),
    ("result empty id", lambda: ToolResult("", "f"), InvalidToolResultError, None),
    ("result empty name", lambda: ToolResult("c", ""), InvalidToolResultError, None),
    ("result output wrong", lambda: ToolResult("c", "f", "out"), InvalidToolResultError, None),
    ("result is_error int", lambda: ToolResult("c", "f", is_error=1), InvalidToolResultError, None),
    # Part
    ("part unknown kind", lambda: Part("audio"), InvalidPartError, None),
    ("part text empty", lambda: Part(PartKind.TEXT), InvalidPartError, None),
    ("part text lone surrogate", lambda: text_part(LONE), InvalidPartError, None),
    ("part text not str", lambda: Part(PartKind.TEXT, text=5), InvalidPartError, None),
    (
        "part text with media",
        lambda: Part(PartKind.TEXT, text="x", media=IMG),
        InvalidPartError,
        None,
    ),
    ("part media missing", lambda: Part(PartKind.MEDIA), InvalidPartError, None),
    (
        "part media with text",
        lambda: Part(PartKind.MEDIA, text="x", media=IMG),
        InvalidPartError,
        None,
    ),
    ("part media wrong type", lambda: Part(PartKind.MEDIA, media="img"), InvalidPartError, None),
    ("part reasoning empty", lambda: reasoning_part(), InvalidPartError, None),
    (
        "part signature on text",
        lambda: Part(PartKind.TEXT, text="x", signature=b"s"),
        InvalidPartError,
        None,
    ),
    (
        "part signature not bytes",
        lambda: reasoning_part("x", signature="s"),
        InvalidPartError,
        None,
    ),
    ("part tool_call missing", lambda: Part(PartKind.TOOL_CALL), InvalidPartError, None),
    (
        "part tool_call with result",
        lambda: Part(PartKind.TOOL_CALL, tool_call=ToolCall("c", "f"), tool_result=RESULT),
        InvalidPartError,
        None,
    ),
    (
        "part tool_call wrong type",
        lambda: Part(PartKind.TOOL_CALL, tool_call=ToolCallDelta("c", "f")),
        InvalidPartError,
        None,
    ),
    ("part delta missing", lambda: Part(PartKind.TOOL_CALL_DELTA), InvalidPartError, None),
    ("part result missing", lambda: Part(PartKind.TOOL_RESULT), InvalidPartError, None),
    (
        "part result with text",
        lambda: Part(PartKind.TOOL_RESULT, text="x", tool_result=RESULT),
        InvalidPartError,
        None,
    ),
    (
        "tool_call_part bad call",
        lambda: tool_call_part("", "f"),
        InvalidPartError,
        InvalidToolCallError,
    ),
    (
        "tool_call_delta_part bad",
        lambda: tool_call_delta_part("c", ""),
        InvalidPartError,
        InvalidToolCallError,
    ),
    (
        "part metadata bad key",
        lambda: text_part("x", metadata={"": 1}),
        InvalidPartError,
        InvalidMetadataError,
    ),
    (
        "part metadata not mapping",
        lambda: Part(PartKind.TEXT, text="x", metadata=[1]),
        InvalidPartError,
        InvalidMetadataError,
    ),
    # Message
    ("message no parts", lambda: Message(Role.USER, ()), InvalidMessageError, None),
    (
        "message unknown role",
        lambda: Message("robot", (text_part("x"),)),
        InvalidMessageError,
        None,
    ),
    ("message parts not parts", lambda: Message(Role.USER, ("x",)), InvalidMessageError, None),
    ("message parts a str", lambda: Message(Role.USER, "x"), InvalidMessageError, None),
    (
        "system with media",
        lambda: Message(Role.SYSTEM, (media_part(IMG),)),
        InvalidMessageError,
        None,
    ),
    ("user with reasoning", lambda: user_message(reasoning_part("r")), InvalidMessageError, None),
    ("user with tool call", lambda: user_message(CALL), InvalidMessageError, None),
    (
        "assistant with result",
        lambda: assistant_message(tool_result_part(RESULT)),
        InvalidMessageError,
        None,
    ),
    ("tool with text", lambda: Message(Role.TOOL, (text_part("x"),)), InvalidMessageError, None),
    ("system_message empty", lambda: system_message(""), InvalidMessageError, InvalidPartError),
    ("user_message empty str", lambda: user_message(""), InvalidMessageError, InvalidPartError),
    ("user_message nothing", lambda: user_message(), InvalidMessageError, None),
    ("tool_message nothing", lambda: tool_message(), InvalidMessageError, None),
    (
        "message metadata NaN",
        lambda: Message(Role.USER, (text_part("x"),), metadata={"k": float("inf")}),
        InvalidMessageError,
        InvalidMetadataError,
    ),
    # ToolDefinition
    ("tool name empty", lambda: ToolDefinition("", SCHEMA), InvalidToolDefinitionError, None),
    ("tool name 65", lambda: ToolDefinition("a" * 65, SCHEMA), InvalidToolDefinitionError, None),
    (
        "tool name space",
        lambda: ToolDefinition("get weather", SCHEMA),
        InvalidToolDefinitionError,
        None,
    ),
    (
        "tool name non-ascii",
        lambda: ToolDefinition("wetter_ä", SCHEMA),
        InvalidToolDefinitionError,
        None,
    ),
    ("tool name dot", lambda: ToolDefinition("a.b", SCHEMA), InvalidToolDefinitionError, None),
    ("tool schema array", lambda: ToolDefinition("f", [1]), InvalidToolDefinitionError, None),
    (
        "tool schema type string",
        lambda: ToolDefinition("f", {"type": "string"}),
        InvalidToolDefinitionError,
        None,
    ),
    ("tool schema no type", lambda: ToolDefinition("f", {}), InvalidToolDefinitionError, None),
    (
        "tool schema str",
        lambda: ToolDefinition("f", '{"type":"object"}'),
        InvalidToolDefinitionError,
        InvalidJSONError,
    ),
    (
        "tool schema RawJSON string",
        lambda: ToolDefinition("f", RawJSON.parse('"object"')),
        InvalidToolDefinitionError,
        None,
    ),
    (
        "tool description surrogate",
        lambda: ToolDefinition("f", SCHEMA, LONE),
        InvalidToolDefinitionError,
        None,
    ),
    # OutputFormat
    ("format unknown type", lambda: OutputFormat("xml"), InvalidOutputFormatError, None),
    (
        "text format with name",
        lambda: OutputFormat(OutputFormatType.TEXT, name="n"),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json format with schema",
        lambda: OutputFormat(OutputFormatType.JSON, schema=SCHEMA),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json format with description",
        lambda: OutputFormat(OutputFormatType.JSON, description="d"),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema no name",
        lambda: OutputFormat.json_schema("", SCHEMA),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema no schema",
        lambda: OutputFormat(OutputFormatType.JSON_SCHEMA, name="n"),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema array schema",
        lambda: OutputFormat.json_schema("n", [1]),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema name padded",
        lambda: OutputFormat.json_schema(" n", SCHEMA),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema description padded",
        lambda: OutputFormat.json_schema("n", SCHEMA, "d\n"),
        InvalidOutputFormatError,
        None,
    ),
    (
        "json_schema schema NaN",
        lambda: OutputFormat.json_schema("n", {"x": float("nan")}),
        InvalidOutputFormatError,
        InvalidJSONError,
    ),
    # Options
    ("frequency_penalty high", lambda: Options(frequency_penalty=2.5), InvalidOptionsError, None),
    ("frequency_penalty low", lambda: Options(frequency_penalty=-2.01), InvalidOptionsError, None),
    ("presence_penalty high", lambda: Options(presence_penalty=3), InvalidOptionsError, None),
    (
        "presence_penalty nan",
        lambda: Options(presence_penalty=float("nan")),
        InvalidOptionsError,
        None,
    ),
    ("temperature negative", lambda: Options(temperature=-0.1), InvalidOptionsError, None),
    ("temperature high", lambda: Options(temperature=2.5), InvalidOptionsError, None),
    ("temperature inf", lambda: Options(temperature=float("inf")), InvalidOptionsError, None),
    ("temperature str", lambda: Options(temperature="1"), InvalidOptionsError, None),
    # The mistakes a type checker now refuses still fail at run time, for untyped callers.
    ("temperature word", lambda: Options(temperature="hot"), InvalidOptionsError, None),
    ("temperature bool", lambda: Options(temperature=True), InvalidOptionsError, None),
    ("temperature huge int", lambda: Options(temperature=10**400), InvalidOptionsError, None),
    ("top_p huge negative int", lambda: Options(top_p=-(10**400)), InvalidOptionsError, None),
    (
        "frequency_penalty huge int",
        lambda: Options(frequency_penalty=10**400),
        InvalidOptionsError,
        None,
    ),
    ("top_p high", lambda: Options(top_p=1.5), InvalidOptionsError, None),
    ("top_p nan", lambda: Options(top_p=float("nan")), InvalidOptionsError, None),
    ("max_tokens zero", lambda: Options(max_tokens=0), InvalidOptionsError, None),
    ("max_tokens float", lambda: Options(max_tokens=1.0), InvalidOptionsError, None),
    ("max_tokens bool", lambda: Options(max_tokens=True), InvalidOptionsError, None),
    ("max_tokens 2**63", lambda: Options(max_tokens=BIG), InvalidOptionsError, None),
    ("top_k zero", lambda: Options(top_k=0), InvalidOptionsError, None),
    ("top_k 2**63", lambda: Options(top_k=BIG), InvalidOptionsError, None),
    ("stop empty entry", lambda: Options(stop=("a", "")), InvalidOptionsError, None),
    ("stop str", lambda: Options(stop="END"), InvalidOptionsError, None),
    ("stop entry not str", lambda: Options(stop=(1,)), InvalidOptionsError, None),
    ("stop entry surrogate", lambda: Options(stop=(LONE,)), InvalidOptionsError, None),
    ("model padded", lambda: Options(model=" gpt"), InvalidOptionsError, None),
    ("model surrogate", lambda: Options(model=LONE), InvalidOptionsError, None),
    (
        "reasoning_effort padded",
        lambda: Options(reasoning_effort="low "),
        InvalidOptionsError,
        None,
    ),
    ("output_format wrong type", lambda: Options(output_format="json"), InvalidOptionsError, None),
    (
        "extensions bad key",
        lambda: Options(extensions={"temperature": 1}),
        InvalidOptionsError,
        InvalidMetadataError,
    ),
    # Request
    ("request no messages", lambda: Request(()), InvalidRequestError, None),
    ("request messages not messages", lambda: Request(("hi",)), InvalidRequestError, None),
    ("request one message", lambda: Request(user_message("x")), InvalidRequestError, None),
    (
        "request system after user",
        lambda: Request((user_message("a"), system_message("s"))),
        InvalidRequestError,
        None,
    ),
    (
        "request delta part",
        lambda: Request((user_message("a"), assistant_message(tool_call_delta_part("c", "f")))),
        InvalidRequestError,
        None,
    ),
    (
        "request duplicate tool names",
        lambda: Request(
            (user_message("a"),), tools=(ToolDefinition("f", SCHEMA), ToolDefinition("f", SCHEMA))
        ),
        InvalidRequestError,
        None,
    ),
    (
        "request tools not tools",
        lambda: Request((user_message("a"),), tools=("f",)),
        InvalidRequestError,
        None,
    ),
    (
        "request options wrong type",
        lambda: Request((user_message("a"),), options={"model": "x"}),
        InvalidRequestError,
        None,
    ),
    ("tool message first", lambda: Request((TOOL,)), InvalidRequestError, None),
    (
        "tool message after user",
        lambda: Request((user_message("a"), TOOL)),
        InvalidRequestError,
        None,
    ),
    (
        "tool message after plain assistant",
        lambda: Request((user_message("a"), assistant_message("no calls"), TOOL)),
        InvalidRequestError,
        None,
    ),
    (
        "tool result answers no call",
        lambda: Request((user_message("a"), ASSISTANT_CALL, tool_message(ToolResult("c2", "f")))),
        InvalidRequestError,
        None,
    ),
    (
        "call answered twice in one message",
        lambda: Request((user_message("a"), ASSISTANT_CALL, tool_message(RESULT, RESULT))),
        InvalidRequestError,
        None,
    ),
    (
        "call answered twice across messages",
        lambda: Request((user_message("a"), ASSISTANT_CALL, TOOL, TOOL)),
        InvalidRequestError,
        None,
    ),
    (
        "tool message after a later user",
        lambda: Request((user_message("a"), ASSISTANT_CALL, TOOL, user_message("b"), TOOL)),
        InvalidRequestError,
        None,
    ),
    (
        "repeated call id",
        lambda: Request((user_message("a"), assistant_message(CALL, CALL))),
        InvalidRequestError,
        None,
    ),
    # Usage
    ("usage negative input", lambda: Usage(-1), InvalidUsageError, None),
    ("usage negative output", lambda: Usage(0, -1), InvalidUsageError, None),
    ("usage float", lambda: Usage(1.0), InvalidUsageError, None),
    ("usage bool", lambda: Usage(True), InvalidUsageError, None),
    ("usage 2**63", lambda: Usage(BIG), InvalidUsageError, None),
    ("usage sum 2**63", lambda: Usage(BIG - 1, 1), InvalidUsageError, None),
    ("reasoning over output", lambda: Usage(5, 3, reasoning_tokens=4), InvalidUsageError, None),
    ("reasoning negative", lambda: Usage(5, 3, reasoning_tokens=-1), InvalidUsageError, None),
    (
        "cache read over input",
        lambda: Usage(5, 3, cache_read_input_tokens=6),
        InvalidUsageError,
        None,
    ),
    (
        "cache write over input",
        lambda: Usage(5, 3, cache_write_input_tokens=6),
        InvalidUsageError,
        None,
    ),
    ("cache write str", lambda: Usage(5, 3, cache_write_input_tokens="1"), InvalidUsageError, None),
    # Response values
    ("response id padded", lambda: ResponseMetadata(id=" r"), InvalidResponseError, None),
    ("response model padded", lambda: ResponseMetadata(model="m\t"), InvalidResponseError, None),
    ("response model surrogate", lambda: ResponseMetadata(model=LONE), InvalidResponseError, None),
    (
        "response usage wrong",
        lambda: ResponseMetadata(usage={"input_tokens": 1}),
        InvalidResponseError,
        None,
    ),
    (
        "response extra bad",
        lambda: ResponseMetadata(extra={"": 1}),
        InvalidResponseError,
        InvalidMetadataError,
    ),
    (
        "output extra bad",
        lambda: OutputMetadata(extra={"k": float("nan")}),
        InvalidResponseError,
        InvalidMetadataError,
    ),
    ("output user message", lambda: Output(user_message("x")), InvalidResponseError, None),
    ("output message wrong type", lambda: Output("x"), InvalidResponseError, None),
    ("output finish unknown", lambda: Output(finish_reason="done"), InvalidResponseError, None),
    ("output finish empty", lambda: Output(finish_reason=""), InvalidResponseError, None),
    ("output metadata wrong", lambda: Output(metadata={}), InvalidResponseError, None),
    ("response output wrong", lambda: Response(output="x"), InvalidResponseError, None),
    ("response metadata wrong", lambda: Response(metadata=Usage()), InvalidResponseError, None),
]


@pytest.mark.parametrize(("build", "error", "cause"), [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_invalid_value_raises_exact_error(
    build: Callable[[], Any], error: type[Exception], cause: type[Exception] | None
) -> None:
    with pytest.raises(error) as info:
        build()
    assert type(info.value) is error
    assert isinstance(info.value, ValueError)
    if cause is not None:
        assert type(info.value.__cause__) is cause


def _complete(message: Message, reason: FinishReason | None) -> Response:
    return Response(Output(message, reason))


INCOMPLETE: list[tuple[str, Response]] = [
    ("empty response", Response()),
    ("no finish reason", _complete(assistant_message("hi"), None)),
    ("metadata only", Response(metadata=ResponseMetadata(id="r"))),
    ("delta part", _complete(assistant_message(tool_call_delta_part("c", "f")), FinishReason.STOP)),
    ("tool_calls without call", _complete(assistant_message("hi"), FinishReason.TOOL_CALLS)),
]


@pytest.mark.parametrize("response", [r[1] for r in INCOMPLETE], ids=[r[0] for r in INCOMPLETE])
def test_validate_complete_refuses(response: Response) -> None:
    response.validate()  # a valid chunk
    with pytest.raises(InvalidResponseError):
        response.validate_complete()


@pytest.mark.parametrize("reason", list(FinishReason))
def test_validate_complete_accepts(reason: FinishReason) -> None:
    parts: tuple[Part, ...] = (text_part("ok"),)
    if reason is FinishReason.TOOL_CALLS:
        parts = (*parts, CALL)
    _complete(Message(Role.ASSISTANT, parts), reason).validate_complete()
    if reason is not FinishReason.TOOL_CALLS:
        Response(Output(finish_reason=reason)).validate_complete()  # no message at all


def test_response_message_and_tool_calls() -> None:
    final = _complete(assistant_message("Oslo"), FinishReason.STOP)
    assert final.message == assistant_message("Oslo")
    assert final.tool_calls == ()
    calls = _complete(
        assistant_message("checking", CALL, tool_call_part("c2", "g")), FinishReason.TOOL_CALLS
    )
    assert calls.tool_calls == (ToolCall("c1", "f", "{}"), ToolCall("c2", "g"))
    assert calls.message.tool_calls == calls.tool_calls
    # A chunk's fragments are not calls.
    assert _complete(assistant_message(tool_call_delta_part("c", "f")), None).tool_calls == ()


@pytest.mark.parametrize(
    ("response", "says"),
    [
        (Response(), "no output"),
        (Response(metadata=ResponseMetadata(id="r")), "no output"),
        (Response(Output(finish_reason=FinishReason.CONTENT_FILTER)), "output has no message"),
    ],
    ids=["empty", "metadata only", "output without message"],
)
def test_response_message_refuses_a_response_without_one(response: Response, says: str) -> None:
    with pytest.raises(InvalidResponseError, match=says) as info:
        response.message  # noqa: B018
    assert type(info.value) is InvalidResponseError
    assert response.tool_calls == ()


@pytest.mark.parametrize(
    ("alias", "enum"),
    [
        (RoleLike, Role),
        (PartKindLike, PartKind),
        (FinishReasonLike, FinishReason),
        (OutputFormatTypeLike, OutputFormatType),
        (SourceKindLike, SourceKind),
    ],
)
def test_literal_parameter_types_spell_every_enum_value(alias: Any, enum: type[Any]) -> None:
    # Constructors accept an enum member or its value as a literal (so a type checker
    # refuses Message("bot", ...)): the literals must be exactly the enum's values.
    member_type, literal = typing.get_args(alias)
    assert member_type is enum
    assert typing.get_origin(literal) is typing.Literal
    assert list(typing.get_args(literal)) == [member.value for member in enum]


def test_evolve_revalidates() -> None:
    with pytest.raises(InvalidPartError):
        attrs.evolve(text_part("x"), text="")
    with pytest.raises(InvalidOptionsError):
        attrs.evolve(Options(), temperature=3.0)


def test_values_are_frozen() -> None:
    part = text_part("x")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        part.text = "y"  # type: ignore[misc]


def test_nested_error_names_path_and_chains_cause() -> None:
    with pytest.raises(InvalidMessageError) as info:
        user_message("ok", "")
    assert str(info.value).startswith("parts[1]: ")
    assert type(info.value.__cause__) is InvalidPartError
    with pytest.raises(InvalidPartError) as part_info:
        text_part("x", metadata={"k": float("nan")})
    assert "metadata" in str(part_info.value)
    assert type(part_info.value.__cause__) is InvalidMetadataError
    assert type(part_info.value.__cause__.__cause__) is InvalidJSONError


# ------------------------------------------------------------------ valid values, conversions


def test_sequences_become_tuples_and_bytes_are_copied() -> None:
    signature = bytearray(b"sig")
    part = reasoning_part("r", signature=signature)
    signature[0] = 0
    assert part.signature == b"sig" and type(part.signature) is bytes
    assert reasoning_part(signature=memoryview(b"m")).signature == b"m"
    message = Message(Role.USER, [text_part("a")])
    assert type(message.parts) is tuple
    message = Message(Role.USER, (p for p in [text_part("a")]))
    assert message.parts == (text_part("a"),)
    assert Options(stop=["a"]).stop == ("a",)
    assert Request([user_message("x")]).messages == (user_message("x"),)


def test_float_fields_accept_ints() -> None:
    options = Options(temperature=1, top_p=0, frequency_penalty=-2, presence_penalty=2)
    assert options.temperature == 1.0 and type(options.temperature) is float
    assert type(options.top_p) is float


def test_boundaries_accepted() -> None:
    Options(temperature=0, top_p=1, frequency_penalty=2, presence_penalty=-2)
    Options(max_tokens=2**63 - 1, top_k=1, stop=())
    Usage(2**63 - 2, 1, reasoning_tokens=1, cache_read_input_tokens=2**63 - 2)
    ToolDefinition("a" * 64, SCHEMA)
    ToolDefinition("A-z_0", SCHEMA)


def test_enums_accept_values() -> None:
    assert Part("text", text="x").kind is PartKind.TEXT
    assert Message("user", (text_part("x"),)).role is Role.USER
    assert Output(finish_reason="stop").finish_reason is FinishReason.STOP
    assert OutputFormat("json").type is OutputFormatType.JSON


def test_factories() -> None:
    assert system_message("s").parts == (text_part("s"),)
    assert user_message("a", media_part(IMG)).parts[1].media == IMG
    assert assistant_message("a", CALL).tool_calls == (ToolCall("c1", "f", "{}"),)
    assert tool_message(RESULT).tool_results == (RESULT,)
    assert text_part("x", metadata={"k": 1}).metadata == Metadata({"k": 1})


def test_message_text_concatenates_text_parts_only() -> None:
    message = assistant_message(reasoning_part("think"), "a", CALL, "b")
    assert message.text == "ab"


def test_tool_output_text() -> None:
    assert ToolOutput().text() == ""
    assert ToolOutput.of_text("") == ToolOutput()
    assert ToolOutput.of_text("hi").text() == "hi"
    assert ToolOutput((text_part("a"), text_part("b"))).text() == "ab"
    assert ToolOutput.of_json('{"b": 1, "a": 2.50}').text() == '{"a":2.50,"b":1}'
    assert ToolOutput.of_json({"x": [1]}).details == RawJSON.parse('{"x":[1]}')
    assert ToolOutput((media_part(IMG),)).text() is None
    assert ToolOutput((text_part("a"), media_part(IMG))).text() is None
    # Text content wins over details.
    assert ToolOutput((text_part("a"),), RawJSON.parse("1")).text() == "a"


def test_output_format_helpers() -> None:
    assert OutputFormat.text().fallback_instruction() == ""
    assert "JSON" in OutputFormat.json().fallback_instruction()
    fmt = OutputFormat.json_schema("person", {"type": "object"}, "A person")
    instruction = fmt.fallback_instruction()
    assert "'person'" in instruction and '{"type":"object"}' in instruction
    assert fmt.schema == RawJSON.parse('{"type": "object"}')


@attrs.frozen
class _Schema:
    type: str


def test_schema_as() -> None:
    fmt = OutputFormat.json_schema("s", {"type": "object"})
    assert fmt.schema_as(RawJSON) == RawJSON.parse('{"type":"object"}')
    assert fmt.schema_as(Metadata) == Metadata({"type": "object"})
    with pytest.raises(InvalidOutputFormatError):
        OutputFormat.text().schema_as(RawJSON)
    with pytest.raises(InvalidOutputFormatError):
        OutputFormat.json().schema_as(RawJSON)
    with pytest.raises(InvalidOutputFormatError) as info:
        fmt.schema_as(Extensions)  # "type" is not a namespace/name key
    assert type(info.value.__cause__) is InvalidMetadataError


def test_schema_as_plain_json_types() -> None:
    schema = {"type": "object", "properties": {"t": {"type": "number", "maximum": 2.50}}}
    fmt = OutputFormat.json_schema("s", schema)
    assert fmt.schema_as(dict) == schema
    assert fmt.schema_as(typing.Any) == schema
    assert fmt.schema_as(dict[str, Any]) == schema
    # A fresh tree: changing it changes nothing in the format.
    fmt.schema_as(dict)["type"] = "array"
    assert fmt.schema_as(dict) == schema
    with pytest.raises(InvalidOutputFormatError) as info:
        fmt.schema_as(list)  # the schema is an object
    assert type(info.value) is InvalidOutputFormatError
    assert type(info.value.__cause__) is InvalidJSONError
    assert "expected an array, got object" in str(info.value)
    with pytest.raises(InvalidOutputFormatError):
        OutputFormat.json().schema_as(dict)


class _NotAValue:
    pass


@pytest.mark.parametrize("cls", [_NotAValue, set, list[int]])
def test_schema_as_an_unknown_class_names_it(cls: Any) -> None:
    fmt = OutputFormat.json_schema("s", {"type": "object"})
    with pytest.raises(InvalidOutputFormatError) as info:
        fmt.schema_as(cls)
    assert type(info.value) is InvalidOutputFormatError
    name = getattr(cls, "__qualname__", None) or repr(cls)
    assert f"cannot decode the output format schema into {name}" in str(info.value)
    assert type(info.value.__cause__) is TypeError


def test_options_resolve() -> None:
    base = Options(
        model="a",
        temperature=0.5,
        stop=("x",),
        max_tokens=10,
        extensions={"p/a": 1, "p/b": 2},
    )
    override = Options(model="b", temperature=0.0, stop=(), extensions={"p/b": 3})
    resolved = base.resolve(override)
    assert resolved.model == "b"
    assert resolved.temperature == 0.0  # a populated zero overrides
    assert resolved.stop == ()  # an explicit empty list clears
    assert resolved.max_tokens == 10  # unset in the override: kept
    assert resolved.extensions == Extensions({"p/a": 1, "p/b": 3})
    assert base.resolve(None) is base
    assert base.resolve(Options()) == base
    assert Options().resolve(base) == base
    fmt = OutputFormat.json()
    assert base.resolve(Options(output_format=fmt)).output_format == fmt


def test_usage() -> None:
    usage = Usage(10, 5, reasoning_tokens=5, cache_read_input_tokens=10, cache_write_input_tokens=0)
    assert usage.total_tokens == 15
    assert Usage().is_zero() and not usage.is_zero()
    assert Response().usage == Usage()
    assert Response(metadata=ResponseMetadata(usage=usage)).usage == usage
    assert ResponseMetadata(usage=None).usage == Usage()


def test_response_text() -> None:
    assert Response().text == ""
    assert Output().text == ""
    assert Response(Output(assistant_message("a", "b"))).text == "ab"


def test_validate_is_idempotent() -> None:
    values: list[Any] = [
        text_part("x"),
        user_message("x"),
        Options(temperature=1),
        Request((user_message("x"),)),
        Usage(1, 1),
        Response(),
        ToolOutput(),
        OutputFormat.json(),
        ToolDefinition("f", SCHEMA),
        IMG,
        IMG.source,
        OutputMetadata(),
    ]
    for value in values:
        value.validate()
        value.validate()


def test_valid_request_shapes() -> None:
    two_calls = assistant_message(CALL, tool_call_part("c2", "g"))
    Request(
        (
            system_message("s1"),
            system_message("s2"),
            user_message("q"),
            two_calls,
            tool_message(RESULT),
            tool_message(ToolResult("c2", "g")),
            assistant_message("done"),
        )
    )
    # Not every call needs an answer; an assistant message may follow directly.
    Request((user_message("q"), ASSISTANT_CALL, assistant_message("never mind")))
    Request((assistant_message("a"),))


def test_values_are_hashable_and_equal_structurally() -> None:
    a = Request((user_message("x", "y"),), options=Options(stop=["z"]))
    b = Request([user_message("x", "y")], options=Options(stop=("z",)))
    assert a == b and hash(a) == hash(b)
    assert text_part("x", metadata={"k": 1}) != text_part("x")


def test_tool_output_null_details_are_absent() -> None:
    assert ToolOutput(details=RawJSON.parse("null")) == ToolOutput()
    assert ToolOutput.of_json("null").details is None
    assert ToolOutput.of_json("[null]").details == RawJSON.parse("[null]")


def test_tool_output_of_json_accepts_bytearray_and_memoryview() -> None:
    expected = ToolOutput.of_json(b'{"a": 1}')
    assert ToolOutput.of_json(bytearray(b'{"a": 1}')) == expected
    assert ToolOutput.of_json(memoryview(b'{"a": 1}')) == expected
    with pytest.raises(InvalidToolResultError):
        ToolOutput.of_json(bytearray(b"{"))
