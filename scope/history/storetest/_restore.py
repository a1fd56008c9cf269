"""The restore rules of DESIGN §6n (``scope.history.Restorer``): closed conversations and
erasure tombstones listed by one store and written back into another. They run on a
store that is a ``Restorer`` and are skipped on one that is not."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pytest

from scope.errors import (
    ConversationClosedError,
    InvalidConversationIDError,
    InvalidReceiptError,
    RestoreConflictError,
)
from scope.history._batch import Batch
from scope.history._erasure import new_secret, tombstone
from scope.history._meta import ConversationMeta
from scope.history._restore import ClosedConversation, Restorer
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import HOSTILE_IDS, Base, _turn

_HOUR = _dt.timedelta(hours=1)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _batch(cid: str, aid: str) -> Batch:
    return Batch(cid, aid, _turn(f"{cid}/{aid}"))


def _restorer(store: Any) -> Any:
    if not isinstance(store, Restorer):
        pytest.skip(f"{type(store).__name__} is no scope.history.Restorer")
    return store


async def _all_closed(store: Any) -> list[ClosedConversation]:
    closed: list[ClosedConversation] = []
    after = None
    while page := await store.closed_conversations(after=after, limit=2):
        closed += page
        after = page[-1].conversation_id
    return closed


async def _all_tombstones(store: Any) -> list[str]:
    marks: list[str] = []
    after = None
    while page := await store.tombstones(after=after, limit=2):
        marks += page
        after = page[-1]
    return marks


async def _closed_store(store: Any) -> dict[str, tuple[str, str | None]]:
    """Fill ``store`` with one conversation of each closed kind (and an open and an
    erased one, which are not closed); what each closed id's closure and owner are."""
    await store.append(_batch("open", "a1"), owner="alice")
    await store.append(_batch("cleared", "a1"), owner="alice")
    await store.append(_batch("cleared", "a2"))
    await store.clear("cleared")
    await store.clear("never-written")
    await store.append(_batch("removed", "a1"), owner="bob")
    await store.retain("removed", _now() - _HOUR)
    assert await store.expire() == 1
    await store.append(_batch("due", "a1"))
    await store.retain("due", _now() - _HOUR)  # expired, not removed yet
    await store.append(_batch("erased", "a1"), owner="alice")
    await store.erase("erased")
    return {
        "cleared": ("cleared", "alice"),
        "due": ("expired", None),
        "never-written": ("cleared", None),
        "removed": ("expired", "bob"),
    }


