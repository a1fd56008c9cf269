"""Retention and erasure (DESIGN §6i): ErasureReceipt, the in-memory store's clock and
secret, and what StoreAdapter derives."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from scope.chat import assistant_message, user_message
from scope.errors import ConversationClosedError, InvalidReceiptError
from scope.history import Batch, KeepInterrupted, StoreAdapter, Wait, keyword_layers
from scope.history._erasure import (
    EMPTY_DIGEST,
    ErasureReceipt,
    check_owner,
    erasure_digest,
    tombstone,
)
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio

UTC = dt.UTC
WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
MARK = "hmac-sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32


def _batch(cid: str, aid: str, tag: str = "t") -> Batch:
    return Batch(cid, aid, [user_message(f"{tag}/0"), assistant_message(f"{tag}/1")])


def _receipt(**changes: Any) -> ErasureReceipt:
    fields: dict[str, Any] = {
        "tombstone": MARK,
        "digest": DIGEST,
        "batches": 2,
        "bytes": 120,
        "erased_at": WHEN,
        "store": "sqlite",
    }
    fields.update(changes)
    return ErasureReceipt(**fields)


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


# -- ErasureReceipt ---------------------------------------------------------------------


def test_receipt_json_is_canonical_and_round_trips() -> None:
    receipt = _receipt()
    data = receipt.to_json()
    assert data == (
        b'{"batches":2,"bytes":120,"digest":"' + DIGEST.encode() + b'",'
        b'"erased_at":"2026-01-02T03:04:05.678901Z","store":"sqlite",'
        b'"tombstone":"' + MARK.encode() + b'"}'
    )
    assert ErasureReceipt.from_json(data) == receipt
    # Any spelling of the same fields reads back to the same receipt.
    spaced = orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2)
    assert ErasureReceipt.from_json(spaced.decode()) == receipt


def test_receipt_times_are_kept_in_utc() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    receipt = _receipt(erased_at=WHEN.astimezone(plus_two))
    assert receipt.erased_at == WHEN
    assert receipt.erased_at.tzinfo is UTC
    data = receipt.to_json().replace(
        b"2026-01-02T03:04:05.678901Z", b"2026-01-02T05:04:05.678901+02:00"
    )
    assert ErasureReceipt.from_json(data) == _receipt()


def test_receipt_of_computes_digest_batches_and_bytes() -> None:
    digests = ["sha256:" + "01" * 32, "sha256:" + "02" * 32]
    receipt = ErasureReceipt.of(
        tombstone=MARK, digests=digests, bytes=7, erased_at=WHEN, store="memory"
    )
    expected = "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()
    assert receipt.digest == expected == erasure_digest(digests)
    assert (receipt.batches, receipt.bytes) == (2, 7)
    empty = ErasureReceipt.of(tombstone=MARK, digests=[], bytes=0, erased_at=WHEN, store="redis")
    assert empty.digest == EMPTY_DIGEST == "sha256:" + hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tombstone", "sha256:" + "ab" * 32),
        ("tombstone", "hmac-sha256:" + "AB" * 32),
        ("tombstone", 5),
        ("digest", "sha256:abc"),
        ("digest", None),
        ("batches", -1),
        ("batches", True),
        ("batches", 1.0),
        ("batches", 2**63),
        ("bytes", -5),
        ("bytes", "1"),
        ("erased_at", dt.datetime(2026, 1, 1)),  # naive
        ("erased_at", "2026-01-01T00:00:00Z"),
        ("store", "mysql"),
        ("store", None),
    ],
)
def test_receipt_rejects_each_invalid_field(field: str, value: object) -> None:
    with pytest.raises(InvalidReceiptError, match=field):
        _receipt(**{field: value})


def test_receipt_of_no_batch_must_have_no_bytes_and_the_empty_digest() -> None:
    with pytest.raises(InvalidReceiptError, match="no batch"):
        _receipt(batches=0, bytes=0)  # DIGEST is not the empty digest
    with pytest.raises(InvalidReceiptError, match="no batch"):
        _receipt(batches=0, bytes=3, digest=EMPTY_DIGEST)
    assert _receipt(batches=0, bytes=0, digest=EMPTY_DIGEST).batches == 0


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{", "must be JSON"),
        (b"[]", "JSON object"),
        (b'"x"', "JSON object"),
        (b"\xff", "must be JSON"),
    ],
)
def test_receipt_from_invalid_json_raises(data: bytes, match: str) -> None:
    with pytest.raises(InvalidReceiptError, match=match):
        ErasureReceipt.from_json(data)


def test_receipt_from_json_names_missing_and_unknown_fields() -> None:
    tree = orjson.loads(_receipt().to_json())
    del tree["bytes"]
    tree["extra"] = 1
    with pytest.raises(InvalidReceiptError, match=r"missing \['bytes'\], unknown \['extra'\]"):
        ErasureReceipt.from_json(orjson.dumps(tree))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("erased_at", "yesterday"),
        ("erased_at", 12),
        ("erased_at", "2026-01-01T00:00:00"),  # no offset
        ("batches", 2.0),
        ("bytes", None),
        ("store", "Memory"),
        ("tombstone", "hmac-sha256:00"),
    ],
)
def test_receipt_from_json_rejects_invalid_values(field: str, value: object) -> None:
    tree = orjson.loads(_receipt().to_json())
    tree[field] = value
    with pytest.raises(InvalidReceiptError, match=field):
        ErasureReceipt.from_json(orjson.dumps(tree))


def test_tombstone_is_the_keyed_hash_of_the_id() -> None:
    import hmac

    secret = b"k" * 32
    expected = hmac.new(secret, "日本".encode(), hashlib.sha256).hexdigest()
    assert tombstone(secret, "日本") == "hmac-sha256:" + expected
    assert tombstone(b"j" * 32, "日本") != tombstone(secret, "日本")


# -- owners -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "error"),
    [
        ("", ValueError),
        ("x" * 257, ValueError),
        ("tab\there", ValueError),
        ("nul\x00", ValueError),
        ("\ud800", ValueError),
        (5, TypeError),
        (b"bytes", TypeError),
    ],
)
def test_invalid_owners_are_refused(owner: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="owner"):
        check_owner(owner)


def test_valid_owners_pass() -> None:
    for owner in ("a", "x" * 256, "user:42 ünï", "emoji 🙂"):
        assert check_owner(owner) == owner


async def test_invalid_owner_appends_nothing() -> None:
    store = InMemoryStore()
    with pytest.raises(ValueError, match="owner"):
        await store.append(_batch("c", "a"), owner="")
    with pytest.raises(ValueError, match="owner"):
        await store.append_release_turn(_batch("c", "a"), "h", owner="x\n")
    with pytest.raises(ValueError, match="owner"):
        await store.conversations(owner="")
    with pytest.raises(ValueError, match="owner"):
        await store.erase_owned("")
    assert await store.read_batches("c") == []


# -- the in-memory store: clock, retention, secret --------------------------------------


async def test_store_retention_counts_from_the_last_append() -> None:
    clock = _Clock()
    store = InMemoryStore(retention=dt.timedelta(seconds=60), clock=clock)
    await store.append(_batch("c", "a1"))
    clock.now += 50
    await store.append(_batch("c", "a2"))
    clock.now += 50  # 100 s after the first append, 50 after the last
    assert len(await store.read("c")) == 4
    clock.now += 10
    assert await store.read("c") == []
    assert (await store.read_view("c")).closed
    assert await store.conversations() == []
    with pytest.raises(ConversationClosedError):
        await store.append(_batch("c", "a3"))
    assert await store.expire() == 1
    assert await store.expire() == 0


async def test_a_retry_does_not_extend_the_retention() -> None:
    clock = _Clock()
    store = InMemoryStore(retention=dt.timedelta(seconds=60), clock=clock)
    batch = _batch("c", "a1")
    await store.append(batch)
    clock.now += 50
    assert await store.append(batch) == batch.receipt()  # a retry: nothing landed
    clock.now += 15
    assert await store.read("c") == []


async def test_retain_overrides_the_store_retention() -> None:
    clock = _Clock()
    store = InMemoryStore(retention=dt.timedelta(seconds=60), clock=clock)
    await store.append(_batch("kept", "a1"))
    await store.retain("kept", None)
    await store.append(_batch("short", "a1"))
    await store.retain("short", dt.datetime.fromtimestamp(clock.now + 5, UTC))
    await store.append(_batch("short", "a2"))  # does not move its own expiry
    clock.now += 6
    assert await store.conversations() == ["kept"]
    clock.now += 10_000
    assert await store.conversations() == ["kept"]
    assert await store.expire() == 1


@pytest.mark.parametrize(("retention", "error"), [(0, TypeError), (dt.timedelta(0), ValueError)])
def test_invalid_store_retention_is_refused(retention: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="retention"):
        InMemoryStore(retention=retention)  # type: ignore[arg-type]


async def test_each_in_memory_store_has_its_own_secret() -> None:
    one, two = InMemoryStore(), InMemoryStore()
    first = await one.erase("c")
    second = await two.erase("c")
    assert first.tombstone != second.tombstone
    assert await one.check_erased(first) == []
    assert await two.check_erased(first) == [f"no tombstone {first.tombstone} in this store"]


async def test_check_erased_names_a_receipt_of_another_kind_of_store() -> None:
    store = InMemoryStore()
    receipt = await store.erase("c")
    forged = _receipt(tombstone=receipt.tombstone, store="postgres")
    problems = await store.check_erased(forged)
    assert problems == ["the receipt was issued by a postgres store, not a memory one"]
    with pytest.raises(TypeError, match="ErasureReceipt"):
        await store.check_erased(receipt.to_json())  # type: ignore[arg-type]


async def test_erase_receipt_uses_the_store_clock() -> None:
    clock = _Clock()
    store = InMemoryStore(clock=clock)
    batch = _batch("c", "a1")
    await store.append(batch)
    receipt = await store.erase("c")
    assert receipt.erased_at == dt.datetime.fromtimestamp(clock.now, UTC)
    assert receipt.bytes == len(batch.encoded_messages)
    assert receipt.digest == erasure_digest([batch.digest])


# -- StoreAdapter -------------------------------------------------------------------------


class _Simple:
    """A simple store: read, append, clear (no owners, no erasure)."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()

    async def read(self, conversation_id: str) -> Any:
        return await self.inner.read(conversation_id)

    async def append(self, batch: Batch) -> Any:
        return await self.inner.append(batch)

    async def clear(self, conversation_id: str) -> None:
        await self.inner.clear(conversation_id)

    async def conversations(self, *, after: Any = None, limit: Any = None) -> Any:
        return await self.inner.conversations(after=after, limit=limit)


