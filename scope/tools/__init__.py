"""Typed tools from Python functions: ``@tool`` gives a ``Tool`` whose JSON Schema comes
from the signature and whose arguments arrive decoded and validated:

    from scope.tools import tool

    @tool
    async def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        \"\"\"The current weather in a city.

        :param city: the city's name, e.g. Lisbon
        :param unit: the temperature unit
        \"\"\"
        return f"21 °{unit}"

    get_weather.definition     # a chat.ToolDefinition: name, description, input_schema
    await get_weather.run(call)   # a chat.ToolResult answering a chat.ToolCall
    await get_weather("Lisbon")   # still the function

**Types** (parameters, and the fields of the classes they use, at any depth): ``str``,
``int``, ``float``, ``bool``, ``None``, ``Literal[...]`` (str, int, bool or None values),
``Enum`` subclasses (str or int values; the model sends the value), ``list[T]``,
``tuple[T, ...]`` and fixed ``tuple[A, B]``, ``dict[str, T]``, unions and optionals (``T |
None``), attrs classes, dataclasses, ``TypedDict`` (required and ``NotRequired`` keys),
Pydantic v2 models (the ``pydantic`` extra; fields by alias, then the model's own
validation, its errors reported with their paths), ``Any``, and ``Annotated[T,
"description"]``. Constraints in ``Annotated`` or on a Pydantic field (``annotated_types``
``Gt``/``Ge``/``Lt``/``Le``/``MultipleOf``/``MinLen``/``MaxLen``, Pydantic's ``pattern``)
become JSON Schema keywords and are checked when decoding. A parameter without a default
is required. Class-like types are closed objects (``additionalProperties: false``).
Anything else
(``bytes``, ``datetime``, a bare ``list``, ``dict[int, T]``, a recursive class, ``*args``)
raises ``TypeError`` when the tool is made, naming the parameter.

**Descriptions** come from the docstring: its first paragraph describes the tool, and
``:param name: text`` lines (or a Google-style ``Args:`` section) describe the
parameters. ``tool(name=..., description=...)`` overrides the name and description.

**Decoding** is strict and agrees with the schema exactly (it runs on a dedicated
``cattrs`` converter): a JSON string is never an ``int``, a number never a ``str``; an
``int`` parameter accepts ``2.0`` (JSON Schema's integers are numbers without a
fraction), a ``float`` accepts ``2``; unknown argument names are refused. Empty
arguments (``""``, as some providers send for a tool without parameters) are ``{}``.

**Strict mode.** ``@tool(strict=True)`` makes the schema in the subset that the
providers' strict modes accept and marks the definition ``strict``: OpenAI (Chat
Completions and Responses) and Anthropic then constrain the model's arguments to the
schema; Gemini has no such flag and gets the same schema without it. In the strict
schema every object is closed and lists every property as required; a parameter or
field with a default accepts null as well (``anyOf`` with ``{"type": "null"}``), and a
null for it decodes to its default (to None when its type accepts None). Every key must
be present. Bounds outside the subset (``minimum``, ``maxLength``, ``minItems`` and the
other ``annotated_types`` bounds; ``pattern`` stays) move into the description, and
the decoder still checks them. A type the subset cannot express raises ``TypeError``
naming the field and the keyword: ``dict[str, T]`` (``additionalProperties``), a
fixed-length tuple (``prefixItems``), the empty tuple, ``Any``.

**Errors the model can fix.** ``Tool.run(call)`` never raises for a bad call: invalid
JSON, arguments that do not match the schema (every problem listed with its path,
``$.unit: expected one of 'C', 'F', got the string 'K'``) and any ``Exception`` the
function raises become a ``ToolResult`` with ``is_error=True`` whose text says what went
wrong, so the model can correct its call. Cancellation is never caught.

**Return values** become the tool output: ``str`` -> text, ``ToolOutput`` as is,
``Media`` -> a media part, ``None`` -> empty output, ``RawJSON`` and anything JSON-shaped
(dicts, lists, numbers, booleans, attrs classes, dataclasses, enums, Pydantic models by
alias) -> JSON details.

**Sync functions run in a worker thread** (``anyio.to_thread.run_sync``) so a blocking
tool (a database driver, ``requests``) never stalls the event loop or the other tools of
the same response; a cancelled turn waits for a running thread to finish (threads cannot
be interrupted). ``tool(thread=False)`` runs a quick, non-blocking sync function on the
event loop instead. Async functions run on the event loop (asyncio or trio).

**Context.** A parameter annotated ``ToolContext`` (or ``ToolContext[Deps]``) receives
the context of the call instead of an argument from the model: the conversation id, its
owner and the ``deps`` the service gave ``Conversation(..., deps=...)``:

    @tool
    async def open_orders(ctx: ToolContext[Shop], status: str) -> list[Order]:
        return await ctx.deps.orders(ctx.owner, status)

The parameter is not in the schema, and an argument of its name from the model is
refused like any unknown argument. At most one parameter takes the context, annotated
``ToolContext`` alone (not optional, not in a union or a container).

**MCP.** ``scope.tools.mcp`` (the ``mcp`` extra) makes ``Tool`` objects of the tools of
an MCP client session: their schema is the server's, their results the server's content.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, ParamSpec, TypeVar, final, get_args, get_origin, overload

import anyio.to_thread
import orjson

from scope import _argschema
from scope.chat import ToolCall, ToolDefinition, ToolOutput, ToolResult, media_part
from scope.errors import InvalidJSONError, InvalidToolCallError
from scope.history import ConversationID
from scope.jsonvalue import RawJSON
from scope.media import Media

__all__ = ["FREEFORM_KEY", "Tool", "ToolContext", "to_output", "tool"]

_log: Final = logging.getLogger("scope.tools")

#: Part metadata an adapter puts on a tool call whose arguments are the text the model
#: wrote, not JSON (an OpenAI ``custom_tool_call``): a freeform tool takes that text
#: (``Tool.run(call, freeform=True)``; ``Conversation`` reads the mark).
FREEFORM_KEY: Final = "scope/freeform"

P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D")


@final
class ToolContext(Generic[D]):
    """What a tool learns about the call besides its arguments: it receives one in the
    parameter annotated ``ToolContext`` (see the module docstring). ``Conversation``
    makes it; make one yourself to run a tool elsewhere (``tool.run(call,
    context=ToolContext("c-1", deps=shop))``, or in a test).

    - ``conversation_id``: the conversation the call belongs to (a ``ConversationID`` or
      ``str``; ``InvalidConversationIDError`` when it is not a valid id).
    - ``owner``: the principal the conversation belongs to (a ``str``), or None.
    - ``deps``: the service's own dependencies (a database pool, a client, settings):
      any object, as given to ``Conversation(deps=...)``; default None.

    Raises ``TypeError`` when ``owner`` is neither a ``str`` nor None.
    """

    __slots__ = ("_conversation_id", "_deps", "_owner")

    def __init__(self, conversation_id: str, *, owner: str | None = None, deps: D = None) -> None:  # type: ignore[assignment]
        if owner is not None and not isinstance(owner, str):
            raise TypeError(f"owner must be a str or None, got {type(owner).__name__}")
        self._conversation_id = ConversationID(conversation_id)
        self._owner = owner
        self._deps = deps

    @property
    def conversation_id(self) -> ConversationID:
        """The conversation the call belongs to."""
        return self._conversation_id

    @property
    def owner(self) -> str | None:
        """The principal the conversation belongs to, or None."""
        return self._owner

    @property
    def deps(self) -> D:
        """The service's dependencies, as given to ``Conversation(deps=...)``."""
        return self._deps

    def __repr__(self) -> str:
        return (
            f"ToolContext({str(self._conversation_id)!r}, owner={self._owner!r}, "
            f"deps={self._deps!r})"
        )


