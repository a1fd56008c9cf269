"""Branches (DESIGN §6h) on the SQL stores, against a real SQLite file and PostgreSQL
server: the tree every append builds (parent = the head, stored time, path length), the
head fence, dedupe across the whole tree, head-path reads, ``read_tree``, ``move_head``
with move ids, a clear that drops every branch, the costs (no tree walk on append, a
linear read without the walk), races and cancellation of head moves, and SIGKILL of a
process rewinding and appending in a loop (the head after restart is the old one or the
new one, never a mix).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidConversationIDError,
    StoreError,
    UnknownHeadError,
)
from scope.history import Batch, HistoryTree
from scope.historystores._schema import SCHEMA_VERSION
from tests.helpers import texts, turn
from tests.servers import (
    drop_tables,
    fresh_backend,
    fresh_store,
    import_driver,
    over_backends,
    postgres_dsn_or_skip,
    unique_table_prefix,
)

ROOT = Path(__file__).resolve().parents[2]

SQL = ("sqlite", "postgres")


async def shape(store: Any, cid: str) -> tuple[list[str], list[int], int]:
    """The tree's append ids, parents and head index."""
    tree = await store.read_tree(cid)
    return [str(b.id) for b in tree.batches], list(tree.parents), tree.head


async def assert_consistent(store: Any, cid: str) -> HistoryTree:
    """Every read agrees on the head path: the tree's, read_batches', read's, the view's
    (messages, length, head)."""
    tree = await store.read_tree(cid)
    path = list(tree.head_path())
    assert await store.read_batches(cid) == path
    messages = [m for b in path for m in b.messages]
    assert await store.read(cid) == messages
    view = await store.read_view(cid)
    assert list(view.messages) == messages
    assert view.length == len(messages)
    assert view.head == ("" if tree.head == -1 else str(tree.batches[tree.head].id))
    return tree


@pytest.mark.anyio
@over_backends(*SQL)
async def test_appends_build_a_tree_from_the_head(kind: str, tmp_path: Path) -> None:
    async with fresh_backend(kind, tmp_path) as backend:
        async with await backend.open() as store:
            before = time.time()
            for aid in ("a1", "a2", "a3"):
                await store.append(Batch("c", aid, turn(aid)))
            assert await shape(store, "c") == (["a1", "a2", "a3"], [-1, 0, 1], 2)
            assert await store.move_head("c", "a1", expected_head="a3") == 2
            b2 = Batch("c", "b2", turn("b2", 3), expected_length=2, expected_head="a1")
            assert await store.append(b2) == b2.receipt()
            await store.append(Batch("c", "b3", turn("b3")))
            assert await shape(store, "c") == (["a1", "a2", "a3", "b2", "b3"], [-1, 0, 1, 0, 3], 4)
            tree = await assert_consistent(store, "c")
            assert [str(b.id) for b in tree.head_path()] == ["a1", "b2", "b3"]
            created = tree.created
            assert all(isinstance(t, float) for t in created)
            assert before - 1 <= created[0] <= created[-1] <= time.time() + 1  # type: ignore[operator]
            assert list(created) == sorted(created)  # type: ignore[type-var]
        # Durable: another handle reads the same tree.
        async with await backend.open() as again:
            assert await again.read_tree("c") == tree
            assert (await again.read_view("c")).length == 7


@pytest.mark.anyio
@over_backends(*SQL)
async def test_append_ids_are_unique_across_the_tree(kind: str, tmp_path: Path) -> None:
    async with fresh_store(kind, tmp_path) as store:
        a1, a2 = Batch("c", "a1", turn("one")), Batch("c", "a2", turn("two"))
        await store.append(a1)
        await store.append(a2)
        await store.move_head("c", "a1", expected_head="a2")
        await store.append(Batch("c", "b2", turn("b")))
        # A retry of a batch on another branch: the equal receipt, nothing appended, the
        # head not moved, whatever its fences say.
        retry = a2.fenced(99, "nowhere")
        assert await store.append(retry) == a2.receipt()
        assert (await store.read_view("c")).head == "b2"
        assert await store.append_release_turn(a2, "nobody") == a2.receipt()
        with pytest.raises(AppendConflictError, match="'a2'"):
            await store.append(Batch("c", "a2", turn("other")))
        assert await shape(store, "c") == (["a1", "a2", "b2"], [-1, 0, 0], 2)


