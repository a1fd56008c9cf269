"""``WindowReader``: a bounded, read-only view of a conversation for a model's context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import attrs

from scope._validate import check_type
from scope.chat import Message
from scope.errors import InvalidWindowError, WindowTooSmallError
from scope.history._adapter import as_store
from scope.history._cache import HistoryCache
from scope.history._ids import ConversationID
from scope.history._protocols import Reader, Store
from scope.history._replay import cache_of
from scope.history._tokens import FOLD_START, DefaultTokenCounter, Fold, TokenCounter
from scope.history._turns import Projection, project
from scope.history._view import HistoryView

__all__ = [
    "WINDOW_CACHE_BYTES",
    "WindowReader",
    "check_low_water",
    "low_bounds",
    "select",
    "window",
]

#: The bound of the cache a ``WindowReader`` owns when its reader has no
#: ``history_cache`` of its own (a third-party reader, a ``StoreAdapter``): 4 MiB.
WINDOW_CACHE_BYTES: Final = 4 * 1024 * 1024


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
    if value is not None and not isinstance(value, TokenCounter):
        raise TypeError(
            f"window counter must be a TokenCounter (an object with a synchronous "
            f"count(messages) method), got {type(value).__name__}"
        )


def _check_low_water(instance: Any, attribute: Any, value: Any) -> None:
    check_low_water(value, instance.limit, instance.max_tokens)


def check_low_water(value: object, limit: int | None, max_tokens: int | None) -> None:
    """``low_water``'s rules (see ``WindowReader``): None, or an int (``TypeError``
    otherwise) between 1 and the bound it goes with (``InvalidWindowError`` otherwise)."""
    if value is None:
        return
    check_type(value, int, "window low_water", "an integer")
    assert isinstance(value, int)
    if max_tokens is None and limit is None:
        raise InvalidWindowError(
            f"window low_water={value} needs max_tokens (it is then in tokens) or limit "
            "(in messages); the window has neither"
        )
    if value < 1:
        raise InvalidWindowError(f"window low_water must be at least 1, got {value}")
    bound, name = (max_tokens, "max_tokens") if max_tokens is not None else (limit, "limit")
    assert bound is not None
    if value > bound:
        raise InvalidWindowError(f"window low_water must be at most {name} ({bound}), got {value}")


def low_bounds(
    limit: int | None, max_tokens: int | None, low_water: int | None
) -> tuple[int | None, int | None]:
    """The low water marks ``(messages, tokens)`` of a window (None: that bound is not
    set): ``low_water`` in tokens when ``max_tokens`` is set (the message limit then
    gets the same fraction of itself, rounded down, at least 1), else in messages; by
    default each bound's ``bound * 3 // 5``, at least 1."""
    if low_water is None:
        return _default_low(limit), _default_low(max_tokens)
    if max_tokens is None:
        return low_water, None
    messages = None if limit is None else max(1, limit * low_water // max_tokens)
    return messages, low_water


def _default_low(bound: int | None) -> int | None:
    return None if bound is None else max(1, bound * 3 // 5)


@final
@attrs.frozen
class WindowReader:
    """A ``Reader`` that returns the part of what ``reader`` holds a model's context
    takes: at most ``limit`` messages and at most ``max_tokens`` tokens, with a start
    that stays put from turn to turn as long as it can.

    - ``reader``: the ``Reader`` to window (a store, usually).
    - ``limit``: at most this many messages (an int >= 1), or None (the default): no
      message limit.
    - ``max_tokens``: at most this many tokens by ``counter``'s measure (an int >= 1),
      or None (the default): no token budget.
    - ``counter``: the ``TokenCounter`` measuring the window, or None (the default): a
      ``DefaultTokenCounter()`` kept with the cache below (``HistoryCache.token_counter``),
      so WindowReaders over one store handle share it and two handles never do.
    - ``low_water``: where the start goes when it has to move (see "Stable windows"
      below): an int from 1 to ``max_tokens`` in tokens when ``max_tokens`` is set, else
      from 1 to ``limit`` in messages; None (the default): ``max_tokens * 3 // 5``
      (``limit * 3 // 5``), rounded down and at least 1. With both limits set, the
      message limit's mark is ``limit * low_water // max_tokens`` (at least 1), the same
      fraction. ``low_water`` equal to its bound turns the stable rule off: the window
      is then v0.3's, the longest suffix that fits.

    With neither limit it only merges system messages and applies the newest
    compaction. The window is:

    1. one system message merging every stored system message, wherever it was stored:
       their parts in stored order with a ``"\\n\\n"`` text part between messages, and
       their metadata merged (later messages win per key); after a compaction
       (``scope.history.compact``) the newest compaction's summary is its last part and
       older compaction messages are left out. Present only when there is something to
       merge, and counted in ``limit`` and ``max_tokens``;
    2. then whole turns from a start turn to the newest, the turns that follow the
       newest compaction's ``covers`` only, with the reasoning parts of those retained
       turns dropped (the prefix they were bound to is gone). A turn starts at a user
       message and keeps every assistant and tool message after it, so a tool call is
       never separated from its result and no turn is ever cut; the window fits both
       limits, ``counter.count(window) <= max_tokens`` measured on the window as a
       whole.

    Stable windows: a window that drops its oldest turn whenever a new one lands
    changes the prefix of every request, which defeats the providers' prompt caches and
    invalidates thinking bound to its prefix (Anthropic's preserved thinking). So the
    start is replayed over the growth of the history, one message at a time, from
    start 0 before the first message: when a message lands (the turns after the newest
    compaction, the newest perhaps only begun), the start stays while the window from
    it to that message fits both limits; otherwise it moves to v0.3's window of the
    turns after it under the low water marks (the longest suffix of them that fits),
    or to the newest turn alone when that turn alone exceeds a mark. The start is thus
    a pure function of the stored messages, the merged system message and the numbers:
    every process reading the same store computes the same one, whatever it read
    before and however many messages landed between its reads, and it only moves
    forward as messages land. It does not move within a turn (nothing is stored until
    the turn completes, so every step of a tool loop reads the same window). A new
    stored system message (a compaction included) changes the merged message, the
    prefix of every window: the start is then replayed afresh under it. ``low_water``
    equal to its bound gives v0.3's window instead: the start of the longest suffix of
    whole turns that fits (the next older turn would not fit either limit), recomputed
    on every read.

    Non-system messages stored before the first user message (a greeting, say) belong to
    the first turn: they are kept with it, and dropped only together with it. When the
    whole history fits, the window is the whole history (with its system messages
    merged into one).

    ``read_view`` returns the window as ``messages`` with the whole head path's
    ``length``, its ``head`` and ``closed`` (from the wrapped reader's ``read_view``
    when it is a ``ViewReader``; otherwise derived as ``StoreAdapter`` derives them), so
    the history ``Middleware`` fences its turns correctly through a window. A window is
    over the head path only (DESIGN §6h), like every read; the projections it
    remembers are checked against the stored messages themselves (not their number),
    so after a rewind, or on another branch that reaches the same length, they are
    rebuilt, never served from the old branch.

    ``read`` raises ``WindowTooSmallError`` when the newest turn alone (plus the merged
    system message) does not fit. Cost: the turns, their token counts and the stable
    start's newest replay step (a few ints) are remembered per conversation
    (``scope/history/_turns.py``) in the ``HistoryCache`` of the reader's store handle
    (its ``history_cache``; within its ``cache_bytes``, dropped when the conversation is
    cleared), so WindowReaders built per request over one handle share them and two
    handles never do; a reader with no ``history_cache`` (a third-party reader) gets a
    cache this WindowReader owns, bounded by ``WINDOW_CACHE_BYTES`` (4 MiB). A read of
    a history that only grew groups, measures and replays only the new messages (a
    replay step is one count of the window; the default counter's count is folded on
    by one message instead, so with it a replay from scratch is linear in the history);
    a move counts the turns it passes and a few windows; a read of an unchanged history
    reuses the window it computed. It is read-only: it has no ``append`` or ``clear``,
    so it is a ``Reader`` but neither a ``Writer`` nor a ``Clearer``, and it is as safe
    to share as the reader it wraps.
    ``limit`` and ``max_tokens`` must each be None or an ``int`` (not a ``bool``;
    ``TypeError`` otherwise) of at least 1 (``InvalidWindowError`` otherwise),
    ``low_water`` None or an ``int`` (``TypeError`` otherwise) within its bound, with a
    bound to go with (``InvalidWindowError`` otherwise), ``counter`` None or a
    ``TokenCounter`` and ``reader`` a ``Reader`` (``TypeError`` otherwise).
    """

    reader: Reader = attrs.field(validator=_check_reader)
    limit: int | None = attrs.field(default=None, validator=_check_limit)
    max_tokens: int | None = attrs.field(default=None, validator=_check_max_tokens, kw_only=True)
    counter: TokenCounter | None = attrs.field(default=None, validator=_check_counter, kw_only=True)
    low_water: int | None = attrs.field(default=None, validator=_check_low_water, kw_only=True)
    # The reader as a Store (its own read_view, or one StoreAdapter derives from read).
    _viewer: Store = attrs.field(init=False, eq=False, repr=False)
    # Where projections are remembered: the reader's store handle's cache, else our own.
    _cache: HistoryCache = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_viewer", as_store(self.reader))
        cache = cache_of(self.reader)
        if cache is None:
            cache = cache_of(self._viewer)
        object.__setattr__(
            self, "_cache", HistoryCache(WINDOW_CACHE_BYTES) if cache is None else cache
        )

    def validate(self) -> None:
        """Check the fields (construction already did)."""
        _check_reader(self, None, self.reader)
        _check_limit(self, None, self.limit)
        _check_max_tokens(self, None, self.max_tokens)
        _check_counter(self, None, self.counter)
        _check_low_water(self, None, self.low_water)

    async def read(self, conversation_id: str) -> list[Message]:
        """The window over the conversation, as a new list (``[]`` when it is empty).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``). Cancellation propagates from the underlying read
        untouched.
        """
        cid = ConversationID(conversation_id)
        return self._window(cid, await self.reader.read(cid))

    async def read_view(self, conversation_id: str) -> HistoryView:
        """The window over one atomic read of the conversation, with the whole head
        path's ``length``, its ``head`` and ``closed`` (see the class docstring).

        The id is validated before the underlying reader is called
        (``InvalidConversationIDError``); ``WindowTooSmallError`` as for ``read``.
        """
        cid = ConversationID(conversation_id)
        view = await self._viewer.read_view(cid)
        if view.closed:
            return view
        return HistoryView(self._window(cid, view.messages), view.length, head=view.head)

    def _window(self, cid: ConversationID, stored: Sequence[Message]) -> list[Message]:
        counter = self.counter if self.counter is not None else self._cache.token_counter
        return select(
            project(self._cache, cid, stored), self.limit, self.max_tokens, counter, self.low_water
        )


def window(
    messages: Sequence[Message],
    limit: int | None = None,
    *,
    max_tokens: int | None = None,
    counter: TokenCounter | None = None,
    low_water: int | None = None,
) -> list[Message]:
    """The window rule of ``WindowReader`` applied to a list of stored messages,
    computed from scratch."""
    _check_limit(None, None, limit)
    _check_max_tokens(None, None, max_tokens)
    _check_counter(None, None, counter)
    check_low_water(low_water, limit, max_tokens)
    return select(
        project(None, ConversationID("window"), messages),
        limit,
        max_tokens,
        counter if counter is not None else DefaultTokenCounter(),
        low_water,
    )


#: The bounds of a window or its low water marks: (messages, tokens), None where unset.
_Bounds = tuple[int | None, int | None]


def select(
    projection: Projection,
    limit: int | None,
    max_tokens: int | None,
    counter: TokenCounter,
    low_water: int | None = None,
) -> list[Message]:
    """The window over a projection (see ``WindowReader``); remembered on it."""
    low = low_bounds(limit, max_tokens, low_water)
    key = (limit, max_tokens, low, id(counter) if max_tokens is not None else 0)
    cached = projection.windows.get(key)
    if cached is not None and (max_tokens is None or cached[0] is counter):
        return list(cached[1])
    start = _start(projection, (limit, max_tokens), low, key, counter)
    out = projection.messages(start)
    projection.windows[key] = (counter, tuple(out))
    return out


def _start(
    projection: Projection,
    hard: _Bounds,
    low: _Bounds,
    key: tuple[Any, ...],
    counter: TokenCounter,
) -> int:
    """The index of the oldest turn in the window."""
    turns = projection.turns
    if not turns:
        return 0
    _check_newest(projection, hard, counter)
    newest = len(turns) - 1
    if low == hard:
        start = _tightest(projection, newest, projection.turns[newest], 0, hard, counter)
        assert start is not None  # the newest turn fits
        return start
    return _replay(projection, hard, low, key, counter)


def _check_newest(projection: Projection, hard: _Bounds, counter: TokenCounter) -> None:
    """``WindowTooSmallError`` unless the newest turn alone fits both limits."""
    limit, budget = hard
    system = projection.system
    newest = projection.turns[-1]
    if limit is not None and len(newest) + (system is not None) > limit:
        raise WindowTooSmallError(
            f"the newest turn has {len(newest)} messages"
            + (" plus the merged system message" if system is not None else "")
            + f"; the window limit is {limit}"
        )
    if budget is not None:
        measured = _count(counter, projection.messages(len(projection.turns) - 1))
        if measured > budget:
            raise WindowTooSmallError(
                f"the newest turn takes {measured} tokens"
                + (" with the merged system message" if system is not None else "")
                + f"; the window's max_tokens is {budget}"
            )


def _replay(
    projection: Projection,
    hard: _Bounds,
    low: _Bounds,
    key: tuple[Any, ...],
    counter: TokenCounter,
) -> int:
    """The stable window's start (see ``WindowReader``), replayed message by message
    from the newest step remembered on the projection (a history that only grew keeps
    every message that step saw), so a read replays only the messages that landed
    since; the measure of the window at that step is remembered with it."""
    turns = projection.turns
    entry = projection.replays.get(key)
    meter = _Meter(projection, counter)
    if entry is not None and (hard[1] is None or entry[0] is counter):
        k, n, start, meter.sizes, meter.folded = entry[1]
    else:
        k, n, start = 0, 0, 0  # before the first message
    while True:
        if n < len(turns[k]):
            n += 1  # the next message of turn k
        elif k + 1 < len(turns):
            k, n = k + 1, 1  # the first message of the next turn
        else:
            break
        start = _step(projection, meter, start, k, n, hard, low, counter)
    projection.replays[key] = (counter, (k, n, start, meter.sizes, meter.folded))
    return start


def _step(
    projection: Projection,
    meter: _Meter,
    start: int,
    k: int,
    n: int,
    hard: _Bounds,
    low: _Bounds,
    counter: TokenCounter,
) -> int:
    """The start once the history holds turns ``0..k-1`` and the first ``n`` messages of
    turn ``k``, from ``start``, the start one message before."""
    if meter.fits(start, k, n, hard):
        return start
    if start >= k:  # turn k is the start already, and alone too big: it stays
        return k
    target = _tightest(projection, k, projection.turns[k][:n], start + 1, low, counter)
    return k if target is None else target


#: A window measured at a replay step: its start, the step (turn k, its first n
#: messages) and the measure (a message count, or ``DefaultTokenCounter._fold``'s state).
_Measured = tuple[int, int, int, Any]


@final
class _Meter:
    """Measures ``system + turns[start..k-1] + turns[k][:n]`` in a replay, in messages
    and in tokens. The last measure of each kind is kept (``sizes``, ``folded``, and
    with the replay step on the projection): while the start stays, the next step's
    adds the messages since. With a ``DefaultTokenCounter`` tokens are folded on
    (``DefaultTokenCounter._fold``, the same number as counting the window whole); any
    other counter counts each window whole."""

    __slots__ = ("_counter", "_fold", "_projection", "folded", "sizes")

    def __init__(self, projection: Projection, counter: TokenCounter) -> None:
        self._projection = projection
        self._counter = counter
        self._fold = counter._fold if type(counter) is DefaultTokenCounter else None
        self.sizes: _Measured | None = None
        self.folded: _Measured | None = None

    def fits(self, start: int, k: int, n: int, hard: _Bounds) -> bool:
        limit, budget = hard
        if limit is not None and self._messages(start, k, n) > limit:
            return False
        return budget is None or self._tokens(start, k, n) <= budget

    def _messages(self, start: int, k: int, n: int) -> int:
        projection = self._projection
        sizes = self.sizes
        if sizes is not None and sizes[0] == start and (sizes[1], sizes[2]) <= (k, n):
            total = int(sizes[3]) + len(_since(projection, sizes[1], sizes[2], k, n))
        else:
            total = (projection.system is not None) + n
            total += sum(len(turn) for turn in projection.turns[start:k])
        self.sizes = (start, k, n, total)
        return total

    def _tokens(self, start: int, k: int, n: int) -> int:
        projection = self._projection
        fold = self._fold
        if fold is None:
            return _count(self._counter, _window_messages(projection, start, k, n))
        folded = self.folded
        if folded is not None and folded[0] == start and (folded[1], folded[2]) <= (k, n):
            state: Fold = fold(folded[3], _since(projection, folded[1], folded[2], k, n))
        else:
            state = fold(FOLD_START, _window_messages(projection, start, k, n))
        self.folded = (start, k, n, state)
        return state[0]


def _since(projection: Projection, k0: int, n0: int, k: int, n: int) -> list[Message]:
    """The messages after step ``(k0, n0)`` up to step ``(k, n)``."""
    turns = projection.turns
    if k0 == k:
        return list(turns[k][n0:n])
    out = list(turns[k0][n0:])
    for turn in turns[k0 + 1 : k]:
        out.extend(turn)
    out.extend(turns[k][:n])
    return out


def _window_messages(projection: Projection, start: int, k: int, n: int) -> list[Message]:
    out = projection.messages(start, k)
    out.extend(projection.turns[k][:n])
    return out


def _tightest(
    projection: Projection,
    newest: int,
    last: tuple[Message, ...],
    lowest: int,
    bounds: _Bounds,
    counter: TokenCounter,
) -> int | None:
    """v0.3's window over turns ``lowest..newest``, turn ``newest`` being ``last`` (a
    prefix of it, in a replay): the index of the oldest turn of the longest suffix of
    them that fits ``bounds``, or None when ``last`` alone does not fit."""
    limit, budget = bounds
    turns = projection.turns
    floor = lowest
    if limit is not None:
        # The oldest turn the message limit allows (each step: the next older turn fits).
        room = limit - (projection.system is not None) - len(last)
        if room < 0:
            return None
        floor = newest
        while floor > lowest and len(turns[floor - 1]) <= room:
            floor -= 1
            room -= len(turns[floor])
    if budget is None:
        return floor
    return _token_start(projection, floor, newest, last, budget, counter)


def _token_start(
    projection: Projection,
    floor: int,
    newest: int,
    last: tuple[Message, ...],
    budget: int,
    counter: TokenCounter,
) -> int | None:
    """The oldest turn (>= ``floor``) such that the window ending at turn ``newest``
    (being ``last``) fits ``budget`` and the next older turn would not (None: ``last``
    alone does not fit): a start guessed from per-turn counts in context (remembered
    per turn), then settled by counting the window itself."""
    turns = projection.turns
    system = projection.system
    head = [] if system is None else [system]

    def fits(start: int) -> bool:
        window = projection.messages(start, newest)
        window.extend(last)
        return _count(counter, window) <= budget

    measured = _count(counter, [*head, *last])
    if measured > budget:
        return None
    # total(s) = count(head + turn s) + the sum of the in-context costs of the turns
    # after s (exact for a counter whose figures reach back at most one turn, as the
    # default counter's do when every turn has stored usage); settled below.
    costs = _turn_costs(projection, counter)
    total = measured
    head_cost = measured
    start = newest
    while start > floor:
        older = _count(counter, [*head, *turns[start - 1]])
        if start == newest and last is not turns[newest]:
            # A prefix of the newest turn (a replay step): its own cost in context.
            before = _count(counter, turns[start - 1])
            cost = _count(counter, [*turns[start - 1], *last]) - before
        else:
            cost = costs[start]
        guess = older + cost + (total - head_cost)
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
