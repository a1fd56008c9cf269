"""Streaming and middleware mistakes a type checker must catch (see fail_values.py for the
``# E:`` convention; checked by tests/test_typing.py, never run).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from scope import chat
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore


class IteratorOnly:
    """A stream method typed as a plain AsyncIterator: callers could not close it."""

    def stream(self, request: chat.Request) -> AsyncIterator[chat.Response]:
        raise NotImplementedError


# E: (expression has type "IteratorOnly", variable has type "Streamer")
streamer: chat.Streamer = IteratorOnly()


async def iterator_fn(request: chat.Request) -> AsyncIterator[chat.Response]:
    raise NotImplementedError
    yield


# An async generator *function* typed as returning AsyncIterator is not a StreamerFunc.
# E: Argument 1 to "StreamerFunc" has incompatible type
chat.StreamerFunc(iterator_fn)


async def consume(chunks: AsyncIterator[chat.Response]) -> None:
    # A plain AsyncIterator has no aclose(): the reason Streamer.stream returns more.
    # E: of "aclosing" cannot be "AsyncIterator[Response]"
    async with contextlib.aclosing(chunks):
        pass


def bind(model: chat.Model) -> chat.Model:
    store = InMemoryStore()
    history = Middleware(store, store, "user-1")
    # The Middleware itself where its .call method was meant.
    # E: Argument 2 to "wrap" has incompatible type "Middleware"
    return chat.wrap(model, history)
