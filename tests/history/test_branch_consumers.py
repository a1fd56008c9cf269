"""What scope.history builds on a store sees the head path only and fences by the head
(DESIGN §6h): the Middleware's commit and replay, kept interrupted turns, compact, and
WindowReader with the projections it remembers. A branched in-memory conversation,
under asyncio and trio."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from scope.chat import (
    Message,
    Output,
    Request,
    Response,
    Role,
    StreamerFunc,
    ToolOutput,
    ToolResult,
    assistant_message,
    collect,
    tool_message,
    user_message,
)
from scope.errors import CommitError, HistoryChangedError, ProviderServerError, StoreError
from scope.history import (
    COMPACTION_KEY,
    Batch,
    HistoryView,
    KeepInterrupted,
    Middleware,
    WindowReader,
    branches,
    compact,
    rewind,
    switch,
)
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel

pytestmark = pytest.mark.anyio


def _turn(tag: str) -> list[Message]:
    return [user_message(f"{tag}?"), assistant_message(f"{tag}!")]


def _texts(messages: Any) -> list[str]:
    return [m.text for m in messages]


async def _fill(store: InMemoryStore, *tags: str, cid: str = "c") -> None:
    for tag in tags:
        await store.append(Batch(cid, tag, _turn(tag)))


@pytest.mark.parametrize("windowed", [False, True], ids=["store", "window"])
async def test_middleware_replays_only_the_head_path(windowed: bool) -> None:
    store = InMemoryStore()
    await _fill(store, "t1", "t2", "t3")
    await rewind(store, "c", to=1)
    seen: list[list[str]] = []

    def answer(request: Request) -> str:
        seen.append(_texts(request.messages))
        return "edited!"

    reader: Any = WindowReader(store, 100) if windowed else store
    mw = Middleware(reader, store, "c")
    await mw.call(FunctionModel(answer)).call(Request([user_message("e2?")]))
    assert seen == [["t1?", "t1!", "e2?"]]
    assert _texts(await store.read("c")) == ["t1?", "t1!", "e2?", "edited!"]
    assert [b.turns for b in await branches(store, "c")] == [3, 2]


@pytest.mark.parametrize("windowed", [False, True], ids=["store", "window"])
async def test_middleware_commit_is_refused_on_a_branch_of_equal_length(windowed: bool) -> None:
    # While the model answers, the head moves to another branch of the same length (a
    # rewind, then another turn): the length fence alone would let the answer land on
    # a history it was not generated from.
    store = InMemoryStore()
    await _fill(store, "t1", "t2")

    async def answer(request: Request) -> str:
        await rewind(store, "c", to=1)
        await store.append(Batch("c", "other", _turn("other")))
        return "late!"

    reader: Any = WindowReader(store, 100) if windowed else store
    mw = Middleware(reader, store, "c")
    with pytest.raises(CommitError) as caught:
        await mw.call(FunctionModel(answer)).call(Request([user_message("q?")]))
    cause = caught.value.__cause__
    assert isinstance(cause, HistoryChangedError)
    assert (cause.expected, cause.actual) == (4, 4)
    assert (cause.expected_head, cause.actual_head) == ("t2", "other")
    assert _texts(await store.read("c")) == ["t1?", "t1!", "other?", "other!"]
    assert len((await store.read_tree("c")).batches) == 3  # the late answer: nowhere


async def test_a_kept_interrupted_turn_is_fenced_by_the_head(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryStore()
    await _fill(store, "t1", "t2")
    mw = Middleware(store, store, "c", layers=(KeepInterrupted(),))
    error = ProviderServerError("dropped")

    async def generate(request: Request) -> AsyncGenerator[Response, None]:
        yield Response(Output(assistant_message("partial")))
        await rewind(store, "c", to=1)
        await store.append(Batch("c", "other", _turn("other")))
        raise error

    with (
        caplog.at_level(logging.WARNING, logger="scope.history"),
        pytest.raises(ProviderServerError),
    ):
        await collect(mw.stream(StreamerFunc(generate)).stream(Request([user_message("q?")])))
    assert _texts(await store.read("c")) == ["t1?", "t1!", "other?", "other!"]
    assert len((await store.read_tree("c")).batches) == 3
    assert "HistoryChangedError" in caplog.text


class Summarizer:
    def __init__(self, during: Any = None) -> None:
        self.requests: list[Request] = []
        self.during = during

    async def call(self, request: Request) -> Response:
        self.requests.append(request)
        if self.during is not None:
            await self.during(len(self.requests))
        return Response(Output(assistant_message(f"SUMMARY {len(self.requests)}")))


def _summaries(messages: list[Message]) -> list[str]:
    return [m.text for m in messages if m.role is Role.SYSTEM and COMPACTION_KEY in m.metadata]


async def test_compact_summarises_the_head_path_and_lands_on_it() -> None:
    store = InMemoryStore()
    await _fill(store, "t1", "t2", "t3", "t4")
    await rewind(store, "c", to=1)
    await _fill(store, "e2", "e3", "e4")
    summarizer = Summarizer()
    receipt = await compact(store, "c", summarizer, keep_turns=1)
    assert receipt is not None
    transcript = summarizer.requests[0].messages[-1].text
    assert "e2?" in transcript and "t2?" not in transcript
    tree = await store.read_tree("c")
    assert tree.batches[tree.head].receipt() == receipt
    assert str(tree.batches[tree.parents[tree.head]].id) == "e4"
    # The other branch compacts at the same boundary: a batch of its own, not a retry.
    await switch(store, "c", "t4")
    assert _texts(await store.read("c")) == _texts(
        [*_turn("t1"), *_turn("t2"), *_turn("t3"), *_turn("t4")]
    )
    other = await compact(store, "c", Summarizer(), keep_turns=1)
    assert other is not None and other.id != receipt.id
    assert _summaries(await store.read("c")) == ["SUMMARY 1"]
    tree = await store.read_tree("c")
    assert str(tree.batches[tree.parents[tree.head]].id) == "t4"


async def test_compact_raced_by_a_branch_of_equal_length_tries_again() -> None:
    store = InMemoryStore()
    await _fill(store, "t1", "t2", "t3")

    async def race(n: int) -> None:
        if n == 1:  # the head moves to a branch of the same length
            await rewind(store, "c", to=2)
            await store.append(Batch("c", "x3", _turn("x3")))

    summarizer = Summarizer(during=race)
    receipt = await compact(store, "c", summarizer, keep_turns=1)
    assert receipt is not None
    assert len(summarizer.requests) == 2
    stored = await store.read("c")
    assert _texts(stored[:6]) == _texts([*_turn("t1"), *_turn("t2"), *_turn("x3")])
    assert _summaries(stored) == ["SUMMARY 2"]


@pytest.mark.parametrize(
    "kwargs",
    [{"limit": 4}, {"max_tokens": 10_000}, {"max_tokens": 10_000, "low_water": 5_000}],
    ids=["limit", "tokens", "stable"],
)
async def test_window_projection_never_serves_another_branch_of_equal_length(
    kwargs: dict[str, Any],
) -> None:
    store = InMemoryStore()
    await _fill(store, "t1", "t2", "t3")
    limit = kwargs.pop("limit", None)
    reader = WindowReader(store, limit, **kwargs)
    before = await reader.read_view("c")
    assert _texts(before.messages)[-2:] == ["t3?", "t3!"]
    assert before.head == "t3"
    await rewind(store, "c", to=2)
    await store.append(Batch("c", "x3", _turn("x3")))  # the same length, another head
    for window in (
        await reader.read_view("c"),
        await WindowReader(store, limit, **kwargs).read_view("c"),  # shares the cache
    ):
        assert _texts(window.messages)[-2:] == ["x3?", "x3!"]
        assert (window.length, window.head) == (6, "x3")
    assert _texts(await reader.read("c"))[-2:] == ["x3?", "x3!"]
    # And back: the old branch's window again, from its own messages.
    await switch(store, "c", "t3")
    window = await reader.read_view("c")
    assert _texts(window.messages)[-2:] == ["t3?", "t3!"]
    assert (window.length, window.head) == (6, "t3")


async def test_window_view_of_a_rewound_conversation_is_empty_with_no_head() -> None:
    store = InMemoryStore()
    await _fill(store, "t1")
    await rewind(store, "c", to=0)
    assert await WindowReader(store, 4).read_view("c") == HistoryView((), 0, head="")


async def test_the_checked_replay_of_another_branch_of_equal_length_is_not_reused() -> None:
    # The replay the Middleware checked for t1 t2 must not vouch for t1 + a broken
    # branch of the same length: that branch is checked, and refused.
    store = InMemoryStore()
    await _fill(store, "t1", "t2")
    mw = Middleware(store, store, "c")
    await mw.call(FunctionModel(lambda request: "ok")).call(Request([user_message("q?")]))
    await rewind(store, "c", to=1)
    orphan = tool_message(ToolResult("nope", "lookup", ToolOutput.of_text("x")))
    await store.append(Batch("c", "bad", [user_message("b?"), orphan]))
    await store.append(Batch("c", "b2", [user_message("c?"), assistant_message("c!")]))
    assert (await store.read_view("c")).length == 6  # as long as the checked history
    with pytest.raises(StoreError, match="cannot be replayed"):
        await mw.call(FunctionModel(lambda request: "never")).call(Request([user_message("q2?")]))


def test_a_view_without_a_head_fences_by_length_only() -> None:
    # A non-empty path has a head batch: "" there means the reader does not track heads.
    assert HistoryView(tuple(_turn("a")), 2).fence_head is None
    assert HistoryView(tuple(_turn("a")), 2, head="a").fence_head == "a"
    assert HistoryView((), 0).fence_head == ""  # the empty path: exact either way
    assert HistoryView((), 2, head="a").fence_head == "a"  # a window over the head path


class _Messages:
    """A plain ``Reader`` of a store's messages (no views, no batches: no heads)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store

    async def read(self, conversation_id: str) -> list[Message]:
        return await self.store.read(conversation_id)


async def test_a_reader_that_tracks_no_heads_commits_fenced_by_length() -> None:
    # A window over a plain Reader: its views say head "" on a non-empty history, so
    # the commit is fenced by the length alone, and lands (fenced by that "", every
    # commit on a non-empty history was refused).
    store = InMemoryStore()
    await _fill(store, "t1", "t2")
    mw = Middleware(WindowReader(_Messages(store), 100), store, "c")
    for n in range(3):
        await mw.call(FunctionModel(lambda _: "ok")).call(Request([user_message(f"q{n}?")]))
    assert len(await store.read("c")) == 4 + 3 * 2

    async def answer(request: Request) -> str:
        await store.append(Batch("c", "other", _turn("other")))
        return "late!"

    with pytest.raises(CommitError) as caught:  # the length fence still holds
        await mw.call(FunctionModel(answer)).call(Request([user_message("q?")]))
    cause = caught.value.__cause__
    assert isinstance(cause, HistoryChangedError)
    assert (cause.expected, cause.actual, cause.expected_head) == (10, 12, None)
