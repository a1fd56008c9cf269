"""``scope demo``: a scripted, offline conversation through the whole stack, self-checked.

A ``ScriptedModel`` streams a three-turn travel chat through the history ``Middleware``
into a real store (SQLite in a fresh temporary directory unless ``--store`` says
otherwise). The first turn is a parallel tool call: the demo runs two small local tools
and resubmits the turn with their results. Then it shows the stored history, a retried
batch landing once, and a ``CommitError`` recovered without calling the model again.

Every step checks its claim; the first claim that does not hold ends the demo with
``DemoCheckFailed`` (exit status 1, one line naming the check).
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import pathlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, TextIO, final

import attrs

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    ResponseMetadata,
    ToolDefinition,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
    wrap_stream,
)
from scope.cli._errors import CLIError
from scope.cli._render import print_stream, render_conversation
from scope.cli._stores import opened_store, sqlite_url
from scope.errors import CommitError, ScopeError, StoreError
from scope.history import Batch, Middleware, Receipt, Writer
from scope.testing import ScriptedModel

__all__ = ["DemoCheckFailed", "run_demo"]

_SYSTEM: Final = "You are a concise travel assistant. Use the tools for facts and arithmetic."
_QUESTIONS: Final = (
    "What is the weather in Lisbon right now, and what is 18.5 * 4?",
    "Thanks! What should I pack for an evening walk there?",
    "One last thing: how do I say thank you in Portuguese?",
)
_TOOLS: Final = (
    ToolDefinition(
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "Current weather for a city.",
    ),
    ToolDefinition(
        "calculator",
        {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
        "Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).",
    ),
)


class DemoCheckFailed(CLIError):
    """A claim the demo makes about the stack did not hold."""

    def __init__(self, claim: str, detail: str = "") -> None:
        super().__init__(f"demo check failed: {claim}" + (f" ({detail})" if detail else ""))
        self.claim = claim


# ---------------------------------------------------------------------- the two tools

_WEATHER: Final = {"lisbon": "21 C, sunny", "oslo": "4 C, light rain", "tokyo": "17 C, cloudy"}

_OPERATORS: Final[dict[type, Callable[..., Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ValueError("booleans are not numbers here")
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return float(_OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.operand)))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def calculator(arguments: dict[str, Any]) -> str:
    """Evaluate ``arguments["expression"]``: numbers, ``+ - * / **`` and parentheses."""
    value = _evaluate(ast.parse(str(arguments["expression"]), mode="eval"))
    return str(int(value)) if value.is_integer() else repr(value)


def get_weather(arguments: dict[str, Any]) -> str:
    """Canned weather for a few cities."""
    city = str(arguments["city"])
    return f"{city}: {_WEATHER.get(city.lower(), 'no data')}"


_LOCAL_TOOLS: Final[dict[str, Callable[[dict[str, Any]], str]]] = {
    "get_weather": get_weather,
    "calculator": calculator,
}


def _run_tool(call_id: str, name: str, arguments: str) -> ToolResult:
    """Run one local tool; a failure becomes an error result the model can read."""
    try:
        args = json.loads(arguments)
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        return ToolResult(call_id, name, ToolOutput.of_text(_LOCAL_TOOLS[name](args)))
    except (ValueError, KeyError, ArithmeticError) as exc:
        return ToolResult(call_id, name, ToolOutput.of_text(f"error: {exc}"), is_error=True)


# ---------------------------------------------------------------------- the script


def _script() -> tuple[Response, ...]:
    def answer(message: Message, finish: FinishReason, n: int, usage: Usage) -> Response:
        return Response(
            Output(message, finish), ResponseMetadata(f"demo-resp-{n}", "scripted-demo", usage)
        )

    return (
        answer(
            assistant_message(
                text_part("Let me look that up."),
                tool_call_part("call_weather", "get_weather", '{"city": "Lisbon"}'),
                tool_call_part("call_calc", "calculator", '{"expression": "18.5 * 4"}'),
            ),
            FinishReason.TOOL_CALLS,
            1,
            Usage(61, 38),
        ),
        answer(
            assistant_message("Lisbon is at 21 C and sunny right now, and 18.5 * 4 = 74."),
            FinishReason.STOP,
            2,
            Usage(118, 17),
        ),
        answer(
            assistant_message(
                "Sunglasses for the sun and a light jacket: evenings by the river get breezy."
            ),
            FinishReason.STOP,
            3,
            Usage(151, 16),
        ),
        answer(
            assistant_message('"Obrigado" (or "obrigada", if you are a woman).'),
            FinishReason.STOP,
            4,
            Usage(182, 12),
        ),
    )


# ---------------------------------------------------------------------- plumbing


@final
@attrs.define(eq=False)
class _RecordingWriter:
    """A writer that records every accepted batch, and fails the next ``fail_next``
    appends with ``StoreError`` (the outage of the CommitError step)."""

    inner: Writer
    fail_next: int = 0
    accepted: list[tuple[Batch, Receipt]] = attrs.Factory(list)

    async def append(self, batch: Batch) -> Receipt:
        if self.fail_next:
            self.fail_next -= 1
            raise StoreError("simulated outage: the store did not answer")
        receipt = await self.inner.append(batch)
        self.accepted.append((batch, receipt))
        return receipt


@final
class _Demo:
    def __init__(self, out: TextIO, delay: float) -> None:
        self.out = out
        self.delay = delay
        self.checks = 0

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A named step: an unexpected scope error inside it fails the demo naming it."""
        try:
            yield
        except ScopeError as exc:
            self.out.flush()
            raise DemoCheckFailed(name, f"unexpected {type(exc).__name__}: {exc}") from exc

    def check(self, ok: bool, claim: str, detail: str = "") -> None:
        if not ok:
            self.out.flush()
            raise DemoCheckFailed(claim, detail)
        self.checks += 1
        self.say(f"  ok: {claim}")

    async def stream(self, chunks: AsyncIterator[Response]) -> Response:
        """Print the text of each chunk as it arrives; return the accumulated response."""
        response = await print_stream(chunks, self.out, "assistant: ", self.delay)
        return Response() if response is None else response


