"""The exception hierarchy of scope.

    ScopeError
    ├── InvalidJSONError                (also ValueError)
    ├── InvalidMetadataError            (also ValueError)
    ├── InvalidMediaError               (also ValueError)
    ├── InvalidPartError                (also ValueError)
    ├── InvalidMessageError             (also ValueError)
    ├── InvalidToolCallError            (also ValueError)
    ├── InvalidToolResultError          (also ValueError)
    ├── InvalidToolDefinitionError      (also ValueError)
    ├── InvalidOutputFormatError        (also ValueError)
    ├── InvalidOptionsError             (also ValueError)
    ├── InvalidUsageError               (also ValueError)
    ├── InvalidRequestError             (also ValueError)
    ├── InvalidResponseError            (also ValueError)
    ├── InvalidConversationIDError      (also ValueError)
    ├── InvalidAppendIDError            (also ValueError)
    ├── InvalidBatchError               (also ValueError)
    ├── InvalidReceiptError             (also ValueError)
    ├── InvalidWindowError              (also ValueError)
    ├── InvalidViewError                (also ValueError)
    ├── UnsupportedOptionError          (also ValueError)
    ├── MaxStepsError                   a Conversation turn used up its model calls
    ├── NoOutputError                   a turn that waits for approval has no output yet
    ├── TurnLogError                    (also LookupError) scope.web: no events to resume
    ├── HistoryError
    │   ├── AppendConflictError
    │   ├── ConversationClosedError
    │   ├── HistoryChangedError         a fenced step met another length or head
    │   ├── UnknownHeadError            (also LookupError) a head move named no batch
    │   ├── HistoryDivergedError        a client's copy of a conversation is not its head path
    │   ├── WindowTooSmallError
    │   ├── StoreError                  a backend failed (I/O, corrupt record)
    │   ├── CommitError                 generation succeeded, persisting it did not (retryable)
    │   ├── TurnInProgressError         another turn holds the conversation's lease
    │   ├── TurnInterruptedError        a newer turn interrupted this one (on_overlap)
    │   ├── ApprovalPendingError        a turn waits for a tool call's approval
    │   └── NotPendingError             no such call waits for a decision (decided already)
    └── ProviderError                   (status_code, body, request_id)
        ├── AuthenticationError         401 / 403
        ├── BadRequestError             400 / 404 / 422
        ├── RateLimitError              429 (retry_after)
        ├── ProviderServerError         5xx
        ├── ProviderConnectionError
        └── ProviderTimeoutError

Warnings (``warnings.warn``; filter them by category):

    UserWarning
    └── ScopeWarning                    a setting that works but risks data (e.g. a
                                        Redis server that does not persist)

An error raised because a nested value is invalid is of the outer type, names the
path of the bad value in its message and chains the inner error as ``__cause__``.

**Bad arguments** (one policy for every public constructor and opener: the model
adapters, the stores' ``open()``, ``Middleware``, ``WindowReader``, ``fallback``,
``tracing``):

    an argument of the wrong type       TypeError  (a bool is not a number; never a ValueError)
    an argument of the wrong value      ValueError, or the matching ScopeError that is one:
    ├── adapter and tracing settings    InvalidOptionsError
    ├── a window limit                  InvalidWindowError
    └── anything else                   ValueError (a choice among named values included)

Each message names the argument (an adapter's also its class), what it must be and what
it got, and is raised at construction, before any I/O. Values themselves (messages,
ids, batches, receipts: what a constructor of ``scope.chat`` or ``scope.history``
values or the codec checks) are the exception: whatever is wrong with one, its own
``Invalid…Error`` is raised, so one ``except ValueError`` covers decoding untrusted data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scope.chat import Response
    from scope.history import Batch, Receipt

__all__ = [
    "AppendConflictError",
    "ApprovalPendingError",
    "AuthenticationError",
    "BadRequestError",
    "CommitError",
    "ConversationClosedError",
    "HistoryChangedError",
    "HistoryDivergedError",
    "HistoryError",
    "InvalidAppendIDError",
    "InvalidBatchError",
    "InvalidConversationIDError",
    "InvalidJSONError",
    "InvalidMediaError",
    "InvalidMessageError",
    "InvalidMetadataError",
    "InvalidOptionsError",
    "InvalidOutputFormatError",
    "InvalidPartError",
    "InvalidReceiptError",
    "InvalidRequestError",
    "InvalidResponseError",
    "InvalidToolCallError",
    "InvalidToolDefinitionError",
    "InvalidToolResultError",
    "InvalidUsageError",
    "InvalidViewError",
    "InvalidWindowError",
    "MaxStepsError",
    "NoOutputError",
    "NotPendingError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "RateLimitError",
    "RestoreConflictError",
    "ScopeError",
    "ScopeWarning",
    "StoreError",
    "TurnInProgressError",
    "TurnInterruptedError",
    "TurnLogError",
    "UnknownHeadError",
    "UnsupportedOptionError",
    "WindowTooSmallError",
]


class ScopeError(Exception):
    """The root of every error scope raises on purpose."""


class ScopeWarning(UserWarning):
    """A configuration scope accepts but that puts data at risk; the message states
    the consequence and the fix."""


class InvalidJSONError(ScopeError, ValueError):
    """Text that is not one valid JSON document within scope's limits."""


