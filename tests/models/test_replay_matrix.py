"""A conversation moves between models (DESIGN §6c), for every ordered pair of six
wire shapes on their loopback servers: Chat Completions with DeepSeek's
``reasoning_content``, Chat Completions against Gemini's compatible endpoint
(``extra_content``), the Responses API, Anthropic, Gemini's ``generateContent`` and
Gemini's Interactions API.

A answers a reasoning + tool-call turn, the tool result goes back, A answers: the turn
is stored. B gets the next turn: its body carries none of A's state and passes B's
request types (each server checks every body it received), and B's answer is stored.
A gets the turn after that and receives its own state back, byte for byte."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from scope.chat import Request, ToolOutput, ToolResult, tool_message, user_message, wrap
from scope.history import Middleware
from scope.history.inmemory import InMemoryStore
from scope.models._provenance import PROVIDER_KEY
from scope.models.gemini import GeminiInteractionsModel
from scope.models.openai import OpenAIChatModel
from tests.gemini_interactions_server import InteractionsServer, assembled, events_of, load
from tests.helpers import ANTHROPIC, GEMINI, OPENAI, RESPONSES, TIME, WEATHER, Provider

pytestmark = pytest.mark.anyio

TOOLS = [WEATHER, TIME]


class _Interactions:
    """The Interactions API's loopback server, as ``Provider.serve`` runs one."""

    @contextlib.contextmanager
    def serve(self) -> Iterator[InteractionsServer]:
        with InteractionsServer() as server:
            yield server
        server.check_requests()


def _interactions_answer(name: str) -> dict[str, Any]:
    """A recorded Interactions answer as a non-streamed request gets it."""
    (exchange,) = load(name)["exchanges"]
    return {"status": 200, "headers": {}, "json": assembled(events_of(exchange))}


def _interactions_state() -> list[str]:
    return [
        event["delta"]["signature"]
        for name in ("stream_tool_call", "stream_final_answer")
        for event in events_of(load(name)["exchanges"][0])
        if event["event_type"] == "step.delta" and event["delta"]["type"] == "thought_signature"
    ]


@attrs.frozen
class Side:
    """One wire shape: its server and adapter, the exchanges of a reasoning + tool-call
    turn and of a plain answer, and the provider state its tool turn carries."""

    name: str
    #: What serves it: a ``Provider`` (or anything with its ``serve()``).
    provider: Provider | _Interactions
    make: Callable[[str], Any]
    tool_turn: Callable[[], list[dict[str, Any]]]
    answer: Callable[[], dict[str, Any]]
    #: The strings of provider state in the tool turn's answers (signatures, encrypted
    #: reasoning, reasoning text that must go back), as the server sent them.
    state: Callable[[], list[str]]

    def __str__(self) -> str:
        return self.name


def _json(provider: Provider, name: str, index: int = 0) -> Any:
    return provider.load_transcript(name)[index]["json"]


def _deepseek_state() -> list[str]:
    message = _json(OPENAI, "deepseek_tool_turn")["choices"][0]["message"]
    return [message["reasoning_content"]]


def _gemini_compat_state() -> list[str]:
    calls = _json(OPENAI, "gemini_compat_tool_turn")["choices"][0]["message"]["tool_calls"]
    return [calls[0]["extra_content"]["google"]["thought_signature"]]


def _responses_state() -> list[str]:
    out = [*_json(RESPONSES, "reasoning_tool_turn")["output"]]
    out += _json(RESPONSES, "reasoning_final_answer")["output"]
    return [item["encrypted_content"] for item in out if item["type"] == "reasoning"]


def _anthropic_state() -> list[str]:
    blocks = [
        block
        for index in (0, 1)
        for block in _json(ANTHROPIC, "thinking_tool_turn", index)["content"]
        if block["type"] == "thinking"
    ]
    return [block["signature"] for block in blocks]


def _gemini_state() -> list[str]:
    return [
        part["thoughtSignature"]
        for index in (0, 1)
        for part in _json(GEMINI, "tool_turn", index)["candidates"][0]["content"]["parts"]
        if "thoughtSignature" in part
    ]


