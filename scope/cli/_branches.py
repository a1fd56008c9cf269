"""``scope history branches|rewind|switch|inspect`` and the chain check of ``verify`` (DESIGN
§6h): a conversation as the tree of batches it is."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import TextIO

from scope._documents import digest_of
from scope.cli._errors import CLIError
from scope.cli._render import safe
from scope.cli._stores import closed_as, opened_store
from scope.errors import ConversationClosedError, HistoryChangedError, UnknownHeadError
from scope.history import ConversationID, HistoryTree, Store, branches, rewind, switch

__all__ = [
    "chain_problems",
    "inspect_conversation",
    "list_branches",
    "path_ends",
    "rewind_conversation",
    "switch_conversation",
]


def _plural(count: int, word: str) -> str:
    plural = word + ("es" if word.endswith(("ch", "s")) else "s")
    return f"{count} {word if count == 1 else plural}"


def _when(created: float | datetime | None) -> str:
    """A stored time as ISO 8601 UTC to the second, ``-`` when unknown."""
    if created is None:
        return "-"
    moment = created if isinstance(created, datetime) else datetime.fromtimestamp(created, tz=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _tree(store: Store, cid: ConversationID) -> HistoryTree:
    tree = await store.read_tree(cid)
    if tree.closed:
        state = await closed_as(store, cid)
        raise CLIError(f"conversation {str(cid)!r} is {state}: no branches")
    if not tree.batches:
        raise CLIError(f"conversation {str(cid)!r} has no messages (unknown)")
    return tree


async def list_branches(url: str, conversation_id: str, *, out: TextIO) -> int:
    """Print each branch of a conversation, one line each, in the order
    ``scope.history.branches`` gives (stored order of their last batch): ``*`` marks the
    current one (the head path), then its head's append id (``(start)`` for the empty
    path), its turns, where it diverges from the head path, when its last batch was
    stored and its chain digest."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        await _tree(store, cid)
        found = await branches(store, cid)
    out.write(f"conversation {cid}: {_plural(len(found), 'branch')}\n")
    for branch in found:
        head = "(start)" if branch.head is None else str(branch.head.id)
        where = "current" if branch.current else f"diverges at turn {branch.diverges_at}"
        line = (
            f"{'*' if branch.current else ' '} {head}  {_plural(branch.turns, 'turn')}  "
            f"{where}  {_when(branch.created)}  {branch.digest or '-'}"
        )
        out.write(safe(line) + "\n")
    out.flush()
    return 0


async def rewind_conversation(
    url: str, conversation_id: str, *, to: int, expected_head: str | None, out: TextIO
) -> int:
    """``scope.history.rewind``: move the head to the end of turn ``to`` (0: before the
    first); nothing is deleted. A moved head (``--expected-head``), an unknown turn or a
    closed conversation is a ``CLIError`` (exit 1), nothing moved."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        try:
            length = await rewind(store, cid, to=to, expected_head=expected_head)
        except ConversationClosedError:
            state = await closed_as(store, cid)
            raise CLIError(f"conversation {str(cid)!r} is {state}; nothing was moved") from None
        except (HistoryChangedError, UnknownHeadError) as exc:
            raise CLIError(f"{exc}; nothing was moved") from None
        tree = await store.read_tree(cid)
    head = "(start)" if tree.head == -1 else str(tree.batches[tree.head].id)
    out.write(
        safe(
            f"rewound conversation {cid} to turn {to}: head {head}, "
            f"{_plural(length, 'message')} on the head path (nothing deleted: "
            "scope history branches lists the others)"
        )
        + "\n"
    )
    out.flush()
    return 0


async def switch_conversation(
    url: str, conversation_id: str, *, to: str, expected_head: str | None, out: TextIO
) -> int:
    """``scope.history.switch``: make the branch ending at batch ``to`` (an append id as
    ``scope history branches`` lists it; ``""``: the empty path) the head, so the next
    turn extends it; nothing is deleted. A moved head (``--expected-head``), a batch the
    conversation does not hold or a closed conversation is a ``CLIError`` (exit 1),
    nothing moved."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        try:
            length = await switch(store, cid, to, expected_head=expected_head)
        except ConversationClosedError:
            state = await closed_as(store, cid)
            raise CLIError(f"conversation {str(cid)!r} is {state}; nothing was moved") from None
        except (HistoryChangedError, UnknownHeadError) as exc:
            raise CLIError(f"{exc}; nothing was moved") from None
        tree = await store.read_tree(cid)
    head = "(start)" if tree.head == -1 else str(tree.batches[tree.head].id)
    turns = len(tree.path(tree.head))
    out.write(
        safe(
            f"switched conversation {cid} to the branch ending at {head}: "
            f"{_plural(turns, 'turn')}, {_plural(length, 'message')} on the head path "
            "(nothing deleted: scope history branches lists the others)"
        )
        + "\n"
    )
    out.flush()
    return 0


