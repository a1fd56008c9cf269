"""The history ``Middleware``: replay prior turns, commit a completed turn exactly once."""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Final, final

import attrs

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
    CommitError,
    InvalidReceiptError,
    InvalidRequestError,
    InvalidResponseError,
    StoreError,
)
from scope.history._batch import Batch, Receipt
from scope.history._ids import ConversationID
from scope.history._protocols import Reader, Writer

__all__ = ["IncompleteReason", "IncompleteTurn", "Middleware"]

_log: Final = logging.getLogger("scope.history")


class IncompleteReason(enum.StrEnum):
    """Why a bound call or stream ended without committing its turn."""

    ERROR = "error"  # the reader or the model raised
    CANCELLED = "cancelled"  # cancellation arrived before the commit
    STOPPED = "stopped"  # the consumer stopped the stream early
    INVALID_RESPONSE = "invalid_response"  # the response (or a chunk) was invalid


@final
@attrs.frozen
class IncompleteTurn:
    """What ``on_incomplete`` receives when a turn ends without a commit.

    ``open_turn`` is the turn the request carried (the user's message and any tool
    follow-ups), ``partial`` the response accumulated so far (None when nothing arrived),
    ``error`` the exception that ended it (None for an early stop).
    """

    conversation_id: ConversationID
    open_turn: tuple[Message, ...]
    partial: Response | None
    reason: IncompleteReason
    error: BaseException | None = attrs.field(default=None, eq=False)


def _new_append_id() -> str:
    return uuid.uuid4().hex


def _is_cancellation(exc: BaseException) -> bool:
    # asyncio.CancelledError and trio.Cancelled are both BaseException, not Exception;
    # GeneratorExit, KeyboardInterrupt and SystemExit are not cancellations.
    return not isinstance(exc, Exception | GeneratorExit | KeyboardInterrupt | SystemExit)


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
                f"their tool results may follow, got a {message.role} message"
                + ("" if message.role is not Role.ASSISTANT else " without tool calls")
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


def _needs_tools(response: Response) -> bool:
    output = response.output
    return (
        output is not None
        and output.message is not None
        and any(part.kind is PartKind.TOOL_CALL for part in output.message.parts)
    )


