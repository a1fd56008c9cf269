"""The branch rules of DESIGN §6h: the head path, the tree, head fences and head moves."""

from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidConversationIDError,
    UnknownHeadError,
)
from scope.history._batch import Batch
from scope.history._tree import HistoryTree
from scope.history._view import HistoryView
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import Base, _flatten, _texts, _turn

#: Invalid heads (and move ids): each must be rejected before any I/O.
_BAD_HEADS: tuple[Any, ...] = (" padded", "nl\nid", "x" * 513, 42, None, b"a1")


async def _branched(store: Any) -> None:
    """``c``: a1 a2 a3 (two messages each), rewound to a1, then b2 (three messages): two
    branches sharing a1, the head b2 at five messages."""
    await store.append(Batch("c", "a1", _turn("a1")))
    await store.append(Batch("c", "a2", _turn("a2")))
    await store.append(Batch("c", "a3", _turn("a3")))
    assert await store.move_head("c", "a1", expected_head="a3") == 2
    await store.append(Batch("c", "b2", _turn("b2", 3)))


@tests_on_anyio_runner
class BranchRules(Base):
    """The branch rules of DESIGN §6h: every read sees the head path, an append extends
    the head, append ids dedupe across the tree, ``expected_head`` fences appends and
    head moves, ``move_head``'s order of checks and its move ids, ``read_tree``, closure
    of every branch, and a head move racing a fenced turn."""

    #: How many tasks race in ``test_rewind_racing_fenced_turns_exactly_one_wins``
    #: (half rewind, half run a fenced turn).
    concurrent_head_moves: ClassVar[int] = 8

    # -- the head path -----------------------------------------------------------------

    async def test_head_path_reads_after_a_rewind(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("a1")))
        await store.append(Batch("c", "a2", _turn("a2", 3)))
        assert await store.move_head("c", "a1", expected_head="a2") == 2
        assert _texts(await store.read("c")) == ["a1/0", "a1/1"]
        assert await store.read_batches("c") == [Batch("c", "a1", _turn("a1"))]
        view = await store.read_view("c")
        assert view == HistoryView(tuple(_turn("a1")), 2, False, head="a1")
        assert await store.acquire_turn_view("c", "h1", 30) == view
        assert await store.conversations() == ["c"]  # it still holds batches
        assert await store.move_head("c", "", expected_head="a1") == 0
        assert await store.read("c") == []
        assert await store.read_batches("c") == []
        assert await store.read_view("c") == HistoryView((), 0, False, head="")
        assert await store.conversations() == ["c"]
        assert await store.move_head("c", "a2", expected_head="") == 5
        assert _texts(await store.read("c")) == _texts(_turn("a1") + _turn("a2", 3))
        assert (await store.read_view("c")).head == "a2"

    async def test_head_moves_return_the_new_head_path_length(self, store: Any) -> None:
        await _branched(store)
        assert (await store.read_view("c")).length == 5
        assert await store.move_head("c", "a3", expected_head="b2") == 6
        assert (await store.read_view("c")).length == 6
        assert await store.move_head("c", "a2", expected_head="a3") == 4
        assert await store.move_head("c", "a2", expected_head="a2") == 4  # to itself
        assert await store.move_head("c", "b2", expected_head="a2") == 5
        assert _texts(await store.read("c")) == _texts(_turn("a1") + _turn("b2", 3))

    async def test_head_append_after_rewind_extends_from_the_new_head(self, store: Any) -> None:
        await _branched(store)
        assert _texts(await store.read("c")) == _texts(_turn("a1") + _turn("b2", 3))
        fenced = Batch("c", "b3", _turn("b3"), expected_length=5, expected_head="b2")
        assert await store.append(fenced) == fenced.receipt()
        assert [b.id for b in await store.read_batches("c")] == ["a1", "b2", "b3"]
        assert await store.read_view("c") == HistoryView(
            tuple(_turn("a1") + _turn("b2", 3) + _turn("b3")), 7, False, head="b3"
        )
        # To the start: the next append starts a second root.
        assert await store.move_head("c", "", expected_head="b3") == 0
        root = Batch("c", "r1", _turn("r1"), expected_length=0, expected_head="")
        assert await store.append(root) == root.receipt()
        assert await store.read_batches("c") == [root]
        tree = await store.read_tree("c")
        ids = [str(b.id) for b in tree.batches]
        assert ids == ["a1", "a2", "a3", "b2", "b3", "r1"]
        assert tree.parents == (-1, 0, 1, 0, 3, -1)
        assert tree.head == 5

    # -- dedupe across the tree --------------------------------------------------------

    async def test_head_retry_of_a_batch_on_another_branch_returns_its_receipt(
        self, store: Any
    ) -> None:
        await _branched(store)
        before = await store.read_tree("c")
        a2 = Batch("c", "a2", _turn("a2"))
        assert await store.append(a2) == a2.receipt()
        assert await store.append(a2.fenced(5, "b2")) == a2.receipt()
        assert await store.append(a2.fenced(4, "a2")) == a2.receipt()  # stale fences too
        assert await store.append_release_turn(a2, "h1") == a2.receipt()
        # The head did not move and nothing was appended.
        assert await store.read_tree("c") == before
        assert (await store.read_view("c")).head == "b2"
        assert _texts(await store.read("c")) == _texts(_turn("a1") + _turn("b2", 3))
        with pytest.raises(AppendConflictError):
            await store.append(Batch("c", "a3", _turn("other")))
        with pytest.raises(AppendConflictError):
            await store.append_release_turn(Batch("c", "a2", _turn("other")), "h1")
        assert await store.read_tree("c") == before

    # -- the expected_head fence -------------------------------------------------------

    async def test_head_fence_refuses_another_branch_at_equal_length(self, store: Any) -> None:
        # The ABA case: a rewind, then an append that reaches the same length again.
        await store.append(Batch("c", "a1", _turn("a1")))
        await store.append(Batch("c", "a2", _turn("a2")))
        stale = await store.read_view("c")
        assert (stale.length, stale.head) == (4, "a2")
        await store.move_head("c", "a1", expected_head="a2")
        await store.append(Batch("c", "b2", _turn("b2")))
        assert (await store.read_view("c")).length == 4  # the same length, another head
        for batch in (
            Batch("c", "t1", _turn("late"), expected_length=4, expected_head="a2"),
            Batch("c", "t1", _turn("late"), expected_head="a2"),
        ):
            with pytest.raises(HistoryChangedError) as caught:
                await store.append(batch)
            error = caught.value
            assert (error.expected, error.actual) == (4, 4)
            assert (error.expected_head, error.actual_head) == ("a2", "b2")
            assert error.conversation_id == "c"
        assert await store.acquire_turn("c", "h1", 30) is True
        with pytest.raises(HistoryChangedError):
            await store.append_release_turn(
                Batch("c", "t1", _turn("late"), expected_length=4, expected_head="a2"), "h1"
            )
        assert await store.acquire_turn("c", "h2", 30) is False  # the lease stayed
        assert [b.id for b in await store.read_batches("c")] == ["a1", "b2"]
        assert len((await store.read_tree("c")).batches) == 3
        # Refused batches left no dedupe record: the id lands on the current head.
        landed = Batch("c", "t1", _turn("late"), expected_length=4, expected_head="b2")
        assert await store.append_release_turn(landed, "h1") == landed.receipt()
        assert await store.acquire_turn("c", "h2", 30) is True

    async def test_head_fence_of_a_new_conversation_is_the_empty_head(self, store: Any) -> None:
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("c", "a1", _turn("t"), expected_head="a0"))
        assert (caught.value.expected_head, caught.value.actual_head) == ("a0", "")
        assert await store.read_tree("c") == HistoryTree((), (), ())
        assert await store.conversations() == []
        first = Batch("c", "a1", _turn("t"), expected_head="")
        assert await store.append(first) == first.receipt()
        with pytest.raises(HistoryChangedError):
            await store.append(Batch("c", "a2", _turn("u"), expected_head=""))

    # -- move_head ---------------------------------------------------------------------

    async def test_move_head_of_a_closed_conversation_raises_closed(self, store: Any) -> None:
        await _branched(store)
        await store.clear("c")
        for head, expected in (("", ""), ("a1", "b2"), ("nope", "x")):
            with pytest.raises(ConversationClosedError):
                await store.move_head("c", head, expected_head=expected)
            with pytest.raises(ConversationClosedError):
                await store.move_head("c", head, expected_head=expected, move_id="m1")
        await store.clear("never-written")
        with pytest.raises(ConversationClosedError):
            await store.move_head("never-written", "", expected_head="")

    async def test_move_head_retry_of_a_move_id_moves_nothing(self, store: Any) -> None:
        await _branched(store)
        assert await store.move_head("c", "a2", expected_head="b2", move_id="m1") == 4
        assert (await store.read_view("c")).head == "a2"
        await store.append(Batch("c", "c3", _turn("c3")))
        before = await store.read_tree("c")
        # The retry answers from the record, before the fence: its expected head is stale.
        assert await store.move_head("c", "a2", expected_head="b2", move_id="m1") == 4
        assert await store.read_tree("c") == before
        assert (await store.read_view("c")).head == "c3"

    async def test_move_head_move_id_for_another_head_conflicts(self, store: Any) -> None:
        await _branched(store)
        assert await store.move_head("c", "a1", expected_head="b2", move_id="m1") == 2
        before = await store.read_tree("c")
        for head, expected in (("a3", "a1"), ("", "a1"), ("b2", "zz")):
            with pytest.raises(AppendConflictError):
                await store.move_head("c", head, expected_head=expected, move_id="m1")
        assert await store.read_tree("c") == before

    async def test_move_head_move_ids_are_their_own_namespace(self, store: Any) -> None:
        await _branched(store)
        # A move id spelled like an append id, and an append id spelled like a move id.
        assert await store.move_head("c", "a2", expected_head="b2", move_id="a1") == 4
        batch = Batch("c", "m1", _turn("m1"))
        assert await store.append(batch) == batch.receipt()
        assert await store.move_head("c", "a1", expected_head="m1", move_id="m1") == 2
        assert (await store.read_view("c")).head == "a1"
        # Move ids are per conversation.
        await store.append(Batch("d", "d1", _turn("d1")))
        await store.append(Batch("d", "d2", _turn("d2")))
        assert await store.move_head("d", "d1", expected_head="d2", move_id="m1") == 2

    async def test_move_head_fenced_by_head_raises_history_changed_with_heads(
        self, store: Any
    ) -> None:
        await _branched(store)
        before = await store.read_tree("c")
        for head, expected in (("a1", "a3"), ("a1", ""), ("", "a1"), ("b2", "a2")):
            with pytest.raises(HistoryChangedError) as caught:
                await store.move_head("c", head, expected_head=expected, move_id="m1")
            error = caught.value
            assert (error.expected, error.actual) == (5, 5)
            assert (error.expected_head, error.actual_head) == (expected, "b2")
            assert error.conversation_id == "c"
        assert await store.read_tree("c") == before
        # Nothing was recorded: the move id is free for another head.
        assert await store.move_head("c", "a3", expected_head="b2", move_id="m1") == 6
        with pytest.raises(HistoryChangedError) as caught:
            await store.move_head("new", "", expected_head="a1")
        assert (caught.value.expected_head, caught.value.actual_head) == ("a1", "")

    async def test_move_head_to_an_unknown_head_raises_unknown_head(self, store: Any) -> None:
        await _branched(store)
        await store.append(Batch("d", "d1", _turn("d1")))
        before = await store.read_tree("c")
        for head in ("nope", "d1"):  # d1 is another conversation's
            with pytest.raises(UnknownHeadError):
                await store.move_head("c", head, expected_head="b2", move_id="m1")
        assert await store.read_tree("c") == before
        assert await store.move_head("c", "a2", expected_head="b2", move_id="m1") == 4
        with pytest.raises(UnknownHeadError):
            await store.move_head("new", "a1", expected_head="")
        assert await store.move_head("new", "", expected_head="") == 0
        assert await store.read_tree("new") == HistoryTree((), (), ())
        assert await store.conversations() == ["c", "d"]

    async def test_move_head_checks_closed_then_move_id_then_fence_then_head(
        self, store: Any
    ) -> None:
        await _branched(store)
        # The fence before the unknown head.
        with pytest.raises(HistoryChangedError):
            await store.move_head("c", "nope", expected_head="a3")
        # The move id's record before the fence and the unknown head.
        assert await store.move_head("c", "a3", expected_head="b2", move_id="m1") == 6
        assert await store.move_head("c", "a3", expected_head="zz", move_id="m1") == 6
        with pytest.raises(AppendConflictError):
            await store.move_head("c", "nope", expected_head="zz", move_id="m1")
        # Closure before everything.
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.move_head("c", "a3", expected_head="zz", move_id="m1")

    @pytest.mark.parametrize("bad", _BAD_HEADS, ids=lambda v: repr(v)[:16])
    async def test_move_head_invalid_arguments_rejected_before_io(
        self, store: Any, bad: Any
    ) -> None:
        for kwargs in (
            {"head": bad, "expected_head": ""},
            {"head": "", "expected_head": bad},
            {"head": "", "expected_head": "", "move_id": bad if bad is not None else ""},
        ):

            async def move(kwargs: dict[str, Any] = kwargs) -> int:
                return await store.move_head("c", **kwargs)  # type: ignore[no-any-return]

            await self._rejects_without_suspending(InvalidAppendIDError, move)
        for bad_id in ("", "nl\nid", 42):

            async def move_bad_id(bad_id: Any = bad_id) -> int:
                return await store.move_head(bad_id, "", expected_head="")  # type: ignore[no-any-return]

            await self._rejects_without_suspending(InvalidConversationIDError, move_bad_id)

    # -- read_tree ---------------------------------------------------------------------

    async def test_tree_shape_parents_head_and_created_times(self, store: Any) -> None:
        assert await store.read_tree("c") == HistoryTree((), (), ())
        start = time.time()
        await _branched(store)
        end = time.time()
        tree = await store.read_tree("c")
        assert type(tree) is HistoryTree
        assert [str(b.id) for b in tree.batches] == ["a1", "a2", "a3", "b2"]
        assert tree.batches[3] == Batch("c", "b2", _turn("b2", 3))
        assert [b.receipt() for b in tree.batches] == [
            Batch("c", i, _turn(i, 3 if i == "b2" else 2)).receipt()
            for i in ("a1", "a2", "a3", "b2")
        ]
        assert tree.parents == (-1, 0, 1, 0)
        assert tree.head == 3
        assert tree.closed is False
        assert list(tree.head_path()) == await store.read_batches("c")
        assert _flatten(tree.head_path()) == await store.read("c")
        created = [t for t in tree.created if type(t) is float]
        assert len(created) == 4, f"created times must be floats: {tree.created}"
        assert created == sorted(created), "created times go back in stored order"
        # The store's clock, not the test's: allow for a clock that is somewhat off.
        assert start - 300 <= created[0] and created[-1] <= end + 300, (start, created, end)
        await store.move_head("c", "", expected_head="b2")
        tree = await store.read_tree("c")
        assert (tree.head, tree.head_path(), len(tree.batches)) == (-1, (), 4)

    async def test_tree_created_restores_a_given_stored_time(self, store: Any) -> None:
        # append(..., created=...): the stored time of a restored batch (DESIGN §6n),
        # kept to the microsecond, on the first batch, a later one and another branch.
        times = (1_500_000_000.123456, 1_500_000_100.5, 1_500_000_200.000001)
        await store.append(Batch("c", "a1", _turn("a1")), created=times[0])
        await store.append(Batch("c", "a2", _turn("a2")), created=int(times[1] // 1))
        await store.move_head("c", "a1", expected_head="a2")
        await store.append(Batch("c", "b2", _turn("b2")), created=times[2])
        start = time.time()
        await store.append(Batch("c", "b3", _turn("b3")))  # the store's clock
        tree = await store.read_tree("c")
        restored = tree.created
        assert all(type(t) is float for t in restored), restored
        wanted = (times[0], float(int(times[1] // 1)), times[2])
        for got, want in zip(restored[:3], wanted, strict=True):
            assert abs(got - want) < 1e-6, (restored, wanted)
        assert restored[3] is not None and restored[3] >= start - 300, (start, restored)
        # A retry of an accepted batch changes nothing: its first stored time stays.
        receipt = await store.append(Batch("c", "a1", _turn("a1")), created=1.0)
        assert receipt == Batch("c", "a1", _turn("a1")).receipt()
        assert (await store.read_tree("c")).created == restored

    async def test_tree_created_invalid_rejected_before_io(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("a1"))
        for bad, error in (
            (True, TypeError),
            ("1500000000", TypeError),
            (b"1", TypeError),
            (float("nan"), ValueError),
            (float("inf"), ValueError),
            (-1.0, ValueError),
            (253_402_300_800.0, ValueError),
            (10**400, ValueError),
        ):

            async def append(bad: Any = bad) -> Any:
                return await store.append(batch, created=bad)

            await self._rejects_without_suspending(error, append)
        assert await store.read_tree("c") == HistoryTree((), (), ())

    async def test_tree_is_per_conversation(self, store: Any) -> None:
        await _branched(store)
        await store.append(Batch("d", "a1", _turn("d")))
        tree = await store.read_tree("d")
        assert tree == HistoryTree((Batch("d", "a1", _turn("d")),), (-1,), tree.created, 0)

    async def test_tree_invalid_conversation_ids_rejected_before_io(self, store: Any) -> None:
        for bad_id in ("", " padded", "nl\nid", 42, None):
            await self._rejects_without_suspending(
                InvalidConversationIDError, store.read_tree, bad_id
            )

    # -- closure -----------------------------------------------------------------------

    async def test_clear_closes_every_branch(self, store: Any) -> None:
        await _branched(store)
        await store.clear("c")
        assert await store.read_tree("c") == HistoryTree((), (), (), -1, True)
        assert await store.read("c") == []
        assert await store.read_batches("c") == []
        view = await store.read_view("c")
        assert (view.closed, view.messages, view.head) == (True, (), "")
        assert await store.conversations() == []
        for batch in (  # a retry of a batch on each branch, and a new one
            Batch("c", "a3", _turn("a3")),
            Batch("c", "b2", _turn("b2", 3)),
            Batch("c", "new", _turn("new")),
        ):
            with pytest.raises(ConversationClosedError):
                await store.append(batch)
        await store.clear("never-written")
        assert await store.read_tree("never-written") == HistoryTree((), (), (), -1, True)

    # -- races -------------------------------------------------------------------------

    async def _race(self, handles: list[Any], cid: str, moves_first: bool) -> None:
        """Half the tasks rewind ``cid`` to its first batch, half run a fenced turn, all
        from the same view (read before any of them writes), the rewinds started first
        or the turns: exactly one wins, and the store holds what that one wrote and
        nothing of the others."""
        handle = handles[0]
        await handle.append(Batch(cid, "a1", _turn("a1")))
        await handle.append(Batch(cid, "a2", _turn("a2")))
        n = max(2, self.concurrent_head_moves)
        ready = anyio.Event()
        read = 0
        won: list[str] = []
        refused: list[HistoryChangedError] = []

        async def task(i: int) -> None:
            nonlocal read
            store = handles[i % len(handles)]
            if i % 2:
                tree = await store.read_tree(cid)
                expected = str(tree.batches[tree.head].id)
            else:
                view = await store.read_view(cid)
            read += 1
            if read == n:
                ready.set()
            await ready.wait()
            try:
                if i % 2:
                    await store.move_head(cid, "a1", expected_head=expected, move_id=f"m{i}")
                else:
                    batch = Batch(cid, f"t{i}", _turn(f"t{i}"), view.length, view.head)
                    await store.append(batch)
            except HistoryChangedError as exc:
                refused.append(exc)
            else:
                won.append(f"m{i}" if i % 2 else f"t{i}")

        order = sorted(range(n), key=lambda i: i % 2 == 0) if moves_first else range(n)
        async with anyio.create_task_group() as tg:
            for i in order:
                tg.start_soon(task, i)
        assert len(won) == 1, f"{won} all won: a head move and a fenced turn interleaved"
        assert len(refused) == n - 1
        tree = await handle.read_tree(cid)
        ids = [str(b.id) for b in tree.batches]
        (winner,) = won
        if winner.startswith("m"):
            assert ids == ["a1", "a2"], ids
            assert (await handle.read_view(cid)).head == "a1"
        else:
            assert ids == ["a1", "a2", winner], ids
            assert tree.parents[2] == 1
            assert (await handle.read_view(cid)).head == winner
        assert all(e.expected_head == "a2" for e in refused if e.expected_head is not None)

    async def test_rewind_racing_fenced_turns_exactly_one_wins(self, store: Any) -> None:
        for round in range(4):
            await self._race([store], f"race{round}", moves_first=round % 2 == 1)

    async def test_rewind_racing_fenced_turns_across_two_handles(self, store: Any) -> None:
        async with self._reopened(store) as again:
            for round in range(4):
                await self._race([store, again], f"race{round}", moves_first=round % 2 == 1)

    # -- cancellation ------------------------------------------------------------------

    async def test_move_head_cancelled_moves_all_or_nothing_and_retry_resolves(
        self, store: Any
    ) -> None:
        # Cancel the move after 0, 1, 2, ... scheduling rounds (before, inside and after
        # the store's work), then once more in a cancelled scope: the head is the old one
        # or the target, every read agrees with the tree, and the retry (same move id)
        # lands the move exactly once.
        for round_ in itertools.chain(range(self.cancellation_rounds), [-1]):
            cid = f"cancel-{round_}"
            await store.append(Batch(cid, "a1", _turn("a1")))
            await store.append(Batch(cid, "a2", _turn("a2", 3)))

            async def move(cid: str = cid) -> None:
                await store.move_head(cid, "a1", expected_head="a2", move_id="m1")

            if round_ < 0:
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await move()
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(move)
                    for _ in range(round_):
                        await anyio.lowlevel.checkpoint()
                    tg.cancel_scope.cancel()
            tree = await store.read_tree(cid)
            view = await store.read_view(cid)
            head = str(tree.batches[tree.head].id)
            assert head in ("a1", "a2"), f"round {round_}: head {head!r}"
            assert (view.head, list(view.messages)) == (head, _flatten(tree.head_path())), (
                f"round {round_}: a cancelled move left the view and the tree apart"
            )
            assert view.length == len(view.messages)
            assert await store.read_batches(cid) == list(tree.head_path())
            assert await store.move_head(cid, "a1", expected_head="a2", move_id="m1") == 2
            assert (await store.read_view(cid)).head == "a1", f"round {round_}"

    # -- durability --------------------------------------------------------------------

    async def test_durable_restored_created_times_survive_reopen(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("a1")), created=1_500_000_000.25)
        await store.append(Batch("c", "a2", _turn("a2")))
        before = await store.read_tree("c")
        async with self._reopened(store) as again:
            assert (await again.read_tree("c")).created == before.created

    async def test_durable_tree_and_move_ids_survive_reopen(self, store: Any) -> None:
        await _branched(store)
        await store.move_head("c", "a2", expected_head="b2", move_id="m1")
        before = await store.read_tree("c")
        async with self._reopened(store) as again:
            assert await again.read_tree("c") == before
            assert (await again.read_view("c")).head == "a2"
            assert await again.move_head("c", "a2", expected_head="zz", move_id="m1") == 4
            with pytest.raises(AppendConflictError):
                await again.move_head("c", "a3", expected_head="a2", move_id="m1")
