"""The core rules: round trips, retries, order, closure, listing, validation,
batches, concurrency, cancellation, durability."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import anyio.lowlevel
import anyio.pytest_plugin
import pytest

from scope.chat import (
    Message,
    ToolOutput,
    ToolResult,
    assistant_message,
    media_part,
    reasoning_part,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.codec import encode_messages, from_json, to_json
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidConversationIDError,
)
from scope.history._batch import Batch, Receipt
from scope.history._ids import AppendID, ConversationID
from scope.history._protocols import Store
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import (
    _BAD_ID_NAMES,
    _BAD_IDS,
    HOSTILE_IDS,
    Base,
    _flatten,
    _texts,
    _turn,
    rich_messages,
)
from scope.jsonvalue import RawJSON
from scope.media import Media


@tests_on_anyio_runner
class CoreRules(Base):
    """The core rules: round trips, retries, order, closure, listing, validation,
    batches, concurrency, cancellation, durability."""

    # -- shape ------------------------------------------------------------------------

    async def test_store_implements_the_protocol(self, store: Any) -> None:
        assert isinstance(store, Store)

    # -- empty and unknown ------------------------------------------------------------

    async def test_read_of_unknown_conversation_is_empty(self, store: Any) -> None:
        assert await store.read("never-written") == []

    async def test_conversations_of_empty_store_is_empty(self, store: Any) -> None:
        assert await store.conversations() == []

    async def test_read_returns_a_new_list_each_time(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        first = await store.read("c")
        assert type(first) is list
        first.clear()
        second = await store.read("c")
        assert _texts(second) == ["t/0", "t/1"]
        assert second is not await store.read("c")

    async def test_str_and_conversation_id_are_the_same_conversation(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        assert await store.read(ConversationID("c")) == await store.read("c")
        await store.clear(ConversationID("c"))
        assert await store.read("c") == []

    # -- exact round trip -------------------------------------------------------------

    async def test_round_trip_is_exact_for_every_part_kind(self, store: Any) -> None:
        messages = rich_messages()
        batch = Batch("rich", "a1", messages)
        await store.append(batch)
        stored = await store.read("rich")
        assert stored == messages
        # Byte-exact: the stored messages digest to the batch's digest.
        assert encode_messages(stored) == batch.encoded_messages
        assert Batch("rich", "a1", stored).digest == batch.digest

    async def test_round_trip_keeps_media_bytes_and_signatures(self, store: Any) -> None:
        data = bytes(range(256)) * 64
        messages = [
            user_message(media_part(Media.from_bytes("application/octet-stream", data))),
            assistant_message(reasoning_part("r", signature=bytes(range(255, -1, -1)))),
        ]
        await store.append(Batch("bytes", "a1", messages))
        stored = await store.read("bytes")
        media = stored[0].parts[0].media
        assert media is not None and media.source.data == data
        assert stored[1].parts[0].signature == bytes(range(255, -1, -1))

    async def test_round_trip_keeps_number_spellings(self, store: Any) -> None:
        spellings = ["2.50", "1e0", "1E+2", "1.0", "-0", "0.10", "10"]
        messages = [
            user_message(
                text_part(
                    "n", metadata={f"k{i}": RawJSON.parse(s) for i, s in enumerate(spellings)}
                )
            ),
            assistant_message(tool_call_part("c1", "t")),
            tool_message(
                ToolResult("c1", "t", ToolOutput.of_json(RawJSON.parse('{"v":[2.50,1e0,-0]}')))
            ),
        ]
        await store.append(Batch("numbers", "a1", messages))
        stored = await store.read("numbers")
        assert stored == messages
        assert stored[0].parts[0].metadata["k0"].bytes == b"2.50"
        assert [stored[0].parts[0].metadata[f"k{i}"].bytes.decode() for i in range(7)] == (
            spellings
        )
        output = stored[2].parts[0].tool_result
        assert output is not None and output.output.details is not None
        assert output.output.details.bytes == b'{"v":[2.50,1e0,-0]}'

    async def test_round_trip_of_a_one_mebibyte_message(self, store: Any) -> None:
        chunk = "héllo wörld 🙂 ɐ "
        text = (chunk * ((1 << 20) // len(chunk.encode()) + 1))[: 1 << 20]
        assert len(text.encode()) >= 1 << 20
        batch = Batch("big", "a1", [user_message(text), assistant_message("ok")])
        await store.append(batch)
        stored = await store.read("big")
        assert stored[0].text == text
        assert encode_messages(stored) == batch.encoded_messages

    async def test_unicode_ids_round_trip(self, store: Any) -> None:
        ids = ["日本語", "emoji 🙂", "ñandú", "Ελληνικά", "עברית", "a\u00a0b"]
        for cid in ids:
            await store.append(Batch(cid, f"append {cid}", _turn(cid)))
        for cid in ids:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]
        assert await store.conversations() == sorted(ids)

    async def test_conversations_pages_with_after_and_limit(self, store: Any) -> None:
        ids = sorted([*HOSTILE_IDS, "日本語", "ñandú", "z"])
        for cid in ids:
            await store.append(Batch(cid, "a1", _turn(cid)))
        await store.clear("z")
        ids.remove("z")
        # Pages of 3 (after = the last id of the previous page) list each id once.
        paged: list[ConversationID] = []
        after: str | None = None
        for _ in range(len(ids) + 1):  # bounded: a store that repeats ids fails, not hangs
            page = await store.conversations(after=after, limit=3)
            if not page:
                break
            assert len(page) <= 3
            paged += page
            after = page[-1]
        assert paged == ids
        assert await store.conversations(limit=2) == ids[:2]
        assert await store.conversations(after=ids[1]) == ids[2:]
        # ``after`` need not be listed: ids after it in code point order.
        assert await store.conversations(after="a0", limit=1) == [c for c in ids if c > "a0"][:1]
        assert await store.conversations(after=ids[-1]) == []

    async def test_conversations_refuses_bad_page_arguments(self, store: Any) -> None:
        for limit in (0, -1, True, 1.5, "2"):
            with pytest.raises(ValueError, match="limit must be an integer >= 1"):
                await store.conversations(limit=limit)
        with pytest.raises(InvalidConversationIDError):
            await store.conversations(after=" padded ")

    async def test_hostile_ids_round_trip_and_stay_apart(self, store: Any) -> None:
        for cid in HOSTILE_IDS:
            receipt = await store.append(Batch(cid, cid, _turn(cid)))
            assert receipt == Receipt(cid, cid, receipt.digest)
        for cid in HOSTILE_IDS:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]
            # The same hostile append id is remembered, exactly, per conversation.
            assert (await store.append(Batch(cid, cid, _turn(cid)))).id == cid
            with pytest.raises(AppendConflictError):
                await store.append(Batch(cid, cid, _turn(cid + "!")))
        listed = await store.conversations()
        assert listed == sorted(HOSTILE_IDS)
        assert all(type(c) is ConversationID for c in listed)
        # Clearing pattern-like ids touches nothing else.
        for cid in ("*", "a*", "?", "[ab]", "100%", "100_", "a:"):
            await store.clear(cid)
        remaining = sorted(set(HOSTILE_IDS) - {"*", "a*", "?", "[ab]", "100%", "100_", "a:"})
        assert await store.conversations() == remaining
        for cid in remaining:
            assert _texts(await store.read(cid)) == [f"{cid}/0", f"{cid}/1"]

    # -- receipts and retries ---------------------------------------------------------

    async def test_append_returns_a_receipt_for_the_batch(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        receipt = await store.append(batch)
        assert isinstance(receipt, Receipt)
        receipt.validate_for(batch)
        assert receipt == batch.receipt()

    async def test_retry_of_accepted_batch_returns_equal_receipt_and_appends_nothing(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"))
        first = await store.append(batch)
        for _ in range(3):
            assert await store.append(batch) == first
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def test_retry_of_batch_rebuilt_from_same_messages_appends_nothing(
        self, store: Any
    ) -> None:
        messages = rich_messages()
        batch = Batch("c", "a1", messages)
        first = await store.append(batch)
        decoded = Batch.from_json(batch.to_json())
        rebuilt = Batch("c", "a1", [from_json(to_json(m), Message) for m in messages])
        assert await store.append(decoded) == first
        assert await store.append(rebuilt) == first
        # Even a batch rebuilt from what the store returned is the same batch.
        assert await store.append(Batch("c", "a1", await store.read("c"))) == first
        assert await store.read("c") == messages

    async def test_retry_after_later_appends_still_appends_nothing(self, store: Any) -> None:
        first = Batch("c", "a1", _turn("one"))
        await store.append(first)
        await store.append(Batch("c", "a2", _turn("two")))
        assert await store.append(first) == first.receipt()
        assert _texts(await store.read("c")) == ["one/0", "one/1", "two/0", "two/1"]

    async def test_same_id_other_digest_conflicts_and_appends_nothing(self, store: Any) -> None:
        accepted = Batch("c", "a1", _turn("t"))
        await store.append(accepted)
        for other in (
            Batch("c", "a1", _turn("other")),
            Batch("c", "a1", _turn("t", 3)),
            Batch("c", "a1", _turn("t")[:1]),
        ):
            with pytest.raises(AppendConflictError):
                await store.append(other)
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        # The accepted batch is still recognised after the conflicts.
        assert await store.append(accepted) == accepted.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def test_conflict_detection_is_exact_about_number_spelling(self, store: Any) -> None:
        def batch(spelling: str) -> Batch:
            meta = {"x": RawJSON.parse(spelling)}
            return Batch("c", "a1", [user_message(text_part("n", metadata=meta))])

        await store.append(batch("2.5"))
        with pytest.raises(AppendConflictError):
            await store.append(batch("2.50"))
        assert len(await store.read("c")) == 1

    async def test_append_ids_are_scoped_per_conversation(self, store: Any) -> None:
        one = Batch("one", "shared", _turn("one"))
        two = Batch("two", "shared", _turn("two"))
        assert await store.append(one) == one.receipt()
        assert await store.append(two) == two.receipt()
        assert _texts(await store.read("one")) == ["one/0", "one/1"]
        assert _texts(await store.read("two")) == ["two/0", "two/1"]
        # Same id and messages in a third conversation: a new batch there, not a retry.
        three = Batch("three", "shared", _turn("one"))
        assert await store.append(three) == three.receipt()
        assert _texts(await store.read("three")) == ["one/0", "one/1"]

    # -- order ------------------------------------------------------------------------

    async def test_batches_read_back_in_append_order_and_contiguous(self, store: Any) -> None:
        expected: list[str] = []
        for i in range(10):
            messages = _turn(f"b{i}", 1 + i % 4)
            await store.append(Batch("c", f"a{i}", messages))
            expected += _texts(messages)
            assert _texts(await store.read("c")) == expected

    async def test_messages_of_a_batch_keep_their_order(self, store: Any) -> None:
        messages = [user_message(f"m{i}") for i in range(50)]
        await store.append(Batch("c", "a1", messages))
        assert await store.read("c") == messages

    async def test_conversations_do_not_mix(self, store: Any) -> None:
        for i in range(6):
            await store.append(Batch(f"c{i % 2}", f"a{i}", _turn(f"{i}")))
        assert _texts(await store.read("c0")) == ["0/0", "0/1", "2/0", "2/1", "4/0", "4/1"]
        assert _texts(await store.read("c1")) == ["1/0", "1/1", "3/0", "3/1", "5/0", "5/1"]

    # -- closure ----------------------------------------------------------------------

    async def test_cleared_conversation_reads_empty(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        assert await store.read("c") == []

    async def test_cleared_conversation_rejects_new_appends(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a2", _turn("new")))
        assert await store.read("c") == []

    async def test_cleared_conversation_rejects_retries_of_accepted_batches(
        self, store: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.append(batch)
        # Closure wins over a conflict, too.
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("other")))
        assert await store.read("c") == []

    async def test_clear_of_never_written_id_closes_it(self, store: Any) -> None:
        await store.clear("fresh")
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("fresh", "a1", _turn("t")))
        assert await store.read("fresh") == []
        assert await store.conversations() == []

    async def test_clear_is_idempotent(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("c")
        await store.clear("c")
        await store.clear("c")
        assert await store.read("c") == []
        assert await store.conversations() == []
        with pytest.raises(ConversationClosedError):
            await store.append(Batch("c", "a1", _turn("t")))

    async def test_cleared_conversation_leaves_the_listing(self, store: Any) -> None:
        for cid in ("a", "b", "c"):
            await store.append(Batch(cid, "a1", _turn(cid)))
        await store.clear("b")
        assert await store.conversations() == ["a", "c"]

    async def test_clear_leaves_other_conversations_alone(self, store: Any) -> None:
        await store.append(Batch("keep", "a1", _turn("keep")))
        await store.append(Batch("drop", "a1", _turn("drop")))
        await store.clear("drop")
        assert _texts(await store.read("keep")) == ["keep/0", "keep/1"]
        second = Batch("keep", "a2", _turn("more"))
        assert await store.append(second) == second.receipt()

    # -- listing ----------------------------------------------------------------------

    async def test_conversations_are_unique_in_lexical_order(self, store: Any) -> None:
        ids = ["b", "a", "B", "a b", "ab", "é", "z", "日本", "🙂", "a:b", "10", "9", "A", "~"]
        for i, cid in enumerate(ids):
            await store.append(Batch(cid, f"a{i}", _turn(cid)))
            await store.append(Batch(cid, f"again{i}", _turn(cid)))
        listed = await store.conversations()
        # Code point order, which is also UTF-8 byte order (not a locale collation).
        assert listed == sorted(ids)
        assert all(type(c) is ConversationID for c in listed)

    async def test_conversations_returns_a_new_list(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        listed = await store.conversations()
        listed.clear()
        assert await store.conversations() == ["c"]

    # -- invalid input ----------------------------------------------------------------

    @pytest.mark.parametrize("bad_id", _BAD_IDS, ids=_BAD_ID_NAMES)
    async def test_invalid_conversation_ids_rejected_before_io(
        self, store: Any, bad_id: Any
    ) -> None:
        # Every step of the Store protocol that takes a conversation id.
        for call, *args in (
            (store.read,),
            (store.read_view,),
            (store.read_batches,),
            (store.clear,),
            (store.acquire_turn, "h1", 30),
            (store.acquire_turn_view, "h1", 30),
            (store.release_turn, "h1"),
        ):
            await self._rejects_without_suspending(InvalidConversationIDError, call, bad_id, *args)
        assert await store.conversations() == []

    @pytest.mark.parametrize(
        "bad_batch",
        [None, "batch", {"conversation_id": "c", "id": "a", "messages": []}, [user_message("x")]],
        ids=["none", "str", "dict", "list"],
    )
    async def test_non_batch_append_rejected_before_io(self, store: Any, bad_batch: Any) -> None:
        await self._rejects_without_suspending(InvalidBatchError, store.append, bad_batch)
        assert await store.conversations() == []

    # -- batches -----------------------------------------------

    async def test_read_batches_round_trip_in_order_with_receipts(self, store: Any) -> None:
        batches = [
            Batch("c", "a1", rich_messages()),
            Batch("c", "a2", _turn("two")),
            Batch("c", "a3", _turn("three", 4)),
        ]
        receipts = [await store.append(batch) for batch in batches]
        await store.append(Batch("other", "a1", _turn("other")))
        # A retry and a conflict add no batch.
        assert await store.append(batches[0]) == receipts[0]
        with pytest.raises(AppendConflictError):
            await store.append(Batch("c", "a2", _turn("conflict")))
        stored = await store.read_batches("c")
        assert type(stored) is list
        assert stored == batches
        for got, batch, receipt in zip(stored, batches, receipts, strict=True):
            assert type(got) is Batch
            assert type(got.conversation_id) is ConversationID
            assert type(got.id) is AppendID
            assert (got.conversation_id, got.id, got.digest) == (
                batch.conversation_id,
                batch.id,
                batch.digest,
            )
            assert got.messages == batch.messages
            assert got.encoded_messages == batch.encoded_messages
            assert got.receipt() == receipt
            receipt.validate_for(got)
        assert await store.read_batches("other") == [Batch("other", "a1", _turn("other"))]

    async def test_read_batches_returns_a_new_list_each_time(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        first = await store.read_batches("c")
        first.clear()
        second = await store.read_batches("c")
        assert [b.id for b in second] == ["a1"]
        assert second is not await store.read_batches("c")

    async def test_read_batches_keeps_hostile_ids_apart(self, store: Any) -> None:
        # Two hostile append ids per conversation: its own id and the next one's.
        pairs = list(zip(HOSTILE_IDS, HOSTILE_IDS[1:] + HOSTILE_IDS[:1], strict=True))
        for cid, second in pairs:
            await store.append(Batch(cid, cid, _turn(cid)))
            await store.append(Batch(cid, second, _turn(second)))
        for cid, second in pairs:
            stored = await store.read_batches(cid)
            assert [(b.conversation_id, b.id) for b in stored] == [(cid, cid), (cid, second)]
            assert _texts(_flatten(stored)) == _texts(_turn(cid) + _turn(second))

    async def test_read_batches_of_unknown_conversation_is_empty(self, store: Any) -> None:
        await store.append(Batch("known", "a1", _turn("t")))
        assert await store.read_batches("never-written") == []

    async def test_read_batches_of_cleared_conversation_is_empty(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.append(Batch("c", "a2", _turn("u")))
        await store.append(Batch("keep", "a1", _turn("k")))
        await store.clear("c")
        await store.clear("fresh")
        assert await store.read_batches("c") == []
        assert await store.read_batches("fresh") == []
        assert [b.id for b in await store.read_batches("keep")] == ["a1"]

    async def test_read_equals_the_concatenated_read_batches(self, store: Any) -> None:
        for i in range(8):
            await store.append(Batch(f"c{i % 2}", f"a{i}", _turn(f"{i}", 1 + i % 3)))
        await store.append(Batch("c0", "a0", _turn("0", 1)))  # a retry: nothing added

        async def append(i: int) -> None:
            await store.append(Batch("c1", f"concurrent{i}", _turn(f"x{i}", 2)))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(append, i)
        for cid in ("c0", "c1", "unknown"):
            batches = await store.read_batches(cid)
            assert await store.read(cid) == _flatten(batches)
        assert [b.id for b in await store.read_batches("c0")] == ["a0", "a2", "a4", "a6"]
        c1 = [b.id for b in await store.read_batches("c1")]
        # Order between concurrent batches is the backend's; the sequential ones come first.
        assert c1[:4] == ["a1", "a3", "a5", "a7"]
        assert sorted(c1[4:]) == sorted(f"concurrent{i}" for i in range(10))

    # -- concurrency ------------------------------------------------------------------

    async def test_concurrent_appends_all_land_each_batch_contiguous(self, store: Any) -> None:
        n = self.concurrent_appends
        batches = [Batch("c", f"a{i}", _turn(f"b{i}", 3)) for i in range(n)]
        receipts: dict[int, Receipt] = {}

        async def append(i: int) -> None:
            receipts[i] = await store.append(batches[i])

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(append, i)
        for i, batch in enumerate(batches):
            receipts[i].validate_for(batch)
        stored = _texts(await store.read("c"))
        assert len(stored) == 3 * n
        assert sorted(stored) == sorted(t for b in batches for t in _texts(b.messages))
        for i in range(n):
            start = stored.index(f"b{i}/0")
            assert stored[start : start + 3] == [f"b{i}/0", f"b{i}/1", f"b{i}/2"], (
                f"batch {i} is not contiguous"
            )

    async def test_concurrent_retries_of_one_batch_land_once(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("once", 3))
        receipts: list[Receipt] = []

        async def append() -> None:
            receipts.append(await store.append(batch))

        async with anyio.create_task_group() as tg:
            for _ in range(self.concurrent_retries):
                tg.start_soon(append)
        assert len(receipts) == self.concurrent_retries
        assert all(r == batch.receipt() for r in receipts)
        assert _texts(await store.read("c")) == ["once/0", "once/1", "once/2"]

    async def test_concurrent_appends_to_many_conversations(self, store: Any) -> None:
        async def append(i: int) -> None:
            for j in range(3):
                await store.append(Batch(f"c{i}", f"a{j}", _turn(f"{i}.{j}")))

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(append, i)
        assert await store.conversations() == sorted(f"c{i}" for i in range(10))
        for i in range(10):
            expected = [f"{i}.{j}/{k}" for j in range(3) for k in range(2)]
            assert _texts(await store.read(f"c{i}")) == expected

    # -- cancellation -----------------------------------------------------------------

    async def test_cancelled_append_leaves_all_or_nothing_and_retry_resolves(
        self, store: Any
    ) -> None:
        # Cancel the append after 0, 1, 2, ... scheduling rounds, so cancellation lands
        # before, inside and after the store's work, then once more with a cancelled scope.
        for round_ in itertools.chain(range(self.cancellation_rounds), [-1]):
            cid = f"cancel-{round_}"
            batch = Batch(cid, "a1", _turn(cid, 4))
            if round_ < 0:
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await store.append(batch)
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(store.append, batch)
                    for _ in range(round_):
                        await anyio.lowlevel.checkpoint()
                    tg.cancel_scope.cancel()
            after_cancel = await store.read(cid)
            assert after_cancel in ([], list(batch.messages)), (
                f"round {round_}: a cancelled append left part of a batch: {_texts(after_cancel)}"
            )
            assert await store.append(batch) == batch.receipt()
            assert await store.read(cid) == list(batch.messages), f"round {round_}"

    # -- durability (needs reopen) ----------------------------------------------------

    async def test_durable_messages_survive_reopen(self, store: Any) -> None:
        messages = rich_messages()
        await store.append(Batch("c", "a1", messages))
        await store.append(Batch("d", "a1", _turn("d")))
        async with self._reopened(store) as again:
            assert await again.read("c") == messages
            assert _texts(await again.read("d")) == ["d/0", "d/1"]
            assert await again.conversations() == ["c", "d"]

    async def test_durable_batches_survive_reopen(self, store: Any) -> None:
        batches = [Batch("c", "a1", rich_messages()), Batch("c", "a2", _turn("t"))]
        receipts = [await store.append(batch) for batch in batches]
        async with self._reopened(store) as again:
            stored = await again.read_batches("c")
            assert stored == batches
            assert [b.receipt() for b in stored] == receipts

    async def test_durable_dedupe_evidence_survives_reopen(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        async with self._reopened(store) as again:
            assert await again.append(batch) == batch.receipt()
            with pytest.raises(AppendConflictError):
                await again.append(Batch("c", "a1", _turn("other")))
            assert _texts(await again.read("c")) == ["t/0", "t/1"]

    async def test_durable_length_survives_reopen(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.append(Batch("c", "a2", _turn("u")))
        async with self._reopened(store) as again:
            with pytest.raises(HistoryChangedError):
                await again.append(Batch("c", "a3", _turn("late"), expected_length=3))
            fenced = Batch("c", "a3", _turn("v"), expected_length=5)
            assert await again.append(fenced) == fenced.receipt()
            assert (await again.read_view("c")).length == 7

    async def test_durable_closure_survives_reopen(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        await store.clear("c")
        await store.clear("never-written")
        async with self._reopened(store) as again:
            assert await again.read("c") == []
            assert await again.conversations() == []
            for cid, aid in (("c", "a1"), ("c", "a2"), ("never-written", "a1")):
                with pytest.raises(ConversationClosedError):
                    await again.append(Batch(cid, aid, _turn("t")))