class _Owning(_Simple):
    """A simple store whose append takes an owner, with its own erasure."""

    async def append(self, batch: Batch, *, owner: str | None = None) -> Any:
        return await self.inner.append(batch, owner=owner)

    async def conversations(self, **options: Any) -> Any:
        return await self.inner.conversations(**options)

    async def erase(self, conversation_id: str) -> Any:
        return await self.inner.erase(conversation_id)


async def test_adapter_without_owners_refuses_an_owner_before_any_io() -> None:
    simple = _Simple()
    adapter = StoreAdapter(simple)
    assert adapter.owners is False
    with pytest.raises(TypeError, match="takes no owner"):
        await adapter.append(_batch("c", "a"), owner="alice")
    with pytest.raises(TypeError, match="takes no owner"):
        await adapter.append_release_turn(_batch("c", "a"), "h", owner="alice")
    assert await simple.read("c") == []
    await adapter.append(_batch("c", "a"))  # without an owner: the store's own append
    assert len(await simple.read("c")) == 2
    with pytest.raises(TypeError, match="takes no owner"):
        await adapter.conversations(owner="alice")
    assert await adapter.conversations() == ["c"]


async def test_adapter_cannot_derive_retention_or_erasure() -> None:
    adapter = StoreAdapter(_Simple())
    calls: list[Any] = [
        adapter.retain("c", None),
        adapter.expire(),
        adapter.erase("c"),
        adapter.erase_owned("alice"),
        adapter.check_erased(_receipt()),
    ]
    for name, call in zip(
        ["retain", "expire", "erase", "erase_owned", "check_erased"], calls, strict=True
    ):
        with pytest.raises(TypeError, match=f"has no {name}: the adapter cannot derive it"):
            await call


