"""``Conversation`` as the one front door (issue 35): every history option a service
needs goes through its constructor — a window over the store (``window=``, or the
``limit=``/``max_tokens=`` shortcuts), compaction, the overlap strategies with their
``overlap_timeout`` and ``lease_ttl`` — and every bad argument raises the exact error
type, naming this constructor's parameter (never the Middleware's). asyncio and trio.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import anyio
import pytest

from scope import otel
from scope.chat import Message, Request, Role
from scope.conversation import Conversation
from scope.errors import (
    CommitError,
    HistoryChangedError,
    InvalidConversationIDError,
    InvalidWindowError,
    TurnInProgressError,
)
from scope.history import Batch, Receipt, WindowReader, compact
from scope.history.inmemory import InMemoryStore
from scope.testing import FunctionModel, ScriptedModel, offline_summarizer
from scope.tools import tool

pytestmark = pytest.mark.anyio


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Recorder:
    """A FunctionModel that answers ``answer N`` and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

        def answer(request: Request) -> str:
            self.requests.append(request)
            return f"answer {len(self.requests)}"

        self.model = FunctionModel(answer)

    def sent(self, index: int = -1) -> list[tuple[Role, str]]:
        return [(m.role, m.text) for m in self.requests[index].messages]


async def _seed(store: InMemoryStore, turns: int, cid: str = "c") -> None:
    for i in range(turns):
        await store.append(
            Batch(cid, f"seed-{i}", [_message(Role.USER, f"q{i}"), _message(Role.ASSISTANT, "a")])
        )


def _message(role: Role, text: str) -> Message:
    from scope.chat import assistant_message, user_message

    return user_message(text) if role is Role.USER else assistant_message(text)


# ------------------------------------------------------------------ combinations


async def test_without_a_window_every_stored_turn_is_replayed() -> None:
    store, recorder = InMemoryStore(), Recorder()
    await _seed(store, 3)
    conversation = Conversation(recorder.model, store, "c")
    assert conversation.window is None and conversation.store is store
    await conversation.ask("next")
    assert len(recorder.sent()) == 7  # 3 stored turns + the new question


@pytest.mark.parametrize("how", ["window", "limit"])
async def test_a_message_limit_replays_the_newest_whole_turns(how: str) -> None:
    store, recorder = InMemoryStore(), Recorder()
    await _seed(store, 3)
    window = {"window": WindowReader(store, 3)} if how == "window" else {"limit": 3}
    conversation = Conversation(recorder.model, store, "c", **window)
    assert isinstance(conversation.window, WindowReader) and conversation.window.limit == 3
    result = await conversation.ask("next")
    assert recorder.sent() == [(Role.USER, "q2"), (Role.ASSISTANT, "a"), (Role.USER, "next")]
    stored = await store.read("c")
    assert len(stored) == 8 and stored[-2:] == list(result.messages)  # the store keeps all


async def test_a_token_budget_replays_what_fits() -> None:
    store, recorder = InMemoryStore(), Recorder()
    for i in range(4):
        await store.append(
            Batch(
                "c",
                f"long-{i}",
                [_message(Role.USER, f"q{i} " + "x" * 400), _message(Role.ASSISTANT, "a")],
            )
        )
    conversation = Conversation(recorder.model, store, "c", max_tokens=250)
    assert conversation.window is not None and conversation.window.max_tokens == 250
    await conversation.ask("next")
    users = [text[:2] for role, text in recorder.sent() if role is Role.USER]
    assert 1 <= len(users) < 5 and users[-1] == "ne"  # older turns left out, newest kept
    assert len(await store.read("c")) == 10


async def test_both_shortcuts_make_one_window() -> None:
    store = InMemoryStore()
    conversation = Conversation(Recorder().model, store, "c", limit=4, max_tokens=1000)
    window = conversation.window
    assert window is not None and (window.limit, window.max_tokens) == (4, 1000)
    assert window.reader is store


async def test_a_window_replays_the_compaction_summary_and_the_fence_holds() -> None:
    store, recorder = InMemoryStore(), Recorder()
    await _seed(store, 4)
    assert await compact(store, "c", offline_summarizer, keep_turns=1) is not None
    conversation = Conversation(recorder.model, store, "c", window=WindowReader(store))
    await conversation.ask("next")
    sent = recorder.sent()
    assert sent[0][0] is Role.SYSTEM and "q0" in sent[0][1] and "offline" in sent[0][1]
    assert sent[1:] == [(Role.USER, "q3"), (Role.ASSISTANT, "a"), (Role.USER, "next")]
    assert len(await store.read("c")) == 11