@pytest.mark.anyio
@over_backends(*SQL)
async def test_the_head_fence(kind: str, tmp_path: Path) -> None:
    async with fresh_store(kind, tmp_path) as store:
        # A new conversation's head is "".
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("c", "x", turn("x"), expected_head="a1"))
        assert (caught.value.actual, caught.value.actual_head) == (0, "")
        await store.append(Batch("c", "a1", turn("one"), expected_head=""))
        await store.append(Batch("c", "a2", turn("two"), expected_head="a1"))
        await store.move_head("c", "a1", expected_head="a2")
        await store.append(Batch("c", "b2", turn("b"), expected_head="a1"))
        # Generated on the other branch, of the same length: refused by the head.
        late = Batch("c", "late", turn("late"), expected_length=4, expected_head="a2")
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(late)
        error = caught.value
        assert (error.expected, error.actual) == (4, 4)
        assert (error.expected_head, error.actual_head) == ("a2", "b2")
        assert error.conversation_id == "c"
        with pytest.raises(HistoryChangedError):
            await store.append_release_turn(late, "h")
        # Length-only fence: actual_head stays None.
        with pytest.raises(HistoryChangedError) as caught:
            await store.append(Batch("c", "late", turn("late"), expected_length=2))
        assert (caught.value.actual, caught.value.actual_head) == (4, None)
        assert await shape(store, "c") == (["a1", "a2", "b2"], [-1, 0, 0], 2)
        # A rewind to the start: the head is "" again, the length 0.
        assert await store.move_head("c", "", expected_head="b2") == 0
        await store.append(Batch("c", "r", turn("r"), expected_length=0, expected_head=""))
        assert await shape(store, "c") == (["a1", "a2", "b2", "r"], [-1, 0, 0, -1], 3)
        await assert_consistent(store, "c")


@pytest.mark.anyio
@over_backends(*SQL)
async def test_views_and_leases_see_the_head_path(kind: str, tmp_path: Path) -> None:
    async with fresh_store(kind, tmp_path) as store:
        assert (await store.read_view("c")).head == ""
        await store.append(Batch("c", "a1", turn("one")))
        await store.append(Batch("c", "a2", turn("two")))
        await store.move_head("c", "a1", expected_head="a2")
        view = await store.acquire_turn_view("c", "h", 30)
        assert view is not None
        assert (view.length, view.head, texts(view.messages)) == (2, "a1", ["one q", "one a"])
        batch = Batch("c", "b2", turn("b"), expected_length=view.length, expected_head=view.head)
        assert await store.append_release_turn(batch, "h") == batch.receipt()
        assert await store.acquire_turn("c", "other", 30) is True  # released with it
        view = await store.acquire_turn_view("c", "other", 30)
        assert view is not None and (view.length, view.head) == (4, "b2")
        assert texts(view.messages) == ["one q", "one a", "b q", "b a"]
        await assert_consistent(store, "c")


