"""scope.tools.ToolContext: a tool parameter annotated ``ToolContext`` receives the
conversation id, the owner and ``Conversation(deps=...)``; it is not in the schema and
the model cannot set it. Sync and async tools, asyncio and trio.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import attrs
import orjson
import pytest

from scope.chat import (
    FinishReason,
    Output,
    Response,
    ToolCall,
    assistant_message,
    tool_call_part,
)
from scope.conversation import Conversation
from scope.errors import InvalidConversationIDError
from scope.history import ConversationID
from scope.history.inmemory import InMemoryStore
from scope.jsonvalue import RawJSON
from scope.testing import ScriptedModel
from scope.tools import Tool, ToolContext, tool

pytestmark = pytest.mark.anyio


def calls(*parts: tuple[str, str, str]) -> Response:
    """An answer asking for tools: ``(id, name, arguments)`` each."""
    message = assistant_message(*(tool_call_part(i, n, a) for i, n, a in parts))
    return Response(Output(message, FinishReason.TOOL_CALLS))


def answer(text: str) -> Response:
    return Response(Output(assistant_message(text), FinishReason.STOP))


@attrs.define
class Shop:
    """A service's dependencies: what the tools reach through ``ctx.deps``."""

    orders: dict[str, list[str]]
    seen: list[tuple[str, str | None, str]] = attrs.field(factory=list)


@tool
async def open_orders(ctx: ToolContext[Shop], status: str) -> list[str]:
    """The owner's orders with a status.

    :param ctx: the call's context (not sent to the model)
    :param status: the status, e.g. open
    """
    ctx.deps.seen.append((str(ctx.conversation_id), ctx.owner, "async"))
    return [order for order in ctx.deps.orders[ctx.owner or ""] if order.endswith(status)]


def _count(status: str, *, ctx: ToolContext[Shop]) -> int:
    """How many of the owner's orders have a status.

    :param status: the status
    """
    ctx.deps.seen.append((str(ctx.conversation_id), ctx.owner, threading.current_thread().name))
    return sum(order.endswith(status) for order in ctx.deps.orders[ctx.owner or ""])


count_threaded = tool(name="count_threaded")(_count)
count_on_loop = tool(name="count_on_loop", thread=False)(_count)


def _plain_count(status: str) -> int:
    """How many of the owner's orders have a status.

    :param status: the status
    """
    return len(status)


SHOP = Shop({"ana": ["o1:open", "o2:shipped", "o3:open"]})


# ------------------------------------------------------------------ the schema


def test_the_context_parameter_leaves_no_trace_in_the_schema() -> None:
    with_context = count_threaded.definition.input_schema.value()
    without = tool(name="count_threaded")(_plain_count).definition.input_schema.value()
    assert with_context == without
    assert with_context == {
        "type": "object",
        "properties": {"status": {"type": "string", "description": "the status"}},
        "required": ["status"],
        "additionalProperties": False,
    }
    # Nor does its docstring line, nor the type's name.
    text = orjson.dumps(open_orders.definition.input_schema.value()).decode()
    assert "ctx" not in text and "ToolContext" not in text and "context" not in text
    assert open_orders.context_parameter == "ctx"
    assert count_threaded.context_parameter == "ctx"


def test_a_tool_without_a_context_parameter_is_unchanged() -> None:
    plain = tool(_plain_count)
    assert plain.context_parameter is None
    assert plain.decode('{"status": "open"}') == {"status": "open"}
    assert plain("abc") == 3


# ------------------------------------------------------------------ through Conversation


async def test_async_and_sync_tools_receive_the_context_through_a_turn() -> None:
    shop = Shop(SHOP.orders)
    model = ScriptedModel(
        calls(
            ("c1", "open_orders", '{"status": "open"}'),
            ("c2", "count_threaded", '{"status": "open"}'),
            ("c3", "count_on_loop", '{"status": "shipped"}'),
        ),
        answer("Two open, one shipped."),
    )
    conversation = Conversation(
        model,
        InMemoryStore(),
        "conv-7",
        tools=[open_orders, count_threaded, count_on_loop],
        owner="ana",
        deps=shop,
    )
    result = await conversation.ask("My orders?")
    assert result.output == "Two open, one shipped."
    outputs = [r.output for r in model.requests[1].messages[-1].tool_results]
    assert [o.details for o in outputs] == [
        RawJSON.from_value(["o1:open", "o3:open"]),
        RawJSON.from_value(2),
        RawJSON.from_value(1),
    ]
    by_tool = sorted(shop.seen, key=lambda seen: seen[2] == "async")
    assert {(cid, owner) for cid, owner, _ in by_tool} == {("conv-7", "ana")}
    assert len(shop.seen) == 3
    # The threaded one ran in a worker thread, the other on the event loop's thread.
    names = {where for _, _, where in shop.seen}
    assert threading.current_thread().name in names and "async" in names
    assert len(names) == 3


