"""The history ``Middleware``: replay the stored turns, commit a completed turn exactly
once, with the overlap and interrupted-turn layers composed around it.

Where each step lives: the turn's state and how it ends (``_turn.py``), the lease
(``_overlap.py``), keeping an interrupted turn (``_interrupted.py``), the fenced commit
(``_commit.py``), the replay (``Middleware._downstream`` here, with ``_replay.py``).
"""

from __future__ import annotations

import inspect
import logging
import uuid
import warnings
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Final, Never, NoReturn, final

import attrs

from scope.chat import Model, Request, Response, ResponseAccumulator, Role, Streamer
from scope.errors import ConversationClosedError, InvalidResponseError, StoreError
from scope.history import _commit, _trace
from scope.history._adapter import StoreAdapter, as_store, records_owners
from scope.history._erasure import check_owner
from scope.history._ids import ConversationID
from scope.history._interrupted import Keeper
from scope.history._layers import (
    Fence,
    Interrupt,
    KeepInterrupted,
    Layers,
    Reject,
    Unfenced,
    Wait,
    check_order,
    keyword_layers,
)
from scope.history._movehead import MoveHead
from scope.history._overlap import Leases, OnOverlap
from scope.history._protocols import Reader, Writer
from scope.history._replay import replay as checked_replay
from scope.history._turn import IncompleteReason, IncompleteTurn, Layer, Turn, failure_reason
from scope.history._turns import COMPACTION_KEY
from scope.history._view import HistoryView

__all__ = ["IncompleteReason", "IncompleteTurn", "Middleware"]

_log: Final = logging.getLogger("scope.history")


