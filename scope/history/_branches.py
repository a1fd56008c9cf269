"""Branches (DESIGN §6h): ``rewind``, ``branches``, ``switch`` and ``fork`` over a store's
``read_tree`` and ``move_head``, and the ``Branch`` that ``branches`` lists."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import final

import attrs

from scope.errors import ConversationClosedError, UnknownHeadError
from scope.history._adapter import as_store
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import Store
from scope.history._tree import HistoryTree, check_head, check_move_id

__all__ = ["Branch", "branches", "fork", "rewind", "switch"]


@final
@attrs.frozen
class Branch:
    """One branch of a conversation, as ``branches`` lists it: the path from the first
    batch to ``head``.

    - ``head``: the receipt of the branch's last batch; None for the empty path (the
      head right after a rewind to the start).
    - ``turns``: how many batches the path holds.
    - ``diverges_at``: the first turn (1-based) of this path that the current head path
      does not share; None for the current branch. A path that extends the head path
      diverges at ``len(head path) + 1``.
    - ``created``: when its last batch was stored (UTC), None where the store did not
      record it (data written before branches) and for the empty path.
    - ``current``: whether this is the head path.
    - ``digest``: the path's chain digest (``HistoryTree.chain``), ``""`` when empty.
    """

    head: Receipt | None
    turns: int
    diverges_at: int | None
    created: datetime | None
    current: bool
    digest: str


def _check_turn(value: object, what: str) -> int:
    if type(value) is not int:
        raise TypeError(
            f"{what} must be an int (a turn of the head path), got {type(value).__name__}"
        )
    if value < 0:
        raise ValueError(f"{what} must be >= 0 (0: before the first turn), got {value}")
    return value


def _head_id(tree: HistoryTree) -> str:
    return "" if tree.head == -1 else str(tree.batches[tree.head].id)


def _turn_target(tree: HistoryTree, cid: ConversationID, to: int, what: str) -> str:
    """The append id of the ``to``-th batch of the head path (``""`` for 0)."""
    if tree.closed:
        raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
    path = tree.path(tree.head)
    if to > len(path):
        raise UnknownHeadError(
            f"conversation {str(cid)!r} has {len(path)} turns on its head path, "
            f"{what}={to} names none"
        )
    return "" if to == 0 else str(tree.batches[path[to - 1]].id)


async def rewind(
    store: Store,
    conversation_id: str,
    *,
    to: int,
    expected_head: str | None = None,
    rewind_id: str | None = None,
) -> int:
    """Move the conversation's head to the end of turn ``to`` of its head path (a turn is
    a batch; 1-based; ``0``: before the first turn), and return the new head path's
    length. Nothing is deleted: the turns after ``to`` stay on their branch
    (``branches``, ``switch``), and the next append extends from the new head.

    It reads the tree once, then moves the head with ``store.move_head``, fenced by
    ``expected_head`` (the head the caller's turn saw) or, when it is None, the head it
    read: a rewind racing a turn that lands first raises ``HistoryChangedError``
    (retryable: read again, decide again), and exactly one of them wins. ``rewind_id``
    makes a retry idempotent (a move id: its retry returns the same length and moves
    nothing again).

    ``to`` not an int raises ``TypeError``, a negative one ``ValueError``, an invalid id,
    ``expected_head`` or ``rewind_id`` ``InvalidConversationIDError`` /
    ``InvalidAppendIDError``, all before any I/O; ``to`` beyond the head path raises
    ``UnknownHeadError``; a closed conversation ``ConversationClosedError``. Nothing
    moves when it raises.
    """
    cid = ConversationID(conversation_id)
    turn = _check_turn(to, "to")
    fence = None if expected_head is None else check_head(expected_head, "expected_head")
    move_id = check_move_id(rewind_id)
    target_store = as_store(store)
    tree = await target_store.read_tree(cid)
    target = _turn_target(tree, cid, turn, "to")
    return await target_store.move_head(
        cid, target, expected_head=_head_id(tree) if fence is None else fence, move_id=move_id
    )


async def switch(
    store: Store,
    conversation_id: str,
    head: Receipt | str,
    *,
    expected_head: str | None = None,
    move_id: str | None = None,
) -> int:
    """Make another branch the head: ``head`` is a batch of the conversation on any
    branch (its ``Receipt``, as ``Branch.head`` gives it, or its append id; ``""``: the
    empty path), and return the new head path's length.

    Fenced like ``rewind``: by ``expected_head``, or the head read with the tree when it
    is None; ``move_id`` makes a retry idempotent. A receipt of another conversation
    raises ``ValueError``, anything but a receipt or a str ``TypeError``, before any
    I/O; a receipt whose digest is not the stored batch's, or a batch the conversation
    does not hold, ``UnknownHeadError``; a closed conversation
    ``ConversationClosedError``. Nothing moves when it raises.
    """
    cid = ConversationID(conversation_id)
    if isinstance(head, Receipt):
        if head.conversation_id != cid:
            raise ValueError(
                f"switch: the receipt is for conversation {str(head.conversation_id)!r}, "
                f"not {str(cid)!r}"
            )
        target = str(head.id)
    elif isinstance(head, str):
        target = check_head(head, "head")
    else:
        raise TypeError(f"switch: head must be a Receipt or a str, got {type(head).__name__}")
    fence = None if expected_head is None else check_head(expected_head, "expected_head")
    mid = check_move_id(move_id)
    target_store = as_store(store)
    tree = await target_store.read_tree(cid)
    if tree.closed:
        raise ConversationClosedError(f"conversation {str(cid)!r} is closed")
    if isinstance(head, Receipt):
        held = [b for b in tree.batches if b.id == head.id]
        if not held or held[0].digest != head.digest:
            raise UnknownHeadError(
                f"conversation {str(cid)!r} holds no batch with receipt "
                f"{str(head.id)!r} {head.digest}: the head was not moved"
            )
    return await target_store.move_head(
        cid, target, expected_head=_head_id(tree) if fence is None else fence, move_id=mid
    )


async def branches(store: Store, conversation_id: str) -> list[Branch]:
    """Every branch of the conversation, from one ``read_tree``: each leaf of the tree
    (a batch no other follows), and the head when it is not a leaf (right after a
    rewind: then the current branch is a prefix of others, possibly the empty path),
    in the stored order of their last batch (the empty path first). ``[]`` for an
    unknown or closed conversation, or one that holds no batch. An invalid id raises
    ``InvalidConversationIDError`` before any I/O.

    Every earlier answer stays reachable: a regenerated or edited turn leaves the old
    one on a branch that ``switch(store, cid, branch.head)`` makes the head again."""
    cid = ConversationID(conversation_id)
    tree = await as_store(store).read_tree(cid)
    if not tree.batches:
        return []
    has_child = [False] * len(tree.batches)
    for parent in tree.parents:
        if parent != -1:
            has_child[parent] = True
    ends = [i for i, child in enumerate(has_child) if not child]
    if tree.head not in ends:
        ends = sorted({*ends, tree.head})
    current = tree.path(tree.head)
    listed: list[Branch] = []
    for end in ends:
        path = tree.path(end)
        shared = 0
        for mine, theirs in zip(path, current, strict=False):
            if mine != theirs:
                break
            shared += 1
        is_current = end == tree.head
        stamp = None if end == -1 else tree.created[end]
        listed.append(
            Branch(
                head=None if end == -1 else tree.batches[end].receipt(),
                turns=len(path),
                diverges_at=None if is_current else shared + 1,
                created=None if stamp is None else datetime.fromtimestamp(stamp, UTC),
                current=is_current,
                digest=tree.chain(end),
            )
        )
    return listed


async def fork(store: Store, conversation_id: str, *, at: int, new_id: str) -> list[Receipt]:
    """Start conversation ``new_id`` with a copy of the first ``at`` turns (batches) of
    ``conversation_id``'s head path, and return their receipts in order.

    The copies keep their append ids and messages (so their digests), each appended
    fenced by the length and the head the copy before it left: a retry after a crash or
    a cancellation finds the copies already made (their retries return their receipts)
    and makes the rest, and a ``new_id`` that holds anything else refuses the copy
    (``HistoryChangedError`` or ``AppendConflictError``) instead of mixing histories.
    The new conversation is independent: cleared, rewound, erased on its own. ``at=0``
    copies nothing and returns ``[]``.

    ``at`` not an int raises ``TypeError``, a negative one or ``new_id`` equal to the
    source ``ValueError``, invalid ids ``InvalidConversationIDError``, all before any
    I/O; ``at`` beyond the head path ``UnknownHeadError``; a closed source
    ``ConversationClosedError``.
    """
    cid = ConversationID(conversation_id)
    turns = _check_turn(at, "at")
    target = ConversationID(new_id)
    if target == cid:
        raise ValueError(f"fork: new_id must name another conversation than {str(cid)!r}")
    target_store = as_store(store)
    tree = await target_store.read_tree(cid)
    _turn_target(tree, cid, turns, "at")
    receipts: list[Receipt] = []
    length, head = 0, ""
    for batch in tree.head_path()[:turns]:
        copy = Batch.from_verified(
            target, batch.id, batch.messages, batch.encoded_messages, batch.digest
        ).fenced(length, head)
        receipts.append(await target_store.append(copy))
        length, head = length + len(batch), str(batch.id)
    return receipts