async def test_adapter_passes_owners_and_erasure_to_a_store_that_has_them() -> None:
    owning = _Owning()
    adapter = StoreAdapter(owning)
    assert adapter.owners is True
    await adapter.append(_batch("c", "a"), owner="alice")
    await adapter.append_release_turn(_batch("d", "a"), "h", owner="bob")
    assert await adapter.conversations(owner="alice") == ["c"]
    assert await adapter.conversations(owner="bob") == ["d"]
    receipt = await adapter.erase("c")
    assert receipt.batches == 1
    assert await owning.read("c") == []


# -- erase_owner over 10,000 conversations ----------------------------------------------


async def test_erase_owner_of_ten_thousand_conversations_resumes_in_memory() -> None:
    from scope.history.storetest._erasure import erase_owner_resumes

    await erase_owner_resumes(InMemoryStore(), 10_000)


async def test_erase_owner_of_ten_thousand_conversations_resumes_on_sqlite(
    tmp_path: Path,
) -> None:
    from scope.history.storetest._erasure import erase_owner_resumes
    from scope.historystores.sqlite import SQLiteStore

    if not hasattr(SQLiteStore, "erase_owned"):
        pytest.skip("this SQLiteStore has no erasure yet")
    async with await SQLiteStore.open(tmp_path / "h.db") as store:
        await erase_owner_resumes(store, 10_000)


