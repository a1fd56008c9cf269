"""Acceptance of DESIGN §6g for Anthropic: long conversations through the history
Middleware on a server that enforces preserved thinking as documented
(``tests.anthropic_server.PreservedThinkingServer``), under asyncio and trio, by
``call`` and by ``stream``.

200 turns with a sliding token window (``WindowReader(store, max_tokens=...)``, the
v0.3 window: it moves on every turn once full), a system-prompt change, a tool-set
change, thinking on every answer (some with the text omitted, some with a redacted
block) and a two-step tool loop every 5th turn: no request is refused, and every
thinking block the adapter leaves out is counted on the response
(``scope/dropped_parts``), on the OpenTelemetry chat span
(``scope.replay.dropped_parts``) and in the DEBUG record of the ``scope.models`` logger.

``prefix_stats`` says how many requests after the window first filled replayed the
request before them unchanged (the server's ``Served.extends_previous``): the figure a
stable window (``WindowReader(..., low_water=...)``) is meant to raise; ``converse(...,
make_window=...)`` runs the same conversation through another window.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncGenerator, Callable
from typing import Any

import attrs
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scope import otel
from scope.chat import (
    FinishReason,
    Message,
    Model,
    Options,
    PartKind,
    Request,
    Response,
    Streamer,
    ToolOutput,
    ToolResult,
    collect,
    system_message,
    tool_message,
    user_message,
    wrap,
    wrap_stream,
)
from scope.errors import BadRequestError
from scope.history import Middleware, WindowReader
from scope.history.inmemory import InMemoryStore
from scope.models._prefix import PREFIX_KEY
from scope.models._provenance import DROPPED_KEY
from scope.models.anthropic import AnthropicModel
from tests.anthropic_server import BOUND_ELSEWHERE, PreservedThinkingServer
from tests.helpers import TIME, WEATHER

pytestmark = pytest.mark.anyio

TURNS = 200
#: The turn the system prompt changes at, and the turn a tool joins the tool set at.
NEW_PROMPT = 70
NEW_TOOLS = 130
#: A window of about ten turns: it moves on every turn once the history outgrows it.
MAX_TOKENS = 1500

_LEFT_OUT = re.compile(r"AnthropicModel left out (\d+) part\(s\) of the request")


def state_parts(request: Request) -> int:
    """Signed (or redacted) reasoning parts of the assistant messages of ``request``:
    the thinking blocks the adapter could send back."""
    return sum(
        1
        for message in request.messages
        if message.role == "assistant"
        for part in message.parts
        if part.kind is PartKind.REASONING and part.signature
    )


@attrs.define
class Offered:
    """Between the Middleware and the adapter: the state parts of each request."""

    counts: list[int] = attrs.Factory(list)

    def call(self, inner: Model) -> Model:
        offered = self

        class Counting:
            async def call(self, request: Request) -> Response:
                offered.counts.append(state_parts(request))
                return await inner.call(request)

        return Counting()

    def stream(self, inner: Streamer) -> Streamer:
        offered = self

        class Counting:
            def stream(self, request: Request) -> AsyncGenerator[Response, None]:
                offered.counts.append(state_parts(request))
                return inner.stream(request)  # type: ignore[return-value]

        return Counting()


def turn_text(turn: int) -> str:
    text = f"Question {turn}: " + " ".join(f"word{turn}-{i}" for i in range(20))
    if turn % 5 == 0:
        text += " (tools: 2)"
    if turn % 11 == 3:
        text += " (redacted)"
    return text


def turn_options(turn: int) -> Options:
    if turn % 7 == 2:  # thinking whose text the API omits: an empty-text block
        thinking = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
        return Options(extensions={"anthropic/thinking": thinking})
    return Options(reasoning_effort="low")


def sliding(reader: Any) -> WindowReader:
    """The v0.3 window: the longest suffix of whole turns within ``MAX_TOKENS``
    (``low_water`` at its bound turns the stable rule off)."""
    return WindowReader(reader, max_tokens=MAX_TOKENS, low_water=MAX_TOKENS)


def stable(reader: Any) -> WindowReader:
    """The default window: stable, its start moving only when it must."""
    return WindowReader(reader, max_tokens=MAX_TOKENS)


@attrs.frozen
class Run:
    responses: list[Response]
    offered: list[int]
    spans: list[dict[str, Any]]
    left_out_records: list[int]


async def converse(
    server: PreservedThinkingServer,
    mode: str,
    caplog: pytest.LogCaptureFixture,
    *,
    turns: int = TURNS,
    unstamped: bool = False,
    make_window: Callable[[Any], Any] = sliding,
) -> Run:
    """``turns`` turns through the Middleware on ``server``; what each request got.
    ``unstamped``: the window reads the stored turns without ``scope/prefix``;
    ``make_window``: the window over the store's reader (default: ``sliding``)."""
    store = InMemoryStore()
    reader = Unstamped(store) if unstamped else store
    window = make_window(reader)
    middleware = Middleware(window, store, "prefix-acceptance")
    offered = Offered()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = otel.tracing(provider, provider_name="anthropic")
    responses: list[Response] = []
    async with AnthropicModel(
        "claude-fable-5-1", api_key="k", base_url=server.base_url, max_retries=0
    ) as adapter:
        model = wrap(adapter, middleware.call, tracing.call, offered.call)
        streamer = wrap_stream(adapter, middleware.stream, tracing.stream, offered.stream)

        async def send(request: Request) -> Response:
            if mode == "call":
                return await model.call(request)
            return await collect(streamer.stream(request))

        with caplog.at_level(logging.DEBUG, logger="scope.models"):
            for turn in range(turns):
                system = system_message(
                    "You are a helpful assistant." if turn < NEW_PROMPT else "You are terse."
                )
                tools = [WEATHER] if turn < NEW_TOOLS else [WEATHER, TIME]
                messages: list[Message] = [system, user_message(turn_text(turn))]
                while True:
                    response = await send(
                        Request(messages, tools=tools, options=turn_options(turn))
                    )
                    responses.append(response)
                    assert response.output is not None and response.output.message is not None
                    if response.output.finish_reason is not FinishReason.TOOL_CALLS:
                        break
                    calls = response.output.message.tool_calls
                    results = [
                        ToolResult(c.id, c.name, ToolOutput.of_text(f"{c.name} done"))
                        for c in calls
                    ]
                    messages = [*messages, response.output.message, tool_message(*results)]
    records = [
        int(match.group(1))
        for record in caplog.records
        if (match := _LEFT_OUT.match(record.getMessage()))
    ]
    spans = [dict(span.attributes or {}) for span in exporter.get_finished_spans()]
    return Run(responses, offered.counts, spans, records)


