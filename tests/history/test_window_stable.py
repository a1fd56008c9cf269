"""Stable windows: ``WindowReader(..., low_water=...)`` (DESIGN §6g), asyncio and trio.

The rule (``WindowReader``'s docstring): the start is replayed over the growth of the
history, message by message; it stays while the window from it fits both limits, and
otherwise moves to v0.3's window of the later turns under the low water marks.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    ResponseMetadata,
    Role,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidWindowError, WindowTooSmallError
from scope.history import (
    Batch,
    ConversationID,
    DefaultTokenCounter,
    Middleware,
    TokenCounter,
    WindowReader,
    compact,
)
from scope.history._cache import HistoryCache
from scope.history._tokens import FOLD_START
from scope.history._turns import Projection, project
from scope.history._window import select, window
from scope.history.inmemory import InMemoryStore
from scope.historystores.sqlite import SQLiteStore
from scope.metadata import Metadata
from scope.testing import ScriptedModel

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
COUNTER = DefaultTokenCounter()


def _turn(i: int, size: int = 40) -> list[Message]:
    return [user_message(f"q{i} " + "q" * size), assistant_message(f"a{i} " + "a" * size)]


def _first(out: Sequence[Message]) -> Message | None:
    """The first message of the window after the merged system message."""
    return next((m for m in out if m.role is not Role.SYSTEM), None)


class _ListReader:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    async def read(self, conversation_id: str) -> list[Message]:
        return list(self.messages)


class _PerMessage:
    """Every message costs ``cost`` tokens; records the length of every count."""

    def __init__(self, cost: int = 1) -> None:
        self.cost = cost
        self.calls: list[int] = []

    def count(self, messages: Sequence[Message]) -> int:
        self.calls.append(len(messages))
        return self.cost * len(messages)


class _Whole:
    """The default counter's numbers, through the protocol only (no fold): a window
    measured whole at every replay step."""

    def count(self, messages: Sequence[Message]) -> int:
        return COUNTER.count(messages)


WHOLE = _Whole()


# -- validation -----------------------------------------------------------------------------


def test_low_water_without_a_bound_is_invalid() -> None:
    with pytest.raises(InvalidWindowError, match="low_water=5 needs max_tokens"):
        WindowReader(_ListReader([]), low_water=5)
    with pytest.raises(InvalidWindowError, match="low_water=5 needs max_tokens"):
        window([], low_water=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 100, "low_water": 101}, r"at most max_tokens \(100\), got 101"),
        ({"limit": 10, "low_water": 11}, r"at most limit \(10\), got 11"),
        # With both bounds low_water is in tokens: the token bound is what it may not pass.
        ({"limit": 10, "max_tokens": 100, "low_water": 101}, r"at most max_tokens \(100\)"),
        ({"max_tokens": 100, "low_water": 0}, "low_water must be at least 1, got 0"),
        ({"limit": 10, "low_water": -3}, "low_water must be at least 1, got -3"),
    ],
    ids=repr,
)
def test_invalid_low_water_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidWindowError, match=match):
        WindowReader(_ListReader([]), **kwargs)
    limit = kwargs.pop("limit", None)
    with pytest.raises(InvalidWindowError, match=match):
        window([], limit, **kwargs)


@pytest.mark.parametrize("low_water", [True, False, 1.5, "3", 4.0], ids=repr)
def test_a_low_water_that_is_no_int_is_a_type_error(low_water: Any) -> None:
    with pytest.raises(TypeError, match="window low_water must be an integer, got"):
        WindowReader(_ListReader([]), 10, max_tokens=100, low_water=low_water)
    with pytest.raises(TypeError, match="window low_water must be an integer, got"):
        window([], 10, low_water=low_water)


def test_low_water_in_tokens_may_exceed_the_message_limit() -> None:
    reader = WindowReader(_ListReader([]), 10, max_tokens=100, low_water=50)
    assert reader.low_water == 50
    reader.validate()


def test_evolve_revalidates_low_water() -> None:
    reader = WindowReader(_ListReader([]), max_tokens=100, low_water=60)
    with pytest.raises(InvalidWindowError, match="at most max_tokens"):
        attrs.evolve(reader, low_water=200)
    with pytest.raises(InvalidWindowError, match="at most max_tokens"):
        attrs.evolve(reader, max_tokens=50)  # the bound changes under low_water
    assert attrs.evolve(reader, low_water=None).low_water is None


# -- the rule -------------------------------------------------------------------------------


async def _starts(
    reader: WindowReader, store: InMemoryStore, turns: list[list[Message]]
) -> list[int]:
    """Append the turns one by one; after each, the index of the window's first turn."""
    out: list[int] = []
    firsts: list[Message] = []
    for i, turn in enumerate(turns):
        await store.append(Batch("c", f"t{i}", turn))
        firsts.append(turn[0])
        first = _first(await reader.read("c"))
        out.append(next(k for k, m in enumerate(firsts) if m is first))
    return out


