"""Where WindowReader remembers projections: the reader's store handle's HistoryCache, or
a cache the WindowReader owns; never a process-wide one (asyncio and trio)."""

from __future__ import annotations

import gc
import importlib
import pkgutil
import weakref
from pathlib import Path

import pytest

import scope
from scope.chat import Message, assistant_message, system_message, user_message
from scope.history import (
    Batch,
    ConversationID,
    DefaultTokenCounter,
    HistoryCache,
    StoreAdapter,
    WindowReader,
)
from scope.history._turns import PER_MESSAGE_BYTES, PER_TURN_BYTES, Projection, _key, project
from scope.history._window import WINDOW_CACHE_BYTES, window
from scope.history.inmemory import InMemoryStore
from scope.historystores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


def _turns(tag: str, count: int, size: int = 10) -> list[Message]:
    out: list[Message] = []
    for i in range(count):
        out += [user_message(f"{tag} q{i} " + "q" * size), assistant_message(f"{tag} a{i}")]
    return out


class _Conversations:
    """A third-party Reader (no ``history_cache``) over a dict of conversations."""

    def __init__(self) -> None:
        self.held: dict[str, list[Message]] = {}

    async def read(self, conversation_id: str) -> list[Message]:
        return list(self.held.get(conversation_id, []))


def _projection(cache: HistoryCache, cid: str) -> Projection | None:
    found = cache._get(_key(cid))
    assert found is None or type(found) is Projection
    return found


async def test_two_stores_with_the_same_conversation_id_never_share_a_projection() -> None:
    one, two = InMemoryStore(), InMemoryStore()
    await one.append(Batch("same", "a", _turns("one", 6)))
    await two.append(Batch("same", "b", [system_message("two's"), *_turns("two", 3)]))
    assert await WindowReader(one, 4).read("same") == window(await one.read("same"), 4)
    got = await WindowReader(two, 4).read("same")
    assert got == window(await two.read("same"), 4)
    assert got[0].text == "two's" and got[-1].text == "two a2"
    # Each handle's projection is in its own cache, of its own messages.
    first, second = _projection(one.history_cache, "same"), _projection(two.history_cache, "same")
    assert first is not None and second is not None and first is not second
    assert second.stored == tuple(await two.read("same"))


async def test_two_third_party_readers_never_share_a_projection() -> None:
    one, two = _Conversations(), _Conversations()
    one.held["same"] = _turns("one", 6)
    two.held["same"] = _turns("two", 6)
    assert await WindowReader(one, 4).read("same") == one.held["same"][-4:]
    assert await WindowReader(two, 4).read("same") == two.held["same"][-4:]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_clear_drops_the_projection_from_the_cache(kind: str, tmp_path: Path) -> None:
    store = InMemoryStore() if kind == "memory" else await SQLiteStore.open(tmp_path / "window.db")
    try:
        await store.append(Batch("gone", "t", _turns("gone", 5)))
        await store.append(Batch("kept", "t", _turns("kept", 5)))
        await store.read("gone")
        await store.read("kept")
        cache = store.history_cache
        _, before = cache.size
        reader = WindowReader(store, max_tokens=10_000)
        await reader.read("gone")
        await reader.read("kept")
        projection = _projection(cache, "gone")
        assert projection is not None and projection.size > 0
        _, windowed = cache.size
        assert windowed >= before + 2 * projection.size - 1  # both projections charged
        await store.clear("gone")
        _, after = cache.size
        assert after < windowed
        assert _projection(cache, "gone") is None
        assert _projection(cache, "kept") is not None
    finally:
        if kind == "sqlite":
            await store.aclose()  # type: ignore[union-attr]


async def test_window_readers_over_one_handle_share_its_projections() -> None:
    store = InMemoryStore()
    await store.append(Batch("c", "t", _turns("c", 4)))
    await WindowReader(store, 4).read("c")
    kept = _projection(store.history_cache, "c")
    assert kept is not None
    await WindowReader(store, 4).read("c")  # another per-request reader: the same projection
    assert _projection(store.history_cache, "c") is kept