async def test_erase_owner_checks_its_arguments_before_any_io() -> None:
    from scope.history import erase_owner

    store = InMemoryStore()
    await store.append(_batch("c", "a"), owner="alice")
    with pytest.raises(ValueError, match="owner"):
        await erase_owner(store, "")
    with pytest.raises(ValueError, match="page"):
        await erase_owner(store, "alice", page=0)
    assert await store.conversations(owner="alice") == ["c"]


async def test_history_functions_retain_and_erase() -> None:
    from scope.history import erase, retain

    clock = _Clock()
    store = InMemoryStore(clock=clock)
    await store.append(_batch("c", "a"))
    await retain(store, "c", dt.datetime.fromtimestamp(clock.now + 10, UTC))
    clock.now += 11
    assert await store.read("c") == []
    with pytest.raises(ValueError, match="aware"):
        await retain(store, "d", dt.datetime(2030, 1, 1))
    receipt = await erase(store, "c")
    assert receipt.batches == 1  # expired, not yet removed: erase removes it
    with pytest.raises(TypeError, match="has no erase"):
        await erase(_Simple(), "c")


# -- Middleware and Conversation owner= -------------------------------------------------


def _answer(text: str) -> Any:
    from scope.chat import FinishReason, Output, Response

    return Response(Output(assistant_message(text), FinishReason.STOP))


@pytest.mark.parametrize("on_overlap", ["fence", "reject"])
async def test_middleware_owner_is_recorded_by_the_first_commit(on_overlap: str) -> None:
    from scope.chat import Request, wrap
    from scope.history import Middleware
    from scope.testing import ScriptedModel

    store = InMemoryStore()
    mw = Middleware(store, store, "c", owner="alice", layers=keyword_layers(on_overlap))  # type: ignore[arg-type]
    assert mw.owner == "alice"
    model = wrap(ScriptedModel(_answer("one"), _answer("two")), mw.call)
    await model.call(Request([user_message("hi")]))
    later = Middleware(store, store, "c", owner="bob")
    await wrap(ScriptedModel(_answer("three")), later.call).call(Request([user_message("x")]))
    assert await store.conversations(owner="alice") == ["c"]
    assert await store.conversations(owner="bob") == []
    # The owner is no part of the batches.
    assert [b.digest for b in await store.read_batches("c")] == [
        b.receipt().digest for b in await store.read_batches("c")
    ]


