"""Token budgets: TokenCounter, DefaultTokenCounter, WindowReader(max_tokens=...) (DESIGN §6d)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.chat import (
    FinishReason,
    Message,
    Output,
    Request,
    Response,
    ResponseMetadata,
    Role,
    ToolOutput,
    ToolResult,
    Usage,
    assistant_message,
    media_part,
    native_part,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import InvalidWindowError, WindowTooSmallError
from scope.history import (
    Batch,
    ConversationID,
    DefaultTokenCounter,
    Middleware,
    TokenCounter,
    WindowReader,
)
from scope.history._cache import HistoryCache
from scope.history._turns import project
from scope.history._window import select, window
from scope.history.inmemory import InMemoryStore
from scope.media import Media
from scope.metadata import Metadata
from scope.testing import ScriptedModel

pytestmark = pytest.mark.anyio

COUNTER = DefaultTokenCounter()


def _stamped(text: str, inp: int, out: int, model: str = "m") -> Message:
    return assistant_message(text).__class__(
        Role.ASSISTANT,
        assistant_message(text).parts,
        Metadata(
            {
                "scope/provider": "p",
                "scope/model": model,
                "scope/usage": {"input_tokens": inp, "output_tokens": out},
            }
        ),
    )


# -- the default counter ------------------------------------------------------------------


def test_estimate_is_bytes_over_four_plus_fixed_costs() -> None:
    assert COUNTER.count([user_message("x" * 40)]) == 4 + 10
    assert COUNTER.count([user_message("é" * 3)]) == 4 + 2  # 6 UTF-8 bytes
    image = media_part(Media.from_uri("image/png", "https://x/y.png"))
    pdf = media_part(Media.from_uri("application/pdf", "https://x/y.pdf"))
    assert COUNTER.count([user_message(image)]) == 4 + 1600
    assert COUNTER.count([user_message(pdf)]) == 4 + 3000
    call = assistant_message(tool_call_part("id", "abcd", "1234"))
    assert COUNTER.count([call]) == 4 + 8 + 2
    result = tool_message(ToolResult("id", "abcd", ToolOutput.of_text("12345678")))
    assert COUNTER.count([result]) == 4 + 8 + 1 + 2
    thought = assistant_message(reasoning_part("x" * 8, b"s" * 400))
    assert COUNTER.count([thought]) == 4 + 2  # signatures are not counted


def test_settings_change_the_estimate() -> None:
    counter = DefaultTokenCounter(bytes_per_token=1, message_tokens=0)
    assert counter.count([user_message("abc")]) == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bytes_per_token": 0}, "bytes_per_token must be at least 1, got 0"),
        ({"bytes_per_token": True}, "bytes_per_token must be an integer, got bool"),
        ({"message_tokens": -1}, "message_tokens must be at least 0, got -1"),
        ({"image_tokens": 1.5}, "image_tokens must be an integer, got float"),
    ],
)
def test_invalid_counter_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidWindowError, match=match):
        DefaultTokenCounter(**kwargs)


def test_stored_usage_counts_the_answer_as_its_output_tokens() -> None:
    assert COUNTER.count([_stamped("a" * 400, 1000, 7)]) == 7


def test_input_tokens_difference_replaces_the_estimate_between_two_answers() -> None:
    q1, q2 = user_message("x" * 400), user_message("y" * 400)
    a1, a2 = _stamped("a", 500, 20), _stamped("b", 560, 30)
    # q1 estimated (104), a1 = 20; then the provider says a1 + q2 took 560 - 500 = 60.
    assert COUNTER.count([q1, a1, q2, a2]) == 104 + 60 + 30
    # Another model: the figures are not comparable, the estimates stand.
    a2_other = _stamped("b", 560, 30, model="other")
    assert COUNTER.count([q1, a1, q2, a2_other]) == 104 + 20 + 104 + 30
    # A negative difference (another system prompt, say): the estimates stand.
    a2_less = _stamped("b", 100, 30)
    assert COUNTER.count([q1, a1, q2, a2_less]) == 104 + 20 + 104 + 30


def test_a_provider_compaction_counts_by_the_usage_recorded_with_it() -> None:
    # DESIGN §6k: an answer holding a provider's compaction item (its encrypted content
    # is large, the summary it stands for small) is counted by the usage stored with it;
    # its bytes only without one.
    compaction = native_part(
        "openai.responses", "compaction", {"type": "compaction", "encrypted_content": "g" * 40_000}
    )
    answer = attrs.evolve(_stamped("Noted.", 9000, 300), parts=(compaction, text_part("Noted.")))
    assert COUNTER.count([answer]) == 300
    after = [answer, user_message("x" * 400), _stamped("b", 9000 + 300 + 110, 30)]
    assert COUNTER.count(after) == 300 + 110 + 30
    unstamped = assistant_message(compaction, "Noted.")
    assert COUNTER.count([unstamped]) > 10_000  # no usage: its bytes, an overestimate


def test_malformed_usage_is_ignored() -> None:
    message = attrs.evolve(
        assistant_message("a" * 40), metadata={"scope/usage": {"input_tokens": -1}}
    )
    assert COUNTER.count([message]) == 14
    unstamped = attrs.evolve(
        assistant_message("a" * 40),
        metadata={"scope/usage": {"input_tokens": 5, "output_tokens": 3}},
    )
    assert COUNTER.count([unstamped]) == 3  # no provenance: counted, never linked


def test_default_counter_is_a_token_counter() -> None:
    assert isinstance(COUNTER, TokenCounter)
    COUNTER.validate()


# -- WindowReader construction --------------------------------------------------------------


class _ListReader:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    async def read(self, conversation_id: str) -> list[Message]:
        return list(self.messages)


@pytest.mark.parametrize("max_tokens", [0, -5, 2**63], ids=repr)
def test_invalid_max_tokens(max_tokens: Any) -> None:
    with pytest.raises(InvalidWindowError, match="max_tokens"):
        WindowReader(_ListReader([]), max_tokens=max_tokens)


@pytest.mark.parametrize("max_tokens", [True, 1.5, "10"], ids=repr)
def test_max_tokens_that_is_no_int_is_a_type_error(max_tokens: Any) -> None:
    with pytest.raises(TypeError, match="window max_tokens must be an integer"):
        WindowReader(_ListReader([]), max_tokens=max_tokens)


def test_counter_must_be_a_token_counter() -> None:
    with pytest.raises(TypeError, match="counter must be a TokenCounter"):
        WindowReader(_ListReader([]), max_tokens=5, counter=object())  # type: ignore[arg-type]


def test_neither_limit_is_valid() -> None:
    reader = WindowReader(_ListReader([]))
    assert reader.limit is None and reader.max_tokens is None
    reader.validate()


class _Fixed:
    """Every message costs ``cost``; counts every call."""

    def __init__(self, cost: int = 1, result: Any = None) -> None:
        self.cost = cost
        self.result = result
        self.calls: list[int] = []

    def count(self, messages: Sequence[Message]) -> int:
        self.calls.append(len(messages))
        return self.result if self.result is not None else self.cost * len(messages)


@pytest.mark.parametrize("result", [-1, 1.5, "3"])
async def test_a_counter_returning_nonsense_is_refused(result: Any) -> None:
    reader = WindowReader(
        _ListReader([user_message("q")]), max_tokens=5, counter=_Fixed(result=result)
    )
    with pytest.raises(InvalidWindowError, match=r"count returned"):
        await reader.read("c")


# -- the budget ---------------------------------------------------------------------------


def _turn(i: int, size: int = 40) -> list[Message]:
    return [user_message("q" * size), assistant_message("a" * size)]


async def test_budget_keeps_the_newest_whole_turns() -> None:
    messages = [*_turn(0), *_turn(1), *_turn(2)]  # each turn: 2 * (4 + 10) = 28

    def tightest(budget: int) -> WindowReader:  # v0.3's window: no stable start
        return WindowReader(_ListReader(messages), max_tokens=budget, low_water=budget)

    assert await tightest(56).read("c") == messages[2:]
    assert await tightest(55).read("c") == messages[4:]
    assert await tightest(84).read("c") == messages


async def test_newest_turn_over_budget_raises_window_too_small() -> None:
    reader = WindowReader(_ListReader([*_turn(0), *_turn(1)]), max_tokens=27)
    with pytest.raises(WindowTooSmallError, match="newest turn takes 28 tokens"):
        await reader.read("c")
    with pytest.raises(WindowTooSmallError, match="with the merged system message"):
        await WindowReader(_ListReader([system_message("s"), *_turn(0)]), max_tokens=28).read("c")


async def test_limit_and_max_tokens_both_apply() -> None:
    messages = [*_turn(0), *_turn(1), *_turn(2)]
    reader = WindowReader(_ListReader(messages), 4, max_tokens=1000, low_water=1000)
    assert await reader.read("c") == messages[2:]
    reader = WindowReader(_ListReader(messages), 100, max_tokens=28, low_water=28)
    assert await reader.read("c") == messages[4:]


async def test_counts_of_unchanged_turns_are_not_recomputed() -> None:
    store = InMemoryStore()
    counter = _Fixed()
    reader = WindowReader(store, max_tokens=1_000, counter=counter, low_water=1_000)
    for i in range(50):
        await store.append(Batch("unchanged", f"t{i}", _turn(i)))
    await reader.read("unchanged")
    counter.calls.clear()
    await reader.read("unchanged")
    assert counter.calls == []  # unchanged history: the window is remembered
    await store.append(Batch("unchanged", "new", _turn(99)))
    await reader.read("unchanged")
    # Only the new turn is measured in context (a pair of turns: 4 messages); the old
    # turns' counts are reused, and the window itself is counted once.
    assert counter.calls.count(4) == 1
    assert counter.calls.count(102) == 1
    assert max(counter.calls) == 102


async def test_a_new_counter_is_not_served_another_counters_window() -> None:
    store = InMemoryStore()
    for i in range(3):
        await store.append(Batch("two-counters", f"t{i}", _turn(i)))
    one, two = _Fixed(), _Fixed(2)
    assert len(await WindowReader(store, max_tokens=4, counter=one).read("two-counters")) == 2
    assert len(await WindowReader(store, max_tokens=4, counter=two).read("two-counters")) == 2
    tightest = {"max_tokens": 4, "low_water": 4}
    assert len(await WindowReader(store, counter=one, **tightest).read("two-counters")) == 4
    assert len(await WindowReader(store, counter=two, **tightest).read("two-counters")) == 2


async def test_the_middleware_stores_usage_and_response_id() -> None:
    store = InMemoryStore()
    answer = Response(
        Output(assistant_message("hi"), FinishReason.STOP),
        ResponseMetadata(id="resp_1", model="m", usage=Usage(120, 7, reasoning_tokens=3)),
    )
    model = ScriptedModel(answer, Response(Output(assistant_message("x"), FinishReason.STOP)))
    history = Middleware(store, store, "u")
    await history.call(model).call(Request([user_message("q")]))
    stored = (await store.read("u"))[-1]
    assert stored.metadata.decode("scope/usage") == {"input_tokens": 120, "output_tokens": 7}
    assert stored.metadata.decode("scope/response_id") == "resp_1"
    # A response without metadata stores the answer as it came.
    await history.call(model).call(Request([user_message("q2")]))
    assert "scope/usage" not in (await store.read("u"))[-1].metadata


async def test_streamed_usage_is_stored_too() -> None:
    store = InMemoryStore()
    answer = Response(
        Output(assistant_message("hello there"), FinishReason.STOP),
        ResponseMetadata(id="r2", usage=Usage(10, 4)),
    )
    history = Middleware(store, store, "s")
    stream = history.stream(ScriptedModel(answer)).stream(Request([user_message("q")]))
    async for _ in stream:
        pass
    stored = (await store.read("s"))[-1]
    assert stored.metadata.decode("scope/usage") == {"input_tokens": 10, "output_tokens": 4}
    assert stored.metadata.decode("scope/response_id") == "r2"


# -- the rule, by hypothesis ----------------------------------------------------------------


@st.composite
def _histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    inp = 0
    if draw(st.booleans()):
        out.append(system_message("s" * draw(st.integers(1, 200))))
    for i in range(draw(st.integers(0, 8))):
        if i == 0 and draw(st.booleans()):
            out.append(assistant_message("greeting"))  # before the first user message
        out.append(user_message("u" * draw(st.integers(1, 300))))
        for j in range(draw(st.integers(0, 2))):
            out.append(assistant_message(tool_call_part(f"c{i}-{j}", "t", "x" * j)))
            out.append(tool_message(ToolResult(f"c{i}-{j}", "t", ToolOutput.of_text("r" * 50))))
        text = "a" * draw(st.integers(1, 300))
        if draw(st.booleans()):
            inp += draw(st.integers(-20, 200))
            model = draw(st.sampled_from(["m", "n"]))
            out.append(_stamped(text, max(inp, 0), draw(st.integers(0, 100)), model))
        elif draw(st.booleans()):
            out.append(assistant_message(text))
    return out


def _starts(rest: list[Message]) -> list[int]:
    starts = [i for i, m in enumerate(rest) if m.role is Role.USER]
    if rest and rest[0].role is not Role.USER:
        starts = [0, *starts[1:]]
    return starts


@given(_histories(), st.integers(1, 1500), st.sampled_from([None, 3, 7, 20]))
def test_token_window_is_whole_turns_within_budget_and_maximal(
    messages: list[Message], budget: int, limit: int | None
) -> None:
    systems = [m for m in messages if m.role is Role.SYSTEM]
    rest = [m for m in messages if m.role is not Role.SYSTEM]
    starts = _starts(rest)
    head = window(systems) if systems else []

    def size(start: int) -> int:
        return COUNTER.count([*head, *rest[start:]])

    def allowed(start: int) -> bool:
        return limit is None or len(head) + len(rest) - start <= limit

    try:
        out = window(messages, limit, max_tokens=budget, low_water=budget)
    except WindowTooSmallError:
        assert starts
        assert size(starts[-1]) > budget or not allowed(starts[-1])
        return
    assert out[: len(head)] == head
    body = out[len(head) :]
    if not starts:
        assert body == []
        return
    start = len(rest) - len(body)
    assert start in starts and body == rest[start:]  # whole turns: no call without its result
    assert COUNTER.count(out) <= budget  # within the budget, by the counter's measure
    assert allowed(start)
    position = starts.index(start)
    if position:  # maximal: the next older turn would not fit
        older = starts[position - 1]
        assert size(older) > budget or not allowed(older)


@given(_histories(), st.integers(0, 30), st.integers(1, 1500))
def test_a_window_over_a_grown_history_equals_a_fresh_one(
    messages: list[Message], cut: int, budget: int
) -> None:
    cache = HistoryCache()
    cid = ConversationID("grown")
    cut = min(cut, len(messages))
    with contextlib.suppress(WindowTooSmallError):  # warm the cache on a prefix
        select(project(cache, cid, messages[:cut]), None, budget, COUNTER)
    try:
        fresh = window(messages, max_tokens=budget)
    except WindowTooSmallError:
        with pytest.raises(WindowTooSmallError):
            select(project(cache, cid, messages), None, budget, COUNTER)
        return
    assert select(project(cache, cid, messages), None, budget, COUNTER) == fresh
    assert select(project(cache, cid, messages), None, budget, COUNTER) == fresh
