"""Caches that must forget a cleared conversation: one registry below both the history
package (the Middleware's replay cache registers itself) and the stores (which report
each clear), so neither reaches into the other's modules."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

__all__ = ["conversation_cleared", "on_conversation_cleared"]

_lock: Final = threading.Lock()
_forgetters: list[Callable[[str], None]] = []


def on_conversation_cleared(forget: Callable[[str], None]) -> None:
    """Call ``forget(conversation_id)`` after every clear this process makes (it must be
    quick, thread-safe and not raise)."""
    with _lock:
        _forgetters.append(forget)


def conversation_cleared(conversation_id: str) -> None:
    """Report a clear: every registered cache forgets ``conversation_id``."""
    with _lock:
        forgetters = tuple(_forgetters)
    for forget in forgetters:
        forget(conversation_id)
