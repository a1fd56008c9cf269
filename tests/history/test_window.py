"""WindowReader: whole turns, a merged system message, read-only (asyncio and trio)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.chat import (
    Message,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidConversationIDError, InvalidWindowError, WindowTooSmallError
from scope.history import (
    Batch,
    Clearer,
    HistoryView,
    Reader,
    ViewReader,
    WindowReader,
    Writer,
)
from scope.history._window import window
from scope.history.inmemory import InMemoryStore
from scope.metadata import Metadata

pytestmark = pytest.mark.anyio


class _ListReader:
    """A Reader over a fixed list, recording the ids it was asked for."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.calls: list[str] = []

    async def read(self, conversation_id: str) -> list[Message]:
        self.calls.append(conversation_id)
        return list(self.messages)


def _tool_turn(tag: str) -> list[Message]:
    """user, assistant tool call, tool result, final assistant: 4 messages."""
    return [
        user_message(f"{tag} q"),
        assistant_message(tool_call_part(f"{tag}-call", "lookup", "{}")),
        tool_message(ToolResult(f"{tag}-call", "lookup", ToolOutput.of_text(f"{tag} result"))),
        assistant_message(f"{tag} a"),
    ]


def _simple_turn(tag: str) -> list[Message]:
    return [user_message(f"{tag} q"), assistant_message(f"{tag} a")]


async def _read(messages: list[Message], limit: int) -> list[Message]:
    """v0.3's window (``low_water=limit``: no stable start), the longest fitting suffix;
    the stable start is tested in test_window_stable.py."""
    return await WindowReader(_ListReader(messages), limit, low_water=limit).read("c")


# -- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1], ids=repr)
def test_invalid_limit_raises_invalid_window_error(limit: Any) -> None:
    with pytest.raises(InvalidWindowError, match="window limit must be at least 1"):
        WindowReader(_ListReader([]), limit)


@pytest.mark.parametrize("limit", [True, False, 1.0, "3"], ids=repr)
def test_a_limit_that_is_no_int_is_a_type_error(limit: Any) -> None:
    with pytest.raises(TypeError, match="window limit must be an integer, got"):
        WindowReader(_ListReader([]), limit)


def test_reader_must_be_a_reader() -> None:
    with pytest.raises(TypeError, match="window reader must be a Reader"):
        WindowReader(object(), 3)  # type: ignore[arg-type]


def test_evolve_revalidates() -> None:
    reader = WindowReader(_ListReader([]), 3)
    with pytest.raises(InvalidWindowError):
        attrs.evolve(reader, limit=0)
    assert attrs.evolve(reader, limit=5).limit == 5
    reader.validate()


def test_window_reader_is_read_only() -> None:
    reader = WindowReader(InMemoryStore(), 3)
    assert isinstance(reader, Reader)
    assert not isinstance(reader, Writer)
    assert not isinstance(reader, Clearer)
    assert not hasattr(reader, "append")
    assert not hasattr(reader, "clear")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        reader.limit = 10  # type: ignore[misc]


# -- the window --------------------------------------------------------------------------


async def test_empty_conversation_gives_empty_window() -> None:
    assert await _read([], 1) == []


async def test_everything_fits() -> None:
    messages = [system_message("s"), *_simple_turn("1"), *_tool_turn("2")]
    assert await _read(messages, 7) == messages
    assert await _read(messages, 100) == messages


async def test_only_whole_turns_are_kept() -> None:
    messages = [*_simple_turn("1"), *_tool_turn("2"), *_simple_turn("3")]
    # 6 fits turns 2 and 3 exactly; 5 cannot take turn 2 (4 messages) partially.
    assert await _read(messages, 6) == messages[2:]
    assert await _read(messages, 5) == messages[6:]
    assert await _read(messages, 2) == messages[6:]


async def test_longest_suffix_stops_at_the_first_turn_that_does_not_fit() -> None:
    # An older small turn is not taken when the turn between it and the suffix is too big.
    messages = [*_simple_turn("1"), *_tool_turn("2"), *_simple_turn("3")]
    assert await _read(messages, 4) == messages[6:]