async def test_through_a_window_the_fence_counts_the_whole_conversation() -> None:
    store = InMemoryStore()
    await _seed(store, 3)

    async def meanwhile(request: Request) -> str:  # another turn lands during this one
        await store.append(Batch("c", "other", [_message(Role.USER, "x")]))
        return "late"

    conversation = Conversation(FunctionModel(meanwhile), store, "c", limit=2)
    with pytest.raises(CommitError) as lost:
        await conversation.ask("next")
    assert not lost.value.retryable
    assert isinstance(lost.value.__cause__, HistoryChangedError)
    assert lost.value.__cause__.expected == 6  # the stored length, not the window's 2


@pytest.mark.parametrize("on_overlap", ["reject", "wait", "interrupt"])
async def test_a_window_and_an_overlap_strategy_go_together(on_overlap: Any) -> None:
    store, recorder = InMemoryStore(), Recorder()
    await _seed(store, 2)
    conversation = Conversation(recorder.model, store, "c", limit=2, on_overlap=on_overlap)
    assert conversation.middleware.on_overlap == on_overlap
    await conversation.ask("next")
    assert recorder.sent() == [(Role.USER, "q1"), (Role.ASSISTANT, "a"), (Role.USER, "next")]
    assert len(await store.read("c")) == 6


async def test_overlap_timeout_bounds_a_waiting_turn() -> None:
    store = InMemoryStore()
    release = anyio.Event()
    started = anyio.Event()

    async def slow(request: Request) -> str:
        started.set()
        await release.wait()
        return "first"

    first = Conversation(FunctionModel(slow), store, "c", on_overlap="wait")
    waiting = Conversation(
        Recorder().model, store, "c", on_overlap="wait", overlap_timeout=0.05, lease_ttl=5
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(first.ask, "one")
            await started.wait()
            with pytest.raises(TurnInProgressError) as refused:
                await waiting.ask("two")
            release.set()
    assert refused.value.waited >= 0.05
    assert [m.text for m in await store.read("c")] == ["one", "first"]


async def test_tools_system_and_middlewares_combine_with_a_window() -> None:
    store = InMemoryStore()
    await _seed(store, 2)
    from scope.chat import FinishReason, Output, Response, assistant_message, tool_call_part

    model = ScriptedModel(
        Response(
            Output(
                assistant_message(tool_call_part("t1", "get_weather", '{"city": "Porto"}')),
                FinishReason.TOOL_CALLS,
            )
        ),
        Response(Output(assistant_message("Sunny."), FinishReason.STOP)),
    )
    conversation = Conversation(
        model,
        store,
        "c",
        limit=3,
        tools=[get_weather],
        system="Be brief.",
        middlewares=[otel.tracing(provider_name="test")],
    )
    result = await conversation.ask("Weather?")
    assert result.output == "Sunny." and result.steps == 2
    second = model.requests[1].messages
    assert [m.role for m in second] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
    ]
    assert len(await store.read("c")) == 8


# --------------------------------------------------------------- bad arguments


class ReadWriteOnly:
    """A store with read and append only: no leases."""

    def __init__(self) -> None:
        self._inner = InMemoryStore()

    async def read(self, conversation_id: str) -> list[Message]:
        return await self._inner.read(conversation_id)

    async def append(self, batch: Batch) -> Receipt:
        return await self._inner.append(batch)


class SyncRead:
    def read(self, conversation_id: str) -> list[Message]:
        return []

    async def append(self, batch: Batch) -> Receipt:
        raise AssertionError


STORE = InMemoryStore()
OTHER = InMemoryStore()
MODEL = ScriptedModel()

