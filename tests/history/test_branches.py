"""Branches (DESIGN §6h): rewind, branches, switch, fork, Branch and HistoryTree.chain,
over the in-memory store, under asyncio and trio."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from scope.chat import Message, assistant_message, user_message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidAppendIDError,
    InvalidConversationIDError,
    InvalidViewError,
    UnknownHeadError,
)
from scope.history import (
    Batch,
    Branch,
    HistoryTree,
    Receipt,
    branches,
    fork,
    rewind,
    switch,
)
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio


def _turn(tag: str) -> list[Message]:
    return [user_message(f"{tag}?"), assistant_message(f"{tag}!")]


def _texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def _three(store: InMemoryStore, cid: str = "c") -> list[Receipt]:
    return [await store.append(Batch(cid, f"t{i}", _turn(f"t{i}"))) for i in (1, 2, 3)]


# -- HistoryTree.chain ----------------------------------------------------------------


def test_chain_digest_covers_the_path_in_order() -> None:
    a, b, c = (Batch("c", i, _turn(i)) for i in ("a", "b", "c"))
    tree = HistoryTree((a, b, c), (-1, 0, 0), (None, None, None), 2)
    assert tree.chain(-1) == ""
    first = "sha256:" + hashlib.sha256(("\n" + a.digest).encode()).hexdigest()
    assert tree.chain(0) == first
    assert (
        tree.chain(2) == "sha256:" + hashlib.sha256((first + "\n" + c.digest).encode()).hexdigest()
    )
    assert tree.chain(1) != tree.chain(2)
    # The same batches in another order chain differently.
    swapped = HistoryTree((b, a), (-1, 0), (None, None), 1)
    linear = HistoryTree((a, b), (-1, 0), (None, None), 1)
    assert swapped.chain(1) != linear.chain(1)


@pytest.mark.parametrize("bad", [3, -2, "0", None, 1.0])
def test_chain_of_no_batch_raises_index_error(bad: Any) -> None:
    tree = HistoryTree((Batch("c", "a", _turn("a")),), (-1,), (None,), 0)
    with pytest.raises(IndexError):
        tree.chain(bad)


_A = Batch("c", "a", [user_message("a?"), assistant_message("a!")])


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"batches": (_A,), "parents": (), "created": (None,)}, "one parent and one created"),
        ({"batches": ("x",), "parents": (-1,), "created": (None,)}, r"batches\[0\] must be"),
        ({"batches": (_A,), "parents": (0,), "created": (None,)}, r"parents\[0\] must be"),
        ({"batches": (_A,), "parents": (-2,), "created": (None,)}, r"parents\[0\] must be"),
        ({"batches": (_A,), "parents": (-1,), "created": ("now",)}, r"created\[0\] must be"),
        ({"batches": (_A,), "parents": (-1,), "created": (1,)}, r"created\[0\] must be"),
        ({"batches": (_A,), "parents": (-1,), "created": (float("nan"),)}, r"created\[0\]"),
        ({"batches": (_A,), "parents": (-1,), "created": (None,), "head": 1}, "head must be"),
        ({"batches": (), "parents": (), "created": (), "head": True}, "head must be"),
        ({"batches": (), "parents": (), "created": (), "closed": 1}, "closed must be"),
        (
            {"batches": (_A,), "parents": (-1,), "created": (None,), "closed": True},
            "closed conversation's tree holds no batches",
        ),
    ],
)
def test_tree_validation(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidViewError, match=match):
        HistoryTree(**fields)


def test_tree_paths() -> None:
    b = Batch("c", "b", _turn("b"))
    tree = HistoryTree((_A, b, b), (-1, 0, -1), (1.5, None, 2.0), 1)
    assert tree.path(1) == (0, 1) and tree.path(2) == (2,) and tree.path(-1) == ()
    assert tree.head_path() == (_A, b)


# -- rewind -----------------------------------------------------------------------------


async def test_rewind_moves_the_head_and_keeps_every_batch() -> None:
    store = InMemoryStore()
    await _three(store)
    assert await rewind(store, "c", to=2) == 4
    assert _texts(await store.read("c")) == ["t1?", "t1!", "t2?", "t2!"]
    assert await rewind(store, "c", to=0) == 0
    assert await store.read("c") == []
    assert len((await store.read_tree("c")).batches) == 3
    assert await store.conversations() == ["c"]


@pytest.mark.parametrize(
    ("to", "error"),
    [("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError), (-1, ValueError)],
)
async def test_rewind_rejects_a_bad_turn_before_io(to: Any, error: type[Exception]) -> None:
    store = InMemoryStore()
    await _three(store)
    with anyio.CancelScope() as scope:
        scope.cancel()  # any I/O would be cancelled: the error comes first
        with pytest.raises(error, match="to must be"):
            await rewind(store, "c", to=to)
    assert len(await store.read("c")) == 6


async def test_rewind_rejects_bad_ids_before_io() -> None:
    store = InMemoryStore()
    with pytest.raises(InvalidConversationIDError):
        await rewind(store, " c", to=0)
    with pytest.raises(InvalidAppendIDError, match="expected_head"):
        await rewind(store, "c", to=0, expected_head="bad\n")
    with pytest.raises(InvalidAppendIDError, match="move_id"):
        await rewind(store, "c", to=0, rewind_id="")


async def test_rewind_beyond_the_head_path_is_an_unknown_head() -> None:
    store = InMemoryStore()
    await _three(store)
    await rewind(store, "c", to=1)
    with pytest.raises(UnknownHeadError, match="1 turns on its head path, to=2"):
        await rewind(store, "c", to=2)  # t2 exists, but not on the head path
    with pytest.raises(UnknownHeadError):
        await rewind(store, "unknown", to=1)
    assert len(await store.read("c")) == 2


async def test_rewind_of_a_closed_conversation_raises_closed() -> None:
    store = InMemoryStore()
    await _three(store)
    await store.clear("c")
    for to in (0, 2):
        with pytest.raises(ConversationClosedError):
            await rewind(store, "c", to=to)


async def test_rewind_is_fenced_by_the_expected_head() -> None:
    store = InMemoryStore()
    await _three(store)
    with pytest.raises(HistoryChangedError) as caught:
        await rewind(store, "c", to=1, expected_head="t2")
    assert (caught.value.expected_head, caught.value.actual_head) == ("t2", "t3")
    assert len(await store.read("c")) == 6
    assert await rewind(store, "c", to=1, expected_head="t3") == 2


async def test_rewind_retry_with_its_rewind_id_is_idempotent() -> None:
    store = InMemoryStore()
    await _three(store)
    assert await rewind(store, "c", to=1, rewind_id="r1") == 2
    await store.append(Batch("c", "n2", _turn("n2")))
    # The retry (the first answer was lost) moves nothing: n2 stays the head.
    assert await rewind(store, "c", to=1, rewind_id="r1") == 2
    assert (await store.read_view("c")).head == "n2"
    with pytest.raises(AppendConflictError):
        await rewind(store, "c", to=0, rewind_id="r1")


async def test_rewind_racing_a_turn_exactly_one_wins() -> None:
    # A turn read the history, then a rewind lands before its append (or the other way).
    for rewind_first in (True, False):
        store = InMemoryStore()
        await _three(store)
        view = await store.read_view("c")
        turn = Batch("c", "t4", _turn("t4"), view.length, view.head)
        if rewind_first:
            await rewind(store, "c", to=1, expected_head=view.head)
            with pytest.raises(HistoryChangedError):
                await store.append(turn)
            assert (await store.read_view("c")).head == "t1"
        else:
            await store.append(turn)
            with pytest.raises(HistoryChangedError):
                await rewind(store, "c", to=1, expected_head=view.head)
            assert (await store.read_view("c")).head == "t4"


# -- switch -----------------------------------------------------------------------------


async def test_switch_by_receipt_or_append_id() -> None:
    store = InMemoryStore()
    receipts = await _three(store)
    await rewind(store, "c", to=1)
    assert await switch(store, "c", receipts[2]) == 6
    assert (await store.read_view("c")).head == "t3"
    assert await switch(store, "c", "t2", expected_head="t3", move_id="s1") == 4
    assert await switch(store, "c", "t2", expected_head="t3", move_id="s1") == 4  # retry
    assert await switch(store, "c", "") == 0


async def test_switch_validation() -> None:
    store = InMemoryStore()
    receipts = await _three(store)
    other = Receipt("d", "t1", receipts[0].digest)
    with pytest.raises(ValueError, match="receipt is for conversation 'd'"):
        await switch(store, "c", other)
    with pytest.raises(TypeError, match="Receipt or a str"):
        await switch(store, "c", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidAppendIDError):
        await switch(store, "c", "bad\n")
    forged = Receipt("c", "t1", receipts[1].digest)  # t1's id, t2's digest
    with pytest.raises(UnknownHeadError, match="no batch with receipt 't1'"):
        await switch(store, "c", forged)
    with pytest.raises(UnknownHeadError):
        await switch(store, "c", "nope")
    with pytest.raises(HistoryChangedError):
        await switch(store, "c", "t1", expected_head="t1")
    assert (await store.read_view("c")).head == "t3"
    await store.clear("c")
    with pytest.raises(ConversationClosedError):
        await switch(store, "c", receipts[0])


# -- branches ---------------------------------------------------------------------------


async def test_branches_of_a_linear_conversation_is_one_current_branch() -> None:
    store = InMemoryStore()
    assert await branches(store, "c") == []
    before = time.time()
    receipts = await _three(store)
    (only,) = await branches(store, "c")
    tree = await store.read_tree("c")
    assert only == Branch(
        head=receipts[2],
        turns=3,
        diverges_at=None,
        created=only.created,
        current=True,
        digest=tree.chain(2),
    )
    assert only.created is not None and only.created.tzinfo is UTC
    assert before - 1 <= only.created.timestamp() <= time.time() + 1
    await store.clear("c")
    assert await branches(store, "c") == []


async def test_branches_after_regenerate_keep_every_answer() -> None:
    # Regenerate the last turn twice: three answers to the same question, all retrievable.
    store = InMemoryStore()
    await _three(store)
    for n in (1, 2):
        await rewind(store, "c", to=2)
        await store.append(Batch("c", f"again{n}", _turn(f"again{n}")))
    listed = await branches(store, "c")
    assert [str(b.head.id) for b in listed if b.head] == ["t3", "again1", "again2"]
    assert [b.current for b in listed] == [False, False, True]
    assert [b.diverges_at for b in listed] == [3, 3, None]
    assert all(b.turns == 3 for b in listed)
    for branch in listed:
        assert branch.head is not None
        await switch(store, "c", branch.head)
        answer = (await store.read("c"))[-1].text
        assert answer == f"{branch.head.id}!"


async def test_branches_after_edit_and_a_rewind_to_the_start() -> None:
    store = InMemoryStore()
    await _three(store)
    await rewind(store, "c", to=1)  # edit turn 2
    await store.append(Batch("c", "e2", _turn("e2")))
    await rewind(store, "c", to=0)  # the head is the empty path, not a leaf
    listed = await branches(store, "c")
    assert [None if b.head is None else str(b.head.id) for b in listed] == [None, "t3", "e2"]
    empty = listed[0]
    assert (empty.current, empty.turns, empty.diverges_at, empty.created, empty.digest) == (
        True,
        0,
        None,
        None,
        "",
    )
    assert [(b.turns, b.diverges_at) for b in listed[1:]] == [(3, 1), (2, 1)]
    await switch(store, "c", "e2")
    listed = await branches(store, "c")
    assert [(str(b.head.id), b.diverges_at) for b in listed if b.head] == [("t3", 2), ("e2", None)]


async def test_branches_list_a_head_inside_a_branch() -> None:
    store = InMemoryStore()
    receipts = await _three(store)
    await rewind(store, "c", to=2)
    listed = await branches(store, "c")
    assert [(b.head, b.turns, b.diverges_at, b.current) for b in listed] == [
        (receipts[1], 2, None, True),
        (receipts[2], 3, 3, False),
    ]


async def test_branches_rejects_a_bad_id_before_io() -> None:
    with pytest.raises(InvalidConversationIDError):
        await branches(InMemoryStore(), "")


# -- fork -------------------------------------------------------------------------------


async def test_fork_copies_the_head_path_prefix_into_an_independent_conversation() -> None:
    store = InMemoryStore()
    await _three(store)
    await rewind(store, "c", to=2)
    await store.append(Batch("c", "b3", _turn("b3")))
    receipts = await fork(store, "c", at=3, new_id="d")
    assert [str(r.id) for r in receipts] == ["t1", "t2", "b3"]
    assert all(r.conversation_id == "d" for r in receipts)
    assert _texts(await store.read("d")) == _texts(await store.read("c"))
    tree = await store.read_tree("d")
    assert (tree.parents, tree.head) == ((-1, 0, 1), 2)
    # The chain digests agree: the copy is the same path.
    source = await store.read_tree("c")
    assert tree.chain(2) == source.chain(source.head)
    await store.clear("d")
    assert len(await store.read("c")) == 6
    assert await fork(store, "c", at=0, new_id="e") == []
    assert await store.conversations() == ["c"]


async def test_fork_is_retry_safe() -> None:
    store = InMemoryStore()
    await _three(store)
    # A fork interrupted after its first copy: the retry finishes it.
    first = (await store.read_batches("c"))[0]
    await store.append(Batch("d", first.id, first.messages, 0, ""))
    receipts = await fork(store, "c", at=3, new_id="d")
    assert [str(r.id) for r in receipts] == ["t1", "t2", "t3"]
    assert await fork(store, "c", at=3, new_id="d") == receipts  # and again
    assert len((await store.read_tree("d")).batches) == 3


async def test_fork_refuses_a_target_holding_something_else() -> None:
    store = InMemoryStore()
    await _three(store)
    await store.append(Batch("d", "x1", _turn("x1")))
    with pytest.raises(HistoryChangedError):
        await fork(store, "c", at=2, new_id="d")
    await store.append(Batch("e", "t1", _turn("other")))
    with pytest.raises(AppendConflictError):
        await fork(store, "c", at=2, new_id="e")
    assert _texts(await store.read("d")) == ["x1?", "x1!"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"at": "1", "new_id": "d"}, TypeError, "at must be an int"),
        ({"at": -1, "new_id": "d"}, ValueError, "at must be >= 0"),
        ({"at": 1, "new_id": "c"}, ValueError, "another conversation"),
        ({"at": 1, "new_id": " d"}, InvalidConversationIDError, "conversation id"),
    ],
)
async def test_fork_validation_before_io(kwargs: Any, error: type[Exception], match: str) -> None:
    store = InMemoryStore()
    await _three(store)
    with anyio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(error, match=match):
            await fork(store, "c", **kwargs)
    assert await store.conversations() == ["c"]


async def test_fork_beyond_the_head_path_or_of_a_closed_conversation() -> None:
    store = InMemoryStore()
    await _three(store)
    with pytest.raises(UnknownHeadError):
        await fork(store, "c", at=4, new_id="d")
    await store.clear("c")
    with pytest.raises(ConversationClosedError):
        await fork(store, "c", at=1, new_id="d")
    assert await store.read("d") == []


def test_branch_is_frozen_and_final() -> None:
    branch = Branch(None, 0, None, datetime.now(UTC), True, "")
    with pytest.raises(AttributeError):
        branch.turns = 1  # type: ignore[misc]
