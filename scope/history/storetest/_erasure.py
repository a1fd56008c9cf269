"""The retention and erasure rules of DESIGN §6i: owners, ``retain``, ``expire``,
``erase``, ``erase_owned`` and ``check_erased``."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from scope.errors import (
    ConversationClosedError,
    HistoryChangedError,
    InvalidConversationIDError,
)
from scope.history._batch import Batch
from scope.history._cache import HistoryCache
from scope.history._erasure import EMPTY_DIGEST, STORE_KINDS, ErasureReceipt, erasure_digest
from scope.history._meta import ConversationMeta
from scope.history._retention import erase_owner
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import (
    HOSTILE_IDS,
    Base,
    _texts,
    _turn,
    rich_messages,
)

_HOUR = _dt.timedelta(hours=1)
_BAD_OWNERS = ("", "x" * 257, "nul\x00", "line\nbreak", "\ud800")


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _batch(cid: str, aid: str, tag: str | None = None) -> Batch:
    return Batch(cid, aid, _turn(tag or f"{cid}/{aid}"))


async def _closed_for_ever(store: Any, cid: str) -> None:
    """Every read of ``cid`` is empty and closed, it is in no listing, and every write
    raises ``ConversationClosedError``."""
    assert await store.read(cid) == []
    assert await store.read_batches(cid) == []
    view = await store.read_view(cid)
    assert view.messages == () and view.closed is True
    assert cid not in await store.conversations()
    with pytest.raises(ConversationClosedError):
        await store.append(_batch(cid, "after"))
    with pytest.raises(ConversationClosedError):
        await store.append_release_turn(_batch(cid, "after-2"), "holder")
    with pytest.raises(ConversationClosedError):
        await store.retain(cid, _now() + _HOUR)
    # The branch steps (DESIGN §6h) of a store that has them: closed too.
    if callable(getattr(store, "read_tree", None)):
        tree = await store.read_tree(cid)
        assert tree.closed is True and tree.batches == ()
    if callable(getattr(store, "move_head", None)):
        with pytest.raises(ConversationClosedError):
            await store.move_head(cid, "", expected_head="")


@tests_on_anyio_runner
class ErasureRules(Base):
    """The retention and erasure rules of DESIGN §6i (see ``scope.history.Store``)."""

    # -- owners -----------------------------------------------------------------------

    async def test_owner_is_recorded_by_the_first_append_only(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.append(_batch("c", "a2"), owner="bob")  # ignored: alice's for ever
        await store.append_release_turn(_batch("d", "a1"), "h", owner="bob")
        await store.append(_batch("d", "a2"), owner="alice")
        assert await store.conversations(owner="alice") == ["c"]
        assert await store.conversations(owner="bob") == ["d"]
        assert await store.conversations() == ["c", "d"]

    async def test_owner_of_a_first_append_without_one_is_never_set(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        await store.append(_batch("c", "a2"), owner="alice")
        assert await store.conversations(owner="alice") == []
        assert await store.erase_owned("alice") == []
        assert len(await store.read("c")) == 4

    async def test_owner_is_not_recorded_by_a_refused_append(self, store: Any) -> None:
        fenced = _batch("c", "a1").fenced(3)
        with pytest.raises(HistoryChangedError):
            await store.append(fenced, owner="alice")
        await store.append(_batch("c", "a2"), owner="bob")
        assert await store.conversations(owner="alice") == []
        assert await store.conversations(owner="bob") == ["c"]

    async def test_owner_is_not_part_of_the_batch(self, store: Any) -> None:
        batch = _batch("c", "a1")
        receipt = await store.append(batch, owner="alice")
        assert receipt == batch.receipt()
        # A retry under another owner is the same batch: the equal receipt, nothing new.
        assert await store.append(batch, owner="bob") == receipt
        assert await store.read_batches("c") == [batch]
        assert await store.conversations(owner="bob") == []

    async def test_conversations_by_owner_page_in_lexical_order(self, store: Any) -> None:
        mine = sorted(f"m{i:02d}" for i in range(7))
        for i, cid in enumerate(reversed(mine)):
            await store.append(_batch(cid, "a"), owner="alice")
            await store.append(_batch(f"o{i}", "a"), owner="bob")
        await store.append(_batch("x", "a"))
        assert await store.conversations(owner="alice") == mine
        assert await store.conversations(owner="alice", limit=3) == mine[:3]
        assert await store.conversations(owner="alice", after=mine[2], limit=3) == mine[3:6]
        assert await store.conversations(owner="alice", after=mine[-1]) == []
        assert len(await store.conversations()) == 15

    async def test_conversations_by_owner_leave_out_closed_ones(self, store: Any) -> None:
        for cid in ("a", "b", "c"):
            await store.append(_batch(cid, "1"), owner="alice")
        await store.clear("a")
        await store.retain("b", _now() - _HOUR)
        assert await store.conversations(owner="alice") == ["c"]

    async def test_owners_keep_hostile_strings_apart(self, store: Any) -> None:
        owners = [h[:256] for h in HOSTILE_IDS]
        for i, owner in enumerate(owners):
            await store.append(_batch(f"c{i:02d}", "a"), owner=owner)
        for i, owner in enumerate(owners):
            assert await store.conversations(owner=owner) == [f"c{i:02d}"], owner

    @pytest.mark.parametrize("owner", _BAD_OWNERS, ids=lambda o: repr(o)[:12])
    async def test_invalid_owners_rejected_before_io(self, store: Any, owner: str) -> None:
        batch = _batch("c", "a1")
        rejected = False
        with anyio.CancelScope() as scope:
            scope.cancel()  # the first checkpoint would raise Cancelled instead
            with pytest.raises(ValueError, match="owner"):
                await store.append(batch, owner=owner)
            with pytest.raises(ValueError, match="owner"):
                await store.append_release_turn(batch, "h", owner=owner)
            with pytest.raises(ValueError, match="owner"):
                await store.erase_owned(owner)
            with pytest.raises(ValueError, match="owner"):
                await store.conversations(owner=owner)
            rejected = True
        assert rejected, "a store step suspended before rejecting an invalid owner"
        assert await store.read("c") == []

    # -- retention --------------------------------------------------------------------

    async def test_retain_in_the_past_expires_at_once(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.append(_batch("d", "a1"), owner="alice")
        await store.retain("c", _now() - _HOUR)
        await _closed_for_ever(store, "c")
        assert await store.conversations(owner="alice") == ["d"]
        assert _texts(await store.read("d")) == ["d/a1/0", "d/a1/1"]

    async def test_retain_in_the_future_keeps_it_until_then(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        await store.retain("c", _now() + _HOUR)
        await store.append(_batch("c", "a2"))
        assert len(await store.read("c")) == 4
        assert await store.expire() == 0
        assert await store.expire(_now() + 2 * _HOUR) == 1
        await _closed_for_ever(store, "c")

    async def test_retain_before_the_first_append_waits_for_it(self, store: Any) -> None:
        await store.retain("c", _now() + _HOUR)
        await store.append(_batch("c", "a1"))
        assert await store.conversations() == ["c"]
        assert await store.expire(_now() + 2 * _HOUR) == 1
        await _closed_for_ever(store, "c")

    async def test_retain_of_a_closed_conversation_raises(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.retain("c", None)
        await store.erase("e")
        with pytest.raises(ConversationClosedError):
            await store.retain("e", _now() + _HOUR)

    async def test_retain_rejects_bad_arguments_before_io(self, store: Any) -> None:
        naive = _dt.datetime.now()
        await self._rejects_without_suspending(ValueError, store.retain, "c", naive)
        await self._rejects_without_suspending(TypeError, store.retain, "c", "tomorrow")
        await self._rejects_without_suspending(TypeError, store.retain, "c", 3600)
        await self._rejects_without_suspending(InvalidConversationIDError, store.retain, " c", None)

    async def test_store_retention_expires_a_conversation_after_its_last_append(self) -> None:
        ttl = self.retention_ttl
        async with self._opened(retention=_dt.timedelta(seconds=ttl)) as store:
            await store.append(_batch("c", "a1"), owner="alice")
            await store.append(_batch("kept", "a1"))
            await store.retain("kept", None)  # its own setting: never expires
            await anyio.sleep(ttl * 0.6)
            await store.append(_batch("c", "a2"))
            await anyio.sleep(ttl * 0.6)  # 1.2 ttl after the first append, 0.6 after the last
            assert len(await store.read("c")) == 4
            await anyio.sleep(ttl * 0.8)
            await _closed_for_ever(store, "c")
            assert await store.conversations() == ["kept"]
            assert await store.conversations(owner="alice") == []
            assert await store.expire() == 1
            await _closed_for_ever(store, "c")
            assert len(await store.read("kept")) == 2

    async def test_expire_pages_and_counts(self, store: Any) -> None:
        expired = [f"gone{i}" for i in range(5)]
        for cid in [*expired, "live1", "live2"]:
            await store.append(_batch(cid, "a1"))
        for cid in expired:
            await store.retain(cid, _now() - _HOUR)
        assert await store.conversations() == ["live1", "live2"]
        assert [await store.expire(limit=2) for _ in range(4)] == [2, 2, 1, 0]
        for cid in expired:
            await _closed_for_ever(store, cid)
        assert await store.conversations() == ["live1", "live2"]
        assert len(await store.read("live1")) == 2

    async def test_expire_keeps_a_cleared_conversation_closed(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        await store.retain("c", _now() + _HOUR)
        await store.clear("c")
        assert await store.expire(_now() + 2 * _HOUR) in (0, 1)
        await _closed_for_ever(store, "c")

    async def test_expired_conversation_keeps_its_owner_for_erase_owned(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.retain("c", _now() - _HOUR)
        assert await store.expire() == 1
        receipts = await store.erase_owned("alice")
        assert [(r.batches, r.bytes, r.digest) for r in receipts] == [(0, 0, EMPTY_DIGEST)]
        assert await store.check_erased(receipts[0]) == []
        assert await store.erase_owned("alice") == []

    @pytest.mark.parametrize("limit", [0, -1, True, 1.5, None, "10"])
    async def test_expire_rejects_bad_limits_before_io(self, store: Any, limit: Any) -> None:
        rejected = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(ValueError, match="limit"):
                await store.expire(limit=limit)
            with pytest.raises(ValueError, match="limit"):
                await store.erase_owned("alice", limit=limit)
            rejected = True
        assert rejected, "a store step suspended before rejecting an invalid limit"

    async def test_expire_rejects_a_naive_now_before_io(self, store: Any) -> None:
        await self._rejects_without_suspending(ValueError, store.expire, _dt.datetime.now())

    # -- read_meta (DESIGN §6n: what export writes beside the tree) --------------------

    async def test_read_meta_of_unknown_conversation_is_empty(self, store: Any) -> None:
        assert await store.read_meta("never-written") == ConversationMeta()

    async def test_read_meta_reads_owner_retention_and_recorded_moves(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.append(_batch("c", "a2"))
        await store.move_head("c", "a1", expected_head="a2", move_id="m2")
        await store.move_head("c", "", expected_head="a1", move_id="m1")
        await store.move_head("c", "a2", expected_head="")  # no move id: nothing recorded
        meta = await store.read_meta("c")
        assert meta == ConversationMeta("alice", None, False, (("m1", ""), ("m2", "a1")))
        until = _now() + _HOUR
        await store.retain("c", until)
        meta = await store.read_meta("c")
        assert meta.retained is True and meta.owner == "alice"
        assert meta.expires_at is not None and abs(meta.expires_at - until.timestamp()) < 0.01
        await store.retain("c", None)
        assert (await store.read_meta("c")).expires_at is None
        assert (await store.read_meta("c")).retained is True
        await store.append(_batch("d", "a1"))
        assert await store.read_meta("d") == ConversationMeta()

    async def test_read_meta_after_clear_keeps_the_owner_and_after_erase_nothing(
        self, store: Any
    ) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.move_head("c", "", expected_head="a1", move_id="m1")
        await store.clear("c")
        meta = await store.read_meta("c")
        assert meta.owner == "alice" and meta.moves == () and meta.expires_at is None
        await store.erase("c")
        assert await store.read_meta("c") == ConversationMeta(closure="erased")

    async def test_read_meta_closure_says_cleared_or_erased(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        assert (await store.read_meta("c")).closure is None
        assert (await store.read_meta("never-written")).closure is None
        await store.clear("c")
        assert (await store.read_meta("c")).closure == "cleared"
        await store.clear("c")  # idempotent
        assert (await store.read_meta("c")).closure == "cleared"
        await store.clear("cleared-unwritten")
        assert (await store.read_meta("cleared-unwritten")).closure == "cleared"
        for cid in ("c", "open", "never"):
            if cid == "open":
                await store.append(_batch(cid, "a1"), owner="bob")
            await store.erase(cid)
            assert await store.read_meta(cid) == ConversationMeta(closure="erased"), cid
            await store.clear(cid)  # an erased id stays erased
            assert await store.read_meta(cid) == ConversationMeta(closure="erased"), cid

    async def test_read_meta_closure_says_expired_before_and_after_expire(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.append(_batch("d", "a1"))
        await store.append(_batch("e", "a1"))
        past = _now() - _HOUR
        for cid in ("c", "d", "e"):
            await store.retain(cid, past)
            assert (await store.read_meta(cid)).closure == "expired", cid
        await store.clear("e")  # a clear after it expired: cleared
        assert (await store.read_meta("e")).closure == "cleared"
        assert await store.expire() == 2
        meta = await store.read_meta("c")
        assert (meta.closure, meta.owner) == ("expired", "alice")
        assert (await store.read_meta("d")).closure == "expired"
        assert (await store.read_meta("e")).closure == "cleared"
        await store.clear("d")  # cleared after expire() removed it: the clear closed it
        assert (await store.read_meta("d")).closure == "cleared"
        await store.erase("c")
        assert await store.read_meta("c") == ConversationMeta(closure="erased")

    async def test_read_meta_of_store_wide_retention_is_not_retained(self) -> None:
        async with self._opened(retention=_HOUR) as store:
            before = _now().timestamp()
            await store.append(_batch("c", "a1"))
            meta = await store.read_meta("c")
            assert meta.retained is False and meta.expires_at is not None
            # The store's clock (a server's for a server store) may differ a little.
            assert abs(meta.expires_at - (before + 3600)) < 60

    async def test_read_meta_of_invalid_id_raises_before_io(self, store: Any) -> None:
        await self._rejects_without_suspending(InvalidConversationIDError, store.read_meta, " c")

    # -- erase ------------------------------------------------------------------------

    async def test_erase_receipt_counts_batches_bytes_and_digest(self, store: Any) -> None:
        batches = [
            Batch("c", "a1", rich_messages()),
            _batch("c", "a2"),
            _batch("c", "a3"),
        ]
        for batch in batches:
            await store.append(batch, owner="alice")
        before = _now()
        receipt = await store.erase("c")
        after = _now()
        assert type(receipt) is ErasureReceipt
        assert receipt.batches == 3
        assert receipt.bytes == sum(len(b.encoded_messages) for b in batches)
        assert receipt.digest == erasure_digest(b.digest for b in batches)
        assert receipt.tombstone.startswith("hmac-sha256:")
        assert receipt.store in STORE_KINDS
        # By the store's clock: allow a server clock a minute apart from this one.
        assert before - _dt.timedelta(minutes=1) <= receipt.erased_at
        assert receipt.erased_at <= after + _dt.timedelta(minutes=1)
        assert ErasureReceipt.from_json(receipt.to_json()) == receipt
        if callable(getattr(store, "move_head", None)):
            # Every batch of every branch (DESIGN §6h), in stored order.
            tree = [_batch("b", "a1"), _batch("b", "a2"), _batch("b", "a3")]
            await store.append(tree[0])
            await store.append(tree[1])
            await store.move_head("b", "a1", expected_head="a2")
            await store.append(tree[2])
            branched = await store.erase("b")
            assert branched.batches == 3
            assert branched.digest == erasure_digest(b.digest for b in tree)
            assert branched.bytes == sum(len(b.encoded_messages) for b in tree)

    async def test_erased_conversation_is_closed_for_ever(self, store: Any) -> None:
        batch = _batch("c", "a1")
        await store.append(batch, owner="alice")
        await store.erase("c")
        await _closed_for_ever(store, "c")
        assert await store.conversations(owner="alice") == []
        with pytest.raises(ConversationClosedError):
            await store.append(batch)  # a retry of the accepted batch too

    async def test_erase_again_gives_an_empty_receipt(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        first = await store.erase("c")
        again = await store.erase("c")
        assert first.batches == 1
        assert (again.tombstone, again.batches, again.bytes, again.digest) == (
            first.tombstone,
            0,
            0,
            EMPTY_DIGEST,
        )
        assert await store.check_erased(again) == []

    async def test_erase_of_an_unknown_id_closes_it(self, store: Any) -> None:
        receipt = await store.erase("never-written")
        assert (receipt.batches, receipt.bytes, receipt.digest) == (0, 0, EMPTY_DIGEST)
        await _closed_for_ever(store, "never-written")
        assert await store.check_erased(receipt) == []

    async def test_erase_of_a_cleared_conversation_removes_its_closure(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.clear("c")
        receipt = await store.erase("c")
        assert receipt.batches == 0
        assert await store.check_erased(receipt) == []
        await _closed_for_ever(store, "c")

    async def test_erase_drops_the_leases(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        assert await store.acquire_turn("c", "h1", 30) is True
        await store.erase("c")
        assert await store.release_turn("c", "h1") is False
        assert await store.acquire_turn("c", "h2", 30) is True

    async def test_erase_makes_the_cache_forget(self, store: Any) -> None:
        cache = getattr(store, "history_cache", None)
        if not isinstance(cache, HistoryCache):
            pytest.skip(f"{type(store).__name__} has no history_cache (a HistoryCache)")
        batch = _batch("c", "a1")
        await store.append(batch)
        cache.remember(batch)
        assert cache.messages("c", batch.digest) is not None
        await store.erase("c")
        assert cache.messages("c", batch.digest) is None

    async def test_erase_keeps_hostile_ids_apart(self, store: Any) -> None:
        for cid in HOSTILE_IDS:
            await store.append(_batch(cid, "a1", "t"), owner="alice")
        gone = ("a:", "a*", "*", "100%", "scope:history:x", "[ab]")
        for cid in (*gone, "a", "scope"):  # the last two: prefixes never written
            await store.erase(cid)
        kept = [cid for cid in HOSTILE_IDS if cid not in gone]
        for cid in kept:
            assert _texts(await store.read(cid)) == ["t/0", "t/1"], cid
        assert await store.conversations(owner="alice") == sorted(kept)

    @pytest.mark.parametrize("bad", ["", " x", "x" * 513, None])
    async def test_erase_rejects_invalid_ids_before_io(self, store: Any, bad: Any) -> None:
        await self._rejects_without_suspending(InvalidConversationIDError, store.erase, bad)

    async def test_check_erased_is_empty_after_erase(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        await store.append(_batch("d", "a1"), owner="alice")
        receipt = await store.erase("c")
        assert await store.check_erased(receipt) == []
        assert _texts(await store.read("d")) == ["d/a1/0", "d/a1/1"]

    async def test_erase_receipts_name_the_conversation_in_memory_only(self, store: Any) -> None:
        # DESIGN §6n: the service gets each erased id once, to erase its own copies;
        # the receipt's JSON (what is kept) never holds it.
        await store.append(_batch("c-erased", "a1"), owner="alice")
        await store.append(_batch("d-erased", "a1"), owner="alice")
        receipt = await store.erase("c-erased")
        owned = await store.erase_owned("alice")
        assert receipt.conversation_id == "c-erased"
        assert [str(r.conversation_id) for r in owned] == ["d-erased"]
        for erased in (receipt, *owned):
            assert b"-erased" not in erased.to_json()
            assert "-erased" not in repr(erased)
            read_back = ErasureReceipt.from_json(erased.to_json())
            assert read_back == erased and read_back.conversation_id is None

    async def test_check_erased_reports_a_forged_receipt(self, store: Any) -> None:
        await store.append(_batch("c", "a1"))
        real = await store.erase("c")
        forged = ErasureReceipt(
            "hmac-sha256:" + "0" * 64, EMPTY_DIGEST, 0, 0, real.erased_at, real.store
        )
        problems = await store.check_erased(forged)
        assert problems and all(type(p) is str and p for p in problems)
        with pytest.raises(TypeError):
            await store.check_erased(real.to_json())

    async def test_durable_erasure_survives_reopen(self, store: Any) -> None:
        await store.append(_batch("c", "a1"), owner="alice")
        receipt = await store.erase("c")
        async with self._reopened(store) as handle:
            await _closed_for_ever(handle, "c")
            assert await handle.check_erased(receipt) == []
            assert await handle.erase_owned("alice") == []

    async def test_erase_racing_appends_is_all_or_nothing(self, store: Any) -> None:
        landed: list[int] = []
        started = anyio.Event()

        async def appender() -> None:
            for i in range(30):
                try:
                    await store.append(_batch("c", f"a{i}"))
                except ConversationClosedError:
                    return
                landed.append(i)
                if len(landed) == 5:
                    started.set()
                await anyio.lowlevel.checkpoint()

        receipts: list[ErasureReceipt] = []

        async def eraser() -> None:
            await started.wait()
            receipts.append(await store.erase("c"))

        async with anyio.create_task_group() as group:
            group.start_soon(appender)
            group.start_soon(eraser)
        # Every batch that landed was erased with it, and none landed after.
        assert receipts[0].batches == len(landed)
        assert receipts[0].digest == erasure_digest(_batch("c", f"a{i}").digest for i in landed)
        await _closed_for_ever(store, "c")

    async def test_erase_under_load_loses_nothing_of_other_conversations(self, store: Any) -> None:
        tasks, rounds = self.erase_under_load_tasks, 10
        doomed = [f"gone{i}" for i in range(20)]
        for cid in doomed:
            await store.append(_batch(cid, "a1"), owner="alice")
            await store.append(_batch(cid, "a2"))

        async def load(n: int) -> None:
            for j in range(rounds):
                await store.append(_batch(f"load{n}", f"a{j}"), owner="bob")
                await anyio.lowlevel.checkpoint()  # let the erasures interleave

        receipts: list[ErasureReceipt] = []

        async def erase_all() -> None:
            for cid in doomed:
                receipts.append(await store.erase(cid))

        async with anyio.create_task_group() as group:
            for n in range(tasks):
                group.start_soon(load, n)
            group.start_soon(erase_all)
        assert [r.batches for r in receipts] == [2] * len(doomed)
        for n in range(tasks):
            texts = _texts(await store.read(f"load{n}"))
            assert texts == [f"load{n}/a{j}/{k}" for j in range(rounds) for k in (0, 1)]
        assert await store.conversations() == sorted(f"load{n}" for n in range(tasks))
        assert len(await store.conversations(owner="bob")) == tasks

    # -- erase_owned and erase_owner --------------------------------------------------

    async def test_erase_owned_pages_through_open_cleared_and_expired(self, store: Any) -> None:
        mine = [f"m{i}" for i in range(5)]
        for cid in mine:
            await store.append(_batch(cid, "a1"), owner="alice")
        await store.append(_batch("other", "a1"), owner="bob")
        await store.clear("m1")
        await store.retain("m2", _now() - _HOUR)
        pages = [await store.erase_owned("alice", limit=2) for _ in range(4)]
        assert [len(page) for page in pages] == [2, 2, 1, 0]
        receipts = [r for page in pages for r in page]
        assert len({r.tombstone for r in receipts}) == 5
        # m1 was cleared (nothing left); m2 expired (removed or not yet by then).
        assert sorted(r.batches for r in receipts) in ([0, 0, 1, 1, 1], [0, 1, 1, 1, 1])
        for receipt in receipts:
            assert await store.check_erased(receipt) == []
        for cid in mine:
            await _closed_for_ever(store, cid)
        assert await store.conversations() == ["other"]
        assert await store.conversations(owner="bob") == ["other"]

    async def test_erase_owner_cancelled_midway_finishes_when_run_again(self, store: Any) -> None:
        count = self.erase_owner_conversations
        await erase_owner_resumes(store, count)


async def erase_owner_resumes(store: Any, count: int) -> None:
    """``count`` conversations of one owner (and some of another), erased by pages that
    are cancelled midway (between pages and inside a store call), then by
    ``erase_owner`` again: none is left, no receipt is issued twice, the other owner's
    conversations are intact. (Also run with 10,000 conversations by scope's own
    tests.)"""
    for i in range(count):
        await store.append(_batch(f"c{i:05d}", "a1", "t"), owner="alice")
    for i in range(3):
        await store.append(_batch(f"keep{i}", "a1", "t"), owner="bob")
    receipts: list[ErasureReceipt] = []
    page = max(1, count // 20)
    with anyio.CancelScope() as scope:  # cancelled between two pages, about half-way
        while True:
            receipts.extend(await store.erase_owned("alice", limit=page))
            if len(receipts) >= count // 2:
                scope.cancel()
            await anyio.lowlevel.checkpoint()
    for delay in (0.0, 0.0005, 0.002, 0.01):  # cancelled inside a store call
        with anyio.move_on_after(delay):
            receipts.extend(await store.erase_owned("alice", limit=page))
    receipts.extend(await erase_owner(store, "alice", page=page))
    assert await erase_owner(store, "alice") == []
    assert await store.conversations(owner="alice") == []
    tombstones = [r.tombstone for r in receipts]
    assert len(set(tombstones)) == len(tombstones), "a receipt was issued twice"
    # Every receipt erased a batch: none is for a conversation erased before.
    assert {r.batches for r in receipts} == {1}
    assert count // 2 <= len(receipts) <= count
    for cid in (f"c{i:05d}" for i in (0, count // 2, count - 1)):
        await _closed_for_ever(store, cid)
    assert await store.conversations() == ["keep0", "keep1", "keep2"]
    assert await store.conversations(owner="bob") == ["keep0", "keep1", "keep2"]
