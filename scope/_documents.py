"""Message documents: the one decoder of a JSON array of messages and the one digest.

Three documents hold a list of messages: a history ``Batch``
(``{"conversation_id", "digest", "id", "messages"}``), a stored batch record (the
canonical array itself) and a line of ``scope history export``
(``{"conversation_id", "messages"}``). Each decodes its ``messages`` with
``decode_messages`` and digests the canonical array with ``digest_of``, so they accept
the same messages and report a bad one with the same ``messages[i]: ...`` path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

from scope.chat import Message, PartKind
from scope.codec import from_builtins
from scope.errors import InvalidMessageError

__all__ = ["DIGEST_PREFIX", "check_messages", "decode_messages", "digest_of"]

#: What every batch digest starts with.
DIGEST_PREFIX: Final = "sha256:"


def digest_of(encoded_messages: bytes) -> str:
    """``"sha256:" + hex(sha256(encoded_messages))``: the digest of a batch whose
    canonical encoded messages are ``encoded_messages``."""
    return DIGEST_PREFIX + hashlib.sha256(encoded_messages).hexdigest()


def _incomplete(index: int, message: Message) -> str | None:
    """The problem of ``message`` (at ``messages[index]``) as a stored message: the path
    of its first ``tool_call_delta`` part, or None when it is complete."""
    for part_index, part in enumerate(message.parts):
        if part.kind is PartKind.TOOL_CALL_DELTA:
            return (
                f"messages[{index}].parts[{part_index}]: a stored message must be "
                "complete (no tool_call_delta parts)"
            )
    return None


def check_messages(messages: tuple[Message, ...], error: Callable[[str], Exception]) -> None:
    """Raise ``error(problem)`` unless ``messages`` are what a document holds: at least
    one, each a complete ``Message`` (no ``tool_call_delta`` parts)."""
    if not messages:
        raise error("a batch needs at least one message")
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise error(f"messages[{index}] must be a Message, got {type(message).__name__}")
        problem = _incomplete(index, message)
        if problem is not None:
            raise error(problem)


def decode_messages(tree: Any, error: Callable[[str], Exception]) -> tuple[Message, ...]:
    """The messages of ``tree``, the parsed ``messages`` array of a document (a tree from
    ``scope._json.parse_exact_fast``, or plain builtins): each decoded strictly (as
    ``scope.codec.from_builtins(item, Message)``) and complete (no ``tool_call_delta``
    parts), as history stores them.

    Anything else raises ``error(problem)``, ``problem`` naming the place:
    ``messages: expected an array``, ``messages[1]: parts[0].kind: ...`` (chained to the
    ``InvalidMessageError``) or ``messages[1].parts[0]: a stored message must be
    complete ...``. ``error`` is an exception class or any callable building one (a
    store's ``corrupt`` for a stored record). An empty array is returned as ``()``:
    whether that is allowed is the document's rule.
    """
    if type(tree) is not list:
        raise error("messages: expected an array")
    messages = []
    for index, item in enumerate(tree):
        try:
            message = from_builtins(item, Message)
        except InvalidMessageError as exc:
            raise error(f"messages[{index}]: {exc}") from exc
        problem = _incomplete(index, message)
        if problem is not None:
            raise error(problem)
        messages.append(message)
    return tuple(messages)
