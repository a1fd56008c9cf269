"""Test helpers for code built on scope: ``ScriptedModel``, a deterministic model, and
``FunctionModel``, a model whose answers a function computes from the request.

``ScriptedModel`` is both a ``chat.Model`` and a ``chat.Streamer``. It answers each
request with the next scripted turn, records what it received and how every stream
ended, and checks requests as a real provider would, so a test of your own middleware,
agent loop or UI can run without a network under asyncio or trio:

    model = ScriptedModel(
        Response(Output(assistant_message("Hi!"), FinishReason.STOP)),   # a complete answer
        [chunk1, chunk2],                                                # exact chunks
        Fail(ProviderServerError("boom"), after=2),                      # fail mid-stream
    )
    answer = await model.call(request)
    assert model.requests == [request]

A turn is one of:

- a ``Response``: ``call`` returns it; ``stream`` yields ``ScriptedModel.chunks(response)``
  (text in small pieces, tool-call arguments in interleaved fragments, usage last);
- a sequence of ``Response`` chunks: ``stream`` yields them as given; ``call`` returns
  them accumulated;
- an exception instance: raised by ``call``, or by a stream's first iteration;
- ``Fail(error, after=k, script=...)``: a stream yields ``k`` chunks, then raises;
- ``Hang(after=k, script=...)``: yields ``k`` chunks, then waits until cancelled (for
  timeout and cancellation tests).

``FunctionModel(fn, chunk_delay=0.0)`` answers every request with ``fn(request)`` (a
``Response`` or its text; ``fn`` sync or async): it never runs out, its answers may
depend on the question, it streams like a provider (small pieces, ``chunk_delay``
seconds apart) and any number of tasks may share one, so it stands in for a model in
a service run offline (``docs/examples/web_chat``) as well as in tests.
``offline_summarizer`` is one for ``scope history compact --summarizer
scope.testing:offline_summarizer``: an extractive summary, no network.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Final, Literal, TypeAlias, final

import anyio
import anyio.lowlevel
import attrs

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Part,
    PartKind,
    Request,
    Response,
    ResponseAccumulator,
    ResponseMetadata,
    Role,
    assistant_message,
    text_part,
    tool_call_delta_part,
)
from scope.errors import InvalidRequestError
from scope.metadata import Metadata

__all__ = [
    "Fail",
    "FunctionModel",
    "Hang",
    "ScriptExhaustedError",
    "ScriptedModel",
    "StreamLog",
    "Turn",
    "offline_summarizer",
]


class ScriptExhaustedError(AssertionError):
    """A ``ScriptedModel`` received more requests than it has scripted turns.

    An ``AssertionError``: the test's script, not the code under test, is short.
    """


def _script_chunks(
    script: Response | Sequence[Response] | None, after: int, what: str
) -> tuple[Response, ...]:
    if type(after) is not int or after < 0:
        raise ValueError(f"{what} after must be a non-negative integer, got {after!r}")
    if script is None:
        return tuple(
            Response(Output(Message(Role.ASSISTANT, (text_part(f"chunk {i} "),))))
            for i in range(after)
        )
    if isinstance(script, Response):
        # The first `after` chunks only, made lazily: a long script answer is not split whole.
        chunks = tuple(itertools.islice(_iter_chunks(script, 4, 3), after))
    else:
        chunks = _chunk_list(script)
    if after > len(chunks):
        raise ValueError(f"{what} after={after}, but its script has only {len(chunks)} chunks")
    return chunks[:after]


def _chunk_list(chunks: Sequence[Response]) -> tuple[Response, ...]:
    out = tuple(chunks)
    for index, chunk in enumerate(out):
        if not isinstance(chunk, Response):
            raise TypeError(f"chunk {index} must be a Response, got {type(chunk).__name__}")
    return out


@final
@attrs.frozen
class Fail:
    """A turn that fails: ``call`` raises ``error``; a stream yields ``after`` chunks
    first, then raises ``error`` (once; the stream is then over).

    The chunks are the first ``after`` of ``script`` (a ``Response``, split with
    ``ScriptedModel.chunks``, or a list of chunks); without a script, chunk ``i`` is a
    text delta ``"chunk {i} "``.
    """

    error: BaseException
    after: int = 0
    script: Response | Sequence[Response] | None = None
    sent: tuple[Response, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.error, BaseException):
            raise TypeError(f"Fail needs an exception instance, got {type(self.error).__name__}")
        object.__setattr__(self, "sent", _script_chunks(self.script, self.after, "Fail"))


@final
@attrs.frozen
class Hang:
    """A turn that never finishes: ``call`` waits until cancelled; a stream yields
    ``after`` chunks (chosen as for ``Fail``), then waits until cancelled."""

    after: int = 0
    script: Response | Sequence[Response] | None = None
    sent: tuple[Response, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "sent", _script_chunks(self.script, self.after, "Hang"))


#: One scripted answer.
Turn: TypeAlias = Response | Sequence[Response] | BaseException | Fail | Hang

Outcome: TypeAlias = Literal["running", "completed", "failed", "stopped", "cancelled"]


@final
@attrs.define(eq=False)
class StreamLog:
    """What happened to one stream of a ``ScriptedModel`` (created on first iteration).

    ``sent``: chunks handed to the consumer. ``closed``: the stream's cleanup ran (it
    ended, failed, or was closed early) — a stream left unclosed by the code under test
    stays ``False``. ``outcome``: ``running``, ``completed``, ``failed`` (the scripted
    error was raised), ``stopped`` (the consumer closed it early) or ``cancelled``.
    """

    request: Request
    sent: int = 0
    closed: bool = False
    outcome: Outcome = "running"


def check_request(request: Request) -> None:
    """Check ``request`` as a strict provider would, raising ``InvalidRequestError``.

    ``Request.validate()`` (which refuses ``tool_call_delta`` parts, misplaced system
    messages and tool results that answer nothing), plus the rule OpenAI and Anthropic
    both enforce: every tool call of an assistant message is answered by the tool
    messages right after it, before the conversation moves on or ends.
    """
    if not isinstance(request, Request):
        raise InvalidRequestError(f"request must be a Request, got {type(request).__name__}")
    request.validate()
    pending: dict[str, None] = {}
    pending_at = 0
    for index, message in enumerate(request.messages):
        if message.role is Role.TOOL:
            for result in message.tool_results:
                pending.pop(result.id, None)
            continue
        if pending:
            break
        if message.role is Role.ASSISTANT:
            pending = dict.fromkeys(call.id for call in message.tool_calls)
            pending_at = index
    if pending:
        ids = ", ".join(repr(call_id) for call_id in pending)
        raise InvalidRequestError(
            f"messages[{pending_at}]: tool calls {ids} are not answered by the tool "
            "messages that follow"
        )


_HANG: Final = object()


@final
class ScriptedModel:
    """A deterministic ``Model`` and ``Streamer`` for tests, answering from a script.

    ``ScriptedModel(*turns, text_size=4, args_size=3)``: every ``call`` or ``stream``
    consumes the next turn (see the module docstring for the kinds of turns); when none
    is left it raises ``ScriptExhaustedError``. ``text_size``/``args_size`` set how a
    ``Response`` turn is split when streamed.

    Like a real provider it checks each request before doing anything
    (``check_request``: ``InvalidRequestError``; an invalid request consumes no turn and
    is not recorded). Valid requests are appended to ``requests``.

    Streams behave like a well-behaved provider's: ``stream(request)`` does nothing until
    first iterated (no check, no record, no turn consumed); every chunk is preceded by a
    cancellation checkpoint; a scripted failure is raised once and ends the stream;
    ``aclose()`` runs the stream's cleanup before returning; cancellation propagates
    untouched. Each started stream appends a ``StreamLog`` to ``streams``, whose
    ``closed`` flag tells a test whether the code under test closed it.

    Use from one task at a time (its script is one queue, consumed in request
    order); a model that many tasks share, a service's stand-in say, is a
    ``FunctionModel``.
    """

    def __init__(self, *turns: Turn, text_size: int = 4, args_size: int = 3) -> None:
        _check_sizes(text_size, args_size)
        for index, turn in enumerate(turns):
            if isinstance(turn, Response | BaseException | Fail | Hang):
                continue
            if isinstance(turn, Sequence) and not isinstance(turn, str | bytes):
                _chunk_list(turn)
                continue
            raise TypeError(
                f"turn {index} must be a Response, a list of Response chunks, an exception, "
                f"Fail or Hang, got {type(turn).__name__}"
            )
        self._turns: deque[Turn] = deque(turns)
        self._text_size = text_size
        self._args_size = args_size
        #: Every valid request received, in order.
        self.requests: list[Request] = []
        #: One log per started stream, in order.
        self.streams: list[StreamLog] = []

    @property
    def remaining(self) -> int:
        """How many scripted turns are left."""
        return len(self._turns)

    def _take(self, request: Request) -> Turn:
        check_request(request)
        self.requests.append(request)
        if not self._turns:
            raise ScriptExhaustedError(
                f"ScriptedModel received request {len(self.requests)}, but its script has "
                "no turn left"
            )
        return self._turns.popleft()

    async def call(self, request: Request) -> Response:
        """Answer with the next turn: a ``Response`` as is, chunks accumulated, an
        exception or ``Fail`` raised, ``Hang`` waiting until cancelled."""
        turn = self._take(request)
        await anyio.lowlevel.checkpoint()
        if isinstance(turn, Response):
            return turn
        if isinstance(turn, BaseException):
            raise turn
        if isinstance(turn, Fail):
            raise turn.error
        if isinstance(turn, Hang):
            await anyio.sleep_forever()
            raise AssertionError("unreachable")  # pragma: no cover
        accumulator = ResponseAccumulator()
        for chunk in turn:
            accumulator.add(chunk)
        response = accumulator.response()
        return Response() if response is None else response

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """A lazy stream answering with the next turn (see the class docstring)."""
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncGenerator[Response, None]:
        turn = self._take(request)
        log = StreamLog(request)
        self.streams.append(log)
        tail: object = None
        if isinstance(turn, Response):
            chunks: Iterable[Response] = _iter_chunks(turn, self._text_size, self._args_size)
        elif isinstance(turn, BaseException):
            chunks, tail = (), turn
        elif isinstance(turn, Fail):
            chunks, tail = turn.sent, turn.error
        elif isinstance(turn, Hang):
            chunks, tail = turn.sent, _HANG
        else:
            chunks = turn
        try:
            for chunk in chunks:
                await anyio.lowlevel.checkpoint()
                log.sent += 1
                yield chunk
            await anyio.lowlevel.checkpoint()
            if tail is _HANG:
                await anyio.sleep_forever()
            if isinstance(tail, BaseException):
                log.outcome = "failed"
                raise tail
            log.outcome = "completed"
        except GeneratorExit:
            log.outcome = "stopped"
            raise
        except anyio.get_cancelled_exc_class():
            log.outcome = "cancelled"
            raise
        finally:
            log.closed = True

    @staticmethod
    def chunks(response: Response, text_size: int = 4, args_size: int = 3) -> list[Response]:
        """Split a complete response into the chunks a provider would stream.

        - the first chunk carries the response id, model and extra metadata and the
          message metadata (an answer without parts: its ``message_metadata`` comes with
          the finish reason);
        - each text part comes in pieces of ``text_size`` characters (with the part's
          metadata on every piece, so they merge back);
        - reasoning text likewise, its signature in one more piece at the end;
        - each run of consecutive tool calls comes as ``tool_call_delta`` fragments of
          ``args_size`` characters, interleaved round-robin between the parallel calls
          (each call's first fragment in order, so positions are kept);
        - media parts come whole;
        - the last chunk carries the finish reason, output metadata and usage.

        Accumulating the chunks with ``ResponseAccumulator`` gives back ``response``
        whenever no two adjacent text (or reasoning) parts of it have equal metadata
        (those would merge, as they would from any provider). At least one chunk is
        returned.

        This builds every chunk at once; the streams of ``ScriptedModel`` and
        ``FunctionModel`` make the same chunks one at a time, as they are sent.
        """
        _check_sizes(text_size, args_size)
        if not isinstance(response, Response):
            raise TypeError(f"response must be a Response, got {type(response).__name__}")
        return list(_iter_chunks(response, text_size, args_size))


#: What a ``FunctionModel``'s function returns (or its coroutine does).
Answer: TypeAlias = Response | str
AnswerFunction: TypeAlias = Callable[[Request], Answer | Awaitable[Answer]]


@final
class FunctionModel:
    """A ``Model`` and ``Streamer`` that answers each request with ``fn(request)``.

    ``FunctionModel(fn, *, chunk_delay=0.0, text_size=4, args_size=3)``:

    - ``fn``: called with each valid request; returns the answer, a ``Response`` or a
      ``str`` (the text of a final assistant answer, finish reason ``stop``). It may be
      a plain function (it runs on the event loop: keep it quick) or an ``async def``
      (it may await, e.g. ``anyio.sleep`` to play a slow model). Its exceptions
      propagate as a provider's would (from ``call``, or from the stream's first
      iteration). Any other return value is a ``TypeError``.
    - ``chunk_delay``: seconds between two chunks of a stream (default 0: a
      cancellation checkpoint only), slept with ``anyio.sleep`` (asyncio and trio).
    - ``text_size``, ``args_size``: how a stream splits the answer, as
      ``ScriptedModel.chunks`` does (text in ``text_size``-character pieces, tool-call
      arguments in ``args_size``-character fragments, usage last).

    Each request is checked as a strict provider would (``check_request``:
    ``InvalidRequestError``, ``fn`` not called). Streams are lazy (nothing happens
    before the first iteration), close cleanly on ``aclose()`` and propagate
    cancellation.

    It keeps no state at all (a test that wants the requests records them in ``fn``),
    so one instance may serve any number of concurrent tasks, under one event loop or
    several: what each task gets depends on its own request only. Construction checks
    the arguments (``TypeError`` for a ``fn`` that is not callable or a
    ``chunk_delay`` that is not a number, ``ValueError`` for a negative or non-finite
    ``chunk_delay`` and sizes below 1).
    """

    __slots__ = ("_args_size", "_delay", "_fn", "_text_size")

    def __init__(
        self,
        fn: AnswerFunction,
        *,
        chunk_delay: float = 0.0,
        text_size: int = 4,
        args_size: int = 3,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"fn must be callable (fn(request) -> Response | str), got {type(fn).__name__}"
            )
        if isinstance(chunk_delay, bool) or not isinstance(chunk_delay, int | float):
            raise TypeError(
                f"chunk_delay must be a number of seconds, got {type(chunk_delay).__name__}"
            )
        if not (math.isfinite(chunk_delay) and chunk_delay >= 0):
            raise ValueError(f"chunk_delay must be a finite number >= 0, got {chunk_delay!r}")
        _check_sizes(text_size, args_size)
        self._fn = fn
        self._delay = float(chunk_delay)
        self._text_size = text_size
        self._args_size = args_size

    @property
    def chunk_delay(self) -> float:
        """Seconds between two chunks of a stream."""
        return self._delay

    async def _answer(self, request: Request) -> Response:
        check_request(request)
        result = self._fn(request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, str):
            return Response(Output(assistant_message(result), FinishReason.STOP))
        if not isinstance(result, Response):
            raise TypeError(
                f"FunctionModel's fn must return a Response or a str, got {type(result).__name__}"
            )
        return result

    async def call(self, request: Request) -> Response:
        """``fn``'s answer to ``request``."""
        response = await self._answer(request)
        await anyio.lowlevel.checkpoint()
        return response

    def stream(self, request: Request) -> AsyncGenerator[Response, None]:
        """``fn``'s answer to ``request`` in chunks, ``chunk_delay`` seconds apart."""
        return self._stream(request)

    async def _stream(self, request: Request) -> AsyncGenerator[Response, None]:
        response = await self._answer(request)
        chunks = _iter_chunks(response, self._text_size, self._args_size)
        for index, chunk in enumerate(chunks):
            if index and self._delay:
                await anyio.sleep(self._delay)
            else:
                await anyio.lowlevel.checkpoint()
            yield chunk


