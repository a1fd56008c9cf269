"""``Conversation``: the turn loop a service runs, owned by the library (DESIGN §6f):

    conversation = Conversation(model, store, "user-42", tools=[get_weather])
    result = await conversation.ask("Weather in Lisbon?")
    print(result.output)                        # the answer's text

    async with contextlib.aclosing(conversation.stream("And in Porto?")) as events:
        async for event in events:               # chunk, tool_call, tool_result, done
            if event.kind == "chunk":
                print(event.chunk.text, end="")

One turn: the user's message goes through the history ``Middleware`` (the stored turns
are replayed, the finished turn is appended once); while the answer asks for tools, the
tools run and the turn is resubmitted with their results; the final answer completes it.
The store then holds ``user, assistant(calls), tool(results), ..., assistant(answer)``
as one batch.

Guarantees a caller relies on:

- **Tools**: the calls of one response run concurrently (an anyio task group: asyncio
  or trio), their results kept in call order. A call to an unknown tool, invalid
  arguments and a failing tool are error results the model sees and can correct
  (``scope.tools``), never an exception of the turn.
- **Steps**: at most ``max_steps`` model calls per turn; when the last one still asks
  for tools, ``MaxStepsError`` (nothing of the turn is stored: the Middleware stores a
  turn only with its final answer).
- **Storing**: a retryable ``CommitError`` (the model answered, the store failed) is
  retried by appending ``err.batch`` again, up to ``append_retries`` times (10 ms,
  doubling, between retries), never by calling the model again; appending the same
  batch lands it exactly once. When every retry fails, a ``CommitError`` (retryable,
  same batch, the last failure as its cause) is raised: the host may append the batch
  later. A non-retryable ``CommitError`` (another turn was stored first, the
  conversation was cleared) is raised as is. Every other error (provider errors, an
  invalid response, ``TurnInProgressError`` with ``on_overlap="reject"``) propagates
  unchanged, nothing stored.
- **Cancellation** propagates unchanged, at any point: the Middleware stores nothing for
  a cancelled turn (or the interrupted turn with ``keep_interrupted=True``), running
  tools are cancelled with it (a sync tool's thread is waited for).
- **Structured answers**: ``output=<a type>`` (any type ``scope.tools`` supports: an
  attrs class, a dataclass, a ``TypedDict``, a Pydantic model, ``list[int]``, ...) sends
  the type's JSON Schema as the request's ``OutputFormat.json_schema`` and decodes the
  answer's text (a JSON document) into the type with the same strict decoder as tool
  arguments. An answer that does not decode is stored (the Middleware stores every final
  answer) and sent back to the model with the problem, in a user message marked
  ``scope/output_retry`` (its number), at most ``output_retries`` times (default 1); the
  retry runs on the head that answer made (``HistoryChangedError`` if another turn was
  stored in between), with ``max_steps`` counted afresh. The stored turn stays a valid
  user/assistant sequence every model replays. ``TurnResult.output_retries`` counts the
  retries; when they run out, ``InvalidResponseError`` (every answer stored).

Tool approval (issue 46): a call of a tool made with ``@tool(requires_approval=...)``
waits for a person. The turn is stored as it stands, the call marked pending (the calls
of other tools in that response have run), and ``TurnResult.pending`` lists what waits;
``approve(call_id)``/``deny(call_id, reason)`` (``stream_approve``/``stream_deny``) from
any process resume it, ``pending()`` reads what waits from the store. The pending state
is the stored turn: durable, erased with the conversation, and each decision is taken
once (fenced by a head move; ``NotPendingError`` for the other of two racing).

Branches (DESIGN §6h): ``regenerate()`` answers the last turn again and ``edit(turn,
message)`` replaces a turn (``stream_regenerate``/``stream_edit`` give their events):
the head is rewound, fenced, and the new turn runs only on the rewound head; nothing is
deleted, and a new turn that is not stored moves the head back.

The ``middlewares`` (objects with ``call(next)`` and ``stream(next)``, like
``scope.otel.Tracing``) wrap the model inside the history Middleware, first outermost: a
tracing span per model call, with the conversation id on it.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import os
import re
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import (
    Any,
    Final,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    cast,
    final,
    overload,
    runtime_checkable,
)

import anyio
import attrs
import orjson

from scope import _argschema
from scope.chat import (
    Message,
    Model,
    Options,
    Output,
    OutputFormat,
    Part,
    Request,
    Response,
    ResponseAccumulator,
    Role,
    Streamer,
    ToolCall,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    system_message,
    tool_message,
    tool_result_part,
    user_message,
    wrap,
    wrap_stream,
)
from scope.errors import (
    AppendConflictError,
    ApprovalPendingError,
    CommitError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidBatchError,
    InvalidConversationIDError,
    InvalidResponseError,
    InvalidWindowError,
    MaxStepsError,
    NoOutputError,
    NotPendingError,
    UnknownHeadError,
)
from scope.history import (
    Batch,
    ConversationID,
    HistoryCache,
    HistoryError,
    HistoryTree,
    HistoryView,
    IncompleteTurn,
    Layers,
    Middleware,
    MoveHead,
    Reader,
    ReadWriter,
    Store,
    ViewReader,
    WindowReader,
    Writer,
    keyword_layers,
)
from scope.jsonvalue import RawJSON
from scope.metadata import Metadata
from scope.tools import FREEFORM_KEY, Tool, ToolContext

__all__ = ["Conversation", "ModelMiddleware", "TurnEvent", "TurnEventKind", "TurnResult"]

T = TypeVar("T")

#: Append failures after which the same batch can never land.
_FINAL: Final = (
    HistoryChangedError,
    ConversationClosedError,
    AppendConflictError,
    InvalidBatchError,
)


#: The options of a conversation made without any (one shared, immutable value).
_NO_OPTIONS: Final = Options()

#: The message metadata key the keep-interrupted layer marks a stored turn with; a
#: regenerated turn's user message is sent again without it.
_INTERRUPTED_KEY: Final = "scope/interrupted"

_log: Final = logging.getLogger("scope.conversation")


@runtime_checkable
class ModelMiddleware(Protocol):
    """A middleware for both paths, as ``scope.otel.Tracing`` is: ``call`` wraps a
    ``Model``, ``stream`` wraps a ``Streamer``."""

    def call(self, next: Model) -> Model:
        """Wrap a model's ``call``."""
        ...

    def stream(self, next: Streamer) -> Streamer:
        """Wrap a streamer's ``stream``."""
        ...


class TurnEventKind(enum.StrEnum):
    """What a ``TurnEvent`` carries."""

    CHUNK = "chunk"  # .chunk: a Response delta of the model's answer
    TOOL_CALL = "tool_call"  # .tool_call: a call the model made (before the tools run)
    TOOL_RESULT = "tool_result"  # .tool_result: its result (in call order)
    DONE = "done"  # .result: the TurnResult; the turn is stored


@final
@attrs.frozen
class TurnResult(Generic[T]):
    """A finished, stored turn.

    - ``response``: the final answer (the model's last response).
    - ``output``: its text, or the decoded value when ``ask``/``stream`` had ``output=``.
    - ``steps``: the model calls the turn made (1 without tools).
    - ``messages``: the turn as stored: the user message, each tool-call message with
      its results, the answer (with ``output_retries``, each answer sent back and the
      user message that sent it back come first).
    - ``output_retries``: how many answers did not decode into ``output=``'s type and
      were sent back to the model (0: the first answer decoded, or no ``output=``).
    - ``pending``: the tool calls that wait for a decision (``@tool(requires_approval=
      ...)``; ``Conversation.approve``/``deny``), in call order; empty for a finished
      turn. A turn that waits is stored as it stands (see ``Conversation.approve``):
      ``response`` is the model's response that made the calls, ``messages`` the stored
      turn so far, and it has no output: reading ``output`` raises ``NoOutputError``
      (check ``pending`` first), so ``output`` is always a ``T``.
    """

    response: Response
    # Read through the ``output`` property (a waiting turn has none); the constructor
    # argument is still ``output``, in the same place.
    _output: T
    steps: int
    messages: tuple[Message, ...]
    # Added with output_retries: a default, so results made without it still build.
    output_retries: int = 0
    # Added with tool approval: a default, as above.
    pending: tuple[ToolCall, ...] = ()

    @property
    def output(self) -> T:
        """The answer's text, or the decoded value with ``output=``. Raises
        ``NoOutputError`` for a turn that waits for a decision (``pending``)."""
        if self.pending:
            waiting = ", ".join(repr(call.id) for call in self.pending)
            raise NoOutputError(
                f"the turn waits for a decision on tool call(s) {waiting} and has no "
                "output yet: check TurnResult.pending, and read the output of the turn "
                "Conversation.approve/deny finish"
            )
        return self._output


