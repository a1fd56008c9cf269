"""The history ``Middleware``: replay prior turns, commit a completed turn exactly once."""

from __future__ import annotations

import enum
import inspect
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final, Never, NoReturn, final

import attrs

from scope._context import is_cancellation
from scope.chat import (
    Message,
    Model,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    Role,
    Streamer,
)
from scope.errors import (
    AppendConflictError,
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidReceiptError,
    InvalidRequestError,
    InvalidResponseError,
    StoreError,
    TurnInterruptedError,
)
from scope.history import _interrupted, _overlap, _trace
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import Reader, ViewReader, Writer, implements
from scope.history._replay import replay as checked_replay
from scope.history._turns import COMPACTION_KEY
from scope.history._view import HistoryView

__all__ = ["IncompleteReason", "IncompleteTurn", "Middleware"]

_log: Final = logging.getLogger("scope.history")


class IncompleteReason(enum.StrEnum):
    """Why a bound call or stream ended without committing its turn."""

    ERROR = "error"  # the reader or the model raised, or the conversation is closed
    CANCELLED = "cancelled"  # cancellation arrived (during the append: see batch)
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

    ``batch`` is set only when a cancellation arrived while the batch was being
    appended (``reason`` is ``CANCELLED``): the store may or may not have appended it,
    and ``await writer.append(turn.batch)`` settles it: it lands once, or returns the
    equal receipt if it had landed. In every other report it is None.

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


def _new_append_id() -> str:
    return uuid.uuid4().hex


#: Causes after which appending the same batch again cannot succeed.
_FINAL_CAUSES: Final = (
    HistoryChangedError,
    ConversationClosedError,
    AppendConflictError,
    InvalidBatchError,
)


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


def _failure_reason(exc: BaseException) -> IncompleteReason | None:
    """The ``IncompleteReason`` of a failed turn (None: a ``CommitError``, which carries
    its batch instead of being reported)."""
    if isinstance(exc, CommitError):
        return None
    if is_cancellation(exc):
        return IncompleteReason.CANCELLED
    if isinstance(exc, InvalidResponseError):
        return IncompleteReason.INVALID_RESPONSE
    if isinstance(exc, TurnInterruptedError):
        return IncompleteReason.INTERRUPTED
    return IncompleteReason.ERROR


#: The reasons ``keep_interrupted`` stores a turn for (an invalid response is not an
#: interruption: its partial is not trusted; a CommitError carries its whole batch).
_KEPT_REASONS: Final = frozenset(
    {
        IncompleteReason.CANCELLED,
        IncompleteReason.STOPPED,
        IncompleteReason.ERROR,
        IncompleteReason.INTERRUPTED,
    }
)


def _needs_tools(response: Response) -> bool:
    output = response.output
    return (
        output is not None
        and output.message is not None
        and any(part.kind is PartKind.TOOL_CALL for part in output.message.parts)
    )


def _article(role: object) -> str:
    """``a`` or ``an`` before a role name (``an assistant message``)."""
    return "an" if str(role)[:1] in "aeiou" else "a"