async def test_merged_system_message_counts_in_the_limit() -> None:
    messages = [system_message("s"), *_simple_turn("1"), *_simple_turn("2")]
    assert await _read(messages, 5) == messages
    assert await _read(messages, 4) == [messages[0], *messages[3:]]
    assert await _read(messages, 3) == [messages[0], *messages[3:]]


async def test_system_messages_merge_into_one() -> None:
    messages = [
        Message(Role.SYSTEM, [text_part("one")], metadata={"a": 1, "b": 1}),
        *_simple_turn("1"),
        Message(Role.SYSTEM, [text_part("two"), text_part("three")], metadata={"b": 2}),
        *_simple_turn("2"),
    ]
    out = await _read(messages, 3)
    assert out[0] == Message(
        Role.SYSTEM,
        [text_part("one"), text_part("\n\n"), text_part("two"), text_part("three")],
        metadata=Metadata({"a": 1, "b": 2}),
    )
    assert out[0].text == "one\n\ntwothree"
    assert out[1:] == _simple_turn("2")
    assert [m.role for m in out].count(Role.SYSTEM) == 1


async def test_a_single_system_message_is_kept_as_is() -> None:
    system = Message(Role.SYSTEM, [text_part("s", metadata={"p": 1})], metadata={"m": 2})
    out = await _read([system, *_simple_turn("1")], 3)
    assert out[0] == system


async def test_only_system_messages() -> None:
    assert await _read([system_message("a"), system_message("b")], 1) == [
        Message(Role.SYSTEM, [text_part("a"), text_part("\n\n"), text_part("b")])
    ]


async def test_newest_turn_too_big_raises_window_too_small() -> None:
    with pytest.raises(WindowTooSmallError):
        await _read([*_simple_turn("1"), *_tool_turn("2")], 3)


async def test_system_message_can_make_the_window_too_small() -> None:
    messages = [system_message("s"), *_simple_turn("1")]
    assert await _read(messages, 3) == messages
    with pytest.raises(WindowTooSmallError):
        await _read(messages, 2)
    with pytest.raises(WindowTooSmallError):
        await _read(messages, 1)


async def test_tool_calls_never_separated_from_their_results() -> None:
    turn = _tool_turn("1")
    messages = [*_simple_turn("0"), *turn]
    for limit in range(4, 7):
        out = await _read(messages, limit)
        assert out[-4:] == turn
    with pytest.raises(WindowTooSmallError):
        await _read(messages, 3)


async def test_open_turn_ending_in_tool_call_is_whole() -> None:
    # A stored turn may end at a tool call or result: it is still one turn.
    messages = [*_simple_turn("1"), *_tool_turn("2")[:3]]
    assert await _read(messages, 3) == messages[2:]
    assert await _read(messages, 5) == messages


async def test_messages_before_the_first_user_message_belong_to_the_first_turn() -> None:
    # DESIGN §6b: a leading greeting is kept with the first turn, never dropped while
    # it fits (v0.1 dropped it, so 5 stored messages read as 4 under a limit of 10).
    greeting = assistant_message("Hello! How can I help?")
    messages = [greeting, *_simple_turn("1"), *_simple_turn("2")]
    assert await _read(messages, 10) == messages
    assert await _read(messages, 5) == messages
    # The greeting goes only together with its turn.
    assert await _read(messages, 4) == messages[3:]
    assert await _read(messages, 2) == messages[3:]
    with_system = [system_message("s"), greeting, *_simple_turn("1")]
    assert await _read(with_system, 10) == with_system
    assert await _read(with_system, 4) == with_system
    with pytest.raises(WindowTooSmallError):
        await _read(with_system, 3)  # the first (only) turn is 3 messages + the system one
    # A conversation that is only a greeting is one turn.
    assert await _read([greeting], 5) == [greeting]
    with pytest.raises(WindowTooSmallError):
        await _read([greeting, assistant_message("more")], 1)


async def test_window_returns_a_new_list() -> None:
    reader = WindowReader(_ListReader(_simple_turn("1")), 5)
    first = await reader.read("c")
    first.clear()
    assert await reader.read("c") == _simple_turn("1")


async def test_invalid_id_raises_before_reading() -> None:
    inner = _ListReader([])
    with pytest.raises(InvalidConversationIDError):
        await WindowReader(inner, 3).read(" bad")
    assert inner.calls == []