@pytest.mark.anyio
@over_backends(*SQL)
async def test_move_head_rules_in_order(kind: str, tmp_path: Path) -> None:
    async with fresh_store(kind, tmp_path) as store:
        for aid in ("a1", "a2", "a3"):
            await store.append(Batch("c", aid, turn(aid, 3)))
        before = await store.read_tree("c")
        # Unknown target: nothing moved.
        with pytest.raises(UnknownHeadError, match="'nope'"):
            await store.move_head("c", "nope", expected_head="a3", move_id="m0")
        # The fence: lengths are the current head path's.
        with pytest.raises(HistoryChangedError) as caught:
            await store.move_head("c", "a1", expected_head="a2")
        error = caught.value
        assert (error.expected, error.actual, error.conversation_id) == (9, 9, "c")
        assert (error.expected_head, error.actual_head) == ("a2", "a3")
        assert await store.read_tree("c") == before
        # A move id is recorded: its retry returns the length of its head's path, even
        # after the head moved on, whatever it expects; another target conflicts.
        assert await store.move_head("c", "a1", expected_head="a3", move_id="m1") == 3
        assert await store.move_head("c", "a2", expected_head="a1") == 6
        assert await store.move_head("c", "a1", expected_head="stale", move_id="m1") == 3
        assert (await store.read_view("c")).head == "a2"  # the retry moved nothing
        with pytest.raises(AppendConflictError, match="'m1'"):
            await store.move_head("c", "a3", expected_head="a2", move_id="m1")
        # The refused moves recorded nothing: m0 is free.
        assert await store.move_head("c", "a3", expected_head="a2", move_id="m0") == 9
        # Move ids are their own namespace: one equal to an append id is a move id.
        assert await store.move_head("c", "", expected_head="a3", move_id="a1") == 0
        assert await store.read("c") == []
        assert await store.conversations() == ["c"]  # still holds its batches
        assert await store.move_head("c", "a3", expected_head="") == 9
        # Moving to the current head changes nothing.
        assert await store.move_head("c", "a3", expected_head="a3") == 9
        await assert_consistent(store, "c")
        # An unknown conversation: its head is "", only "" is a target.
        assert await store.move_head("new", "", expected_head="", move_id="m") == 0
        with pytest.raises(UnknownHeadError):
            await store.move_head("new", "a1", expected_head="")
        assert await store.conversations() == ["c"]
        assert await store.read_tree("new") == HistoryTree((), (), ())
        # Closed: refused first, before the move record and the fence.
        await store.clear("c")
        with pytest.raises(ConversationClosedError):
            await store.move_head("c", "a1", expected_head="a3", move_id="m1")
        await store.clear("never")  # an id never written is closed too
        with pytest.raises(ConversationClosedError):
            await store.move_head("never", "", expected_head="")


@pytest.mark.anyio
@over_backends(*SQL)
async def test_clear_drops_every_branch(kind: str, tmp_path: Path) -> None:
    async with fresh_backend(kind, tmp_path) as backend:
        async with await backend.open() as store:
            await store.append(Batch("c", "a1", turn("one")))
            await store.append(Batch("c", "a2", turn("two")))
            await store.move_head("c", "a1", expected_head="a2", move_id="m")
            await store.append(Batch("c", "b2", turn("b")))
            await store.clear("c")
            assert await store.read_tree("c") == HistoryTree((), (), (), -1, True)
            view = await store.read_view("c")
            assert view.closed and view.head == "" and view.messages == ()
            assert await store.read_batches("c") == []
            assert await store.conversations() == []
            with pytest.raises(ConversationClosedError):
                await store.append(Batch("c", "a2", turn("two")))
        # Nothing of any branch, nor the move record, is left in the tables.
        assert await rows_of(backend, "c") == (0, 0)


async def rows_of(backend: Any, cid: str) -> tuple[int, int]:
    """How many batch rows and move rows ``cid`` has, counted in the tables."""
    tables = (f'"{backend.prefix}_batches"', f'"{backend.prefix}_moves"')
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.url) as conn:
            counts = [
                conn.execute(
                    f"SELECT count(*) FROM {t} WHERE conversation_id = ?", (cid,)
                ).fetchone()[0]
                for t in tables
            ]
        return counts[0], counts[1]
    conn = await import_driver("asyncpg").connect(backend.url)
    try:
        counts = [
            await conn.fetchval(f"SELECT count(*) FROM {t} WHERE conversation_id = $1", cid)
            for t in tables
        ]
    finally:
        await conn.close()
    return counts[0], counts[1]


@pytest.mark.anyio
@over_backends(*SQL)
async def test_bad_arguments_raise_before_any_io(kind: str, tmp_path: Path) -> None:
    async with fresh_backend(kind, tmp_path) as backend:
        store = await backend.open()
        await store.aclose()  # any I/O would raise StoreError
        for bad in ("", " x", "a\n", 3, None):
            with pytest.raises(InvalidConversationIDError):
                await store.read_tree(bad)
            with pytest.raises(InvalidConversationIDError):
                await store.move_head(bad, "", expected_head="")
        for bad in (" x", "a\n", 3, None, b"a1"):
            with pytest.raises(InvalidAppendIDError, match="head"):
                await store.move_head("c", bad, expected_head="")
            with pytest.raises(InvalidAppendIDError, match="expected_head"):
                await store.move_head("c", "", expected_head=bad)
        for bad in ("", " x", 3, b"m"):
            with pytest.raises(InvalidAppendIDError, match="move_id"):
                await store.move_head("c", "", expected_head="", move_id=bad)
        with pytest.raises(StoreError):
            await store.move_head("c", "", expected_head="")