@final
class Middleware:
    """Keeps one conversation's history around a model.

    ``Middleware(reader, writer, conversation_id)`` gives ``.call(model)`` and
    ``.stream(streamer)``, usable with ``chat.wrap``/``chat.wrap_stream``. Each request
    must be a system prefix plus one open turn (one user message, then optionally
    assistant tool-call messages each followed by their tool results); it is checked
    before any I/O (``InvalidRequestError``: neither the reader nor the model is called).
    ``reader`` must be a ``Reader`` and ``writer`` a ``Writer`` whose ``read`` and
    ``append`` are coroutine functions (``async def``); anything else is a ``TypeError``
    at construction, not at the first turn. A writer whose ``append`` returns something
    other than a ``Receipt`` is broken: the turn's ``CommitError`` is not retryable.

    Replay: ``system prefix + stored non-system messages + open turn`` goes downstream.
    When the reader is a ``ViewReader`` (every bundled store and ``WindowReader`` are),
    the history is read as one ``HistoryView``: a closed conversation raises
    ``ConversationClosedError`` before the model is called. An invalid stored history
    raises ``StoreError`` and is never sent.

    Exclusive turns (``exclusive_turns=True``, the default, with a ``ViewReader``): the
    committed batch carries ``expected_length=view.length``, so it lands only if no
    other turn was stored since the history was read. Of two overlapping turns on one
    conversation exactly one commits; the other raises ``CommitError`` with
    ``retryable=False`` and a ``HistoryChangedError`` cause: run that turn again on the
    current history. With ``exclusive_turns=False`` (or a plain ``Reader``) there is no
    fence: overlapping turns both commit, each answer generated without the other turn,
    stored one after the other.

    Commit: the response must pass ``validate_complete()`` (else
    ``InvalidResponseError``, nothing written). A response with tool calls leaves the turn
    open and writes nothing: the host runs the tools and resubmits the turn with their
    results. A final answer appends exactly one ``Batch(open turn + answer)`` under a
    fresh append id (``new_append_id()``) and checks the receipt. If persisting fails
    after the model answered, ``CommitError`` carries the batch, the receipt (only one
    that passed ``validate_for``) and the response, with the failure as ``__cause__``;
    ``err.retryable`` says whether ``await writer.append(err.batch)`` can still land it
    (without calling the model again) or the turn must be run again.

    Cancellation is never converted: a cancellation that arrives during the append
    propagates unchanged (an ``asyncio.timeout`` still raises ``TimeoutError``, a trio
    cancel scope still catches its ``Cancelled``). Whether the batch landed is then
    unknown, so ``on_incomplete`` receives ``IncompleteTurn(reason=CANCELLED,
    batch=<the batch>)``; appending that batch again is safe.

    Streams: no I/O and no checks until the first iteration (the request is checked
    then, as every ``Streamer`` does); chunks are forwarded as they arrive and
    accumulated; the batch is appended only after the inner stream ends naturally
    without error (a ``CommitError`` is raised after the last chunk). An early stop, an
    inner error or cancellation writes nothing; the inner stream is closed on every path
    before the outer one finishes closing.

    Interrupted turns (``keep_interrupted=True``; off by default, when an interrupted
    turn leaves nothing behind): a turn that ends after the model was asked — its stream
    cancelled, stopped early by the consumer (``aclose()``) or failed with an error from
    the model (``reason`` ``cancelled``, ``stopped``, ``error``) — is stored as the open
    turn (the user message and its complete tool-call/result pairs) plus the partial
    assistant message: the text, reasoning and media received so far, under the
    partial's message metadata; tool calls (complete or still streaming) are dropped, as
    their results never came. The last stored message carries message metadata
    ``scope/interrupted`` = the reason: the partial assistant message, or the open
    turn's last message when nothing of the answer remains (nothing had arrived yet, or
    only tool calls). A ``call`` has no partial answer: a cancelled or failed ``call``
    keeps the open turn, marked. Not kept: failures before the model is asked (request
    checks, reading the history, a closed conversation), an invalid response, a
    ``CommitError`` (it carries the whole batch) and a cancellation during the commit's
    append (reported with its batch). The write is fenced like a commit
    (``expected_length`` from the view), appended under a fresh ``new_append_id()``,
    shielded from the cancellation and bounded to 5 seconds; whatever becomes of it
    (stored, refused by the fence because another turn landed, failed, timed out: the
    latter three logged as warnings on ``scope.history``), the original cancellation or
    error then propagates unchanged, and ``on_incomplete`` still reports the turn, with
    the stored batch as ``kept``. A host that retries such a turn sends the question
    again: it is stored twice, the first copy marked.

    Overlapping turns (``on_overlap``, DESIGN §6e): what a turn does when another turn
    of the conversation is running, decided *before* the model is called.
    ``"fence"`` (the default): both run, the fence commits one. ``"reject"``: the turn
    takes the store's turn lease first and raises ``TurnInProgressError`` when another
    turn holds it. ``"wait"``: it waits for the lease (polling with backoff, 2 ms
    doubling to 100 ms, at most ``overlap_timeout`` seconds, then
    ``TurnInProgressError``) and runs on the history as it is then. ``"interrupt"``: it
    stops the running turn (which raises ``TurnInterruptedError``; ``on_incomplete``
    reason ``interrupted``) and runs once the lease is free, waiting at most
    ``overlap_timeout``; immediate within one process, at the running turn's next
    renewal across processes. The lease (``lease_ttl`` seconds, renewed every third of
    it while the model runs) is released on every path: commit, error, cancellation,
    early stop. These three need a writer or reader that is a ``TurnLeaser``
    (``TypeError``) and ``exclusive_turns=True`` (``ValueError``). When the leaser is
    also a ``FoldedTurnLeaser`` (every bundled store but ``PostgresStore``), the lease is
    taken with the history read when it is the reader (``acquire_turn_view``, one store
    step) and released with the commit when it is the writer (``append_release_turn``,
    one store step; when that raises, ``release_turn`` still releases it), so a leased
    turn makes as many store steps as a fenced one.

    ``on_incomplete`` (synchronous, must not block) receives an ``IncompleteTurn`` once
    whenever a bound call or stream ends without committing — except the tool-call pause
    and a ``CommitError`` (which carries its batch). If it raises, the error is logged on
    the ``scope.history`` logger and the original outcome stands.
    """

    __slots__ = (
        "_conversation_id",
        "_exclusive_turns",
        "_keep_interrupted",
        "_new_append_id",
        "_on_incomplete",
        "_overlap",
        "_reader",
        "_writer",
    )

    def __init__(
        self,
        reader: Reader,
        writer: Writer,
        conversation_id: str,
        new_append_id: Callable[[], str] = _new_append_id,
        on_incomplete: Callable[[IncompleteTurn], None] | None = None,
        *,
        exclusive_turns: bool = True,
        keep_interrupted: bool = False,
        on_overlap: _overlap.OnOverlap = "fence",
        overlap_timeout: float = 30.0,
        lease_ttl: float = 15.0,
    ) -> None:
        if not implements(reader, Reader):
            raise TypeError(
                f"Middleware reader must be a scope.history.Reader (an object with an async "
                f"read(conversation_id)), got {type(reader).__name__}"
            )
        if not implements(writer, Writer):
            raise TypeError(
                f"Middleware writer must be a scope.history.Writer (an object with an async "
                f"append(batch)), got {type(writer).__name__}"
            )
        _check_coroutine_method(reader, "reader", "read", "read(conversation_id)")
        _check_coroutine_method(writer, "writer", "append", "append(batch)")
        if not callable(new_append_id):
            raise TypeError(f"new_append_id must be callable, got {type(new_append_id).__name__}")
        if on_incomplete is not None and not callable(on_incomplete):
            raise TypeError(
                f"on_incomplete must be callable or None, got {type(on_incomplete).__name__}"
            )
        if type(exclusive_turns) is not bool:
            raise TypeError(f"exclusive_turns must be a bool, got {type(exclusive_turns).__name__}")
        if type(keep_interrupted) is not bool:
            raise TypeError(
                f"keep_interrupted must be a bool, got {type(keep_interrupted).__name__}"
            )
        self._conversation_id = ConversationID(conversation_id)
        self._reader = reader
        self._writer = writer
        self._new_append_id = new_append_id
        self._on_incomplete = on_incomplete
        self._exclusive_turns = exclusive_turns
        self._keep_interrupted = keep_interrupted
        self._overlap = _overlap.Overlap(
            on_overlap, overlap_timeout, lease_ttl, reader, writer, exclusive_turns
        )

    @property
    def conversation_id(self) -> ConversationID:
        """The conversation this middleware keeps."""
        return self._conversation_id

    @property
    def exclusive_turns(self) -> bool:
        """Whether committed turns are fenced (see the class docstring)."""
        return self._exclusive_turns

    @property
    def keep_interrupted(self) -> bool:
        """Whether interrupted turns are stored (see the class docstring)."""
        return self._keep_interrupted

    @property
    def on_overlap(self) -> str:
        """What an overlapping turn does (see the class docstring)."""
        return self._overlap.strategy

    def __call__(self, *args: Never, **kwargs: Never) -> NoReturn:
        # chat.wrap(model, history) instead of chat.wrap(model, history.call): the
        # middlewares are the two methods. (Typed to take nothing, so mypy still flags it.)
        raise TypeError(
            "a history Middleware is not itself a middleware: pass its call or stream "
            "method, chat.wrap(model, history.call) or chat.wrap_stream(streamer, "
            "history.stream)"
        )

    def call(self, next: Model) -> Model:
        """A call middleware: wrap ``next`` (use with ``chat.wrap``).

        ``next`` must be a ``Model`` (``TypeError`` otherwise: a Streamer-only object
        goes through ``stream`` with ``chat.wrap_stream``)."""
        _check_next(next, "call", Model, "an async call(request)")
        return _HistoryModel(self, next)

    def stream(self, next: Streamer) -> Streamer:
        """A stream middleware: wrap ``next`` (use with ``chat.wrap_stream``).

        ``next`` must be a ``Streamer`` (``TypeError`` otherwise: a Model-only object
        goes through ``call`` with ``chat.wrap``)."""
        _check_next(next, "stream", Streamer, "a stream(request)")
        return _HistoryStreamer(self, next)

    # ------------------------------------------------------------------ internals

    def _report(
        self,
        turn: tuple[Message, ...],
        partial: Response | None,
        reason: IncompleteReason,
        error: BaseException | None,
        batch: Batch | None = None,
        kept: Batch | None = None,
    ) -> None:
        callback = self._on_incomplete
        if callback is None:
            return
        try:
            callback(
                IncompleteTurn(self._conversation_id, turn, partial, reason, error, batch, kept)
            )
        except Exception:
            _log.exception(
                "on_incomplete callback failed for conversation %r", str(self._conversation_id)
            )

    def _report_failure(
        self,
        turn: tuple[Message, ...],
        partial: Response | None,
        exc: BaseException,
        batch: Batch | None = None,
        kept: Batch | None = None,
    ) -> None:
        reason = _failure_reason(exc)
        if reason is None:
            return
        # During the append (``batch`` set) the outcome is unknown: hand the batch over.
        self._report(
            turn,
            partial,
            reason,
            exc,
            batch if reason is IncompleteReason.CANCELLED else None,
            kept,
        )

    async def _keep(
        self,
        turn: tuple[Message, ...],
        partial: Response | None,
        reason: str,
        expected_length: int | None,
    ) -> Batch | None:
        """Store an interrupted turn when ``keep_interrupted`` is on (see the class
        docstring): the batch that landed, or None. Never raises an ``Exception``;
        ``reason`` is an ``IncompleteReason`` value or ``"interrupted"``."""
        if not self._keep_interrupted:
            return None
        return await _interrupted.keep(
            self._writer,
            lambda: _interrupted.interrupted_batch(
                self._conversation_id,
                self._new_append_id(),
                turn,
                partial,
                str(reason),
                expected_length,
            ),
        )

    async def _keep_failure(
        self,
        turn: tuple[Message, ...],
        partial: Response | None,
        exc: BaseException,
        expected_length: int | None,
    ) -> Batch | None:
        """``_keep`` for a turn that failed after the model was called."""
        reason = _failure_reason(exc)
        if reason not in _KEPT_REASONS:
            return None
        return await self._keep(turn, partial, str(reason), expected_length)

    async def _downstream(
        self,
        request: Request,
        prefix: tuple[Message, ...],
        turn: tuple[Message, ...],
        lease: _overlap.Lease | None,
    ) -> tuple[Request, int | None]:
        """The request to send downstream and the fence for the commit (None: none).
        A lease that read the history with the lease (a ``FoldedTurnLeaser`` reader)
        hands its view over instead of a second read."""
        reader = self._reader
        cid = self._conversation_id
        expected: int | None = None
        stored: Any
        with _trace.read_span(cid) as span:
            view: object = None if lease is None else lease.view
            viewed = view is not None
            if not viewed and implements(reader, ViewReader):
                view = await reader.read_view(cid)  # type: ignore[attr-defined]
                viewed = True
            if viewed:
                if not isinstance(view, HistoryView):
                    raise StoreError(
                        f"read_view of conversation {str(cid)!r} returned "
                        f"{type(view).__name__}, not a HistoryView"
                    )
                span.read(len(view.messages), length=view.length, closed=view.closed)
                if view.closed:
                    with _trace.commit_span(cid):  # the trace says why nothing was stored
                        raise ConversationClosedError(
                            f"conversation {str(cid)!r} is closed (cleared): the turn "
                            "cannot be stored, so the model was not called"
                        )
                stored = view.messages
                if self._exclusive_turns:
                    expected = view.length
            else:
                stored = await reader.read(cid)
                span.read(len(stored))
        # The replay is checked once per stored message, not once per call (_replay.py);
        # the prefix and the open turn are the caller's already-validated request.
        replay = checked_replay(reader, cid, stored)
        # A WindowReader's merged system message holding a compaction summary (§6d) is
        # history the model needs, not a stored system prompt: it follows the prefix.
        first = stored[0] if stored else None
        if first is not None and first.role is Role.SYSTEM and COMPACTION_KEY in first.metadata:
            prefix = (*prefix, first)
        return request._with_checked_messages((*prefix, *replay, *turn)), expected

    def _completed(
        self, turn: tuple[Message, ...], response: Response, expected_length: int | None
    ) -> Batch | None:
        """Validate a finished response: the batch completing the turn, or None for the
        tool-call pause (the turn stays open, nothing is written)."""
        response.validate_complete()
        if _needs_tools(response):
            return None
        output = response.output
        assert output is not None
        if output.message is None:
            raise InvalidResponseError(
                "a final response needs an assistant message to complete the turn"
            )
        return Batch(
            self._conversation_id,
            self._new_append_id(),
            (*turn, _with_usage(output.message, response)),
            expected_length,
        )

    async def _commit(
        self,
        turn: tuple[Message, ...],
        response: Response,
        expected_length: int | None,
        pending: list[Batch],
        lease: _overlap.Lease | None = None,
    ) -> None:
        """Complete the turn (``_completed``) and append its batch (``_append``), in a
        ``scope.history.commit`` trace span; the batch goes into ``pending`` before the
        append, so a cancellation during it can be reported with the batch. With a
        lease that folds the commit, the append releases the lease in the same step."""
        with _trace.commit_span(self._conversation_id) as span:
            batch = self._completed(turn, response, expected_length)
            if batch is None:
                span.outcome(_trace.CommitOutcome.TOOL_PAUSE)
                return
            pending.append(batch)
            span.batch(batch)
            await self._append(batch, response, lease)

    async def _append(
        self, batch: Batch, response: Response, lease: _overlap.Lease | None = None
    ) -> None:
        """Append the batch and check its receipt; failures become ``CommitError``.
        Cancellation (and KeyboardInterrupt, SystemExit, GeneratorExit) pass unchanged."""
        receipt: Any = None
        broken = False  # the writer answered with something that is not a Receipt
        try:
            if lease is not None and lease.folds_commit:
                receipt = await lease.append_and_release(batch)
            else:
                receipt = await self._writer.append(batch)
            if not isinstance(receipt, Receipt):
                broken = True
                raise InvalidReceiptError(
                    f"the writer is broken: {type(self._writer).__name__}.append returned "
                    f"{type(receipt).__name__}, not a Receipt; whether it stored the batch "
                    "is unknown"
                )
            receipt.validate_for(batch)
        except Exception as exc:
            checked = receipt if isinstance(receipt, Receipt) and _matches(receipt, batch) else None
            retryable = not broken and not isinstance(exc, _FINAL_CAUSES)
            raise CommitError(
                _commit_message(self._conversation_id, exc, retryable),
                batch=batch,
                receipt=checked,
                response=response,
                retryable=retryable,
            ) from exc


