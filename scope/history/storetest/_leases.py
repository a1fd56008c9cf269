"""The lease rules of DESIGN §6e: the lease steps of ``Store``, separate and folded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import anyio.pytest_plugin
import pytest

from scope.chat import (
    user_message,
)
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
)
from scope.history._batch import Batch
from scope.history._ids import ConversationID
from scope.history._view import HistoryView
from scope.history.storetest._runner import tests_on_anyio_runner
from scope.history.storetest._support import (
    HOSTILE_IDS,
    Base,
    _texts,
    _turn,
)


@tests_on_anyio_runner
class LeaseRules(Base):
    """The lease rules of DESIGN §6e: the lease steps of ``Store``, separate and folded."""

    # -- turn leases --------------------------------------------

    async def test_lease_of_a_free_conversation_is_taken(self, store: Any) -> None:
        assert await store.acquire_turn("c", "h1", 30) is True
        assert await store.acquire_turn(ConversationID("other"), "h2", 30) is True

    async def test_lease_holder_token_excludes_other_holders(self, store: Any) -> None:
        assert await store.acquire_turn("c", "h1", 30) is True
        assert await store.acquire_turn("c", "h2", 30) is False
        assert await store.acquire_turn("c", "h1-", 30) is False
        assert await store.release_turn("c", "h2") is False
        assert await store.acquire_turn("c", "h2", 30) is False  # still h1's
        assert await store.release_turn("c", "h1") is True
        assert await store.release_turn("c", "h1") is False  # released already
        assert await store.acquire_turn("c", "h2", 30) is True

    async def test_lease_renewal_by_its_holder_extends_it(self, store: Any) -> None:
        ttl = self.lease_ttl
        assert await store.acquire_turn("c", "h1", ttl) is True
        for _ in range(3):  # renewed every ttl/2: alive for 1.5 ttl past the first expiry
            await anyio.sleep(ttl / 2)
            assert await store.acquire_turn("c", "h1", ttl) is True
            assert await store.acquire_turn("c", "h2", ttl) is False
        assert await store.release_turn("c", "h1") is True

    async def test_lease_expires_by_itself(self, store: Any) -> None:
        ttl = self.lease_ttl
        assert await store.acquire_turn("c", "crashed", ttl) is True
        assert await store.acquire_turn("c", "h2", 30) is False
        await anyio.sleep(ttl * 2)
        assert await store.acquire_turn("c", "h2", 30) is True
        # The expired holder can neither renew nor release what is now h2's.
        assert await store.acquire_turn("c", "crashed", ttl) is False
        assert await store.release_turn("c", "crashed") is False
        assert await store.release_turn("c", "h2") is True

    async def test_lease_release_after_expiry_is_not_held(self, store: Any) -> None:
        ttl = self.lease_ttl
        assert await store.acquire_turn("c", "h1", ttl) is True
        await anyio.sleep(ttl * 2)
        assert await store.release_turn("c", "h1") is False
        assert await store.acquire_turn("c", "h2", 30) is True

    async def test_leases_are_per_conversation(self, store: Any) -> None:
        for cid in HOSTILE_IDS[:8]:
            assert await store.acquire_turn(cid, "h1", 30) is True
        for cid in HOSTILE_IDS[8:16]:
            assert await store.acquire_turn(cid, "h2", 30) is True
        assert await store.acquire_turn(HOSTILE_IDS[0], "h2", 30) is False
        assert await store.acquire_turn(HOSTILE_IDS[8], "h1", 30) is False

    async def test_concurrent_lease_acquires_exactly_one_wins(self, store: Any) -> None:
        for round_ in range(3):
            won: list[str] = []

            async def acquire(holder: str, won: list[str] = won) -> None:
                if await store.acquire_turn("c", holder, 30):
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, f"r{round_}h{i}")
            assert len(won) == 1, f"round {round_}: {len(won)} holders won the lease"
            assert await store.release_turn("c", won[0]) is True

    async def test_lease_is_exclusive_across_two_handles(self, store: Any) -> None:
        async with self._reopened(store) as again:
            assert await store.acquire_turn("c", "h1", 30) is True
            assert await again.acquire_turn("c", "h2", 30) is False
            assert await again.release_turn("c", "h2") is False
            assert await again.release_turn("c", "h1") is True  # the token, not the handle
            won: list[str] = []

            async def acquire(handle: Any, holder: str) -> None:
                if await handle.acquire_turn("d", holder, 30):
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, (store, again)[i % 2], f"h{i}")
            assert len(won) == 1, f"{len(won)} holders on two handles won the lease"

    @pytest.mark.parametrize("bad_holder", ["", 3, None, b"h", "\ud800"])
    async def test_lease_holder_rejected_before_io(self, store: Any, bad_holder: Any) -> None:
        await self._rejects_without_suspending(ValueError, store.acquire_turn, "c", bad_holder, 30)
        await self._rejects_without_suspending(ValueError, store.release_turn, "c", bad_holder)
        with pytest.raises(ValueError, match=r"lease holder (must|is not valid)"):
            await store.acquire_turn("c", bad_holder, 30)

    @pytest.mark.parametrize("bad_ttl", [0, -1, float("nan"), float("inf"), "1", True, None])
    async def test_lease_ttl_rejected_before_io(self, store: Any, bad_ttl: Any) -> None:
        await self._rejects_without_suspending(ValueError, store.acquire_turn, "c", "h1", bad_ttl)
        with pytest.raises(ValueError, match="lease ttl must be a finite number of seconds > 0"):
            await store.acquire_turn("c", "h1", bad_ttl)
        assert await store.acquire_turn("c", "h2", 30) is True  # nothing was taken

    # -- folded lease steps --------------------------------

    #: How many tasks hand one conversation over with the folded steps, and how many
    #: turns each commits.
    folded_turn_tasks: ClassVar[int] = 8
    folded_turns_each: ClassVar[int] = 4

    async def _lease_is_free(self, store: Any) -> bool:
        """Whether conversation ``c``'s lease is free (probed, then released again)."""
        if not await store.acquire_turn("c", "probe", 30):
            return False
        assert await store.release_turn("c", "probe") is True
        return True

    async def test_folded_acquire_returns_the_view_and_takes_the_lease(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("one")))
        await store.append(Batch("c", "a2", _turn("two", 3)))
        view = await store.acquire_turn_view("c", "h1", 30)
        assert view == await store.read_view("c")
        assert (_texts(view.messages), view.length, view.closed) == (
            _texts(_turn("one") + _turn("two", 3)),
            5,
            False,
        )
        assert await store.acquire_turn("c", "h2", 30) is False
        assert await store.acquire_turn_view("c", "h1", 30) == view  # the holder renews
        assert await store.release_turn("c", "h1") is True

    async def test_folded_acquire_of_unknown_and_closed_conversations(self, store: Any) -> None:
        assert await store.acquire_turn_view("never-written", "h1", 30) == HistoryView((), 0)
        assert await store.acquire_turn("never-written", "h2", 30) is False
        await store.append(Batch("c", "a1", _turn("t", 3)))
        await store.clear("c")
        view = await store.acquire_turn_view("c", "h1", 30)
        assert view == await store.read_view("c")  # its last length, or 0
        assert view.closed and view.messages == ()
        assert await store.acquire_turn("c", "h2", 30) is False

    async def test_folded_acquire_under_another_holders_lease_reads_nothing(
        self, store: Any
    ) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        assert await store.acquire_turn("c", "h1", 30) is True
        assert await store.acquire_turn_view("c", "h2", 30) is None
        assert await store.release_turn("c", "h2") is False  # h2 never held it
        assert await store.release_turn("c", "h1") is True  # h1's lease untouched
        assert await store.acquire_turn_view("c", "h2", 30) is not None

    async def test_folded_acquire_takes_an_expired_lease(self, store: Any) -> None:
        ttl = self.lease_ttl
        assert await store.acquire_turn("c", "crashed", ttl) is True
        assert await store.acquire_turn_view("c", "h2", 30) is None
        await anyio.sleep(ttl * 2)
        assert await store.acquire_turn_view("c", "h2", 30) == HistoryView((), 0)
        assert await store.acquire_turn("c", "crashed", ttl) is False

    async def test_concurrent_folded_acquires_exactly_one_reads(self, store: Any) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        for round_ in range(3):
            won: list[str] = []

            async def acquire(holder: str, won: list[str] = won) -> None:
                if await store.acquire_turn_view("c", holder, 30) is not None:
                    won.append(holder)

            async with anyio.create_task_group() as group:
                for i in range(self.concurrent_leases):
                    group.start_soon(acquire, f"r{round_}h{i}")
            assert len(won) == 1, f"round {round_}: {len(won)} holders read under the lease"
            assert await store.release_turn("c", won[0]) is True

    async def test_folded_append_lands_and_releases_the_lease(self, store: Any) -> None:
        view = await store.acquire_turn_view("c", "h1", 30)
        batch = Batch("c", "a1", _turn("t"), expected_length=view.length)
        assert await store.append_release_turn(batch, "h1") == batch.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await store.release_turn("c", "h1") is False  # released already
        assert await self._lease_is_free(store)

    async def test_folded_append_retry_returns_the_receipt_and_releases(self, store: Any) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await store.append(batch)
        assert await store.acquire_turn("c", "h1", 30) is True
        stale = Batch("c", "a1", _turn("t"), expected_length=0)  # the fence yields to dedupe
        assert await store.append_release_turn(stale, "h1") == batch.receipt()
        assert _texts(await store.read("c")) == ["t/0", "t/1"]
        assert await self._lease_is_free(store)

    async def test_folded_append_leaves_another_holders_lease(self, store: Any) -> None:
        assert await store.acquire_turn("c", "h1", 30) is True
        batch = Batch("c", "a1", _turn("t"))
        assert await store.append_release_turn(batch, "h2") == batch.receipt()
        assert await store.acquire_turn("c", "h2", 30) is False  # still h1's
        assert await store.release_turn("c", "h1") is True

    async def test_folded_append_refused_keeps_the_lease_and_appends_nothing(
        self, store: Any
    ) -> None:
        await store.append(Batch("c", "a1", _turn("t")))
        await store.clear("closed")
        refusals = [
            (HistoryChangedError, Batch("c", "a2", _turn("late"), expected_length=0)),
            (AppendConflictError, Batch("c", "a1", _turn("other"))),
            (ConversationClosedError, Batch("closed", "a1", _turn("t"))),
        ]
        for error, batch in refusals:
            cid = batch.conversation_id
            assert await store.acquire_turn(cid, "h1", 30) is True
            with pytest.raises(error):
                await store.append_release_turn(batch, "h1")
            assert await store.acquire_turn(cid, "h2", 30) is False, (
                f"{error.__name__} released the lease"
            )
            assert await store.release_turn(cid, "h1") is True
        assert _texts(await store.read("c")) == ["t/0", "t/1"]

    async def _hand_over(self, handles: Sequence[Any]) -> None:
        """``folded_turn_tasks`` tasks on ``handles`` take turns on ``c`` with the folded
        steps: each turn's fenced batch must land (its view was never stale)."""
        tasks, each = self.folded_turn_tasks, self.folded_turns_each

        async def turns(task: int) -> None:
            handle = handles[task % len(handles)]
            for turn in range(each):
                holder = f"t{task}n{turn}"
                # Busy polling (a checkpoint, not a sleep): every waiting task tries
                # again in every scheduling round, so a lease handed over at any point
                # is taken at once, and a store whose steps are not atomic is caught.
                while (view := await handle.acquire_turn_view("c", holder, 30)) is None:
                    await anyio.lowlevel.checkpoint()
                for _ in range((task + turn) % 3 + 1):  # the model call, of varied length
                    await anyio.lowlevel.checkpoint()
                batch = Batch("c", holder, _turn(holder), expected_length=view.length)
                await handle.append_release_turn(batch, holder)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for task in range(tasks):
                    group.start_soon(turns, task)
        assert (await handles[0].read_view("c")).length == 2 * tasks * each
        assert await self._lease_is_free(handles[0])

    async def test_folded_turns_hand_over_without_a_stale_view(self, store: Any) -> None:
        await self._hand_over([store])

    async def test_folded_turns_hand_over_across_two_handles(self, store: Any) -> None:
        async with self._reopened(store) as again:
            await self._hand_over([store, again])

    @pytest.mark.parametrize("bad_holder", ["", 3, None, b"h", "\ud800"])
    async def test_folded_steps_reject_a_bad_holder_before_io(
        self, store: Any, bad_holder: Any
    ) -> None:
        batch = Batch("c", "a1", _turn("t"))
        await self._rejects_without_suspending(
            ValueError, store.acquire_turn_view, "c", bad_holder, 30
        )
        await self._rejects_without_suspending(
            ValueError, store.append_release_turn, batch, bad_holder
        )
        with pytest.raises(ValueError, match=r"lease holder (must|is not valid)"):
            await store.append_release_turn(batch, bad_holder)
        assert await store.read("c") == []

    @pytest.mark.parametrize("bad_ttl", [0, -1, float("nan"), float("inf"), "1", True, None])
    async def test_folded_acquire_rejects_a_bad_ttl_before_io(
        self, store: Any, bad_ttl: Any
    ) -> None:
        await self._rejects_without_suspending(
            ValueError, store.acquire_turn_view, "c", "h1", bad_ttl
        )
        with pytest.raises(ValueError, match="lease ttl must be a finite number of seconds > 0"):
            await store.acquire_turn_view("c", "h1", bad_ttl)
        assert await self._lease_is_free(store)

    @pytest.mark.parametrize(
        "bad_batch", [None, "batch", [user_message("x")]], ids=["none", "str", "list"]
    )
    async def test_folded_append_rejects_a_non_batch_before_io(
        self, store: Any, bad_batch: Any
    ) -> None:
        await self._rejects_without_suspending(
            InvalidBatchError, store.append_release_turn, bad_batch, "h1"
        )
