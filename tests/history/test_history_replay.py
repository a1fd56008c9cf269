"""The Middleware's replay fast path accepts exactly what the full request check accepts
(``scope.history._replay``), across histories that grow, change and shrink."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope.chat import (
    Message,
    Request,
    Role,
    ToolResult,
    assistant_message,
    system_message,
    tool_call_delta_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidRequestError, StoreError
from scope.history import ConversationID, HistoryCache, Middleware
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio

PREFIX = (system_message("sys"),)
TURN = (user_message("now"),)

# A small alphabet that reaches every rule of check_sequence: tool messages with and
# without a preceding call, answered twice, answering unknown calls; repeated call ids;
# streaming deltas; system messages in the middle; things that are not messages.
ATOMS: list[Any] = [
    user_message("u"),
    assistant_message("a"),
    assistant_message(tool_call_part("c1", "f")),
    assistant_message(tool_call_part("c1", "f"), tool_call_part("c2", "f")),
    assistant_message(tool_call_part("c1", "f"), tool_call_part("c1", "g")),
    assistant_message(tool_call_delta_part("c1", "f", "{")),
    tool_message(ToolResult("c1", "f")),
    tool_message(ToolResult("c2", "f")),
    tool_message(ToolResult("c1", "f"), ToolResult("c2", "f")),
    tool_message(ToolResult("c3", "f")),
    system_message("stored system"),
    "not a message",
]

histories = st.lists(st.sampled_from(range(len(ATOMS))), max_size=12)


def full_check(stored: list[Any]) -> tuple[Message, ...] | None:
    """What the Middleware sent before the fast path: the whole request, validated."""
    if not all(isinstance(m, Message) for m in stored):
        return None
    replay = tuple(m for m in stored if m.role is not Role.SYSTEM)
    try:
        Request((*PREFIX, *replay, *TURN))
    except InvalidRequestError:
        return None
    return replay


def fast_check(replays: HistoryCache, stored: list[Any]) -> tuple[Message, ...] | None:
    try:
        return replays.replay(ConversationID("c"), stored)
    except StoreError:
        return None


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["grow", "new", "cut"]), histories), max_size=6))
def test_fast_path_accepts_exactly_what_the_full_check_accepts(
    steps: list[tuple[str, list[int]]],
) -> None:
    replays = HistoryCache()
    stored: list[Any] = []
    for how, picks in steps:
        # Fresh objects for every pick (equal values, other identities) except where the
        # history grows: then the old objects stay and new ones follow, as a store with a
        # warm decoded cache hands them out.
        atoms = [_copy(ATOMS[i]) for i in picks]
        if how == "grow":
            stored = [*stored, *atoms]
        elif how == "new":
            stored = atoms
        else:
            stored = stored[: len(picks) % (len(stored) + 1)]
        assert fast_check(replays, stored) == full_check(stored), stored


def _copy(atom: Any) -> Any:
    if isinstance(atom, Message):
        return Message(atom.role, atom.parts, atom.metadata)
    return atom


def test_a_grown_history_is_checked_from_its_last_reset_point() -> None:
    replays = HistoryCache()
    cid = ConversationID("c")
    call = assistant_message(tool_call_part("c1", "f"), tool_call_part("c2", "f"))
    first = [user_message("q"), call, tool_message(ToolResult("c1", "f"))]
    assert replays.replay(cid, first) == tuple(first)
    # The next stored message answers c1 again: invalid only together with the old part.
    with pytest.raises(StoreError, match="answered more than once"):
        replays.replay(cid, [*first, tool_message(ToolResult("c1", "f"))])
    assert replays.replay(cid, [*first, tool_message(ToolResult("c2", "f"))])[-1].role is Role.TOOL


async def test_the_middleware_replays_with_the_fast_path() -> None:
    store = InMemoryStore()
    sent: list[Request] = []

    class Echo:
        async def call(self, request: Request) -> Any:
            from scope.chat import FinishReason, Output, Response

            sent.append(request)
            return Response(Output(assistant_message("ok"), FinishReason.STOP))

    for i in range(5):
        await (
            Middleware(store, store, "fast")
            .call(Echo())
            .call(Request([system_message("s"), user_message(f"q{i}")]))
        )
    # Each downstream request equals the fully validated request of the same messages.
    for request in sent:
        assert request == Request(request.messages, request.tools, request.options)
    assert [m.text for m in sent[-1].messages] == [
        "s",
        "q0",
        "ok",
        "q1",
        "ok",
        "q2",
        "ok",
        "q3",
        "ok",
        "q4",
    ]


@pytest.mark.parametrize(
    ("cache_bytes", "checked"), [(None, [0, 2, 3, 3, 3]), (0, [0, 2, 4, 6, 8])]
)
async def test_the_store_handles_cache_keeps_the_checked_replay(
    monkeypatch: pytest.MonkeyPatch, cache_bytes: int | None, checked: list[int]
) -> None:
    from scope.history import _replay

    lengths: list[int] = []
    real = _replay.check_sequence

    def counting(piece: Any, error: Any) -> None:
        lengths.append(len(piece))
        real(piece, error)

    monkeypatch.setattr(_replay, "check_sequence", counting)
    store = InMemoryStore() if cache_bytes is None else InMemoryStore(cache_bytes=cache_bytes)

    class Echo:
        async def call(self, request: Request) -> Any:
            from scope.chat import FinishReason, Output, Response

            return Response(Output(assistant_message("ok"), FinishReason.STOP))

    for i in range(5):
        await Middleware(store, store, "kept").call(Echo()).call(Request([user_message(f"q{i}")]))
    # Warm, each turn checks only from the last reset point of the kept replay.
    assert lengths == checked
    assert store.history_cache.size[0] == (0 if cache_bytes == 0 else 1)