class InvalidMetadataError(ScopeError, ValueError):
    """A metadata or extensions key or value is invalid."""


class InvalidMediaError(ScopeError, ValueError):
    """A media value or its source is invalid."""


class InvalidPartError(ScopeError, ValueError):
    """A message part is invalid."""


class InvalidMessageError(ScopeError, ValueError):
    """A message is invalid."""


class InvalidToolCallError(ScopeError, ValueError):
    """A tool call or tool-call delta is invalid."""


class InvalidToolResultError(ScopeError, ValueError):
    """A tool result or tool output is invalid."""


class InvalidToolDefinitionError(ScopeError, ValueError):
    """A tool definition is invalid."""


class InvalidOutputFormatError(ScopeError, ValueError):
    """An output format is invalid or used where it has no schema."""


class InvalidOptionsError(ScopeError, ValueError):
    """Generation options are invalid."""


class InvalidUsageError(ScopeError, ValueError):
    """Token usage is invalid."""


class InvalidRequestError(ScopeError, ValueError):
    """A request is invalid."""


class InvalidResponseError(ScopeError, ValueError):
    """A response (or a stream chunk) is invalid or incomplete."""


class InvalidConversationIDError(ScopeError, ValueError):
    """A conversation id is invalid."""


class InvalidAppendIDError(ScopeError, ValueError):
    """An append id is invalid."""


class InvalidBatchError(ScopeError, ValueError):
    """A history batch is invalid."""


class InvalidReceiptError(ScopeError, ValueError):
    """A receipt is invalid or does not match its batch."""


class InvalidWindowError(ScopeError, ValueError):
    """A window limit is invalid."""


class InvalidViewError(ScopeError, ValueError):
    """A history view is invalid."""


class UnsupportedOptionError(ScopeError, ValueError):
    """A populated option the provider's protocol cannot express."""


class HistoryError(ScopeError):
    """A history operation is refused by the state of the store."""


class AppendConflictError(HistoryError):
    """The append id was already used for a batch with another digest."""


class ConversationClosedError(HistoryError):
    """The conversation was cleared; it is closed for ever."""


class RestoreConflictError(HistoryError):
    """A restore step (``scope.history.Restorer``) is refused: the store holds something
    the restored record contradicts (a closed conversation's id holding batches or
    closed another way, tombstones under another store secret). Nothing was written."""


class HistoryChangedError(HistoryError):
    """A fenced step (a batch's ``expected_length``/``expected_head``, a head move's
    ``expected_head``) met a conversation that has changed.

    ``expected`` is the length the batch was generated against, ``actual`` the number of
    messages on the conversation's head path when the store refused it. When the fence
    named a head (DESIGN §6h: the append id of the last batch on the head path, ``""``
    before the first), ``expected_head`` is that head and ``actual_head`` the one the
    store holds; both are None for a length-only fence. Nothing was appended or moved.
    The turn was generated from a history that has since changed (another turn landed
    first, or the head moved to another branch), so the same step cannot succeed: run it
    again on the current history.
    """

    def __init__(
        self,
        expected: int,
        actual: int,
        conversation_id: str | None = None,
        *,
        expected_head: str | None = None,
        actual_head: str | None = None,
    ) -> None:
        where = (
            "the conversation"
            if conversation_id is None
            else (f"conversation {str(conversation_id)!r}")
        )
        if expected_head is not None and expected_head != actual_head:
            super().__init__(
                f"{where} has head {actual_head!r} ({actual} messages), the step "
                f"expected head {expected_head!r} ({expected} messages): another turn was "
                "stored first or the head moved"
            )
        else:
            super().__init__(
                f"{where} holds {actual} messages, the batch expected {expected}: "
                "another turn was stored first"
            )
        self.expected = expected
        self.actual = actual
        self.conversation_id = conversation_id
        self.expected_head = expected_head
        self.actual_head = actual_head

    def __reduce__(self) -> Any:
        return (
            _history_changed,
            (
                self.expected,
                self.actual,
                self.conversation_id,
                self.expected_head,
                self.actual_head,
            ),
        )