def path_ends(tree: HistoryTree) -> list[int]:
    """The batch index at the end of every path worth naming: every leaf, and the head
    when it is not one (-1 for the empty path), in stored order."""
    parents = set(tree.parents)
    ends = [i for i in range(len(tree.batches)) if i not in parents]
    if tree.head not in ends:
        ends.append(tree.head)
    return sorted(ends)


def chain_problems(tree: HistoryTree) -> list[str]:
    """What is wrong with the chain digest of each path of ``tree``: every path (to a
    leaf, and to the head) has its chain recomputed from its batches' messages (their
    canonical bytes, hashed again) and compared with the chain of the digests the store
    keeps (``HistoryTree.chain``). Empty when every path is sound."""
    problems: list[str] = []
    own: dict[int, str] = {-1: ""}
    for index, batch in enumerate(tree.batches):  # parents come first
        text = own[tree.parents[index]] + "\n" + digest_of(batch.encoded_messages)
        own[index] = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    for end in path_ends(tree):
        kept, recomputed = tree.chain(end), own[end]
        if kept == recomputed:
            continue
        bad = [
            f"batch {str(tree.batches[i].id)!r} (#{n})"
            for n, i in enumerate(tree.path(end), 1)
            if digest_of(tree.batches[i].encoded_messages) != tree.batches[i].digest
        ]
        problems.append(
            f"the path to batch {str(tree.batches[end].id)!r} chains to {kept}, its messages "
            f"to {recomputed} (digest mismatch in {', '.join(bad)})"
        )
    return problems


def _short(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}:{hexdigest[:12]}" if hexdigest else digest


async def inspect_conversation(url: str, conversation_id: str, *, out: TextIO) -> int:
    """Print a conversation's tree: every batch of every branch, each under the batch it
    follows (``(start)`` at the top), in stored order, with its message count, when it
    was stored and its digest (shortened), the head marked ``<- head``; then each
    path's chain digest."""
    cid = ConversationID(conversation_id)
    async with opened_store(url) as store:
        tree = await _tree(store, cid)
    children: dict[int, list[int]] = {}
    for index, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(index)
    path = tree.path(tree.head)
    messages = sum(len(tree.batches[i]) for i in path)
    head = "(start)" if tree.head == -1 else str(tree.batches[tree.head].id)
    ends = path_ends(tree)
    lines = [
        f"conversation {cid}: {_plural(len(tree.batches), 'batch')}, "
        f"{_plural(len(ends), 'path')}; head {head} ({_plural(len(path), 'turn')}, "
        f"{_plural(messages, 'message')})",
        "(start)" + ("  <- head" if tree.head == -1 else ""),
    ]

    def walk(index: int, prefix: str) -> None:
        below = children.get(index, [])
        for n, child in enumerate(below):
            last = n == len(below) - 1
            batch = tree.batches[child]
            mark = "  <- head" if child == tree.head else ""
            lines.append(
                f"{prefix}{'└── ' if last else '├── '}{batch.id}  "
                f"{_plural(len(batch), 'message')}  {_when(tree.created[child])}  "
                f"{_short(batch.digest)}{mark}"
            )
            walk(child, prefix + ("    " if last else "│   "))

    walk(-1, "")
    lines.append("paths (chain digests):")
    for end in ends:
        name = "(start)" if end == -1 else str(tree.batches[end].id)
        lines.append(f"  {name}: {tree.chain(end) or '-'}")
    for line in lines:
        out.write(safe(line) + "\n")
    out.flush()
    return 0
