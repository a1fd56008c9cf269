"""``WindowReader``: a bounded, read-only view of a conversation for a model's context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import attrs

from scope._validate import check_type
from scope.chat import Message
from scope.errors import InvalidWindowError, WindowTooSmallError
from scope.history._ids import ConversationID
from scope.history._protocols import Reader, ViewReader, implements
from scope.history._tokens import DefaultTokenCounter, TokenCounter
from scope.history._turns import Projection, Projections, project
from scope.history._view import HistoryView

__all__ = ["WindowReader", "select", "window"]


def _check_reader(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Reader):
        raise TypeError(
            f"window reader must be a Reader (an object with async read), got "
            f"{type(value).__name__}"
        )


def _check_limit(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    check_type(value, int, "window limit", "an integer")
    if value < 1:
        raise InvalidWindowError(f"window limit must be at least 1, got {value}")


def _check_max_tokens(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    check_type(value, int, "window max_tokens", "an integer")
    if not 1 <= value < 2**63:
        raise InvalidWindowError(f"window max_tokens must be between 1 and 2**63 - 1, got {value}")


def _check_counter(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not implements(value, TokenCounter):
        raise TypeError(
            f"window counter must be a TokenCounter (an object with a synchronous "
            f"count(messages) method), got {type(value).__name__}"
        )


@final
@attrs.frozen
class WindowReader:
    """A ``Reader`` that returns the part of what ``reader`` holds a model's context
    takes: at most ``limit`` messages and at most ``max_tokens`` tokens.

    - ``reader``: the ``Reader`` to window (a store, usually).
    - ``limit``: at most this many messages (an int >= 1), or None (the default): no
      message limit.
    - ``max_tokens``: at most this many tokens by ``counter``'s measure (an int >= 1),
      or None (the default): no token budget.
    - ``counter``: the ``TokenCounter`` measuring the window, or None (the default): a
      shared ``DefaultTokenCounter()``.

    With neither limit it only merges system messages and applies the newest
    compaction. The window is:

    1. one system message merging every stored system message, wherever it was stored:
       their parts in stored order with a ``"\\n\\n"`` text part between messages, and
       their metadata merged (later messages win per key); after a compaction
       (``scope.history.compact``) the newest compaction's summary is its last part and
       older compaction messages are left out. Present only when there is something to
       merge, and counted in ``limit`` and ``max_tokens``;
    2. then the longest suffix of whole turns that fits the rest of both limits, the
       turns that follow the newest compaction's ``covers`` only, with the reasoning
       parts of those retained turns dropped (the prefix they were bound to is gone).
       A turn starts at a user message and keeps every assistant and tool message
       after it, so a tool call is never separated from its result and no turn is ever
       cut. The suffix is maximal (the next older turn would not fit either limit), and
       ``counter.count(window) <= max_tokens``, measured on the window as a whole.

    Non-system messages stored before the first user message (a greeting, say) belong to
    the first turn: they are kept with it, and dropped only together with it. When the
    whole history fits, the window is the whole history (with its system messages
    merged into one).

    ``read_view`` returns the window as ``messages`` with the whole conversation's
    ``length`` and ``closed`` (from the wrapped reader's ``read_view`` when it is a
    ``ViewReader``; otherwise ``length`` is the number of messages ``read`` returned and
    ``closed`` is False), so the history ``Middleware`` fences its turns correctly
    through a window.

    ``read`` raises ``WindowTooSmallError`` when the newest turn alone (plus the merged
    system message) does not fit. Cost: the turns and their token counts are remembered
    per conversation (``scope/history/_turns.py``), so a read of a history that only grew
    groups and measures only the new messages, plus one count of the window; a read of
    an unchanged history reuses the window it computed. It is read-only: it has no
    ``append`` or ``clear``, so it is a ``Reader`` but neither a ``Writer`` nor a
    ``Clearer``, and it is as safe to share as the reader it wraps. ``limit`` and
    ``max_tokens`` must each be None or an ``int`` (not a ``bool``; ``TypeError``
    otherwise) of at least 1 (``InvalidWindowError`` otherwise), ``counter`` None or a
    ``TokenCounter`` and ``reader`` a ``Reader`` (``TypeError`` otherwise).
    """

    reader: Reader = attrs.field(validator=_check_reader)
    limit: int | None = attrs.field(default=None, validator=_check_limit)
    max_tokens: int | None = attrs.field(default=None, validator=_check_max_tokens, kw_only=True)
    counter: TokenCounter | None = attrs.field(default=None, validator=_check_counter, kw_only=True)

    def validate(self) -> None:
        """Check the fields (construction already did)."""
        _check_reader(self, None, self.reader)
        _check_limit(self, None, self.limit)
        _check_max_tokens(self, None, self.max_tokens)
        _check_counter(self, None, self.counter)

    async def read(self, conversation_id: str) -> list[Message]:
        """The window over the conversation, as a new list (``[]`` when it is empty).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``). Cancellation propagates from the underlying read
        untouched.
        """
        cid = ConversationID(conversation_id)
        return self._window(cid, await self.reader.read(cid))

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The window over one atomic read of the conversation, with the whole
        conversation's ``length`` and ``closed`` (see the class docstring).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``); ``WindowTooSmallError`` as for ``read``.
        """
        cid = ConversationID(conversation_id)
        reader = self.reader
        if implements(reader, ViewReader):
            view: HistoryView = await reader.read_view(cid)  # type: ignore[attr-defined]
            if view.closed:
                return view
            return HistoryView(self._window(cid, view.messages), view.length)
        messages = await reader.read(cid)
        return HistoryView(self._window(cid, messages), len(messages))

    def _window(self, cid: ConversationID, stored: Sequence[Message]) -> list[Message]:
        counter = self.counter if self.counter is not None else _DEFAULT_COUNTER
        return select(project(cid, stored), self.limit, self.max_tokens, counter)