@tests_on_anyio_runner
class RestoreRules(Base):
    """The rules of ``scope.history.Restorer`` (see its docstrings)."""

    # -- listing ----------------------------------------------------------------------

    async def test_closed_conversations_lists_cleared_and_expired_in_order(
        self, store: Any
    ) -> None:
        store = _restorer(store)
        expected = await _closed_store(store)
        closed = await _all_closed(store)
        assert [c.conversation_id for c in closed] == sorted(expected)
        for entry in closed:
            cid = entry.conversation_id
            assert (entry.closure, entry.owner) == expected[cid], cid
            assert entry.length == (await store.read_view(cid)).length, cid
            meta = await store.read_meta(cid)
            assert (meta.closure, meta.owner) == expected[cid], cid
        assert await store.closed_conversations() == closed
        assert await store.closed_conversations(after="due", limit=1) == [closed[2]]
        assert await store.closed_conversations(after="zzz") == []

    @pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2", None])
    async def test_closed_conversations_rejects_bad_limits(self, store: Any, limit: Any) -> None:
        store = _restorer(store)
        with pytest.raises(ValueError, match="limit"):
            await store.closed_conversations(limit=limit)
        with pytest.raises(ValueError, match="limit"):
            await store.tombstones(limit=limit)

    async def test_closed_conversations_rejects_a_bad_after(self, store: Any) -> None:
        store = _restorer(store)
        with pytest.raises(InvalidConversationIDError):
            await store.closed_conversations(after="")

    # -- restore_closed ---------------------------------------------------------------

    async def test_restore_closed_writes_what_was_listed(self, store: Any) -> None:
        source = _restorer(store)
        await _closed_store(source)
        closed = await _all_closed(source)
        async with self._opened() as target:
            for entry in closed:
                assert await target.restore_closed(entry) is True
            assert await _all_closed(target) == closed
            for entry in closed:
                cid = entry.conversation_id
                meta = await target.read_meta(cid)
                assert meta == ConversationMeta(entry.owner, closure=entry.closure)
                view = await target.read_view(cid)
                assert view.closed is True and view.messages == ()
                assert view.length == entry.length
                assert await target.read(cid) == []
                with pytest.raises(ConversationClosedError):
                    await target.append(_batch(cid, "after"))
                with pytest.raises(ConversationClosedError):
                    await target.retain(cid, None)
                with pytest.raises(ConversationClosedError):
                    await target.move_head(cid, "", expected_head="")
            assert await target.conversations() == []
            assert await target.tombstones() == []

    async def test_restore_closed_again_writes_nothing(self, store: Any) -> None:
        store = _restorer(store)
        entry = ClosedConversation("c", "cleared", "alice", 3)
        assert await store.restore_closed(entry) is True
        assert await store.restore_closed(entry) is False
        assert await store.closed_conversations() == [entry]

    async def test_restored_owner_is_found_by_erase_owned(self, store: Any) -> None:
        store = _restorer(store)
        await store.restore_closed(ClosedConversation("c", "cleared", "alice", 2))
        await store.restore_closed(ClosedConversation("d", "expired", "alice"))
        await store.restore_closed(ClosedConversation("e", "expired", "bob"))
        receipts = await store.erase_owned("alice")
        assert [r.conversation_id for r in receipts] == ["c", "d"]
        for receipt in receipts:
            assert await store.check_erased(receipt) == []
        assert [c.conversation_id for c in await store.closed_conversations()] == ["e"]
        assert len(await store.tombstones()) == 2
        assert (await store.read_meta("c")).closure == "erased"

    async def test_restore_closed_keeps_hostile_ids_apart(self, store: Any) -> None:
        store = _restorer(store)
        entries = [
            ClosedConversation(cid, "cleared", "alice", n) for n, cid in enumerate(HOSTILE_IDS)
        ]
        for entry in entries:
            assert await store.restore_closed(entry) is True
        assert await _all_closed(store) == sorted(entries, key=lambda e: e.conversation_id)

    async def test_restore_closed_refuses_an_id_holding_batches(self, store: Any) -> None:
        store = _restorer(store)
        await store.append(_batch("c", "a1"), owner="alice")
        with pytest.raises(RestoreConflictError):
            await store.restore_closed(ClosedConversation("c", "cleared", "alice"))
        await store.append(_batch("due", "a1"))
        await store.retain("due", _now() - _HOUR)
        [due] = await store.closed_conversations()  # expired, its batches not removed yet
        with pytest.raises(RestoreConflictError):
            await store.restore_closed(due)
        assert await store.read("c") == _turn("c/a1")
        assert await store.conversations() == ["c"]
        assert [c.conversation_id for c in await store.closed_conversations()] == ["due"]

    @pytest.mark.parametrize(
        "other",
        [
            ClosedConversation("c", "expired", "alice", 2),
            ClosedConversation("c", "cleared", "bob", 2),
            ClosedConversation("c", "cleared", None, 2),
            ClosedConversation("c", "cleared", "alice", 3),
        ],
    )
    async def test_restore_closed_refuses_another_closure(
        self, store: Any, other: ClosedConversation
    ) -> None:
        store = _restorer(store)
        held = ClosedConversation("c", "cleared", "alice", 2)
        await store.restore_closed(held)
        with pytest.raises(RestoreConflictError):
            await store.restore_closed(other)
        assert await store.closed_conversations() == [held]

    async def test_restore_closed_refuses_an_erased_id(self, store: Any) -> None:
        store = _restorer(store)
        await store.erase("c")
        with pytest.raises(RestoreConflictError):
            await store.restore_closed(ClosedConversation("c", "cleared"))
        assert await store.closed_conversations() == []
        assert (await store.read_meta("c")).closure == "erased"

    # -- tombstones and the secret ----------------------------------------------------

    async def test_tombstones_list_the_erased_ids_marks_in_order(self, store: Any) -> None:
        store = _restorer(store)
        receipts = [await store.erase(cid) for cid in ("a", "b", "c", "d", "e")]
        marks = sorted(r.tombstone for r in receipts)
        assert await _all_tombstones(store) == marks
        assert await store.tombstones() == marks
        assert await store.tombstones(after=marks[1], limit=2) == marks[2:4]
        secret = await store.store_secret()
        assert type(secret) is bytes and len(secret) == 32
        assert marks == sorted(tombstone(secret, cid) for cid in "abcde")

    async def test_store_secret_survives_reopen(self, store: Any) -> None:
        store = _restorer(store)
        async with self._reopened(store) as handle:
            assert await handle.store_secret() == await store.store_secret()

    async def test_restore_erasures_adopts_the_secret_of_an_empty_store(self, store: Any) -> None:
        source = _restorer(store)
        await source.append(_batch("gone", "a1"), owner="alice")
        receipts = [await source.erase("gone"), await source.erase("never")]
        secret, marks = await source.store_secret(), await source.tombstones()
        async with self._opened() as target:
            assert await target.restore_erasures(secret, marks) == 2
            assert await target.store_secret() == secret
            assert await target.tombstones() == marks
            for receipt in receipts:
                assert await target.check_erased(receipt) == []
            for cid in ("gone", "never"):
                assert await target.read_meta(cid) == ConversationMeta(closure="erased")
                with pytest.raises(ConversationClosedError):
                    await target.append(_batch(cid, "again"), owner="alice")
            assert await target.restore_erasures(secret, marks) == 0  # a re-run
            await target.append(_batch("new", "a1"))
            assert await target.restore_erasures(secret, marks) == 0  # same secret: fine

    async def test_restore_erasures_adds_to_a_store_with_that_secret(self, store: Any) -> None:
        store = _restorer(store)
        await store.append(_batch("kept", "a1"))
        mine = (await store.erase("mine")).tombstone
        theirs = tombstone(await store.store_secret(), "theirs")
        assert await store.restore_erasures(await store.store_secret(), [theirs, mine]) == 1
        assert await store.tombstones() == sorted([mine, theirs])
        assert (await store.read_meta("theirs")).closure == "erased"
        assert await store.read("kept") == _turn("kept/a1")

    @pytest.mark.parametrize("held_as", ["open", "cleared"])
    async def test_restore_erasures_refuses_a_tombstone_of_a_held_id(
        self, store: Any, held_as: str
    ) -> None:
        store = _restorer(store)
        await store.append(_batch("c", "a1"), owner="alice")
        if held_as == "cleared":
            await store.clear("c")
        secret = await store.store_secret()
        other = tombstone(secret, "other")
        with pytest.raises(RestoreConflictError):  # erase it first: an erased id holds nothing
            await store.restore_erasures(secret, [other, tombstone(secret, "c")])
        assert await store.tombstones() == []
        assert (await store.read_meta("c")).closure == (None if held_as == "open" else "cleared")
        if held_as == "open":
            assert await store.read("c") == _turn("c/a1")

    @pytest.mark.parametrize("used_by", ["append", "clear", "erase"])
    async def test_restore_erasures_refuses_another_secret_in_a_used_store(
        self, store: Any, used_by: str
    ) -> None:
        store = _restorer(store)
        if used_by == "append":
            await store.append(_batch("c", "a1"))
        elif used_by == "clear":
            await store.clear("c")  # an id closed without a batch is held too
        else:
            await store.erase("c")
        secret, before = await store.store_secret(), await store.tombstones()
        other = new_secret()
        with pytest.raises(RestoreConflictError):
            await store.restore_erasures(other, [tombstone(other, "x")])
        assert await store.store_secret() == secret
        assert await store.tombstones() == before

    @pytest.mark.parametrize(
        ("secret", "error"),
        [(b"x" * 31, ValueError), (b"x" * 33, ValueError), ("x" * 32, TypeError)],
    )
    async def test_restore_erasures_rejects_a_bad_secret(
        self, store: Any, secret: Any, error: type[Exception]
    ) -> None:
        store = _restorer(store)
        with pytest.raises(error, match="secret"):
            await store.restore_erasures(secret, [])
        assert await store.tombstones() == []

    @pytest.mark.parametrize(
        "mark", ["", "hmac-sha256:" + "A" * 64, "hmac-sha256:" + "0" * 63, "sha256:" + "0" * 64]
    )
    async def test_restore_erasures_rejects_a_bad_tombstone(self, store: Any, mark: str) -> None:
        store = _restorer(store)
        secret = await store.store_secret()
        good = tombstone(secret, "good")
        with pytest.raises(InvalidReceiptError):
            await store.restore_erasures(secret, [good, mark])
        assert await store.tombstones() == []

    async def test_restore_closed_over_an_id_with_only_a_retention_setting(
        self, store: Any
    ) -> None:
        store = _restorer(store)
        await store.retain("c", _now() + _HOUR)  # waits for a first append that never came
        entry = ClosedConversation("c", "cleared", "alice", 2)
        assert await store.restore_closed(entry) is True
        assert await store.read_meta("c") == ConversationMeta("alice", closure="cleared")
        assert await store.closed_conversations() == [entry]
