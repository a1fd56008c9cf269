"""The in-memory store: the conformance suite (asyncio and trio) plus its own guarantees."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from scope.chat import assistant_message, user_message
from scope.errors import HistoryChangedError
from scope.history import Batch, ConversationID, Lister, Store
from scope.history.inmemory import InMemoryStore as InMemoryStore
from scope.history.storetest import StoreConformance


class TestInMemoryStore(StoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[InMemoryStore]:
        yield InMemoryStore()

    async def open_store(self, *, retention: dt.timedelta | None = None) -> InMemoryStore:
        return InMemoryStore(retention=retention)


class _Handle:
    """A second handle on one in-memory store's data: what ``reopen`` means for a store
    whose data lives as long as the object."""

    def __init__(self, store: InMemoryStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        # Every Store method, the lease steps included, on the shared data.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._store, name)


class TestInMemoryStoreThroughSecondHandle(StoreConformance):
    """Runs the durability checks too: the 'reopened' handle shares the data."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[InMemoryStore]:
        yield InMemoryStore()

    async def reopen(self, store: Any) -> Any:
        return _Handle(store)

    async def open_store(self, *, retention: dt.timedelta | None = None) -> InMemoryStore:
        return InMemoryStore(retention=retention)


def test_store_is_a_store_and_lister() -> None:
    store = InMemoryStore()
    assert isinstance(store, Store)
    assert isinstance(store, Lister)
    assert type(store).__module__ == "scope.history.inmemory"


def test_store_is_safe_across_threads() -> None:
    # Each thread runs its own event loop (asyncio and trio alternately) on one store.
    store = InMemoryStore()
    shared = Batch("shared", "retry", [user_message("once"), assistant_message("ok")])
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        async def main() -> None:
            for j in range(20):
                messages = [user_message(f"{n}.{j}/0"), assistant_message(f"{n}.{j}/1")]
                await store.append(Batch("c", f"{n}.{j}", messages))
                assert await store.append(shared) == shared.receipt()

        try:
            anyio.run(main, backend="trio" if n % 2 else "asyncio")
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    async def check() -> None:
        texts = [m.text for m in await store.read("c")]
        assert len(texts) == 8 * 20 * 2
        for n in range(8):
            for j in range(20):
                start = texts.index(f"{n}.{j}/0")
                assert texts[start + 1] == f"{n}.{j}/1"
        assert [m.text for m in await store.read("shared")] == ["once", "ok"]

    anyio.run(check)


@pytest.mark.anyio
async def test_read_shares_the_immutable_messages() -> None:
    store = InMemoryStore()
    message = user_message("hi")
    await store.append(Batch("c", "a1", [message]))
    assert (await store.read("c"))[0] is message


@pytest.mark.anyio
async def test_clear_drops_messages_and_dedupe_records_but_keeps_closure() -> None:
    store = InMemoryStore()
    await store.append(Batch("c", "a1", [user_message("hi")]))
    await store.append(Batch("c", "a2", [user_message("again")]))
    await store.move_head("c", "a1", expected_head="a2")  # a second branch
    await store.append(Batch("c", "a3", [user_message("other")]))
    await store.clear("c")
    assert store._trees == {}  # every branch, its dedupe and move records
    assert store._closed == {ConversationID("c")}
    assert store._lengths == {ConversationID("c"): 2}


def test_repr_does_not_dump_the_contents() -> None:
    assert repr(InMemoryStore()) == "InMemoryStore()"


def test_the_old_name_still_works_for_one_release_and_warns() -> None:
    import scope.history.inmemory as module

    with pytest.warns(DeprecationWarning, match="use InMemoryStore"):
        old = module.Store
    assert old is InMemoryStore
    with pytest.raises(AttributeError, match="no attribute 'Stores'"):
        module.Stores  # noqa: B018


def test_branching_is_safe_across_threads() -> None:
    # Threads (asyncio and trio alternately) append and rewind one conversation, each
    # step fenced by the view it read: the tree stays one tree and the views agree.
    store = InMemoryStore()
    errors: list[BaseException] = []
    landed: list[str] = []

    def worker(n: int) -> None:
        async def main() -> None:
            for j in range(30):
                view = await store.read_view("c")
                try:
                    if j % 3 == 2 and view.length:
                        await store.move_head("c", "", expected_head=view.head)
                    else:
                        batch = Batch(
                            "c", f"{n}.{j}", [user_message(f"{n}.{j}")], view.length, view.head
                        )
                        await store.append(batch)
                        landed.append(f"{n}.{j}")
                except HistoryChangedError:
                    pass

        try:
            anyio.run(main, backend="trio" if n % 2 else "asyncio")
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    async def check() -> None:
        tree = await store.read_tree("c")
        assert sorted(str(b.id) for b in tree.batches) == sorted(landed)
        view = await store.read_view("c")
        path = tree.head_path()
        assert list(view.messages) == [m for b in path for m in b.messages]
        assert view.length == len(path) and view.head == (str(path[-1].id) if path else "")

    anyio.run(check)