async def test_a_message_window_stays_until_it_must_move_then_drops_to_low_water() -> None:
    store = InMemoryStore()
    # limit 10, low water 6 (10 * 3 // 5): five 2-message turns fill it; the sixth
    # moves the start to keep 6 messages (turns 3, 4, 5); it stays for two more turns.
    starts = await _starts(WindowReader(store, 10), store, [_turn(i) for i in range(12)])
    assert starts == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9]


async def test_low_water_equal_to_the_limit_is_the_sliding_window() -> None:
    store = InMemoryStore()
    reader = WindowReader(store, 10, low_water=10)
    starts = await _starts(reader, store, [_turn(i) for i in range(8)])
    assert starts == [0, 0, 0, 0, 0, 1, 2, 3]


async def test_low_water_sets_where_the_start_goes() -> None:
    store = InMemoryStore()
    reader = WindowReader(store, 10, low_water=4)
    starts = await _starts(reader, store, [_turn(i) for i in range(9)])
    assert starts == [0, 0, 0, 0, 0, 4, 4, 4, 4]  # 4 messages after the move, then 6, 8, 10


async def test_the_default_mark_rounds_down() -> None:
    # limit 7: the mark is 7 * 3 // 5 = 4 (not 5): one-message turns, 4 kept on a move.
    store = InMemoryStore()
    reader = WindowReader(store, 7)
    starts = await _starts(reader, store, [[user_message(f"u{i}")] for i in range(9)])
    assert starts == [0, 0, 0, 0, 0, 0, 0, 4, 4]


async def test_a_token_window_moves_to_its_low_water_mark() -> None:
    store = InMemoryStore()
    counter = _PerMessage(10)  # 20 tokens a turn
    reader = WindowReader(store, max_tokens=100, counter=counter)  # mark: 60
    starts = await _starts(reader, store, [_turn(i) for i in range(12)])
    assert starts == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
    # Another mark is another window, replayed on its own: it moves to 20 tokens (the
    # newest turn alone) at turns 5 and 10, then holds turns 10 and 11.
    reader = WindowReader(store, max_tokens=100, counter=counter, low_water=20)
    assert len(await reader.read("c")) == 4


async def test_with_both_bounds_the_message_mark_is_the_same_fraction() -> None:
    store = InMemoryStore()
    # Tokens never bind (1 a message); the message mark is 10 * 500 // 1000 = 5.
    reader = WindowReader(store, 10, max_tokens=1000, counter=_PerMessage(), low_water=500)
    starts = await _starts(reader, store, [[user_message(f"u{i}")] for i in range(13)])
    assert starts == [0] * 10 + [6, 6, 6]


async def test_the_newest_turn_over_the_mark_is_kept_alone() -> None:
    store = InMemoryStore()
    reader = WindowReader(store, max_tokens=100, counter=_PerMessage(35))  # mark 60
    starts = await _starts(reader, store, [_turn(i) for i in range(3)])
    assert starts == [0, 1, 2]  # each turn (70) exceeds the mark: it is kept alone
    reader = WindowReader(store, max_tokens=69, counter=_PerMessage(35))
    with pytest.raises(WindowTooSmallError, match="newest turn takes 70 tokens"):
        await reader.read("c")


async def test_a_tool_call_stored_before_its_result_moves_nothing_backwards() -> None:
    """A turn stored message by message: the start never goes back, and the window
    holds whole turns only."""
    store = InMemoryStore()
    reader = WindowReader(store, 8)
    seen: list[int] = []
    stored: list[Message] = []
    for i in range(6):
        for j, message in enumerate(
            [
                user_message(f"q{i}"),
                assistant_message(tool_call_part(f"c{i}", "t")),
                tool_message(ToolResult(f"c{i}", "t", ToolOutput.of_text("r"))),
                assistant_message(f"a{i}"),
            ]
        ):
            await store.append(Batch("c", f"m{i}-{j}", [message]))
            stored.append(message)
            out = await reader.read("c")
            assert len(out) <= 8 and out[0].role is Role.USER
            seen.append(next(k for k, m in enumerate(stored) if m is out[0]))
            assert out == stored[seen[-1] :]
    assert seen == sorted(seen)