@pytest.mark.anyio
@over_backends(*SQL)
async def test_grouped_appends_on_a_branch_chain_from_the_head(kind: str, tmp_path: Path) -> None:
    # Unfenced appends queued together (SQLite's group commit, PostgreSQL's queued
    # statement) each extend the head the one before it left.
    async with fresh_store(kind, tmp_path) as store:
        for aid in ("a1", "a2"):
            await store.append(Batch("c", aid, turn(aid)))
        await store.move_head("c", "a1", expected_head="a2")
        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(store.append, Batch("c", f"b{i}", turn(f"b{i}")))
        tree = await assert_consistent(store, "c")
        path = [str(b.id) for b in tree.head_path()]
        assert path[0] == "a1" and sorted(path[1:]) == sorted(f"b{i}" for i in range(24))
        assert tree.parents[1] == 0  # a2, the other branch
        assert (await store.read_view("c")).length == 50


@pytest.mark.anyio
@over_backends(*SQL)
async def test_a_rewind_racing_a_turn_exactly_one_wins(kind: str, tmp_path: Path) -> None:
    async with (
        fresh_backend(kind, tmp_path) as backend,
        await backend.open() as one,
        await backend.open() as two,
    ):
        await one.append(Batch("c", "a0", turn("a0")))
        wins = {"append": 0, "move": 0}
        for round_ in range(20):
            view = await one.read_view("c")
            path = await one.read_batches("c")
            target = str(path[-2].id) if len(path) > 1 else ""
            outcomes: list[str] = []

            async def turn_(
                view: Any = view, round_: int = round_, outcomes: list[str] = outcomes
            ) -> None:
                batch = Batch(
                    "c",
                    f"t{round_}",
                    turn(f"t{round_}"),
                    expected_length=view.length,
                    expected_head=view.head,
                )
                try:
                    await one.append(batch)
                    outcomes.append("append")
                except HistoryChangedError:
                    outcomes.append("refused")

            async def rewind(
                view: Any = view, target: str = target, outcomes: list[str] = outcomes
            ) -> None:
                try:
                    await two.move_head("c", target, expected_head=view.head)
                    outcomes.append("move")
                except HistoryChangedError:
                    outcomes.append("refused")

            async with anyio.create_task_group() as tg:
                tg.start_soon(turn_)
                tg.start_soon(rewind)
            assert sorted(outcomes) in (["append", "refused"], ["move", "refused"])
            winner = next(o for o in outcomes if o != "refused")
            wins[winner] += 1
            await assert_consistent(two, "c")
            if winner == "move":  # keep the path growing
                await one.append(Batch("c", f"g{round_}", turn("g")))
        assert wins["append"] + wins["move"] == 20


@pytest.mark.anyio
@over_backends(*SQL)
async def test_cancelled_head_moves_settle(kind: str, tmp_path: Path) -> None:
    # A head move cancelled at any point has moved entirely or not at all; its retry
    # (same move id) lands once and answers the same length.
    rng = random.Random(33)
    async with fresh_store(kind, tmp_path) as store:
        for aid in ("a1", "a2", "a3"):
            await store.append(Batch("c", aid, turn(aid)))
        lengths = {"": 0, "a1": 2, "a2": 4, "a3": 6}
        head = "a3"
        cancelled = 0
        for i in range(60):
            target = rng.choice([t for t in lengths if t != head])
            with anyio.CancelScope() as scope:
                scope.deadline = anyio.current_time() + rng.uniform(0, 0.003)
                await store.move_head("c", target, expected_head=head, move_id=f"m{i}")
            cancelled += scope.cancelled_caught
            tree = await assert_consistent(store, "c")
            now = "" if tree.head == -1 else str(tree.batches[tree.head].id)
            assert now in (head, target)
            # The retry: moves if the first did not, answers the target's length.
            assert (
                await store.move_head("c", target, expected_head=head, move_id=f"m{i}")
                == (lengths[target])
            )
            assert (await store.read_view("c")).head == target
            head = target
        assert cancelled > 0  # some moves were cancelled (before or during their step)
        assert (await shape(store, "c"))[:2] == (["a1", "a2", "a3"], [-1, 0, 1])  # no batch added


