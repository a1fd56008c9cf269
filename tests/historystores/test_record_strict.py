"""Records whose sha256 digest matches, in the one spelling scope writes (keys sorted,
no whitespace), holding content scope refuses: every store's read, through a handle
that keeps nothing (``cache_bytes=0``: each read decodes) and one that caches, fails
with ``StoreError`` naming the conversation and the batch, as ``read_batches`` does."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope._documents import digest_of
from scope.errors import StoreError
from scope.historystores._records import decode_record
from tests.chat.test_codec_strict import _items
from tests.helpers import batch, texts
from tests.historystores.test_record_decode import verdicts
from tests.servers import Backend, fresh_backend, over_backends

pytestmark = pytest.mark.anyio

Change = Callable[[list[Any]], None]

#: One change each to the stored tree of ``batch("victim", "a1")`` (a user and an
#: assistant text message) that the checked decoder refuses or that is not canonical.
CHANGES: dict[str, Change] = {
    "empty-metadata": lambda t: t[0].__setitem__("metadata", {}),  # a member at its default
    "empty-text": lambda t: t[1]["parts"][0].__setitem__("text", ""),  # a rule broken
    "null-media": lambda t: t[0]["parts"][0].__setitem__("media", None),
    "unknown-member": lambda t: t[1].__setitem__("extra", 1),
    "role-type": lambda t: t[0].__setitem__("role", 1),
    "tool-part-in-user": lambda t: t[0]["parts"][0].__setitem__("kind", "tool_result"),
    "no-parts": lambda t: t[1].__setitem__("parts", []),
    "not-an-array": lambda t: t.__setitem__(0, "user"),
}


@pytest.fixture
async def backend(kind: str, tmp_path: Path) -> AsyncIterator[Backend]:
    async with fresh_backend(kind, tmp_path) as backend:
        yield backend


@over_backends(change={k: sorted(CHANGES) for k in ("sqlite", "postgres", "redis")})
async def test_a_rehashed_record_scope_refuses_fails_every_read(
    backend: Backend, change: str
) -> None:
    original = batch("victim", "a1")
    async with await backend.open() as store, await backend.open(cache_bytes=0) as cold:
        await store.append(original)
        await store.append(batch("bystander", "a1"))
        assert len(await store.read("victim")) == 2  # cached while valid
        tree = orjson.loads(original.encoded_messages)
        CHANGES[change](tree)
        data = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        await backend.rewrite_record("victim", "a1", data=data, digest=digest)
        for handle in (cold, store):
            for read in (handle.read, handle.read_batches):
                with pytest.raises(StoreError, match="stored batch 'a1' is corrupt") as info:
                    await read("victim")
                assert "conversation 'victim'" in str(info.value)
            assert texts(await handle.read("bystander")) == ["hello", "hello!"]


def test_a_tool_result_without_its_output_member_is_refused() -> None:
    # Its output is written even when empty: a record lacking it is not scope's. (The
    # canonical check read the member unguarded: a KeyError escaped the read.)
    data = b'[{"parts":[{"kind":"tool_result","tool_result":{"id":"0","name":"0"}}],"role":"tool"}]'
    with pytest.raises(StoreError, match="canonical"):
        decode_record("c", "a", digest_of(data), data)


@settings(max_examples=300, deadline=None)
@given(st.lists(_items(), min_size=1, max_size=3))
def test_the_read_decoder_equals_the_checked_decoder(items: list[Any]) -> None:
    # Messages with members changed, added or removed anywhere, in the one spelling
    # scope writes, digest matching: decode_record returns the reference's messages or
    # raises StoreError exactly when the reference (exact reader, strict decode,
    # completeness, encoding again) does.
    data = orjson.dumps(items, option=orjson.OPT_SORT_KEYS)
    fast, slow = verdicts(data)
    assert fast == slow