def prefix_stats(server: PreservedThinkingServer) -> tuple[int, int, int]:
    """(the index of the first request whose window no longer starts at the first
    turn, how many requests from there on replayed the request before them unchanged,
    how many requests there are from there on)."""
    first = next(
        index
        for index, recorded in enumerate(server.requests)
        if not recorded.body["messages"][0]["content"][0]["text"].startswith("Question 0:")
    )
    after = server.served[first:]
    return first, sum(s.extends_previous for s in after), len(after)


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_200_turns_on_a_sliding_window_never_fail_and_count_every_block_left_out(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with PreservedThinkingServer() as server:
        run = await converse(server, mode, caplog)
        server.check_requests()
    served = server.served
    loops = len(range(0, TURNS, 5))
    assert len(served) == len(run.responses) == len(run.offered) == TURNS + 2 * loops
    # Zero 400s: every request was answered, every answer with a thinking block.
    assert [s.status for s in served] == [200] * len(served)
    assert all(s.minted >= 1 for s in served)
    assert all(m.metadata.get(PREFIX_KEY) for m in _answers(run)), "every answer is stamped"
    # Every block left out is counted, request by request, in all three places.
    expected = [
        offered - s.state_sent - len(s.dropped)
        for offered, s in zip(run.offered, served, strict=True)
    ]
    assert all(count >= 0 for count in expected)
    assert [_dropped(response) for response in run.responses] == expected
    assert [span.get("scope.replay.dropped_parts", 0) for span in run.spans] == expected
    assert run.left_out_records == [count for count in expected if count]
    # The window moved and the prompt and the tools changed: much was left out ...
    assert sum(expected) > TURNS
    # ... but never the current turn's thinking: each tool-loop step sent back every
    # block of the steps before it (the server refuses a final tool-use turn without).
    steps = [s for s in served if s.answer == "tool_use"]
    assert len(steps) == 2 * loops
    follow_ups = [i + 1 for i, s in enumerate(served) if s.answer == "tool_use"]
    assert all(served[i].state_sent >= 1 for i in follow_ups)
    # Right after the prompt changed, nothing made under the old one went back.
    change = _first_request_of_turn(run, NEW_PROMPT)
    assert served[change].state_sent == 0 and expected[change] == run.offered[change] > 0
    # What a stable window is meant to improve, computed for the comparison: before
    # the window fills every request replays the one before it; once it is full, the
    # v0.3 window moves so often that fewer than the 80% a stable window must reach do.
    first, unchanged, total = prefix_stats(server)
    assert first > 1 and all(s.extends_previous for s in served[1:first])
    assert 0 < unchanged < 0.8 * total


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_200_turns_on_a_stable_window_replay_an_unchanged_prefix_at_least_80_percent(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with PreservedThinkingServer() as server:
        run = await converse(server, mode, caplog, make_window=stable)
        server.check_requests()
    served = server.served
    assert [s.status for s in served] == [200] * len(served)
    expected = [
        offered - s.state_sent - len(s.dropped)
        for offered, s in zip(run.offered, served, strict=True)
    ]
    assert [_dropped(response) for response in run.responses] == expected
    assert [span.get("scope.replay.dropped_parts", 0) for span in run.spans] == expected
    assert run.left_out_records == [count for count in expected if count]
    first, unchanged, total = prefix_stats(server)
    assert first > 1 and total > TURNS // 2
    assert unchanged >= 0.8 * total, (unchanged, total)
    # Fewer blocks fall than on the sliding window, whose every move drops them.
    with PreservedThinkingServer() as other:
        sliding_run = await converse(other, mode, caplog)
    sliding_expected = [
        offered - s.state_sent - len(s.dropped)
        for offered, s in zip(sliding_run.offered, other.served, strict=True)
    ]
    assert sum(expected) < sum(sliding_expected)


def _answers(run: Run) -> list[Message]:
    return [r.output.message for r in run.responses if r.output and r.output.message]


def _dropped(response: Response) -> int:
    assert response.metadata is not None
    value = response.metadata.extra.get(DROPPED_KEY)
    return 0 if value is None else int(value.value())  # type: ignore[arg-type]


def _first_request_of_turn(run: Run, turn: int) -> int:
    """The index of the first request of ``turn`` (two more requests per tool loop)."""
    return turn + 2 * len(range(0, turn, 5))


@attrs.frozen
class Unstamped:
    """A reader of stored turns as v0.3 stored them: without ``scope/prefix``."""

    store: InMemoryStore

    async def read(self, conversation_id: str) -> list[Message]:
        return [
            attrs.evolve(m, metadata={k: v for k, v in m.metadata.items() if k != PREFIX_KEY})
            for m in await self.store.read(conversation_id)
        ]


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_without_the_digests_the_same_conversation_is_refused(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The check the digests pass: the same conversation replayed from a history
    # without them (the v0.3 rule sends every own block back) is refused as soon as the
    # window first moves.
    with (
        PreservedThinkingServer() as server,
        pytest.raises(BadRequestError, match=re.escape(BOUND_ELSEWHERE)),
    ):
        await converse(server, mode, caplog, turns=40, unstamped=True)
    assert [s.status for s in server.served].count(400) == 1
    assert server.served[-1].status == 400


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_a_tool_loop_asking_an_alias_sends_its_thinking_back_on_every_step(
    mode: str,
) -> None:
    # claude-sonnet-4-0 is answered by claude-sonnet-4-20250514: the answers are the
    # adapter's own (scope/asked is the alias asked now), so each step's thinking goes
    # back, as the API requires of a final tool-use turn with thinking on.
    store = InMemoryStore()
    middleware = Middleware(store, store, "alias")
    with PreservedThinkingServer() as server:
        async with AnthropicModel(
            "claude-sonnet-4-0", api_key="k", base_url=server.base_url, max_retries=0
        ) as adapter:
            model = wrap(adapter, middleware.call)
            streamer = wrap_stream(adapter, middleware.stream)
            messages: list[Message] = [user_message("Weather in Paris? (tools: 2)")]
            options = Options(reasoning_effort="low")
            while True:
                request = Request(messages, tools=[WEATHER], options=options)
                if mode == "call":
                    response = await model.call(request)
                else:
                    response = await collect(streamer.stream(request))
                assert response.metadata is not None
                assert response.metadata.model == "claude-sonnet-4-20250514"
                assert response.output is not None and response.output.message is not None
                if response.output.finish_reason is not FinishReason.TOOL_CALLS:
                    break
                results = [
                    ToolResult(c.id, c.name, ToolOutput.of_text("18C"))
                    for c in response.output.message.tool_calls
                ]
                messages = [*messages, response.output.message, tool_message(*results)]
        server.check_requests()
    assert [(s.status, s.state_sent, s.answer) for s in server.served] == [
        (200, 0, "tool_use"),
        (200, 1, "tool_use"),
        (200, 2, "text"),
    ]
    assert all(s.asked == "claude-sonnet-4-0" for s in server.served)
