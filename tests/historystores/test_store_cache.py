"""Stores remember what they append: a read after this handle's own append (or a
deduplicated retry) decodes nothing; a cold handle decodes every record once, strictly.

Decoding is counted at ``scope.historystores._records.decode_canonical`` (every strict
decode of a record starts there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.history import Batch, ConversationID, HistoryCache
from scope.historystores import _records
from tests.helpers import turn
from tests.servers import BACKENDS, fresh_backend

pytestmark = pytest.mark.anyio

Opener = Callable[..., Awaitable[Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=BACKENDS)
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens handles on one fresh store: ``await opener(cache_bytes=...)``."""
    async with fresh_backend(request.param, tmp_path) as backend:
        yield backend.open


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = _records.decode_canonical

    def counting(data: Any) -> Any:
        count[0] += 1
        return real(data)

    monkeypatch.setattr(_records, "decode_canonical", counting)
    return count


async def test_a_read_after_our_own_append_decodes_nothing(
    opener: Opener, decodes: list[int]
) -> None:
    store = await opener()
    try:
        batches = [Batch("c", f"a{i}", turn(str(i))) for i in range(3)]
        for batch in batches:
            await store.append(batch)
        assert decodes == [0]
        stored = await store.read("c")
        view = await store.read_view("c")
        assert decodes == [0]
        assert stored == [m for b in batches for m in b.messages]
        # The very objects appended: the Middleware's replay check then skips them too.
        assert all(a is b for a, b in zip(view.messages, stored, strict=True))
        assert view.messages[0] is batches[0].messages[0]
        assert await store.read_batches("c") == batches
        assert decodes == [0]
    finally:
        await store.aclose()


async def test_a_deduplicated_retry_fills_the_cache_and_cold_reads_still_decode(
    opener: Opener, decodes: list[int]
) -> None:
    first = await opener()
    batch = Batch("c", "a1", turn("x"))
    try:
        await first.append(batch)
    finally:
        await first.aclose()
    cold = await opener()
    try:
        # A fresh handle has nothing cached: full strict decoding, once per record.
        assert await cold.read("c") == list(batch.messages)
        assert decodes == [1]
        await cold.read("c")
        assert decodes == [1]  # and then it is warm
    finally:
        await cold.aclose()
    again = await opener()
    try:
        assert await again.append(batch) == batch.receipt()  # a retry: nothing appended
        assert await again.read("c") == list(batch.messages)
        assert decodes == [1]  # the retry's messages were remembered
    finally:
        await again.aclose()
    uncached = await opener(cache_bytes=0)
    try:
        await uncached.append(Batch("c", "a2", turn("y")))
        await uncached.read("c")
        await uncached.read("c")
        assert decodes == [5]  # no cache: every read decodes both records
    finally:
        await uncached.aclose()


async def test_the_cache_is_bounded_by_bytes_and_forgets_a_cleared_conversation(
    opener: Opener, decodes: list[int]
) -> None:
    big = [Batch("c", f"a{i}", turn("x" * 4000 + str(i))) for i in range(4)]
    # A batch counts twice its encoded size: two batches fit, not three.
    bound = 2 * 2 * len(big[0].encoded_messages) + 100
    store = await opener(cache_bytes=bound)
    try:
        assert store.history_cache.max_bytes == bound
        for batch in big:
            await store.append(batch)
        entries, size = store.history_cache.size
        assert size <= bound and entries == 2  # the last two batches
        await store.read("c")
        assert decodes == [4]  # a history over the bound is decoded on every read (LRU)
        small = Batch("d", "a1", turn("d"))
        await store.append(small)
        await store.clear("c")
        assert store.history_cache.size == (1, 2 * len(small.encoded_messages))
    finally:
        await store.aclose()


async def test_a_clear_through_another_handle_empties_this_handles_cache_on_read(
    opener: Opener, decodes: list[int]
) -> None:
    reader, clearer = await opener(), await opener()
    try:
        batch = Batch("c", "a1", turn("x"))
        await clearer.append(batch)
        assert await reader.read("c") == list(batch.messages)
        reader.history_cache.replay("c", await reader.read("c"))
        assert reader.history_cache.size[0] == 2  # the decoded batch and the replay
        await clearer.clear("c")
        # Nothing is served without reading the store: the closed conversation reads
        # empty, and the read_view that finds it closed drops what this handle kept.
        view = await reader.read_view("c")
        assert view.closed and view.messages == ()
        assert await reader.read("c") == []
        assert reader.history_cache.size == (0, 0)
    finally:
        await reader.aclose()
        await clearer.aclose()


async def test_the_cache_bytes_bound_is_validated(opener: Opener) -> None:
    # The argument policy: a wrong type is a TypeError, a wrong value a ValueError.
    for wrong_type in (True, 1.5, "64"):
        with pytest.raises(TypeError, match="cache_bytes must be an integer"):
            await opener(cache_bytes=wrong_type)
    with pytest.raises(ValueError, match="cache_bytes must be an integer >= 0"):
        await opener(cache_bytes=-1)


def test_the_default_bound_is_small() -> None:
    assert HistoryCache().max_bytes == HistoryCache.DEFAULT_MAX_BYTES == 32 * 2**20


def test_replays_share_the_bound_and_a_clear_forgets_them() -> None:
    from scope.history.inmemory import InMemoryStore

    one = Batch("c", "a1", turn("x" * 4000)).messages
    size = 2 * len(Batch("c", "a1", list(one)).encoded_messages)  # counted twice
    cache = HistoryCache(max_bytes=2 * size + 50)
    for cid in ("a", "b", "c"):
        cache.replay(ConversationID(cid), one)
    assert cache.size[0] == 2 and cache.size[1] <= 2 * size + 50  # "a" left
    cache.forget("c")
    assert cache.size[0] == 1
    assert HistoryCache(0).replay("c", one) == one  # checked, not kept
    # A store's clear drops the conversation from its own cache, and from nobody else's.
    store, other = InMemoryStore(), InMemoryStore(cache_bytes=10**6)
    for handle in (store, other):
        handle.history_cache.replay(ConversationID("cleared"), one)
    anyio.run(store.clear, "cleared")
    assert store.history_cache.size == (0, 0)
    assert other.history_cache.size[0] == 1
    with pytest.raises(TypeError, match="cache_bytes must be an integer"):
        InMemoryStore(cache_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_bytes must be an integer >= 0"):
        InMemoryStore(cache_bytes=-1)


async def test_clear_empties_the_cache_and_reads_decode_again(
    opener: Opener, decodes: list[int]
) -> None:
    # HistoryCache.clear drops every entry of every conversation; a read after it
    # decodes each record again (and keeps it again).
    store = await opener()
    try:
        for cid in ("c", "d"):
            await store.append(Batch(cid, "a1", turn(cid)))
        cache = store.history_cache
        entries, held = cache.size
        assert entries >= 2 and held > 0
        assert repr(cache) == (
            f"HistoryCache(max_bytes={cache.max_bytes}, entries={entries}, bytes={held})"
        )
        cache.clear()
        assert cache.size == (0, 0)
        before = decodes[0]
        assert [m.text for m in await store.read("c")] == ["c q", "c a"]
        assert decodes[0] == before + 1 and cache.size[0] == 1
    finally:
        await store.aclose()
