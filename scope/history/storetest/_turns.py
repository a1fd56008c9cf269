"""The turn rules of DESIGN §6b: the ``expected_length`` fence and views."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import anyio.pytest_plugin
import pytest

from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
)
from scope.history._batch import Batch
from scope.history._ids import ConversationID
from scope.history._view import HistoryView
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import (
    Base,
    _texts,
    _turn,
    rich_messages,
)


@tests_on_anyio_runner
class TurnRules(Base):
    """The turn rules of DESIGN §6b: the ``expected_length`` fence and views."""

    # -- the expected_length fence (DESIGN §6b) ----------------------------------------

    async def test_fenced_append_lands_at_the_current_length(self, store: Any) -> None:
        first = Batch("c", "a1", _turn("one"), expected_length=0)
        assert await store.append(first) == first.receipt()
        second = Batch("c", "a2", _turn("two", 3), expected_length=2)
        assert await store.append(second) == second.receipt()
        # Unfenced appends move the length too.
        await store.append(Batch("c", "a3", _turn("three")))
        fourth = Batch("c", "a4", _turn("four"), expected_length=7)
        assert await store.append(fourth) == fourth.receipt()
        assert _texts(await store.read("c")) == _texts(
            _turn("one") + _turn("two", 3) + _turn("three") + _turn("four")
        )

    async def test_stale_expected_length_is_refused_and_appends_nothing(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("one")))
        await store.append(Batch("c", "a2", _turn("two")))
        for stale in (0, 2, 3):
            with pytest.raises(HistoryChangedError) as caught:
                await store.append(Batch("c", f"stale{stale}", _turn("late"), stale))
            assert (caught.value.expected, caught.value.actual) == (stale, 4)
        assert _texts(await store.read("c")) == _texts(_turn("one") + _turn("two"))
        # A refused batch leaves no dedupe record: the same id lands at the right length.
        retry = Batch("c", "stale0", _turn("late"), expected_length=4)
        assert await store.append(retry) == retry.receipt()

    async def test_future_expected_length_is_refused_and_appends_nothing(self, store: Any) -> None:
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("new", "a1", _turn("t"), expected_length=2))
        assert (caught.value.expected, caught.value.actual) == (2, 0)
        assert await store.read("new") == []
        assert await store.conversations() == []
        await store.append(Batch("c", "a1", _turn("t")))
        with pytest.raises(HistoryChangedError):
            await store.append(Batch("c", "a2", _turn("u"), expected_length=3))
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await store.conversations() == ["c"]

    async def test_retry_of_accepted_batch_with_stale_expected_length_returns_equal_receipt(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"), expected_length=0)
        first = await store.append(batch)
        await store.append(Batch("c", "a2", _turn("u"), expected_length=2))
        # The turn already landed: the dedupe record answers before the fence.
        assert await store.append(batch) == first
        assert await store.append(batch.fenced(None)) == first
        assert await store.append(batch.fenced(99)) == first
        assert _texts(await store.read("c")) == ["t/0", "t/1", "u/0", "u/1"]

    async def test_closed_and_conflict_win_over_the_fence(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        # Same id, other digest, wrong length: the conflict is reported, not the fence.
        with pytest.raises(AppendConflictError):
            await store.append(Batch("c", "a1", _turn("other"), expected_length=0))
        await store.clear("c")
        for expected in (0, 2, 5):
            with pytest.raises(ConversationClosedError):
                await store.append(Batch("c", "a2", _turn("x"), expected_length=expected))
            with pytest.raises(ConversationClosedError):
                await store.append(Batch("c", "a1", _turn("t"), expected_length=expected))
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("other"), expected_length=0))

    async def test_concurrent_fenced_appends_at_one_length_exactly_one_lands(
        self, store: Any
    ) -> None:
        n = self.concurrent_fenced_appends
        await store.append(Batch("c", "base", _turn("base")))
        landed: list[int] = []
        refused: list[HistoryChangedError] = []

        async def append(i: int) -> None:
            try:
                await store.append(Batch("c", f"a{i}", _turn(f"b{i}", 3), expected_length=2))
            except HistoryChangedError as exc:
                refused.append(exc)
            else:
                landed.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(append, i)
        assert len(landed) == 1, f"{len(landed)} fenced appends at one length landed"
        assert len(refused) == n - 1
        assert all((e.expected, e.actual) == (2, 5) for e in refused)
        winner = landed[0]
        assert _texts(await store.read("c")) == _texts(_turn("base") + _turn(f"b{winner}", 3))

    # -- views --------------------------------------------------

    async def test_views_agree_with_read(self, store: Any) -> None:
        assert await store.read_view("unknown") == HistoryView((), 0, False)
        messages = rich_messages()
        await store.append(Batch("c", "a1", messages))
        await store.append(Batch("c", "a2", _turn("t", 3)))
        await store.append(Batch("other", "a1", _turn("o")))
        view = await store.read_view("c")
        assert type(view) is HistoryView
        assert view.closed is False
        assert list(view.messages) == await store.read("c")
        assert view.length == len(messages) + 3
        assert view.head == "a2"
        assert await store.read_view(ConversationID("other")) == HistoryView(
            tuple(_turn("o")), 2, False, head="a1"
        )

    async def test_view_of_a_closed_conversation(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.clear("c")
        view = await store.read_view("c")
        assert view.closed is True and view.messages == ()
        assert view.length in (0, 3), "a closed conversation keeps its last length or 0"
        await store.clear("never-written")
        assert await store.read_view("never-written") == HistoryView((), 0, True)

    async def test_views_are_atomic_under_concurrent_appends(self, store: Any) -> None:
        sizes = [1 + i % 3 for i in range(16)]
        views: list[HistoryView] = []
        done = anyio.Event()

        async def append_all() -> None:
            for i, size in enumerate(sizes):
                await store.append(Batch("c", f"a{i}", _turn(f"b{i}", size)))
                await anyio.lowlevel.checkpoint()
            done.set()

        async def watch() -> None:
            while not done.is_set():
                views.append(await store.read_view("c"))
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            tg.start_soon(watch)
            tg.start_soon(append_all)
        views.append(await store.read_view("c"))
        for view in views:
            # One state: the length is the messages', and they are whole batches in order.
            assert view.length == len(view.messages), "a view mixed two states"
            expected: list[str] = []
            for i, size in enumerate(sizes):
                if len(expected) >= view.length:
                    break
                expected += _texts(_turn(f"b{i}", size))
            assert _texts(view.messages) == expected
        assert views[-1].length == sum(sizes)