class _ToolFailed(Exception):
    """Raised by the function of a tool made by ``_schema_tool`` to answer with an error
    result whose output is ``output`` exactly (an MCP result with ``isError``)."""

    def __init__(self, output: ToolOutput) -> None:
        # What a direct call of the tool (not Tool.run) shows: the error's own text.
        super().__init__(output.text() or "the tool answered with an error result")
        self.output = output


@final
class Tool(Generic[P, R]):
    """A Python function the model can call: its ``definition`` for the request, and
    ``run(call)`` to answer a call. Made with ``@tool`` (see the module docstring).

    Calling the ``Tool`` calls the function unchanged (``await get_weather("Lisbon")``).

    - ``function``: the function (sync or async).
    - ``name``: the tool's name; default the function's ``__name__``.
    - ``description``: default the docstring's first paragraph.
    - ``thread``: run a sync function in a worker thread (default True); ignored for
      async functions.
    - ``requires_approval``: whether a call waits for a person's decision before it runs
      (``Conversation.approve``/``deny``): ``False`` (the default), ``True``, or a
      predicate ``requires_approval(arguments, context) -> bool`` given the call's decoded
      keyword arguments (a dict, the ``ToolContext`` parameter left out) and the
      conversation's ``ToolContext`` (see ``needs_approval``).
    - ``strict``: make the schema in the strict subset and mark the definition strict,
      so providers with a strict mode constrain the model's arguments to it (default
      False; see the module docstring).
    - ``freeform``: the tool takes one text the model writes itself (code, a patch, a
      query), not JSON arguments: the function has exactly one parameter the model sets,
      a ``str`` without a default. The definition is marked ``freeform``: OpenAI
      Responses offers it as a custom tool and answers with a ``custom_tool_call``
      whose input is the text; the other providers get the schema (an object of that
      one string) and send the text as its value (default False; see ``run``).

    Raises ``TypeError`` when a parameter's type has no JSON form, a parameter has no
    annotation or cannot be passed by keyword, ``ToolContext`` is used other than as a
    parameter's whole annotation or by two parameters; ``InvalidToolDefinitionError``
    when the name is not a valid tool name; ``TypeError`` when ``requires_approval`` is
    neither a bool nor callable; ``TypeError`` naming the field and the keyword when
    ``strict`` and the schema has no strict form; ``TypeError`` when ``freeform`` and the
    function does not take exactly one required ``str`` (``strict`` and ``freeform``
    together: ``TypeError``, a custom tool has no schema to be strict about).
    """

    __slots__ = (
        "_approval",
        "_arguments",
        "_context",
        "_definition",
        "_function",
        "_is_async",
        "_strict",
        "_text",
        "_thread",
    )

    def __init__(
        self,
        function: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        thread: bool = True,
        requires_approval: bool | Callable[[dict[str, Any], ToolContext[Any]], bool] = False,
        strict: bool = False,
        freeform: bool = False,
    ) -> None:
        if not callable(function):
            raise TypeError(f"tool needs a function, got {type(function).__name__}")
        if type(thread) is not bool:
            raise TypeError(f"thread must be a bool, got {type(thread).__name__}")
        if type(strict) is not bool:
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
        if type(freeform) is not bool:
            raise TypeError(f"freeform must be a bool, got {type(freeform).__name__}")
        if strict and freeform:
            raise TypeError("a tool is strict or freeform, not both (a custom tool has no schema)")
        if type(requires_approval) is not bool and not callable(requires_approval):
            raise TypeError(
                "requires_approval must be a bool or a predicate "
                f"(arguments, context) -> bool, got {type(requires_approval).__name__}"
            )
        self._approval = requires_approval
        tool_name = name if name is not None else getattr(function, "__name__", "")
        summary, notes = _docstring(inspect.getdoc(function) or "")
        fields, context = _parameters(function, tool_name)
        self._text: str | None = None  # the parameter that takes a freeform tool's text
        if freeform:
            if len(fields) != 1 or fields[0][1] is not str or not fields[0][2]:
                raise TypeError(
                    f"tool {tool_name!r} is freeform: it takes exactly one parameter the "
                    "model sets, a str without a default (the text), got "
                    f"{', '.join(f[0] for f in fields) or 'none'}"
                )
            self._text = fields[0][0]
        try:
            schema = _argschema.object_schema(fields, notes)
            if strict:
                schema = _argschema.strict_schema(schema)
        except TypeError as exc:
            raise TypeError(f"tool {tool_name!r}, parameter {exc}") from None
        self._function = function
        self._context = context
        self._is_async = inspect.iscoroutinefunction(function)
        self._thread = thread
        self._strict = strict
        self._definition = ToolDefinition(
            tool_name,
            RawJSON.from_value(schema),
            summary if description is None else description,
            strict=strict,
            freeform=freeform,
        )
        # The arguments object as a TypedDict made at run time: the decoder reads it as
        # any TypedDict (required and optional keys, no unknown keys).
        make_typeddict: Any = typing.TypedDict
        self._arguments: Any = make_typeddict(
            f"{tool_name}_arguments",
            {
                field: (typing.Required if required else typing.NotRequired)[tp]
                for field, tp, required in fields
            },
        )

    @property
    def name(self) -> str:
        """The tool's name, as the model calls it."""
        return self._definition.name

    @property
    def definition(self) -> ToolDefinition:
        """The ``ToolDefinition`` to put in a request (name, description, schema)."""
        return self._definition

    @property
    def context_parameter(self) -> str | None:
        """The name of the parameter that receives the ``ToolContext``, or None."""
        return self._context

    @property
    def requires_approval(self) -> bool | Callable[[dict[str, Any], ToolContext[Any]], bool]:
        """Whether (or the predicate that says whether) a call waits for approval."""
        return self._approval

    def needs_approval(self, call: ToolCall, context: ToolContext[Any]) -> bool:
        """Whether ``call`` waits for approval before it runs: ``requires_approval`` as
        given, or its predicate's answer for the call's decoded arguments and
        ``context``. A call whose arguments do not decode needs none (it never runs: its
        error result tells the model what to fix). A predicate that raises lets its
        exception through, and one that returns something other than a bool raises
        ``TypeError``: the turn fails, nothing runs unapproved."""
        approval = self._approval
        if type(approval) is bool:
            return approval
        try:
            arguments = self.decode(call.arguments)
        except InvalidToolCallError:
            return False
        answer = approval(arguments, context)
        if type(answer) is not bool:
            raise TypeError(
                f"tool {self.name!r}: requires_approval must return a bool, got "
                f"{type(answer).__name__}"
            )
        return answer

    @property
    def function(self) -> Callable[P, R]:
        """The wrapped function."""
        return self._function

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"

    def decode(self, arguments: str) -> dict[str, Any]:
        """The keyword arguments a call's ``arguments`` text decodes to (for a tool whose
        schema is another system's, an MCP server's: the JSON object itself).

        Raises ``InvalidToolCallError`` naming every problem with its path (invalid JSON,
        not an object, a missing or unknown argument, a value of the wrong type).
        """
        if not arguments.strip():
            value: Any = {}
        else:
            try:
                value = orjson.loads(arguments)
            except orjson.JSONDecodeError as exc:
                raise InvalidToolCallError(
                    f"the arguments of {self.name} are not valid JSON ({exc}); send one JSON "
                    "object matching the tool's schema"
                ) from None
        if type(value) is not dict:
            got = _argschema.kind_of(value)
            raise InvalidToolCallError(
                f"the arguments of {self.name} must be a JSON object, got {got}"
            )
        if self._arguments is None:  # the schema is another system's to check
            return typing.cast(dict[str, Any], value)
        try:
            decoded: dict[str, Any] = _argschema.structure(
                value, self._arguments, strict=self._strict
            )
        except _argschema.ArgumentError as exc:
            raise InvalidToolCallError(f"invalid arguments for {self.name}: {exc}") from None
        return decoded

    async def run(
        self, call: ToolCall, *, context: ToolContext[Any] | None = None, freeform: bool = False
    ) -> ToolResult:
        """Answer ``call``: decode its arguments, run the function, wrap what it returned.
        ``context`` is what the function's ``ToolContext`` parameter receives (ignored
        by a function without one). ``freeform``: the call's arguments are the text the
        model wrote, not JSON (a call whose part carries metadata ``scope/freeform``, an
        OpenAI ``custom_tool_call``; ``Conversation`` passes it): a freeform tool's
        function gets that text as it is, and any other tool answers with an error
        result (it takes JSON arguments).

        Never raises for a bad call or a failing function: both become an error result
        (``is_error=True``) telling the model what to fix. Cancellation propagates.
        Raises ``ValueError`` when the call names another tool; ``TypeError`` when
        ``context`` is not a ``ToolContext`` or None, or is None and the function takes
        one.
        """
        if call.name != self.name:
            raise ValueError(f"tool {self.name!r} cannot answer a call to {call.name!r}")
        if context is not None and not isinstance(context, ToolContext):
            raise TypeError(
                f"context must be a scope.tools.ToolContext or None, got {type(context).__name__}"
            )
        if context is None and self._context is not None:
            raise TypeError(
                f"tool {self.name!r} takes a ToolContext (parameter {self._context}): pass "
                "run(call, context=ToolContext(...))"
            )
        if type(freeform) is not bool:
            raise TypeError(f"freeform must be a bool, got {type(freeform).__name__}")
        if freeform and self._text is None:
            text = (
                f"{self.name} takes JSON arguments matching its schema, not free text; call "
                f"it as a function with a JSON object"
            )
            return ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
        try:
            kwargs: dict[str, Any] = (
                {self._text: call.arguments}
                if freeform and self._text is not None
                else self.decode(call.arguments)
            )
        except InvalidToolCallError as exc:
            text = f"{exc}. Call {self.name} again with corrected arguments."
            return ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
        if self._context is not None:  # decode refused an argument of this name
            kwargs[self._context] = context
        try:
            value = await self._invoke(kwargs)
        except _ToolFailed as failed:  # the tool's own error result (an MCP server's)
            return ToolResult(call.id, call.name, failed.output, is_error=True)
        except Exception as exc:  # the tool's own failure: the model decides what to do
            _log.debug("tool %s failed", self.name, exc_info=True)
            text = f"{self.name} failed: {type(exc).__name__}: {exc}"
            return ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
        try:
            output = to_output(value)
        except TypeError as exc:
            _log.warning("tool %s returned a value with no JSON form: %s", self.name, exc)
            text = f"{self.name} returned a value that cannot be sent ({exc})"
            return ToolResult(call.id, call.name, ToolOutput.of_text(text), is_error=True)
        return ToolResult(call.id, call.name, output)

    async def _invoke(self, kwargs: dict[str, Any]) -> Any:
        function: Callable[..., Any] = self._function
        if self._arguments is None:  # _schema_tool: the arguments object as one argument
            return await function(kwargs)
        if self._is_async:
            return await function(**kwargs)
        if self._thread:
            return await anyio.to_thread.run_sync(functools.partial(function, **kwargs))
        result = function(**kwargs)
        if inspect.isawaitable(result):  # a sync callable returning an awaitable
            return await result
        return result