@final
class Middleware:
    """Keeps one conversation's history around a model.

    ``Middleware(reader, writer, conversation_id)`` gives ``.call(model)`` and
    ``.stream(streamer)``, usable with ``chat.wrap``/``chat.wrap_stream``. Each request
    must be a system prefix plus one open turn (see ``split_request``); it is checked
    before any I/O (``InvalidRequestError``: neither the reader nor the model is called).

    Replay: ``system prefix + stored non-system messages + open turn`` goes downstream.
    Stored messages are checked first; an invalid stored history raises ``StoreError``
    and is never sent.

    Commit: the response must pass ``validate_complete()`` (else
    ``InvalidResponseError``, nothing written). A response with tool calls leaves the turn
    open and writes nothing: the host runs the tools and resubmits the turn with their
    results. A final answer appends exactly one ``Batch(open turn + answer)`` under a
    fresh append id (``new_append_id()``) and checks the receipt. If persisting fails
    after the model answered — the writer raised, a cancellation arrived during the
    append, or the receipt does not match — ``CommitError`` carries the batch, the
    receipt (only one that passed ``validate_for``) and the response, with the failure as
    ``__cause__``: ``await writer.append(err.batch)`` retries without calling the model.

    Streams: no I/O until the first iteration; chunks are forwarded as they arrive and
    accumulated; the batch is appended only after the inner stream ends naturally
    without error (a ``CommitError`` is raised after the last chunk). An early stop, an
    inner error or cancellation writes nothing; the inner stream is closed on every path
    before the outer one finishes closing.

    ``on_incomplete`` (synchronous, must not block) receives an ``IncompleteTurn`` once
    whenever a bound call or stream ends without committing — except the tool-call pause
    and a ``CommitError`` (which carries its batch). If it raises, the error is logged on
    the ``scope.history`` logger and the original outcome stands.
    """

    __slots__ = ("_conversation_id", "_new_append_id", "_on_incomplete", "_reader", "_writer")

    def __init__(
        self,
        reader: Reader,
        writer: Writer,
        conversation_id: str,
        new_append_id: Callable[[], str] = _new_append_id,
        on_incomplete: Callable[[IncompleteTurn], None] | None = None,
    ) -> None:
        self._conversation_id = ConversationID(conversation_id)
        self._reader = reader
        self._writer = writer
        self._new_append_id = new_append_id
        self._on_incomplete = on_incomplete

    @property
    def conversation_id(self) -> ConversationID:
        """The conversation this middleware keeps."""
        return self._conversation_id

    def call(self, next: Model) -> Model:
        """A call middleware: wrap ``next`` (use with ``chat.wrap``)."""
        return _HistoryModel(self, next)

    def stream(self, next: Streamer) -> Streamer:
        """A stream middleware: wrap ``next`` (use with ``chat.wrap_stream``)."""
        return _HistoryStreamer(self, next)

    # ------------------------------------------------------------------ internals

    def _report(
        self,
        turn: tuple[Message, ...],
        partial: Response | None,
        reason: IncompleteReason,
        error: BaseException | None,
    ) -> None:
        callback = self._on_incomplete
        if callback is None:
            return
        try:
            callback(IncompleteTurn(self._conversation_id, turn, partial, reason, error))
        except Exception:
            _log.exception(
                "on_incomplete callback failed for conversation %r", str(self._conversation_id)
            )

    def _report_failure(
        self, turn: tuple[Message, ...], partial: Response | None, exc: BaseException
    ) -> None:
        if isinstance(exc, CommitError):
            return
        if _is_cancellation(exc):
            reason = IncompleteReason.CANCELLED
        elif isinstance(exc, InvalidResponseError):
            reason = IncompleteReason.INVALID_RESPONSE
        else:
            reason = IncompleteReason.ERROR
        self._report(turn, partial, reason, exc)

    async def _downstream(
        self, request: Request, prefix: tuple[Message, ...], turn: tuple[Message, ...]
    ) -> Request:
        stored = await self._reader.read(self._conversation_id)
        replay: list[Message] = []
        for index, message in enumerate(stored):
            if not isinstance(message, Message):
                raise StoreError(
                    f"stored history of conversation {str(self._conversation_id)!r}: "
                    f"message {index} is a {type(message).__name__}, not a Message"
                )
            if message.role is not Role.SYSTEM:
                replay.append(message)
        try:
            return attrs.evolve(request, messages=(*prefix, *replay, *turn))
        except InvalidRequestError as exc:
            raise StoreError(
                f"stored history of conversation {str(self._conversation_id)!r} cannot be "
                f"replayed: {exc}"
            ) from exc

    async def _commit(self, turn: tuple[Message, ...], response: Response) -> None:
        """Validate a finished response and, for a final answer, append its batch."""
        response.validate_complete()
        if _needs_tools(response):
            return  # the tool-call pause: the turn stays open, nothing is written
        output = response.output
        assert output is not None
        if output.message is None:
            raise InvalidResponseError(
                "a final response needs an assistant message to complete the turn"
            )
        batch = Batch(self._conversation_id, self._new_append_id(), (*turn, output.message))
        receipt: Any = None
        try:
            receipt = await self._writer.append(batch)
            if not isinstance(receipt, Receipt):
                raise InvalidReceiptError(
                    f"the writer returned {type(receipt).__name__}, not a Receipt"
                )
            receipt.validate_for(batch)
        except BaseException as exc:
            if isinstance(exc, GeneratorExit | KeyboardInterrupt | SystemExit):
                raise
            checked = receipt if isinstance(receipt, Receipt) and _matches(receipt, batch) else None
            raise CommitError(
                f"the model answered but the turn of conversation "
                f"{str(self._conversation_id)!r} was not persisted: {exc!r}; retry "
                "writer.append(err.batch)",
                batch=batch,
                receipt=checked,
                response=response,
            ) from exc


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
        response: Response | None = None
        try:
            downstream = await mw._downstream(request, prefix, turn)
            returned = await self.next.call(downstream)
            if not isinstance(returned, Response):
                raise InvalidResponseError(
                    f"the model returned {type(returned).__name__}, not a Response"
                )
            response = returned
            await mw._commit(turn, response)
        except BaseException as exc:
            mw._report_failure(turn, response, exc)
            raise
        return response


@final
@attrs.frozen
class _HistoryStreamer:
    """``Middleware.stream(next)``."""

    middleware: Middleware
    next: Streamer

    def stream(self, request: Request) -> AsyncIterator[Response]:
        prefix, turn = split_request(request)  # checked now: no I/O happens here
        return self._run(request, prefix, turn)

    async def _run(
        self, request: Request, prefix: tuple[Message, ...], turn: tuple[Message, ...]
    ) -> AsyncGenerator[Response, None]:
        mw = self.middleware
        accumulator = ResponseAccumulator()
        try:
            downstream = await mw._downstream(request, prefix, turn)
            inner = self.next.stream(downstream)
            try:
                async for chunk in inner:
                    accumulator.add(chunk)
                    yield chunk
            finally:
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    await aclose()
            response = accumulator.response()
            if response is None:
                raise InvalidResponseError("the stream ended without any chunk")
            await mw._commit(turn, response)
        except GeneratorExit:
            mw._report(turn, accumulator.response(), IncompleteReason.STOPPED, None)
            raise
        except BaseException as exc:
            mw._report_failure(turn, accumulator.response(), exc)
            raise