#: What the history Middleware adds to the answer it commits (DESIGN §6d).
_COMMIT_STAMPS: Final = ("scope/usage", "scope/response_id")


def _unstamped(messages: list[Message]) -> list[Message]:
    """Stored messages without the Middleware's commit stamps, to compare with answers."""
    return [
        Message(
            m.role,
            m.parts,
            {k: v for k, v in m.metadata.items() if k not in _COMMIT_STAMPS},
        )
        for m in messages
    ]


def _message(response: Response) -> Message:
    """The response's assistant message (a demo check fails without one)."""
    output = response.output
    if output is None or output.message is None:
        raise DemoCheckFailed("the model answered with an assistant message")
    return output.message


async def run_demo(url: str | None, out: TextIO) -> int:
    """Run the demo against the store ``url`` (None: SQLite in a fresh temp dir).

    Returns 0 when every check held; raises ``DemoCheckFailed`` naming the first claim
    that did not (an unexpected error inside a step counts as that step failing). A
    store that cannot be opened raises its own error before any step runs.
    """
    if url is None:
        directory = pathlib.Path(tempfile.mkdtemp(prefix="scope-demo-"))
        url = sqlite_url(directory / "demo.sqlite3")
    try:
        interactive = out.isatty()
    except (AttributeError, ValueError):
        interactive = False
    demo = _Demo(out, 0.02 if interactive else 0.0)
    # A fresh id every run, so the demo can share a store with anything, itself included.
    cid = f"demo-{uuid.uuid4().hex[:12]}"
    demo.say("scope demo: a scripted, offline conversation through the whole stack")
    demo.say(f"store:        {url}")
    demo.say(f"conversation: {cid}")
    async with opened_store(url) as store:
        model = ScriptedModel(*_script(), text_size=6, args_size=8)
        writer = _RecordingWriter(store)
        history = Middleware(store, writer, cid)
        streamer = wrap_stream(model, history.stream)
        system = system_message(_SYSTEM)

        async def turn(*messages: Message) -> Response:
            request = Request((system, *messages), tools=_TOOLS)
            return await demo.stream(streamer.stream(request))

        with demo.step("turn 1 (parallel tool call)"):
            demo.say()
            demo.say("== turn 1: two tools in one assistant message ==")
            user1 = user_message(_QUESTIONS[0])
            demo.say(f"user: {user1.text}")
            paused = await turn(user1)
            asked = _message(paused)
            for call in asked.tool_calls:
                demo.say(f"  -> tool call {call.name} [{call.id}] {call.arguments}")
            demo.check(
                len(asked.tool_calls) == 2
                and paused.output is not None
                and paused.output.finish_reason is FinishReason.TOOL_CALLS,
                "the model asked for two tool calls in one message",
            )
            demo.check(
                await store.read(cid) == [],
                "nothing is stored while the turn waits for tool results",
            )
            results = []
            for call in asked.tool_calls:
                result = _run_tool(call.id, call.name, call.arguments)
                demo.say(f"  <- {call.name} [{call.id}] {result.output.text()}")
                results.append(result)
            tool_turn = (user1, asked, tool_message(*results))
            final = _message(await turn(*tool_turn))
            stored = await store.read(cid)
            demo.check(
                _unstamped(stored) == [*tool_turn, final] and len(writer.accepted) == 1,
                "the completed turn is stored as one batch of 4 messages",
                f"stored {len(stored)} messages in {len(writer.accepted)} batches",
            )

        with demo.step("turn 2 (replay)"):
            demo.say()
            demo.say("== turn 2: the history middleware replays turn 1 ==")
            user2 = user_message(_QUESTIONS[1])
            demo.say(f"user: {user2.text}")
            before = await store.read(cid)
            second = _message(await turn(user2))
            demo.check(
                model.requests[-1].messages == (system, *before, user2),
                "the model saw the system prompt, the stored turn 1 and the new question",
            )
            stored = await store.read(cid)
            demo.check(
                _unstamped(stored) == [*_unstamped(before), user2, second],
                "turn 2 is appended after turn 1 (6 messages)",
            )

        demo.say()
        demo.say(f"== stored history of {cid} ==")
        for line in render_conversation(stored):
            demo.say(line)

        with demo.step("retrying an accepted batch"):
            demo.say()
            demo.say("== retrying an accepted batch ==")
            batch, receipt = writer.accepted[-1]
            again = await store.append(batch)
            demo.say(f"append id {batch.id} again -> receipt digest {again.digest[:19]}...")
            demo.check(again == receipt, "the retry returns an equal receipt")
            demo.check(await store.read(cid) == stored, "the history is unchanged (6 messages)")

        with demo.step("turn 3 (CommitError recovery)"):
            demo.say()
            demo.say("== turn 3: the store fails after the model answered ==")
            user3 = user_message(_QUESTIONS[2])
            demo.say(f"user: {user3.text}")
            writer.fail_next = 1
            error: CommitError | None = None
            try:
                await turn(user3)
            except CommitError as exc:
                error = exc
            if error is None:
                raise DemoCheckFailed("the failed append surfaces as CommitError")
            demo.check(error.receipt is None, "the failed append surfaces as CommitError")
            demo.say(f"CommitError: {error.__cause__}; retrying writer.append(err.batch)")
            calls_before = len(model.requests)
            retried = await writer.append(error.batch)
            retried.validate_for(error.batch)
            demo.check(
                len(model.requests) == calls_before == 4 and model.remaining == 0,
                "the retry did not call the model again (4 model requests in all)",
            )
            demo.check(
                _unstamped(await store.read(cid))
                == [*_unstamped(stored), user3, _message(error.response)],
                "turn 3 is stored once, after the retry (8 messages)",
            )
    demo.say()
    demo.say(f"all {demo.checks} checks passed")
    demo.say(f"look again: scope history show --store {url} {cid}")
    return 0