async def test_without_deps_or_owner_the_context_has_none() -> None:
    got: list[ToolContext[Any]] = []

    @tool
    def remember(ctx: ToolContext[None]) -> str:
        got.append(ctx)
        return "ok"

    model = ScriptedModel(calls(("c1", "remember", "")), answer("Done."))
    await Conversation(model, InMemoryStore(), "c", tools=[remember]).ask("x")
    assert len(got) == 1
    assert got[0].conversation_id == ConversationID("c")
    assert type(got[0].conversation_id) is ConversationID
    assert got[0].owner is None and got[0].deps is None
    assert remember.definition.input_schema.value() == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


async def test_the_model_cannot_set_the_context_argument() -> None:
    shop = Shop(SHOP.orders)
    model = ScriptedModel(
        calls(("c1", "open_orders", '{"status": "open", "ctx": {"owner": "bob"}}')),
        answer("Sorry."),
    )
    conversation = Conversation(
        model, InMemoryStore(), "c", tools=[open_orders], owner="ana", deps=shop
    )
    await conversation.ask("x")
    error = model.requests[1].messages[-1].tool_results[0]
    assert error.is_error
    assert "unknown field(s) ['ctx'] (not in the schema)" in (error.output.text() or "")
    assert shop.seen == []  # the tool never ran


async def test_a_tool_without_the_parameter_runs_as_before_in_a_conversation() -> None:
    plain = tool(_plain_count)
    model = ScriptedModel(calls(("c1", "_plain_count", '{"status": "open"}')), answer("4."))
    conversation = Conversation(model, InMemoryStore(), "c", tools=[plain], deps=SHOP)
    await conversation.ask("x")
    result = model.requests[1].messages[-1].tool_results[0]
    assert not result.is_error
    assert result.output.details == RawJSON.from_value(4)


# ------------------------------------------------------------------ Tool.run directly


async def test_run_passes_the_context_given_and_ignores_it_for_a_tool_without_one() -> None:
    shop = Shop(SHOP.orders)
    call = ToolCall("c1", "count_threaded", '{"status": "open"}')
    result = await count_threaded.run(call, context=ToolContext("c-9", owner="ana", deps=shop))
    assert not result.is_error
    assert [seen[:2] for seen in shop.seen] == [("c-9", "ana")]
    plain = tool(_plain_count)
    call = ToolCall("c2", "_plain_count", '{"status": "ab"}')
    for context in (None, ToolContext("c-9", deps=shop)):
        out = await plain.run(call, context=context)
        assert not out.is_error and out.output.details == RawJSON.from_value(2)


async def test_run_refuses_a_missing_or_wrong_context() -> None:
    call = ToolCall("c1", "open_orders", '{"status": "open"}')
    with pytest.raises(TypeError) as missing:
        await open_orders.run(call)
    assert str(missing.value) == (
        "tool 'open_orders' takes a ToolContext (parameter ctx): pass "
        "run(call, context=ToolContext(...))"
    )
    with pytest.raises(TypeError) as wrong:
        await open_orders.run(call, context={"owner": "ana"})  # type: ignore[arg-type]
    assert str(wrong.value) == "context must be a scope.tools.ToolContext or None, got dict"


def test_tool_context_checks_its_arguments() -> None:
    context = ToolContext("c-1", owner="ana", deps=SHOP)
    assert context.conversation_id == "c-1" and context.owner == "ana"
    assert context.deps is SHOP
    assert repr(ToolContext("c-1")) == "ToolContext('c-1', owner=None, deps=None)"
    with pytest.raises(InvalidConversationIDError):
        ToolContext("")
    with pytest.raises(InvalidConversationIDError):
        ToolContext(7)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as owner:
        ToolContext("c-1", owner=42)  # type: ignore[arg-type]
    assert str(owner.value) == "owner must be a str or None, got int"


# ------------------------------------------------------------------ misuse at definition


def _twice(a: ToolContext[None], b: ToolContext[None], x: int) -> int:
    return x


def _optional(x: int, ctx: ToolContext[None] | None = None) -> int:
    return x


def _inside(x: int, ctxs: list[ToolContext[None]]) -> int:
    return x


def _annotated(ctx: Annotated[ToolContext[None], "the context"]) -> int:
    return 0


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (_twice, "tool '_twice', parameter b: a second ToolContext parameter (a takes it already)"),
        (
            _optional,
            "tool '_optional', parameter ctx: ToolContext must be the whole annotation (ctx: "
            "ToolContext), not part of one: the context is always given, never optional",
        ),
        (
            _inside,
            "tool '_inside', parameter ctxs: ToolContext must be the whole annotation (ctx: "
            "ToolContext), not part of one: the context is always given, never optional",
        ),
        (
            _annotated,
            "tool '_annotated', parameter ctx: ToolContext must be the whole annotation (ctx: "
            "ToolContext), not part of one: the context is always given, never optional",
        ),
    ],
)
def test_tool_context_other_than_as_one_whole_annotation_is_refused(
    function: Any, message: str
) -> None:
    with pytest.raises(TypeError) as refused:
        Tool(function)
    assert str(refused.value) == message


def test_an_unparametrized_tool_context_annotation_is_recognised() -> None:
    def bare(ctx: ToolContext, n: int) -> int:  # type: ignore[type-arg]
        return n

    made = tool(bare)
    assert made.context_parameter == "ctx"
    assert list(made.definition.input_schema.value()["properties"]) == ["n"]  # type: ignore[index, call-overload]