def _history_changed(
    expected: int,
    actual: int,
    conversation_id: str | None,
    expected_head: str | None,
    actual_head: str | None,
) -> HistoryChangedError:
    return HistoryChangedError(
        expected,
        actual,
        conversation_id,
        expected_head=expected_head,
        actual_head=actual_head,
    )


class UnknownHeadError(HistoryError, LookupError):
    """A head move (``rewind``, ``switch``, ``fork``) named a batch or turn the
    conversation does not hold. Nothing was moved."""


class HistoryDivergedError(HistoryError):
    """A client's copy of a conversation (the messages a ``scope.web`` request carries)
    does not match the stored head path, so the request cannot be answered as asked: an
    AG-UI run whose prior messages are not the stored ones, or an AI SDK request naming
    a message id the head path does not hold. Raised before any model call; nothing was
    stored or moved. A service answers it with a 409 (the client reloads the
    conversation).

    ``conversation_id`` names the conversation; ``turn`` is the first turn (1-based)
    where the client's copy and the head path differ, when known; ``message_id`` the
    client's message id the request named, when that is what was not found.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        turn: int | None = None,
        message_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.turn = turn
        self.message_id = message_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_diverged,
            (str(self), self.conversation_id, self.turn, self.message_id),
        )


def _rebuild_diverged(
    message: str, conversation_id: str, turn: int | None, message_id: str | None
) -> HistoryDivergedError:
    return HistoryDivergedError(
        message, conversation_id=conversation_id, turn=turn, message_id=message_id
    )


class WindowTooSmallError(HistoryError):
    """The newest turn alone does not fit the window."""


class StoreError(HistoryError):
    """A store backend failed: I/O, a lost connection, or a corrupt stored record."""


class CommitError(HistoryError):
    """The model answered, but persisting the completed turn failed.

    ``batch`` is exactly what should have been appended, ``receipt`` a receipt that
    passed ``validate_for(batch)`` or None, ``response`` the complete response, usage
    included. The underlying failure is ``__cause__``.

    ``retryable`` says which recovery fits. True: the writer failed (a store, driver or
    connection error) or returned a receipt that does not match, so
    ``await writer.append(err.batch)`` may succeed and lands the turn exactly once,
    without calling the model again. False: the cause is ``HistoryChangedError`` (another
    turn was stored first: run the turn again on the current history),
    ``ConversationClosedError`` (nothing to do: the conversation is closed) or
    ``AppendConflictError`` (the append id was used for another batch); appending the
    same batch again cannot succeed. Also False when the writer is broken (its
    ``append`` returned something other than a ``Receipt``: an ``InvalidReceiptError``
    cause whose message says so): retrying through it proves nothing. The message names
    the recovery.
    """

    def __init__(
        self,
        message: str,
        *,
        batch: Batch,
        response: Response,
        receipt: Receipt | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message)
        self.batch = batch
        self.receipt = receipt
        self.response = response
        self.retryable = retryable


class TurnInProgressError(HistoryError):
    """Another turn holds the conversation's lease (``Middleware(layers=(Reject(),))``,
    or ``"wait"``/``"interrupt"`` past ``overlap_timeout``). Raised before the model is
    called: nothing was generated, nothing stored.

    ``conversation_id`` names the conversation. ``started_at`` is the holder's start
    time (``time.time()`` seconds) when the holder runs in this process, else None (a
    store's lease records only a holder token and an expiry). ``waited`` is how many
    seconds this turn waited for the lease (0.0 under ``"reject"``).

    ``scope.web`` raises it too, for a resumable turn whose id is still running
    (``TurnLog.open``, ``ResumableTurns.start``): ``conversation_id`` is then the turn
    id. A service answers either with a 409.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        started_at: float | None = None,
        waited: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.started_at = started_at
        self.waited = waited

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_in_progress,
            (str(self), self.conversation_id, self.started_at, self.waited),
        )