@final
@attrs.frozen
class TurnEvent(Generic[T]):
    """One event of ``Conversation.stream``: ``kind`` says which attribute is set;
    ``denied`` (with ``tool_result``): the reason given when the call was denied
    (``deny``/``stream_deny``), None for every other result."""

    kind: TurnEventKind
    chunk: Response | None = None
    tool_call: ToolCall | None = None
    tool_result: ToolResult | None = None
    result: TurnResult[T] | None = None
    # Added with the denial mark (a default, so events made without it still build):
    # with a tool_result, the reason a person denied the call (``Conversation.deny``;
    # the result is then the error result telling the model so), else None.
    denied: str | None = None


@final
class Conversation:
    """One conversation's turns: the model, the store and the tools, with the loop.

    - ``model``: a ``Model`` and/or a ``Streamer`` (every bundled adapter is both).
    - ``store``: the history store, opened (a ``Reader`` and ``Writer`` with async
      ``read``/``append``: every bundled store). It stores every turn and, unless
      ``window`` says otherwise, is what the turns replay.
    - ``conversation_id``: the conversation (a ``ConversationID`` or ``str``).
    - ``window``: what each turn replays, a ``WindowReader`` over ``store`` (token
      budget, message limit, compaction: ``WindowReader(store, max_tokens=8000)``), or
      None (the default: the whole stored history, system messages as stored). The
      store stays the writer, so the fence still counts the whole conversation.
    - ``limit``, ``max_tokens``: shortcuts for ``window=WindowReader(store, limit,
      max_tokens=max_tokens)`` (ints >= 1, or None); not together with ``window``.
    - ``tools``: a list (any iterable) of ``Tool`` objects (``@scope.tools.tool``);
      names must be unique. A single ``Tool`` is a ``TypeError`` (write
      ``tools=[get_weather]``): one shape, no guessing.
    - ``max_steps``: model calls per turn at most (default 8): ``MaxStepsError``.
    - ``on_overlap``, ``overlap_timeout``, ``lease_ttl``, ``keep_interrupted``: what
      overlapping turns do and how interrupted turns end (DESIGN §6e, §6c; defaults
      ``"fence"``, 30 s, 15 s, False), the layers ``scope.history.keyword_layers``
      gives; or ``layers``: the history ``Middleware``'s layers themselves (DESIGN §6m:
      ``Reject()``, ``Wait()``, ``Interrupt()``, ``KeepInterrupted()``...). Both forms
      at once are a ``TypeError``. A leasing layer needs a store that is a
      ``TurnLeaser`` (every bundled store is); the default fence a store with atomic
      views (``layers=(Unfenced(),)`` for one without).
    - ``on_incomplete``: as the history ``Middleware`` takes it (default None).
    - ``middlewares``: ``ModelMiddleware`` objects applied around the model, inside
      the history Middleware (first outermost), e.g. ``scope.otel.tracing()``.
    - ``system``: a system prompt sent before the history with every request (not
      stored), default none.
    - ``options``: request ``Options`` (model, temperature, ...), default none.
    - ``append_retries``: how many times a retryable ``CommitError``'s batch is
      appended again (default 3; 0: raised at once).
    - ``owner``: the principal the conversation belongs to (DESIGN §6i; a string of 1
      to 256 characters), passed to every append: the first one records it, and
      ``scope.history.erase_owner(store, owner)`` erases all of one owner's
      conversations. Default None (no owner); ``store``'s append must take ``owner=``
      (every bundled store's does).
    - ``deps``: the service's own dependencies (any object: a database pool, a client),
      given to every tool that declares a ``ToolContext`` parameter, with the
      conversation id and the owner (``scope.tools``). Default None.
    - ``strict_output``: send ``output=``'s schema in the strict subset, marked strict
      (``OutputFormat(strict=True)``), so providers with a strict structured-output
      mode constrain the answer to it; decoding follows the strict schema (every key
      present, null for an optional field is its default). The type must be an object
      type the subset can express (``TypeError`` at ``ask`` naming the field and the
      keyword otherwise, as ``@tool(strict=True)``). Default False.

    A tool made with ``requires_approval`` needs a store with branches (a
    ``scope.history.Store``: ``read_tree``, ``move_head``, ``read_view``; every bundled
    store): ``TypeError`` here otherwise.

    ``ask`` returns the finished turn (or the turn that waits for a tool call's
    approval: ``approve``, ``deny``, ``pending``); ``stream`` gives its events as they
    happen;
    ``regenerate``/``edit`` (and ``stream_regenerate``/``stream_edit``) rewind the head
    and run a turn again or with another message (needs a ``Store``). They
    work under asyncio and trio; one ``Conversation`` may run overlapping turns (the
    ``on_overlap`` strategy decides what they do). See the module docstring for the
    guarantees. Every invalid argument raises at construction, naming this
    constructor's parameter: ``TypeError`` for a wrong kind of value, ``ValueError``
    (``InvalidConversationIDError``, ``InvalidWindowError``) for a wrong value.
    """

    __slots__ = (
        "_append_retries",
        "_approvals",
        "_caller",
        "_context",
        "_definitions",
        "_formats",
        "_layers",
        "_max_steps",
        "_middleware",
        "_model",
        "_on_incomplete",
        "_options",
        "_owner",
        "_reader",
        "_store",
        "_streamer",
        "_strict_output",
        "_system",
        "_tools",
        "_window",
    )

    def __init__(
        self,
        model: Model | Streamer,
        store: ReadWriter,
        conversation_id: str,
        *,
        window: WindowReader | None = None,
        limit: int | None = None,
        max_tokens: int | None = None,
        tools: Iterable[Tool[..., Any]] = (),
        max_steps: int = 8,
        on_overlap: Literal["fence", "reject", "wait", "interrupt"] | None = None,
        overlap_timeout: float | None = None,
        lease_ttl: float | None = None,
        keep_interrupted: bool | None = None,
        layers: Sequence[Layers] = (),
        on_incomplete: Callable[[IncompleteTurn], None] | None = None,
        middlewares: Sequence[ModelMiddleware] = (),
        system: str | None = None,
        options: Options | None = None,
        append_retries: int = 3,
        owner: str | None = None,
        deps: object = None,
        strict_output: bool = False,
    ) -> None:
        if type(strict_output) is not bool:
            raise TypeError(f"strict_output must be a bool, got {type(strict_output).__name__}")
        calls = callable(getattr(model, "call", None))
        streams = callable(getattr(model, "stream", None))
        if not (calls or streams):
            raise TypeError(
                f"model must be a scope.chat Model (async call) or Streamer (stream), got "
                f"{type(model).__name__}"
            )
        _check_store(store)
        cid = _conversation_id(conversation_id)
        reader = _window(store, window, limit, max_tokens)
        for name, value, least in (
            ("max_steps", max_steps, 1),
            ("append_retries", append_retries, 0),
        ):
            if type(value) is not int:
                raise TypeError(f"{name} must be an int >= {least}, got {type(value).__name__}")
            if value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, got {type(system).__name__}")
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"options must be a scope.chat.Options, got {type(options).__name__}")
        keywords = {
            "on_overlap": on_overlap,
            "overlap_timeout": overlap_timeout,
            "lease_ttl": lease_ttl,
            "keep_interrupted": keep_interrupted,
        }
        given = {name: value for name, value in keywords.items() if value is not None}
        if given and layers:
            raise TypeError(
                f"Conversation takes layers= or {', '.join(f'{k}=' for k in given)}, not both"
            )
        if on_incomplete is not None and not callable(on_incomplete):
            raise TypeError(
                f"on_incomplete must be callable or None, got {type(on_incomplete).__name__}"
            )
        self._tools: dict[str, Tool[..., Any]] = {}
        for index, item in enumerate(_sequence(tools, "tools", Tool, "[get_weather]")):
            if not isinstance(item, Tool):
                raise TypeError(
                    f"tools[{index}] must be a scope.tools.Tool (decorate the function with "
                    f"@scope.tools.tool), got {type(item).__name__}"
                )
            if item.name in self._tools:
                raise ValueError(f"tools[{index}]: a second tool named {item.name!r}")
            self._tools[item.name] = item
        self._approvals = any(item.requires_approval is not False for item in self._tools.values())
        wrappers = _sequence(middlewares, "middlewares", ModelMiddleware, "[otel.tracing()]")
        for index, layer in enumerate(wrappers):
            if not isinstance(layer, ModelMiddleware):
                raise TypeError(
                    f"middlewares[{index}] must have call(next) and stream(next) methods (like "
                    f"scope.otel.Tracing), got {type(layer).__name__}"
                )
        # Every argument the Middleware takes was checked above, under this
        # constructor's names, but ``owner``: the Middleware checks it, and its errors
        # name ``owner=`` and the store as this constructor would, so it raises nothing
        # the caller would have to translate.
        self._on_incomplete = on_incomplete
        self._model = model
        self._layers = wrappers
        self._reader = reader
        self._middleware = Middleware(
            reader,
            store,
            cid,
            on_incomplete=on_incomplete,
            layers=keyword_layers(**given) if given else layers,
            owner=owner,
        )
        self._caller, self._streamer = self._wrapped(self._middleware)
        self._owner = owner
        # One context for every tool call: the Middleware checked the owner above.
        self._context: ToolContext[Any] = ToolContext(cid, owner=owner, deps=deps)
        self._store = store
        if self._approvals:  # its turns store themselves and decisions move the head
            self._tree_store("a tool with requires_approval")
        self._window = reader if isinstance(reader, WindowReader) else None
        self._max_steps = max_steps
        self._append_retries = append_retries
        self._system: tuple[Message, ...] = () if not system else (system_message(system),)
        self._options = _NO_OPTIONS if options is None else options
        self._definitions: tuple[ToolDefinition, ...] = tuple(
            item.definition for item in self._tools.values()
        )
        self._formats: dict[Any, tuple[Options, Callable[[Response], Any]]] = {}
        self._strict_output = strict_output

    @property
    def store(self) -> ReadWriter:
        """The store every turn is written to."""
        return self._store

    @property
    def window(self) -> WindowReader | None:
        """What the turns replay (None: the whole stored history)."""
        return self._window

    @property
    def conversation_id(self) -> ConversationID:
        """The conversation this object runs."""
        return self._middleware.conversation_id

    @property
    def middleware(self) -> Middleware:
        """The history ``Middleware`` the turns go through."""
        return self._middleware

    @property
    def tools(self) -> tuple[Tool[..., Any], ...]:
        """The tools, in the order given."""
        return tuple(self._tools.values())

    @property
    def max_steps(self) -> int:
        """Model calls per turn at most."""
        return self._max_steps

    @overload
    async def ask(
        self,
        message: Message | str,
        *,
        output: None = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[str]: ...

    @overload
    async def ask(
        self,
        message: Message | str,
        *,
        output: type[T],
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[T]: ...

    @overload
    async def ask(
        self,
        message: Message | str,
        *,
        output: object,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]: ...

    async def ask(
        self,
        message: Message | str,
        *,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]:
        """Run one turn: send ``message`` (a user ``Message`` or its text), run the tools
        the model asks for, and return the stored turn. See the class docstring.

        ``expected_head``: run the turn only on this head (the append id of the head
        path's last batch, ``""`` for an empty one, as ``HistoryView.head`` says); a
        conversation with another head raises ``HistoryChangedError`` before the model
        is called, and the turn is stored only on that head. Needs a ``Store``.

        ``output_retries``: with ``output=``, how many times an answer that does not
        decode is sent back to the model with the problem (an int >= 0, default 1;
        ``TypeError``/``ValueError`` before anything runs). See the module docstring."""
        user = _user(message)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return await _finish(
            self._turn(user, output, output_retries, streaming=False, pinned=expected_head)
        )

    def stream(
        self,
        message: Message | str,
        *,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """Run one turn as ``ask`` does, yielding its events: the answer's ``chunk``s as
        they arrive (a model that only has ``call`` gives each answer as one chunk), each
        ``tool_call`` before the tools run, each ``tool_result`` (call order), then
        ``done`` with the ``TurnResult`` once the turn is stored.

        Nothing happens until the first iteration. Stopping early (``aclose()``, a
        ``break`` inside ``contextlib.aclosing``) ends the turn unstored (or stored as
        interrupted with ``keep_interrupted=True``). ``expected_head`` as for ``ask``.
        """
        user = _user(message)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return self._turn(user, output, output_retries, streaming=True, pinned=expected_head)

    # ------------------------------------------------------------ branches (§6h)

    @overload
    async def regenerate(
        self,
        *,
        turn: int | None = None,
        output: None = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[str]: ...

    @overload
    async def regenerate(
        self,
        *,
        turn: int | None = None,
        output: type[T],
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[T]: ...

    @overload
    async def regenerate(
        self,
        *,
        turn: int | None = None,
        output: object,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]: ...

    async def regenerate(
        self,
        *,
        turn: int | None = None,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]:
        """Answer a stored turn again: rewind the head to before turn ``turn`` (default:
        the last turn of the head path, with its output retries) and run a new turn with
        that turn's own user
        message. The old answer stays in the tree, on its own branch
        (``scope.history.branches``); the new one is the head. Returns the stored turn,
        as ``ask`` does. See ``stream_regenerate`` for the rules."""
        if turn is not None:
            _check_turn(turn)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return await _finish(
            self._branch_turn(turn, None, output, output_retries, expected_head, streaming=False)
        )

    @overload
    async def edit(
        self,
        turn: int,
        message: Message | str,
        *,
        output: None = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[str]: ...

    @overload
    async def edit(
        self,
        turn: int,
        message: Message | str,
        *,
        output: type[T],
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[T]: ...

    @overload
    async def edit(
        self,
        turn: int,
        message: Message | str,
        *,
        output: object,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]: ...

    async def edit(
        self,
        turn: int,
        message: Message | str,
        *,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> TurnResult[Any]:
        """Replace turn ``turn`` (1-based, a turn of the head path): rewind the head to
        before it and run a new turn with ``message``. The turns from ``turn`` on stay
        in the tree, on their own branch; the new turn is the head. Returns the stored
        turn, as ``ask`` does. See ``stream_edit`` for the rules."""
        _check_turn(turn)
        user = _user(message)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return await _finish(
            self._branch_turn(turn, user, output, output_retries, expected_head, streaming=False)
        )

    def stream_regenerate(
        self,
        *,
        turn: int | None = None,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``regenerate`` as events, like ``stream``.

        The turn's user message is the first message of its stored batch, sent again as
        stored (without a ``scope/interrupted`` mark); a batch that is not one user turn
        (a compaction summary, an imported batch of several turns) raises ``ValueError``
        naming the turn. The rules of ``stream_edit`` apply."""
        if turn is not None:
            _check_turn(turn)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return self._branch_turn(turn, None, output, output_retries, expected_head, streaming=True)

    def stream_edit(
        self,
        turn: int,
        message: Message | str,
        *,
        output: object = None,
        expected_head: str | None = None,
        output_retries: int = 1,
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``edit`` as events, like ``stream``.

        In order, from the first iteration: the conversation's tree is read once (a
        closed conversation raises ``ConversationClosedError``); a head other than
        ``expected_head`` (when given) raises ``HistoryChangedError``; a ``turn`` the
        head path does not hold raises ``UnknownHeadError``; then the new turn runs as
        ``stream`` runs it, its first step moving the head to the end of turn ``turn -
        1`` (``scope.history.MoveHead``: ``Store.move_head``, fenced by the head just
        read, so a turn that landed meanwhile makes it raise ``HistoryChangedError``
        before the model is called). With a leasing ``on_overlap`` the move is made once
        the turn holds the conversation's lease: a running turn is waited for, refused
        or interrupted as the strategy says, never refused at its commit because the head
        moved under it. The turn is fenced to start from the new head and to be stored
        only there. Nothing is deleted.

        When the new turn is not stored (any error, a cancellation, an early stop), the
        head moves back to where it was (under the lease, when the turn failed inside a
        model call), fenced by the head it moved to (so a turn kept by
        ``keep_interrupted``, or stored by someone else meanwhile, stays the head),
        shielded from cancellation and bounded to 5 seconds (``MoveHead.undo``); a move
        back that fails is logged on the ``scope.history`` logger and the turn's own
        error goes on. ``turn`` must be an int >= 1 (``TypeError``/``ValueError``
        before any I/O). Needs a ``Store`` (``read_tree``, ``move_head``: every bundled
        store; ``TypeError`` otherwise)."""
        _check_turn(turn)
        user = _user(message)
        _check_head(expected_head, "expected_head")
        _check_retries(output_retries)
        return self._branch_turn(turn, user, output, output_retries, expected_head, streaming=True)

    # ------------------------------------------------------------ tool approval

    @overload
    async def approve(
        self, call_id: str, *, output: None = None, output_retries: int = 1
    ) -> TurnResult[str]: ...

    @overload
    async def approve(
        self, call_id: str, *, output: type[T], output_retries: int = 1
    ) -> TurnResult[T]: ...

    @overload
    async def approve(
        self, call_id: str, *, output: object, output_retries: int = 1
    ) -> TurnResult[Any]: ...

    async def approve(
        self, call_id: str, *, output: object = None, output_retries: int = 1
    ) -> TurnResult[Any]:
        """Approve the waiting tool call ``call_id`` (``TurnResult.pending``,
        ``pending()``), from this process or any other (a new ``Conversation`` on the
        same store and conversation, with the same tools): the call's tool runs, its
        result is stored, and when no call of the turn waits any more the turn goes on
        with the model, as ``ask`` would have; returns that turn's ``TurnResult`` (which
        may wait again, for a later call), or, while other calls still wait, the stored
        turn with those in ``pending`` (``steps`` 0, no ``output``: ``NoOutputError``).
        ``output``/``output_retries`` as for ``ask`` (for the answer the resumed turn
        ends with).

        The rules:

        - A decision is taken once. It first moves the conversation's head from the
          waiting turn to where that turn started, fenced by the waiting turn
          (``Store.move_head``, ``expected_head``): of two decisions racing on a call,
          on any processes, exactly one moves it; the other raises ``NotPendingError``
          before anything runs. A decision on another call of the same turn that
          landed first is no loss: the turn is read again and the decision taken on
          it (while that one is still being taken, ``NotPendingError`` says so, and
          ``pending()`` is empty until it is stored). The tool then runs, and the turn
          is stored again with its result (fenced by that head): the call is decided.
          A decision whose result cannot be stored moves the head back (the call waits
          again; its tool may have run).
        - The resumed turn runs as ``edit``'s turn does: its first model call moves the
          head back to where the turn started (the decided turn stays in the tree, on
          its own branch, ``scope.history.branches``), and the finished turn is stored
          there as one batch, as a turn that never waited would have been (user,
          tool calls, results, answer). When it is not stored (a provider error, a
          cancellation), the head moves back to the decided turn: ``pending()`` is then
          empty, and ``ask`` goes on from it (its calls all have results, so it
          replays to any model).
        - A call that waits is not in process memory: it is the stored turn's last
          assistant message, marked ``scope/approval`` (the ids that wait), with the
          results of the calls that ran at once. It is erased with the conversation.
          While a call waits, a new turn of a ``Conversation`` with approval tools
          raises ``ApprovalPendingError`` (before the model is called); ``regenerate``
          and ``edit`` move on from it.
        - A process that dies after its decision moved the head and before the turn is
          stored again leaves the head where the turn started and the waiting turn on a
          branch: the decision is lost, never taken twice.

        Raises ``TypeError``/``ValueError`` for a ``call_id`` that is not a non-empty
        string and for bad ``output``/``output_retries`` (before any I/O),
        ``NotPendingError`` when the call does not wait (decided already, never
        pending, or the waiting turn is not the head), ``ConversationClosedError`` for a
        closed conversation. Needs a ``Store`` (``read_tree``, ``move_head``)."""
        _check_call_id(call_id)
        _check_retries(output_retries)
        self._format(output)
        return await _finish(self._decide(call_id, None, output, output_retries, streaming=False))

    @overload
    async def deny(
        self, call_id: str, reason: str, *, output: None = None, output_retries: int = 1
    ) -> TurnResult[str]: ...

    @overload
    async def deny(
        self, call_id: str, reason: str, *, output: type[T], output_retries: int = 1
    ) -> TurnResult[T]: ...

    @overload
    async def deny(
        self, call_id: str, reason: str, *, output: object, output_retries: int = 1
    ) -> TurnResult[Any]: ...

    async def deny(
        self, call_id: str, reason: str, *, output: object = None, output_retries: int = 1
    ) -> TurnResult[Any]:
        """Deny the waiting tool call ``call_id``: its tool does not run; the model gets
        an error result for it saying it was denied, with ``reason`` (a non-empty
        string, told to the model). Otherwise as ``approve``: the same rules, the same
        errors (``TypeError``/``ValueError`` for a bad ``reason`` too)."""
        _check_reason(call_id, reason)
        _check_retries(output_retries)
        self._format(output)
        return await _finish(self._decide(call_id, reason, output, output_retries, streaming=False))

    def stream_approve(
        self, call_id: str, *, output: object = None, output_retries: int = 1
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``approve`` as events, like ``stream``: the decided call's ``tool_result``,
        then the resumed turn's events (``chunk``, ``tool_call``, ``tool_result``) and
        ``done`` with the ``TurnResult`` (``done`` at once, with ``pending``, while other
        calls of the turn still wait). The arguments are checked here, before the first
        iteration; nothing else happens until then. An early stop of the resumed turn
        leaves the decided turn the head, as a failure does."""
        _check_call_id(call_id)
        _check_retries(output_retries)
        self._format(output)
        return self._decide(call_id, None, output, output_retries, streaming=True)

    def stream_deny(
        self, call_id: str, reason: str, *, output: object = None, output_retries: int = 1
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``deny`` as events, as ``stream_approve`` gives them."""
        _check_reason(call_id, reason)
        _check_retries(output_retries)
        self._format(output)
        return self._decide(call_id, reason, output, output_retries, streaming=True)

    async def pending(self) -> tuple[ToolCall, ...]:
        """The tool calls that wait for a decision, in call order, as the store holds
        them now (empty when none waits, and for a closed or erased conversation). Needs
        a ``Store`` (``read_tree``)."""
        store = self._tree_store("pending")
        tree = await store.read_tree(self.conversation_id)
        if tree.closed:
            return ()
        held = _held(tree)
        return () if held is None else held.waiting_calls()

    def _waiting(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """The calls that wait for approval (their tool says so)."""
        waiting = []
        for call in calls:
            found = self._tools.get(call.name)
            if found is not None and found.needs_approval(call, self._context):
                waiting.append(call)
        return tuple(waiting)

    async def _hold(
        self,
        turn: list[Message],
        response: Response,
        waiting: tuple[ToolCall, ...],
        results: list[ToolResult],
        watch: _Pinned,
    ) -> tuple[Message, ...]:
        """Store the turn so far with ``waiting`` marked, fenced by the view its model
        calls replayed; the messages stored."""
        view = watch.view
        assert view is not None  # the Middleware read it before calling the model
        marked = _marked(response.message, tuple(call.id for call in waiting))
        messages = (*turn, marked, *((tool_message(*results),) if results else ()))
        batch = Batch(
            self.conversation_id, uuid.uuid4().hex, messages, view.length, view.fence_head
        )
        await self._append(batch, response)
        return messages

    async def _append(self, batch: Batch, response: Response) -> None:
        """Append ``batch`` (retrying a store failure as ``_land`` does)."""
        try:
            receipt = await (
                self._store.append(batch)
                if self._owner is None
                else self._store.append(batch, owner=self._owner)  # type: ignore[call-arg]
            )
            receipt.validate_for(batch)
        except _FINAL:
            raise
        except Exception as exc:
            err = CommitError(
                f"conversation {str(self.conversation_id)!r}: storing the turn that waits "
                f"for approval failed ({type(exc).__name__}: {exc})",
                batch=batch,
                response=response,
                retryable=True,
            )
            err.__cause__ = exc
            await self._land(err)

    async def _claim(self, store: Store, call_id: str, what: str) -> _Held:
        """Take the decision on ``call_id``: read the waiting turn and move the head off
        it, fenced by it. A move refused because a decision on another call of the turn
        landed first is tried again on the turn that decision stored."""
        cid = self.conversation_id
        lost = False  # a move was refused: another decision landed first
        for _ in range(_CLAIM_TRIES):
            tree = await store.read_tree(cid)
            if not isinstance(tree, HistoryTree):
                raise HistoryError(
                    f"{type(store).__name__}.read_tree returned {type(tree).__name__}, not a "
                    "HistoryTree"
                )
            if tree.closed:
                raise ConversationClosedError(
                    f"conversation {str(cid)!r} is closed (cleared, expired or erased): "
                    f"nothing to {what}"
                )
            held = _held(tree)
            if held is None or call_id not in held.waiting:
                if lost:
                    raise NotPendingError(
                        f"conversation {str(cid)!r}: tool call {call_id!r} was decided by "
                        "another caller first (its decision moved the head; or one on another "
                        "call of the turn is being taken: pending() says when it waits "
                        "again): nothing ran",
                        conversation_id=str(cid),
                        call_id=call_id,
                    )
                why = (
                    "no turn of it waits for a decision"
                    if held is None or not held.waiting
                    else f"the calls that wait are {', '.join(map(repr, held.waiting))}"
                )
                raise NotPendingError(
                    f"conversation {str(cid)!r}: tool call {call_id!r} does not wait for a "
                    f"decision ({why}): decided already, or never pending",
                    conversation_id=str(cid),
                    call_id=call_id,
                )
            try:  # the decision: exactly one caller moves the head off the waiting turn
                await store.move_head(cid, held.parent, expected_head=str(held.batch.id))
            except HistoryChangedError:
                lost = True  # read again: decided by another caller, or another call was
                continue
            return held
        raise NotPendingError(  # pragma: no cover - decisions on other calls kept landing
            f"conversation {str(cid)!r}: tool call {call_id!r}: other decisions on the turn "
            f"kept landing first ({_CLAIM_TRIES} tries); decide again",
            conversation_id=str(cid),
            call_id=call_id,
        )

    async def _decide(
        self, call_id: str, reason: str | None, output: object, retries: int, *, streaming: bool
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``approve`` (``reason`` None) and ``deny``, as events."""
        what = "approve" if reason is None else "deny"
        store = self._tree_store(what)
        cid = self.conversation_id
        held = await self._claim(store, call_id, what)
        head = str(held.batch.id)
        call = held.call(call_id)
        response = Response(Output(message=_unmarked(held.assistant)))
        try:
            if reason is None:
                result = await self._answer(call, call.id in _freeform_calls(held.assistant))
            else:
                text = f"the call was denied: {reason}"
                result = ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
            answer = tool_result_part(result, None if reason is None else {_DENIED_KEY: reason})
            messages = held.decided(answer)
            batch = Batch(cid, uuid.uuid4().hex, messages, held.length, held.parent)
            await self._append(batch, response)
        except BaseException:
            await _move_back(store, cid, held.parent, head)
            raise
        if streaming:
            yield TurnEvent(TurnEventKind.TOOL_RESULT, tool_result=result, denied=reason)
        waiting = tuple(c for c in held.waiting_calls() if c.id != call_id)
        if waiting:
            partial = TurnResult(response, None, 0, messages, pending=waiting)
            yield TurnEvent(TurnEventKind.DONE, result=partial)
            return
        opening = held.opening(answer)
        move = MoveHead(store, held.parent, expected_head=str(batch.id))
        finished = False
        try:
            events = self._turn(
                opening, output, retries, streaming=streaming, pinned=held.parent, branch=move
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.result is not None:
                        finished = True
                    yield event
        finally:
            if not finished:
                await move.undo()

    # ------------------------------------------------------------------ internals

    def _wrapped(self, middleware: Middleware) -> tuple[Model | None, Streamer | None]:
        """The model and the streamer wrapped by ``middleware`` and the model layers."""
        model, layers = self._model, self._layers
        caller: Model | None = (
            wrap(cast(Model, model), middleware.call, *(layer.call for layer in layers))
            if callable(getattr(model, "call", None))
            else None
        )
        streamer: Streamer | None = (
            wrap_stream(
                cast(Streamer, model), middleware.stream, *(layer.stream for layer in layers)
            )
            if callable(getattr(model, "stream", None))
            else None
        )
        return caller, streamer

    def _tree_store(self, what: str) -> Store:
        store = self._store
        for method in ("read_tree", "move_head", "read_view"):
            if not inspect.iscoroutinefunction(getattr(store, method, None)):
                raise TypeError(
                    f"{what} needs a store with branches (a scope.history.Store: async "
                    f"read_tree, move_head and read_view; every bundled store), got "
                    f"{type(store).__name__} without an async {method}()"
                )
        return cast(Store, store)

    async def _branch_turn(
        self,
        turn: int | None,
        user: Message | None,
        output: object,
        retries: int,
        expected: str | None,
        *,
        streaming: bool,
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """``stream_regenerate`` (``user`` None) and ``stream_edit``: rewind, then the turn."""
        what = "regenerate" if user is None else "edit"
        store = self._tree_store(what)
        cid = self.conversation_id
        tree = await store.read_tree(cid)
        if not isinstance(tree, HistoryTree):
            raise HistoryError(
                f"{type(store).__name__}.read_tree returned {type(tree).__name__}, not a "
                "HistoryTree"
            )
        if tree.closed:
            raise ConversationClosedError(
                f"conversation {str(cid)!r} is closed (cleared, expired or erased): "
                f"nothing to {what}"
            )
        path = tree.path(tree.head)
        head = str(tree.batches[path[-1]].id) if path else ""
        length = sum(len(tree.batches[i]) for i in path)
        if expected is not None and expected != head:
            raise HistoryChangedError(length, length, cid, expected_head=expected, actual_head=head)
        number = len(path) if turn is None else turn
        while turn is None and number > 1 and _is_retry(tree.batches[path[number - 1]]):
            number -= 1  # the last turn is the one its output retries answer
        if not 1 <= number <= len(path):
            there = f"it has {len(path)} turn{'s' if len(path) != 1 else ''}"
            asked = "last turn" if turn is None else f"turn {number}"
            raise UnknownHeadError(
                f"conversation {str(cid)!r}: no {asked} to {what} ({there} on its head path)"
            )
        if user is None:
            user = _stored_user(tree.batches[path[number - 1]], number, cid)
        target = str(tree.batches[path[number - 2]].id) if number > 1 else ""
        # The move is the turn's own first step (under its lease, when a strategy
        # leases), and moved back under that lease when the turn fails.
        move = MoveHead(store, target, expected_head=head)
        stored = False
        try:
            events = self._turn(
                user, output, retries, streaming=streaming, pinned=target, branch=move
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.result is not None:
                        stored = True
                    yield event
        finally:
            if not stored:  # a failure between two model calls (tools, max_steps)
                await move.undo()

    async def _turn(
        self,
        user: Message | tuple[Message, ...],
        output: object,
        output_retries: int,
        *,
        streaming: bool,
        pinned: str | None = None,
        branch: MoveHead | None = None,
    ) -> AsyncGenerator[TurnEvent[Any], None]:
        """One turn: ``user`` is its user message, or (a decided approval resuming) the
        open turn so far."""
        options, decode = self._format(output)
        retrying = output is not None and output_retries > 0
        # A turn that may send a bad answer back needs to know where that answer was
        # stored (the retry runs only on that head): a Middleware of its own, naming
        # the batches it appends.
        appended = _AppendIDs() if retrying else None
        caller, streamer = self._caller, self._streamer
        # A turn that may wait for an approval stores itself: it needs the view its
        # model calls replayed (the fence), and refuses to run on a turn that waits.
        watch: _Pinned | None = None
        if self._approvals:
            watch = _Pinned(self._reader, pinned, guard=True)
        if pinned is not None or appended is not None or watch is not None:
            caller, streamer = self._turn_wrapped(pinned, appended, branch, watch=watch)
        streaming = streaming or caller is None
        turn: list[Message] = [user] if isinstance(user, Message) else list(user)
        stored: tuple[Message, ...] = ()  # the attempts whose answers did not decode
        retries = steps = step = 0
        while True:
            step += 1
            steps += 1
            request = Request((*self._system, *turn), tools=self._definitions, options=options)
            response: Response | None = None
            try:
                if streaming and streamer is not None:
                    accumulator = ResponseAccumulator()
                    async with contextlib.aclosing(streamer.stream(request)) as chunks:
                        async for chunk in chunks:
                            accumulator.add(chunk)
                            yield TurnEvent(TurnEventKind.CHUNK, chunk=chunk)
                    response = accumulator.response()
                else:
                    assert caller is not None  # a model has call, stream or both
                    response = await caller.call(request)
                    if streaming:
                        yield TurnEvent(TurnEventKind.CHUNK, chunk=response)
            except CommitError as err:
                if not err.retryable:
                    raise
                response = await self._land(err)
            if response is None or response.message is None:  # the Middleware refuses these
                raise InvalidResponseError("the model's answer has no message")
            calls = response.tool_calls
            if not calls:
                try:
                    value = decode(response)
                except _Undecodable as exc:
                    if retries == output_retries:
                        if retries:
                            raise InvalidResponseError(
                                f"{exc.problem}, after {retries} output "
                                f"retr{'ies' if retries > 1 else 'y'} (output_retries); every "
                                "answer is stored"
                            ) from None
                        raise
                    # Stored already (the Middleware stores every final answer): send it
                    # back as a new user turn on that head, so the history stays one
                    # valid user/assistant sequence any model replays.
                    assert appended is not None and appended.last is not None
                    retries += 1
                    stored += (*turn, response.message)
                    turn = [_retry_message(exc.problem, retries)]
                    # Pinned to that head where the reader has views (a store without
                    # them has no fence for any turn).
                    views = inspect.iscoroutinefunction(getattr(self._reader, "read_view", None))
                    pin = appended.last if views else None
                    if watch is not None:
                        watch = _Pinned(self._reader, pin, guard=False)
                    caller, streamer = self._turn_wrapped(pin, appended, check=False, watch=watch)
                    step = 0
                    continue
                messages = (*stored, *turn, response.message)
                result = TurnResult(response, value, steps, messages, output_retries=retries)
                yield TurnEvent(TurnEventKind.DONE, result=result)
                return
            if step == self._max_steps:
                kept = (
                    f"; the {retries} answer(s) sent back (output_retries) stay stored"
                    if retries
                    else ""
                )
                raise MaxStepsError(
                    f"conversation {str(self.conversation_id)!r}: the model still asked for "
                    f"tools ({', '.join(sorted({c.name for c in calls}))}) after "
                    f"{self._max_steps} model calls (max_steps); nothing of the turn was "
                    f"stored{kept}"
                )
            waiting = self._waiting(calls) if watch is not None else ()
            if streaming:  # ask() only wants the result: no events to make
                for call in calls:
                    yield TurnEvent(TurnEventKind.TOOL_CALL, tool_call=call)
            ids = {call.id for call in waiting}
            now = tuple(call for call in calls if call.id not in ids) if ids else calls
            freeform = _freeform_calls(response.message)
            results = await self._run_tools(now, freeform) if now else []
            if streaming:
                for tool_result in results:
                    yield TurnEvent(TurnEventKind.TOOL_RESULT, tool_result=tool_result)
            if waiting:
                assert watch is not None
                held = await self._hold(turn, response, waiting, results, watch)
                result = TurnResult(
                    response,
                    None,
                    steps,
                    (*stored, *held),
                    output_retries=retries,
                    pending=waiting,
                )
                yield TurnEvent(TurnEventKind.DONE, result=result)
                return
            turn += (response.message, tool_message(*results))

    def _turn_wrapped(
        self,
        pinned: str | None,
        appended: _AppendIDs | None,
        branch: MoveHead | None = None,
        *,
        check: bool = True,
        watch: _Pinned | None = None,
    ) -> tuple[Model | None, Streamer | None]:
        """The model and the streamer behind a Middleware of one turn's own: reading
        through the pin (when there is one; ``watch``, when given, is that reader),
        naming its batches with ``appended``, its first step moving the head
        (``branch``: regenerate and edit)."""
        reader: Reader = self._reader
        if pinned is not None:
            if check:  # expected_head and branches need a Store; a retry's pin does not
                self._tree_store("expected_head")
            reader = _Pinned(self._reader, pinned)
        if watch is not None:
            reader = watch
        extra: dict[str, Any] = {} if appended is None else {"new_append_id": appended}
        base = self._middleware
        layers = base.layers
        if branch is not None:  # inside the overlap layer, outside KeepInterrupted
            layers = (layers[0], branch, *layers[1:])
        middleware = Middleware(
            reader,
            self._store,
            self.conversation_id,
            on_incomplete=self._on_incomplete,
            layers=layers,
            owner=base.owner,
            **extra,
        )
        return self._wrapped(middleware)

    async def _land(self, err: CommitError) -> Response:
        """Append a retryable ``CommitError``'s batch again (never the model)."""
        if self._append_retries == 0:
            raise err
        last: Exception | None = None
        for attempt in range(self._append_retries):
            if attempt:
                await anyio.sleep(0.01 * 2 ** (attempt - 1))
            try:
                receipt = await (
                    self._store.append(err.batch)
                    if self._owner is None
                    else self._store.append(err.batch, owner=self._owner)  # type: ignore[call-arg]
                )
                receipt.validate_for(err.batch)
            except _FINAL as exc:
                raise CommitError(
                    f"conversation {str(self.conversation_id)!r}: retrying the append of "
                    f"the answered turn failed for good ({type(exc).__name__}: {exc})",
                    batch=err.batch,
                    response=err.response,
                    retryable=False,
                ) from exc
            except Exception as exc:  # a store failure: try again, then report it
                last = exc
                continue
            return err.response
        raise CommitError(
            f"conversation {str(self.conversation_id)!r}: the answered turn is not stored "
            f"after {self._append_retries} more append(s) ({type(last).__name__}: {last}); "
            "append err.batch again later (it lands once), never call the model again",
            batch=err.batch,
            response=err.response,
            retryable=True,
        ) from last

    async def _run_tools(
        self, calls: tuple[ToolCall, ...], freeform: frozenset[str]
    ) -> list[ToolResult]:
        """Answer every call, concurrently, results in call order (``freeform``: the ids
        of the calls whose arguments are the model's text, not JSON)."""
        if len(calls) == 1:
            return [await self._answer(calls[0], calls[0].id in freeform)]
        results: list[ToolResult | None] = [None] * len(calls)

        async def answer(index: int, call: ToolCall) -> None:
            results[index] = await self._answer(call, call.id in freeform)

        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(answer, index, call)
        return [result for result in results if result is not None]

    async def _answer(self, call: ToolCall, freeform: bool) -> ToolResult:
        found = self._tools.get(call.name)
        if found is None:
            known = ", ".join(self._tools) if self._tools else "none"
            text = f"there is no tool named {call.name!r} (the tools: {known})"
            return ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
        return await found.run(call, context=self._context, freeform=freeform)

    def decoder(self, output: object = None) -> Callable[[Response], Any]:
        """The function that makes a turn's value of its final answer for ``output``
        (as ``ask(..., output=output)`` applies it: the text for None, else the decoded
        value), for a caller replaying a stored turn (``scope.web`` answering a resent
        request); it raises ``InvalidResponseError`` for an answer that does not decode.
        ``output`` is checked as ``ask`` checks it."""
        return self._format(output)[1]

    def _format(self, output: object) -> tuple[Options, Callable[[Response], Any]]:
        """The request options and the answer decoder for ``output`` (cached per type).
        The decoder raises ``InvalidResponseError`` (an ``_Undecodable``)."""
        if output is None:
            return self._options, _text
        cached = self._formats.get(output)
        if cached is not None:
            return cached
        strict = self._strict_output
        try:
            schema = _argschema.schema_for(output, strict=strict)
        except TypeError as exc:
            raise TypeError(f"output: {exc}") from None
        name = re.sub(r"[^A-Za-z0-9_-]", "_", getattr(output, "__name__", "") or "output")
        fmt = OutputFormat.json_schema(name[:64] or "output", schema, strict=strict)
        options = self._options.resolve(Options(output_format=fmt))
        expected = _argschema.describe(output)

        def decode(response: Response) -> Any:
            try:
                value = orjson.loads(response.text)
            except orjson.JSONDecodeError as exc:
                raise _Undecodable(f"the answer is not JSON ({exc}), expected {expected}") from None
            try:
                return _argschema.structure(value, output, strict=strict)
            except _argschema.ArgumentError as exc:
                raise _Undecodable(f"the answer does not decode into {expected}: {exc}") from None

        self._formats[output] = (options, decode)
        return options, decode


class _Undecodable(InvalidResponseError):
    """An answer that does not decode into ``output=``'s type; ``problem`` says why."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{problem}; the turn is stored")
        self.problem = problem


@final
class _AppendIDs:
    """The append ids of one turn's Middleware (fresh ones, as its default makes),
    remembering the last: where the turn's last stored answer is the head."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self) -> str:
        self.last = uuid.uuid4().hex
        return self.last


#: The message metadata key of the user message that sends an answer back
#: (``output_retries``): its value is the retry's number, 1 for the first.
_OUTPUT_RETRY_KEY: Final = "scope/output_retry"


def _retry_message(problem: str, number: int) -> Message:
    """The user message that sends an undecodable answer back to the model."""
    text = (
        f"Your answer cannot be used: {problem}. Answer again with only the JSON "
        "document the response format describes."
    )
    message = user_message(text)
    return Message(message.role, message.parts, Metadata({_OUTPUT_RETRY_KEY: number}))


def _is_retry(batch: Any) -> bool:
    """Whether a stored batch is an output retry (its user message sent an answer back)."""
    messages = batch.messages
    return bool(messages) and _OUTPUT_RETRY_KEY in messages[0].metadata


def _check_retries(value: object) -> None:
    if type(value) is not int:
        raise TypeError(f"output_retries must be an int >= 0, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"output_retries must be an int >= 0, got {value!r}")


#: The message metadata key that marks a stored turn's last assistant message as
#: waiting for decisions: the ids of its tool calls that wait (a JSON array).
_APPROVAL_KEY: Final = "scope/approval"


#: The metadata key that marks the tool-result part answering a call a person denied
#: (``Conversation.deny``): the reason given (a JSON string). Results stored before the
#: mark existed have none, and read as results like any other.
_DENIED_KEY: Final = "scope/denied"
_TRUE: Final = RawJSON.from_value(True)


#: How many times a decision reads the waiting turn again when a decision on another
#: call of it landed first.
_CLAIM_TRIES: Final = 8


def _check_reason(call_id: object, reason: object) -> None:
    _check_call_id(call_id)
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {type(reason).__name__}")
    if not reason.strip():
        raise ValueError("reason must be a non-empty str (the model is told why)")


def _check_call_id(call_id: object) -> None:
    if not isinstance(call_id, str):
        raise TypeError(f"call_id must be a str, got {type(call_id).__name__}")
    if not call_id:
        raise ValueError("call_id must be a non-empty str (a ToolCall's id)")


def _marked(message: Message, waiting: tuple[str, ...]) -> Message:
    kept = {k: v for k, v in message.metadata.items() if k != _APPROVAL_KEY}
    return Message(message.role, message.parts, Metadata({**kept, _APPROVAL_KEY: list(waiting)}))


def _freeform_calls(message: Message) -> frozenset[str]:
    """The ids of ``message``'s tool calls whose arguments are the text the model wrote,
    not JSON (part metadata ``scope/freeform``: an OpenAI ``custom_tool_call``)."""
    return frozenset(
        part.tool_call.id
        for part in message.parts
        if part.tool_call is not None and part.metadata.get(FREEFORM_KEY) == _TRUE
    )


def _unmarked(message: Message) -> Message:
    if _APPROVAL_KEY not in message.metadata:
        return message
    kept = {k: v for k, v in message.metadata.items() if k != _APPROVAL_KEY}
    return Message(message.role, message.parts, Metadata(kept))


def _marks(message: Message) -> tuple[str, ...] | None:
    """The waiting call ids a message is marked with, or None (not marked)."""
    if message.role is not Role.ASSISTANT or _APPROVAL_KEY not in message.metadata:
        return None
    value = message.metadata[_APPROVAL_KEY].value()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None  # not ours: a mark is a list of call ids
    return tuple(value)


def _waiting_ids(messages: Sequence[Message]) -> tuple[str, ...]:
    """The call ids the last turn of ``messages`` waits for (empty: none)."""
    index = len(messages) - 1
    while index >= 0 and messages[index].role is Role.TOOL:
        index -= 1
    if index < 0:
        return ()
    return _marks(messages[index]) or ()


@final
class _Held:
    """The head batch of a conversation whose turn waits (or waited) for decisions."""

    __slots__ = ("assistant", "batch", "index", "length", "parent", "results", "waiting")

    def __init__(self, batch: Batch, index: int, parent: str, length: int) -> None:
        self.batch = batch
        self.index = index  # of the marked assistant message
        self.assistant: Message = batch.messages[index]
        self.waiting: tuple[str, ...] = _marks(self.assistant) or ()
        self.parent = parent  # where the turn started
        self.length = length  # messages on the head path before it
        # The tool-result parts stored so far, with their metadata (a denial's mark).
        self.results: list[Part] = [
            part
            for message in batch.messages[index + 1 :]
            for part in message.parts
            if part.tool_result is not None
        ]

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(p.tool_call for p in self.assistant.parts if p.tool_call is not None)

    def waiting_calls(self) -> tuple[ToolCall, ...]:
        return tuple(call for call in self.calls() if call.id in self.waiting)

    def call(self, call_id: str) -> ToolCall:
        return next(call for call in self.calls() if call.id == call_id)

    def _answered(self, answer: Part) -> Message:
        """The tool message of the result parts so far with ``answer``, in call order."""
        by_id = {_result_of(p).id: p for p in (*self.results, answer)}
        return Message(Role.TOOL, [by_id[c.id] for c in self.calls() if c.id in by_id])

    def decided(self, answer: Part) -> tuple[Message, ...]:
        """The waiting turn with ``answer`` (a tool-result part) stored and its call no
        longer waiting."""
        waiting = tuple(i for i in self.waiting if i != _result_of(answer).id)
        head = self.batch.messages[: self.index]
        return (*head, _marked(self.assistant, waiting), self._answered(answer))

    def opening(self, answer: Part) -> tuple[Message, ...]:
        """The open turn that resumes once every call is decided (no mark)."""
        head = self.batch.messages[: self.index]
        return (*head, _unmarked(self.assistant), self._answered(answer))


def _result_of(part: Part) -> ToolResult:
    assert part.tool_result is not None  # a tool message's parts are tool results
    return part.tool_result


def _held(tree: HistoryTree) -> _Held | None:
    """The head batch when its turn waits for decisions (a marked last assistant)."""
    path = tree.path(tree.head)
    if not path:
        return None
    batch = tree.batches[path[-1]]
    messages = batch.messages
    index = len(messages) - 1
    while index >= 0 and messages[index].role is Role.TOOL:
        index -= 1
    if index < 0 or _marks(messages[index]) is None:
        return None
    parent = str(tree.batches[path[-2]].id) if len(path) > 1 else ""
    length = sum(len(tree.batches[i]) for i in path[:-1])
    return _Held(batch, index, parent, length)


async def _move_back(store: Store, cid: ConversationID, moved_to: str, head: str) -> None:
    """Move the head back to the waiting turn ``head`` after a decision failed, as
    ``MoveHead.undo`` does (shielded, bounded, logged, never raising)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
        try:
            await store.move_head(cid, head, expected_head=moved_to)
        except Exception as exc:
            _log.warning(
                "conversation %r: the head could not move back to the turn that waits "
                "for approval (%s: %s)",
                str(cid),
                type(exc).__name__,
                exc,
            )


def _text(response: Response) -> str:
    return response.text


async def _finish(events: AsyncGenerator[TurnEvent[Any], None]) -> TurnResult[Any]:
    """The ``TurnResult`` a turn's events end with."""
    result: TurnResult[Any] | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if event.result is not None:
                result = event.result
    if result is None:  # pragma: no cover - a turn ends with a result or raises
        raise AssertionError("the turn ended without a result")
    return result


def _check_turn(turn: object) -> None:
    if type(turn) is not int:
        raise TypeError(f"turn must be an int >= 1, got {type(turn).__name__}")
    if turn < 1:
        raise ValueError(f"turn must be an int >= 1 (turns count from 1), got {turn}")


def _check_head(head: object, name: str) -> None:
    if head is not None and not isinstance(head, str):
        raise TypeError(
            f"{name} must be a str (a batch's append id, or '' before the first) or None, "
            f"got {type(head).__name__}"
        )


def _stored_user(batch: Any, number: int, cid: ConversationID) -> Message:
    """The user message a stored turn was asked with (regenerate), unmarked."""
    messages = batch.messages
    users = [m for m in messages if m.role is Role.USER]
    if not messages or messages[0].role is not Role.USER or len(users) != 1:
        what = (
            "it holds no user message (a compaction summary?)"
            if not users
            else f"it holds {len(users)} user messages (several turns in one batch)"
            if len(users) > 1
            else "it does not start with its user message"
        )
        raise ValueError(
            f"conversation {str(cid)!r}: turn {number} (batch {str(batch.id)!r}) is not one "
            f"user turn: {what}; edit it with a message instead"
        )
    user: Message = messages[0]
    if _INTERRUPTED_KEY in user.metadata:
        kept = {k: v for k, v in user.metadata.items() if k != _INTERRUPTED_KEY}
        user = Message(user.role, user.parts, Metadata(kept))
    return user


@final
class _Pinned:
    """The reader of one turn that must start from the head ``head``: its view is the
    reader's, or ``HistoryChangedError`` (before the model is called) when the
    conversation's head is another. The Middleware then fences the commit by that
    view's head, so the turn is stored on ``head`` or not at all.

    ``head`` None: any head. ``view`` is the last view read (a turn that waits for an
    approval is stored fenced by it); with ``guard``, a view whose last turn waits for
    an approval raises ``ApprovalPendingError`` before the model is called."""

    __slots__ = ("_guard", "_head", "_reader", "view")

    def __init__(self, reader: Reader, head: str | None, *, guard: bool = False) -> None:
        self._reader = reader
        self._head = head
        self._guard = guard
        self.view: HistoryView | None = None

    @property
    def history_cache(self) -> HistoryCache | None:
        """The reader's store handle's cache (the replay's checks use it)."""
        cache = getattr(self._reader, "history_cache", None)
        return cache if isinstance(cache, HistoryCache) else None

    async def read(self, conversation_id: str) -> list[Message]:
        return list((await self.read_view(conversation_id)).messages)

    async def read_view(self, conversation_id: str) -> HistoryView:
        view = await cast(ViewReader, self._reader).read_view(conversation_id)
        if self._head is not None and not view.closed and view.head != self._head:
            raise HistoryChangedError(
                view.length,
                view.length,
                conversation_id,
                expected_head=self._head,
                actual_head=view.head,
            )
        if self._guard and isinstance(view, HistoryView):
            waiting = _waiting_ids(view.messages)
            if waiting:
                raise ApprovalPendingError(
                    f"conversation {str(conversation_id)!r} waits for a decision on tool "
                    f"call(s) {', '.join(map(repr, waiting))}: approve or deny them first "
                    "(Conversation.pending() lists them); the model was not called",
                    conversation_id=str(conversation_id),
                    call_ids=waiting,
                )
        self.view = view
        return view


def _user(message: Message | str) -> Message:
    if isinstance(message, str):
        return user_message(message)
    if isinstance(message, Message):
        return message
    raise TypeError(f"message must be a user Message or its text, got {type(message).__name__}")


# ------------------------------------------------------------- argument checks

#: The largest window limit a store's integer columns hold.
_MAX_INT64: Final = 2**63 - 1


def _check_store(store: object) -> None:
    """``store`` must be an opened store: a Reader and Writer with async methods."""
    if isinstance(store, str | os.PathLike):
        raise TypeError(
            f"store must be a history store (a scope.history Reader and Writer), got "
            f"{type(store).__name__} {store!r}: open it first, e.g. `async with await "
            "SQLiteStore.open(path) as store` or `await scope.historystores.open_store(url)`"
        )
    if isinstance(store, WindowReader):
        raise TypeError(
            "store must be a history store (a scope.history Reader and Writer), got "
            "WindowReader, which only reads: pass the store and the window apart, "
            "Conversation(model, store, conversation_id, window=WindowReader(store, ...))"
        )
    for protocol, method in ((Reader, "read"), (Writer, "append")):
        found = getattr(store, method, None)
        if not isinstance(store, protocol) or not inspect.iscoroutinefunction(found):
            raise TypeError(
                "store must be a history store (a scope.history Reader and Writer: async "
                f"read(conversation_id) and append(batch)), got {type(store).__name__} "
                f"without an async {method}()"
            )


def _conversation_id(value: object) -> ConversationID:
    if not isinstance(value, str):
        raise TypeError(f"conversation_id must be a str, got {type(value).__name__}")
    try:
        return ConversationID(value)
    except InvalidConversationIDError as exc:
        raise InvalidConversationIDError(f"conversation_id: {exc}") from None


def _window(store: ReadWriter, window: object, limit: object, max_tokens: object) -> Reader:
    """The reader the turns replay: ``window``, the window the shortcuts ask for, or
    the store itself."""
    if window is not None:
        if limit is not None or max_tokens is not None:
            given = " and ".join(
                f"{name}="
                for name, value in (("limit", limit), ("max_tokens", max_tokens))
                if value is not None
            )
            raise ValueError(
                f"pass window= or its shortcuts, not both: got window= and {given} (put "
                "them in the WindowReader)"
            )
        if not isinstance(window, WindowReader):
            raise TypeError(
                f"window must be a scope.history.WindowReader over the store, got "
                f"{type(window).__name__}"
            )
        if window.reader is not store:
            raise ValueError(
                "window must read the conversation's store (window=WindowReader(store, "
                f"...)), but it reads a {type(window.reader).__name__} that is not store"
            )
        return window
    for name, value in (("limit", limit), ("max_tokens", max_tokens)):
        if value is None:
            continue
        if type(value) is not int:
            raise TypeError(f"{name} must be an int >= 1 or None, got {type(value).__name__}")
        if not 1 <= value <= _MAX_INT64:
            raise InvalidWindowError(f"{name} must be between 1 and 2**63 - 1, got {value}")
    if limit is None and max_tokens is None:
        return store
    return WindowReader(store, cast(int | None, limit), max_tokens=cast(int | None, max_tokens))


def _sequence(value: object, name: str, item: type, example: str) -> tuple[Any, ...]:
    """An iterable argument as a tuple; one item given alone is a ``TypeError``."""
    if isinstance(value, item):
        raise TypeError(
            f"{name} must be a list of {item.__name__} objects, got a single "
            f"{type(value).__name__}: write {name}={example}"
        )
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(
            f"{name} must be a list of {item.__name__} objects, got {type(value).__name__}"
        )
    return tuple(value)
