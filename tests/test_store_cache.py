"""Stores remember what they append: a read after this handle's own append (or a
deduplicated retry) decodes nothing; a cold handle decodes every record once, strictly.

Decoding is counted at ``scope.historystores._records.parse_exact_fast`` (every strict decode of a
record starts there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from scope.history import Batch
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
