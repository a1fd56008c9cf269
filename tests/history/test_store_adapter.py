"""``StoreAdapter``: the whole ``Store`` protocol over a simple store (DESIGN §6j)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    assistant_message,
    user_message,
)
from scope.errors import (
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidConversationIDError,
    StoreError,
    TurnInProgressError,
    UnknownHeadError,
)
from scope.history import (
    Batch,
    HistoryTree,
    HistoryView,
    Middleware,
    Receipt,
    Reject,
    Store,
    StoreAdapter,
    Unfenced,
    rewind,
)
from scope.history.inmemory import InMemoryStore
from scope.history.storetest import StoreConformance

pytestmark = pytest.mark.anyio


class Simple:
    """A third-party store with only read, append and clear."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()
        self.reads = 0

    async def read(self, conversation_id: str) -> list[Message]:
        self.reads += 1
        return await self.inner.read(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        return await self.inner.append(batch)

    async def clear(self, conversation_id: str) -> None:
        await self.inner.clear(conversation_id)


TURN = (user_message("q"), assistant_message("a"))


def test_a_simple_store_is_not_a_store_until_adapted() -> None:
    simple = Simple()
    assert not isinstance(simple, Store)
    adapted = StoreAdapter(simple)
    assert isinstance(adapted, Store)
    assert (adapted.atomic_views, adapted.folds) == (False, False)
    assert "StoreAdapter(" in repr(adapted)


def test_the_adapter_refuses_an_object_with_neither_read_nor_append() -> None:
    with pytest.raises(TypeError, match="object has neither read nor append"):
        StoreAdapter(object())


async def test_the_derived_view_counts_what_read_returns_and_is_never_closed() -> None:
    adapted = StoreAdapter(Simple())
    assert await adapted.read_view("c") == HistoryView((), 0)
    await adapted.append(Batch("c", "a1", TURN))
    assert await adapted.read_view("c") == HistoryView(TURN, 2)
    await adapted.clear("c")
    assert await adapted.read_view("c") == HistoryView((), 0, False)
    assert await adapted.read("c") == []


async def test_a_derived_view_of_a_store_that_returns_junk_is_a_store_error() -> None:
    class Junk(Simple):
        async def read(self, conversation_id: str) -> list[Any]:
            return [user_message("ok"), "not a message"]

    with pytest.raises(StoreError, match=r"Junk\.read of conversation 'c'.*messages\[1\]"):
        await StoreAdapter(Junk()).read_view("c")


async def test_what_cannot_be_derived_raises_type_error_naming_it() -> None:
    adapted = StoreAdapter(Simple())
    with pytest.raises(TypeError, match="Simple has no read_batches"):
        await adapted.read_batches("c")
    with pytest.raises(TypeError, match="Simple has no conversations"):
        await adapted.conversations()
    with pytest.raises(TypeError, match="Simple has no read_meta"):
        await adapted.read_meta("c")

    class ReadOnly:
        async def read(self, conversation_id: str) -> list[Message]:
            return []

    with pytest.raises(TypeError, match="ReadOnly has no append"):
        await StoreAdapter(ReadOnly()).append(Batch("c", "a1", TURN))


async def test_read_meta_is_the_wrapped_stores_own() -> None:
    inner = InMemoryStore()
    await inner.append(Batch("c", "a1", TURN), owner="alice")
    assert (await StoreAdapter(inner).read_meta("c")).owner == "alice"


async def test_a_restored_stored_time_reaches_a_store_that_takes_it() -> None:
    inner = InMemoryStore()
    await StoreAdapter(inner).append(Batch("c", "a1", TURN), created=1_500_000_000.5)
    assert (await inner.read_tree("c")).created == (1_500_000_000.5,)


async def test_a_restored_stored_time_through_a_store_without_it_is_a_type_error() -> None:
    simple = Simple()
    adapted = StoreAdapter(simple)
    with pytest.raises(TypeError, match=r"Simple\.append takes no created"):
        await adapted.append(Batch("c", "a1", TURN), created=1_500_000_000.5)
    with pytest.raises(ValueError, match="created must be Unix seconds"):
        await adapted.append(Batch("c", "a1", TURN), created=-1.0)
    assert await simple.inner.read("c") == []
    await adapted.append(Batch("c", "a1", TURN), created=None)  # None: the store's clock
    assert await simple.inner.read("c") == list(TURN)


async def test_the_stores_own_methods_are_used_as_they_are() -> None:
    store = InMemoryStore()
    adapted = StoreAdapter(store)
    assert (adapted.atomic_views, adapted.folds) == (True, True)
    await store.append(Batch("c", "a1", TURN))
    await store.clear("gone")
    assert await adapted.read_view("gone") == HistoryView((), 0, True)
    assert await adapted.read_batches("c") == [Batch("c", "a1", TURN)]
    assert await adapted.conversations() == ["c"]
    assert await adapted.acquire_turn("c", "h1", 30) is True
    assert await store.acquire_turn("c", "h2", 30) is False  # the store's own lease


async def test_leases_kept_in_the_adapter_exclude_each_other_by_holder_token() -> None:
    adapted = StoreAdapter(Simple())
    assert await adapted.acquire_turn("c", "h1", 30) is True
    assert await adapted.acquire_turn("c", "h2", 30) is False
    assert await adapted.acquire_turn_view("c", "h2", 30) is None  # nothing read
    assert await adapted.release_turn("c", "h2") is False
    assert await adapted.release_turn("c", "h1") is True
    assert await adapted.release_turn("c", "h1") is False
    view = await adapted.acquire_turn_view("c", "h2", 30)
    assert view == HistoryView((), 0)
    batch = Batch("c", "a1", TURN, expected_length=0)
    assert await adapted.append_release_turn(batch, "h2") == batch.receipt()
    assert await adapted.acquire_turn("c", "h3", 30) is True  # released with the append


class OwnFold(Simple):
    """A third-party store that records owners on append and folds the commit with the
    lease release itself, but whose fold takes no owner."""

    async def append(self, batch: Batch, *, owner: str | None = None) -> Receipt:
        return await self.inner.append(batch, owner=owner)

    async def acquire_turn(self, conversation_id: str, holder: str, ttl: float) -> bool:
        return await self.inner.acquire_turn(conversation_id, holder, ttl)

    async def release_turn(self, conversation_id: str, holder: str) -> bool:
        return await self.inner.release_turn(conversation_id, holder)

    async def append_release_turn(self, batch: Batch, holder: str) -> Receipt:
        return await self.inner.append_release_turn(batch, holder)


async def test_the_stores_own_fold_gets_the_owner_only_when_it_takes_one() -> None:
    # The store's own append_release_turn is used as it is: with the owner when it takes
    # one; without one when none is given; a TypeError, before anything is written,
    # when an owner is given and it takes none.
    store = InMemoryStore()
    assert await store.acquire_turn("c", "h", 30)
    batch = Batch("c", "a1", TURN)
    assert await StoreAdapter(store).append_release_turn(batch, "h", owner="alice") == (
        batch.receipt()
    )
    assert (await store.read_meta("c")).owner == "alice"
    assert await store.acquire_turn("c", "h2", 30)  # released with the append

    own = OwnFold()
    adapted = StoreAdapter(own)
    assert await own.acquire_turn("d", "h", 30)
    with pytest.raises(
        TypeError, match=r"^OwnFold\.append_release_turn takes no owner: the adapter cannot"
    ):
        await adapted.append_release_turn(Batch("d", "a1", TURN), "h", owner="alice")
    assert await own.inner.read("d") == []  # nothing written, the lease still held
    assert not await own.acquire_turn("d", "other", 30)
    assert await adapted.append_release_turn(Batch("d", "a1", TURN), "h") == (
        Batch("d", "a1", TURN).receipt()
    )
    assert await own.acquire_turn("d", "other", 30)


async def test_adapter_leases_expire_by_themselves() -> None:
    adapted = StoreAdapter(Simple())
    assert await adapted.acquire_turn("c", "h1", 0.05) is True
    await anyio.sleep(0.1)
    assert await adapted.acquire_turn("c", "h2", 30) is True


@pytest.mark.parametrize(("holder", "ttl"), [("", 30), (None, 30), ("h", 0), ("h", float("nan"))])
async def test_adapter_lease_arguments_are_checked(holder: Any, ttl: Any) -> None:
    adapted = StoreAdapter(Simple())
    with pytest.raises(ValueError):
        await adapted.acquire_turn("c", holder, ttl)
    with pytest.raises(ValueError):
        await adapted.acquire_turn_view("c", holder, ttl)
    if ttl == 30:
        with pytest.raises(ValueError):
            await adapted.append_release_turn(Batch("c", "a1", TURN), holder)
        assert await adapted.read("c") == []  # refused before the append


class Answer:
    def __init__(self) -> None:
        self.started = anyio.Event()
        self.go = anyio.Event()

    async def call(self, request: Request) -> Response:
        self.started.set()
        await self.go.wait()
        return Response(Output(assistant_message("ok"), FinishReason.STOP))


async def test_a_middleware_over_an_adapted_simple_store_rejects_an_overlapping_turn() -> None:
    adapted = StoreAdapter(Simple())
    model = Answer()
    mw = Middleware(adapted, adapted, "c", layers=(Reject(),))
    refused: list[TurnInProgressError] = []

    async def second() -> None:
        await model.started.wait()
        try:
            await mw.call(Answer()).call(Request([user_message("second")]))
        except TurnInProgressError as exc:
            refused.append(exc)
        model.go.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(second)
            await mw.call(model).call(Request([user_message("first")]))
    assert len(refused) == 1
    assert [m.text for m in await adapted.read("c")] == ["first", "ok"]
    assert await adapted.acquire_turn("c", "someone", 30) is True  # given back


async def test_a_middleware_over_a_simple_reader_does_not_fence() -> None:
    # DESIGN §6b: a plain Reader, no fence: the derived view is not one atomic read.
    simple = Simple()
    mw = Middleware(simple, simple, "c", layers=(Unfenced(),))  # type: ignore[arg-type]
    first, second = Answer(), Answer()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(mw.call(first).call, Request([user_message("one")]))
            await first.started.wait()
            group.start_soon(mw.call(second).call, Request([user_message("two")]))
            await second.started.wait()
            first.go.set()
            second.go.set()
    assert sorted(m.text for m in await simple.read("c")) == ["ok", "ok", "one", "two"]


class Linear(Simple):
    """A simple store that also reads its batches: one linear history, no branches."""

    async def read_batches(self, conversation_id: str) -> list[Batch]:
        return await self.inner.read_batches(conversation_id)


async def test_a_linear_store_is_one_path_whose_head_is_its_last_batch() -> None:
    adapted = StoreAdapter(Linear())
    assert await adapted.read_tree("c") == HistoryTree((), (), ())
    assert await adapted.read_view("c") == HistoryView((), 0, head="")
    first, second = Batch("c", "a1", TURN), Batch("c", "a2", TURN[:1])
    await adapted.append(first)
    await adapted.append(second)
    assert await adapted.read_tree("c") == HistoryTree((first, second), (-1, 0), (None, None), 1)
    assert await adapted.read_view("c") == HistoryView((*TURN, TURN[0]), 3, head="a2")
    # Without read_batches the derived view cannot name the head.
    plain = StoreAdapter(Simple())
    await plain.append(first)
    assert await plain.read_view("c") == HistoryView(TURN, 2, head="")
    with pytest.raises(TypeError, match="Simple has no read_batches"):
        await plain.read_tree("c")
    with pytest.raises(TypeError, match="Simple has no read_batches"):
        await plain.move_head("c", "", expected_head="")


async def test_a_linear_store_moves_its_head_only_where_it_is() -> None:
    linear = Linear()
    adapted = StoreAdapter(linear)
    assert await adapted.move_head("c", "", expected_head="") == 0  # empty: a no-op
    await adapted.append(Batch("c", "a1", TURN))
    await adapted.append(Batch("c", "a2", TURN))
    assert await adapted.move_head("c", "a2", expected_head="a2", move_id="m1") == 4
    assert await adapted.move_head("c", "a2", expected_head="a2", move_id="m1") == 4
    with pytest.raises(HistoryChangedError) as caught:
        await adapted.move_head("c", "a1", expected_head="a1")
    assert (caught.value.expected, caught.value.actual) == (4, 4)
    assert (caught.value.expected_head, caught.value.actual_head) == ("a1", "a2")
    with pytest.raises(UnknownHeadError, match="holds no batch 'nope'"):
        await adapted.move_head("c", "nope", expected_head="a2")
    for target in ("a1", ""):
        with pytest.raises(StoreError, match="keeps one linear history"):
            await adapted.move_head("c", target, expected_head="a2")
    with pytest.raises(HistoryChangedError):  # rewind fences like a move
        await rewind(adapted, "c", to=1, expected_head="a1")
    with pytest.raises(StoreError, match="keeps one linear history"):
        await rewind(adapted, "c", to=1)
    assert [b.id for b in await linear.read_batches("c")] == ["a1", "a2"]  # nothing moved


@pytest.mark.parametrize("bad", [42, None, " padded", "nl\nid"])
async def test_a_linear_stores_move_head_checks_its_arguments(bad: Any) -> None:
    adapted = StoreAdapter(Linear())
    with pytest.raises(InvalidAppendIDError):
        await adapted.move_head("c", bad, expected_head="")
    with pytest.raises(InvalidAppendIDError):
        await adapted.move_head("c", "", expected_head=bad)
    if bad is not None:
        with pytest.raises(InvalidAppendIDError):
            await adapted.move_head("c", "", expected_head="", move_id=bad)
    with pytest.raises(InvalidConversationIDError):
        await adapted.move_head(" c", "", expected_head="")


async def test_a_linear_store_whose_batches_are_junk_is_a_store_error() -> None:
    class Junk(Linear):
        async def read_batches(self, conversation_id: str) -> list[Any]:
            return [Batch("other", "a1", TURN)]

    adapted = StoreAdapter(Junk())
    for call in (adapted.read_view("c"), adapted.read_tree("c")):
        with pytest.raises(StoreError, match=r"not its batches at \[0\]"):
            await call


class _NoLeases:
    """Every Store method of an in-memory store but the lease steps: the adapter supplies
    them (its own lease table) and passes the rest, branches included, through."""

    def __init__(self) -> None:
        self._store = InMemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "turn" in name:
            raise AttributeError(name)
        return getattr(self._store, name)


class TestAdapterConformance(StoreConformance):
    @pytest.fixture
    async def store(self) -> Any:
        adapted = StoreAdapter(_NoLeases())
        assert (adapted.atomic_views, adapted.folds) == (True, False)
        yield adapted
