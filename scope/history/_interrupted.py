"""Keeping an interrupted turn (``Middleware(layers=(..., KeepInterrupted()))``, DESIGN §6c): the
``KeepInterrupted`` layer, inside the lease (the kept turn lands while the lease is
held) and outside the replay and commit.

What is kept: a turn that fails after the model was asked (``turn.asked``) for a
reason in ``KEPT_REASONS``. The batch: the open turn plus what is complete of the
partial answer, the last message marked ``scope/interrupted``. The write: fenced like
a commit, shielded from the cancellation that interrupted the turn, bounded by
``KEEP_TIMEOUT``; it never raises, so the original cancellation or error propagates
unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, final

import anyio
import attrs

from scope.chat import Message, PartKind, Response, Role
from scope.errors import ConversationClosedError
from scope.history import _trace
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import Writer
from scope.history._turn import IncompleteReason, Layer, Turn, failure_reason

__all__ = [
    "INTERRUPTED_KEY",
    "KEEP_TIMEOUT",
    "KEPT_REASONS",
    "REASONS",
    "Keeper",
    "interrupted_batch",
    "keep",
]

_log: Final = logging.getLogger("scope.history")

#: The message metadata key marking the last message of an interrupted turn.
INTERRUPTED_KEY: Final = "scope/interrupted"

#: Its values: why the turn ended. ``interrupted`` is a newer turn's ``on_overlap=
#: "interrupt"`` (§6e); the others are IncompleteReason values of the same name.
REASONS: Final = frozenset({"cancelled", "stopped", "error", "interrupted"})

#: Seconds the shielded write of an interrupted turn may take before it is abandoned
#: (its outcome then unknown); long enough for a store round trip, short enough that a
#: cancelled caller is not kept waiting on a hung store.
KEEP_TIMEOUT: float = 5.0

#: The reasons a turn is kept for (an invalid response is not an interruption: its
#: partial is not trusted; a CommitError carries its whole batch).
KEPT_REASONS: Final = frozenset(
    {
        IncompleteReason.CANCELLED,
        IncompleteReason.STOPPED,
        IncompleteReason.ERROR,
        IncompleteReason.INTERRUPTED,
    }
)

# What of a partial answer is kept: complete content the user saw. Tool calls are
# dropped (a call without its result cannot be replayed; deltas are incomplete).
_KEPT_KINDS: Final = frozenset({PartKind.TEXT, PartKind.REASONING, PartKind.MEDIA})


def _mark(message: Message, reason: str) -> Message:
    return attrs.evolve(message, metadata=message.metadata.merge({INTERRUPTED_KEY: reason}))


def _partial_message(partial: Response | None) -> Message | None:
    """The assistant message to keep from a partial answer, or None when nothing is."""
    output = None if partial is None else partial.output
    message = None if output is None else output.message
    if message is None or message.role is not Role.ASSISTANT:
        return None
    parts = tuple(part for part in message.parts if part.kind in _KEPT_KINDS)
    if not parts:
        return None
    return Message(Role.ASSISTANT, parts, message.metadata)


def interrupted_batch(
    conversation_id: ConversationID,
    append_id: str,
    turn: tuple[Message, ...],
    partial: Response | None,
    reason: str,
    expected_length: int | None,
    expected_head: str | None = None,
) -> Batch:
    """The batch keeping an interrupted turn: ``turn`` plus the partial answer's text,
    reasoning and media, the last message marked ``scope/interrupted = reason``."""
    if reason not in REASONS:
        raise ValueError(
            f"an interrupted turn's reason must be one of {sorted(REASONS)}, got {reason!r}"
        )
    answer = _partial_message(partial)
    messages = [*turn] if answer is None else [*turn, answer]
    messages[-1] = _mark(messages[-1], reason)
    return Batch(conversation_id, append_id, messages, expected_length, expected_head)


async def keep(
    writer: Writer, make_batch: Callable[[], Batch], *, owner: str | None = None
) -> Batch | None:
    """Append the batch ``make_batch()`` builds (with ``owner`` when set), shielded from
    cancellation and bounded by ``KEEP_TIMEOUT``: the batch when it landed (receipt
    checked), else None.

    Never raises an ``Exception``: a failure (the fence refused it, the store failed,
    the time ran out) is logged on the ``scope.history`` logger, since the caller is
    already propagating the error or cancellation that interrupted the turn.
    """
    try:
        batch = make_batch()
    except Exception:
        _log.exception("could not build the interrupted turn's batch")
        return None
    cid = str(batch.conversation_id)
    with _trace.commit_span(cid) as span:
        span.batch(batch)
        with anyio.move_on_after(KEEP_TIMEOUT, shield=True) as scope:
            try:
                receipt = await (
                    writer.append(batch) if owner is None else writer.append(batch, owner=owner)  # type: ignore[call-arg]
                )
                if not isinstance(receipt, Receipt):
                    raise TypeError(f"the writer returned {type(receipt).__name__}, not a Receipt")
                receipt.validate_for(batch)
            except ConversationClosedError as exc:
                # Cleared, expired or erased meanwhile: nothing to keep it in, and no log
                # line names the conversation (an erased id is kept nowhere).
                span.outcome(_trace.classify(exc))
                _log.debug("an interrupted turn was not stored: its conversation is closed")
                return None
            except Exception as exc:
                span.outcome(_trace.classify(exc))
                _log.warning(
                    "the interrupted turn of conversation %r was not stored: %r",
                    cid,
                    exc,
                )
                return None
        if scope.cancelled_caught:
            span.outcome(_trace.CommitOutcome.CANCELLED)
            _log.warning(
                "storing the interrupted turn of conversation %r took longer than %s s and "
                "was abandoned; it may or may not have landed (append id %r)",
                cid,
                KEEP_TIMEOUT,
                str(batch.id),
            )
            return None
        span.outcome(_trace.CommitOutcome.COMMITTED)
    return batch


@final
class Keeper(Layer):
    """The layer that stores an interrupted turn (see the module docstring): on a
    failure after the model was asked, ``keep`` the open turn and the partial answer,
    fenced by the turn's view, under a fresh append id; ``turn.kept`` is the batch when
    it landed."""

    __slots__ = ("_new_append_id", "_owner", "_writer")

    def __init__(
        self, writer: Writer, new_append_id: Callable[[], str], *, owner: str | None = None
    ) -> None:
        self._writer = writer
        self._new_append_id = new_append_id
        self._owner = owner  # passed to the append (DESIGN §6i)

    async def failed(self, turn: Turn, exc: BaseException) -> None:
        reason = failure_reason(exc)
        if not turn.asked or reason not in KEPT_REASONS:
            return
        partial = turn.partial()
        turn.kept = await keep(
            self._writer,
            lambda: interrupted_batch(
                turn.conversation_id,
                self._new_append_id(),
                turn.open_turn,
                partial,
                str(reason),
                turn.expected,
                turn.expected_head,
            ),
            owner=self._owner,
        )
