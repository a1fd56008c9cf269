"""Stores remember what they append: a read after this handle's own append (or a
deduplicated retry) decodes nothing; a cold handle decodes every record once, strictly.

Decoding is counted at ``scope.historystores._records.parse_exact_fast`` (every strict decode of a
record starts there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.history import Batch, ConversationID
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
    """Opens handles on one fresh store: ``await opener(decoded_cache_messages=...)``."""
    async with fresh_backend(request.param, tmp_path) as backend:
        yield backend.open


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = _records.parse_exact_fast

    def counting(data: Any) -> Any:
        count[0] += 1
        return real(data)

    monkeypatch.setattr(_records, "parse_exact_fast", counting)
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
    uncached = await opener(decoded_cache_messages=0)
    try:
        await uncached.append(Batch("c", "a2", turn("y")))
        await uncached.read("c")
        await uncached.read("c")
        assert decodes == [5]  # no cache: every read decodes both records
    finally:
        await uncached.aclose()


async def test_the_decoded_cache_is_bounded_by_bytes_and_forgets_a_cleared_conversation(
    opener: Opener, decodes: list[int]
) -> None:
    big = [Batch("c", f"a{i}", turn("x" * 4000 + str(i))) for i in range(4)]
    # A batch counts twice its encoded size: two batches fit, not three.
    bound = 2 * 2 * len(big[0].encoded_messages) + 100
    store = await opener(decoded_cache_bytes=bound)
    try:
        for batch in big:
            await store.append(batch)
        messages, size = store._cache.size
        assert size <= bound and messages == 4  # the last two batches
        await store.read("c")
        assert decodes == [4]  # a history over the bound is decoded on every read (LRU)
        await store.append(Batch("d", "a1", turn("d")))
        await store.clear("c")
        assert store._cache.size == (2, 2 * len(Batch("d", "a1", turn("d")).encoded_messages))
    finally:
        await store.aclose()


async def test_the_decoded_cache_bytes_bound_is_validated(opener: Opener) -> None:
    # The argument policy: a wrong type is a TypeError, a wrong value a ValueError.
    for wrong_type in (True, 1.5, "64"):
        with pytest.raises(TypeError, match="decoded_cache_bytes must be an integer"):
            await opener(decoded_cache_bytes=wrong_type)
    with pytest.raises(ValueError, match="decoded_cache_bytes must be an integer >= 0"):
        await opener(decoded_cache_bytes=-1)


def test_the_replay_cache_is_bounded_by_bytes_and_forgets_a_cleared_conversation() -> None:
    from scope.history._replay import Replays
    from scope.history.inmemory import InMemoryStore

    one = Batch("c", "a1", turn("x" * 4000)).messages
    size = 2 * len(Batch("c", "a1", list(one)).encoded_messages)  # counted twice
    replays = Replays(max_conversations=100, max_bytes=2 * size + 50)
    for cid in ("a", "b", "c"):
        replays.replay(ConversationID(cid), one)
    assert replays.size[0] == 2 and replays.size[1] <= 2 * size + 50  # "a" left
    replays.forget("c")
    assert replays.size[0] == 1
    # The process-wide cache forgets what any store clears.
    from scope.history._replay import replays as shared

    store = InMemoryStore()
    shared.replay(ConversationID("cleared"), one)
    before = shared.size[0]
    anyio.run(store.clear, "cleared")
    assert shared.size[0] == before - 1