def _schema_tool(
    function: Callable[[dict[str, Any]], Awaitable[R]], definition: ToolDefinition
) -> Tool[[dict[str, Any]], Awaitable[R]]:
    """A ``Tool`` whose schema is given rather than made from a signature (an MCP
    server's, ``scope.tools.mcp``): ``function`` receives the call's arguments as the
    decoded JSON object (checked to be an object; the schema is the other system's to
    check), its value becomes the output (``to_output``), and ``_ToolFailed`` the error
    result it carries. Everything else (errors, cancellation) is ``Tool.run``'s."""
    made: Tool[[dict[str, Any]], Awaitable[R]] = object.__new__(Tool)
    made._function = function
    made._context = None
    made._is_async = True
    made._thread = False
    made._definition = definition
    made._arguments = None
    made._approval = False
    made._strict = definition.strict
    return made


def to_output(value: object) -> ToolOutput:
    """A tool's return value as a ``ToolOutput`` (see the module docstring).

    Raises ``TypeError`` when the value has no JSON form.
    """
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput.of_text(value)
    if value is None:
        return ToolOutput()
    if isinstance(value, Media):
        return ToolOutput((media_part(value),))
    if isinstance(value, RawJSON):
        return ToolOutput.of_json(value)
    try:
        return ToolOutput.of_json(RawJSON.from_value(_argschema.unstructure(value)))
    except (InvalidJSONError, TypeError, ValueError) as exc:
        raise TypeError(f"{type(value).__name__} has no JSON form: {exc}") from None