SIDES = [
    Side(
        "deepseek",
        OPENAI,
        lambda url: OpenAIChatModel(
            "deepseek-reasoner", api_key="sk-ds", base_url=url, provider_name="deepseek"
        ),
        lambda: OPENAI.load_transcript("deepseek_tool_turn"),
        lambda: OPENAI.load_transcript("deepseek_answer")[0],
        _deepseek_state,
    ),
    Side(
        "gemini-compat",
        OPENAI,
        lambda url: OpenAIChatModel(
            "gemini-3-pro-preview", api_key="AIza-c", base_url=url, provider_name="gemini"
        ),
        lambda: OPENAI.load_transcript("gemini_compat_tool_turn"),
        lambda: OPENAI.load_transcript("gemini_compat_answer")[0],
        _gemini_compat_state,
    ),
    Side(
        "responses",
        RESPONSES,
        RESPONSES.make,
        lambda: [
            *RESPONSES.load_transcript("reasoning_tool_turn"),
            *RESPONSES.load_transcript("reasoning_final_answer"),
        ],
        lambda: RESPONSES.load_transcript("text")[0],
        _responses_state,
    ),
    Side(
        "anthropic",
        ANTHROPIC,
        ANTHROPIC.make,
        lambda: ANTHROPIC.load_transcript("thinking_tool_turn"),
        lambda: ANTHROPIC.load_transcript("text")[0],
        _anthropic_state,
    ),
    Side(
        "gemini",
        GEMINI,
        GEMINI.make,
        lambda: GEMINI.load_transcript("tool_turn"),
        lambda: GEMINI.load_transcript("text")[0],
        _gemini_state,
    ),
    Side(
        "gemini-interactions",
        _Interactions(),
        lambda url: GeminiInteractionsModel("gemini-3.7-flash", api_key="AIza-i", base_url=url),
        lambda: [
            _interactions_answer("stream_tool_call"),
            _interactions_answer("stream_final_answer"),
        ],
        lambda: _interactions_answer("stream_final_answer"),
        _interactions_state,
    ),
]

PAIRS = [pytest.param(a, b, id=f"{a}-then-{b}") for a in SIDES for b in SIDES if a is not b]


def _text(body: Any) -> str:
    return json.dumps(body, ensure_ascii=False)


@pytest.mark.parametrize(("a", "b"), PAIRS)
async def test_a_conversation_moves_between_models_and_back(a: Side, b: Side) -> None:
    store = InMemoryStore()
    history = Middleware(store, store, "c")
    question = user_message("Weather in Paris?")
    with a.provider.serve() as server_a, b.provider.serve() as server_b:
        server_a.script(*a.tool_turn(), a.answer())
        server_b.script(b.answer())
        async with a.make(server_a.base_url) as model_a, b.make(server_b.base_url) as model_b:
            on_a, on_b = wrap(model_a, history.call), wrap(model_b, history.call)
            # Turn 1 on A: reasoning and a tool call, the results, the answer.
            paused = await on_a.call(Request([question], tools=TOOLS))
            assert paused.output is not None and paused.output.message is not None
            results = tool_message(
                *(
                    ToolResult(call.id, call.name, ToolOutput.of_text("18C"))
                    for call in paused.output.message.tool_calls
                )
            )
            await on_a.call(Request([question, paused.output.message, results], tools=TOOLS))
            # Turn 2 on B, turn 3 on A again.
            await on_b.call(Request([user_message("And tomorrow?")], tools=TOOLS))
            await on_a.call(Request([user_message("Thanks!")], tools=TOOLS))
        bodies_a = [recorded.body for recorded in server_a.requests]
        (body_b,) = [recorded.body for recorded in server_b.requests]
    # (Leaving ``serve()`` checked every body against its server's request types.)
    state = a.state()
    assert state
    sent_to_b = _text(body_b)
    for value in state:
        assert value not in sent_to_b, f"{b} received {a}'s state {value[:24]}..."
    # A gets its own state back, byte for byte, in the turn after B's.
    sent_back = _text(bodies_a[2])
    for value in state:
        assert value in sent_back, f"{a} did not get its state {value[:24]}... back"
    stored = await store.read("c")
    roles = [m.role.value for m in stored]
    assert roles == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert stored[5].metadata.decode(PROVIDER_KEY) == model_b.provider_name
    assert stored[7].metadata.decode(PROVIDER_KEY) == model_a.provider_name
