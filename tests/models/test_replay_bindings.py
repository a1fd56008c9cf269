"""Replay bindings (DESIGN §6g) on each adapter's loopback server: model aliases and the
account.

Model aliases: a request that asks an alias is answered by another name
(Anthropic's ``claude-sonnet-4-0`` by ``claude-sonnet-4-20250514``, a ``-latest`` name by
its snapshot, an Azure deployment by the model behind it, Gemini's ``gemini-flash-latest``
by a preview). Every adapter stamps ``scope/asked``; a tool loop that keeps asking the
alias sends its provider state back on every step, on each adapter's loopback server.

Each loop has three steps: a tool call (with reasoning state), a second tool call (the
same answer with other ids), the final answer. The second request must carry the first
answer's state, the third both answers' state.

The account: an adapter with ``provider_account`` stamps ``scope/account``; another
account's state is never sent (only when both accounts are known: a message stamped
without one is judged by the rest of the rule)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from scope.chat import Message, Request, ToolOutput, ToolResult, tool_message, user_message
from scope.metadata import Metadata
from scope.models._provenance import ACCOUNT_KEY, ASKED_KEY, DROPPED_KEY, MODEL_KEY, Replay
from scope.models.openai import OpenAIChatModel
from tests.helpers import ANTHROPIC, GEMINI, OPENAI, RESPONSES, TIME, WEATHER, Provider, answer

pytestmark = pytest.mark.anyio

TOOLS = [WEATHER, TIME]
QUESTION = user_message("Weather in Paris?")


@attrs.frozen
class Loop:
    """One adapter asking ``asked``, its server answering as ``answered``."""

    name: str
    provider: Provider
    make: Callable[..., Any]
    asked: str
    answered: str
    #: The transcript of a tool step and the final answer (exchange 0 and 1 of it, or
    #: of two transcripts), by mode.
    exchanges: Callable[[str], tuple[dict[str, Any], dict[str, Any]]]
    #: The provider state strings in the tool step's answer, by mode.
    state: Callable[[str], list[str]]
    #: Ids in the tool step's answer, renamed in its second copy.
    ids: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("call",)
    #: Whether the state is parts of its own (reasoning), counted when left out; a
    #: signature on a call (Gemini's) is ignored with the call still sent.
    counted: bool = True

    def __str__(self) -> str:
        return self.name


def _pair(provider: Provider, tool: str, final: str | None = None) -> Any:
    def exchanges(mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
        name = tool if mode == "call" else f"stream_{tool}"
        loaded = provider.load_transcript(name)
        if final is None:
            return loaded[0], loaded[1]
        return loaded[0], provider.load_transcript(final)[0]

    return exchanges


def _anthropic_state(mode: str) -> list[str]:
    if mode == "call":
        (exchange, _) = _pair(ANTHROPIC, "thinking_tool_turn")(mode)
        return [b["signature"] for b in exchange["json"]["content"] if b["type"] == "thinking"]
    (exchange, _) = _pair(ANTHROPIC, "thinking_tool_turn")(mode)
    return [
        "".join(
            event["delta"]["signature"]
            for event in exchange["sse"]
            if event.get("type") == "content_block_delta"
            and event["delta"]["type"] == "signature_delta"
        )
    ]


def _deepseek_state(mode: str) -> list[str]:
    message = OPENAI.load_transcript("deepseek_tool_turn")[0]["json"]["choices"][0]["message"]
    return [message["reasoning_content"]]


def _responses_state(mode: str) -> list[str]:
    output = RESPONSES.load_transcript("reasoning_tool_turn")[0]["json"]["output"]
    return [item["encrypted_content"] for item in output if item["type"] == "reasoning"]


def _gemini_state(mode: str) -> list[str]:
    parts = GEMINI.load_transcript("tool_turn")[0]["json"]["candidates"][0]["content"]["parts"]
    return [part["thoughtSignature"] for part in parts if "thoughtSignature" in part]


def _anthropic(name: str, asked: str, answered: str) -> Loop:
    return Loop(
        name,
        ANTHROPIC,
        lambda url, model, **kwargs: ANTHROPIC.make(url, model=model, **kwargs),
        asked,
        answered,
        _pair(ANTHROPIC, "thinking_tool_turn"),
        _anthropic_state,
        ids=("toolu_01WeatherParis", "toolu_01Weather"),
        modes=("call", "stream"),
    )


LOOPS = [
    _anthropic("anthropic-0", "claude-sonnet-4-0", "claude-sonnet-4-20250514"),
    _anthropic("anthropic-latest", "claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219"),
    Loop(
        "openai-chat",
        OPENAI,
        lambda url, model, **kwargs: OpenAIChatModel(
            model, api_key="sk-ds", base_url=url, provider_name="deepseek", **kwargs
        ),
        "deepseek-reasoner",
        "deepseek-reasoner-0528",
        _pair(OPENAI, "deepseek_tool_turn"),
        _deepseek_state,
        ids=("call_00_ds1",),
    ),
    Loop(
        "responses",
        RESPONSES,
        lambda url, model, **kwargs: RESPONSES.make(url, model=model, **kwargs),
        "my-gpt5-deployment",  # an Azure deployment: the model behind it answers
        "gpt-5-mini-2025-08-07",
        _pair(RESPONSES, "reasoning_tool_turn", "reasoning_final_answer"),
        _responses_state,
        ids=("call_Wx1", "fc_tool1", "rs_tool1"),
    ),
    Loop(
        "gemini",
        GEMINI,
        lambda url, model, **kwargs: GEMINI.make(url, model=model, **kwargs),
        "gemini-flash-latest",
        "gemini-2.5-flash-preview-09-2025",
        _pair(GEMINI, "tool_turn"),
        _gemini_state,
        counted=False,
    ),
]

CASES = [pytest.param(loop, mode, id=f"{loop}-{mode}") for loop in LOOPS for mode in loop.modes]


def _answered_by(value: Any, model: str) -> Any:
    """``value`` (an exchange) with every model name the server states set to ``model``."""
    if isinstance(value, dict):
        return {
            key: model if key in ("model", "modelVersion") else _answered_by(item, model)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_answered_by(item, model) for item in value]
    return value


def _renamed(exchange: dict[str, Any], ids: tuple[str, ...]) -> dict[str, Any]:
    text = json.dumps(exchange)
    for old in ids:
        text = text.replace(f'"{old}"', f'"{old}_2"').replace(f'\\"{old}\\"', f'\\"{old}_2\\"')
    renamed: dict[str, Any] = json.loads(text)
    return renamed


def _results(message: Message) -> Message:
    return tool_message(
        *(ToolResult(call.id, call.name, ToolOutput.of_text("18C")) for call in message.tool_calls)
    )


@pytest.mark.parametrize(("loop", "mode"), CASES)
async def test_a_tool_loop_asking_an_alias_sends_its_state_back_on_every_step(
    loop: Loop, mode: str
) -> None:
    tool, final = (_answered_by(copy.deepcopy(e), loop.answered) for e in loop.exchanges(mode))
    state = loop.state(mode)
    assert state
    with loop.provider.serve() as server:
        server.script(tool, _renamed(tool, loop.ids), final)
        async with loop.make(server.base_url, loop.asked) as model:
            messages: list[Message] = [QUESTION]
            for _ in range(2):
                response = await answer(model, Request(messages, tools=TOOLS), mode)
                assert response.output is not None and response.output.message is not None
                step = response.output.message
                assert step.metadata.decode(ASKED_KEY) == loop.asked
                assert step.metadata.decode(MODEL_KEY) == loop.answered
                assert step.tool_calls
                messages += [step, _results(step)]
            done = await answer(model, Request(messages, tools=TOOLS), mode)
            assert done.metadata is not None
            assert DROPPED_KEY not in done.metadata.extra
        bodies = [json.dumps(body, ensure_ascii=False) for body in server.bodies()]
    assert len(bodies) == 3
    for value in state:
        assert value not in bodies[0]
        assert bodies[1].count(value) == 1, f"step 2 lacks {value[:24]}..."
        assert bodies[2].count(value) == 2, f"step 3 lacks {value[:24]}..."


@pytest.mark.parametrize("loop", [LOOPS[0], LOOPS[2]], ids=str)
async def test_without_the_asked_stamp_the_alias_rule_alone_decides(loop: Loop) -> None:
    # The control: the same answers with their scope/asked stamp removed are judged by
    # the v0.3 rule. Anthropic's alias forms still own their snapshot; a name that is no
    # snapshot of the alias (deepseek-reasoner-0528) is another model.
    tool, _ = (_answered_by(copy.deepcopy(e), loop.answered) for e in loop.exchanges("call"))
    with loop.provider.serve() as server:
        server.script(tool)
        async with loop.make(server.base_url, loop.asked) as model:
            response = await model.call(Request([QUESTION], tools=TOOLS))
    assert response.output is not None and response.output.message is not None
    step = response.output.message
    kept = {key: value for key, value in step.metadata.items() if key != ASKED_KEY}
    v03 = attrs.evolve(step, metadata=Metadata(kept))
    api, provider = model._WIRE.api, model.provider_name
    replay = Replay(api, provider, loop.asked)
    assert replay.owns(step)
    assert replay.owns(v03) is (loop.provider is ANTHROPIC)


@pytest.mark.parametrize("loop", LOOPS[1:], ids=str)
@pytest.mark.parametrize(
    ("then", "sent"),
    [
        pytest.param("org-a", True, id="same-account"),
        pytest.param("org-b", False, id="other-account"),
        pytest.param(None, True, id="no-account-now"),
    ],
)
async def test_another_accounts_state_is_never_sent(
    loop: Loop, then: str | None, sent: bool
) -> None:
    tool, final = (_answered_by(copy.deepcopy(e), loop.answered) for e in loop.exchanges("call"))
    state = loop.state("call")
    with loop.provider.serve() as server:
        server.script(tool, final)
        async with loop.make(server.base_url, loop.asked, provider_account="org-a") as first:
            response = await first.call(Request([QUESTION], tools=TOOLS))
        assert response.output is not None and response.output.message is not None
        step = response.output.message
        assert step.metadata.decode(ACCOUNT_KEY) == "org-a"
        async with loop.make(server.base_url, loop.asked, provider_account=then) as second:
            done = await second.call(Request([QUESTION, step, _results(step)], tools=TOOLS))
        body = json.dumps(server.bodies()[1], ensure_ascii=False)
    for value in state:
        assert (value in body) is sent
    assert done.metadata is not None
    assert (DROPPED_KEY in done.metadata.extra) is (loop.counted and not sent)