def _with_usage(message: Message, response: Response) -> Message:
    """The answer as committed: with the response's usage (``scope/usage``, the input
    and output token counts) and id (``scope/response_id``) in its metadata (DESIGN
    §6d), when the response reported them (a zero usage is no report)."""
    meta = response.metadata
    if meta is None:
        return message
    stamps: dict[str, object] = {}
    usage = meta.usage
    if usage.input_tokens or usage.output_tokens:
        stamps["scope/usage"] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        }
    if meta.id:
        stamps["scope/response_id"] = meta.id
    if not stamps:
        return message
    return Message(message.role, message.parts, message.metadata.merge(stamps))


def _check_next(next: object, method: str, wanted: type, shape: str) -> None:
    """``TypeError`` unless ``next`` is what ``Middleware.<method>`` wraps; an object
    that is only the other protocol is told which composition to use instead."""
    if implements(next, wanted):
        return
    other, other_usage = (
        (Streamer, "chat.wrap_stream(streamer, mw.stream)")
        if wanted is Model
        else (Model, "chat.wrap(model, mw.call)")
    )
    hint = ""
    if implements(next, other):
        hint = f", which is only a {other.__name__}: use {other_usage}"
    raise TypeError(
        f"Middleware.{method} wraps a scope.chat.{wanted.__name__} (an object with "
        f"{shape}), got {type(next).__name__}{hint}"
    )


