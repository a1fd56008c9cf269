"""The one core both UI protocols share: a scope stream in, protocol-neutral calls out.

``Driver`` feeds every chunk to a ``ResponseAccumulator`` (which validates it and keeps
the answer so far) and turns the same chunk into block calls on a ``Sink``: a text or
reasoning block opens where the accumulator starts a new part and closes where the
next part starts, so the blocks a client assembles are exactly the parts the
accumulator (and the history) holds. Each protocol module is a ``Sink`` that writes
its own wire format; nothing protocol-specific lives here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from types import TracebackType
from typing import Final, Protocol, Self

from scope.chat import (
    FinishReason,
    PartKind,
    Response,
    ResponseAccumulator,
    ToolCall,
    ToolResult,
    Usage,
)
from scope.conversation import TurnEvent, TurnEventKind
from scope.errors import ConversationClosedError, TurnInProgressError, TurnInterruptedError
from scope.media import Media
from scope.metadata import Metadata
from scope.web._sources import Page, Source, cited, images, sources

__all__ = [
    "Driver",
    "EncodedStream",
    "ErrorText",
    "Sink",
    "StreamItem",
    "check_encoder_arguments",
    "default_error_text",
]

_log: Final = logging.getLogger("scope.web")

#: What the encoders accept: a model's stream of ``Response`` deltas, or the events of
#: ``Conversation.stream`` (tool calls, tool results and steps included).
StreamItem = Response | TurnEvent[object]
#: Turns a stream's failure into the text the client sees in the protocol's error event.
ErrorText = Callable[[Exception], str]

_TEXT = PartKind.TEXT
_REASONING = PartKind.REASONING
_TOOL_CALL_DELTA = PartKind.TOOL_CALL_DELTA
_TOOL_CALL = PartKind.TOOL_CALL
_MEDIA = PartKind.MEDIA
_NATIVE = PartKind.NATIVE


def default_error_text(exc: Exception) -> str:
    """The error text a client sees by default: the failure's type, never its message
    (which may carry a provider's body or a store's address)."""
    return f"the answer failed ({type(exc).__name__})"


class Sink(Protocol):
    """What a protocol writes for each neutral event (block ids are the core's)."""

    def start(self) -> None: ...
    def step_start(self) -> None: ...
    def step_end(self) -> None: ...
    def step_restart(self) -> None: ...
    def text_start(self, block: str) -> None: ...
    def text_delta(self, block: str, text: str) -> None: ...
    def text_end(self, block: str) -> None: ...
    def reasoning_start(self, block: str) -> None: ...
    def reasoning_delta(self, block: str, text: str) -> None: ...
    def reasoning_end(self, block: str) -> None: ...
    def tool_start(self, call_id: str, name: str) -> None: ...
    def tool_delta(self, call_id: str, arguments: str) -> None: ...
    def tool_end(self, call: ToolCall) -> None: ...
    def earlier_call(self, call: ToolCall) -> None: ...
    def tool_result(self, result: ToolResult, denied: str | None) -> None: ...
    def approval_request(self, call: ToolCall) -> None: ...
    def media(self, media: Media) -> None: ...
    def source(self, source_id: str, url: str, title: str) -> None: ...
    def document(self, source_id: str, media_type: str, title: str, filename: str) -> None: ...
    def finish(self, reason: FinishReason | None, usage: Usage | None) -> None: ...
    def error(self, text: str) -> None: ...
    def abort(self, reason: str) -> None: ...


class Driver:
    """Turns stream items into ``Sink`` calls; one per encoded stream, one task at a time.

    A *step* is one model call: ``Conversation.stream`` runs several when tools are
    called, and each gets its own accumulator (a step's answer ends with its finish
    reason). The block ids are ``{prefix}{n}``, unique within the stream.

    A step is *restarted* when ``Conversation.stream`` sends an answer back
    (``output_retries``: it did not decode) and the model answers again: then the
    answer's chunks are followed, with no tool result between, by a new model call's
    chunks. The driver closes what is open and calls ``Sink.step_restart`` before the
    new answer (a fresh accumulator; its parts are new blocks). From a model's own
    ``Response`` stream, parts after the finish reason stay an invalid chunk.
    """

    __slots__ = (
        "_accumulator",
        "_block",
        "_block_kind",
        "_block_meta",
        "_calls",
        "_carried",
        "_count",
        "_finished",
        "_in_step",
        "_last",
        "_prefix",
        "_seen",
        "_sink",
    )

    def __init__(self, sink: Sink, prefix: str) -> None:
        self._sink = sink
        self._prefix = prefix
        self._count = 0
        self._accumulator = ResponseAccumulator()
        self._last: Response | None = None  # the last step's answer
        self._block = ""  # the open text or reasoning block's id ("" when none)
        self._block_kind: PartKind | None = None
        self._block_meta: Metadata | None = None
        self._calls: dict[str, tuple[str, list[str]]] = {}  # open calls: id -> name, args
        self._carried: set[str] = set()  # the ids of the calls this stream has sent
        self._in_step = False
        self._finished = False  # the step's answer has its finish reason
        self._seen: set[str] = set()  # the pages (URLs) and documents shown so far

    def start(self) -> None:
        self._sink.start()

    def feed(self, item: StreamItem) -> None:
        """One item of the stream; ``InvalidResponseError`` for an invalid chunk."""
        if type(item) is Response:
            self.chunk(item)
            return
        if not isinstance(item, TurnEvent):
            raise TypeError(
                f"a stream to encode yields Response or TurnEvent, got {type(item).__name__}"
            )
        kind = item.kind
        if kind is TurnEventKind.CHUNK:
            chunk = item.chunk
            assert chunk is not None
            output = chunk.output
            if (
                self._in_step
                and self._finished
                and output is not None
                and output.message is not None
                and output.message.parts
            ):
                self._restart()
            self.chunk(chunk)
        elif kind is TurnEventKind.TOOL_CALL:
            call = item.tool_call
            assert call is not None
            if call.id not in self._carried:
                # A call an earlier stream carried (the waiting turn's, which a decision
                # continues): sent again before its result, so that this stream read
                # alone (a resumed one, replayed from its start) holds it too.
                self._carried.add(call.id)
                self._sink.earlier_call(call)
            # Otherwise it repeats a call the chunks already carried.
        elif kind is TurnEventKind.TOOL_RESULT:
            assert item.tool_result is not None
            self._end_step()
            self._sink.tool_result(item.tool_result, item.denied)
        elif kind is TurnEventKind.DONE:
            result = item.result
            if result is not None and result.pending:
                # The turn waits for a decision on these calls (requires_approval):
                # each is asked for, after its call was sent (by an earlier stream, for
                # the calls a partial decision leaves waiting: sent again, as above).
                self._end_step()
                for call in result.pending:
                    if call.id not in self._carried:
                        self._carried.add(call.id)
                        self._sink.earlier_call(call)
                    self._sink.approval_request(call)

    def chunk(self, chunk: Response) -> None:
        if not self._in_step:
            self._in_step = True
            self._finished = False
            self._accumulator = ResponseAccumulator()
            self._sink.step_start()
        self._accumulator.add(chunk)  # validates; raises before anything is written
        output = chunk.output
        if output is None:
            return
        if output.finish_reason is not None:
            self._finished = True
        if output.message is None:
            if output.message_metadata:  # what a provider sent after the last part
                self._show(cited(output.message_metadata))
            return
        sink = self._sink
        for part in output.message.parts:
            kind = part.kind
            if kind is _TEXT or kind is _REASONING:
                meta = part.metadata
                if not (
                    self._block_kind is kind
                    and (self._block_meta is meta or self._block_meta == meta)
                ):
                    self._close_block()
                    if kind is _REASONING and not part.text:
                        # Encrypted or redacted reasoning (a signature, no text): the
                        # signature stays on the server, and an empty block shows nothing.
                        continue
                    self._count += 1
                    self._block = block = f"{self._prefix}{self._count}"
                    self._block_kind = kind
                    self._block_meta = meta
                    if kind is _TEXT:
                        sink.text_start(block)
                    else:
                        sink.reasoning_start(block)
                if part.text:
                    if kind is _TEXT:
                        sink.text_delta(self._block, part.text)
                    else:
                        sink.reasoning_delta(self._block, part.text)
            elif kind is _TOOL_CALL_DELTA:
                delta = part.tool_call_delta
                assert delta is not None
                call = self._calls.get(delta.id)
                if call is None:  # a new call: the accumulator starts a new part
                    self._close_block()
                    call = self._calls[delta.id] = (delta.name, [])
                    self._carried.add(delta.id)
                    sink.tool_start(delta.id, delta.name)
                if delta.arguments:
                    call[1].append(delta.arguments)
                    sink.tool_delta(delta.id, delta.arguments)
            elif kind is _TOOL_CALL:
                complete = part.tool_call
                assert complete is not None
                self._close_block()
                self._carried.add(complete.id)
                sink.tool_start(complete.id, complete.name)
                if complete.arguments:
                    sink.tool_delta(complete.id, complete.arguments)
                sink.tool_end(complete)
            elif kind is _MEDIA:
                assert part.media is not None
                self._close_block()
                sink.media(part.media)
            elif kind is _NATIVE:
                self._close_block()
                for image in images(part):
                    sink.media(image)
            if kind is _TEXT or kind is _NATIVE:
                self._show(sources(part))
        metadata = output.message.metadata
        if metadata:
            self._show(cited(metadata))

    def end(self) -> None:
        """The stream ended naturally: close what is open, then ``finish``."""
        self._end_step()
        last = self._last
        usage = None
        reason = None
        if last is not None:
            reason = last.output.finish_reason if last.output is not None else None
            usage = last.metadata.usage if last.metadata is not None else None
        self._sink.finish(reason, usage)

    def abort(self, reason: str) -> None:
        """The stream was stopped on purpose (a newer turn interrupted it): the
        protocol's abort event, or its error event where it has none."""
        self._sink.abort(reason)

    def fail(self, text: str) -> None:
        """The stream failed: the protocol's error event (open blocks stay open, as the
        protocols expect of an aborted run)."""
        self._sink.error(text)

    def _show(self, found: list[Source]) -> None:
        """Source parts for what an answer read or cited, each page (by URL) and each
        document once per stream."""
        for source in found:
            key = source.url if isinstance(source, Page) else f"document:{source.key}"
            if key in self._seen:
                continue
            self._seen.add(key)
            source_id = f"{self._prefix}src{len(self._seen)}"
            if isinstance(source, Page):
                self._sink.source(source_id, source.url, source.title)
            else:
                self._sink.document(source_id, source.media_type, source.title, source.filename)

    def _close_block(self) -> None:
        if self._block:
            if self._block_kind is _TEXT:
                self._sink.text_end(self._block)
            else:
                self._sink.reasoning_end(self._block)
            self._block = ""
            self._block_kind = None
            self._block_meta = None

    def _restart(self) -> None:
        """The step's answer was sent back and the model answers again (see the class)."""
        self._close_block()
        for call_id, (name, args) in self._calls.items():
            self._sink.tool_end(ToolCall(call_id, name, "".join(args)))
        self._calls = {}
        self._accumulator = ResponseAccumulator()
        self._finished = False
        self._sink.step_restart()

    def _end_step(self) -> None:
        if not self._in_step:
            return
        self._close_block()
        for call_id, (name, args) in self._calls.items():
            self._sink.tool_end(ToolCall(call_id, name, "".join(args)))
        self._calls = {}
        self._last = self._accumulator.response()
        self._in_step = False
        self._finished = False
        self._sink.step_end()


def check_encoder_arguments(stream: object, on_error: object) -> None:
    """The arguments every encoder takes: ``TypeError`` before anything is streamed."""
    if isinstance(stream, str | bytes) or not callable(getattr(stream, "__aiter__", None)):
        raise TypeError(
            "stream must be an async iterable of Response chunks or TurnEvents (a model's "
            f"stream(request), Conversation.stream(...)), got {type(stream).__name__}"
        )
    if not callable(on_error):
        raise TypeError(
            f"on_error must be callable (exception -> text), got {type(on_error).__name__}"
        )


class EncodedStream:
    """The SSE bytes of one encoded stream (what ``ui_message_stream`` and
    ``agui_events`` return): an async iterator of ``bytes``, one per stream item that
    wrote something, closed with ``aclose()`` (or ``async with``).

    A failure of the scope stream (an ``Exception`` from it, or an invalid chunk)
    becomes the protocol's error event with ``on_error``'s text and ends the encoded
    stream normally; the exception is logged on the ``scope.web`` logger (``ERROR``
    with its traceback; ``INFO`` for a turn another turn refused or interrupted:
    ``TurnInProgressError``, ``TurnInterruptedError``) and kept as ``error``, so a
    service may act on it once the stream ended. Cancellation propagates untouched.
    The scope stream is closed on every path.

    A stream stopped from outside before its end (cancelled, or closed early) has
    written neither its finish nor its error event: ``stopped(text)`` gives that error
    event, for whoever stopped it to send after what was sent (``ResumableTurns``
    does when its shutdown stops a turn).
    """

    __slots__ = ("_driver", "_ended", "_error", "_frames", "_out")

    def __init__(
        self,
        stream: AsyncIterable[StreamItem],
        driver: Driver,
        out: list[bytes],
        on_error: ErrorText,
    ) -> None:
        self._error: Exception | None = None
        self._driver = driver
        self._out = out
        self._ended = False  # the finish or error event was written
        self._frames = self._run(stream, driver, out, on_error)

    @property
    def error(self) -> Exception | None:
        """The exception the scope stream failed with (None while it has not failed)."""
        return self._error

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await self._frames.__anext__()

    async def aclose(self) -> None:
        """Stop early: the scope stream is closed before this returns."""
        await self._frames.aclose()

    def stopped(self, text: str) -> bytes:
        """The protocol's error event with ``text`` (the AI SDK's ``error`` part and
        ``[DONE]``, AG-UI's ``RUN_ERROR``), for a stream that was stopped before its
        end, to send after the frames already sent; ``b""`` when the stream wrote its
        finish or error event (it ended: nothing to add). Call it once the stream is
        closed (``aclose``); it writes nothing else."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self._ended:
            return b""
        self._ended = True
        self._out.clear()  # an item cut off mid-write is not sent
        self._driver.fail(text)
        data = b"".join(self._out)
        self._out.clear()
        return data

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(
        self,
        stream: AsyncIterable[StreamItem],
        driver: Driver,
        out: list[bytes],
        on_error: ErrorText,
    ) -> AsyncGenerator[bytes, None]:
        aclose = getattr(stream, "aclose", None)
        try:
            driver.start()
            kept = len(out)  # what the item being fed may not leave half written
            try:
                async for item in stream:
                    driver.feed(item)
                    if out:
                        data = b"".join(out)
                        out.clear()
                        yield data
                    kept = len(out)
                driver.end()
                self._ended = True
            except Exception as exc:
                self._error = exc
                _report(exc)
                del out[kept:]  # the start event stays when nothing was sent yet
                if isinstance(exc, TurnInterruptedError):
                    driver.abort(on_error(exc))  # stopped on purpose, not failed
                else:
                    driver.fail(on_error(exc))
            self._ended = True
            data = b"".join(out)
            out.clear()
            yield data
        finally:
            if aclose is not None:
                await aclose()


def _report(exc: Exception) -> None:
    if isinstance(exc, TurnInProgressError | TurnInterruptedError):
        _log.info("a turn ended without an answer: %s: %s", type(exc).__name__, exc)
    elif isinstance(exc, ConversationClosedError) or isinstance(
        exc.__cause__, ConversationClosedError
    ):
        # Cleared, expired or erased meanwhile: the error's text names the conversation,
        # and an erased conversation's id is kept nowhere, logs included.
        _log.info(
            "a turn ended without an answer: its conversation is closed (%s)",
            type(exc).__name__,
        )
    else:
        _log.error(
            "a streamed turn failed (%s): the client got the error event",
            type(exc).__name__,
            exc_info=exc,
        )