def _new_append_id() -> str:
    return uuid.uuid4().hex


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

    The fence (the default overlap layer, ``Fence()``): the committed batch carries
    ``expected_length=view.length`` and ``expected_head=view.fence_head``, so it lands
    only if no other turn was stored, and the head was not moved to another branch
    (DESIGN §6h), since the history was read; see ``Fence`` and ``Unfenced``.

    Commit: the response must pass ``validate_complete()`` (else
    ``InvalidResponseError``, nothing written). A response with tool calls leaves the turn
    open and writes nothing: the host runs the tools and resubmits the turn with their
    results. A final answer appends exactly one ``Batch(open turn + answer)`` under a
    fresh append id (``new_append_id()``) and checks the receipt; the answer carries
    ``scope/usage`` (the response's input, output and, when reported, cache read and
    write counts) and ``scope/response_id``. If persisting fails after the model
    answered, ``CommitError`` carries the batch, the receipt (only one that passed
    ``validate_for``) and the response, with the failure as ``__cause__``;
    ``err.retryable`` says whether ``await writer.append(err.batch)`` can still land it
    (without calling the model again) or the turn must be run again.

    Cancellation is never converted: a cancellation that arrives during the commit
    propagates unchanged (an ``asyncio.timeout`` still raises ``TimeoutError``, a trio
    cancel scope still catches its ``Cancelled``), and ``on_incomplete`` receives
    ``IncompleteTurn(reason=CANCELLED, batch=<the batch>)``: appending that batch again
    is safe. When the append had returned (the cancellation landed while the lease was
    being released) the report carries its ``receipt`` too: the turn is stored.

    Streams: no I/O and no checks until the first iteration (the request is checked
    then, as every ``Streamer`` does); chunks are forwarded as they arrive and
    accumulated; the batch is appended only after the inner stream ends naturally
    without error (a ``CommitError`` is raised after the last chunk). An early stop, an
    inner error or cancellation writes nothing; the inner stream is closed on every path
    before the outer one finishes closing.

    ``on_incomplete`` (synchronous, must not block) receives an ``IncompleteTurn`` once
    whenever a bound call or stream ends without committing, except the tool-call pause
    and a ``CommitError`` (which carries its batch), after every layer is done. If it
    raises, the error is logged on the ``scope.history`` logger and the original outcome
    stands.

    ``layers`` (DESIGN §6m), outermost first: at most one overlap layer (``Fence()``,
    the default when none is given; ``Unfenced()``, ``Reject()``, ``Wait()``,
    ``Interrupt()``), then ``MoveHead``, then ``KeepInterrupted()``; each is entered
    before the history is read and left, in reverse order, after the commit, and
    documents its own rules. Another order, a second layer of a kind or anything that is
    not a layer raises ``ValueError``/``TypeError`` here, and so does a store without
    what a layer needs (a ``TurnLeaser`` for a leasing layer; atomic views for
    ``Fence``). The v0.4 keywords ``exclusive_turns``, ``on_overlap``,
    ``overlap_timeout``, ``lease_ttl`` and ``keep_interrupted`` still work for this
    release with a ``DeprecationWarning`` (``keyword_layers`` gives their layers);
    with ``layers`` as well, ``TypeError``.

    ``owner`` (DESIGN §6i; a principal string, default None): passed to every append of
    the conversation (the commit, the folded commit of a lease, a kept interrupted
    turn), so the append that lands its first batch records the conversation's owner
    (``scope.history.erase_owner`` erases by it). It is not part of any batch. An
    invalid owner raises ``ValueError`` (``TypeError`` for a non-string), and a writer
    (or, with a lease strategy, a leaser) whose append takes no ``owner`` raises
    ``TypeError``, at construction. Retrying ``err.batch`` of a ``CommitError`` by hand:
    ``writer.append(err.batch, owner=...)``.
    """

    __slots__ = (
        "_chain",
        "_conversation_id",
        "_fenced",
        "_layers",
        "_new_append_id",
        "_on_incomplete",
        "_owner",
        "_read_view",
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
        layers: Sequence[Layers] = (),
        owner: str | None = None,
        exclusive_turns: bool | None = None,
        keep_interrupted: bool | None = None,
        on_overlap: OnOverlap | None = None,
        overlap_timeout: float | None = None,
        lease_ttl: float | None = None,
    ) -> None:
        if not isinstance(reader, Reader):
            raise TypeError(
                f"Middleware reader must be a scope.history.Reader (an object with an async "
                f"read(conversation_id)), got {type(reader).__name__}"
            )
        if not isinstance(writer, Writer):
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
        old = {
            "exclusive_turns": exclusive_turns,
            "keep_interrupted": keep_interrupted,
            "on_overlap": on_overlap,
            "overlap_timeout": overlap_timeout,
            "lease_ttl": lease_ttl,
        }
        given = {name: value for name, value in old.items() if value is not None}
        if given:
            if layers:
                raise TypeError(
                    f"Middleware takes layers= or the v0.4 keywords ({', '.join(given)}), not both"
                )
            warnings.warn(
                f"Middleware({', '.join(f'{k}=' for k in given)}...) is deprecated: pass "
                "layers=(...) (scope.history.Fence, Reject, Wait, Interrupt, "
                "KeepInterrupted; docs/history.md)",
                DeprecationWarning,
                stacklevel=2,
            )
            layers = keyword_layers(**given)
        self._layers = check_order(layers)
        if owner is not None:
            check_owner(owner)
            if not records_owners(writer):
                raise TypeError(
                    f"owner= needs a store whose append takes owner= (a scope.history.Store: "
                    f"every bundled store's does); {type(writer).__name__}.append does not"
                )
        self._owner = owner
        self._conversation_id = ConversationID(conversation_id)
        self._reader = reader
        self._writer = writer
        self._new_append_id = new_append_id
        self._on_incomplete = on_incomplete
        overlap = self._layers[0]
        # The history is read as a view; one derived from read() (StoreAdapter) is not
        # atomic, so it could fence nothing (DESIGN §6b): Unfenced says so.
        viewer = as_store(reader)
        self._read_view = viewer.read_view
        atomic = not isinstance(viewer, StoreAdapter) or viewer.atomic_views
        if isinstance(overlap, Fence) and not atomic:
            raise TypeError(
                f"Fence() fences each commit by the view it read, and "
                f"{type(reader).__name__} has no atomic read_view (a plain Reader, or a "
                "StoreAdapter without atomic_views): pass a scope.history.ViewReader, or "
                "layers=(Unfenced(), ...) to run overlapping turns without the fence"
            )
        # A leasing layer over such a reader keeps turns apart by the lease alone.
        self._fenced = atomic and not isinstance(overlap, Unfenced)
        # The runtime layers, outermost first (the class docstring gives the order).
        chain: list[Layer] = []
        for layer in self._layers:
            if isinstance(layer, (Reject, Wait, Interrupt)):
                timeout = 0.0 if isinstance(layer, Reject) else layer.timeout
                strategy = type(layer).__name__.lower()
                chain.append(
                    Leases(strategy, timeout, layer.lease_ttl, reader, writer, owner=owner)
                )
            elif isinstance(layer, KeepInterrupted):
                chain.append(Keeper(writer, new_append_id, owner=owner))
            elif isinstance(layer, MoveHead):
                chain.append(layer)
        self._chain: tuple[Layer, ...] = tuple(chain)

    @property
    def conversation_id(self) -> ConversationID:
        """The conversation this middleware keeps."""
        return self._conversation_id

    @property
    def owner(self) -> str | None:
        """The owner passed to this middleware's appends (see the class docstring)."""
        return self._owner

    @property
    def layers(self) -> tuple[Layers, ...]:
        """The layers, outermost first: the overlap layer (``Fence()`` when none was
        given), then the others as given."""
        return self._layers

    @property
    def fenced(self) -> bool:
        """Whether committed turns are fenced: every overlap layer but ``Unfenced``, over
        a reader with atomic views."""
        return self._fenced

    @property
    def exclusive_turns(self) -> bool:
        """Deprecated (v0.4): ``fenced``."""
        warnings.warn(
            "Middleware.exclusive_turns is deprecated: use Middleware.fenced",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._fenced

    @property
    def keep_interrupted(self) -> bool:
        """Whether interrupted turns are stored: a ``KeepInterrupted`` layer."""
        return isinstance(self._layers[-1], KeepInterrupted)

    @property
    def on_overlap(self) -> str:
        """The overlap layer's v0.4 name: ``"fence"`` (``Fence`` and ``Unfenced``),
        ``"reject"``, ``"wait"`` or ``"interrupt"``."""
        overlap = self._layers[0]
        return "fence" if isinstance(overlap, (Fence, Unfenced)) else type(overlap).__name__.lower()

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

    def _turn(self, request: Request) -> Turn:
        return Turn(self._conversation_id, request, self._writer, self._owner)

    async def _enter(self, turn: Turn) -> None:
        for layer in self._chain:
            await layer.enter(turn)

    async def _leave(self, turn: Turn, exc: BaseException | None) -> None:
        """The layers' ``failed`` (when ``exc``) and then ``exit``, innermost first."""
        if exc is not None:
            for layer in reversed(self._chain):
                await layer.failed(turn, exc)
        for layer in reversed(self._chain):
            await layer.exit(turn)

    async def _commit(self, turn: Turn, response: Response) -> None:
        await _commit.commit(turn, response, self._new_append_id, self._writer)

    def _report(self, turn: Turn, exc: BaseException) -> None:
        """``on_incomplete`` for a turn that raised ``exc`` (see the class docstring)."""
        reason = failure_reason(exc)
        callback = self._on_incomplete
        if reason is None or callback is None:
            return
        # During the commit (``batch`` set) a cancellation leaves the outcome to settle:
        # hand the batch over, with its receipt when it is known to have landed.
        cancelled = reason is IncompleteReason.CANCELLED
        try:
            callback(
                IncompleteTurn(
                    self._conversation_id,
                    turn.open_turn,
                    turn.partial(),
                    reason,
                    None if reason is IncompleteReason.STOPPED else exc,
                    turn.batch if cancelled else None,
                    turn.kept,
                    turn.receipt if cancelled else None,
                )
            )
        except Exception:
            _log.exception(
                "on_incomplete callback failed for conversation %r", str(self._conversation_id)
            )

    async def _downstream(self, turn: Turn, request: Request) -> Request:
        """The request to send downstream; sets the commit's fences (``turn.expected``,
        ``turn.expected_head``).
        A lease that read the history with the lease hands its view over instead of a
        second read."""
        cid = self._conversation_id
        with _trace.read_span(cid) as span:
            view: object = turn.view
            if view is None:
                view = await self._read_view(cid)
            if not isinstance(view, HistoryView):
                raise StoreError(
                    f"read_view of conversation {str(cid)!r} returned "
                    f"{type(view).__name__}, not a HistoryView"
                )
            span.read(len(view.messages), length=view.length, closed=view.closed)
            if view.closed:
                with _trace.commit_span(cid):  # the trace says why nothing was stored
                    raise ConversationClosedError(
                        f"conversation {str(cid)!r} is closed (cleared, expired or erased): "
                        "the turn cannot be stored, so the model was not called"
                    )
            stored = view.messages
            if self._fenced:
                turn.expected = view.length
                turn.expected_head = view.fence_head
        # The replay is checked once per stored message, not once per call (_replay.py);
        # the prefix and the open turn are the caller's already-validated request.
        replay = checked_replay(self._reader, cid, stored)
        # A WindowReader's merged system message holding a compaction summary (§6d) is
        # history the model needs, not a stored system prompt: it follows the prefix.
        prefix = turn.prefix
        first = stored[0] if stored else None
        if first is not None and first.role is Role.SYSTEM and COMPACTION_KEY in first.metadata:
            prefix = (*prefix, first)
        return request.with_checked_messages((*prefix, *replay, *turn.open_turn))


def _check_next(next: object, method: str, wanted: type, shape: str) -> None:
    """``TypeError`` unless ``next`` is what ``Middleware.<method>`` wraps; an object
    that is only the other protocol is told which composition to use instead."""
    if isinstance(next, wanted):
        return
    other, other_usage = (
        (Streamer, "chat.wrap_stream(streamer, mw.stream)")
        if wanted is Model
        else (Model, "chat.wrap(model, mw.call)")
    )
    hint = ""
    if isinstance(next, other):
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


@final
@attrs.frozen
class _HistoryModel:
    """``Middleware.call(next)``."""

    middleware: Middleware
    next: Model

    async def call(self, request: Request) -> Response:
        mw = self.middleware
        turn = mw._turn(request)
        cid = turn.conversation_id
        _trace.annotate_conversation(cid)
        try:
            failure: BaseException | None = None
            try:
                await mw._enter(turn)
                downstream = await mw._downstream(turn, request)
                turn.asked = True  # an interruption from here on can be kept
                with _trace.conversation(cid):
                    returned = await turn.run(self.next.call(downstream))
                turn.asked = False  # the model answered: what follows is a commit
                if not isinstance(returned, Response):
                    raise InvalidResponseError(
                        f"the model returned {type(returned).__name__}, not a Response"
                    )
                turn.response = returned
                await mw._commit(turn, returned)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                await mw._leave(turn, failure)
        except BaseException as exc:
            mw._report(turn, exc)
            raise
        return returned


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
        turn = mw._turn(request)  # the request is checked on first iteration
        accumulator = turn.accumulator = ResponseAccumulator()
        cid = turn.conversation_id
        try:
            failure: BaseException | None = None
            try:
                await mw._enter(turn)
                downstream = await mw._downstream(turn, request)
                with _trace.conversation(cid):  # a synchronous call: never held across a yield
                    inner = self.next.stream(downstream)
                turn.asked = True
                chunks = inner if turn.lease is None else turn.lease.chunks(inner)
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
                turn.asked = False
                response = accumulator.response()
                if response is None:
                    raise InvalidResponseError("the stream ended without any chunk")
                await mw._commit(turn, response)
            except BaseException as exc:  # GeneratorExit too: a stop at a yield
                failure = exc
                raise
            finally:
                await mw._leave(turn, failure)
        except BaseException as exc:
            mw._report(turn, exc)
            raise
