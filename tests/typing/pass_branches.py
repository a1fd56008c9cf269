"""Regenerate and edit, typed (mypy --strict: no errors): the result's ``output`` is the
answer's text, or the ``output=`` type. tests/test_typing.py also runs ``main()``."""

from __future__ import annotations

import anyio

from scope.chat import Request
from scope.conversation import Conversation, TurnResult
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel


def answer(request: Request) -> str:
    return "42" if request.options.output_format is not None else "forty-two"


async def main() -> None:
    conversation = Conversation(FunctionModel(answer), InMemoryStore(), "c")
    await conversation.ask("What is six times seven?")
    text: TurnResult[str] = await conversation.regenerate()
    number: TurnResult[int] = await conversation.edit(1, "As a number?", output=int)
    assert (text.output, number.output + 0) == ("forty-two", 42)
    retried: TurnResult[int] = await conversation.ask("Again?", output=int, output_retries=2)
    retries: int = retried.output_retries
    assert (retried.output + 0, retries) == (42, 0)


if __name__ == "__main__":
    anyio.run(main)
