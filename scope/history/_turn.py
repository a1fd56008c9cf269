"""One turn as it passes through the history ``Middleware``'s layers, and how it ends.

The Middleware (``_middleware.py``) replays and commits; the layers around it
(``Layer``) are entered in order before the history is read and left in reverse order
after the commit (see ``Middleware`` for the order). A ``Turn`` is the state they share:
the open turn, the view read with a lease, the append the commit goes through, the
batch and receipt of the commit, the batch kept of an interrupted turn.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable
from typing import Any, final

import attrs

from scope._context import is_cancellation, is_stop
from scope.chat import Message, Request, Response, ResponseAccumulator, Role
from scope.errors import (
    CommitError,
    InvalidRequestError,
    InvalidResponseError,
    TurnInterruptedError,
)
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import Writer
from scope.history._view import HistoryView

__all__ = ["IncompleteReason", "IncompleteTurn", "Layer", "Turn", "failure_reason", "split_request"]


class IncompleteReason(enum.StrEnum):
    """Why a bound call or stream ended without committing its turn."""

    ERROR = "error"  # the reader or the model raised, or the conversation is closed
    CANCELLED = "cancelled"  # cancellation arrived (during the commit: see batch)
    STOPPED = "stopped"  # the consumer stopped the stream early
    INVALID_RESPONSE = "invalid_response"  # the response (or a chunk) was invalid
    INTERRUPTED = "interrupted"  # a newer turn stopped it (on_overlap="interrupt")


@final
@attrs.frozen
class IncompleteTurn:
    """What ``on_incomplete`` receives when a turn ends without a commit.

    ``open_turn`` is the turn the request carried (the user's message and any tool
    follow-ups), ``partial`` the response accumulated so far (None when nothing arrived),
    ``error`` the exception that ended it (None for an early stop).

    ``batch`` is set only when a cancellation arrived during the commit (``reason`` is
    ``CANCELLED``). While the batch was being appended, the store may or may not have
    appended it, and ``await writer.append(turn.batch)`` settles it: it lands once, or
    returns the equal receipt if it had landed. ``receipt`` is set as well when the
    append had returned and its receipt checked out (the cancellation landed while the
    turn's lease was being released): the turn **is stored**, nothing is to be retried
    (appending the batch again only returns the equal receipt). In every other report
    both are None.

    ``kept`` is the batch that stored the interrupted turn (``keep_interrupted=True``:
    the open turn and the partial answer, marked ``scope/interrupted``) when it landed
    and its receipt checked out; None when nothing was kept (off, not applicable, or the
    write failed or ran out of time: see the ``scope.history`` log).
    """

    conversation_id: ConversationID
    open_turn: tuple[Message, ...]
    partial: Response | None
    reason: IncompleteReason
    error: BaseException | None = attrs.field(default=None, eq=False)
    batch: Batch | None = None
    kept: Batch | None = None
    receipt: Receipt | None = None


def failure_reason(exc: BaseException) -> IncompleteReason | None:
    """The ``IncompleteReason`` of a turn that raised ``exc`` (None: a ``CommitError``,
    which carries its batch instead of being reported)."""
    if isinstance(exc, CommitError):
        return None
    if is_stop(exc):
        return IncompleteReason.STOPPED
    if is_cancellation(exc):
        return IncompleteReason.CANCELLED
    if isinstance(exc, InvalidResponseError):
        return IncompleteReason.INVALID_RESPONSE
    if isinstance(exc, TurnInterruptedError):
        return IncompleteReason.INTERRUPTED
    return IncompleteReason.ERROR


@final
class Turn:
    """The state of one turn (private; see the module docstring).

    ``view``: the history read with the lease (a folded acquire), else None: the
    Middleware reads it. ``expected``/``expected_head``: the fences of the commit (the
    view's length and head).
    ``asked``: the model was asked and has not answered (an interruption from now on can
    be kept). ``lease``: the turn's ``Lease`` under a leasing layer, else None; ``run``
    and ``append`` go through it. ``batch``/``receipt``: the
    commit's batch once built, its checked receipt once it landed. ``kept``: the batch
    that stored the interrupted turn.
    """

    __slots__ = (
        "accumulator",
        "asked",
        "batch",
        "conversation_id",
        "expected",
        "expected_head",
        "kept",
        "lease",
        "open_turn",
        "owner",
        "prefix",
        "receipt",
        "response",
        "view",
        "writer",
    )

    def __init__(
        self,
        conversation_id: ConversationID,
        request: Request,
        writer: Writer,
        owner: str | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.prefix, self.open_turn = split_request(request)
        self.writer = writer
        self.owner = owner
        self.view: HistoryView | None = None
        self.expected: int | None = None
        self.expected_head: str | None = None
        self.asked = False
        self.accumulator: ResponseAccumulator | None = None
        self.response: Response | None = None
        self.batch: Batch | None = None
        self.receipt: Receipt | None = None
        self.kept: Batch | None = None
        self.lease: Any = None  # the turn's Lease under a leasing strategy

    async def run(self, step: Awaitable[Any]) -> Any:
        """``await step`` (a model call, or the next chunk of a stream): under the lease
        when there is one (renewed, and stopped when a newer turn interrupts)."""
        lease = self.lease
        return await (step if lease is None else lease.run(step))

    async def append(self, batch: Batch) -> Any:
        """The commit's append: the lease's folded append and release when its layer
        folds them, else the writer's; with the owner when there is one."""
        lease = self.lease
        if lease is not None and lease.leases.fold_commit:
            return await lease.append_release(batch)
        if self.owner is None:
            return await self.writer.append(batch)
        return await self.writer.append(batch, owner=self.owner)  # type: ignore[call-arg]

    def partial(self) -> Response | None:
        """What the model answered so far: the accumulated stream, or a call's response."""
        if self.accumulator is not None:
            return self.accumulator.response()
        return self.response


class Layer:
    """A layer around the Middleware's replay and commit (``Middleware`` gives the
    order). ``enter`` runs before the history is read (outermost first), ``failed``
    when the turn raised (innermost first; ``GeneratorExit`` for a stream stopped early),
    ``exit`` on every path after that (innermost first). ``failed`` and ``exit`` must
    not raise an ``Exception``. Each does nothing unless a layer overrides it."""

    __slots__ = ()

    async def enter(self, turn: Turn) -> None:
        """Before the history is read."""

    async def failed(self, turn: Turn, exc: BaseException) -> None:
        """The turn raised ``exc``."""

    async def exit(self, turn: Turn) -> None:
        """After the turn, on every path."""


def split_request(request: Request) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """Split a request into its system prefix and its one open turn.

    The open turn is one user message, then optionally assistant messages with tool
    calls, each followed by the tool messages answering every one of its calls. Anything
    else raises ``InvalidRequestError``.
    """
    if not isinstance(request, Request):
        raise InvalidRequestError(f"expected a Request, got {type(request).__name__}")
    messages = request.messages
    start = 0
    while start < len(messages) and messages[start].role is Role.SYSTEM:
        start += 1
    prefix, turn = messages[:start], messages[start:]
    if not turn:
        raise InvalidRequestError("the request has no user message: it must end in an open turn")
    if turn[0].role is not Role.USER:
        raise InvalidRequestError(
            f"messages[{start}]: the open turn must start with a user message, got "
            f"{turn[0].role} (send only the new turn; the middleware replays the history)"
        )
    index = 1
    while index < len(turn):
        message = turn[index]
        where = f"messages[{start + index}]"
        if message.role is Role.USER:
            raise InvalidRequestError(
                f"{where}: a second user message; send one open turn, not a transcript"
            )
        if message.role is not Role.ASSISTANT or not message.tool_calls:
            raise InvalidRequestError(
                f"{where}: after the user message only assistant tool-call messages and "
                f"their tool results may follow, got {_article(message.role)} {message.role} "
                "message" + ("" if message.role is not Role.ASSISTANT else " without tool calls")
            )
        pending = {call.id for call in message.tool_calls}
        index += 1
        while index < len(turn) and turn[index].role is Role.TOOL:
            for result in turn[index].tool_results:
                pending.discard(result.id)
            index += 1
        if pending:
            raise InvalidRequestError(
                f"{where}: tool call(s) {sorted(pending)} have no tool result in the open turn"
            )
    return prefix, turn


def _article(role: object) -> str:
    """``a`` or ``an`` before a role name (``an assistant message``)."""
    return "an" if str(role)[:1] in "aeiou" else "a"