def _check_coroutine_method(obj: object, role: str, name: str, signature: str) -> None:
    """``TypeError`` unless ``obj.<name>`` is a coroutine function (an ``async def``):
    a plain one would fail only when the first turn runs."""
    method = getattr(obj, name)
    if not inspect.iscoroutinefunction(method):
        raise TypeError(
            f"Middleware {role} {type(obj).__name__}.{name} must be a coroutine function "
            f"(async def {signature}), got {type(method).__name__} {method!r}"
        )


def _commit_message(cid: ConversationID, exc: Exception, retryable: bool) -> str:
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


@final
@attrs.frozen
class _HistoryModel:
    """``Middleware.call(next)``."""

    middleware: Middleware
    next: Model

    async def call(self, request: Request) -> Response:
        mw = self.middleware
        prefix, turn = split_request(request)
        cid = mw._conversation_id
        _trace.annotate_conversation(cid)
        response: Response | None = None
        pending: list[Batch] = []
        called = False  # the model was asked: an interruption from here on can be kept
        expected: int | None = None
        lease: _overlap.Lease | None = None
        try:
            lease = await mw._overlap.begin(cid)
            downstream, expected = await mw._downstream(request, prefix, turn, lease)
            called = True
            with _trace.conversation(cid):
                if lease is None:
                    returned = await self.next.call(downstream)
                else:
                    returned = await lease.call(self.next.call, downstream)
            called = False  # the model answered: what follows is a commit, not an interruption
            if not isinstance(returned, Response):
                raise InvalidResponseError(
                    f"the model returned {type(returned).__name__}, not a Response"
                )
            response = returned
            await mw._commit(turn, response, expected, pending, lease)
        except BaseException as exc:
            kept = await mw._keep_failure(turn, None, exc, expected) if called else None
            mw._report_failure(turn, response, exc, pending[0] if pending else None, kept)
            raise
        finally:
            if lease is not None:
                await lease.release()
        return response


