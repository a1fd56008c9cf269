"""The ``MoveHead`` layer (DESIGN §6h, §6m): a turn that starts from another point of
the conversation's tree, the head move being the turn's own first step.

``Conversation.regenerate``/``edit`` run their new turn behind a Middleware with this
layer. Inside the lease layer (when there is one), the head moves after the turn holds
the conversation's lease and before the history is read, so a turn of another caller
that holds the lease is never refused at its commit because the head moved under it:
the move waits for (``"wait"``), is refused by (``"reject"``) or stops
(``"interrupt"``) that turn, as the strategy says, like any turn. A turn that fails
before it is stored moves the head back while it still holds the lease.
"""

from __future__ import annotations

import inspect
import logging
from typing import Final, cast, final

import anyio

from scope.errors import (
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    UnknownHeadError,
)
from scope.history._ids import ConversationID
from scope.history._protocols import Store
from scope.history._tree import check_head
from scope.history._turn import Layer, Turn

__all__ = ["RESTORE_TIMEOUT", "MoveHead"]

_log: Final = logging.getLogger("scope.history")

#: Seconds a move of the head back (``MoveHead.undo``) may take; it runs shielded from
#: cancellation, and one that does not finish in time leaves the head where it is.
RESTORE_TIMEOUT: Final = 5.0


@final
class MoveHead(Layer):
    """Move the conversation's head to ``head`` (an append id; ``""``: before the first
    batch) as the first step of the first turn that enters this layer, fenced by
    ``expected_head`` (``Store.move_head``); move it back when that turn is not stored.

    ``Middleware(..., layers=(MoveHead(store, head, expected_head=...),))``: the layer
    goes inside the overlap layer (``on_overlap``), so the move is made while the turn
    holds the conversation's lease, and outside ``keep_interrupted``. The move happens
    once (later turns through the same Middleware pass through); a head other than
    ``expected_head`` raises ``HistoryChangedError`` (and an unknown ``head``
    ``UnknownHeadError``) before the history is read and the model is called.

    When a turn through it raises before its commit (the model's error, an
    interruption, a cancellation, an early stop) and nothing of it was kept
    (``keep_interrupted``), the head moves back to ``expected_head`` before the lease is
    released (``undo``). A turn that pauses for tool calls moves nothing back: the
    caller that runs the tools calls ``undo`` if it gives up.

    ``store`` must have an async ``move_head`` (every bundled store; ``TypeError``
    otherwise); invalid append ids raise ``InvalidAppendIDError`` at construction.
    """

    __slots__ = ("_entered", "_expected", "_head", "_moved", "_store", "_where")

    def __init__(self, store: object, head: str, *, expected_head: str) -> None:
        if not inspect.iscoroutinefunction(getattr(store, "move_head", None)):
            raise TypeError(
                f"MoveHead needs a store with an async move_head (a scope.history.Store; "
                f"every bundled store), got {type(store).__name__}"
            )
        self._store = cast(Store, store)
        self._head = check_head(head, "MoveHead head")
        self._expected = check_head(expected_head, "MoveHead expected_head")
        #: The conversation moved (set before the store step: a cancelled step may have
        #: landed; moving back is fenced, so a step that did not land moves nothing).
        self._where: ConversationID | None = None
        self._moved = False
        self._entered: Turn | None = None  # the turn that made the move, or a later one

    @property
    def moved(self) -> bool:
        """Whether the head was moved (or may have been) and not moved back yet."""
        return self._moved

    async def enter(self, turn: Turn) -> None:
        self._entered = turn
        if self._where is not None:
            return
        cid = self._where = turn.conversation_id
        self._moved = True
        try:
            await self._store.move_head(cid, self._head, expected_head=self._expected)
        except (HistoryChangedError, UnknownHeadError, ConversationClosedError):
            self._moved = False  # refused: nothing moved
            raise

    async def failed(self, turn: Turn, exc: BaseException) -> None:
        # Not for a failed commit (its batch may still land on the new head), nor for a
        # turn whose interrupted part was kept there, nor for one that never entered.
        if (
            self._entered is turn
            and turn.batch is None
            and turn.kept is None
            and not isinstance(exc, CommitError)
        ):
            await self.undo()

    async def undo(self) -> None:
        """Move the head back to ``expected_head``, fenced by ``head`` (a turn stored on
        the new head meanwhile, kept or another's, stays the head), once; shielded from
        cancellation, bounded by ``RESTORE_TIMEOUT`` seconds. It never raises an
        ``Exception``: a move back that fails is logged on the ``scope.history`` logger
        (never naming a conversation that was erased)."""
        cid = self._where
        if not self._moved or cid is None:
            return
        self._moved = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(RESTORE_TIMEOUT) as scope:
            try:
                await self._store.move_head(cid, self._expected, expected_head=self._head)
            except HistoryChangedError:
                return  # a turn landed on the new head (kept, or another's): it stays
            except ConversationClosedError:
                # Cleared, expired or erased meanwhile: no head to move back, and no log
                # line names it (an erased conversation's id is kept nowhere).
                _log.debug("a moved head's conversation was closed before it moved back")
                return
            except Exception as exc:
                _log.warning(
                    "conversation %r: the head could not move back to %r after the turn "
                    "was not stored (%s: %s); it stays at %r",
                    str(cid),
                    self._expected,
                    type(exc).__name__,
                    exc,
                    self._head,
                )
        if scope.cancelled_caught:
            _log.warning(
                "conversation %r: moving the head back to %r took longer than %s s; it "
                "may stay at %r",
                str(cid),
                self._expected,
                RESTORE_TIMEOUT,
                self._head,
            )
