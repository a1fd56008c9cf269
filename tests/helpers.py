"""Small builders and readers of test values, shared by the whole test suite.

Test modules import helpers from here (values), ``tests.servers`` (servers and store
backends), ``tests.strategies`` / ``tests.strategies_stream`` (Hypothesis strategies) and
``tests.openai_server`` / ``tests.anthropic_server`` (fake provider servers), never from
another test module.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from scope.chat import (
    Message,
    Options,
    Request,
    Response,
    ResponseAccumulator,
    ToolCallDelta,
    ToolDefinition,
    assistant_message,
    collect,
    user_message,
)
from scope.history import Batch
from scope.jsonvalue import RawJSON

__all__ = [
    "ROOT",
    "EXACT_WEATHER",
    "TIME",
    "WEATHER",
    "Sleeps",
    "accumulate",
    "batch",
    "collect_until_cancelled",
    "hello",
    "merged",
    "numbered_turn",
    "recording_sleeps",
    "nested",
    "respell",
    "subprocess_env",
    "texts",
    "tool_call_deltas",
    "turn",
]

M = TypeVar("M")

#: The root of this source tree.
ROOT = Path(__file__).resolve().parents[1]

#: Tools the provider tests offer the model.
WEATHER = ToolDefinition(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "The current weather in a city.",
)
TIME = ToolDefinition(
    "get_time",
    {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    "The local time in a time zone.",
)
#: The weather tool with a schema holding a number to keep as spelled (``1.50``).
EXACT_WEATHER = ToolDefinition(
    "get_weather",
    RawJSON.parse(
        '{"type": "object", "properties": {"city": {"type": "string"},'
        ' "days": {"type": "number", "minimum": 1.50}}, "required": ["city"]}'
    ),
    "The current weather in a city.",
)


def turn(tag: str, size: int = 2) -> list[Message]:
    """A user question and ``size - 1`` answers: ``"<tag> q"``, ``"<tag> a"``, and for
    longer turns ``"<tag> a2"``, ``"<tag> a3"``..."""
    answers = [f"{tag} a"] + [f"{tag} a{i}" for i in range(2, size)]
    return [user_message(f"{tag} q"), *map(assistant_message, answers)]


def hello(**options: Any) -> Request:
    """``"Hi"``, with ``options``."""
    return Request([user_message("Hi")], options=Options(**options))


def numbered_turn(cid: str, aid: str, size: int = 2) -> list[Message]:
    """``size`` messages whose texts ``"<cid>|<aid>|<index>"`` say where they belong: a
    user message, then answers."""
    return [user_message(f"{cid}|{aid}|0")] + [
        assistant_message(f"{cid}|{aid}|{i}") for i in range(1, size)
    ]


def batch(cid: str, aid: str, text: str = "hello") -> Batch:
    """A two-message batch: ``text`` asked, ``text + "!"`` answered."""
    return Batch(cid, aid, [user_message(text), assistant_message(text + "!")])


def texts(messages: Iterable[Message]) -> list[str]:
    """The text of each message, in order."""
    return [m.text for m in messages]


class Sleeps:
    """Records the delays a model asks for instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await anyio.lowlevel.checkpoint()


def recording_sleeps(model: M) -> tuple[M, Sleeps]:
    """``model``, its retry sleeps recorded (not waited) by the returned ``Sleeps``."""
    sleeps = Sleeps()
    model._sleep = sleeps  # type: ignore[attr-defined]
    return model, sleeps


async def collect_until_cancelled(stream: AsyncIterator[Response], after: float = 0.05) -> None:
    """Collect ``stream`` under a cancel scope that fires after ``after`` seconds: the
    cancellation must reach this caller, once, and end at the scope."""
    caught: list[type[BaseException]] = []
    with anyio.move_on_after(after) as scope:
        try:
            await collect(stream)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(type(exc))
            raise
    assert scope.cancelled_caught
    assert caught == [anyio.get_cancelled_exc_class()]


def tool_call_deltas(chunks: Iterable[Response]) -> list[ToolCallDelta]:
    """The tool call fragments of ``chunks``, in order."""
    return [
        part.tool_call_delta
        for chunk in chunks
        if chunk.output is not None and chunk.output.message is not None
        for part in chunk.output.message.parts
        if part.tool_call_delta is not None
    ]


def merged(chunks: Iterable[Response]) -> Response:
    """The chunks merged by a ResponseAccumulator (each must be valid, and one at least
    non-empty)."""
    accumulator = ResponseAccumulator()
    for chunk in chunks:
        accumulator.add(chunk)
    response = accumulator.response()
    assert response is not None
    return response


async def accumulate(stream: AsyncIterator[Response]) -> tuple[list[Response], Response]:
    """Every chunk of ``stream``, and the chunks ``merged``."""
    async with contextlib.aclosing(stream) as iterator:  # type: ignore[type-var]
        chunks = [chunk async for chunk in iterator]
    return chunks, merged(chunks)


def respell(text: str | bytes, *, indent: str = "", ascii_: bool = True) -> str:
    """The same document with reversed key order, other whitespace and string escapes;
    number tokens verbatim."""
    tree = json.loads(text, parse_float=_Token, parse_int=_Token)
    return _write(tree, indent, ascii_, 0)


class _Token(str):
    __slots__ = ()


def _write(value: Any, indent: str, ascii_: bool, level: int) -> str:
    pad = "\n" + indent * (level + 1) if indent else " "
    end = "\n" + indent * level if indent else ""
    if isinstance(value, _Token):
        return str(value)
    if isinstance(value, dict):
        items = [
            f"{json.dumps(k, ensure_ascii=ascii_)} : {_write(v, indent, ascii_, level + 1)}"
            for k, v in reversed(list(value.items()))
        ]
        return "{" + ",".join(pad + item for item in items) + end + "}"
    if isinstance(value, list):
        return "[" + ",".join(pad + _write(v, indent, ascii_, level + 1) for v in value) + end + "]"
    return json.dumps(value, ensure_ascii=ascii_)


def nested(depth: int) -> Any:
    """``1`` inside ``depth`` lists."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def subprocess_env(tmp_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``python -m scope`` subprocess: this environment without scope's
    and the provider's settings, its data and temporary files under ``tmp_path``, UTF-8
    standard streams, and this source tree's ``scope`` importable first; then ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SCOPE_", "OPENAI_")) and key != "XDG_DATA_HOME"
    }
    env["TMPDIR"] = str(tmp_path)
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env["PYTHONIOENCODING"] = "utf-8"
    # The subprocess imports the scope under test (this source tree), as pytest does
    # (pythonpath = ["."]), not whichever copy is installed in the environment.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env
