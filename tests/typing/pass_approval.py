"""A turn that waits for approval, typed (mypy --strict: no errors): ``ask`` gives a
``TurnResult[str]`` whether or not the turn waits; a waiting turn has ``pending`` and no
output (reading it raises ``NoOutputError``), so ``output`` is a ``str`` whenever it is
read; ``approve``/``deny`` type their result as ``ask`` does (``TurnResult[str]``, or
``TurnResult[T]`` with ``output=T``). tests/test_typing.py also runs ``main()``."""

from __future__ import annotations

import anyio
import attrs

from scope.chat import FinishReason, Output, Response, assistant_message, tool_call_part
from scope.conversation import Conversation, TurnResult
from scope.errors import NoOutputError
from scope.history.inmemory import InMemoryStore
from scope.testing import ScriptedModel
from scope.tools import tool


@attrs.frozen
class Kept:
    kept: bool


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


async def main() -> None:
    asks = assistant_message(tool_call_part("c1", "refund", '{"order": "o7"}'))
    model = ScriptedModel(
        Response(Output(asks, FinishReason.TOOL_CALLS)),
        Response(Output(assistant_message("Refunded o7."), FinishReason.STOP)),
    )
    conversation = Conversation(model, InMemoryStore(), "c", tools=[refund])
    waiting: TurnResult[str] = await conversation.ask("Refund o7")
    assert [call.id for call in waiting.pending] == ["c1"]
    try:
        waiting.output.upper()
    except NoOutputError:
        pass
    else:
        raise AssertionError("a waiting turn has no output")
    finished = await conversation.approve("c1")
    text: str = finished.output
    assert not finished.pending and text == "Refunded o7."
    again = ScriptedModel(
        Response(Output(asks, FinishReason.TOOL_CALLS)),
        Response(Output(assistant_message('{"kept": true}'), FinishReason.STOP)),
    )
    other = Conversation(again, InMemoryStore(), "d", tools=[refund])
    await other.ask("Refund o7")
    denied: TurnResult[Kept] = await other.deny("c1", "not today", output=Kept)
    kept: bool = denied.output.kept
    assert kept


if __name__ == "__main__":
    anyio.run(main)