@overload
def tool(function: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = True,
    requires_approval: bool | Callable[[dict[str, Any], ToolContext[Any]], bool] = False,
    strict: bool = False,
    freeform: bool = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = True,
    requires_approval: bool | Callable[[dict[str, Any], ToolContext[Any]], bool] = False,
    strict: bool = False,
    freeform: bool = False,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a ``Tool`` of a function: ``@tool`` or ``@tool(name=..., description=...,
    thread=..., requires_approval=..., strict=..., freeform=...)`` (the arguments of
    ``Tool``)."""
    if function is not None:
        return Tool(
            function,
            name=name,
            description=description,
            thread=thread,
            requires_approval=requires_approval,
            strict=strict,
            freeform=freeform,
        )

    def decorate(function: Callable[P, R]) -> Tool[P, R]:
        return Tool(
            function,
            name=name,
            description=description,
            thread=thread,
            requires_approval=requires_approval,
            strict=strict,
            freeform=freeform,
        )

    return decorate


def _parameters(
    function: Callable[..., Any], name: str
) -> tuple[list[tuple[str, Any, bool]], str | None]:
    """``(name, type, required)`` of each parameter the model sets, in order, and the
    name of the parameter that takes the ``ToolContext`` (None: none does)."""
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise TypeError(f"tool {name!r}: cannot read its signature ({exc})") from None
    fields = []
    context: str | None = None
    for parameter in signature.parameters.values():
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(
                f"tool {name!r}, parameter {parameter.name}: tool parameters are passed by "
                f"keyword ({parameter.kind.description} is not supported)"
            )
        if parameter.name not in hints:
            raise TypeError(
                f"tool {name!r}, parameter {parameter.name}: needs a type annotation (it "
                "makes the schema)"
            )
        annotation = hints[parameter.name]
        if _is_context(annotation, f"tool {name!r}, parameter {parameter.name}"):
            if context is not None:
                raise TypeError(
                    f"tool {name!r}, parameter {parameter.name}: a second ToolContext "
                    f"parameter ({context} takes it already)"
                )
            context = parameter.name
            continue
        required = parameter.default is inspect.Parameter.empty
        fields.append((parameter.name, annotation, required))
    return fields, context


def _is_context(annotation: Any, where: str) -> bool:
    """Whether a parameter's annotation is ``ToolContext`` (or ``ToolContext[D]``): the one
    place a context parameter is recognised. ``ToolContext`` anywhere inside another
    annotation (optional, a union, a container, ``Annotated``) is a ``TypeError``."""
    if annotation is ToolContext or get_origin(annotation) is ToolContext:
        return True

    def mentions(tp: Any) -> bool:
        return (
            tp is ToolContext or get_origin(tp) is ToolContext or any(map(mentions, get_args(tp)))
        )

    if mentions(annotation):
        raise TypeError(
            f"{where}: ToolContext must be the whole annotation (ctx: ToolContext), not "
            "part of one: the context is always given, never optional"
        )
    return False


_SPHINX: Final = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_GOOGLE: Final = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION: Final = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?):$")
_ARGS: Final = ("Args", "Arguments", "Parameters")


def _docstring(doc: str) -> tuple[str, Mapping[str, str]]:
    """The first paragraph (as one line) and the parameter descriptions of a docstring
    (``inspect.getdoc``: dedented): sphinx ``:param name: text`` fields, or the entries
    of a Google-style ``Args:`` section; indented lines continue an entry."""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith(":") or _SECTION.match(stripped):
            break
        summary.append(stripped)
    notes: dict[str, list[str]] = {}
    current: list[str] | None = None
    args_indent: int | None = None  # inside an Args: section: its entries' indent (-1: unknown)
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        section = _SECTION.match(stripped)
        if section:
            args_indent = -1 if section.group(1) in _ARGS else None
            current = None
            continue
        if not stripped:
            current = None
            continue
        sphinx = _SPHINX.match(stripped)
        if sphinx:
            current = notes.setdefault(sphinx.group(1), [sphinx.group(2)])
            continue
        if args_indent is not None:
            if args_indent == -1:
                args_indent = indent
            google = _GOOGLE.match(stripped)
            if indent == args_indent and google:
                current = notes.setdefault(google.group(1), [google.group(2)])
                continue
            if indent < args_indent:
                args_indent = None
                current = None
        if current is not None and indent > (args_indent or 0):
            current.append(stripped)
        else:
            current = None
    return " ".join(summary), {key: " ".join(" ".join(v).split()) for key, v in notes.items()}