_DEFAULT_COUNTER: Final = DefaultTokenCounter()


def window(
    messages: Sequence[Message],
    limit: int | None = None,
    *,
    max_tokens: int | None = None,
    counter: TokenCounter | None = None,
) -> list[Message]:
    """The window rule of ``WindowReader`` applied to a list of stored messages."""
    _check_limit(None, None, limit)
    _check_max_tokens(None, None, max_tokens)
    _check_counter(None, None, counter)
    return select(
        Projections().project(ConversationID("window"), messages),
        limit,
        max_tokens,
        counter if counter is not None else _DEFAULT_COUNTER,
    )


def select(
    projection: Projection, limit: int | None, max_tokens: int | None, counter: TokenCounter
) -> list[Message]:
    """The window over a projection (see ``WindowReader``); remembered on it."""
    key = (limit, max_tokens, id(counter) if max_tokens is not None else 0)
    cached = projection.windows.get(key)
    if cached is not None and (max_tokens is None or cached[0] is counter):
        return list(cached[1])
    start = _start(projection, limit, max_tokens, counter)
    out = projection.messages(start)
    projection.windows[key] = (counter, tuple(out))
    return out


def _start(
    projection: Projection, limit: int | None, max_tokens: int | None, counter: TokenCounter
) -> int:
    """The index of the oldest turn in the window."""
    turns = projection.turns
    system = projection.system
    if not turns:
        return 0
    if limit is not None:
        room = limit - (system is not None)
        newest = len(turns[-1])
        if newest > room:
            raise WindowTooSmallError(
                f"the newest turn has {newest} messages"
                + (" plus the merged system message" if system is not None else "")
                + f"; the window limit is {limit}"
            )
    else:
        room = -1
    # The oldest turn the message limit allows (each step: the next older turn fits).
    floor = len(turns) - 1
    if room >= 0:
        room -= len(turns[-1])
        while floor > 0 and len(turns[floor - 1]) <= room:
            floor -= 1
            room -= len(turns[floor])
    else:
        floor = 0
    if max_tokens is None:
        return floor
    return _token_start(projection, floor, max_tokens, counter)


def _token_start(projection: Projection, floor: int, budget: int, counter: TokenCounter) -> int:
    """The oldest turn (>= ``floor``) such that the window fits ``budget`` and the next
    older turn would not: a start guessed from per-turn counts in context (remembered
    per turn), then settled by counting the window itself."""
    turns = projection.turns
    system = projection.system
    head = [] if system is None else [system]
    newest = len(turns) - 1

    def fits(start: int) -> bool:
        return _count(counter, projection.messages(start)) <= budget

    measured = _count(counter, [*head, *turns[newest]])
    if measured > budget:
        raise WindowTooSmallError(
            f"the newest turn takes {measured} tokens"
            + (" with the merged system message" if system is not None else "")
            + f"; the window's max_tokens is {budget}"
        )
    # total(s) = count(head + turn s) + the sum of the in-context costs of the turns
    # after s (exact for a counter whose figures reach back at most one turn, as the
    # default counter's do when every turn has stored usage); settled below.
    costs = _turn_costs(projection, counter)
    total = measured
    head_cost = measured
    start = newest
    while start > floor:
        older = _count(counter, [*head, *turns[start - 1]])
        guess = older + costs[start] + (total - head_cost)
        if guess > budget:
            break
        start -= 1
        total, head_cost = guess, older
    if start < newest and not fits(start):
        # The guess was too long: drop turns until the window fits (the newest fits).
        start += 1
        while start < newest and not fits(start):
            start += 1
        return start
    # The window fits: add older turns while the next one still fits.
    while start > floor and fits(start - 1):
        start -= 1
    return start


def _turn_costs(projection: Projection, counter: TokenCounter) -> list[int]:
    """Each turn's cost in context: ``count(turn k-1 + turn k) - count(turn k-1)`` (the
    first turn: ``count(turn 0)``), remembered on the projection."""
    key = id(counter)
    entry = projection.costs.get(key)
    costs = entry[1] if entry is not None and entry[0] is counter else []
    turns = projection.turns
    if len(costs) < len(turns):
        costs = list(costs)
        for k in range(len(costs), len(turns)):
            if k == 0:
                costs.append(_count(counter, turns[0]))
            else:
                before = _count(counter, turns[k - 1])
                costs.append(_count(counter, [*turns[k - 1], *turns[k]]) - before)
        projection.costs[key] = (counter, costs)
    return costs


def _count(counter: TokenCounter, messages: Sequence[Message]) -> int:
    value = counter.count(messages)
    if type(value) is not int or value < 0:
        raise InvalidWindowError(
            f"the window's counter {type(counter).__name__}.count returned {value!r}; "
            "expected a non-negative int"
        )
    return value
