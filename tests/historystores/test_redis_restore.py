"""RedisStore as a ``scope.history.Restorer`` (DESIGN §6n), on a real Redis and on a real
Redis Cluster: closed conversations listed and restored, tombstones listed and
restored under an adopted store secret, every refusal leaving the keys as they were.

Needs ``SCOPE_TEST_REDIS_URL`` / ``SCOPE_TEST_REDIS_CLUSTER_URL`` (see tests/servers.py);
each half is skipped without its server unless ``SCOPE_REQUIRE_SERVERS=1``. Every test
works under its own key prefixes and deletes them.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

import scope.historystores.redis as redis_store
from scope.errors import (
    ConversationClosedError,
    InvalidConversationIDError,
    InvalidReceiptError,
    RestoreConflictError,
)
from scope.history import ClosedConversation, ConversationMeta, Restorer
from scope.history.storekit import tombstone
from scope.historystores.redis import RedisStore
from tests.helpers import batch
from tests.servers import (
    drop_keys,
    import_driver,
    redis_cluster_url_or_skip,
    redis_url_or_skip,
    unique_key_prefix,
)

import_driver("redis")
import redis.asyncio as aioredis  # noqa: E402
from redis.asyncio.cluster import RedisCluster  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.servers]

PAST = _dt.datetime(2020, 1, 1, tzinfo=_dt.UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["redis", "cluster"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str) -> str:
    return redis_url_or_skip() if kind == "redis" else redis_cluster_url_or_skip()


@pytest.fixture
async def admin(url: str, kind: str) -> AsyncIterator[Any]:
    if kind == "cluster":
        client: Any = RedisCluster.from_url(url)
        await client.initialize()
    else:
        client = aioredis.Redis.from_url(url)
    yield client
    await client.aclose()


class Places:
    """Opens stores under fresh prefixes and deletes every key of them at the end."""

    def __init__(self, url: str, kind: str) -> None:
        self.url, self.kind = url, kind
        self.prefixes: list[str] = []
        self.stores: list[RedisStore] = []

    async def open(self, prefix: str | None = None) -> RedisStore:
        if prefix is None:
            prefix = unique_key_prefix()
            self.prefixes.append(prefix)
        store = await RedisStore.open(
            self.url, prefix=prefix, check_persistence=False, cluster=self.kind == "cluster"
        )
        self.stores.append(store)
        return store

    async def close(self) -> None:
        for store in self.stores:
            await store.aclose()
        for prefix in self.prefixes:
            await drop_keys(self.url, prefix, cluster=self.kind == "cluster")


@pytest.fixture
async def places(url: str, kind: str) -> AsyncIterator[Places]:
    made = Places(url, kind)
    yield made
    await made.close()


async def snapshot(admin: Any, prefix: str) -> dict[bytes, Any]:
    """Every key of the store under ``prefix`` with its type, value (``DUMP``) and TTL."""
    keys = [
        bytes(key)
        for match in (f"{prefix}:*", f"{{{prefix}:*")
        async for key in admin.scan_iter(match=match, count=1000)
    ]
    return {
        key: (await admin.type(key), await admin.dump(key), await admin.pttl(key) > 0)
        for key in sorted(keys)
    }


async def source_with_closures(store: RedisStore) -> dict[str, ClosedConversation]:
    """In ``store``: a cleared conversation with an owner, one cleared with none, one
    cleared without a batch, one expired and removed, one due (expiry passed, not
    removed), an open one and an erased one. The closed ones as they should list."""
    await store.append(batch("c-cleared", "a1"), owner="ann")
    await store.append(batch("c-cleared", "a2"))
    await store.clear("c-cleared")
    await store.append(batch("c-plain", "a1"))
    await store.clear("c-plain")
    await store.clear("c-never")
    await store.append(batch("c-removed", "a1"), owner="bob")
    await store.retain("c-removed", PAST)
    assert await store.expire() == 1
    await store.append(batch("c-due", "a1"), owner="ann")
    await store.append(batch("c-due", "a2"))
    await store.retain("c-due", PAST)
    await store.append(batch("c-open", "a1"), owner="ann")
    await store.append(batch("c-erased", "a1"), owner="ann")
    await store.clear("c-erased")
    await store.erase("c-erased")
    return {
        "c-cleared": ClosedConversation("c-cleared", "cleared", "ann", 4),
        "c-due": ClosedConversation("c-due", "expired", "ann", 0),
        "c-never": ClosedConversation("c-never", "cleared", None, 0),
        "c-plain": ClosedConversation("c-plain", "cleared", None, 2),
        "c-removed": ClosedConversation("c-removed", "expired", "bob", 0),
    }


async def test_redis_store_is_a_restorer(places: Places) -> None:
    assert isinstance(await places.open(), Restorer)


async def test_closed_conversations_lists_every_closure_in_order(places: Places) -> None:
    store = await places.open()
    expected = await source_with_closures(store)
    listed = await store.closed_conversations()
    assert listed == [expected[cid] for cid in sorted(expected)]
    for closed in listed:  # what read_meta and read_view say of each, today
        meta = await store.read_meta(closed.conversation_id)
        view = await store.read_view(closed.conversation_id)
        assert (meta.closure, meta.owner) == (closed.closure, closed.owner)
        assert view.closed and view.length == closed.length
    assert await store.closed_conversations(limit=2) == listed[:2]
    assert await store.closed_conversations(after="c-due", limit=2) == listed[2:4]
    assert await store.closed_conversations(after="c-plain") == listed[4:]
    assert await store.closed_conversations(after="c-removed") == []
    assert await store.closed_conversations(after="c-a") == listed  # not itself an id held


async def test_closed_conversations_orders_by_code_point(places: Places) -> None:
    store = await places.open()
    ids = ["é", "z", "Z", "a", "😀", "ab"]
    for cid in ids:
        await store.clear(cid)
    assert [c.conversation_id for c in await store.closed_conversations()] == sorted(ids)


async def test_closed_conversations_checks_arguments(places: Places) -> None:
    store = await places.open()
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ValueError, match="limit"):
            await store.closed_conversations(limit=bad)
    with pytest.raises(InvalidConversationIDError):
        await store.closed_conversations(after="")


async def test_restore_closed_writes_what_closure_leaves(places: Places) -> None:
    source = await places.open()
    target = await places.open()
    expected = await source_with_closures(source)
    for closed in await source.closed_conversations():
        assert await target.restore_closed(closed) is True
    assert await target.closed_conversations() == [expected[cid] for cid in sorted(expected)]
    assert await target.conversations() == []
    assert await target.conversations(owner="ann") == []
    for closed in expected.values():
        cid = closed.conversation_id
        assert await target.read_meta(cid) == ConversationMeta(
            owner=closed.owner, closure=closed.closure
        )
        view = await target.read_view(cid)
        assert view.closed and view.length == closed.length and view.messages == ()
        assert (await target.read_tree(cid)).closed
        assert await target.read(cid) == []
        with pytest.raises(ConversationClosedError):
            await target.append(batch(cid, "new"))
        with pytest.raises(ConversationClosedError):
            await target.move_head(cid, "", expected_head="")
        with pytest.raises(ConversationClosedError):
            await target.retain(cid, None)
        assert await target.restore_closed(closed) is False  # an import run again
    # erase_owned finds the restored conversations of an owner, receipts and all.
    receipts = await target.erase_owned("ann")
    assert sorted(r.conversation_id for r in receipts if r.conversation_id) == [
        "c-cleared",
        "c-due",
    ]
    for receipt in receipts:
        assert receipt.batches == 0 and await target.check_erased(receipt) == []
    assert await target.erase_owned("ann") == []
    assert [r.conversation_id for r in await target.erase_owned("bob")] == ["c-removed"]
    assert [c.conversation_id for c in await target.closed_conversations()] == [
        "c-never",
        "c-plain",
    ]


async def test_restore_closed_refusals_write_nothing(places: Places, admin: Any) -> None:
    store = await places.open()
    await store.append(batch("open", "a1"), owner="ann")
    await store.append(batch("due", "a1"), owner="ann")
    await store.retain("due", PAST)
    await store.append(batch("gone", "a1"), owner="ann")
    await store.erase("gone")
    await store.append(batch("closed", "a1"), owner="ann")
    await store.clear("closed")
    cases = [
        (ClosedConversation("open", "cleared", "ann", 2), "holds batches"),
        (ClosedConversation("due", "expired", "ann", 0), "holds batches"),
        (ClosedConversation("gone", "cleared", "ann", 2), "erased"),
        (ClosedConversation("closed", "expired", "ann", 2), "is cleared, not expired"),
        (ClosedConversation("closed", "cleared", "bob", 2), "owner 'ann', not 'bob'"),
        (ClosedConversation("closed", "cleared", None, 2), "owner 'ann', not None"),
        (ClosedConversation("closed", "cleared", "ann", 3), "length 2, not 3"),
    ]
    for closed, reason in cases:
        before = await snapshot(admin, store.prefix)
        with pytest.raises(RestoreConflictError, match=reason) as raised:
            await store.restore_closed(closed)
        assert repr(str(closed.conversation_id)) in str(raised.value)
        assert await snapshot(admin, store.prefix) == before
    with pytest.raises(TypeError, match="ClosedConversation"):
        await store.restore_closed(("closed", "cleared", "ann", 2))  # type: ignore[arg-type]


async def test_restore_closed_expired_is_what_expire_leaves(places: Places) -> None:
    store = await places.open()
    assert await store.restore_closed(ClosedConversation("x", "expired", "ann", 7))
    assert (await store.read_meta("x")).closure == "expired"
    assert await store.expire() == 0
    with pytest.raises(RestoreConflictError, match="is expired, not cleared"):
        await store.restore_closed(ClosedConversation("x", "cleared", "ann", 7))
    await store.clear("x")  # clearing a closed conversation keeps it closed
    assert (await store.read_view("x")).closed


async def test_restore_closed_run_again_finishes_the_owner_index(
    places: Places, admin: Any
) -> None:
    # A restore cut short before the owner's index was written (Cluster: another slot,
    # written after the script): running it again writes it, and erase_owned finds it.
    store = await places.open()
    closed = ClosedConversation("c", "cleared", "ann", 2)
    assert await store.restore_closed(closed)
    assert await admin.zrem(store._owner_index("ann"), b"c") == 1
    assert await store.erase_owned("ann") == []
    assert await store.restore_closed(closed) is False
    assert [r.conversation_id for r in await store.erase_owned("ann")] == ["c"]


async def test_tombstones_lists_every_slot_in_order(places: Places) -> None:
    store = await places.open()
    assert await store.tombstones() == []
    ids = [f"conversation-{n}" for n in range(12)]
    receipts = [await store.erase(cid) for cid in ids]
    marks = sorted(receipt.tombstone for receipt in receipts)
    assert await store.tombstones() == marks
    assert await store.tombstones(limit=5) == marks[:5]
    assert await store.tombstones(after=marks[4], limit=5) == marks[5:10]
    assert await store.tombstones(after=marks[-1]) == []
    with pytest.raises(ValueError, match="limit"):
        await store.tombstones(limit=0)
    with pytest.raises(TypeError, match="after"):
        await store.tombstones(after=1)  # type: ignore[arg-type]


async def test_store_secret_is_the_one_every_handle_reads(places: Places) -> None:
    store = await places.open()
    secret = await store.store_secret()
    assert type(secret) is bytes and len(secret) == 32
    again = await places.open(store.prefix)
    assert await again.store_secret() == secret


async def test_restore_erasures_checks_before_any_io(places: Places, admin: Any) -> None:
    store = await places.open()
    secret = await store.store_secret()
    good = "hmac-sha256:" + "a" * 64
    before = await snapshot(admin, store.prefix)
    for bad_secret, error in (
        (b"x" * 31, ValueError),
        (b"x" * 33, ValueError),
        ("x" * 32, TypeError),
    ):
        with pytest.raises(error):
            await store.restore_erasures(bad_secret, [good])  # type: ignore[arg-type]
    for bad in ("hmac-sha256:" + "A" * 64, "sha256:" + "a" * 64, "hmac-sha256:" + "a" * 63, 7):
        with pytest.raises(InvalidReceiptError):
            await store.restore_erasures(b"n" * 32, [good, bad])  # type: ignore[list-item]
    assert await snapshot(admin, store.prefix) == before
    assert await store.store_secret() == secret


async def test_restore_erasures_adopts_the_secret_into_an_empty_store(places: Places) -> None:
    source = await places.open()
    await source.append(batch("gone-1", "a1"), owner="ann")
    await source.append(batch("gone-2", "a1"))
    receipts = [await source.erase("gone-1"), await source.erase("gone-2"), await source.erase("x")]
    secret, marks = await source.store_secret(), await source.tombstones()
    target = await places.open()
    assert await target.store_secret() != secret
    assert await target.restore_erasures(secret, marks) == 3
    assert await target.store_secret() == secret
    assert await target.tombstones() == marks
    assert await target.restore_erasures(secret, marks) == 0  # run again
    for receipt in receipts:
        assert await target.check_erased(receipt) == []
    for handle in (target, await places.open(target.prefix)):  # a handle opened after, too
        assert await handle.store_secret() == secret
        for cid in ("gone-1", "gone-2"):
            with pytest.raises(ConversationClosedError):
                await handle.append(batch(cid, "again"))
            assert await handle.read_meta(cid) == ConversationMeta(closure="erased")
            view = await handle.read_view(cid)
            assert view.closed and view.length == 0
            assert (await handle.read_tree(cid)).closed
            with pytest.raises(ConversationClosedError):
                await handle.retain(cid, None)
            with pytest.raises(RestoreConflictError, match="erased"):
                await handle.restore_closed(ClosedConversation(cid, "cleared", None, 0))
            await handle.clear(cid)
            assert (await handle.read_meta(cid)).closure == "erased"
        await handle.append(batch("other", "a1"))  # an id never erased stays open
        assert await handle.closed_conversations() == []
    assert await target.tombstones() == marks
    assert await target.conversations() == ["other"]


async def test_restore_erasures_refuses_another_secret_over_data(
    places: Places, admin: Any
) -> None:
    source = await places.open()
    await source.erase("gone")
    secret, marks = await source.store_secret(), await source.tombstones()
    setups = {
        "open": lambda store: store.append(batch("c", "a1")),
        "cleared": lambda store: store.clear("c"),
        "restored": lambda store: store.restore_closed(ClosedConversation("c", "expired")),
        "tombstone": lambda store: store.erase("c"),
        "imported": lambda store: store.restore_erasures(
            store._secret, ["hmac-sha256:" + "b" * 64]
        ),
    }
    for name, setup in setups.items():
        target = await places.open()
        await setup(target)
        own = await target.store_secret()
        before = await snapshot(admin, target.prefix)
        with pytest.raises(RestoreConflictError, match="another store secret") as raised:
            await target.restore_erasures(secret, marks)
        assert target.prefix in str(raised.value), name
        assert await snapshot(admin, target.prefix) == before, name
        assert await target.store_secret() == own, name
        assert await (await places.open(target.prefix)).store_secret() == own, name


async def test_restore_erasures_under_the_same_secret_adds_only_new_ones(places: Places) -> None:
    store = await places.open()
    await store.append(batch("c", "a1"))
    own = [(await store.erase("gone")).tombstone]
    secret = await store.store_secret()
    assert await store.restore_erasures(secret, own) == 0  # held in its slot's set
    extra = ["hmac-sha256:" + "c" * 64, "hmac-sha256:" + "d" * 64]
    assert await store.restore_erasures(secret, [*extra, extra[0]]) == 2
    assert await store.restore_erasures(secret, [*own, *extra]) == 0
    assert await store.tombstones() == sorted([*own, *extra])
    assert await store.conversations() == ["c"]


async def test_restore_erasures_cut_short_is_finished_by_a_rerun(places: Places) -> None:
    # The secret adopted, the tombstones not added yet (an import stopped there): the
    # same call again no longer needs an empty store and adds them.
    source = await places.open()
    receipt = await source.erase("gone")
    secret = await source.store_secret()
    target = await places.open()
    assert await target.restore_erasures(secret, []) == 0
    assert await target.store_secret() == secret
    await target.restore_closed(ClosedConversation("kept", "cleared"))
    assert await target.restore_erasures(secret, [receipt.tombstone]) == 1
    assert await target.check_erased(receipt) == []
    with pytest.raises(ConversationClosedError):
        await target.append(batch("gone", "a1"))


async def test_a_tombstone_of_a_held_id_is_refused_by_any_handle(places: Places) -> None:
    # The same secret, a tombstone of an id this store holds (open or cleared): refused
    # through a second handle too, nothing added (erase it first, as StoreConformance
    # asks of every store).
    store = await places.open()
    await store.append(batch("c", "a1"), owner="ann")
    await store.append(batch("d", "a1"), owner="ann")
    await store.clear("d")
    secret = await store.store_secret()
    other = await places.open(store.prefix)
    for cid in ("c", "d"):
        with pytest.raises(RestoreConflictError, match="erase it first"):
            await other.restore_erasures(secret, [tombstone(secret, cid)])
    assert await other.tombstones() == []
    assert await other.read_batches("c") == [batch("c", "a1")]
    assert [c.conversation_id for c in await other.closed_conversations()] == ["d"]


async def test_restore_erasures_swaps_the_secret_only_if_unchanged(
    places: Places, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another handle swaps the secret between the emptiness check and the swap: the
    # compare-and-set refuses, nothing written.
    store = await places.open()
    secret_key = f"{store.prefix}:secret"
    third = b"t" * 32
    checked = RedisStore._held_keys

    async def racing(self: RedisStore, limit: int = 3) -> list[str]:
        found = await checked(self, limit)
        await admin.set(secret_key, third)
        return found

    monkeypatch.setattr(RedisStore, "_held_keys", racing)
    own = await store.store_secret()
    with pytest.raises(RestoreConflictError, match="changed during the restore"):
        await store.restore_erasures(b"n" * 32, ["hmac-sha256:" + "e" * 64])
    assert await admin.get(secret_key) == third
    assert await store.store_secret() == own
    assert await admin.exists(f"{store.prefix}:{{imported}}:tombstones") == 0


class _CountedChecks:
    """Wraps a handle's client to count its ``SISMEMBER`` calls (the imported check)."""

    def __init__(self, store: RedisStore) -> None:
        self.calls = 0
        client = store._client
        original = client.sismember

        async def sismember(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await original(*args, **kwargs)

        client.sismember = sismember


async def test_a_handle_checks_each_id_against_imported_tombstones_once(
    places: Places,
) -> None:
    """On a store holding imported tombstones, a handle asks the imported set once per
    conversation id: the set never changes once steps run, and a tombstone found there
    is copied into the id's own slot set. Before, every step paid that round trip."""
    source = await places.open()
    for cid in ("gone", "later"):
        await source.append(batch(cid, "a1"))
        await source.erase(cid)
    secret, marks = await source.store_secret(), await source.tombstones()
    first = [m for m in marks if m != tombstone(secret, "later")]
    assert len(first) == 1
    target = await places.open()
    assert await target.restore_erasures(secret, first) == 1
    handle = await places.open(target.prefix)  # opened after: finds the imported set
    checks = _CountedChecks(handle)
    for index in range(3):
        await handle.append(batch("live", f"a{index}"))
        assert (await handle.read_view("live")).length == 2 * (index + 1)
    assert len(await handle.read("live")) == 6
    assert (await handle.read_tree("live")).head == 2
    assert checks.calls == 1
    for _ in range(2):
        with pytest.raises(ConversationClosedError):
            await handle.append(batch("gone", "again"))
        assert (await handle.read_view("gone")).closed
        assert await handle.read("gone") == []
    assert checks.calls == 2
    # "later" was checked (no imported tombstone then) before its tombstone is imported
    # through this handle: the kept answer is dropped with the import.
    assert await handle.read("later") == []
    calls = checks.calls
    assert await handle.restore_erasures(secret, marks) == 1
    with pytest.raises(ConversationClosedError):
        await handle.append(batch("later", "again"))
    assert checks.calls == calls + 1


async def test_the_kept_answers_are_bounded(
    places: Places, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle keeps its answers for the most recently used ids only: one pushed out
    is checked again."""
    monkeypatch.setattr(redis_store, "_SETTLED_MAX", 2)
    source = await places.open()
    await source.append(batch("gone", "a1"))
    await source.erase("gone")
    target = await places.open()
    await target.restore_erasures(await source.store_secret(), await source.tombstones())
    handle = await places.open(target.prefix)
    checks = _CountedChecks(handle)
    for cid in ("c1", "c2", "c1", "c3"):  # c2 is now the least recently used
        await handle.append(batch(cid, f"a-{checks.calls}"))
    assert checks.calls == 3
    assert list(handle._settled) == ["c1", "c3"]
    await handle.read_view("c2")
    assert checks.calls == 4