async def test_a_window_over_a_compaction_starts_at_covers_and_stays() -> None:
    store = InMemoryStore()
    for i in range(6):
        turn = [
            user_message(f"q{i}"),
            assistant_message(reasoning_part("thought", b"sig"), text_part(f"a{i}")),
        ]
        await store.append(Batch("c", f"t{i}", turn))
    summary = Response(Output(assistant_message("summary"), FinishReason.STOP))
    assert await compact(store, "c", ScriptedModel(summary), keep_turns=2) is not None
    reader = WindowReader(store, 9)  # mark 5: the merged system message and two turns
    out = await reader.read("c")
    assert [m.text for m in out] == ["summary", "q4", "a4", "q5", "a5"]
    assert not any(p.kind.value == "reasoning" for m in out for p in m.parts)
    firsts = []
    for i in range(6, 12):
        await store.append(Batch("c", f"t{i}", _turn(i, 0)))
        out = await reader.read("c")
        assert out[0].text == "summary" and len(out) <= 9
        firsts.append(out[1].text.split()[0])
    assert firsts == ["q4", "q4", "q7", "q7", "q7", "q10"]


async def test_a_new_system_message_replays_the_start_afresh() -> None:
    store = InMemoryStore()
    reader = WindowReader(store, 10)
    for i in range(7):
        await store.append(Batch("c", f"t{i}", _turn(i)))
    await reader.read("c")
    await store.append(Batch("c", "s", [system_message("be brief")]))
    for i in range(7, 10):
        await store.append(Batch("c", f"t{i}", _turn(i)))
        out = await reader.read("c")
        assert out == window(await store.read("c"), 10)  # the same as from scratch
        assert out[0].text == "be brief" and len(out) <= 10


# -- cost -----------------------------------------------------------------------------------


async def test_a_grown_history_replays_only_the_new_messages() -> None:
    store = InMemoryStore()
    counter = _PerMessage()
    reader = WindowReader(store, max_tokens=40, counter=counter)
    for i in range(300):
        await store.append(Batch("grown", f"t{i}", _turn(i)))
    await reader.read("grown")  # from scratch: one count per message at least
    assert len(counter.calls) >= 600
    for i in range(300, 320):
        await store.append(Batch("grown", f"t{i}", _turn(i)))
        counter.calls.clear()
        out = await reader.read("grown")
        assert len(out) <= 40
        # Two replay steps (two messages), plus now and then a move (counts of the few
        # turns it passes and of a few windows): never a rescan of the 600-odd stored
        # messages (a replay from scratch counts over 20,000).
        assert sum(counter.calls) <= 8 * 41, counter.calls
    counter.calls.clear()
    await reader.read("grown")
    assert counter.calls == []  # unchanged: the window is remembered


async def test_the_folded_count_is_the_whole_count() -> None:
    """The default counter measures replay steps by folding (a message at a time); a
    counter with the same numbers that can only count whole windows gives the same
    start on every read."""
    rng = random.Random(3)
    store = InMemoryStore()
    folded = WindowReader(store, max_tokens=700)
    whole = WindowReader(store, max_tokens=700, counter=_Whole())
    inp = 0
    for i in range(80):
        text = "a" * rng.randrange(1, 400)
        inp += rng.randrange(0, 200)
        answer = Message(
            Role.ASSISTANT,
            [text_part(text)],
            Metadata(
                {
                    "scope/provider": "p",
                    "scope/model": "m",
                    "scope/usage": {"input_tokens": inp, "output_tokens": rng.randrange(100)},
                }
            ),
        )
        await store.append(Batch("f", f"t{i}", [user_message("q" * rng.randrange(300)), answer]))
        assert await folded.read("f") == await whole.read("f")


def test_fold_composes() -> None:
    messages = [*_turn(0), *_turn(1, 400)]
    for cut in range(len(messages) + 1):
        state = COUNTER._fold(COUNTER._fold(FOLD_START, messages[:cut]), messages[cut:])
        assert state[0] == COUNTER.count(messages)


# -- through the Middleware -----------------------------------------------------------------