@final
@attrs.frozen
class _HistoryStreamer:
    """``Middleware.stream(next)``."""

    middleware: Middleware
    next: Streamer

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        return self._run(request)

    async def _run(self, request: Request) -> AsyncGenerator[Response, None]:
        mw = self.middleware
        prefix, turn = split_request(request)  # on first iteration, like every Streamer
        accumulator = ResponseAccumulator()
        pending: list[Batch] = []
        cid = mw._conversation_id
        streaming = False  # the model was asked and has not finished: keep_interrupted applies
        expected: int | None = None
        lease: _overlap.Lease | None = None
        try:
            lease = await mw._overlap.begin(cid)
            downstream, expected = await mw._downstream(request, prefix, turn, lease)
            with _trace.conversation(cid):  # a synchronous call: never held across a yield
                inner = self.next.stream(downstream)
            streaming = True
            chunks = inner if lease is None else lease.chunks(inner)
            try:
                async for chunk in chunks:
                    accumulator.add(chunk)
                    yield chunk
            finally:
                if chunks is not inner:
                    await chunks.aclose()
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    await aclose()
            streaming = False
            response = accumulator.response()
            if response is None:
                raise InvalidResponseError("the stream ended without any chunk")
            await mw._commit(turn, response, expected, pending, lease)
        except GeneratorExit:
            partial = accumulator.response()
            kept = None
            if streaming:  # stopped at a yield: always while streaming
                kept = await mw._keep(turn, partial, IncompleteReason.STOPPED, expected)
            mw._report(turn, partial, IncompleteReason.STOPPED, None, None, kept)
            raise
        except BaseException as exc:
            partial = accumulator.response()
            kept = await mw._keep_failure(turn, partial, exc, expected) if streaming else None
            mw._report_failure(turn, partial, exc, pending[0] if pending else None, kept)
            raise
        finally:
            if lease is not None:
                await lease.release()