@pytest.mark.anyio
@over_backends(*SQL)
async def test_a_broken_parent_chain_is_reported(kind: str, tmp_path: Path) -> None:
    # A parent changed outside scope: read_tree names the batch, the head path's reads
    # find its messages do not add up to the stored length; nothing is returned.
    async with fresh_backend(kind, tmp_path) as backend, await backend.open() as store:
        for aid in ("a1", "a2", "a3"):
            await store.append(Batch("c", aid, turn(aid)))
        await store.move_head("c", "a2", expected_head="a3")
        await store.move_head("c", "a3", expected_head="a2")  # branched: reads walk
        await set_parent(backend, "c", "a3", 7)
        with pytest.raises(StoreError, match=r"'a3'.*parent 7"):
            await store.read_tree("c")
        with pytest.raises(StoreError, match="corrupt"):
            await store.read_view("c")


async def set_parent(backend: Any, cid: str, aid: str, parent: int) -> None:
    """Set batch ``aid``'s stored parent seq, bypassing scope."""
    table = f'"{backend.prefix}_batches"'
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.url, isolation_level=None) as conn:
            conn.execute(
                f"UPDATE {table} SET parent = ? WHERE conversation_id = ? AND append_id = ?",
                (parent, cid, aid),
            )
        return
    conn = await import_driver("asyncpg").connect(backend.url)
    try:
        await conn.execute(
            f"UPDATE {table} SET parent = $1 WHERE conversation_id = $2 AND append_id = $3",
            parent,
            cid,
            aid,
        )
    finally:
        await conn.close()


# -- costs -------------------------------------------------------------------------------


def test_sqlite_linear_reads_cost_what_they_cost_before_branches(tmp_path: Path) -> None:
    # SQLite VM steps (a progress handler on every step) of the statements a read runs.
    # A linear conversation's read is the scan of before branches plus a constant (the
    # branched flag, checked once in the key the scan looks up) and at most one step per
    # batch (the scan's end is compared with a register, not a literal parameter). A
    # conversation with the same head path that has branched (rewound and moved back to
    # its last batch) walks its parents: more steps.
    from scope.historystores.sqlite import SQLiteStore, _Tables

    async def fill() -> None:
        async with await SQLiteStore.open(tmp_path / "h.db") as store:
            for cid, size in (("lin50", 50), ("lin100", 100), ("br", 50)):
                for i in range(size):
                    await store.append(Batch(cid, f"a{i}", turn(f"a{i}")))
            await store.move_head("br", "a0", expected_head="a49")
            await store.move_head("br", "a49", expected_head="a0")
            assert await store.read("br") == await store.read("lin50")

    anyio.run(fill)
    t = _Tables("scope_history")
    before = (  # the read of schema 4
        "SELECT append_id, digest, messages FROM scope_history_batches "
        "WHERE conversation_id = ? ORDER BY seq"
    )
    conn = sqlite3.connect(tmp_path / "h.db")
    try:

        def steps(cid: str, *statements: str) -> tuple[int, int]:
            count = 0

            def tick() -> int:
                nonlocal count
                count += 1
                return 0

            conn.set_progress_handler(tick, 1)
            try:
                rows = [len(conn.execute(sql, (cid,)).fetchall()) for sql in statements]
            finally:
                conn.set_progress_handler(None, 1)
            return count, rows[-1]

        assert steps("lin50", t.read)[1] == 50 and steps("lin100", t.read)[1] == 100
        extra = [steps(cid, t.read)[0] - steps(cid, before)[0] for cid in ("lin50", "lin100")]
        assert 0 <= extra[1] - extra[0] <= 50, extra  # at most one step per batch more
        assert steps("br", t.read) == (steps("br", t.read)[0], 0)  # branched: nothing here
        walked, rows = steps("br", t.read, t.read_path)
        assert rows == 50 and walked > steps("lin50", t.read)[0]
        # The view: the same.
        assert steps("lin50", t.view)[1] == 50
        assert steps("br", t.view)[1] == 1  # the row of the flag
        walked, rows = steps("br", t.view, t.view_path)
        assert rows == 50 and walked > steps("lin50", t.view)[0]
    finally:
        conn.close()


# -- SIGKILL of a process rewinding and appending ------------------------------------------


def turn_of(text: str) -> list[Any]:
    """The child's turns: a user message and an answer, both ``text``."""
    from scope.chat import assistant_message, user_message

    return [user_message(text), assistant_message(text)]