BAD: list[Any] = [
    pytest.param({"store": "history.db"}, TypeError, r"store must be a history store .*got str "
                 r"'history\.db': open it first", id="store-path-str"),
    pytest.param({"store": pathlib.Path("h.db")}, TypeError, "store must be a history store",
                 id="store-path"),
    pytest.param({"store": WindowReader(STORE, 4)}, TypeError,
                 r"got WindowReader, which only reads: .*window=WindowReader\(store",
                 id="store-window"),
    pytest.param({"store": object()}, TypeError, "without an async read", id="store-object"),
    pytest.param({"store": SyncRead()}, TypeError, "without an async read", id="store-sync"),
    pytest.param({"conversation_id": 5}, TypeError, "conversation_id must be a str, got int",
                 id="cid-int"),
    pytest.param({"conversation_id": " c "}, InvalidConversationIDError,
                 "conversation_id: .*surrounding whitespace", id="cid-whitespace"),
    pytest.param({"conversation_id": "c\x00"}, InvalidConversationIDError,
                 "conversation_id: .*control characters", id="cid-control"),
    pytest.param({"window": STORE}, TypeError, "window must be a scope.history.WindowReader",
                 id="window-store"),
    pytest.param({"window": WindowReader(OTHER, 2)}, ValueError,
                 "window must read the conversation's store", id="window-other-store"),
    pytest.param({"window": WindowReader(STORE, 2), "limit": 3}, ValueError,
                 r"not both: got window= and limit=", id="window-and-limit"),
    pytest.param({"window": WindowReader(STORE, 2), "max_tokens": 3}, ValueError,
                 r"got window= and max_tokens=", id="window-and-max-tokens"),
    pytest.param({"limit": 0}, InvalidWindowError,
                 r"limit must be between 1 and 2\*\*63 - 1, got 0", id="limit-zero"),
    pytest.param({"limit": True}, TypeError, "limit must be an int >= 1 or None, got bool",
                 id="limit-bool"),
    pytest.param({"max_tokens": -5}, InvalidWindowError, "max_tokens must be between 1 and",
                 id="max-tokens-negative"),
    pytest.param({"max_tokens": 2**63}, InvalidWindowError, "max_tokens must be between 1 and",
                 id="max-tokens-huge"),
    pytest.param({"limit": 1, "max_tokens": 2, "window": WindowReader(STORE)}, ValueError,
                 "got window= and limit= and max_tokens=", id="window-and-both"),
    pytest.param({"max_tokens": "8000"}, TypeError, "max_tokens must be an int",
                 id="max-tokens-str"),
    pytest.param({"tools": get_weather}, TypeError,
                 r"tools must be a list of Tool objects, got a single Tool: write "
                 r"tools=\[get_weather\]", id="tools-single"),
    pytest.param({"tools": "get_weather"}, TypeError,
                 "tools must be a list of Tool objects, got str", id="tools-str"),
    pytest.param({"tools": 3}, TypeError, "tools must be a list of Tool objects, got int",
                 id="tools-int"),
    pytest.param({"middlewares": otel.tracing(provider_name="test")}, TypeError,
                 "middlewares must be a list of ModelMiddleware objects, got a single",
                 id="middlewares-single"),
    pytest.param({"on_overlap": "queue"}, ValueError, "on_overlap must be one of", id="overlap"),
    pytest.param({"store": ReadWriteOnly(), "on_overlap": "reject"}, TypeError,
                 r"Reject\(\) \(on_overlap='reject'\) needs a store that is a scope\.history\."
                 r"TurnLeaser.*"
                 "got ReadWriteOnly", id="overlap-no-leases"),
    pytest.param({"overlap_timeout": -1}, ValueError, "overlap_timeout must be a finite",
                 id="overlap-timeout-negative"),
    pytest.param({"overlap_timeout": "1"}, TypeError, "overlap_timeout", id="overlap-timeout-str"),
    pytest.param({"lease_ttl": 0}, ValueError, "lease_ttl must be a finite number of seconds > 0",
                 id="lease-ttl-zero"),
    pytest.param({"lease_ttl": float("nan")}, ValueError, "lease_ttl", id="lease-ttl-nan"),
    pytest.param({"max_steps": "8"}, TypeError, "max_steps must be an int >= 1, got str",
                 id="max-steps-str"),
    pytest.param({"max_steps": 0}, ValueError, "max_steps must be an int >= 1, got 0",
                 id="max-steps-zero"),
    pytest.param({"append_retries": 1.0}, TypeError, "append_retries must be an int >= 0",
                 id="append-retries-float"),
    pytest.param({"system": 1}, TypeError, "system must be a str or None", id="system"),
    pytest.param({"options": {}}, TypeError, "options must be a scope.chat.Options",
                 id="options"),
    pytest.param({"model": object()}, TypeError, "model must be a scope.chat Model",
                 id="model"),
    pytest.param({"keep_interrupted": 1}, TypeError, "keep_interrupted must be a bool",
                 id="keep-interrupted"),
    pytest.param({"on_incomplete": 3}, TypeError, "on_incomplete must be callable",
                 id="on-incomplete"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "problem"), BAD)
def test_a_bad_argument_names_the_conversation_parameter(
    kwargs: dict[str, Any], error: type[Exception], problem: str
) -> None:
    arguments: dict[str, Any] = {"model": MODEL, "store": STORE, "conversation_id": "c", **kwargs}
    with pytest.raises(error, match=problem) as raised:
        Conversation(**arguments)
    assert type(raised.value) is error
    assert not re.search(r"\bMiddleware\b", str(raised.value))  # the Conversation's names
