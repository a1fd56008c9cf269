"""Tracing hooks for the history ``Middleware``: short spans for the read and the commit.

Dependency-free: OpenTelemetry is imported on first use, once; without it, or while the
global tracer provider is still the API's proxy or a no-op one (no SDK configured), every
hook is a near no-op: a type check, no span. Spans go to the **global** tracer provider
(instrumentation scope ``scope.history``).

Chosen form: **short spans**, not span events, so a trace shows how long the store took
and why a turn was not stored even when no other span is current (events on an absent
span would be lost), and a store's own instrumented driver calls nest under them.

- ``read_span(conversation_id)``: a context manager around the history read; span
  ``scope.history.read`` (kind INTERNAL), attributes ``gen_ai.conversation.id`` and, via
  ``.read(messages, length=None, closed=None)``, ``scope.history.messages`` (messages
  returned), ``scope.history.length`` (messages stored) and ``scope.history.closed``.
- ``commit_span(conversation_id)``: a context manager around deciding and appending one
  turn; span ``scope.history.commit`` (kind INTERNAL), attributes
  ``gen_ai.conversation.id``, ``scope.history.outcome`` (a ``CommitOutcome``) and, via
  ``.batch(batch)``, ``scope.history.batch.size`` (messages), ``scope.history.append_id``,
  ``scope.history.digest`` and ``scope.history.expected_length`` (when set).
  ``.outcome(value)`` states the outcome; left unset, an exception leaving the block
  decides it (cancellation: ``cancelled``; ``ConversationClosedError``: ``closed``;
  ``HistoryChangedError``: ``history_changed``, each also found as the ``__cause__`` of a
  ``CommitError``; anything else ``failed``) and a clean exit means ``committed``.
  ``closed``, ``history_changed`` and ``failed`` set status ERROR and ``error.type``
  (and record the exception when there is one); ``cancelled`` leaves the status unset.
- ``annotate_conversation(conversation_id)``: set ``gen_ai.conversation.id`` on the
  current span, when it is recording.
- ``conversation(conversation_id)`` (from ``scope._context``, re-exported): a context
  manager that makes the id known to ``scope.otel`` chat spans
  (``current_conversation()``): hold it around
  ``await next.call(downstream)``, and around ``next.stream(downstream)`` (the synchronous
  call that makes the stream: ``scope.otel`` reads the id there, so nothing needs to be
  held while the stream is iterated).

Every context manager here attaches context on entry and detaches it on exit: hold one
only around awaits, **never across a ``yield``** of an async generator.
"""

from __future__ import annotations

import enum
import os
from types import TracebackType
from typing import Any, Final, final

from scope import errors
from scope._context import conversation, current_conversation, is_cancellation

__all__ = [
    "CommitOutcome",
    "HistorySpan",
    "annotate_conversation",
    "classify",
    "commit_span",
    "conversation",
    "current_conversation",
    "read_span",
]


class CommitOutcome(enum.StrEnum):
    """What became of a turn the Middleware tried to complete."""

    COMMITTED = "committed"  # the batch was appended and its receipt checked
    TOOL_PAUSE = "tool_pause"  # the response asked for tools: the turn stays open
    HISTORY_CHANGED = "history_changed"  # the fence refused the batch (HistoryChangedError)
    CLOSED = "closed"  # the conversation is closed (ConversationClosedError)
    FAILED = "failed"  # the append failed (CommitError) or the response was invalid
    CANCELLED = "cancelled"  # cancellation arrived; for an append the outcome is unknown


_ERROR_OUTCOMES: Final = frozenset(
    {CommitOutcome.HISTORY_CHANGED, CommitOutcome.CLOSED, CommitOutcome.FAILED}
)

_UNLOADED: Final[Any] = object()
_api: Any = _UNLOADED


def _otel() -> Any:
    """The ``opentelemetry.trace`` module and friends, or None; imported once."""
    global _api
    api = _api
    if api is _UNLOADED:
        try:
            from opentelemetry import context as otel_context
            from opentelemetry import trace
        except ImportError:
            api = None
        else:
            from scope import __version__

            api = _Api(trace, otel_context, trace.get_tracer("scope.history", __version__))
        _api = api
    if api is None or api.live:
        return api
    if api.set_directly:
        # The API keeps the provider set with set_tracer_provider() in a module global;
        # reading it costs nothing, where get_tracer_provider() looks at os.environ on
        # every call while none is set.
        provider = getattr(api.trace, "_TRACER_PROVIDER", None)
    else:
        provider = api.trace.get_tracer_provider()
    if provider is None or isinstance(provider, api.idle):
        return None  # no SDK configured (yet): spans would record nothing
    api.live = True  # a global provider is set once and never replaced
    return api


