"""Mistakes a type checker must catch (checked by tests/test_typing.py, never run).

A comment line ``# E: <text>`` announces an error mypy --strict must report on the next
code line, with ``<text>`` in its message (several such lines: several errors). Any error
not announced this way fails the test too.
"""

from __future__ import annotations

from scope.chat import (
    Message,
    Options,
    Output,
    OutputFormat,
    Part,
    Request,
    Response,
    ToolDefinition,
    ToolOutput,
    text_part,
    user_message,
)
from scope.conversation import Conversation
from scope.history import Batch, Receipt
from scope.media import Source

# A message where a sequence of messages goes.
# E: Argument 1 to "Request" has incompatible type "Message"; expected "Iterable[Message]"
Request(user_message("x"))
# E: "ToolDefinition"; expected "Iterable[
Request([user_message("x")], tools=ToolDefinition("f", {}))
# E: expected "Options | None"
Request([user_message("x")], options={"temperature": 0.5})

# A role, kind or reason that does not exist.
# E: Argument 1 to "Message" has incompatible type "Literal['bot']"
Message("bot", [text_part("hello")])
# E: Argument 1 to "Part" has incompatible type "Literal['txt']"
Part("txt", text="x")
# E: "finish_reason" to "Output" has incompatible type "Literal['done']"
Output(finish_reason="done")
# E: Argument 1 to "OutputFormat" has incompatible type "Literal['yaml']"
OutputFormat("yaml")
# E: Argument 1 to "Source" has incompatible type "Literal['file']"
Source("file")


def role_from_user_input(role: str) -> Message:
    # E: Argument 1 to "Message" has incompatible type "str"
    return Message(role, [text_part("hi")])


# Text where parts go, parts where text goes.
# E: Argument 2 to "Message" has incompatible type "str"; expected "Iterable[Part]"
Message("user", "hello")
# E: Argument 1 to "ToolOutput" has incompatible type "str"; expected "Iterable[Part]"
ToolOutput("done")

# Numbers and options.
# E: "temperature" to "Options" has incompatible type "str"; expected "float | None"
Options(temperature="hot")
# E: "max_tokens" to "Options" has incompatible type "float"; expected "int | None"
Options(max_tokens=1.5)
# E: List item 0 has incompatible type "int"; expected "str"
Options(stop=[1])
# E: "list[str]"; expected "Mapping[str, Any]"
Options(extensions=["openai/user"])

# JSON documents: a schema is an object.
# E: Argument 2 to "ToolDefinition" has incompatible type "str"
ToolDefinition("f", '{"type": "object"}')
# E: Argument 2 to "ToolDefinition" has incompatible type "list[int]"
ToolDefinition("f", [1])

# History values.
# E: "Message"; expected "Iterable[Message]"
Batch("conv", "turn-1", user_message("hi"))
# E: Argument 2 to "Receipt" has incompatible type "int"; expected "str"
Receipt("conv", 1, "sha256:00")


# Why Response.message exists: the fields themselves are optional.
def answer_message(response: Response) -> Message | None:
    # E: Item "None" of "Output | None" has no attribute "message"
    return response.output.message


def tool_call_count(response: Response) -> int:
    return len(response.message.tool_calls) + len(response.tool_calls)  # no error here


# A decision's result is typed as ask()'s: the text without output=, T with output=T.
async def decided(conversation: Conversation) -> None:
    approved = await conversation.approve("c1")
    # E: expression has type "str", variable has type "int"
    count: int = approved.output
    denied = await conversation.deny("c1", "no", output=int)
    # E: expression has type "int", variable has type "str"
    text: str = denied.output
    assert count and text
