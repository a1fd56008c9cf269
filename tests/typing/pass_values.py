"""Value constructors and factories accept what they document (mypy --strict: no errors).

Checked by tests/test_typing.py, which also runs this file: every line is valid at run
time too.
"""

from __future__ import annotations

from typing import Any, assert_type

import attrs

from scope import codec
from scope.chat import (
    FinishReason,
    Message,
    Options,
    Output,
    OutputFormat,
    OutputFormatType,
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
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.history import Batch, HistoryView, Receipt
from scope.jsonvalue import RawJSON
from scope.media import Media, Source, SourceKind
from scope.metadata import Extensions, Metadata

# Sequences: any iterable of the right item type (lists, tuples, generators).
messages = [system_message("Be brief."), user_message("Hi!")]
request = Request(messages)
request = Request(tuple(messages), tools=(), options=None)
request = Request(m for m in messages)
assert_type(request.messages, tuple[Message, ...])

# Enum fields: the member or its value spelled as a literal.
Message("user", [text_part("hi")])
Message(Role.ASSISTANT, (text_part("hi"),), metadata={"k": 1})
Message(Role("assistant"), [text_part("hi")])  # a str known only at run time: via the enum
Part("text", text="x")
Part(PartKind.REASONING, signature=bytearray(b"sig"))
Output(assistant_message("ok"), "stop")
Output(finish_reason=FinishReason.TOOL_CALLS)
Output(finish_reason=None)
OutputFormat("json")
OutputFormat(OutputFormatType.JSON_SCHEMA, name="n", schema={"type": "object"})
Source("bytes", data=memoryview(b"x"))
Source(SourceKind.URI, uri="https://example.com/a.png")

# Numbers: ints where floats go; None means unset.
Options(temperature=1, top_p=0.5, frequency_penalty=None, max_tokens=256, stop=["END"])
Options(stop=(), extensions={"openai/user": "u-1"}, output_format=OutputFormat.json())
Usage(10, 5, reasoning_tokens=None)
ResponseMetadata(id="r", usage=None, extra=Metadata({"k": 1}))

# JSON documents: RawJSON, dict, list.
ToolDefinition("f", {"type": "object"})
ToolDefinition("f", RawJSON.parse('{"type":"object"}'), description="d")
ToolOutput(details=[1, 2])
ToolOutput((text_part("a"),), details=None)
ToolResult("c1", "f", ToolOutput.of_json({"temp_c": 21.5}))
tool_message(ToolResult("c1", "f"))
reasoning_part("think", signature=b"s")
tool_call_part("c1", "f", "{}")
Media("image/png", Source("reference", ref="file-1"), metadata={"alt": "a"})
Extensions({"a/b": 1})

# History values.
batch = Batch("conv", "turn-1", messages, expected_length=0)
Receipt("conv", "turn-1", batch.digest)
HistoryView(messages, 2)
HistoryView((), 0, closed=True)

# Evolve keeps working (attrs' own signature).
attrs.evolve(request, options=Options(temperature=0.0))

# A complete response: the message and its tool calls without None checks.
response = Response(Output(assistant_message("Oslo"), FinishReason.STOP))
assert_type(response.message, Message)
assert_type(response.tool_calls, tuple[ToolCall, ...])
assert_type(response.message.tool_calls, tuple[ToolCall, ...])

# schema_as: plain JSON types or a codec class.
fmt = OutputFormat.json_schema("answer", {"type": "object"})
assert_type(fmt.schema_as(dict), dict[Any, Any])
assert_type(fmt.schema_as(dict[str, Any]), dict[str, Any])
fmt.schema_as(Any)  # accepted (the result is Any)
assert_type(fmt.schema_as(RawJSON), RawJSON)

# The codec and Batch.
assert_type(codec.from_json(codec.to_json(batch), Batch), Batch)
assert_type(codec.from_json(codec.to_json([batch]), list[Batch]), list[Batch])
assert_type(codec.from_json("[1, 2.50]", list), list[Any])