async def test_window_over_a_store() -> None:
    store = InMemoryStore()
    await store.append(Batch("c", "1", [system_message("s"), *_simple_turn("1")]))
    await store.append(Batch("c", "2", _tool_turn("2")))
    reader = WindowReader(store, 5)
    assert await reader.read("c") == [system_message("s"), *_tool_turn("2")]
    assert await reader.read("unknown") == []
    await store.clear("c")
    assert await reader.read("c") == []


async def test_read_view_is_the_window_with_the_whole_conversation_length() -> None:
    store = InMemoryStore()
    await store.append(Batch("c", "1", [system_message("s"), *_simple_turn("1")]))
    await store.append(Batch("c", "2", _tool_turn("2")))
    reader = WindowReader(store, 5)
    assert isinstance(reader, ViewReader)
    view = await reader.read_view("c")
    assert view == HistoryView((system_message("s"), *_tool_turn("2")), 7, False, head="2")
    assert view.messages == tuple(await reader.read("c"))
    # Windows nest: the length stays the whole conversation's.
    nested = await WindowReader(WindowReader(store, 10), 5).read_view("c")
    assert nested == view
    assert await reader.read_view("unknown") == HistoryView((), 0, False)
    await store.clear("c")
    assert await reader.read_view("c") == HistoryView((), 7, True)
    with pytest.raises(InvalidConversationIDError):
        await reader.read_view(" c")


async def test_read_view_over_a_plain_reader_counts_what_it_read() -> None:
    messages = [system_message("s"), *_simple_turn("1"), *_simple_turn("2")]
    plain = _ListReader(messages)
    view = await WindowReader(plain, 3).read_view("c")
    assert view == HistoryView((system_message("s"), *_simple_turn("2")), 5, False)
    assert plain.calls == ["c"]
    with pytest.raises(WindowTooSmallError):
        await WindowReader(plain, 2).read_view("c")


# -- the rule, against a brute-force model -----------------------------------------------


_kinds = st.lists(st.sampled_from(["system", "user", "assistant", "tool_pair"]), max_size=14)


def _build(kinds: list[str]) -> list[Message]:
    out: list[Message] = []
    for i, kind in enumerate(kinds):
        if kind == "system":
            out.append(system_message(f"s{i}"))
        elif kind == "user":
            out.append(user_message(f"u{i}"))
        elif kind == "assistant":
            out.append(assistant_message(f"a{i}"))
        else:
            out.append(assistant_message(tool_call_part(f"c{i}", "t")))
            out.append(tool_message(ToolResult(f"c{i}", "t")))
    return out


@given(_kinds, st.integers(1, 12))
def test_window_is_the_longest_fitting_suffix_of_whole_turns(kinds: list[str], limit: int) -> None:
    messages = _build(kinds)
    systems = [m for m in messages if m.role is Role.SYSTEM]
    rest = [m for m in messages if m.role is not Role.SYSTEM]
    starts = [i for i, m in enumerate(rest) if m.role is Role.USER]
    if rest and rest[0].role is not Role.USER:
        # Messages before the first user message start the first turn (DESIGN §6b).
        starts = [0, *starts[1:]]
    room = limit - (1 if systems else 0)
    # Every candidate: a suffix of rest starting at a user message.
    fitting = [rest[s:] for s in starts if len(rest) - s <= room]
    try:
        out = window(messages, limit, low_water=limit)
    except WindowTooSmallError:
        assert starts and not fitting
        return
    if len(rest) + (1 if systems else 0) <= limit:
        assert out[1 if systems else 0 :] == rest  # everything fits: the whole history
    assert len(out) <= limit
    body = out[1:] if systems else out
    if systems:
        assert out[0].role is Role.SYSTEM
        assert out[0].text == "".join(("\n\n" if i else "") + m.text for i, m in enumerate(systems))
    assert body == (max(fitting, key=len) if fitting else [])
    assert all(m.role is not Role.SYSTEM for m in body)
    # Every tool call in the window has its result, every result its call.
    calls = {c.id for m in body for c in m.tool_calls}
    results = {r.id for m in body for r in m.tool_results}
    assert calls == results
