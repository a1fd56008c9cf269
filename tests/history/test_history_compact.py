"""scope.history.compact: an append, never a rewrite (DESIGN §6d), asyncio and trio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from scope.chat import (
    FinishReason,
    Message,
    Output,
    PartKind,
    Request,
    Response,
    Role,
    ToolOutput,
    ToolResult,
    assistant_message,
    reasoning_part,
    system_message,
    text_part,
    tool_call_part,
    tool_message,
    user_message,
)
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    InvalidConversationIDError,
    InvalidResponseError,
    StoreError,
)
from scope.history import Batch, Middleware, Receipt, WindowReader, compact
from scope.history._compact import (
    ATTEMPTS,
    BACKOFF_CAP,
    BACKOFF_FIRST,
    backoff_delay,
    compaction_append_id,
    transcript,
)
from scope.history.inmemory import InMemoryStore
from scope.historystores.sqlite import SQLiteStore
from scope.testing import ScriptedModel
from tests.servers import (
    drop_keys,
    drop_tables,
    import_driver,
    postgres_dsn_or_skip,
    redis_url_or_skip,
    unique_key_prefix,
    unique_table_prefix,
)

pytestmark = pytest.mark.anyio


class Summarizer:
    """A Model answering every request with ``text``; ``during(n)`` runs inside the
    n-th call (1-based), before it answers."""

    def __init__(
        self, text: str = "SUMMARY", during: Callable[[int], Awaitable[None]] | None = None
    ) -> None:
        self.text = text
        self.during = during
        self.requests: list[Request] = []

    async def call(self, request: Request) -> Response:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        if self.during is not None:
            await self.during(len(self.requests))
        return Response(Output(assistant_message(self.text), FinishReason.STOP))


def _turn(i: int, *, reasoning: bool = False) -> list[Message]:
    answer = (
        assistant_message(reasoning_part(f"thought {i}", b"sig"), f"a{i}")
        if reasoning
        else assistant_message(f"a{i}")
    )
    return [user_message(f"q{i}"), answer]


def _tool_turn(i: int) -> list[Message]:
    return [
        user_message(f"q{i}"),
        assistant_message(tool_call_part(f"c{i}", "lookup", '{"k":1}')),
        tool_message(ToolResult(f"c{i}", "lookup", ToolOutput.of_text(f"r{i}"))),
        assistant_message(f"a{i}"),
    ]


async def _fill(store: Any, turns: int, cid: str = "c", **kw: Any) -> None:
    for i in range(turns):
        await store.append(Batch(cid, f"t{i}", _turn(i, **kw)))


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStore()
        return
    async with await SQLiteStore.open(tmp_path / "h.db") as sqlite:
        yield sqlite


def _compactions(messages: list[Message]) -> list[Message]:
    return [m for m in messages if "scope/compaction" in m.metadata]


# -- the append ---------------------------------------------------------------------------


async def test_compaction_appends_one_system_message_and_removes_nothing(store: Any) -> None:
    await _fill(store, 5)
    before = await store.read("c")
    head = (await store.read_view("c")).head
    receipt = await compact(store, "c", Summarizer(), keep_turns=2)
    assert isinstance(receipt, Receipt)
    after = await store.read("c")
    assert after[: len(before)] == before  # nothing removed or changed
    assert len(after) == len(before) + 1
    summary = after[-1]
    assert summary.role is Role.SYSTEM and summary.text == "SUMMARY"
    assert summary.metadata.decode("scope/compaction") == {"covers": 6}
    assert receipt.id == compaction_append_id("c", 6, head)


async def test_replay_is_the_merged_system_message_then_the_retained_turns(store: Any) -> None:
    await store.append(Batch("c", "sys", [system_message("be brief")]))
    for i in range(4):
        await store.append(Batch("c", f"t{i}", _turn(i, reasoning=True)))
    await compact(store, "c", Summarizer(), keep_turns=2)
    window = await WindowReader(store).read("c")
    stored = await store.read("c")
    # stored: system, q0 a0 q1 a1 | q2 a2 q3 a3, compaction (covers 5)
    assert window[0] == Message(
        Role.SYSTEM,
        [text_part("be brief"), text_part("\n\n"), text_part("SUMMARY")],
        {"scope/compaction": {"covers": 5}},
    )
    retained = stored[5:9]
    assert [m.role for m in window[1:]] == [m.role for m in retained]
    assert [m.text for m in window[1:]] == [m.text for m in retained]
    # The reasoning of the retained turns is dropped, everything else kept.
    for kept, original in zip(window[1:], retained, strict=True):
        assert [p for p in original.parts if p.kind is not PartKind.REASONING] == list(kept.parts)
        assert kept.metadata == original.metadata
    assert not any(p.kind is PartKind.REASONING for m in window for p in m.parts)


async def test_the_summarizer_sees_everything_before_the_boundary_and_the_previous_summary(
    store: Any,
) -> None:
    await store.append(Batch("c", "tools", _tool_turn(0)))
    await _fill(store, 3, reasoning=True)
    first = Summarizer("FIRST")
    assert await compact(store, "c", first, keep_turns=1) is not None
    text = first.requests[0].messages[1].text
    assert "[tool call lookup (id c0)]" in text and "[tool result lookup (id c0)] r0" in text
    assert "thought" not in text  # reasoning is provider state, never summarised
    assert first.requests[0].messages[0].role is Role.SYSTEM
    await store.append(Batch("c", "later", _turn(9)))
    await store.append(Batch("c", "later2", _turn(10)))
    second = Summarizer("SECOND")
    assert await compact(store, "c", second, keep_turns=1) is not None
    text = second.requests[0].messages[1].text
    assert text.startswith("system:\nFIRST")  # the previous summary included
    assert "q9" in text and "q10" not in text
    window = await WindowReader(store).read("c")
    assert window[0].text == "SECOND"  # older compactions excluded
    assert [m.text for m in window[1:]] == ["q10", "a10"]


async def test_nothing_to_compact_returns_none(store: Any) -> None:
    summarizer = Summarizer()
    assert await compact(store, "c", summarizer) is None  # empty
    await _fill(store, 2)
    assert await compact(store, "c", summarizer, keep_turns=2) is None
    assert await compact(store, "c", summarizer, keep_turns=1) is not None
    assert await compact(store, "c", summarizer, keep_turns=1) is None  # just compacted
    assert len(summarizer.requests) == 1


async def test_keep_turns_zero_summarises_everything(store: Any) -> None:
    await _fill(store, 2)
    await compact(store, "c", Summarizer(), keep_turns=0)
    assert await WindowReader(store).read("c") == [
        Message(Role.SYSTEM, [text_part("SUMMARY")], {"scope/compaction": {"covers": 4}})
    ]


async def test_a_retry_lands_once(store: Any) -> None:
    await _fill(store, 4)
    receipt = await compact(store, "c", Summarizer(), keep_turns=1)
    assert receipt is not None
    (batch,) = [b for b in await store.read_batches("c") if b.id == receipt.id]
    assert await store.append(batch) == receipt  # the same boundary's batch: a retry
    assert len(_compactions(await store.read("c"))) == 1


async def test_a_turn_landing_during_the_summarizer_call_moves_the_boundary(store: Any) -> None:
    await _fill(store, 3)

    async def land_a_turn(n: int) -> None:
        if n == 1:
            await store.append(Batch("c", "meanwhile", _turn(7)))

    summarizer = Summarizer(during=land_a_turn)
    receipt = await compact(store, "c", summarizer, keep_turns=1)
    assert receipt is not None
    assert len(summarizer.requests) == 2  # asked again on the new history
    assert "q2" in summarizer.requests[1].messages[1].text
    stored = await store.read("c")
    (only,) = _compactions(stored)
    assert only.metadata.decode("scope/compaction") == {"covers": 6}
    assert stored[-1] == only and [m.text for m in stored[6:8]] == ["q7", "a7"]


async def test_gives_up_after_bounded_attempts(store: Any) -> None:
    await _fill(store, 3)

    async def always(n: int) -> None:
        await store.append(Batch("c", f"m{n}", _turn(100 + n)))

    summarizer = Summarizer(during=always)
    with pytest.raises(HistoryChangedError) as caught:
        await compact(store, "c", summarizer, keep_turns=1)
    assert len(summarizer.requests) == ATTEMPTS
    assert _compactions(await store.read("c")) == []
    # Each attempt read the conversation, then one turn (2 messages) landed before its
    # append: the message names every attempt with the lengths expected and found.
    raced = "; ".join(
        f"#{n}: expected {6 + 2 * (n - 1)} messages, found {6 + 2 * n}"
        for n in range(1, ATTEMPTS + 1)
    )
    assert str(caught.value) == (
        f"compact of conversation 'c' gave up after {ATTEMPTS} attempts, each raced by an "
        f"append that landed while the summary was made ({raced}); nothing was appended: "
        "call compact again when the conversation is quieter"
    )
    last = 6 + 2 * ATTEMPTS
    assert (caught.value.expected, caught.value.actual) == (last - 2, last)
    assert caught.value.conversation_id == "c"
    assert isinstance(caught.value.__cause__, HistoryChangedError)


def test_the_pauses_between_attempts_back_off_with_jitter() -> None:
    for retry in range(1, ATTEMPTS):
        full = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (retry - 1))
        assert backoff_delay(retry, 0.0) == pytest.approx(full / 2)
        assert backoff_delay(retry, 0.999) == pytest.approx(full * 0.9995)
    assert backoff_delay(1, 0.5) == pytest.approx(0.015)
    assert backoff_delay(2, 0.0) == pytest.approx(2 * backoff_delay(1, 0.0))  # doubling
    assert backoff_delay(40, 0.0) == BACKOFF_CAP / 2  # capped


async def _race_appenders(store: Any, cid: str) -> Receipt | None:
    """A compaction of ``cid`` (a summarizer that takes 15 ms) racing 8 tasks that each
    append 30 turns, about 10 ms apart (a burst of about 0.3 s): every early attempt is
    raced, attempts without pauses would all be (8 of them take about 120 ms), and the
    pauses of the backoff outlast the burst, so the compaction lands."""
    await _fill(store, 4, cid)
    result: list[Receipt | None] = []
    landed = [anyio.Event()]  # set by every append

    async def turns(task: int) -> None:
        for i in range(30):
            await store.append(Batch(cid, f"x{task}-{i}", _turn(1000 * task + i)))
            landed[0].set()
            await anyio.sleep(0.008 + 0.002 * ((task + i) % 3))

    async def slow(n: int) -> None:
        if n == 1:  # the first attempt is raced for sure: a turn lands meanwhile
            landed[0] = anyio.Event()
            await landed[0].wait()
        await anyio.sleep(0.015)

    summarizer = Summarizer(during=slow)

    async def compaction() -> None:
        await anyio.lowlevel.checkpoint()  # the appenders start first
        result.append(await compact(store, cid, summarizer, keep_turns=1))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for task in range(8):
                tg.start_soon(turns, task)
            tg.start_soon(compaction)
    [receipt] = result
    assert receipt is not None
    stored = await store.read(cid)
    (only,) = _compactions(stored)
    assert stored.index(only) >= 2 * 4  # after the turns it read
    assert len(summarizer.requests) > 1  # it did race
    return receipt


async def test_a_compaction_racing_many_appending_tasks_lands(anyio_backend: str) -> None:
    await _race_appenders(InMemoryStore(), "c")


@pytest.mark.servers
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_compaction_racing_many_appending_tasks_lands_on_redis(
    anyio_backend: str,
) -> None:
    url = redis_url_or_skip()
    import_driver("redis")
    from scope.historystores.redis import RedisStore

    prefix = unique_key_prefix()
    try:
        async with await RedisStore.open(url, prefix=prefix, check_persistence=False) as redis:
            await _race_appenders(redis, "c")
    finally:
        await drop_keys(url, prefix)


async def test_twenty_concurrent_compactions_append_one_message(store: Any) -> None:
    await _fill(store, 6)
    results: list[Receipt | None] = []

    async def one() -> None:
        results.append(await compact(store, "c", Summarizer(), keep_turns=2))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(one)
    assert len(_compactions(await store.read("c"))) == 1
    receipts = {r for r in results if r is not None}
    assert len(receipts) == 1  # whoever got a receipt got the same one


async def test_concurrent_compactions_with_different_summaries_land_one(store: Any) -> None:
    await _fill(store, 6)

    async def one(i: int) -> None:
        await compact(store, "c", Summarizer(f"S{i}"), keep_turns=2)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert len(_compactions(await store.read("c"))) == 1


async def test_the_middleware_sends_the_summary_through_a_window(store: Any) -> None:
    await _fill(store, 4)
    await compact(store, "c", Summarizer(), keep_turns=1)
    model = ScriptedModel(Response(Output(assistant_message("ok"), FinishReason.STOP)))
    history = Middleware(WindowReader(store), store, "c")
    await history.call(model).call(Request([system_message("sys"), user_message("next")]))
    sent = model.requests[0].messages
    assert [m.text for m in sent] == ["sys", "SUMMARY", "q3", "a3", "next"]
    assert len(await store.read("c")) == 9 + 2  # the fence used the whole length


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_twenty_concurrent_compactions_on_postgres(anyio_backend: str) -> None:
    dsn = postgres_dsn_or_skip()
    import_driver("asyncpg")
    from scope.historystores.postgres import PostgresStore

    prefix = unique_table_prefix()
    try:
        async with await PostgresStore.open(dsn, table_prefix=prefix) as pg:
            await _fill(pg, 6)

            async def one(i: int) -> None:
                await compact(pg, "c", Summarizer(f"S{i % 2}"), keep_turns=2)

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
            assert len(_compactions(await pg.read("c"))) == 1
    finally:
        await drop_tables(dsn, prefix)


# -- refusals -----------------------------------------------------------------------------


async def test_closed_conversation_raises_before_the_summarizer(store: Any) -> None:
    await _fill(store, 3)
    await store.clear("c")
    summarizer = Summarizer()
    with pytest.raises(ConversationClosedError):
        await compact(store, "c", summarizer, keep_turns=1)
    assert summarizer.requests == []


async def test_an_answer_without_text_appends_nothing(store: Any) -> None:
    await _fill(store, 3)
    with pytest.raises(InvalidResponseError, match="no text"):
        await compact(store, "c", Summarizer("   "), keep_turns=1)
    assert _compactions(await store.read("c")) == []


async def test_summarizer_errors_propagate(store: Any) -> None:
    await _fill(store, 3)
    with pytest.raises(RuntimeError, match="down"):
        await compact(store, "c", ScriptedModel(RuntimeError("down")), keep_turns=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"keep_turns": -1}, ValueError, "keep_turns must be an int >= 0, got -1"),
        ({"keep_turns": True}, ValueError, "keep_turns"),
        ({"keep_turns": 1.0}, ValueError, "keep_turns"),
        ({"instructions": ""}, ValueError, "instructions must be None or a non-blank str"),
        ({"instructions": 3}, ValueError, "instructions"),
    ],
)
async def test_invalid_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        await compact(InMemoryStore(), "c", Summarizer(), **kwargs)


async def test_store_and_summarizer_types_are_checked() -> None:
    with pytest.raises(TypeError, match="ViewReader and Writer"):
        await compact(object(), "c", Summarizer())
    with pytest.raises(TypeError, match=r"summarizer must be a scope\.chat\.Model"):
        await compact(InMemoryStore(), "c", object())  # type: ignore[arg-type]
    with pytest.raises(InvalidConversationIDError):
        await compact(InMemoryStore(), " c", Summarizer())


async def test_custom_instructions_are_the_system_prompt(store: Any) -> None:
    await _fill(store, 2)
    summarizer = Summarizer()
    await compact(store, "c", summarizer, keep_turns=1, instructions="Be terse.")
    assert summarizer.requests[0].messages[0].text == "Be terse."


async def test_a_malformed_compaction_is_a_store_error() -> None:
    store = InMemoryStore()
    await _fill(store, 2)
    bad = Message(Role.SYSTEM, [text_part("x")], {"scope/compaction": {"covers": 99}})
    await store.append(Batch("c", "bad", [bad]))
    with pytest.raises(StoreError, match=r"message 4 has scope/compaction metadata"):
        await WindowReader(store).read("c")


async def test_conflicting_derived_id_counts_as_done() -> None:
    # Another writer landed a different summary of this boundary first: re-read, done.
    store = InMemoryStore()
    await _fill(store, 3)
    other = Message(Role.SYSTEM, [text_part("OTHER")], {"scope/compaction": {"covers": 4}})
    head = (await store.read_view("c")).head

    async def race(n: int) -> None:
        if n == 1:
            await store.append(Batch("c", compaction_append_id("c", 4, head), [other]))

    assert await compact(store, "c", Summarizer(during=race), keep_turns=1) is None
    assert _compactions(await store.read("c")) == [other]
    with pytest.raises(AppendConflictError):  # the id really is taken
        await store.append(Batch("c", compaction_append_id("c", 4, head), [system_message("x")]))


def test_transcript_names_media_and_errors() -> None:
    from scope.chat import media_part
    from scope.media import Media

    text = transcript(
        [
            user_message("look", media_part(Media.from_uri("image/png", "https://x/y.png"))),
            tool_message(ToolResult("c", "t", ToolOutput.of_text("bad"), is_error=True)),
        ]
    )
    assert text == "user:\nlook\n[media: image/png]\n\ntool:\n[tool error result t (id c)] bad"