@final
class _Api:
    __slots__ = ("context", "idle", "live", "set_directly", "trace", "tracer")

    def __init__(self, trace: Any, context: Any, tracer: Any) -> None:
        self.trace = trace
        self.context = context
        self.tracer = tracer
        self.live = False
        # OTEL_PYTHON_TRACER_PROVIDER names a provider the API builds on first use: then
        # ask the API itself; else the provider can only come from set_tracer_provider().
        self.set_directly = "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ and hasattr(
            trace, "_TRACER_PROVIDER"
        )
        # The global provider before an SDK is set, or one that never records: the hooks
        # then cost a type check, not a no-op span each.
        self.idle = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def annotate_conversation(conversation_id: str) -> None:
    """Set ``gen_ai.conversation.id`` on the current span if one is recording."""
    api = _otel()
    if api is None:
        return
    span = api.trace.get_current_span()
    if span.is_recording():
        span.set_attribute("gen_ai.conversation.id", str(conversation_id))


def classify(exc: BaseException) -> CommitOutcome:
    """The outcome an exception leaving a commit says (its ``__cause__`` chain too)."""
    changed = getattr(errors, "HistoryChangedError", None)
    seen: BaseException | None = exc
    depth = 0
    while seen is not None and depth < 8:
        if is_cancellation(seen):
            return CommitOutcome.CANCELLED
        if isinstance(seen, errors.ConversationClosedError):
            return CommitOutcome.CLOSED
        if changed is not None and isinstance(seen, changed):
            return CommitOutcome.HISTORY_CHANGED
        seen = seen.__cause__
        depth += 1
    return CommitOutcome.FAILED


class HistorySpan:
    """A short span around one history read or commit (see the module docstring).

    Without OpenTelemetry every method does nothing.
    """

    __slots__ = ("_api", "_cid", "_commit", "_name", "_outcome", "_span", "_token")

    def __init__(self, api: Any, name: str, conversation_id: str, commit: bool) -> None:
        self._api = api
        self._name = name
        self._cid = str(conversation_id)
        self._commit = commit
        self._span: Any = None
        self._token: Any = None
        self._outcome: CommitOutcome | None = None

    def __enter__(self) -> HistorySpan:
        api = self._api
        if api is not None:
            span = api.tracer.start_span(
                self._name,
                kind=api.trace.SpanKind.INTERNAL,
                attributes={"gen_ai.conversation.id": self._cid},
            )
            self._span = span
            self._token = api.context.attach(api.trace.set_span_in_context(span))
        return self

    def read(self, messages: int, length: int | None = None, closed: bool | None = None) -> None:
        """Record what the read returned: messages returned, stored length, closed."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute("scope.history.messages", messages)
        if length is not None:
            span.set_attribute("scope.history.length", length)
        if closed is not None:
            span.set_attribute("scope.history.closed", closed)

    def batch(self, batch: Any) -> None:
        """Record the batch about to be appended: size, append id, digest, fence."""
        span = self._span
        if span is None or not span.is_recording():
            return
        attrs: dict[str, Any] = {
            "scope.history.batch.size": len(batch),
            "scope.history.append_id": str(batch.id),
            "scope.history.digest": batch.digest,
        }
        expected = getattr(batch, "expected_length", None)
        if expected is not None:
            attrs["scope.history.expected_length"] = expected
        span.set_attributes(attrs)

    def outcome(self, value: CommitOutcome | str) -> None:
        """State the outcome of a commit (it wins over what an exception would say)."""
        outcome = CommitOutcome(value)
        if self._api is not None:
            self._outcome = outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        try:
            self._api.context.detach(self._token)
        finally:
            self._finish(span, exc)

    def _finish(self, span: Any, exc: BaseException | None) -> None:
        try:
            if not span.is_recording():
                return
            cancelled = exc is not None and classify(exc) is CommitOutcome.CANCELLED
            if self._commit:
                outcome = self._outcome
                if outcome is None:
                    outcome = CommitOutcome.COMMITTED if exc is None else classify(exc)
                span.set_attribute("scope.history.outcome", outcome.value)
                failed = outcome in _ERROR_OUTCOMES
            else:
                failed = exc is not None and not cancelled
            if not failed:
                return
            status = self._api.trace.Status
            code = self._api.trace.StatusCode.ERROR
            if exc is not None and not cancelled:
                error_type = type(exc).__qualname__
                span.record_exception(exc, escaped=True)
                span.set_status(status(code, f"{error_type}: {exc}"))
            else:
                error_type = str(self._outcome)
                span.set_status(status(code, error_type))
            span.set_attribute("error.type", error_type)
        finally:
            span.end()


# Without OpenTelemetry one shared span that does nothing: no allocation per hook.
_NOOP: Final = HistorySpan(None, "", "", commit=False)


def read_span(conversation_id: str) -> HistorySpan:
    """A context manager tracing one history read (``scope.history.read``)."""
    api = _otel()
    if api is None:
        return _NOOP
    return HistorySpan(api, "scope.history.read", conversation_id, commit=False)


def commit_span(conversation_id: str) -> HistorySpan:
    """A context manager tracing one commit decision and append (``scope.history.commit``)."""
    api = _otel()
    if api is None:
        return _NOOP
    return HistorySpan(api, "scope.history.commit", conversation_id, commit=True)