CHILD = """
import sys
import anyio
from scope.chat import assistant_message, user_message
from scope.history import Batch

kind, where, prefix = sys.argv[1], sys.argv[2], sys.argv[3]

async def open_store():
    if kind == "sqlite":
        from scope.historystores.sqlite import SQLiteStore
        return await SQLiteStore.open(where)
    from scope.historystores.postgres import PostgresStore
    return await PostgresStore.open(where, table_prefix=prefix, max_size=1)

async def main() -> None:
    async with await open_store() as store:
        i = 0
        while True:
            view = await store.read_view("k")
            if i % 3 == 2:  # a rewind of one turn
                path = await store.read_batches("k")
                target = str(path[-2].id) if len(path) > 1 else ""
                await store.move_head("k", target, expected_head=view.head, move_id=f"m{i}")
            else:
                batch = Batch("k", f"b{i}", [user_message(f"b{i}"), assistant_message(f"b{i}")],
                              expected_length=view.length, expected_head=view.head)
                await store.append(batch)
            after = await store.read_view("k")
            print(f"ack {i} {after.head or '-'} {after.length}", flush=True)
            i += 1

anyio.run(main, backend="asyncio")
"""


@pytest.mark.parametrize("kill_after", [8, 21, 40])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def test_sigkill_while_rewinding_leaves_the_old_or_the_new_head(
    tmp_path: Path, kind: str, kill_after: int
) -> None:
    if kind == "sqlite":
        where, prefix = str(tmp_path / "killed.db"), "scope_history"
    else:
        import_driver("asyncpg")
        where, prefix = postgres_dsn_or_skip(), unique_table_prefix()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, where, prefix],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert child.stdout is not None
    acked: tuple[int, str, int] = (-1, "", 0)
    try:
        for line in child.stdout:
            _, i, head, length = line.split()
            acked = (int(i), "" if head == "-" else head, int(length))
            if acked[0] + 1 >= kill_after:
                break
        child.send_signal(signal.SIGKILL)  # mid-step: a read, an append or a move
    finally:
        child.kill()
        child.wait()
        for line in child.stdout:  # acks printed before it died, not read yet
            _, i, head, length = line.split()
            acked = (int(i), "" if head == "-" else head, int(length))
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    step = acked[0] + 1  # the step in flight when the child died

    async def verify() -> None:
        if kind == "sqlite":
            from scope.historystores.sqlite import SQLiteStore

            store = await SQLiteStore.open(where)
        else:
            from scope.historystores.postgres import PostgresStore

            store = await PostgresStore.open(where, table_prefix=prefix)
        async with store:
            tree = await assert_consistent(store, "k")  # one head, its path, its length
            view = await store.read_view("k")
            old = (acked[1], acked[2])
            ids = [str(b.id) for b in tree.batches]
            if step % 3 == 2:  # the in-flight step was a rewind
                path = [ids[i] for i in tree.path(ids.index(acked[1]))] if acked[1] else []
                new_head = path[-2] if len(path) > 1 else ""
                new = (new_head, acked[2] - 2)
                assert (view.head, view.length) in (old, new)
                # Its retry settles it: the same move id lands once.
                assert (
                    await store.move_head("k", new_head, expected_head=acked[1], move_id=f"m{step}")
                    == new[1]
                )
            else:  # an append
                new = (f"b{step}", acked[2] + 2)
                assert (view.head, view.length) in (old, new)
                assert f"b{step}" not in ids or view.head == f"b{step}"
                # Its retry settles it: lands once, or is the equal receipt.
                retry = Batch(
                    "k",
                    f"b{step}",
                    turn_of(f"b{step}"),
                    expected_length=acked[2],
                    expected_head=acked[1],
                )
                assert await store.append(retry) == retry.receipt()
                assert (await store.read_view("k")).head == f"b{step}"
            # Every batch acknowledged is still stored; nothing was deleted.
            for i in range(step):
                if i % 3 != 2:
                    assert f"b{i}" in ids

    try:
        anyio.run(verify, backend="asyncio")
    finally:
        if kind == "postgres":
            anyio.run(drop_tables, where, prefix, backend="asyncio")
    if kind == "sqlite":
        conn = sqlite3.connect(where)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute('SELECT version FROM "scope_history_schema"').fetchone() == (
                SCHEMA_VERSION,
            )
        finally:
            conn.close()
