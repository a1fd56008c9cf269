"""Freeform tools: ``@tool(freeform=True)`` takes one text the model writes itself.

The definition is marked ``freeform`` (OpenAI Responses offers it as a custom tool, the
others get its one-string schema); ``run(call, freeform=True)`` hands the call's
arguments to the function as they are, and a JSON call of the same tool (another
provider's) decodes as for any tool. Asyncio and trio."""

from __future__ import annotations

from typing import Any

import pytest

from scope.chat import ToolCall, ToolDefinition
from scope.codec import from_json, to_json
from scope.errors import InvalidToolDefinitionError
from scope.tools import ToolContext, tool

pytestmark = pytest.mark.anyio

PATCH = '*** Begin Patch\n*** Update File: app.py\n@@\n-a\n+b\n*** End Patch\n{"patch": "x"}'


@tool(freeform=True)
def apply_patch(patch: str, ctx: ToolContext) -> str:
    """Apply a patch to the working tree."""
    return f"{ctx.conversation_id}:{len(patch)}:{patch[-14:]}"


def test_the_definition_is_freeform_with_one_required_string() -> None:
    definition = apply_patch.definition
    assert definition.freeform and not definition.strict
    schema = definition.input_schema.value()
    assert schema["properties"] == {"patch": {"type": "string"}}
    assert schema["required"] == ["patch"]
    assert from_json(to_json(definition), ToolDefinition) == definition
    assert b"freeform" in to_json(definition)
    plain = ToolDefinition("f", {"type": "object"})
    assert b"freeform" not in to_json(plain)  # stored definitions decode unchanged


async def test_a_freeform_call_passes_the_text_as_it_is() -> None:
    call = ToolCall("c1", "apply_patch", PATCH)
    result = await apply_patch.run(call, context=ToolContext("chat-1"), freeform=True)
    assert not result.is_error
    assert result.output.text() == f"chat-1:{len(PATCH)}:{PATCH[-14:]}"


async def test_a_json_call_of_a_freeform_tool_decodes_its_one_string() -> None:
    call = ToolCall("c1", "apply_patch", '{"patch": "*** Begin Patch"}')
    result = await apply_patch.run(call, context=ToolContext("chat-1"))
    assert result.output.text() == "chat-1:15:** Begin Patch"
    bad = await apply_patch.run(ToolCall("c2", "apply_patch", PATCH), context=ToolContext("c"))
    assert bad.is_error and "not valid JSON" in (bad.output.text() or "")


async def test_a_freeform_call_of_a_json_tool_is_an_error_result() -> None:
    @tool
    def add(a: int, b: int) -> int:
        return a + b

    result = await add.run(ToolCall("c1", "add", "1 + 2"), freeform=True)
    assert result.is_error
    assert result.output.text() == (
        "add takes JSON arguments matching its schema, not free text; call it as a "
        "function with a JSON object"
    )


def _two(a: str, b: str) -> str:
    return a + b


def _optional(a: str = "") -> str:
    return a


def _number(a: int) -> int:
    return a


def _none() -> str:
    return ""


@pytest.mark.parametrize(
    ("function", "got"),
    [(_two, "a, b"), (_optional, "a"), (_number, "a"), (_none, "none")],
)
def test_a_freeform_tool_takes_exactly_one_required_str(function: Any, got: str) -> None:
    with pytest.raises(
        TypeError, match=rf"is freeform: it takes exactly one parameter .*got {got}$"
    ):
        tool(freeform=True)(function)


def test_freeform_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"^freeform must be a bool, got int$"):
        tool(freeform=1)(_none)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="strict or freeform, not both"):
        tool(freeform=True, strict=True)(_optional)


async def test_run_checks_its_freeform_argument() -> None:
    with pytest.raises(TypeError, match=r"^freeform must be a bool, got str$"):
        await apply_patch.run(
            ToolCall("c1", "apply_patch", "x"),
            context=ToolContext("c"),
            freeform="yes",  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "properties": {"a": {"type": "string"}}},
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "required": ["a", "b"],
        },
    ],
)
def test_a_freeform_definition_needs_one_required_string(schema: dict[str, Any]) -> None:
    with pytest.raises(
        InvalidToolDefinitionError,
        match=r"^tool 'f' is freeform: its input_schema must be an object of exactly one "
        r"property, a required string \(the text\)$",
    ):
        ToolDefinition("f", schema, freeform=True)
    with pytest.raises(InvalidToolDefinitionError, match=r"^tool 'f' freeform must be a bool"):
        ToolDefinition("f", {"type": "object"}, freeform=1)  # type: ignore[arg-type]