class TurnInterruptedError(HistoryError):
    """A newer turn on the same conversation interrupted this one
    (``Middleware(layers=(Interrupt(),))``): the model call or stream was stopped and
    the turn was not stored (the incomplete-turn reason is ``interrupted``).

    ``conversation_id`` names the conversation.
    """

    def __init__(self, message: str, *, conversation_id: str) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_interrupted, (str(self), self.conversation_id))


class ApprovalPendingError(HistoryError):
    """The conversation's last turn waits for a decision on a tool call
    (``@tool(requires_approval=...)``): a new turn would replay a tool call that has no
    result, which no model accepts. Raised before the model is called, nothing stored:
    decide the calls first (``Conversation.approve``/``deny``; ``pending()`` lists them).

    ``conversation_id`` names the conversation, ``call_ids`` the calls that wait.
    """

    def __init__(self, message: str, *, conversation_id: str, call_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.call_ids = call_ids

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_pending, (str(self), self.conversation_id, self.call_ids))


class NotPendingError(HistoryError):
    """``Conversation.approve``/``deny`` named a call that does not wait for a decision:
    another decision on it won (of two racing, exactly one is taken; the other gets
    this error, and nothing of it ran or was stored), it was never pending, or the
    conversation's head is no longer the turn that waits (another turn, a regenerate or
    an edit moved on from it). ``pending()`` says what still waits.

    ``conversation_id`` names the conversation, ``call_id`` the call.
    """

    def __init__(self, message: str, *, conversation_id: str, call_id: str) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.call_id = call_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_not_pending, (str(self), self.conversation_id, self.call_id))


def _rebuild_pending(
    message: str, conversation_id: str, call_ids: tuple[str, ...]
) -> ApprovalPendingError:
    return ApprovalPendingError(message, conversation_id=conversation_id, call_ids=call_ids)


def _rebuild_not_pending(message: str, conversation_id: str, call_id: str) -> NotPendingError:
    return NotPendingError(message, conversation_id=conversation_id, call_id=call_id)


def _rebuild_in_progress(
    message: str, conversation_id: str, started_at: float | None, waited: float
) -> TurnInProgressError:
    return TurnInProgressError(
        message, conversation_id=conversation_id, started_at=started_at, waited=waited
    )


def _rebuild_interrupted(message: str, conversation_id: str) -> TurnInterruptedError:
    return TurnInterruptedError(message, conversation_id=conversation_id)


class MaxStepsError(ScopeError):
    """A ``scope.conversation.Conversation`` turn made ``max_steps`` model calls and the
    last answer still asked for tools. Nothing of the turn was stored."""


class NoOutputError(ScopeError):
    """``TurnResult.output`` was read on a turn that waits for a decision on tool calls
    (``TurnResult.pending`` lists them): it has no answer yet, so no output. The turn
    that ``Conversation.approve``/``deny`` finish has one. The message names the calls."""


class TurnLogError(ScopeError, LookupError):
    """A resumable turn's events cannot be served (``scope.web``): the turn is unknown
    or expired, or the events after the client's last event id were dropped (the
    per-turn log is bounded). The message names the turn and what is missing."""


class ProviderError(ScopeError):
    """A model provider failed. ``body`` is the provider's error body, if any."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        body: Any = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.request_id = request_id


class AuthenticationError(ProviderError):
    """401 or 403: the credentials were refused."""


class BadRequestError(ProviderError):
    """400, 404 or 422: the provider refused the request."""


class RateLimitError(ProviderError):
    """429: rate limited. ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        body: Any = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, body=body, request_id=request_id)
        self.retry_after = retry_after


class ProviderServerError(ProviderError):
    """5xx: the provider failed."""


class ProviderConnectionError(ProviderError):
    """The connection failed or dropped."""


class ProviderTimeoutError(ProviderError):
    """The provider did not answer in time."""
