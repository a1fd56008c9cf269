"""Small builders and readers of test values, shared by the whole test suite.

Test modules import helpers from here (values), ``tests.servers`` (servers and store
backends), ``tests.strategies`` / ``tests.strategies_stream`` (Hypothesis strategies) and
``tests.openai_server`` / ``tests.anthropic_server`` (fake provider servers), never from
another test module.
"""

from __future__ import annotations

from collections.abc import Iterable

from scope.chat import Message, assistant_message, user_message
from scope.history import Batch

__all__ = ["batch", "numbered_turn", "texts", "turn"]


def turn(tag: str, size: int = 2) -> list[Message]:
    """A user question and ``size - 1`` answers: ``"<tag> q"``, ``"<tag> a"``, and for
    longer turns ``"<tag> a2"``, ``"<tag> a3"``..."""
    answers = [f"{tag} a"] + [f"{tag} a{i}" for i in range(2, size)]
    return [user_message(f"{tag} q"), *map(assistant_message, answers)]


def numbered_turn(cid: str, aid: str, size: int = 2) -> list[Message]:
    """``size`` messages whose texts ``"<cid>|<aid>|<index>"`` say where they belong: a
    user message, then answers."""
    return [user_message(f"{cid}|{aid}|0")] + [
        assistant_message(f"{cid}|{aid}|{i}") for i in range(1, size)
    ]


def batch(cid: str, aid: str, text: str = "hello") -> Batch:
    """A two-message batch: ``text`` asked, ``text + "!"`` answered."""
    return Batch(cid, aid, [user_message(text), assistant_message(text + "!")])


def texts(messages: Iterable[Message]) -> list[str]:
    """The text of each message, in order."""
    return [m.text for m in messages]