async def test_a_store_with_cache_bytes_zero_remembers_no_projection() -> None:
    store = InMemoryStore(cache_bytes=0)
    await store.append(Batch("c", "t", _turns("c", 4)))
    assert await WindowReader(store, 4).read("c") == (await store.read("c"))[-4:]
    assert store.history_cache.size == (0, 0)


@pytest.mark.parametrize("wrap", [False, True], ids=["reader", "adapter"])
async def test_the_cache_a_window_reader_owns_is_bounded(wrap: bool) -> None:
    source = _Conversations()
    reader = WindowReader(StoreAdapter(source) if wrap else source, max_tokens=50_000)
    cache = reader._cache
    assert cache.max_bytes == WINDOW_CACHE_BYTES
    assert WindowReader(source)._cache is not cache  # one per WindowReader, none shared
    for i in range(200):  # about 200 * 40 KiB charged: well past the bound
        cid = f"c{i}"
        source.held[cid] = _turns(cid, 10, size=2_000)
        assert await reader.read(cid) == window(source.held[cid], max_tokens=50_000)
        entries, held = cache.size
        assert held <= WINDOW_CACHE_BYTES and entries >= 1
    assert _projection(cache, "c199") is not None  # the newest stays
    assert _projection(cache, "c0") is None  # the oldest left


async def test_a_grown_projection_is_charged_as_a_fresh_one() -> None:
    messages = [system_message("s"), *_turns("g", 8)]
    grown = HistoryCache()
    cid = ConversationID("g")
    for cut in (3, 7, 12, len(messages)):
        project(grown, cid, messages[:cut])
    fresh = project(HistoryCache(), cid, messages)
    incremental = _projection(grown, "g")
    assert incremental is not None and incremental.size == fresh.size
    assert fresh.size > 2 * sum(len(m.text) for m in messages)
    assert fresh.size - fresh.held == PER_MESSAGE_BYTES * len(messages) + PER_TURN_BYTES * 8
    assert grown.size == (1, fresh.size)


def test_no_module_of_scope_holds_a_cache_of_history() -> None:
    """Nothing process-wide: no module-level HistoryCache, Projection or (remembering
    estimates) DefaultTokenCounter anywhere."""
    for info in pkgutil.walk_packages(scope.__path__, "scope."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name, value in vars(module).items():
            kinds = (HistoryCache, Projection, DefaultTokenCounter)
            assert type(value) not in kinds, f"{info.name}.{name}"


async def test_the_default_counter_is_one_per_store_handle() -> None:
    """A WindowReader without a counter measures with its cache's: shared by readers
    over one handle (their stable windows' steps stay warm), never by two handles."""
    one, two = InMemoryStore(), InMemoryStore()
    assert one.history_cache.token_counter is one.history_cache.token_counter
    assert one.history_cache.token_counter is not two.history_cache.token_counter
    assert type(one.history_cache.token_counter) is DefaultTokenCounter
    await one.append(Batch("c", "t", _turns("c", 30, size=200)))
    await WindowReader(one, max_tokens=2_000).read("c")
    projection = _projection(one.history_cache, "c")
    assert projection is not None
    steps = dict(projection.replays)
    assert [counter for counter, _ in steps.values()] == [one.history_cache.token_counter]
    await WindowReader(one, max_tokens=2_000).read("c")  # a per-request reader: warm
    assert projection.replays == steps
    source = _Conversations()
    reader = WindowReader(source, max_tokens=2_000)
    assert reader._cache.token_counter is not WindowReader(source)._cache.token_counter


def test_a_counter_keeps_no_counted_message_alive() -> None:
    counter = DefaultTokenCounter()
    message = user_message("x" * 100_000)
    assert counter.count([message]) == counter.count([message]) > 20_000
    gone = weakref.ref(message)
    del message
    gc.collect()
    assert gone() is None
    other = user_message("y")  # a new object, perhaps at the collected one's address
    assert counter.count([other]) == DefaultTokenCounter().count([other])
