"""``scope history branches|rewind|switch|inspect`` and ``verify``'s chain check (DESIGN §6h),
in process, over the in-memory reference store (the command line's store opener is
pointed at it): the lines a user sees, exit statuses, nothing moved on error.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator
from typing import Any

import pytest

from scope.chat import assistant_message, user_message
from scope.cli import _stores, main
from scope.cli._branches import (
    chain_problems,
    inspect_conversation,
    list_branches,
    path_ends,
    rewind_conversation,
    switch_conversation,
)
from scope.cli._errors import CLIError
from scope.cli._verify import _path_problems
from scope.errors import StoreError
from scope.history import Batch, HistoryTree, rewind
from scope.history.inmemory import InMemoryStore

pytestmark = pytest.mark.anyio


class Handle(InMemoryStore):
    """The in-memory store as the command line holds a store (closed with ``aclose``)."""

    async def aclose(self) -> None:
        pass


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Handle]:
    handle = Handle()

    async def open_store(url: str, *, create: bool = True) -> Any:
        return handle

    monkeypatch.setattr(_stores, "open_cli_store", open_store)
    yield handle


def turn(cid: str, append_id: str, text: str) -> Batch:
    return Batch(cid, append_id, (user_message(text), assistant_message(f"re: {text}")))


async def branched(store: Handle) -> None:
    """``c``: a1 -> a2, then rewound to 1 and a3 (a sibling of a2), rewound to 0 and a4."""
    await store.append(turn("c", "a1", "q1"))
    await store.append(turn("c", "a2", "q2"))
    await rewind(store, "c", to=1)
    await store.append(turn("c", "a3", "q2b"))
    await rewind(store, "c", to=0)
    await store.append(turn("c", "a4", "q1b"))


def chain(*digests: str) -> str:
    value = ""
    for digest in digests:
        value = "sha256:" + hashlib.sha256((value + "\n" + digest).encode()).hexdigest()
    return value


async def test_branches_lists_every_branch(store: Handle) -> None:
    await branched(store)
    out = io.StringIO()
    assert await list_branches("memory://", "c", out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "conversation c: 3 branches"
    tree = await store.read_tree("c")
    digests = [b.digest for b in tree.batches]
    when = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    expected = [
        rf"  a2  2 turns  diverges at turn 1  {when}  {chain(digests[0], digests[1])}",
        rf"  a3  2 turns  diverges at turn 1  {when}  {chain(digests[0], digests[2])}",
        rf"\* a4  1 turn  current  {when}  {chain(digests[3])}",
    ]
    assert len(lines) == 4
    for line, pattern in zip(lines[1:], expected, strict=True):
        assert re.fullmatch(pattern, line), line


async def test_branches_right_after_a_rewind_shows_the_empty_head(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await rewind(store, "c", to=0)
    out = io.StringIO()
    await list_branches("memory://", "c", out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "conversation c: 2 branches"
    assert "* (start)  0 turns  current  -  -" in lines
    assert any(line.startswith("  a1  1 turn  diverges at turn 1  ") for line in lines)


async def test_rewind_moves_the_head_and_deletes_nothing(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await store.append(turn("c", "a2", "q2"))
    out = io.StringIO()
    assert await rewind_conversation("memory://", "c", to=1, expected_head="a2", out=out) == 0
    assert out.getvalue() == (
        "rewound conversation c to turn 1: head a1, 2 messages on the head path (nothing "
        "deleted: scope history branches lists the others)\n"
    )
    assert [m.text for m in await store.read("c")] == ["q1", "re: q1"]
    assert len((await store.read_tree("c")).batches) == 2


@pytest.mark.parametrize(
    ("to", "expected_head", "problem"),
    [
        (3, None, "UnknownHead|turn 3|3"),
        (0, "a1", "expected head 'a1'"),
    ],
)
async def test_rewind_errors_move_nothing(
    store: Handle, to: int, expected_head: str | None, problem: str
) -> None:
    await store.append(turn("c", "a1", "q1"))
    await store.append(turn("c", "a2", "q2"))
    before = await store.read_tree("c")
    with pytest.raises(CLIError, match=problem) as caught:
        await rewind_conversation(
            "memory://", "c", to=to, expected_head=expected_head, out=io.StringIO()
        )
    assert str(caught.value).endswith("; nothing was moved")
    assert await store.read_tree("c") == before


async def test_rewind_of_a_closed_conversation(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await store.clear("c")
    with pytest.raises(CLIError, match="nothing was moved"):
        await rewind_conversation("memory://", "c", to=0, expected_head=None, out=io.StringIO())


async def test_switch_makes_an_old_branch_the_head_and_deletes_nothing(store: Handle) -> None:
    await branched(store)  # head a4; a2 and a3 on their branches
    before = (await store.read_tree("c")).batches
    out = io.StringIO()
    assert await switch_conversation("memory://", "c", to="a2", expected_head="a4", out=out) == 0
    assert out.getvalue() == (
        "switched conversation c to the branch ending at a2: 2 turns, 4 messages on the "
        "head path (nothing deleted: scope history branches lists the others)\n"
    )
    assert [m.text for m in await store.read("c")] == ["q1", "re: q1", "q2", "re: q2"]
    assert (await store.read_tree("c")).batches == before
    out = io.StringIO()
    assert await switch_conversation("memory://", "c", to="", expected_head=None, out=out) == 0
    assert out.getvalue().startswith(
        "switched conversation c to the branch ending at (start): 0 turns, 0 messages"
    )
    assert await store.read("c") == []


@pytest.mark.parametrize(
    ("to", "expected_head", "problem"),
    [
        ("a9", None, "UnknownHead|a9"),
        ("a2", "a1", "expected head 'a1'"),
    ],
)
async def test_switch_errors_move_nothing(
    store: Handle, to: str, expected_head: str | None, problem: str
) -> None:
    await branched(store)
    before = await store.read_tree("c")
    with pytest.raises(CLIError, match=problem) as caught:
        await switch_conversation(
            "memory://", "c", to=to, expected_head=expected_head, out=io.StringIO()
        )
    assert str(caught.value).endswith("; nothing was moved")
    assert await store.read_tree("c") == before


async def test_switch_of_a_closed_conversation(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await store.clear("c")
    with pytest.raises(CLIError, match=r"^conversation 'c' is cleared; nothing was moved$"):
        await switch_conversation("memory://", "c", to="a1", expected_head=None, out=io.StringIO())


async def test_inspect_shows_the_tree(store: Handle) -> None:
    await branched(store)
    out = io.StringIO()
    assert await inspect_conversation("memory://", "c", out=out) == 0
    tree = await store.read_tree("c")
    short = {b.id: b.digest[: len("sha256:") + 12] for b in tree.batches}
    when = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    patterns = [
        r"conversation c: 4 batches, 3 paths; head a4 \(1 turn, 2 messages\)",
        r"\(start\)",
        rf"├── a1  2 messages  {when}  {short['a1']}",
        rf"│   ├── a2  2 messages  {when}  {short['a2']}",
        rf"│   └── a3  2 messages  {when}  {short['a3']}",
        rf"└── a4  2 messages  {when}  {short['a4']}  <- head",
        r"paths \(chain digests\):",
        rf"  a2: {tree.chain(1)}",
        rf"  a3: {tree.chain(2)}",
        rf"  a4: {tree.chain(3)}",
    ]
    lines = out.getvalue().splitlines()
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns, strict=True):
        assert re.fullmatch(pattern, line), line


async def test_inspect_marks_an_empty_head(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await rewind(store, "c", to=0)
    out = io.StringIO()
    await inspect_conversation("memory://", "c", out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "conversation c: 1 batch, 2 paths; head (start) (0 turns, 0 messages)"
    assert lines[1] == "(start)  <- head"
    assert lines[-2:] == ["  (start): -", f"  a1: {(await store.read_tree('c')).chain(0)}"]


@pytest.mark.parametrize("command", [inspect_conversation, list_branches])
async def test_unknown_and_closed_conversations(store: Handle, command: Any) -> None:
    with pytest.raises(CLIError, match=r"conversation 'nope' has no messages \(unknown\)"):
        await command("memory://", "nope", out=io.StringIO())
    await store.append(turn("c", "a1", "q1"))
    await store.clear("c")
    with pytest.raises(CLIError, match=r"^conversation 'c' is cleared: no branches$"):
        await command("memory://", "c", out=io.StringIO())


def test_the_commands_through_main(store: Handle, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    anyio.run(store.append, turn("c", "a1", "q1"))
    anyio.run(store.append, turn("c", "a2", "q2"))
    store_url = "postgresql://unused/db"  # the opener is the fixture's, whatever the URL
    assert main(["history", "rewind", "--store", store_url, "c", "--to", "1"]) == 0
    assert "rewound conversation c to turn 1: head a1" in capsys.readouterr().out
    assert main(["history", "branches", "--store", store_url, "c"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "conversation c: 2 branches"  # a2's, and the head a1 (not a leaf)
    assert listed[1].startswith("* a1  1 turn  current  ")
    assert main(["history", "inspect", "--store", store_url, "c"]) == 0
    assert "<- head" in capsys.readouterr().out
    status = main(
        ["history", "rewind", "--store", store_url, "c", "--to", "0", "--expected-head", "a2"]
    )
    assert status == 1
    assert "nothing was moved" in capsys.readouterr().err
    assert main(["history", "rewind", "--store", store_url, "c", "--to", "-1"]) == 2
    assert main(["history", "switch", "--store", store_url, "c", "--to", "a2"]) == 0
    assert "to the branch ending at a2: 2 turns" in capsys.readouterr().out
    assert [m.text for m in anyio.run(store.read, "c")] == ["q1", "re: q1", "q2", "re: q2"]
    status = main(["history", "switch", "--store", store_url, "c", "--to", "nope"])
    assert status == 1
    assert "nothing was moved" in capsys.readouterr().err
    assert main(["history", "switch", "--store", store_url, "c"]) == 2  # --to is required


# -------------------------------------------------------------- the chain check


def tampered(tree: HistoryTree, index: int) -> HistoryTree:
    """``tree`` with ``batches[index]`` keeping its messages under another digest."""
    batch = tree.batches[index]
    forged = Batch.from_verified(
        batch.conversation_id,
        batch.id,
        batch.messages,
        batch.encoded_messages,
        "sha256:" + "0" * 64,
    )
    batches = list(tree.batches)
    batches[index] = forged
    return HistoryTree(batches, tree.parents, tree.created, tree.head, tree.closed)


async def test_chain_problems_name_every_path_through_a_bad_batch(store: Handle) -> None:
    await branched(store)
    tree = await store.read_tree("c")
    assert chain_problems(tree) == []
    assert path_ends(tree) == [1, 2, 3]
    problems = chain_problems(tampered(tree, 0))
    assert len(problems) == 2  # a1 is on the paths to a2 and a3, not on a4's
    assert problems[0].startswith("the path to batch 'a2' chains to sha256:")
    assert problems[0].endswith("(digest mismatch in batch 'a1' (#1))")
    assert problems[1].startswith("the path to batch 'a3' chains to ")
    assert chain_problems(tampered(tree, 3)) == [
        f"the path to batch 'a4' chains to {tampered(tree, 3).chain(3)}, its messages to "
        f"{tree.chain(3)} (digest mismatch in batch 'a4' (#1))"
    ]


async def test_the_head_is_a_path_end_when_it_is_not_a_leaf(store: Handle) -> None:
    await store.append(turn("c", "a1", "q1"))
    await store.append(turn("c", "a2", "q2"))
    await rewind(store, "c", to=1)
    tree = await store.read_tree("c")
    assert path_ends(tree) == [0, 1]
    assert len(chain_problems(tampered(tree, 0))) == 2


class Broken(Handle):
    """A store whose tree forges a digest."""

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        return tampered(await super().read_tree(conversation_id), 0)


async def test_verify_checks_the_paths_of_a_store_with_branches() -> None:
    store = Broken()
    await store.append(turn("c", "a1", "q1"))
    problems = await _path_problems(store, "c")
    assert len(problems) == 1 and "digest mismatch in batch 'a1'" in problems[0]
    assert await _path_problems(Handle(), "c") == []  # nothing stored: nothing to check
    assert await _path_problems(object(), "c") == []  # a store without branches
    assert await _path_problems(store, " not an id") == []  # named by the record check


class Unreadable(Handle):
    """A store whose tree read is refused (a role that may read records only)."""

    async def read_tree(self, conversation_id: str) -> HistoryTree:
        raise StoreError("NOPERM this user has no permissions to run the 'evalsha' command")


async def test_a_tree_that_cannot_be_read_is_reported_not_hidden() -> None:
    refused = await _path_problems(Unreadable(), "c")
    assert isinstance(refused, StoreError) and "NOPERM" in str(refused)


async def test_show_of_a_conversation_rewound_to_its_start(store: Handle) -> None:
    from scope.cli._history import show_conversation

    await store.append(turn("c", "a1", "q1"))
    out = io.StringIO()
    assert await show_conversation("memory://", "c", as_json=False, out=out) == 0
    assert "batch a1" in out.getvalue()
    await rewind(store, "c", to=0)
    with pytest.raises(
        CLIError,
        match=r"no messages on its head path \(rewound to its start\); its 1 batch is on other",
    ):
        await show_conversation("memory://", "c", as_json=False, out=io.StringIO())
    with pytest.raises(CLIError, match=r"'nope' has no messages \(unknown\)"):
        await show_conversation("memory://", "nope", as_json=False, out=io.StringIO())