def _check_sizes(text_size: int, args_size: int) -> None:
    for name, value in (("text_size", text_size), ("args_size", args_size)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _iter_chunks(response: Response, text_size: int, args_size: int) -> Iterator[Response]:
    """``ScriptedModel.chunks(response)``, made one chunk at a time.

    Lazy so that a stream holds one chunk, not the whole split answer, before it sends
    anything: a 5 MB answer split into 4-character pieces is over a million chunks.
    The arguments are checked by the caller.
    """
    output = response.output
    meta = response.metadata
    message = None if output is None else output.message
    last_output = None
    if output is not None:
        # Metadata for a message that never came (no part) rides on the last chunk.
        last_output = Output(
            finish_reason=output.finish_reason,
            metadata=output.metadata,
            message_metadata=output.message_metadata,
        )
    first_meta = None
    last_meta = None
    if meta is not None:
        first_meta = ResponseMetadata(meta.id, meta.model, extra=meta.extra)
        if not meta.usage.is_zero():
            last_meta = ResponseMetadata(usage=meta.usage)
    first = True
    if message is not None:
        for part in _pieces(message.parts, text_size, args_size):
            delta = Message(Role.ASSISTANT, (part,), message.metadata if first else Metadata())
            yield Response(Output(delta), first_meta if first else None)
            first = False
    if first:  # nothing to split: one chunk
        yield Response(last_output, meta)
    else:
        yield Response(last_output, last_meta)


def _pieces(parts: Sequence[Part], text_size: int, args_size: int) -> Iterator[Part]:
    """The delta parts of ``parts``, in streaming order (see ``ScriptedModel.chunks``)."""
    index = 0
    while index < len(parts):
        part = parts[index]
        kind = part.kind
        if kind is PartKind.TEXT:
            for piece in _split(part.text, text_size):
                yield text_part(piece, part.metadata)
        elif kind is PartKind.REASONING:
            for piece in _split(part.text, text_size):
                yield Part(PartKind.REASONING, text=piece, metadata=part.metadata)
            if part.signature:
                yield Part(PartKind.REASONING, signature=part.signature, metadata=part.metadata)
        elif kind is PartKind.TOOL_CALL:
            end = index
            while end < len(parts) and parts[end].kind is PartKind.TOOL_CALL:
                end += 1
            yield from _interleave(parts[index:end], args_size)
            index = end
            continue
        else:
            yield part
        index += 1


def _split(text: str, size: int) -> Iterator[str]:
    return (text[i : i + size] for i in range(0, len(text), size))


def _fragments(part: Part, size: int) -> Iterator[Part]:
    """One tool call's argument fragments (one empty fragment for empty arguments), its
    metadata on the first."""
    call = part.tool_call
    assert call is not None
    arguments = call.arguments
    for n, start in enumerate(range(0, max(len(arguments), 1), size)):
        yield tool_call_delta_part(
            call.id,
            call.name,
            arguments[start : start + size],
            part.metadata if n == 0 else Metadata(),
        )


def _interleave(calls: Sequence[Part], size: int) -> Iterator[Part]:
    """The fragments of parallel tool calls, round-robin: each call's n-th fragment in the
    calls' order, then the (n+1)-th, so each call's first fragment keeps its position."""
    running = [_fragments(part, size) for part in calls]
    while running:
        alive = []
        for fragments in running:
            fragment = next(fragments, None)
            if fragment is not None:
                alive.append(fragments)
                yield fragment
        running = alive


#: The longest line of one message ``offline_summarizer`` keeps (characters).
_SUMMARY_LINE: Final = 160
#: The most lines it keeps (the newest ones).
_SUMMARY_LINES: Final = 40


def _offline_summary(request: Request) -> str:
    """An extractive summary of the transcript ``scope.history.compact`` sends (the last
    user message): each message's role and its first line, shortened."""
    transcript = request.messages[-1].text
    lines: list[str] = []
    for block in transcript.split("\n\n"):
        head, _, body = block.partition(":\n")
        first = (body or head).strip().splitlines()[0] if (body or head).strip() else ""
        if len(first) > _SUMMARY_LINE:
            first = first[: _SUMMARY_LINE - 1] + "…"
        lines.append(f"- {head}: {first}" if body else f"- {first}")
    dropped = max(0, len(lines) - _SUMMARY_LINES)
    kept = lines[dropped:]
    intro = "Earlier in this conversation (an extractive summary, made offline"
    intro += f"; {dropped} older lines left out):" if dropped else "):"
    return "\n".join([intro, *kept])


#: A summarizer that needs no model and no network (``scope history compact
#: --summarizer scope.testing:offline_summarizer``): each message of the transcript
#: becomes one line, its role and its first line (at most 160 characters), the newest
#: 40 lines kept. Deterministic, so a compaction it made can be checked in a test.
offline_summarizer: Final = FunctionModel(_offline_summary)