class _Answering:
    """A model that records each request and answers with text of a size drawn from a
    seeded generator, reporting usage (stored with the answer)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.requests: list[Request] = []

    async def call(self, request: Request) -> Response:
        self.requests.append(request)
        text = "a" * self.rng.randrange(100, 1200)
        usage = Usage(10 * len(request.messages), len(text) // 4)
        return Response(
            Output(assistant_message(text), FinishReason.STOP),
            ResponseMetadata(model="m", usage=usage),
        )


async def _converse(reader: WindowReader, store: InMemoryStore) -> list[Message | None]:
    """200 turns; the first history message of each request."""
    model = _Answering(seed=11)
    bound = Middleware(reader, store, "long").call(model)
    rng = random.Random(5)
    for i in range(200):
        question = user_message(f"q{i} " + "q" * rng.randrange(50, 800))
        await bound.call(Request([system_message("sys"), question]))
    return [_first(r.messages[1:]) for r in model.requests]


async def test_most_turns_of_a_long_conversation_replay_the_same_prefix() -> None:
    """200 turns through the Middleware with the default low water: after the window
    first fills, at least 80% of requests start their history with the same message
    as the request before (measured, deterministic)."""
    store = InMemoryStore()
    firsts = await _converse(WindowReader(store, max_tokens=8_000), store)
    filled = next(i for i in range(1, 200) if firsts[i] != firsts[0])
    kept = sum(firsts[i] == firsts[i - 1] for i in range(filled + 1, 200))
    assert filled < 60  # the window does fill
    assert kept / (199 - filled) >= 0.8, (kept, filled)
    # v0.3's window (low_water = max_tokens) moves on most turns instead.
    store = InMemoryStore()
    tight = await _converse(WindowReader(store, max_tokens=8_000, low_water=8_000), store)
    assert tight[:filled] == firsts[:filled]  # the same until the window first fills
    moved = sum(tight[i] != tight[i - 1] for i in range(filled + 1, 200))
    assert moved / (199 - filled) >= 0.5, moved


async def test_a_tool_loop_never_sees_its_prefix_move() -> None:
    store = InMemoryStore()
    for i in range(40):
        await store.append(Batch("loop", f"t{i}", _turn(i, 100)))
    reader = WindowReader(store, max_tokens=1_000)
    call = Response(
        Output(assistant_message(tool_call_part("c1", "lookup", "{}")), FinishReason.TOOL_CALLS)
    )
    final = Response(Output(assistant_message("done"), FinishReason.STOP))
    model = ScriptedModel(call, call, final)
    bound = Middleware(reader, store, "loop").call(model)
    question = user_message("q" * 100)
    step = assistant_message(tool_call_part("c1", "lookup", "{}"))
    result = tool_message(ToolResult("c1", "lookup", ToolOutput.of_text("r" * 300)))
    await bound.call(Request([question]))
    await bound.call(Request([question, step, result]))
    await bound.call(Request([question, step, result, step, result]))
    histories = [r.messages[: len(r.messages) - 1 - 2 * k] for k, r in enumerate(model.requests)]
    assert histories[0] == histories[1] == histories[2]
    assert len(histories[0]) < 80  # a window, not the whole history
    stored = await store.read("loop")
    assert stored[-6:] == [question, step, result, step, result, stored[-1]]


# -- properties -----------------------------------------------------------------------------


def _stamped(text: str, inp: int, out: int, model: str) -> Message:
    usage = {"input_tokens": inp, "output_tokens": out}
    metadata = {"scope/provider": "p", "scope/model": model, "scope/usage": usage}
    return Message(Role.ASSISTANT, [text_part(text)], Metadata(metadata))


@st.composite
def _histories(draw: st.DrawFn, systems: bool = True) -> list[Message]:
    """Histories with a greeting, tool calls with their results, stamped usage (which
    makes the default counter's figures non-monotone) and, optionally, system messages
    anywhere."""
    out: list[Message] = []
    inp = 0
    if draw(st.booleans()):
        out.append(system_message("s" * draw(st.integers(1, 200))))
    for i in range(draw(st.integers(0, 14))):
        if i == 0 and draw(st.booleans()):
            out.append(assistant_message("greeting"))
        if systems and i and draw(st.integers(0, 9)) == 0:
            out.append(system_message(f"system {i}"))
        out.append(user_message("u" * draw(st.integers(1, 300))))
        for j in range(draw(st.integers(0, 2))):
            out.append(assistant_message(tool_call_part(f"c{i}-{j}", "t", "x" * j)))
            out.append(tool_message(ToolResult(f"c{i}-{j}", "t", ToolOutput.of_text("r" * 50))))
        text = "a" * draw(st.integers(1, 300))
        if draw(st.booleans()):
            inp += draw(st.integers(-20, 200))
            model = draw(st.sampled_from(["m", "n"]))
            out.append(_stamped(text, max(inp, 0), draw(st.integers(0, 100)), model))
        elif draw(st.booleans()):
            out.append(assistant_message(text))
    return out


@st.composite
def _bounds(draw: st.DrawFn) -> tuple[int | None, int | None, int | None]:
    """(limit, max_tokens, low_water), at least one bound set."""
    limit = draw(st.none() | st.integers(1, 25))
    max_tokens = (
        draw(st.integers(1, 2500)) if limit is None else draw(st.none() | st.integers(1, 2500))
    )
    bound = max_tokens if max_tokens is not None else limit
    assert bound is not None
    low_water = draw(st.none() | st.integers(1, bound))
    return limit, max_tokens, low_water


def _position(rest: Sequence[Message], out: Sequence[Message]) -> int:
    """Where the window's body starts in the stored non-system messages."""
    first = _first(out)
    if first is None:
        return len(rest)
    return next(i for i, m in enumerate(rest) if m is first)


def _turn_starts(rest: Sequence[Message]) -> list[int]:
    starts = [i for i, m in enumerate(rest) if m.role is Role.USER]
    if rest and rest[0].role is not Role.USER:
        starts = [0, *starts[1:]]
    return starts


@settings(max_examples=300, deadline=None)
@given(
    _histories(),
    _bounds(),
    st.lists(st.integers(0, 60), max_size=6),
    st.sampled_from([COUNTER, WHOLE]),
)
def test_incremental_equals_from_scratch_for_any_read_schedule(
    messages: list[Message],
    bounds: tuple[int | None, int | None, int | None],
    schedule: list[int],
    counter: TokenCounter,
) -> None:
    """(c) read at any points of the growth (each read extends the remembered
    projection, or projects afresh): the window equals the one computed from scratch,
    and (a) it fits both bounds, whole turns only; with the default counter (folded)
    and with the same numbers counted whole."""
    limit, max_tokens, low_water = bounds
    cache = HistoryCache()
    cid = ConversationID("schedule")
    cuts = sorted({min(c, len(messages)) for c in schedule} | {len(messages)})
    for cut in cuts:
        prefix = messages[:cut]
        try:
            fresh = window(
                prefix, limit, max_tokens=max_tokens, counter=counter, low_water=low_water
            )
        except WindowTooSmallError:
            with pytest.raises(WindowTooSmallError):
                select(project(cache, cid, prefix), limit, max_tokens, counter, low_water)
            continue
        got = select(project(cache, cid, prefix), limit, max_tokens, counter, low_water)
        assert got == fresh
        if counter is WHOLE:  # the same numbers: the same window
            assert got == window(prefix, limit, max_tokens=max_tokens, low_water=low_water)
        assert limit is None or len(got) <= limit
        rest = [m for m in prefix if m.role is not Role.SYSTEM]
        # (Without a turn the window is the merged system message, whatever its size.)
        assert max_tokens is None or not rest or COUNTER.count(got) <= max_tokens
        position = _position(rest, got)
        assert position == len(rest) or position in _turn_starts(rest)
        assert [m for m in got if m.role is not Role.SYSTEM] == rest[position:]


@settings(max_examples=300, deadline=None)
@given(_histories(systems=False), _bounds())
def test_the_start_only_moves_forward_as_the_history_grows(
    messages: list[Message], bounds: tuple[int | None, int | None, int | None]
) -> None:
    """(b) read after every message: the start never moves back (system messages only
    before the first turn here: a new one changes every window's prefix). Not for
    ``low_water`` at its bound: v0.3's window, recomputed, which may move back when an
    answer's stored usage makes the window smaller than its estimate."""
    limit, max_tokens, low_water = bounds
    bound = max_tokens if max_tokens is not None else limit
    assume(low_water is None or low_water != bound)
    cache = HistoryCache()
    cid = ConversationID("forward")
    last = 0
    for cut in range(len(messages) + 1):
        prefix = messages[:cut]
        with contextlib.suppress(WindowTooSmallError):
            got = select(project(cache, cid, prefix), limit, max_tokens, COUNTER, low_water)
            rest = [m for m in prefix if m.role is not Role.SYSTEM]
            position = _position(rest, got)
            if position < len(rest):
                assert position >= last
                last = position


# v0.3's window (scope 0.3, scope/history/_window.py), as the reference for low_water=N.


def _v03(messages: list[Message], limit: int | None, budget: int | None) -> list[Message]:
    projection = project(None, ConversationID("v03"), messages)
    return projection.messages(_v03_start(projection, limit, budget))


def _v03_start(projection: Projection, limit: int | None, max_tokens: int | None) -> int:
    turns = projection.turns
    system = projection.system
    if not turns:
        return 0
    if limit is not None:
        room = limit - (system is not None)
        if len(turns[-1]) > room:
            raise WindowTooSmallError("messages")
        room -= len(turns[-1])
        floor = len(turns) - 1
        while floor > 0 and len(turns[floor - 1]) <= room:
            floor -= 1
            room -= len(turns[floor])
    else:
        floor = 0
    if max_tokens is None:
        return floor
    head = [] if system is None else [system]
    newest = len(turns) - 1

    def fits(start: int) -> bool:
        return COUNTER.count(projection.messages(start)) <= max_tokens

    measured = COUNTER.count([*head, *turns[newest]])
    if measured > max_tokens:
        raise WindowTooSmallError("tokens")
    costs = [COUNTER.count(turns[0])] + [
        COUNTER.count([*turns[k - 1], *turns[k]]) - COUNTER.count(turns[k - 1])
        for k in range(1, len(turns))
    ]
    total = head_cost = measured
    start = newest
    while start > floor:
        older = COUNTER.count([*head, *turns[start - 1]])
        guess = older + costs[start] + (total - head_cost)
        if guess > max_tokens:
            break
        start -= 1
        total, head_cost = guess, older
    if start < newest and not fits(start):
        start += 1
        while start < newest and not fits(start):
            start += 1
        return start
    while start > floor and fits(start - 1):
        start -= 1
    return start


@settings(max_examples=300, deadline=None)
@given(_histories(), st.none() | st.integers(1, 25), st.none() | st.integers(1, 2500), st.data())
def test_low_water_at_the_bound_is_v03s_window(
    messages: list[Message], limit: int | None, max_tokens: int | None, data: st.DataObject
) -> None:
    """(d) low_water = max_tokens (or = limit without max_tokens): v0.3's window,
    however the history grew before."""
    low_water = max_tokens if max_tokens is not None else limit
    cache = HistoryCache()
    cid = ConversationID("v03")
    cut = data.draw(st.integers(0, len(messages)))
    with contextlib.suppress(WindowTooSmallError):
        select(project(cache, cid, messages[:cut]), limit, max_tokens, COUNTER, low_water)
    try:
        expected = _v03(messages, limit, max_tokens)
    except WindowTooSmallError:
        with pytest.raises(WindowTooSmallError):
            select(project(cache, cid, messages), limit, max_tokens, COUNTER, low_water)
        return
    assert select(project(cache, cid, messages), limit, max_tokens, COUNTER, low_water) == expected
    assert window(messages, limit, max_tokens=max_tokens, low_water=low_water) == expected


# -- two processes ----------------------------------------------------------------------------

CHILD = """
import sys
import anyio
from scope.history import WindowReader
from scope.historystores.sqlite import SQLiteStore

async def main() -> None:
    async with await SQLiteStore.open(sys.argv[1]) as store:
        out = await WindowReader(store, max_tokens=int(sys.argv[3])).read(sys.argv[2])
        print("|".join(m.text for m in out))

anyio.run(main)
"""


async def test_two_processes_compute_the_same_window(tmp_path: Path) -> None:
    path = tmp_path / "window.db"
    rng = random.Random(9)
    async with await SQLiteStore.open(path) as one, await SQLiteStore.open(path) as two:
        reader = WindowReader(one, max_tokens=2_000)
        for i in range(120):
            turn = [
                user_message(f"q{i} " + "q" * rng.randrange(400)),
                assistant_message(f"a{i} " + "a" * rng.randrange(400)),
            ]
            await one.append(Batch("shared", f"t{i}", turn))
            mine = await reader.read("shared")  # this handle: incremental, read by read
        # The second handle has a cache of its own: from scratch, as a fresh process would.
        theirs = await WindowReader(two, max_tokens=2_000).read("shared")
        assert theirs == mine
    assert _first(mine) is not None and _first(mine).text.split()[0] != "q0"  # type: ignore[union-attr]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = await anyio.run_process(
        [sys.executable, "-c", CHILD, str(path), "shared", "2000"], cwd=ROOT, env=env
    )
    assert child.stdout.decode().rstrip("\n") == "|".join(m.text for m in mine)