async def test_middleware_keeps_an_interrupted_first_turn_under_its_owner() -> None:
    from scope.chat import Request, wrap
    from scope.history import Middleware
    from scope.testing import ScriptedModel

    store = InMemoryStore()
    mw = Middleware(store, store, "c", owner="alice", layers=(KeepInterrupted(),))
    model = wrap(ScriptedModel(RuntimeError("the model failed")), mw.call)
    with pytest.raises(RuntimeError):
        await model.call(Request([user_message("hi")]))
    assert await store.conversations(owner="alice") == ["c"]


def test_middleware_owner_is_checked_at_construction() -> None:
    from scope.history import Middleware, Unfenced

    store = InMemoryStore()
    with pytest.raises(ValueError, match="owner"):
        Middleware(store, store, "c", owner="")
    with pytest.raises(TypeError, match="owner"):
        Middleware(store, store, "c", owner=5)  # type: ignore[arg-type]
    simple = StoreAdapter(_Simple())
    with pytest.raises(TypeError, match="append takes owner"):
        Middleware(simple, simple, "c", owner="alice", layers=(Unfenced(),))
    with pytest.raises(TypeError, match="append takes owner"):
        Middleware(store, _Simple(), "c", owner="alice")  # type: ignore[arg-type]
    Middleware(simple, simple, "c", layers=(Unfenced(),))  # no owner: any writer


class _NoOwnerFold(_Owning):
    """A simple store whose append takes an owner and whose own folded append (with
    its own acquire) takes none."""

    async def read_view(self, conversation_id: str) -> Any:
        return await self.inner.read_view(conversation_id)

    async def acquire_turn_view(self, conversation_id: str, holder: str, ttl: float) -> Any:
        return await self.inner.acquire_turn_view(conversation_id, holder, ttl)

    async def append_release_turn(self, batch: Batch, holder: str) -> Any:
        return await self.inner.append_release_turn(batch, holder)


def test_middleware_owner_with_a_lease_needs_an_owning_folded_append() -> None:
    """Checked without looking at signatures: a ``Store`` records owners by its
    protocol; through a ``StoreAdapter``, the adapter says whether the wrapped store's
    folded append takes one (``records_owners``)."""
    from scope.history import Middleware

    store = StoreAdapter(_NoOwnerFold())
    assert store.records_owners("append") and not store.records_owners("append_release_turn")
    Middleware(store, store, "c", owner="alice")  # fence: the folded append is not used
    with pytest.raises(TypeError, match="append_release_turn takes owner"):
        Middleware(store, store, "c", owner="alice", layers=(Wait(),))
    owning = InMemoryStore()
    Middleware(owning, owning, "c", owner="alice", layers=(Wait(),))


async def test_conversation_owner_is_recorded_and_erase_owner_erases_it() -> None:
    from scope.conversation import Conversation
    from scope.history import erase_owner
    from scope.testing import ScriptedModel

    store = InMemoryStore()
    for cid in ("c1", "c2"):
        conversation = Conversation(ScriptedModel(_answer("ok")), store, cid, owner="alice")
        await conversation.ask("hello")
    await Conversation(ScriptedModel(_answer("ok")), store, "c3", owner="bob").ask("hi")
    assert await store.conversations(owner="alice") == ["c1", "c2"]
    receipts = await erase_owner(store, "alice")
    assert [r.batches for r in receipts] == [1, 1]
    assert await store.conversations() == ["c3"]
    with pytest.raises(ValueError, match="owner"):
        Conversation(ScriptedModel(), store, "c", owner="x" * 257)
    with pytest.raises(TypeError, match="owner"):
        Conversation(ScriptedModel(), _Simple(), "c", owner="alice")  # type: ignore[arg-type]


class _FlakyOwning(InMemoryStore):
    """Fails the first append: the Conversation's retry must carry the owner too."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 1

    async def append(self, batch: Batch, *, owner: str | None = None) -> Any:
        if self.fail:
            self.fail -= 1
            from scope.errors import StoreError

            raise StoreError("the store is down")
        return await super().append(batch, owner=owner)


async def test_conversation_retries_the_append_with_the_owner() -> None:
    from scope.conversation import Conversation
    from scope.testing import ScriptedModel

    store = _FlakyOwning()
    await Conversation(ScriptedModel(_answer("ok")), store, "c", owner="alice").ask("hello")
    assert await store.conversations(owner="alice") == ["c"]
