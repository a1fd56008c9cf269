"""Committing a turn (DESIGN §6, §6b): the batch that completes it, fenced by the
history it was generated from, appended once, its receipt checked.

``commit(turn, response, new_append_id)``: a final answer becomes one
``Batch(open turn + answer)`` under a fresh append id, with ``expected_length`` and
``expected_head`` = the length and head of the view the turn was replayed from (the
fence: it lands only if no other turn was stored, and the head did not move,
meanwhile), appended through ``turn.append`` (the writer, or the lease's
folded append-and-release). A response asking for tools leaves the turn open and
writes nothing. Failures after the model answered become ``CommitError``;
cancellation passes unchanged, the batch on ``turn.batch`` for ``on_incomplete``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from scope.chat import Message, PartKind, Response
from scope.errors import (
    AppendConflictError,
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidReceiptError,
    InvalidResponseError,
)
from scope.history import _trace
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._turn import Turn

__all__ = ["commit", "usage_stamp"]

#: Causes after which appending the same batch again cannot succeed.
_FINAL_CAUSES: Final = (
    HistoryChangedError,
    ConversationClosedError,
    AppendConflictError,
    InvalidBatchError,
)

#: The cache counts of ``Usage`` that ``scope/usage`` carries when reported (§6g).
_CACHE_COUNTS: Final = ("cache_read_input_tokens", "cache_write_input_tokens")


async def commit(
    turn: Turn, response: Response, new_append_id: Callable[[], str], writer: object
) -> None:
    """Complete the turn with ``response`` and append its batch, in a
    ``scope.history.commit`` trace span; see the module docstring (``writer``: the
    Middleware's, named when it answers with something that is not a receipt)."""
    cid = turn.conversation_id
    with _trace.commit_span(cid) as span:
        response.validate_complete()
        output = response.output
        assert output is not None
        if output.message is not None and any(
            part.kind is PartKind.TOOL_CALL for part in output.message.parts
        ):
            span.outcome(_trace.CommitOutcome.TOOL_PAUSE)
            return
        if output.message is None:
            raise InvalidResponseError(
                "a final response needs an assistant message to complete the turn"
            )
        answer = _stamped(output.message, response)
        batch = Batch(
            cid, new_append_id(), (*turn.open_turn, answer), turn.expected, turn.expected_head
        )
        turn.batch = batch
        span.batch(batch)
        receipt: Any = None
        broken = False  # the writer answered with something that is not a Receipt
        try:
            receipt = await turn.append(batch)
            if not isinstance(receipt, Receipt):
                broken = True
                raise InvalidReceiptError(
                    f"the writer is broken: {type(writer).__name__}.append returned "
                    f"{type(receipt).__name__}, not a Receipt; whether it stored the batch "
                    "is unknown"
                )
            receipt.validate_for(batch)
        except Exception as exc:
            checked = receipt if isinstance(receipt, Receipt) and _matches(receipt, batch) else None
            retryable = not broken and not isinstance(exc, _FINAL_CAUSES)
            raise CommitError(
                _message(cid, exc, retryable),
                batch=batch,
                receipt=checked,
                response=response,
                retryable=retryable,
            ) from exc
        turn.receipt = receipt


def usage_stamp(response: Response) -> dict[str, int] | None:
    """``scope/usage`` for an answer: the input and output counts, and the cache counts
    the response reported (DESIGN §6d, §6g); None when it reported no usage (a zero
    usage is no report)."""
    meta = response.metadata
    usage = None if meta is None else meta.usage
    if usage is None or not (usage.input_tokens or usage.output_tokens):
        return None
    stamp = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    for name in _CACHE_COUNTS:
        count = getattr(usage, name)
        if count is not None:
            stamp[name] = count
    return stamp


def _stamped(message: Message, response: Response) -> Message:
    """The answer as committed: with ``scope/usage`` (``usage_stamp``) and the
    response's id (``scope/response_id``) in its metadata, when reported."""
    stamps: dict[str, object] = {}
    usage = usage_stamp(response)
    if usage is not None:
        stamps["scope/usage"] = usage
    meta = response.metadata
    if meta is not None and meta.id:
        stamps["scope/response_id"] = meta.id
    if not stamps:
        return message
    return Message(message.role, message.parts, message.metadata.merge(stamps))


def _message(cid: ConversationID, exc: Exception, retryable: bool) -> str:
    head = f"the model answered but the turn of conversation {str(cid)!r} was not stored: "
    if isinstance(exc, HistoryChangedError):
        return head + (
            f"{exc}; the answer was generated without the newer turn(s): run the turn "
            "again on the current history (do not append err.batch)"
        )
    if isinstance(exc, ConversationClosedError):
        return head + f"{exc}; the conversation is closed for ever: nothing to retry"
    if isinstance(exc, AppendConflictError):
        return head + (
            f"{exc}; the append id is taken by another batch (new_append_id repeated an "
            "id): run the turn again with a fresh append id"
        )
    if not retryable:
        return head + f"{exc!r}; appending this batch again cannot succeed"
    return head + (
        f"{exc!r}; retry `await writer.append(err.batch)` (the model is not called "
        "again; the batch lands once)"
    )


def _matches(receipt: Receipt, batch: Batch) -> bool:
    try:
        receipt.validate_for(batch)
    except InvalidReceiptError:
        return False
    return True
